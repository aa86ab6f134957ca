//! Planner tests over whole batch runs: a batch runs until its last
//! sequence is done, so the planner is judged on the run's rate, not its
//! rounds' (the batch-end check of `planner_horizon.rs` and the run check
//! of `Planner::end_run`), and its predicted speedup against the one
//! such runs realise.

use super::tests::Sim;
use super::*;

/// Tokens/s over whole batch runs of `tokens` tokens a sequence (a run
/// ends with its last sequence), `fixed` drafting `k` every round or,
/// without it, planned by one planner kept over the runs.
fn whole_runs(sim: &mut Sim, max: usize, fixed: Option<usize>, runs: usize, tokens: usize) -> f64 {
    let b = sim.alpha.len();
    let mut p = Planner::new(PlannerConfig::auto(max)).unwrap();
    let (mut emitted, mut secs) = (0usize, 0.0);
    for _ in 0..runs {
        // A planner that starts the run off runs the plain decoder.
        if fixed.is_none() && p.start_run(b) {
            secs += tokens as f64 * sim.verify(b);
            emitted += tokens * b;
            p.rounds_off(b, tokens, tokens * b);
            continue;
        }
        let mut room = vec![tokens; b];
        let run_start = secs;
        loop {
            let slots: Vec<usize> = (0..b).filter(|&i| room[i] > 0).collect();
            if slots.is_empty() {
                break;
            }
            p.set_rooms(slots.iter().map(|&i| (i, room[i])));
            let budgets: Vec<usize> = match fixed {
                Some(k) => vec![k; slots.len()],
                None => p.plan(&slots).budgets,
            };
            // Never past the room: the bonus needs one slot.
            let budgets: Vec<usize> = budgets
                .iter()
                .zip(&slots)
                .map(|(&k, &i)| k.min(room[i] - 1))
                .collect();
            let d = budgets.iter().copied().max().unwrap_or(0);
            let rows: usize = budgets.iter().map(|k| 1 + k).sum();
            let (dt, vt) = (sim.draft(d), sim.verify(rows));
            if d > 0 {
                p.observe_draft(slots.len(), d, dt, true);
            }
            p.observe_verify(rows, vt);
            secs += dt + vt;
            for (&i, &k) in slots.iter().zip(&budgets) {
                let mut a = 0;
                while a < k && sim.uniform() < sim.alpha[i] {
                    a += 1;
                }
                p.observe_seq(i, k, a);
                let n = (a + 1).min(room[i]);
                room[i] -= n;
                emitted += n;
            }
        }
        if fixed.is_none() {
            // Every sequence made its tokens after the prefill's first.
            p.end_run(&vec![tokens + 1; b], secs - run_start);
        }
    }
    emitted as f64 / secs
}

fn lavapipe_batch4(alpha: f64, rng: u64) -> Sim {
    // Lavapipe at four sequences: 116 ms for four rows, 152 ms for eight
    // (docs/planner-measured.md's traces), a 10 ms one-token drafter call.
    Sim::line((0.080, 0.009), (0.0, 0.010), vec![alpha; 4], rng)
}

#[test]
fn over_whole_batch_runs_auto_does_not_draft_what_does_not_pay() {
    // One token accepted 45 % of the time: a round drafting one token for
    // all four sequences predicts 1.04x, within the planner's margin; over
    // 31-token runs, which end with their slowest sequence, fixed drafts
    // lose.
    let ar = whole_runs(&mut lavapipe_batch4(0.45, 3), 3, Some(0), 40, 31);
    let fixed1 = whole_runs(&mut lavapipe_batch4(0.45, 3), 3, Some(1), 40, 31);
    let auto = whole_runs(&mut lavapipe_batch4(0.45, 3), 3, None, 40, 31);
    assert!(fixed1 < ar, "fixed 1 {fixed1} autoregressive {ar}");
    assert!(auto >= 0.99 * ar, "auto {auto} autoregressive {ar}");
    // Where drafts pay over the run, auto drafts.
    let ar = whole_runs(&mut lavapipe_batch4(0.75, 4), 3, Some(0), 40, 31);
    let fixed1 = whole_runs(&mut lavapipe_batch4(0.75, 4), 3, Some(1), 40, 31);
    let auto = whole_runs(&mut lavapipe_batch4(0.75, 4), 3, None, 40, 31);
    assert!(fixed1 > 1.05 * ar, "fixed 1 {fixed1} autoregressive {ar}");
    assert!(auto >= 0.95 * fixed1, "auto {auto} fixed 1 {fixed1}");
}

#[test]
fn a_sequence_that_races_ahead_does_not_leave_the_batch_to_finish_alone() {
    // Prompt lookup at four sequences on lavapipe's measured pass times
    // (three rows cost nearly what four do): one sequence copies (92 % of
    // its draft tokens accepted), three accept 30 %. Drafting the copying
    // sequence pays per round, but it finishes early and leaves the three
    // others to run their last rounds alone. Without the batch-end check
    // this planner made 0.93x of autoregressive decoding.
    let lookup = || Sim {
        table: true,
        ..Sim::line((0.0, 0.0), (0.0, 0.00002), vec![0.92, 0.3, 0.3, 0.3], 3)
    };
    let ar = whole_runs(&mut lookup(), 3, Some(0), 60, 31);
    let fixed1 = whole_runs(&mut lookup(), 3, Some(1), 60, 31);
    let auto = whole_runs(&mut lookup(), 3, None, 60, 31);
    assert!(fixed1 < ar, "fixed 1 {fixed1} autoregressive {ar}");
    assert!(auto >= 0.96 * ar, "auto {auto} autoregressive {ar}");
}

/// Beagle at four sequences on lavapipe (docs/bench/lavapipe traces):
/// 215 ms for four rows, 255 ms for eight, an 18 ms one-token call.
fn beagle_batch4(alpha: Vec<f64>) -> Sim {
    Sim {
        verify_a: 0.175,
        verify_c: 0.010,
        draft_c: 0.018,
        alpha,
        ..lavapipe_batch4(0.0, 3)
    }
}

#[test]
fn a_batch_run_slower_than_the_plain_decoder_switches_the_drafter_off() {
    // Sequences that differ: two accept most one-token drafts, two few. A
    // round that drafts the first two pays, but they finish early and the
    // other two run the last rounds alone. The round model and the batch-end
    // check still draft, and over whole runs lose (0.965x without the run
    // check); a run slower than the plain decoder's estimate stops that.
    let alpha = vec![0.8, 0.6, 0.2, 0.1];
    let ar = whole_runs(&mut beagle_batch4(alpha.clone()), 3, Some(0), 40, 31);
    let auto = whole_runs(&mut beagle_batch4(alpha), 3, None, 40, 31);
    assert!(auto >= 0.985 * ar, "auto {auto} autoregressive {ar}");
    // Where a one-token draft pays over the run, auto keeps most of it: a
    // run unlucky by more than the margin costs the drafter its next runs.
    let alpha = vec![0.45; 4];
    let ar = whole_runs(&mut beagle_batch4(alpha.clone()), 3, Some(0), 40, 31);
    let fixed1 = whole_runs(&mut beagle_batch4(alpha.clone()), 3, Some(1), 40, 31);
    let auto = whole_runs(&mut beagle_batch4(alpha), 3, None, 40, 31);
    assert!(fixed1 > 1.05 * ar, "fixed 1 {fixed1} autoregressive {ar}");
    assert!(auto >= 0.96 * fixed1, "auto {auto} fixed 1 {fixed1}");
}

#[test]
fn the_run_check_compares_with_the_plain_decoder_on_the_same_tokens() {
    let mut p = Planner::new(PlannerConfig::auto(1)).unwrap();
    for (rows, t) in [(1, 0.1), (2, 0.2), (3, 0.3), (4, 0.4)] {
        for _ in 0..3 {
            p.observe_verify(rows, t);
        }
    }
    // Lengths 3 and 2 (first tokens from the prefill): a step over both
    // sequences, then one over the longer.
    let plain = p.plain_run_time(&[3, 2]).unwrap();
    assert!((plain - 0.3).abs() < 1e-9, "{plain}");
    // A timed plain step at the whole batch scales its smaller tails too.
    p.set_step_ratio(2, 0.9);
    let plain = p.plain_run_time(&[3, 2]).unwrap();
    assert!((plain - 0.27).abs() < 1e-9, "{plain}");
    // Within the margin: on; past it: off, as a cost (no fresh judgement
    // at the next run).
    assert_eq!(p.end_run(&[3, 2], 0.275), Some(plain));
    assert!(!p.is_off(2));
    p.end_run(&[3, 2], 0.29);
    assert!(p.is_off(2) && p.start_run(2));
    // One sequence: its rounds are its run, judged by the reality windows.
    p.end_run(&[40], 100.0);
    assert!(!p.is_off(1));
    assert_eq!(p.end_run(&[40], 100.0), None);
}

#[test]
fn the_predicted_speedup_counts_the_draft_lookup_actually_proposed() {
    // Prompt lookup at batch 1 on lavapipe (the ninth grid's trace): a
    // pass of 140 ms plus 6 ms a row, drafting for free, proposing where
    // the history matches (44 % of rounds), each token accepted at 0.38.
    let mut sim = Sim::line((0.140, 0.006), (0.0, 0.0), vec![0.38], 7);
    let mut p = Planner::new(PlannerConfig::auto(3)).unwrap();
    // The costs a warm-up measures.
    for rows in 1..=4 {
        p.observe_verify(rows, sim.verify(rows));
        if rows < 4 {
            p.observe_draft(1, rows, 0.0, true);
        }
    }
    p.observe_plain_step(1, sim.verify(1));
    let (mut emitted, mut secs) = (0usize, 0.0);
    for _ in 0..3000 {
        let k = p.plan(&[0]).budgets[0];
        let mut rows = 1;
        let mut accepted = 0;
        if k > 0 {
            let proposed = if sim.uniform() < 0.44 { k } else { 0 };
            p.observe_depth(k, proposed);
            let keep = p
                .verify_counts(&[0], &[proposed], 0.0, None)
                .map_or(proposed, |c| c[0]);
            p.observe_draft(1, k, 0.0, true);
            while accepted < keep && sim.uniform() < sim.alpha[0] {
                accepted += 1;
            }
            rows += keep;
            p.observe_seq(0, keep, accepted);
        }
        let t = sim.verify(rows);
        p.observe_verify(rows, t);
        p.observe_round(1, accepted + 1, t, k > 0);
        emitted += accepted + 1;
        secs += t;
    }
    let measured = emitted as f64 / secs * sim.verify(1);
    let predicted = p.predicted_speedup(1).unwrap();
    assert!(
        (predicted / measured - 1.0).abs() < 0.05,
        "predicted {predicted:.3}x, realised {measured:.3}x"
    );
}
