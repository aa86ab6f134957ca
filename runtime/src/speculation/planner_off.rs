//! When the planner's drafter is off: switching it off (losing rounds, the
//! reality check of the realised rate, a batch run slower than the plain
//! decoder would have been), starting a run off, trying it again
//! after [`RETRY_OFF`] rounds, and judging it afresh when a new run starts
//! after a hard stretch of text switched it off.
//!
//! An off drafter is a batch size's state, and it outlives the run that set
//! it. Why it went off decides how soon a new run may undo it:
//! * **costs** (a window took longer than the model predicted, no draft
//!   pays at the global acceptance, or a batch run took longer than the
//!   plain decoder would have): the next runs start off until the retry;
//! * **acceptance** (a window's rounds took the predicted time but emitted
//!   fewer tokens than predicted, by the larger factor): those sequences
//!   were a hard stretch. The next run has other sequences, and starts on
//!   if a draft pays at the global acceptance estimates. It does this once:
//!   if that run also goes off by acceptance, the retry rule holds again.
//!   Windows short by acceptance within the binomial noise of what the plan
//!   predicted do not count: a marginal drafter would go off at random.
//!
//!   On lavapipe one held-out prompt rejected Beagle's first ten
//!   three-token drafts; the drafter went off and stayed off for the next
//!   prompts' 64 rounds, and auto measured 1.09x where a fixed one-token
//!   draft measured 1.26x (docs/bench/lavapipe/issue34-baseline-grid).

use super::{
    PlanMode, Planner, ACCEPT_NOISE_SD, DRAFT_MARGIN, FREE_DRAFT, REALITY_MARGIN, REALITY_WINDOW,
    RETRY_GAIN, START_TRIALS,
};

#[cfg(doc)]
use super::RETRY_OFF;

/// Why the drafter went off: the rule that switched it off, which also
/// decides how soon a new run may undo it (module docs). Shown in the
/// round trace (`DRAFTC_PLAN_DEBUG=rounds`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OffWhy {
    /// [`OFF_AFTER`](super::OFF_AFTER) planned rounds in a row in which no
    /// draft paid at the batch's average acceptance.
    #[default]
    Losing,
    /// A run started off: at the measured costs no draft pays, or none at
    /// the acceptance estimated so far.
    AtStart,
    /// Two reality windows in a row fell short by their time.
    WindowTime,
    /// Two reality windows in a row fell short by what they emitted (a
    /// hard stretch of text).
    WindowAcceptance,
    /// A batch run took longer than the plain decoder would have.
    BatchRun,
}

impl std::fmt::Display for OffWhy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            OffWhy::Losing => "losing rounds",
            OffWhy::AtStart => "at the run's start",
            OffWhy::WindowTime => "short windows, by time",
            OffWhy::WindowAcceptance => "short windows, by acceptance",
            OffWhy::BatchRun => "a batch run slower than the plain decoder",
        })
    }
}

/// A reality check's window: realised tokens, seconds and rounds of the
/// drafting rounds, and the predicted tokens, seconds and rounds of those
/// that [`Planner::plan`] planned.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Window {
    tokens: f64,
    seconds: f64,
    rounds: usize,
    pred_tokens: f64,
    pred_seconds: f64,
    pred_rounds: usize,
}

impl Window {
    /// Both windows' sums.
    fn plus(&self, o: &Window) -> Window {
        Window {
            tokens: self.tokens + o.tokens,
            seconds: self.seconds + o.seconds,
            rounds: self.rounds + o.rounds,
            pred_tokens: self.pred_tokens + o.pred_tokens,
            pred_seconds: self.pred_seconds + o.pred_seconds,
            pred_rounds: self.pred_rounds + o.pred_rounds,
        }
    }

    /// Why windows that fell short (these sums, of `seqs` sequences) switch
    /// the drafter off: by acceptance when emitted over predicted tokens is
    /// below predicted over realised time (acceptance lost more than time
    /// did), else by time. `None` when short by acceptance but within
    /// [`ACCEPT_NOISE_SD`] of the predicted draft tokens: the plan priced
    /// that noise in.
    fn why_short(&self, seqs: usize) -> Option<OffWhy> {
        let by_acceptance = self.pred_rounds == self.rounds
            && self.pred_tokens > 0.0
            && self.seconds > 0.0
            && self.tokens / self.pred_tokens < self.pred_seconds / self.seconds;
        if !by_acceptance {
            return Some(OffWhy::WindowTime);
        }
        // Beyond the one token a sequence-round emits without a draft.
        let drafted = (self.pred_tokens - (self.pred_rounds * seqs) as f64).max(0.0);
        let shortfall = self.pred_tokens - self.tokens;
        (shortfall > ACCEPT_NOISE_SD * drafted.sqrt()).then_some(OffWhy::WindowAcceptance)
    }
}

impl Planner {
    /// Whether every measured drafter call at `seqs` sequences costs less
    /// than [`FREE_DRAFT`] of a no-draft round.
    pub(super) fn free_drafter(&self, seqs: usize) -> bool {
        let Some(v0) = self.verify_time(seqs) else {
            return false;
        };
        let calls: Vec<f64> = self
            .draft
            .iter()
            .filter(|((b, _), _)| *b == seqs)
            .map(|(_, e)| e.value)
            .collect();
        !calls.is_empty() && calls.iter().all(|&t| t < FREE_DRAFT * v0)
    }

    /// Whether the drafter is off for a batch of `seqs` sequences (a run
    /// that starts off does not feed the drafter its prompts either).
    pub fn is_off(&self, seqs: usize) -> bool {
        self.cfg.mode == PlanMode::Auto && self.off_at == Some(seqs)
    }

    /// Why the drafter is off at `seqs` sequences, if it is.
    pub fn off_why(&self, seqs: usize) -> Option<OffWhy> {
        self.is_off(seqs).then_some(self.off_why)
    }

    /// Switches the drafter off at `seqs` sequences, for `why`.
    /// Hopeless when even with half the rejections it now sees a draft
    /// would not gain [`RETRY_GAIN`]: then its costs lose, not a hard
    /// stretch of text, and a retry would only pay its own rounds again.
    pub(super) fn switch_off(&mut self, seqs: usize, why: OffWhy) {
        self.off_at = Some(seqs);
        self.off_rounds = 0;
        self.off_why = why;
        let mut p = 1.0;
        let hopeful: Vec<f64> = (0..self.cfg.max_budget)
            .map(|j| {
                p *= 1.0 - (1.0 - self.alpha(usize::MAX, j)) / 2.0;
                p
            })
            .collect();
        self.hopeless = self.beats_no_draft(&vec![hopeful; seqs], RETRY_GAIN) == Some(false);
    }

    /// Turns the drafter back on, its off counters and reality windows
    /// cleared.
    fn switch_on(&mut self) {
        self.off_at = None;
        self.off_rounds = 0;
        self.losing = 0;
        self.window = Window::default();
        self.short_window = None;
    }

    /// Whether a run of `seqs` sequences starts with the drafter off:
    /// [`Planner::is_off`], unless it has been off for [`RETRY_OFF`]
    /// rounds (doubling with each retry), when this run tries it again, or
    /// a hard stretch switched it off and a draft pays at the global
    /// acceptance (module docs); never for a hopeless drafter (MagicDec on
    /// a 135M target: it accepts almost everything, and its draft steps
    /// still cost too much).
    ///
    /// A run also starts off when, at the measured costs, no draft would
    /// pay even if every draft token were accepted, or would not at the
    /// batch's average acceptance as estimated so far (a warm-up's, at
    /// least [`START_TRIALS`] first-depth trials): the off rule applied
    /// before the first round instead of after four (MagicDec on
    /// lavapipe: a one-token draft costs a target pass). A retry is exempt
    /// from the acceptance half of that rule: it would otherwise undo every
    /// retry of a drafter that the losing rounds switched off, whose global
    /// estimates do not pay by definition, and the drafter would never be
    /// tried again.
    pub fn start_run(&mut self, seqs: usize) -> bool {
        let mut retry = false;
        if !self.is_off(seqs) {
            self.rejudged = false;
        } else if !self.hopeless && self.off_rounds >= self.retry_after {
            self.switch_on();
            self.retry_after *= 2;
            self.rejudged = false;
            retry = true;
        } else if !self.hopeless
            && self.off_why == OffWhy::WindowAcceptance
            && !self.rejudged
            && self.pays_on_average(seqs)
        {
            self.switch_on();
            self.rejudged = true;
        }
        let costs_known = (1..=self.cfg.max_budget).any(|d| self.draft_time(seqs, d).is_some());
        let never = || {
            self.beats_no_draft(&vec![vec![1.0; self.cfg.max_budget]; seqs], DRAFT_MARGIN)
                == Some(false)
        };
        // The off rule at round 0, on the warm-up's acceptance estimates;
        // not for a retry, whose estimates are the ones that switched the
        // drafter off: the retry is there to measure them again.
        let not_on_average =
            || !retry && self.global.at(0).1 >= START_TRIALS && !self.pays_on_average(seqs);
        if self.cfg.mode == PlanMode::Auto
            && !self.is_off(seqs)
            && !self.free_drafter(seqs)
            && costs_known
            && (never() || not_on_average())
        {
            // As the losing rounds switch it off, hopeless included: a
            // drafter whose drafts lose even at half its rejections is not
            // retried (MagicDec: a retry drafted one losing round in the
            // main job's third timed run).
            self.switch_off(seqs, OffWhy::AtStart);
        }
        self.is_off(seqs)
    }

    /// A run of `lengths.len()` sequences in the speculative engine ended
    /// after `seconds` of decoding, sequence `i` with `lengths[i]` tokens
    /// (its first from the prefill). At two sequences or more, a run slower
    /// than the plain decoder would have been on the same tokens, by more
    /// than the reality check's margin, switches the drafter off at that
    /// batch size, as a cost (the retry rule brings it back). Returns the
    /// plain decoder's estimated seconds ([`Planner::plain_run_time`])
    /// where the run was judged.
    ///
    /// The round model and the reality windows judge rounds, but a batch
    /// runs until its last sequence is done: sequences that drafted finish
    /// at different rounds and leave the batch's last rounds to a few of
    /// them, at a higher cost per token, while the plain decoder keeps
    /// sequences of equal length in step to the end. On lavapipe at four
    /// sequences Beagle's drafted rounds each gained a little, and its runs
    /// measured 0.89–0.99x of autoregressive decoding over ten grids of
    /// successive planner versions (docs/speculative.md, "A batch run
    /// judged whole"). At one sequence the rounds are the run.
    pub fn end_run(&mut self, lengths: &[usize], seconds: f64) -> Option<f64> {
        let seqs = lengths.len();
        if self.cfg.mode != PlanMode::Auto || seqs < 2 || self.is_off(seqs) {
            return None;
        }
        let plain = self.plain_run_time(lengths)?;
        if seconds.is_finite() && REALITY_MARGIN * seconds > plain {
            self.switch_off(seqs, OffWhy::BatchRun);
        }
        Some(plain)
    }

    /// Seconds the plain decoder takes to emit `lengths[i]` tokens for
    /// sequence `i` (the first from the prefill): a step for every token
    /// after the first, over the sequences still going, each at
    /// [`Planner::baseline_time`] (a batch size whose plain step was not
    /// timed takes the whole batch's share of its no-draft round). `None`
    /// while a row count's cost is unknown.
    pub fn plain_run_time(&self, lengths: &[usize]) -> Option<f64> {
        let whole = self.step_ratio.get(&lengths.len()).copied().unwrap_or(1.0);
        let longest = lengths.iter().copied().max().unwrap_or(0);
        (1..longest)
            .map(|r| {
                let going = lengths.iter().filter(|&&l| l > r).count();
                self.baseline_time_or(going, whole)
            })
            .sum()
    }

    /// Counts `steps` rounds (`seq_rounds` over the sequences) that ran
    /// without the drafter, as [`Planner::plan`] would have planned them
    /// (a run that started off is autoregressive decoding).
    pub fn rounds_off(&mut self, seqs: usize, steps: usize, seq_rounds: usize) {
        if let Some(v0) = self.baseline_time(seqs) {
            // Planned as an off planner plans: one token a sequence in a
            // plain decoder's step.
            self.predicted.0 += steps as f64;
            self.predicted.1 += steps as f64 * v0;
            self.predicted_rounds += steps;
        }
        self.rounds += steps;
        self.no_draft_rounds += steps;
        self.since_draft += steps;
        self.off_rounds += steps;
        self.histogram[0] += seq_rounds;
    }

    /// A whole round (drafter call, target pass, acceptance, commit) emitted
    /// `tokens` tokens for `seqs` sequences in `seconds`. Every
    /// [`REALITY_WINDOW`] rounds in which the drafter ran, the realised rate
    /// is compared with the no-draft rate `seqs / V(seqs)`; a window that fell
    /// short switches the drafter off, whatever the model predicted (costs
    /// it does not see, such as a drafter catching up on skipped rows, are
    /// in the realised rate). The two windows' predicted tokens and seconds
    /// (of the rounds [`Planner::plan`] planned) say whether they fell
    /// short by their acceptance or by their time (module docs); short by
    /// acceptance, they switch it off only beyond the acceptance noise
    /// that the plan priced in ([`ACCEPT_NOISE_SD`]).
    pub fn observe_round(&mut self, seqs: usize, tokens: usize, seconds: f64, drafted: bool) {
        let planned = self.pending.take();
        if self.cfg.mode != PlanMode::Auto || !seconds.is_finite() || self.off_at.is_some() {
            return;
        }
        if drafted {
            let w = &mut self.window;
            w.tokens += tokens as f64;
            w.seconds += seconds;
            w.rounds += 1;
            if let Some((t, s)) = planned {
                w.pred_tokens += t;
                w.pred_seconds += s;
                w.pred_rounds += 1;
            }
        }
        if self.window.rounds >= REALITY_WINDOW {
            let w = std::mem::take(&mut self.window);
            if let Some(v0) = self.baseline_time(seqs) {
                // Two windows in a row must fall short (one is noise on a
                // shared host as often as not).
                let short = w.tokens / w.seconds < REALITY_MARGIN * seqs as f64 / v0;
                // Short by acceptance within its noise gives no reason:
                // the later window is the next check's first.
                let why = match self.short_window {
                    Some(last) if short && !self.free_drafter(seqs) => {
                        last.plus(&w).why_short(seqs)
                    }
                    _ => None,
                };
                if let Some(why) = why {
                    self.switch_off(seqs, why);
                }
                self.short_window = short.then_some(w);
            }
        }
    }
}
