//! Planner tests: the cost tables, acceptance estimates, the modes, and
//! simulated runs against a known device (costs and acceptance drawn from
//! a model the planner does not see) where `auto` must match the best
//! fixed budget.

use super::*;

/// A simulated device and drafter: round time `draft(b, d) + verify(n)`,
/// each drafted token accepted with probability `alpha[i]` of sequence `i`.
pub(super) struct Sim {
    pub(super) verify_a: f64,
    pub(super) verify_c: f64,
    pub(super) draft_a: f64,
    pub(super) draft_c: f64,
    pub(super) alpha: Vec<f64>,
    pub(super) rng: u64,
    /// Verify time from lavapipe's measured table instead of the line.
    pub(super) table: bool,
}

impl Sim {
    /// Verify time `verify.0 + verify.1 · rows`, draft time `draft.0 +
    /// draft.1 · d` (none when `d` is 0), acceptance `alpha`, random
    /// numbers from `rng`.
    pub(super) fn line(verify: (f64, f64), draft: (f64, f64), alpha: Vec<f64>, rng: u64) -> Sim {
        Sim {
            verify_a: verify.0,
            verify_c: verify.1,
            draft_a: draft.0,
            draft_c: draft.1,
            alpha,
            rng,
            table: false,
        }
    }

    /// Only random numbers (from `rng`), no costs.
    pub(super) fn rng(rng: u64) -> Sim {
        Sim::line((0.0, 0.0), (0.0, 0.0), vec![], rng)
    }

    pub(super) fn verify(&self, rows: usize) -> f64 {
        if self.table {
            // Lavapipe's measured passes by rows (SmolLM2, f32): its
            // linears block rows by 4 and 8.
            let t = [0.0, 0.080, 0.092, 0.107, 0.113, 0.125, 0.139, 0.145, 0.150];
            return t
                .get(rows)
                .copied()
                .unwrap_or_else(|| 0.150 + 0.012 * (rows - 8) as f64);
        }
        self.verify_a + self.verify_c * rows as f64
    }

    pub(super) fn draft(&self, d: usize) -> f64 {
        if d == 0 {
            0.0
        } else {
            self.draft_a + self.draft_c * d as f64
        }
    }

    pub(super) fn uniform(&mut self) -> f64 {
        self.rng = self
            .rng
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.rng >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Tokens/s of `auto`, checked within 5 % of the best fixed budget's in
/// `0..=max` on the same simulated device.
fn auto_matches_best_fixed(sim: &mut Sim, max: usize) -> f64 {
    let rounds = 2000;
    // The fixed budgets' expected rates, exactly (a best-of-n over noisy
    // simulations would be biased upwards).
    let mut best: f64 = 0.0;
    for k in 0..=max {
        let b = sim.alpha.len();
        let tokens: f64 = sim
            .alpha
            .iter()
            .map(|&a| (0..=k).map(|j| a.powi(j as i32)).sum::<f64>())
            .sum();
        best = best.max(tokens / (sim.draft(k) + sim.verify(b * (1 + k))));
    }
    let mut p = Planner::new(PlannerConfig::auto(max)).unwrap();
    let auto = {
        let slots: Vec<usize> = (0..sim.alpha.len()).collect();
        let (mut tokens, mut secs) = (0.0, 0.0);
        for _ in 0..rounds {
            let plan = p.plan(&slots);
            let d = plan.draft_budget();
            let rows: usize = plan.budgets.iter().map(|k| 1 + k).sum();
            let (dt, vt) = (sim.draft(d), sim.verify(rows));
            p.observe_draft(slots.len(), d, dt, true);
            p.observe_verify(rows, vt);
            secs += dt + vt;
            for (i, &k) in plan.budgets.iter().enumerate() {
                let mut a = 0;
                while a < k && sim.uniform() < sim.alpha[i] {
                    a += 1;
                }
                p.observe_seq(i, k, a);
                tokens += (a + 1) as f64;
            }
        }
        tokens / secs
    };
    assert!(auto >= 0.95 * best, "auto {auto} best fixed {best}");
    auto
}

#[test]
fn auto_matches_the_best_fixed_budget_where_drafts_pay() {
    // Lavapipe-like: a verified row costs 6 % of a step, a cheap drafter.
    let mut sim = Sim::line((0.1, 0.006), (0.003, 0.004), vec![0.7], 1);
    auto_matches_best_fixed(&mut sim, 6);
}

#[test]
fn auto_stops_drafting_where_drafts_cost() {
    // MagicDec-like: every draft token costs most of a target pass.
    let mut sim = Sim::line((0.1, 0.006), (0.0, 0.09), vec![0.9], 2);
    let ar = sim.verify(1);
    let auto = auto_matches_best_fixed(&mut sim, 4);
    assert!(auto >= 0.97 / ar, "auto {auto} autoregressive {}", 1.0 / ar);
    // The same device, planned step by step: the drafter is switched off.
    let mut p = Planner::new(PlannerConfig::auto(4)).unwrap();
    for _ in 0..40 {
        let plan = p.plan(&[0]);
        let d = plan.draft_budget();
        p.observe_draft(1, d, sim.draft(d), true);
        p.observe_verify(1 + d, sim.verify(1 + d));
        p.observe_seq(0, d, d);
    }
    assert!(p.is_off(1));
    assert!(!p.is_off(2));
    assert!(p.plan(&[0]).drafter_off);
    // Even all-accepted drafts lose here: it is never tried again.
    for _ in 0..4 * RETRY_OFF {
        p.plan(&[0]);
    }
    assert!(p.start_run(1), "a hopeless drafter was tried again");
}

#[test]
fn auto_stops_drafting_at_large_batch_where_rows_cost() {
    // GPU at batch 16: a row costs as much as the weights stream.
    let mut sim = Sim::line((0.002, 0.0004), (0.001, 0.001), vec![0.35; 16], 3);
    auto_matches_best_fixed(&mut sim, 4);
}

#[test]
fn budgets_follow_each_sequence_acceptance() {
    let mut sim = Sim::line((0.1, 0.01), (0.001, 0.001), vec![0.95, 0.05], 4);
    auto_matches_best_fixed(&mut sim, 6);
    // After a run, the sure sequence drafts deeper than the unsure one.
    let mut p = Planner::new(PlannerConfig::auto(6)).unwrap();
    for _ in 0..40 {
        p.observe_seq(0, 6, 6);
        p.observe_seq(1, 6, 0);
    }
    p.observe_verify(2, 0.12);
    p.observe_verify(14, 0.24);
    p.observe_draft(2, 6, 0.007, true);
    p.observe_draft(2, 1, 0.002, true);
    p.rounds = 4;
    let plan = p.plan(&[0, 1]);
    assert!(plan.budgets[0] > plan.budgets[1], "{:?}", plan.budgets);
    assert!(
        p.alpha(0, 0) > 0.7 && p.alpha(1, 0) < 0.3,
        "{} {}",
        p.alpha(0, 0),
        p.alpha(1, 0)
    );
}

#[test]
fn first_rounds_calibrate_then_it_plans() {
    let mut p = Planner::new(PlannerConfig::auto(4)).unwrap();
    let mut seen = Vec::new();
    for _ in 0..4 {
        let plan = p.plan(&[0, 1]);
        let k = plan.budgets[0];
        seen.push(k);
        p.observe_draft(2, k, 0.01 * k as f64, true);
        p.observe_verify(2 * (1 + k), 0.1 + 0.01 * (2 * (1 + k)) as f64);
    }
    assert_eq!(seen, vec![4, 4, 1, 0]);
    // A warm-up's costs make a new planner plan from its first round.
    let mut q = Planner::new(PlannerConfig::auto(4)).unwrap();
    q.adopt_costs(&p);
    assert!(q.plan(&[0, 1]).predicted.is_some());
    assert!(p.plan(&[0, 1]).predicted.is_some());
}

#[test]
fn verify_line_interpolates_and_never_slopes_down() {
    let mut p = Planner::new(PlannerConfig::auto(4)).unwrap();
    assert_eq!(p.verify_time(3), None);
    p.observe_verify(1, 0.10);
    assert_eq!(p.verify_time(1), Some(0.10));
    p.observe_verify(5, 0.14);
    // A compile inside a round is a spike, clipped once the average holds.
    let mut e = Ema::default();
    for x in [9.0, 1.0, 1.0, 50.0] {
        e.update(x, 0.5);
    }
    assert!((e.value - 1.5).abs() < 1e-12, "{}", e.value);
    let mid = p.verify_time(3).unwrap();
    assert!((mid - 0.12).abs() < 1e-9, "{mid}");
    // One sample far above the settled ones (a compile) bends no line.
    for _ in 0..2 {
        p.observe_verify(1, 0.10);
        p.observe_verify(5, 0.14);
    }
    p.observe_verify(3, 9.9);
    assert!(p.verify_time(4).unwrap() < 0.2);
    let mut q = Planner::new(PlannerConfig::auto(4)).unwrap();
    q.observe_verify(1, 0.2);
    q.observe_verify(5, 0.1);
    assert!(q.verify_time(9).unwrap() > 0.0);
    assert!(q.verify_time(9).unwrap() <= q.verify_time(1).unwrap() + 1e-12);
}

#[test]
fn draft_time_scales_from_the_nearest_budget() {
    let mut p = Planner::new(PlannerConfig::auto(8)).unwrap();
    assert_eq!(p.draft_time(1, 2), None);
    p.observe_draft(1, 1, 0.01, true);
    assert_eq!(p.draft_time(1, 3), Some(0.01));
    // After skipped rounds a call only lowers the estimate.
    p.observe_draft(1, 3, 0.03, false);
    p.observe_draft(1, 3, 0.09, false);
    assert!((p.draft_time(1, 5).unwrap() - 0.05).abs() < 1e-9);
    // Another batch size borrows the nearest measured one.
    assert!((p.draft_time(4, 3).unwrap() - 0.03).abs() < 1e-9);
}

#[test]
fn random_mode_is_seeded_and_in_range() {
    let cfg = |seed| PlannerConfig {
        mode: PlanMode::Random { seed },
        ..PlannerConfig::auto(5)
    };
    let mut a = Planner::new(cfg(7)).unwrap();
    let mut b = Planner::new(cfg(7)).unwrap();
    let mut all = Vec::new();
    for _ in 0..50 {
        let pa = a.plan(&[0, 1, 2]);
        assert_eq!(pa, b.plan(&[0, 1, 2]));
        all.extend(pa.budgets);
    }
    assert!(all.iter().all(|&k| k <= 5));
    assert!(all.contains(&0) && all.contains(&5));
    assert_eq!(a.histogram().iter().sum::<usize>(), 150);
}

#[test]
fn cycle_mode_visits_every_warm_budget() {
    let cfg = PlannerConfig {
        mode: PlanMode::Cycle,
        ..PlannerConfig::auto(6)
    };
    let want = vec![0, 1, 0, 0, 1, 0, 0, 0, 0, 0, 1, 2, 3, 6, 2, 3, 6];
    assert_eq!(cfg.warm_budgets(), want);
    let mut p = Planner::new(cfg).unwrap();
    let ks: Vec<usize> = (0..want.len()).map(|_| p.plan(&[0]).budgets[0]).collect();
    assert_eq!(ks, want);
    assert_eq!(p.no_draft_rounds(), 8);
    // Two rounds draft for the first sequence only.
    let singles: Vec<usize> = (0..want.len())
        .filter(|&r| p.config().warm_single(r))
        .collect();
    assert_eq!(singles, vec![4, 14]);
}

#[test]
fn bad_configs_are_errors() {
    for cfg in [
        PlannerConfig::auto(0),
        PlannerConfig {
            smoothing: 0.0,
            ..PlannerConfig::auto(3)
        },
        PlannerConfig {
            prior_alpha: 1.5,
            ..PlannerConfig::auto(3)
        },
    ] {
        assert!(Planner::new(cfg).is_err());
    }
}

#[test]
fn speedup_is_the_throughput_multiplier() {
    assert!((speedup(2.0, 0.1, 0.2, 0.15) - 1.0).abs() < 1e-12);
    assert_eq!(speedup(2.0, 0.0, 0.0, 0.1), 0.0);
}

#[test]
fn costs_round_trip_and_seed_a_planner() {
    let mut p = Planner::new(PlannerConfig::auto(3)).unwrap();
    p.observe_verify(1, 0.1);
    p.observe_verify(4, 0.13);
    p.observe_verify(2, 0.11);
    p.observe_draft(1, 3, 0.02, true);
    let c = p.costs();
    let text = serde_json::to_string(&c).unwrap();
    let back: Costs = serde_json::from_str(&text).unwrap();
    assert_eq!(back, c);
    let mut q = Planner::new(PlannerConfig::auto(3)).unwrap();
    q.seed_costs(&back);
    // Seeded costs skip calibration: the first round is planned.
    assert!(q.plan(&[0]).predicted.is_some());
    assert!((q.verify_time(4).unwrap() - p.verify_time(4).unwrap()).abs() < 1e-9);
    // Garbage in a file is ignored, not trusted.
    let mut r = Planner::new(PlannerConfig::auto(3)).unwrap();
    r.seed_costs(&Costs {
        verify: vec![(0, 1.0), (3, f64::NAN), (2, -1.0)],
        draft: vec![(0, 1, 1.0)],
        step: vec![(0, 0.9), (1, f64::NAN)],
    });
    assert_eq!(r.costs(), Costs::default());
    let mut m = c.clone();
    m.merge(&Costs {
        verify: vec![(4, 0.5), (9, 0.2)],
        draft: vec![],
        step: vec![(1, 0.8)],
    });
    assert_eq!(m.step, vec![(1, 0.8)]);
    assert_eq!(m.verify.len(), 4);
    assert!(m.verify.contains(&(4, 0.5)));
}

/// Costs of a batch of 4 on lavapipe: a fifth row crosses a row block.
fn batch4_planner() -> Planner {
    let mut p = Planner::new(PlannerConfig::auto(3)).unwrap();
    for (n, t) in [(4, 0.127), (5, 0.150), (6, 0.153), (8, 0.164), (16, 0.25)] {
        for _ in 0..3 {
            p.observe_verify(n, t);
        }
    }
    p.observe_draft(4, 1, 0.01, true);
    p.observe_draft(4, 3, 0.02, true);
    p
}

#[test]
fn after_drafting_it_verifies_only_what_pays() {
    let mut p = batch4_planner();
    // Lookup-like: one sequence in four proposed a token, accepted 40 %:
    // one more row costs 18 % of the step for 0.4 tokens.
    for s in 0..4 {
        for _ in 0..20 {
            p.observe_seq(s, 1, usize::from(s == 0));
        }
    }
    let keep = p
        .verify_counts(&[0, 1, 2, 3], &[0, 1, 0, 0], 0.0, None)
        .unwrap();
    assert_eq!(keep, vec![0, 0, 0, 0]);
    // A sure sequence's chain is worth its rows.
    for _ in 0..40 {
        p.observe_seq(0, 3, 3);
    }
    let keep = p
        .verify_counts(&[0, 1, 2, 3], &[3, 1, 0, 0], 0.0, None)
        .unwrap();
    assert_eq!(keep[0], 3, "{keep:?}");
    // Other modes verify everything.
    let mut r = Planner::new(PlannerConfig {
        mode: PlanMode::Random { seed: 1 },
        ..PlannerConfig::auto(3)
    })
    .unwrap();
    assert_eq!(r.verify_counts(&[0], &[3], 0.0, None), None);
}

#[test]
fn a_window_that_realised_less_than_no_draft_switches_the_drafter_off() {
    let mut p = batch4_planner();
    // Rounds that drafted emitted 4.4 tokens in 0.2 s: 22 tokens/s against
    // 4 / 0.127 = 31.5 without a draft, whatever the model predicted.
    for _ in 0..2 * REALITY_WINDOW - 1 {
        p.observe_round(4, 5, 0.2, true);
        assert!(!p.is_off(4));
    }
    p.observe_round(4, 4, 0.2, true);
    assert!(p.is_off(4));
    // A window that paid keeps it on.
    let mut q = batch4_planner();
    for _ in 0..3 * REALITY_WINDOW {
        q.observe_round(4, 6, 0.15, true);
        q.observe_round(4, 4, 0.13, false);
    }
    assert!(!q.is_off(4));
    // A drafter that costs nothing (prompt lookup) stays on: after drafting
    // the planner verifies only what pays.
    let mut f = batch4_planner();
    f.observe_draft(4, 1, 0.0001, true);
    f.observe_draft(4, 3, 0.0001, true);
    for _ in 0..10 {
        f.observe_draft(4, 1, 0.0001, true);
        f.observe_draft(4, 3, 0.0001, true);
    }
    for _ in 0..REALITY_WINDOW {
        f.observe_round(4, 4, 0.2, true);
    }
    assert!(!f.is_off(4));
}

#[test]
fn drafts_are_planned_no_deeper_than_the_drafter_goes() {
    let mut p = batch4_planner();
    for s in 0..4 {
        for _ in 0..20 {
            p.observe_seq(s, 3, 3);
        }
    }
    p.rounds = 4;
    assert_eq!(p.plan(&[0, 1, 2, 3]).draft_budget(), 3);
    // Asked for 3, the drafter returned chains of 2 at most.
    p.observe_depth(3, 2);
    p.observe_depth(1, 1);
    assert!(p.plan(&[0, 1, 2, 3]).draft_budget() <= 2);
}

/// A batch-1 planner that measured each `(rows, seconds)` of `verify` and
/// each `(budget, seconds)` of `draft` four times.
fn batch1_planner(verify: &[(usize, f64)], draft: &[(usize, f64)]) -> Planner {
    let mut p = Planner::new(PlannerConfig::auto(3)).unwrap();
    for &(n, t) in verify {
        for _ in 0..4 {
            p.observe_verify(n, t);
        }
    }
    for &(k, t) in draft {
        for _ in 0..4 {
            p.observe_draft(1, k, t, true);
        }
    }
    p
}

/// The H200's batch-1 costs (docs/bench/cuda-h200/2026-11-27c): a round
/// without a draft 2.2 ms, a one-token draft 0.5 ms; the plain decoder's
/// step 1.9 ms.
fn h200_b1_planner(plain: Option<f64>) -> Planner {
    let mut p = batch1_planner(
        &[(1, 2.2e-3), (2, 2.2e-3), (3, 2.36e-3), (4, 2.6e-3)],
        &[(1, 0.5e-3), (2, 0.9e-3), (3, 1.2e-3)],
    );
    if let Some(t) = plain {
        p.observe_plain_step(1, t);
    }
    // 35 % of first draft tokens accepted.
    for i in 0..40 {
        p.observe_seq(9, 1, usize::from(i % 20 < 7));
    }
    p
}

#[test]
fn the_drafter_stays_on_only_where_it_beats_the_plain_decoder() {
    // A one-token draft (1.35 tokens in 2.7 ms) beats the engine's no-draft
    // round (1 in 2.2 ms) by 10 %, but not the plain decoder (1 in 1.9 ms).
    let mut unaware = h200_b1_planner(None);
    assert!(!unaware.start_run(1), "no plain step measured: drafts");
    let mut p = h200_b1_planner(Some(1.9e-3));
    assert!((p.baseline_time(1).unwrap() - 1.9e-3).abs() < 1e-9);
    // Each round still chooses between a draft and a no-draft round.
    assert!((p.verify_time(1).unwrap() - 2.2e-3).abs() < 1e-9);
    assert!(
        p.start_run(1),
        "started with a drafter slower than the decoder"
    );
    // The ratio travels with the stored costs.
    let mut q = Planner::new(PlannerConfig::auto(3)).unwrap();
    q.seed_costs(&p.costs());
    let share = q.baseline_time(1).unwrap() / q.verify_time(1).unwrap();
    assert!((share - 1.9 / 2.2).abs() < 1e-9, "{share}");
    // A plain step slower than the round (noise) is the round; one far
    // faster is held at half of it.
    let mut slow = h200_b1_planner(Some(3.0e-3));
    assert!((slow.baseline_time(1).unwrap() - 2.2e-3).abs() < 1e-9);
    assert!(!slow.start_run(1));
    let fast = h200_b1_planner(Some(0.1e-3));
    assert!((fast.baseline_time(1).unwrap() - 1.1e-3).abs() < 1e-9);
}

#[test]
fn the_predicted_speedup_is_over_the_plain_decoder() {
    let mut p = h200_b1_planner(None);
    // Ten off rounds: planned as the plain decoder's steps, so 1x over it
    // whatever its cost.
    p.rounds_off(1, 10, 10);
    assert!((p.predicted_speedup(1).unwrap() - 1.0).abs() < 1e-9);
    let mut q = h200_b1_planner(Some(1.9e-3));
    q.predicted = (13.0, 10.0 * 2.7e-3);
    q.predicted_rounds = 10;
    // 1.3 tokens in 2.7 ms against 1 in 1.9 ms: 0.915x (1.06x over the
    // engine's no-draft round).
    let x = q.predicted_speedup(1).unwrap();
    assert!((x - 1.3 * 1.9 / 2.7).abs() < 1e-9, "{x}");
}

/// Batch 1 on a GPU (the H100 traces of docs/bench/cuda-h100/2026-11-26):
/// a round costs about the same at 1 to 4 rows, a drafter call a quarter
/// of it.
fn gpu_b1_planner() -> Planner {
    let mut p = batch1_planner(
        &[(1, 3.0e-3), (2, 3.0e-3), (3, 3.1e-3), (4, 3.2e-3)],
        &[(1, 0.7e-3), (2, 1.1e-3), (3, 1.2e-3)],
    );
    p.rounds = 4;
    p
}

#[test]
fn a_hard_stretch_on_one_sequence_does_not_switch_the_drafter_off() {
    let mut p = gpu_b1_planner();
    // Earlier sequences accepted half their first tokens: drafting pays on
    // average (break-even is about 0.23).
    for i in 0..40 {
        p.observe_seq(9, 1, i % 2);
    }
    // This one rejects everything for a while.
    let mut skipped = 0;
    for _ in 0..30 {
        let plan = p.plan(&[0]);
        let k = plan.draft_budget();
        skipped += usize::from(k == 0);
        p.observe_seq(0, k, 0);
        assert!(!plan.drafter_off, "switched off by one sequence's stretch");
    }
    assert!(
        skipped > 10,
        "the hard sequence kept its drafts ({skipped} skipped)"
    );
    assert!(!p.is_off(1));
    // A new sequence in another slot drafts again.
    assert!(p.plan(&[1]).draft_budget() > 0);
}

/// Plans rounds for sequence `slot` until the drafter goes off (at most
/// 100): each drafting round takes `slow` times its predicted seconds and
/// emits `emitted` tokens (its predicted tokens, rounded up, if `None`).
fn draft_until_off(p: &mut Planner, slot: usize, slow: f64, emitted: Option<usize>) {
    for _ in 0..100 {
        let plan = p.plan(&[slot]);
        if plan.drafter_off {
            return;
        }
        match plan.predicted {
            Some((t, s)) if plan.draft_budget() > 0 => {
                let n = emitted.unwrap_or(t.ceil() as usize);
                p.observe_round(1, n, s * slow, true);
            }
            _ => p.observe_round(1, 1, 3.0e-3, false),
        }
    }
}

#[test]
fn a_run_after_a_hard_stretch_judges_the_drafter_afresh_once() {
    let mut p = gpu_b1_planner();
    // Earlier sequences accepted half their first tokens: drafting pays.
    for i in 0..40 {
        p.observe_seq(9, 1, i % 2);
    }
    // This sequence's rounds took their predicted time and emitted one token
    // each: short by acceptance, and off.
    draft_until_off(&mut p, 0, 1.0, Some(1));
    assert!(p.is_off(1));
    assert!(
        !p.start_run(1),
        "the next run inherited a hard stretch's off"
    );
    // That run is hard too: now the drafter stays off until the retry.
    draft_until_off(&mut p, 1, 1.0, Some(1));
    assert!(p.is_off(1));
    assert!(p.start_run(1), "judged afresh twice in a row");
    // Off by its time (as many tokens as predicted, in twice the time):
    // costs do not change with the sequences, and the next run starts off.
    let mut q = gpu_b1_planner();
    for i in 0..40 {
        q.observe_seq(9, 1, i % 2);
    }
    draft_until_off(&mut q, 0, 2.0, None);
    assert!(q.is_off(1));
    assert!(q.start_run(1), "an off by costs was judged afresh");
}

/// SpecFormer's batch-1 costs on lavapipe (docs/bench/lavapipe/
/// issue34-eighth-grid): a one-token draft gains a few per cent at its
/// depth-1 acceptance of about 0.3 (`observe_seq` three times in ten).
fn marginal_b1_planner() -> Planner {
    let mut p = batch1_planner(
        &[(1, 0.140), (2, 0.146), (3, 0.165), (4, 0.170)],
        &[(1, 0.016), (2, 0.017), (3, 0.017)],
    );
    for i in 0..40 {
        p.observe_seq(9, 1, usize::from(i % 10 < 3));
    }
    p.rounds = 4;
    p
}

/// Plans `rounds` rounds for sequence 0; each drafting round takes its
/// predicted time and 1 % more (a shared host) and emits its sequence's
/// token plus `accepted(r)` of drafting round `r`.
fn run_marginal(p: &mut Planner, rounds: usize, accepted: impl Fn(usize) -> usize) {
    let mut r = 0;
    for _ in 0..rounds {
        let plan = p.plan(&[0]);
        match plan.predicted {
            Some((_, s)) if plan.draft_budget() > 0 => {
                let n = 1 + accepted(r).min(plan.draft_budget());
                p.observe_round(1, n, 1.01 * s, true);
                r += 1;
            }
            _ => p.observe_round(1, 1, 0.140, false),
        }
    }
}

#[test]
fn windows_short_by_acceptance_within_its_noise_do_not_switch_the_drafter_off() {
    // One draft token accepted in eight rounds, where the plan expects
    // about 0.3 a round: each window is short of the no-draft rate (9
    // tokens in 1.31 s against 0.97 / 0.140 s), but 2 of the 4.9
    // predicted over 16 rounds is within two standard deviations of the
    // count (2.2).
    let mut p = marginal_b1_planner();
    run_marginal(&mut p, 4 * REALITY_WINDOW, |r| usize::from(r % 8 == 0));
    assert!(!p.is_off(1), "off by binomial noise: {:?}", p.off_why(1));
    // Nothing accepted for 16 rounds is beyond it: off, by acceptance.
    let mut q = marginal_b1_planner();
    run_marginal(&mut q, 4 * REALITY_WINDOW, |_| 0);
    assert_eq!(q.off_why(1), Some(off::OffWhy::WindowAcceptance));
}

#[test]
fn an_off_drafter_is_tried_again_after_enough_rounds() {
    let mut p = gpu_b1_planner();
    // Nothing is ever accepted: the drafter goes off.
    for _ in 0..40 {
        let k = p.plan(&[0]).draft_budget();
        p.observe_seq(0, k, 0);
    }
    assert!(p.is_off(1));
    assert!(p.start_run(1), "tried again too soon");
    for _ in 0..RETRY_OFF {
        assert!(p.plan(&[0]).drafter_off);
    }
    assert!(!p.start_run(1), "never tried again");
    assert!(!p.is_off(1));
    // Still nothing accepted: off again, and the next retry waits twice as long.
    for _ in 0..40 {
        let k = p.plan(&[0]).draft_budget();
        p.observe_seq(0, k, 0);
    }
    assert!(p.is_off(1));
    for _ in 0..RETRY_OFF {
        p.plan(&[0]);
    }
    assert!(p.start_run(1));
    for _ in 0..RETRY_OFF {
        p.plan(&[0]);
    }
    assert!(!p.start_run(1));
}

#[test]
fn an_unsettled_row_count_that_caught_compiles_is_planned_again() {
    let mut p = Planner::new(PlannerConfig::auto(3)).unwrap();
    for (n, t, count) in [
        (1, 3.1e-3, 10),
        (2, 3.0e-3, 10),
        (3, 3.6e-3, 9),
        (4, 5.25e-3, 2),
    ] {
        for _ in 0..count {
            p.observe_verify(n, t);
        }
    }
    let v4 = p.verify_time(4).unwrap();
    assert!(v4 < 4.2e-3, "two compile-inflated samples kept: {v4}");
    // Measured again at its real cost, the row count takes it.
    p.observe_verify(4, 3.1e-3);
    assert!((p.verify_time(4).unwrap() - 3.1e-3).abs() < 1e-6);
    // A settled row count keeps its own average, however far off the line.
    for _ in 0..3 {
        p.observe_verify(6, 9.0e-3);
    }
    assert!((p.verify_time(6).unwrap() - 9.0e-3).abs() < 1e-6);
}

#[test]
fn one_settled_row_count_gives_no_line_to_doubt_others_by() {
    // Lavapipe at 16 sequences: the 16-row pass settled at 222 ms, the
    // 32-row pass was measured twice at 388 ms. One point has no slope:
    // the 32-row pass keeps its own cost, and a MagicDec draft (a full
    // target pass, 216 ms) does not look like it pays.
    let mut p = Planner::new(PlannerConfig::auto(1)).unwrap();
    for _ in 0..8 {
        p.observe_verify(16, 222e-3);
    }
    for _ in 0..2 {
        p.observe_verify(32, 388e-3);
        p.observe_draft(16, 1, 216e-3, true);
    }
    assert!((p.verify_time(32).unwrap() - 388e-3).abs() < 1e-6);
    for _ in 0..4 {
        p.observe_verify(15, 226e-3);
    }
    // Two settled row counts side by side: still too far to reach 32.
    assert!((p.verify_time(32).unwrap() - 388e-3).abs() < 1e-6);
    let slots: Vec<usize> = (0..16).collect();
    for &s in &slots {
        for _ in 0..20 {
            p.observe_seq(s, 1, 1);
        }
    }
    assert_eq!(p.plan(&slots).draft_budget(), 0);
}

#[test]
fn an_unsettled_drafter_cost_above_a_settled_larger_call_is_planned_again() {
    let mut p = Planner::new(PlannerConfig::auto(3)).unwrap();
    for _ in 0..3 {
        p.observe_draft(4, 1, 9.0e-3, true);
        p.observe_draft(4, 3, 23.0e-3, true);
    }
    // Two sequences left; their one call caught the drafter catching up.
    p.observe_draft(2, 1, 41.6e-3, true);
    assert!((p.draft_time(2, 1).unwrap() - 9.0e-3).abs() < 1e-9);
    // Measured again, its own cost.
    p.observe_draft(2, 1, 7.0e-3, true);
    assert!((p.draft_time(2, 1).unwrap() - 7.0e-3).abs() < 1e-9);
    // Nothing settled to compare with: its own samples.
    p.observe_draft(8, 3, 50.0e-3, true);
    assert!((p.draft_time(8, 3).unwrap() - 50.0e-3).abs() < 1e-9);
}

#[test]
fn context_enters_through_the_attention_term() {
    // A round over `rows` rows at context `ctx` (keys each row attends to).
    let truth = |rows: usize, ctx: f64| 0.05 + 0.002 * rows as f64 + 2e-5 * rows as f64 * ctx;
    let mut p = Planner::new(PlannerConfig::auto(3)).unwrap();
    // The warm-up measured every row count at a short context…
    p.set_context(100.0);
    for n in 1..=4 {
        for _ in 0..4 {
            p.observe_verify(n, truth(n, 100.0));
        }
    }
    assert_eq!(p.attention_cost(), 0.0, "no context change seen yet");
    // …then the run decoded one row a round as its context grew.
    for c in (100..=1000).step_by(10) {
        p.set_context(c as f64);
        p.observe_verify(1, truth(1, c as f64));
    }
    let a = p.attention_cost();
    assert!((a - 2e-5).abs() < 0.2e-5, "attention cost {a}");
    // Four rows, last measured at context 100, now cost what they cost at 1000.
    let (v4, want) = (p.verify_time(4).unwrap(), truth(4, 1000.0));
    assert!((v4 - want).abs() < 0.05 * want, "{v4} against {want}");
    assert!(
        truth(4, 100.0) < 0.5 * want,
        "the test must tell the two apart"
    );
    // A short run on a noisy host (±5 %, 64 tokens) fits nothing: a slope
    // from that little would move costs by more than it knows.
    let mut q = Planner::new(PlannerConfig::auto(3)).unwrap();
    let mut sim = Sim::rng(9);
    for c in 60..124 {
        q.set_context(c as f64);
        let noise = 1.0 + 0.1 * (sim.uniform() - 0.5);
        q.observe_verify(1, truth(1, c as f64) * noise);
    }
    assert_eq!(q.attention_cost(), 0.0);
}

#[test]
fn horizon_terms_match_their_definitions() {
    use super::horizon::{emission, normal_quantile};
    // Emitted tokens with P(j) = 0.8, 0.5: A ∈ {0, 1, 2} with chances
    // 0.2, 0.3, 0.5.
    let (mean, var) = emission(&[0.8, 0.5], 2);
    let (m2, v2) = (1.0 + 0.3 + 1.0, 0.3 + 4.0 * 0.5 - 1.3f64 * 1.3);
    assert!((mean - m2).abs() < 1e-12 && (var - v2).abs() < 1e-12);
    assert_eq!(emission(&[0.8, 0.5], 0), (1.0, 0.0));
    for (p, z) in [
        (0.5, 0.0),
        (0.975, 1.959_964),
        (0.01, -2.326_348),
        (0.9999, 3.719_016),
    ] {
        assert!(
            (normal_quantile(p) - z).abs() < 1e-5,
            "{p}: {}",
            normal_quantile(p)
        );
    }
}

/// A drafter whose confidence tells its good tokens from its bad ones
/// (half its tokens at probability 0.95, accepted 90 % of the time, half
/// at 0.15, accepted 10 %), on a device where a verified row costs 30 % of
/// the step: its average acceptance (50 %) pays for verifying every
/// token, its confidence says to verify only the good ones, and planning
/// by it is faster.
#[test]
fn the_drafters_confidence_cuts_the_tokens_that_do_not_pay() {
    let v = |rows: usize| 0.1 + 0.03 * (rows - 1) as f64;
    let run = |by_confidence: bool| {
        let mut p = Planner::new(PlannerConfig::auto(1)).unwrap();
        for n in 1..=3 {
            for _ in 0..3 {
                p.observe_verify(n, v(n));
            }
        }
        let mut sim = Sim::rng(7);
        let (mut tokens, mut time, mut low_verified, mut low) = (0.0, 0.0, 0, 0);
        for round in 0..4000 {
            let good = sim.uniform() < 0.5;
            let (c, accept) = if good { (0.95, 0.9) } else { (0.15, 0.1) };
            let conf = [vec![c]];
            let keep = p
                .verify_counts(&[0], &[1], 0.0, by_confidence.then_some(&conf[..]))
                .unwrap()[0];
            let accepted = usize::from(keep == 1 && sim.uniform() < accept);
            p.observe_seq(0, keep, accepted);
            if keep == 1 {
                p.observe_confidence(&[c], accepted);
            }
            if round >= 1000 {
                tokens += 1.0 + accepted as f64;
                time += v(1 + keep);
                if !good {
                    low += 1;
                    low_verified += keep;
                }
            }
        }
        (tokens / time, low_verified as f64 / low as f64)
    };
    let (blind, blind_low) = run(false);
    let (seeing, seeing_low) = run(true);
    // Expected: 1.5 / 0.13 = 11.5 tokens/s verifying everything, and
    // (0.95 + 0.5) / 0.115 = 12.6 verifying the good tokens only.
    assert!(
        blind_low > 0.9,
        "without confidences it verifies all: {blind_low}"
    );
    assert!(seeing_low < 0.1, "{seeing_low}");
    assert!(seeing > 1.05 * blind, "{seeing} against {blind}");
    // The bins hold what was verified.
    let mut p = Planner::new(PlannerConfig::auto(1)).unwrap();
    p.observe_confidence(&[0.95, 0.15, 0.5], 1);
    assert!(p.confidence_trials(9) > 0.99 && p.confidence_trials(1) > 0.99);
    assert_eq!(
        p.confidence_trials(5),
        0.0,
        "past the first rejection is not a trial"
    );
    assert!(p.alpha_at_confidence(0, 0, 0.95) > p.alpha(0, 0));
    assert!(p.alpha_at_confidence(0, 1, 0.15) < p.alpha(0, 1));
}

#[test]
fn a_retry_drafts_although_the_estimates_that_switched_it_off_do_not_pay() {
    let mut p = gpu_b1_planner();
    // Half the first tokens accepted, then a long stretch of rejections:
    // the losing rounds switch the drafter off, with many trials behind
    // a global estimate that does not pay.
    for r in 0..20 {
        let k = p.plan(&[0]).draft_budget();
        p.observe_seq(0, k, usize::from(r % 2 == 0).min(k));
    }
    assert!(!p.is_off(1));
    for _ in 0..60 {
        let k = p.plan(&[0]).draft_budget();
        p.observe_seq(0, k, 0);
    }
    assert!(p.is_off(1) && !p.pays_on_average(1) && !p.hopeless);
    assert!(p.global.at(0).1 >= START_TRIALS);
    assert!(p.start_run(1), "tried again too soon");
    for _ in 0..RETRY_OFF {
        p.plan(&[0]);
    }
    assert!(!p.start_run(1), "the retry was undone at round 0");
    assert!(p.plan(&[0]).draft_budget() > 0, "the retry drafts");
}

#[test]
fn a_run_started_off_by_drafts_that_lose_at_any_acceptance_is_not_retried() {
    // MagicDec in the README's main job on lavapipe: a one-token draft
    // costs a target pass (139 ms against a 141 ms round), and 92 % of
    // first tokens are accepted. No draft pays, so its runs start off; a
    // retry would only pay a losing draft again (it drafted one round in
    // the main job's third timed run, and printed 0.99x).
    let mut p = batch1_planner(
        &[(1, 0.141), (2, 0.149), (3, 0.168), (5, 0.209)],
        &[(1, 0.139), (2, 0.277), (4, 0.589)],
    );
    for i in 0..12 {
        p.observe_seq(9, 3, if i == 0 { 0 } else { 3 });
    }
    assert!(p.start_run(1), "a drafter that loses was started on");
    assert!(p.hopeless, "off at round 0 but not hopeless");
    for _ in 0..4 * RETRY_OFF {
        p.plan(&[0]);
    }
    assert!(p.start_run(1), "a hopeless drafter was tried again");
    // A drafter off at round 0 on its acceptance, which half its
    // rejections would make pay, is tried again.
    let mut q = h200_b1_planner(Some(1.9e-3));
    assert!(q.start_run(1) && !q.hopeless);
    for _ in 0..RETRY_OFF {
        q.plan(&[0]);
    }
    assert!(!q.start_run(1), "never tried again");
}
