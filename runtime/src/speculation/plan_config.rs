//! The settings of the draft planner ([`super::planner`]): its mode,
//! budgets and the warm-up's cycle ([`PlannerConfig`]), and the cost tables
//! `draftc calibrate` stores ([`Costs`]).

use super::SpecError;

/// How the planner chooses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlanMode {
    /// Maximise expected tokens per second (the default).
    Auto,
    /// Uniformly random budgets per sequence in `0..=max` (tests: whatever
    /// is chosen, output stays lossless).
    Random { seed: u64 },
    /// Cycle the whole batch through every budget in `budgets` (warm-up:
    /// compiles each shape once before anything is timed).
    Cycle,
}

/// Settings of a [`Planner`].
#[derive(Clone, Debug, PartialEq)]
pub struct PlannerConfig {
    /// Largest draft budget per sequence per round.
    pub max_budget: usize,
    /// Prior per-depth acceptance before any round was verified.
    pub prior_alpha: f64,
    /// Weight of the prior (in pseudo-rounds).
    pub prior_strength: f64,
    /// EMA weight of the newest cost sample, in `(0, 1]`.
    pub smoothing: f64,
    /// After this many rounds with no draft, one round drafts (probe).
    pub probe_every: usize,
    pub mode: PlanMode,
}

impl PlannerConfig {
    pub fn auto(max_budget: usize) -> PlannerConfig {
        PlannerConfig {
            max_budget,
            prior_alpha: 0.5,
            prior_strength: 2.0,
            smoothing: 0.25,
            probe_every: 4,
            mode: PlanMode::Auto,
        }
    }

    pub fn validate(&self) -> Result<(), SpecError> {
        let bad = |reason: String| {
            Err(SpecError::InvalidConfig {
                what: "draft planner",
                reason,
            })
        };
        if self.max_budget == 0 {
            return bad("the largest draft budget must be at least 1".into());
        }
        if !(0.0..=1.0).contains(&self.prior_alpha) || self.prior_strength <= 0.0 {
            return bad(format!(
                "prior acceptance {} must be in [0, 1] with a positive strength (found {})",
                self.prior_alpha, self.prior_strength
            ));
        }
        if !(self.smoothing > 0.0 && self.smoothing <= 1.0) {
            return bad(format!(
                "smoothing must be in (0, 1], found {}",
                self.smoothing
            ));
        }
        Ok(())
    }

    /// The budgets a warm-up cycles through, round by round: no draft,
    /// one token after one, two and five rounds without a draft (a drafter
    /// that catches up on the rows it skipped runs a wider first pass), the
    /// middle and the largest budget (each shape a run mostly uses). The
    /// rounds [`PlannerConfig::warm_single`] names draft for the first
    /// sequence only, so a batch also measures a verify pass one or a few
    /// rows wider than no draft.
    pub fn warm_budgets(&self) -> Vec<usize> {
        let mut v = WARM_BASE.to_vec();
        // Twice each: a shape's first round compiles, its second measures.
        let tail = self.warm_tail();
        v.extend(&tail);
        v.extend(&tail);
        v
    }

    /// Two tokens (rows 3 and 4 of a batch of one: lavapipe's linears block
    /// rows by 1, 2, 4 and 8, and every block is a kernel to compile), the
    /// middle and the largest budget.
    fn warm_tail(&self) -> Vec<usize> {
        let k = self.max_budget;
        let mut tail: Vec<usize> = Vec::new();
        for x in [2, k.div_ceil(2), k] {
            if x > 1 && x <= k && !tail.contains(&x) {
                tail.push(x);
            }
        }
        tail
    }

    /// Whether warm-up round `r` drafts for the first sequence only: the
    /// second one-token round, and the first round of the second pass over
    /// the larger budgets.
    pub fn warm_single(&self, r: usize) -> bool {
        r == 4 || (r == WARM_BASE.len() + self.warm_tail().len() && self.max_budget > 1)
    }
}

/// The warm-up's first rounds: no draft, then one token after one, two and
/// five rounds without a draft.
pub(super) const WARM_BASE: [usize; 11] = [0, 1, 0, 0, 1, 0, 0, 0, 0, 0, 1];

/// A planner's measured costs, as `draftc calibrate` stores them per
/// device, model, dtype and drafter: seconds of a round without its drafter
/// call by rows verified, and of a drafter call by (sequences, budget).
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Costs {
    pub verify: Vec<(usize, f64)>,
    pub draft: Vec<(usize, usize, f64)>,
    /// The plain decoder's step over the no-draft round, by sequences
    /// (`Planner::observe_plain_step`; absent from files written before it).
    #[serde(default)]
    pub step: Vec<(usize, f64)>,
}

impl Costs {
    /// `other`'s entries replace this one's where both have a key.
    pub fn merge(&mut self, other: &Costs) {
        replace_by_key(&mut self.verify, &other.verify, |e| (e.0, 0));
        replace_by_key(&mut self.draft, &other.draft, |e| (e.0, e.1));
        replace_by_key(&mut self.step, &other.step, |e| (e.0, 0));
    }
}

/// `table` with `new`'s entries in place of those with the same key, sorted
/// by key.
fn replace_by_key<T: Copy>(table: &mut Vec<T>, new: &[T], key: impl Fn(&T) -> (usize, usize)) {
    for e in new {
        table.retain(|x| key(x) != key(e));
        table.push(*e);
    }
    table.sort_by_key(|e| key(e));
}
