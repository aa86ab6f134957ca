//! Hardware-aware draft length: pick the number of draft tokens `k` per round
//! that maximises expected tokens per second, from timings measured while
//! decoding (paper 003 §3.1, "Hardware-aware Drafting Budget").
//!
//! # Model
//! Measured, each smoothed by an exponential moving average (weight
//! `smoothing` on the newest sample) so the choice follows changing load:
//! * `t_d` — drafter time per draft token;
//! * `T_v(k) = a + b·k` — target verify time of a round with `k` draft
//!   tokens, fitted by least squares on EMA'd moments of the observed
//!   `(k, seconds)` pairs (flat, `b = 0`, until two different `k` were seen);
//! * `α` — per-token acceptance rate, `Σ accepted / Σ trials` (EMA'd), where
//!   a round that accepted `a` of `k` tokens made `a + [a < k]` trials.
//!
//! Expected tokens per round with `k` drafted and i.i.d. acceptance
//! (Leviathan et al. 2023, Eq. 1; includes the bonus token):
//! `E(k) = (1 − α^{k+1}) / (1 − α)`.
//!
//! | schedule | round time | choice |
//! | --- | --- | --- |
//! | [`Schedule::Sequential`] (draft, then verify) | `k·t_d + T_v(k)` | `argmax_k E(k) / (k·t_d + T_v(k))` |
//! | [`Schedule::Concurrent`] (paper 003: the drafter drafts round `r+1` while the target verifies round `r`) | `max(k·t_d, T_v(k))` | `argmax_k E(k) / max(k·t_d, T_v(k))` |
//!
//! For the concurrent schedule this lands at (or next to) paper 003's
//! cost coefficient `γ = T_v / t_d`: below it the round time is the verify
//! time and more tokens are free, above it every token costs `t_d` while
//! `E(k)/k` falls. `k` is searched over `[1, max]`, ties to the smaller `k`.

use super::SpecError;

/// How drafting and verification share time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Schedule {
    /// Draft `k` tokens, then verify them (one device, or devices in turn).
    Sequential,
    /// Draft on one device while the target verifies on another (paper 003).
    Concurrent,
}

/// Settings of a [`BudgetController`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BudgetConfig {
    /// Largest draft length (the clamp `[1, max]`).
    pub max: usize,
    /// Draft length used until there are measurements.
    pub initial: usize,
    /// EMA weight of the newest sample, in `(0, 1]`.
    pub smoothing: f64,
    pub schedule: Schedule,
}

impl Default for BudgetConfig {
    fn default() -> Self {
        BudgetConfig {
            max: 16,
            initial: 4,
            smoothing: 0.1,
            schedule: Schedule::Sequential,
        }
    }
}

/// Exponential moving average; the first sample initialises it.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Ema(Option<f64>);

impl Ema {
    fn update(&mut self, x: f64, w: f64) {
        self.0 = Some(match self.0 {
            None => x,
            Some(v) => v + w * (x - v),
        });
    }
}

/// Expected tokens emitted by a round drafting `k` tokens, each accepted
/// with probability `alpha` until the first rejection, plus the bonus token.
pub fn expected_tokens(alpha: f64, k: usize) -> f64 {
    let a = alpha.clamp(0.0, 1.0);
    if a >= 1.0 - 1e-12 {
        return k as f64 + 1.0;
    }
    (1.0 - a.powi(k as i32 + 1)) / (1.0 - a)
}

/// Splits a per-round budget over `batch` sequences as evenly as possible
/// (the first `total % batch` sequences get one more). Under large batches
/// the draft-token budget is a per-round total (paper 000 §3).
pub fn per_sequence_budgets(total: usize, batch: usize) -> Vec<usize> {
    if batch == 0 {
        return Vec::new();
    }
    (0..batch)
        .map(|i| total / batch + usize::from(i < total % batch))
        .collect()
}

/// Chooses the draft length from measured timings and acceptance.
#[derive(Clone, Debug)]
pub struct BudgetController {
    cfg: BudgetConfig,
    draft_step: Ema,
    /// EMA'd moments of the verify observations: k, t, k², k·t.
    vk: Ema,
    vt: Ema,
    vkk: Ema,
    vkt: Ema,
    verify_ks: Vec<usize>,
    accepted: Ema,
    trials: Ema,
}

impl BudgetController {
    pub fn new(cfg: BudgetConfig) -> Result<BudgetController, SpecError> {
        if cfg.max == 0 {
            return Err(SpecError::InvalidConfig {
                what: "draft budget",
                reason: "max must be at least 1".into(),
            });
        }
        if !(cfg.smoothing > 0.0 && cfg.smoothing <= 1.0) {
            return Err(SpecError::InvalidConfig {
                what: "draft budget",
                reason: format!("smoothing must be in (0, 1], found {}", cfg.smoothing),
            });
        }
        Ok(BudgetController {
            cfg,
            draft_step: Ema::default(),
            vk: Ema::default(),
            vt: Ema::default(),
            vkk: Ema::default(),
            vkt: Ema::default(),
            verify_ks: Vec::new(),
            accepted: Ema::default(),
            trials: Ema::default(),
        })
    }

    pub fn config(&self) -> &BudgetConfig {
        &self.cfg
    }

    /// A drafter pass that produced `tokens` tokens took `seconds`.
    pub fn observe_draft(&mut self, tokens: usize, seconds: f64) {
        if tokens > 0 && seconds.is_finite() && seconds >= 0.0 {
            self.draft_step
                .update(seconds / tokens as f64, self.cfg.smoothing);
        }
    }

    /// A target verify pass over `draft_tokens` draft tokens took `seconds`.
    pub fn observe_verify(&mut self, draft_tokens: usize, seconds: f64) {
        if !(seconds.is_finite() && seconds >= 0.0) {
            return;
        }
        let (k, w) = (draft_tokens as f64, self.cfg.smoothing);
        self.vk.update(k, w);
        self.vt.update(seconds, w);
        self.vkk.update(k * k, w);
        self.vkt.update(k * seconds, w);
        if !self.verify_ks.contains(&draft_tokens) && self.verify_ks.len() < 2 {
            self.verify_ks.push(draft_tokens);
        }
    }

    /// A round drafted `drafted` tokens (a chain, or the accepted path's
    /// depth budget) and the target accepted `accepted` of them.
    pub fn observe_round(&mut self, drafted: usize, accepted: usize) {
        if drafted == 0 {
            return;
        }
        let a = accepted.min(drafted);
        let trials = a + usize::from(a < drafted);
        self.accepted.update(a as f64, self.cfg.smoothing);
        self.trials.update(trials as f64, self.cfg.smoothing);
    }

    /// Smoothed per-token acceptance rate `α`.
    pub fn acceptance_rate(&self) -> Option<f64> {
        match (self.accepted.0, self.trials.0) {
            (Some(a), Some(t)) if t > 0.0 => Some((a / t).clamp(0.0, 1.0)),
            _ => None,
        }
    }

    /// Smoothed drafter time per token `t_d` (seconds).
    pub fn draft_step_time(&self) -> Option<f64> {
        self.draft_step.0
    }

    /// Fitted `(a, b)` of `T_v(k) = a + b·k`, `b >= 0`.
    pub fn verify_fit(&self) -> Option<(f64, f64)> {
        let (k, t, kk, kt) = (self.vk.0?, self.vt.0?, self.vkk.0?, self.vkt.0?);
        let var = kk - k * k;
        let slope = if self.verify_ks.len() >= 2 && var > 1e-9 {
            ((kt - k * t) / var).max(0.0)
        } else {
            0.0
        };
        Some(((t - slope * k).max(0.0), slope))
    }

    /// Predicted verify time of a round with `k` draft tokens (seconds).
    pub fn verify_time(&self, k: usize) -> Option<f64> {
        let (a, b) = self.verify_fit()?;
        Some(a + b * k as f64)
    }

    /// Paper 003's cost coefficient `γ = T_v / t_d` (at the current `k`
    /// scale: `T_v(1)`): how many draft tokens fit in one verify pass.
    pub fn cost_coefficient(&self) -> Option<f64> {
        let td = self.draft_step_time()?;
        (td > 0.0).then(|| self.verify_time(1).map(|tv| tv / td))?
    }

    /// Modelled tokens per second with `k` draft tokens.
    pub fn tokens_per_second(&self, k: usize) -> Option<f64> {
        let alpha = self.acceptance_rate()?;
        let td = self.draft_step_time()?;
        let tv = self.verify_time(k)?;
        let draft = k as f64 * td;
        let round = match self.cfg.schedule {
            Schedule::Sequential => draft + tv,
            Schedule::Concurrent => draft.max(tv),
        };
        (round > 0.0).then(|| expected_tokens(alpha, k) / round)
    }

    /// The draft length for the next round, in `[1, max]`: the modelled
    /// optimum once acceptance, draft and verify timings are known. Until
    /// verify timings at two different lengths exist, it alternates between
    /// `initial` and its neighbour so the slope of `T_v` can be fitted.
    pub fn choose(&self) -> usize {
        let max = self.cfg.max;
        let initial = self.cfg.initial.clamp(1, max);
        if max > 1 && self.verify_ks.len() < 2 {
            let probe = if initial < max {
                initial + 1
            } else {
                initial - 1
            };
            return if self.verify_ks.contains(&initial) {
                probe
            } else {
                initial
            };
        }
        let mut best = (initial, f64::NEG_INFINITY);
        for k in 1..=max {
            match self.tokens_per_second(k) {
                Some(v) if v > best.1 * (1.0 + 1e-12) || best.1 == f64::NEG_INFINITY => {
                    best = (k, v)
                }
                None => return initial,
                _ => {}
            }
        }
        best.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn controller(schedule: Schedule, max: usize) -> BudgetController {
        BudgetController::new(BudgetConfig {
            max,
            initial: 4,
            smoothing: 0.5,
            schedule,
        })
        .unwrap()
    }

    /// Feeds exact timings: `t_d` per draft token, `T_v(k) = a + b·k`, and
    /// rounds whose acceptance rate is exactly `alpha` (as a ratio).
    fn feed(c: &mut BudgetController, td: f64, a: f64, b: f64, alpha: f64, rounds: usize) {
        for r in 0..rounds {
            let k = 2 + r % 5;
            c.observe_draft(k, td * k as f64);
            c.observe_verify(k, a + b * k as f64);
        }
        // α = s / (s + 1): `s` accepted then one rejection, per round.
        let s = (alpha / (1.0 - alpha)).round() as usize;
        for _ in 0..rounds {
            c.observe_round(s + 1, s);
        }
    }

    fn brute_force(c: &BudgetController) -> usize {
        let mut best = (1, f64::NEG_INFINITY);
        for k in 1..=c.config().max {
            let v = c.tokens_per_second(k).unwrap();
            if v > best.1 * (1.0 + 1e-12) || best.1 == f64::NEG_INFINITY {
                best = (k, v);
            }
        }
        best.0
    }

    #[test]
    fn expected_tokens_formula() {
        assert_eq!(expected_tokens(0.0, 5), 1.0);
        assert_eq!(expected_tokens(1.0, 5), 6.0);
        assert!((expected_tokens(0.5, 2) - 1.75).abs() < 1e-12);
        assert!((expected_tokens(0.8, 4) - (1.0 - 0.8f64.powi(5)) / 0.2).abs() < 1e-12);
    }

    #[test]
    fn budget_split_is_even_and_exact() {
        assert_eq!(per_sequence_budgets(10, 4), vec![3, 3, 2, 2]);
        assert_eq!(per_sequence_budgets(3, 5), vec![1, 1, 1, 0, 0]);
        assert!(per_sequence_budgets(3, 0).is_empty());
    }

    #[test]
    fn no_data_uses_initial_then_probes_a_neighbour() {
        let mut c = controller(Schedule::Sequential, 8);
        assert_eq!(c.choose(), 4);
        c.observe_verify(4, 0.01);
        assert_eq!(c.choose(), 5);
        c.observe_verify(5, 0.011);
        // Verify fitted, but no draft timing or acceptance yet.
        assert_eq!(c.choose(), 4);
        let one = controller(Schedule::Sequential, 1);
        assert_eq!(one.choose(), 1);
    }

    #[test]
    fn verify_fit_recovers_a_line() {
        let mut c = controller(Schedule::Sequential, 16);
        feed(&mut c, 0.001, 0.010, 0.0005, 0.75, 40);
        let (a, b) = c.verify_fit().unwrap();
        assert!(
            (a - 0.010).abs() < 1e-9 && (b - 0.0005).abs() < 1e-9,
            "{a} {b}"
        );
        assert!((c.acceptance_rate().unwrap() - 0.75).abs() < 1e-9);
        assert!((c.cost_coefficient().unwrap() - 10.5).abs() < 1e-6);
    }

    #[test]
    fn sequential_choice_is_the_model_optimum_and_moves_with_costs() {
        // t_d 1 ms, T_v = 10 ms + 0.1 ms·k, α = 0.8.
        let mut c = controller(Schedule::Sequential, 32);
        feed(&mut c, 0.001, 0.010, 0.0001, 0.8, 40);
        let k = c.choose();
        assert_eq!(k, brute_force(&c));
        assert!((5..=12).contains(&k), "k = {k}");
        // A 10× faster drafter makes longer drafts worth it …
        let mut fast = controller(Schedule::Sequential, 32);
        feed(&mut fast, 0.0001, 0.010, 0.0001, 0.8, 40);
        assert!(fast.choose() > k);
        // … and so does a better acceptance rate.
        let mut good = controller(Schedule::Sequential, 32);
        feed(&mut good, 0.001, 0.010, 0.0001, 0.95, 40);
        assert!(good.choose() > k);
        // A drafter as slow as the target: one token at most.
        let mut slow = controller(Schedule::Sequential, 32);
        feed(&mut slow, 0.010, 0.010, 0.0001, 0.5, 40);
        assert_eq!(slow.choose(), 1);
    }

    #[test]
    fn concurrent_choice_is_the_cost_coefficient() {
        // Paper 003 Table 3: target verify 24× a draft step → budget 24.
        let mut c = controller(Schedule::Concurrent, 64);
        feed(&mut c, 0.001, 0.024, 0.0, 0.9, 40);
        assert!((c.cost_coefficient().unwrap() - 24.0).abs() < 1e-6);
        assert_eq!(c.choose(), 24);
    }

    #[test]
    fn ema_adapts_when_the_drafter_slows_down() {
        let mut c = controller(Schedule::Concurrent, 64);
        feed(&mut c, 0.001, 0.024, 0.0, 0.9, 40);
        assert_eq!(c.choose(), 24);
        // The drafter's device gets 3× slower: within a few rounds the
        // budget follows to ≈ 8.
        for _ in 0..30 {
            c.observe_draft(8, 0.003 * 8.0);
        }
        assert_eq!(c.choose(), 8);
    }

    #[test]
    fn bad_configs_are_errors() {
        let mut cfg = BudgetConfig {
            max: 0,
            ..BudgetConfig::default()
        };
        assert!(BudgetController::new(cfg).is_err());
        cfg.max = 4;
        cfg.smoothing = 0.0;
        assert!(BudgetController::new(cfg).is_err());
        cfg.smoothing = f64::NAN;
        assert!(BudgetController::new(cfg).is_err());
    }

    proptest! {
        #[test]
        fn choice_is_clamped_and_optimal(
            max in 1usize..40,
            initial in 0usize..60,
            obs in prop::collection::vec((1usize..40, 0.0f64..0.1, 0.0f64..0.01, 0usize..40), 0..30),
            concurrent in any::<bool>(),
        ) {
            let schedule = if concurrent { Schedule::Concurrent } else { Schedule::Sequential };
            let mut c = BudgetController::new(BudgetConfig { max, initial, smoothing: 0.3, schedule }).unwrap();
            for &(k, tv, td, acc) in &obs {
                c.observe_verify(k, tv);
                c.observe_draft(k, td * k as f64);
                c.observe_round(k, acc);
            }
            let k = c.choose();
            prop_assert!((1..=max).contains(&k));
            if c.tokens_per_second(1).is_some() && c.verify_ks.len() >= 2 {
                let best = (1..=max).map(|j| c.tokens_per_second(j).unwrap()).fold(f64::MIN, f64::max);
                prop_assert!(c.tokens_per_second(k).unwrap() >= best * (1.0 - 1e-9));
            }
            if let Some(a) = c.acceptance_rate() {
                prop_assert!((0.0..=1.0).contains(&a));
            }
        }
    }
}
