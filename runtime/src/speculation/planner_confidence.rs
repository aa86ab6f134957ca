//! Acceptance by the drafter's own confidence (issue 34, item 2): once a
//! drafter has drafted, the probability it gave each token says more about
//! that token's chance than the depth's average does (EAGLE-2 §3: the
//! draft model's confidence is well calibrated to the acceptance rate;
//! SpecDec++ stops drafting on a predicted acceptance).
//!
//! The planner keeps decayed (accepted, tried) counts per confidence bin
//! (ten bins of equal width over `[0, 1]`), learnt from the rounds the
//! target verified: a token is *tried* when every token before it on its
//! path was accepted, as the depth counts count it. A token's estimate is
//! its bin's rate shrunk to the depth estimate of its sequence
//! ([`Planner::alpha`]) with [`CONF_PRIOR`] pseudo-trials, so an empty bin
//! is the depth estimate and a full one is the drafter's calibration.
//! [`Planner::verify_counts`] then cuts each sequence's draft where its
//! tokens stop paying for their rows.
//!
//! Only drafters whose tree log-probabilities are their own probabilities
//! report confidences (`Drafter::with_probabilities`): prompt lookup gives
//! every token probability one, and is planned by depth alone.

use super::{Planner, GLOBAL_KEEP};

/// Bins over the confidence `[0, 1]`.
pub const CONF_BINS: usize = 10;
/// Pseudo-trials of the depth estimate in a bin's estimate.
const CONF_PRIOR: f64 = 4.0;

/// Decayed (accepted, tried) counts per confidence bin.
#[derive(Clone, Debug, Default)]
pub(super) struct ConfidenceBins([(f64, f64); CONF_BINS]);

/// The bin of confidence `c` (a probability; anything not in `[0, 1]`
/// is clamped, NaN counts as 0).
pub fn bin(c: f64) -> usize {
    let c = if c.is_nan() { 0.0 } else { c.clamp(0.0, 1.0) };
    ((c * CONF_BINS as f64) as usize).min(CONF_BINS - 1)
}

impl ConfidenceBins {
    fn add(&mut self, conf: &[f64], accepted: usize) {
        for c in &mut self.0 {
            c.0 *= GLOBAL_KEEP;
            c.1 *= GLOBAL_KEEP;
        }
        let tried = (accepted + 1).min(conf.len());
        for (j, &c) in conf[..tried].iter().enumerate() {
            let b = &mut self.0[bin(c)];
            b.1 += 1.0;
            if j < accepted {
                b.0 += 1.0;
            }
        }
    }
}

impl Planner {
    /// Sequence-round verified with the drafter's confidences `conf` (its
    /// probability of each token on the path the planner cut by, depth by
    /// depth) and `accepted` of its tokens accepted.
    pub fn observe_confidence(&mut self, conf: &[f64], accepted: usize) {
        if !conf.is_empty() {
            self.conf.add(conf, accepted);
        }
    }

    /// Tokens tried so far in bin `b` (decayed), for reports and tests.
    pub fn confidence_trials(&self, b: usize) -> f64 {
        self.conf.0.get(b).map_or(0.0, |c| c.1)
    }

    /// The bins that saw tokens: `lower edge: rate/tried`.
    pub(super) fn describe_confidence(&self) -> String {
        let bins: Vec<String> = self
            .conf
            .0
            .iter()
            .enumerate()
            .filter(|(_, c)| c.1 >= 0.5)
            .map(|(k, c)| {
                let edge = k as f64 / CONF_BINS as f64;
                format!("{edge:.1}:{:.2}/{:.0}", c.0 / c.1, c.1)
            })
            .collect();
        bins.join(" ")
    }

    /// The estimated acceptance of a token of sequence `slot` at depth `j`
    /// that the drafter gave probability `c`.
    pub fn alpha_at_confidence(&self, slot: usize, j: usize, c: f64) -> f64 {
        let (a, t) = self.conf.0[bin(c)];
        (a + CONF_PRIOR * self.alpha(slot, j)) / (t + CONF_PRIOR)
    }

    /// `P(j)` for `j = 1..=conf.len()` by the tokens' confidences.
    pub(super) fn reach_by_confidence(&self, slot: usize, conf: &[f64]) -> Vec<f64> {
        let mut p = 1.0;
        conf.iter()
            .enumerate()
            .map(|(j, &c)| {
                p *= self.alpha_at_confidence(slot, j, c);
                p
            })
            .collect()
    }
}
