//! The planner's cost tables read back (`Planner::verify_time`,
//! `Planner::draft_time`, `Planner::baseline_time`): a row count's or a
//! drafter call's own average, the least-squares line through the table
//! where it has none, the guards against samples that caught a compile or a
//! catch-up, and the plain decoder's step as a share of the no-draft round.

use super::{Ema, Planner, SETTLED, SPIKE, SUSPECT, SUSPECT_REACH};

/// The least a plain decoder's step is taken to cost, as a share of the
/// no-draft round (a smaller measured share is a noisy sample).
const STEP_RATIO_MIN: f64 = 0.5;

impl Planner {
    /// Seconds of the plain decoder's step at `seqs` sequences: what a
    /// round costs with the drafter off, the baseline every on/off decision
    /// and the predicted speedup compare with. The no-draft round's time
    /// ([`Planner::verify_time`]) scaled by the share the warm-up measured
    /// ([`Planner::observe_plain_step`]; 1 where none was measured).
    pub fn baseline_time(&self, seqs: usize) -> Option<f64> {
        self.baseline_time_or(seqs, 1.0)
    }

    /// [`Planner::baseline_time`], with `ratio` as the plain step's share
    /// where none was timed at `seqs` sequences.
    pub(super) fn baseline_time_or(&self, seqs: usize, ratio: f64) -> Option<f64> {
        let v0 = self.verify_time(seqs)?;
        Some(v0 * self.step_ratio.get(&seqs).copied().unwrap_or(ratio))
    }

    /// The plain decoder took `seconds` a step at `seqs` sequences (the
    /// warm-up times it right after its planned rounds, at their context):
    /// kept as a share of this planner's no-draft round at that batch, in
    /// `[STEP_RATIO_MIN, 1]`. Nothing is kept before a no-draft round was
    /// measured.
    pub fn observe_plain_step(&mut self, seqs: usize, seconds: f64) {
        if let Some(v0) = self.verify_time(seqs) {
            if seconds.is_finite() && seconds > 0.0 {
                self.set_step_ratio(seqs, seconds / v0);
            }
        }
    }

    /// Keeps `ratio` (clamped) as the plain step's share at `seqs`.
    pub(super) fn set_step_ratio(&mut self, seqs: usize, ratio: f64) {
        if seqs > 0 && ratio.is_finite() && ratio > 0.0 {
            self.step_ratio
                .insert(seqs, ratio.clamp(STEP_RATIO_MIN, 1.0));
        }
    }

    /// Predicted round time without a draft over `rows` rows: the row
    /// count's own average once it was measured twice (a kernel's cost is
    /// a step function of its rows: lavapipe's linears block rows by 1, 2,
    /// 4 and 8, a GPU's by its tiles), else the line through the table.
    pub fn verify_time(&self, rows: usize) -> Option<f64> {
        let (base, at) = self.verify_time_measured(rows)?;
        // Moved to this round's context along the attention term (never
        // below half the measured time).
        if !at.is_finite() {
            return Some(base);
        }
        let moved = base + self.attention_cost() * rows as f64 * (self.ctx - at);
        Some(moved.max(0.5 * base))
    }

    /// [`Planner::verify_time`] as measured, and the context it was
    /// measured at.
    fn verify_time_measured(&self, rows: usize) -> Option<(f64, f64)> {
        let mean_ctx = || {
            let (w, c) = self
                .verify
                .values()
                .filter(|e| e.ctx.is_finite())
                .fold((0.0, 0.0), |(w, c), e| {
                    (w + e.count as f64, c + e.count as f64 * e.ctx)
                });
            if w > 0.0 {
                c / w
            } else {
                self.ctx
            }
        };
        if let Some(e) = self.verify.get(&rows).filter(|e| e.count >= 2) {
            // Two samples that both caught compiles (a GPU compiles kernels
            // per row count) would keep the row count unplanned, and so
            // unmeasured, for good: until it settles, it costs at most what
            // the settled row counts' line says, give or take.
            // The line must rest on two settled row counts and reach at
            // most a third past them: one settled point gives no slope
            // (lavapipe at 16 sequences planned a 32-row pass at the
            // 16-row cost, 222 ms against 388 ms measured twice, and
            // drafted a MagicDec round that lost).
            let settled: Vec<usize> = self
                .verify
                .iter()
                .filter(|(_, e)| e.count >= SETTLED)
                .map(|(&n, _)| n)
                .collect();
            let near = settled.len() >= 2
                && settled
                    .last()
                    .is_some_and(|&m| m as f64 >= rows as f64 / SUSPECT_REACH);
            if e.count < SETTLED && near {
                let line = self.line(rows, |e| e.count >= SETTLED);
                if let Some(l) = line.filter(|&l| e.value > SUSPECT * l) {
                    return Some((l, mean_ctx()));
                }
            }
            return Some((e.value, e.ctx));
        }
        if self.verify.len() < 2 {
            return self.verify.get(&rows).map(|e| (e.value, e.ctx));
        }
        // Weighted least squares over the keys (weight = samples, capped);
        // a row count seen once at more than twice the slowest row count
        // seen twice is a compile, not a cost, until a second sample says
        // otherwise.
        let settled = self
            .verify
            .values()
            .filter(|e| e.count >= 2)
            .map(|e| e.value)
            .fold(0.0f64, f64::max);
        self.line(rows, |e| {
            e.count >= 2 || settled == 0.0 || e.value <= SPIKE * settled
        })
        .map(|l| (l, mean_ctx()))
    }

    /// The weighted least-squares line (weight = samples, capped at 8;
    /// never sloping down) through the row counts `keep` accepts, at
    /// `rows`; `None` when it keeps none.
    fn line(&self, rows: usize, keep: impl Fn(&Ema) -> bool) -> Option<f64> {
        let (mut sw, mut sx, mut sy, mut sxx, mut sxy) = (0.0, 0.0, 0.0, 0.0, 0.0);
        for (&n, e) in self.verify.iter().filter(|(_, e)| keep(e)) {
            let w = e.count.min(8) as f64;
            let x = n as f64;
            sw += w;
            sx += w * x;
            sy += w * e.value;
            sxx += w * x * x;
            sxy += w * x * e.value;
        }
        if sw == 0.0 {
            return None;
        }
        let var = sxx * sw - sx * sx;
        let slope = if var > 1e-12 {
            ((sxy * sw - sx * sy) / var).max(0.0)
        } else {
            0.0
        };
        let icpt = (sy - slope * sx) / sw;
        Some((icpt + slope * rows as f64).max(1e-9))
    }

    /// Predicted drafter call time for `seqs` sequences at `budget`.
    pub fn draft_time(&self, seqs: usize, budget: usize) -> Option<f64> {
        if let Some(e) = self.draft.get(&(seqs, budget)) {
            // An unsettled call costing more than a settled call for at
            // least as many sequences at least as deep is a compile or a
            // catch-up caught in its few samples: planned at that call's
            // cost until it settles (else it is never planned, so never
            // measured again: two sequences left at the end of a batch on
            // lavapipe kept a 41.6 ms catch-up as their one-token cost, 9 ms
            // settled at four sequences).
            if e.count < SETTLED {
                let bound = self
                    .draft
                    .iter()
                    .filter(|(&(b, k), o)| b >= seqs && k >= budget && o.count >= SETTLED)
                    .map(|(_, o)| o.value)
                    .fold(f64::INFINITY, f64::min);
                if e.value > SUSPECT * bound {
                    return Some(bound);
                }
            }
            return Some(e.value);
        }
        // The same batch at other budgets: nearest, scaled by the slope.
        let same: Vec<(usize, f64)> = self
            .draft
            .iter()
            .filter(|((b, _), _)| *b == seqs)
            .map(|((_, k), e)| (*k, e.value))
            .collect();
        let pool: Vec<(usize, f64)> = if same.is_empty() {
            // Nearest batch size that was measured.
            let b = self
                .draft
                .keys()
                .map(|(b, _)| *b)
                .min_by_key(|b| b.abs_diff(seqs))?;
            self.draft
                .iter()
                .filter(|((bb, _), _)| *bb == b)
                .map(|((_, k), e)| (*k, e.value))
                .collect()
        } else {
            same
        };
        let &(k0, t0) = pool.iter().min_by_key(|(k, _)| k.abs_diff(budget))?;
        let slope = if pool.len() >= 2 {
            let (lo, hi) = (pool[0], pool[pool.len() - 1]);
            ((hi.1 - lo.1) / (hi.0 - lo.0).max(1) as f64).max(0.0)
        } else {
            0.0
        };
        Some((t0 + slope * (budget as f64 - k0 as f64)).max(0.0))
    }
}
