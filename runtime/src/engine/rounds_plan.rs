//! The planner's side of a [`Batch`]'s rounds: each decoding sequence's
//! draft budget under the current batch, the drafter's off switch (a join
//! or a leave starts a stretch the planner judges; off at a batch size
//! stays off at every larger one for a while), and the books the planner
//! keeps from each round (acceptance always, costs only for rounds without
//! prompt rows: its tables are per verify width).

use std::time::Instant;

use cubecl::prelude::*;

use super::rounds::{Batch, Parts};
use super::speculative::DraftPolicy;

/// What [`Batch::plan_books`] reads of a round.
pub(super) struct RoundFacts<'a> {
    pub decoding: &'a [usize],
    /// Per decoding sequence: (tree depth, accepted nodes).
    pub per_seq: &'a [(usize, usize)],
    pub conf: &'a [Vec<f64>],
    pub drafted: bool,
    pub budget: usize,
    pub draft_s: f64,
    pub decode_rows: usize,
    pub prompt_rows: bool,
    pub emitted: usize,
    /// When the round and its pass started.
    pub started: (Instant, Instant),
}

impl Batch {
    /// Stops drafting for every running sequence (the planner switched the
    /// drafter off); sequences that join later draft again.
    fn go_off<R: Runtime>(&mut self, cx: &mut Parts<'_, R>) {
        if !self.drafter_off {
            self.stats.drafter_off_at = Some(self.stats.rounds);
        }
        self.drafter_off = true;
        for s in &mut self.seqs {
            if s.synced {
                s.synced = false;
                if let Some(d) = cx.drafter.as_deref_mut() {
                    d.reset(s.slot);
                }
            }
        }
    }

    /// A planner's judgement of a batch of `batch` sequences starting now
    /// (a join, a leave): whether the drafter is off for it.
    pub(super) fn start_stretch<R: Runtime>(&mut self, cx: &mut Parts<'_, R>, batch: usize) {
        let DraftPolicy::Planned(p) = &mut *cx.policy else {
            return;
        };
        if cx.drafter.is_none() {
            return;
        }
        self.planned_batch = batch;
        // The planner keeps one batch size off at a time (a static run has
        // one); here the batch size moves every few rounds, and each new
        // size would switch the drafter back on, draft losing rounds and
        // prefill its joiners whole. Off at a batch size stays off at every
        // larger one (a draft pays less the larger the batch) until
        // `off_rounds_left` runs out (doubling each time, as the planner's
        // own retries), when a larger batch is judged afresh.
        let sticky = matches!(self.off_from, Some(b) if batch >= b && self.off_rounds_left > 0);
        let off = sticky || p.start_run(batch);
        if off != self.drafter_off && self.plan_debug {
            eprintln!(
                "planner: batch of {batch}: drafter {}{}",
                if off { "off" } else { "on" },
                p.off_why(batch)
                    .map_or(String::new(), |w| format!(" ({w})"))
            );
        }
        if off && !self.drafter_off {
            self.stats.drafter_off_at = Some(self.stats.rounds);
        }
        self.drafter_off = off;
        if off && !sticky {
            self.went_off(batch);
        }
    }

    /// The planner switched the drafter off at `batch` sequences: off at
    /// every larger batch too, for the next `off_retry` rounds.
    fn went_off(&mut self, batch: usize) {
        if self.off_from.is_none_or(|b| batch < b) {
            self.off_from = Some(batch);
            self.off_rounds_left = self.off_retry;
            self.off_retry *= 2;
        }
    }

    /// Per decoding sequence (indices into `seqs`), its draft budget.
    pub(super) fn budgets<R: Runtime>(
        &mut self,
        cx: &mut Parts<'_, R>,
        decoding: &[usize],
    ) -> Vec<usize> {
        let mut budgets = vec![0; decoding.len()];
        if cx.drafter.is_none() || decoding.is_empty() {
            return budgets;
        }
        let batch = decoding.len();
        if matches!(cx.policy, DraftPolicy::Planned(_))
            && batch != self.planned_batch
            && !self.fixed
        {
            self.start_stretch(cx, batch);
        }
        let mut went_off = false;
        match &mut *cx.policy {
            DraftPolicy::Fixed(k) => {
                for (b, &i) in budgets.iter_mut().zip(decoding) {
                    if self.seqs[i].synced {
                        *b = *k;
                    }
                }
            }
            DraftPolicy::Planned(p) => {
                if self.drafter_off || !decoding.iter().any(|&i| self.seqs[i].synced) {
                    p.rounds_off(batch, 1, batch);
                } else {
                    let slots: Vec<usize> = decoding.iter().map(|&i| self.seqs[i].slot).collect();
                    let ctx = decoding
                        .iter()
                        .map(|&i| self.seqs[i].tokens.len())
                        .sum::<usize>() as f64
                        / batch as f64;
                    p.set_context(ctx);
                    p.set_rooms(decoding.iter().map(|&i| {
                        let s = &self.seqs[i];
                        (s.slot, s.room())
                    }));
                    let plan = p.plan(&slots);
                    if plan.drafter_off {
                        if self.plan_debug {
                            eprintln!(
                                "planner: batch of {batch}: drafter off{}",
                                p.off_why(batch)
                                    .map_or(String::new(), |w| format!(" ({w})"))
                            );
                        }
                        went_off = true;
                    } else {
                        for ((b, &k), &i) in budgets.iter_mut().zip(&plan.budgets).zip(decoding) {
                            if self.seqs[i].synced {
                                *b = k;
                            }
                        }
                    }
                }
            }
        }
        if went_off {
            self.went_off(batch);
        }
        if went_off || self.drafter_off {
            self.go_off(cx);
            budgets.iter_mut().for_each(|b| *b = 0);
        }
        budgets
    }

    /// The planner's books after a round: acceptance always; costs only
    /// for passes without prompt rows (its tables are per verify width).
    pub(super) fn plan_books<R: Runtime>(&mut self, cx: &mut Parts<'_, R>, f: RoundFacts<'_>) {
        let DraftPolicy::Planned(p) = &mut *cx.policy else {
            return;
        };
        for (j, &i) in f.decoding.iter().enumerate() {
            let (levels, acc) = f.per_seq[j];
            if f.drafted && self.seqs[i].synced {
                p.observe_seq(self.seqs[i].slot, levels, acc);
                if let Some(c) = f.conf.get(j) {
                    p.observe_confidence(&c[..c.len().min(levels)], acc);
                }
            }
        }
        if !f.prompt_rows && !f.decoding.is_empty() && !self.drafter_off {
            let batch = f.decoding.len();
            if f.drafted {
                p.observe_draft(batch, f.budget, f.draft_s, self.drafted_last);
            }
            let (t0, tv) = f.started;
            p.observe_verify(f.decode_rows, tv.elapsed().as_secs_f64());
            p.observe_round(batch, f.emitted, t0.elapsed().as_secs_f64(), f.drafted);
        }
    }
}
