//! The per-round draft planner of `--speculate auto` (issue 34): from costs
//! measured on this device and acceptance estimated online, it picks each
//! round's draft budget per sequence, down to no draft at all for the whole
//! batch, to maximise expected emitted tokens per second.
//!
//! # Model
//! A round over `b` active sequences where sequence `i` gets `k_i` draft
//! tokens (a drafter call with budget `d = max k_i`, skipped when `d = 0`):
//!
//! * time `D(b, d)·[d > 0] + V(n)`, `n = Σ (1 + k_i)` rows verified;
//!   `D` is the drafter call, `V` everything else of the round (the target
//!   pass, acceptance, the KV commit and the drafter's observation of the
//!   committed rows), so a round with no draft is an autoregressive step
//!   through the same code. The plain decoder's own step (the drafter off)
//!   can cost less: on an H200 the engine's no-draft round took 2.1–2.3 ms
//!   where the decoder took 1.9 ms (docs/bench/cuda-h200/2026-11-27c). The
//!   warm-up times it, and every on/off decision and the predicted speedup
//!   compare with it ([`Planner::baseline_time`]);
//! * tokens `b + Σ_i Σ_{j ≤ k_i} P_i(j)`, with `P_i(j) = Π_{m ≤ j} α_i(m)`
//!   the chance that sequence `i` accepts its first `j` draft tokens
//!   (Leviathan et al. 2023's expected length, per depth instead of one `α`).
//!
//! This is paper 004's throughput multiplier (`crate::perf_model`) with
//! measured times in place of the roofline: [`speedup`] is the one formula
//! both use.
//!
//! **Costs** are tables of exponential moving averages keyed by what was
//! run: `V` by rows `n`, `D` by `(b, d)`. `V` between observed row counts
//! is the least-squares line through the table (a weighted fit over the
//! keys, so a row count seen often does not erase the slope the others
//! give); `D` at an unseen budget is its nearest seen budget's time scaled
//! by the fitted slope over budgets (a flat drafter such as prompt lookup
//! or a parallel head stays flat, an autoregressive one grows per level).
//! The first rounds measure: the configured budget, no draft, one token.
//!
//! **Acceptance** per depth `j`: a global estimate (decayed counts with a
//! Beta prior: depth `j`'s prior is depth `j − 1`'s estimate, so an
//! unexplored depth is expected to do as well as the one before it) and one
//! per sequence (faster decay, shrunk to the global one), updated every
//! round from the tree's depth and the accepted length.
//!
//! **Choice**: for every drafter budget `d` in `1..=max`, the per-sequence
//! items `P_i(j)` (`j ≤ d`) are sorted by value and the best prefix (the
//! items the verify cost pays for) is kept; the best `d` is compared with
//! no draft. When no draft wins for many rounds, one round probes the best
//! draft so the acceptance estimates stay current.

use std::collections::{BTreeMap, HashMap};

use super::SpecError;

pub use super::plan_config::{Costs, PlanMode, PlannerConfig};

/// Paper 004's throughput multiplier `τ / Δt` with `Δt = (t_draft +
/// t_verify) / t_step`: tokens per round `tau` over the round's time
/// against one autoregressive step of `step_s` seconds per token.
pub fn speedup(tau: f64, draft_s: f64, verify_s: f64, step_s: f64) -> f64 {
    let round = draft_s + verify_s;
    if round <= 0.0 || step_s <= 0.0 {
        return 0.0;
    }
    tau * step_s / round
}

/// One round's choice.
#[derive(Clone, Debug, PartialEq)]
pub struct RoundPlan {
    /// Draft tokens per sequence (in the order `plan` got the slots).
    pub budgets: Vec<usize>,
    /// The planner has switched the drafter off for this batch size: no
    /// draft has paid for [`OFF_AFTER`] planned rounds, so the drafter need
    /// not even observe the committed rows any more (its observation is a
    /// cost of its own: SpecFormer's pass over every committed row).
    pub drafter_off: bool,
    /// Predicted emitted tokens and seconds of the round (`None` while the
    /// planner has no costs yet).
    pub predicted: Option<(f64, f64)>,
}

impl RoundPlan {
    /// The drafter call's budget; 0: no drafter call this round.
    pub fn draft_budget(&self) -> usize {
        self.budgets.iter().copied().max().unwrap_or(0)
    }
}

#[derive(Clone, Copy, Debug, Default)]
struct Ema {
    value: f64,
    count: usize,
    /// The context (keys a verified row attends to, on average) the value
    /// was measured at: the same average over its samples.
    ctx: f64,
    /// The value and context when it settled: the attention fit measures
    /// later samples' time and context against them.
    settled_at: Option<(f64, f64)>,
}

impl Ema {
    /// A sample more than `SPIKE` times the average (a kernel compiled
    /// inside the round, a preempted host) counts as `SPIKE` times it: a
    /// real change of cost still moves the average within a few rounds.
    /// The first samples keep their least (a shape's first run may
    /// include its compilation). `ctx`: the sample's context.
    fn update_at(&mut self, x: f64, w: f64, ctx: f64) {
        if self.count == 0 || (self.count < 3 && x < self.value) || self.ctx.is_nan() {
            self.ctx = ctx;
        } else if self.count >= 3 {
            self.ctx += w * (ctx - self.ctx);
        }
        self.value = if self.count == 0 {
            x
        } else if self.count < 3 {
            self.value.min(x)
        } else {
            let x = x.min(SPIKE * self.value);
            self.value + w * (x - self.value)
        };
        self.count += 1;
    }

    fn update(&mut self, x: f64, w: f64) {
        let ctx = self.ctx;
        self.update_at(x, w, ctx);
    }

    /// Only lowers the average (a sample that may carry unrelated work).
    fn lower(&mut self, x: f64, w: f64) {
        if self.count == 0 || x < self.value {
            self.update(x, w);
        }
    }
}

/// Decayed (accepted, trials) counts per depth.
#[derive(Clone, Debug, Default)]
struct DepthCounts(Vec<(f64, f64)>);

impl DepthCounts {
    fn decay(&mut self, keep: f64) {
        for c in &mut self.0 {
            c.0 *= keep;
            c.1 *= keep;
        }
    }

    fn add(&mut self, levels: usize, accepted: usize) {
        let a = accepted.min(levels);
        let tried = (a + 1).min(levels);
        if self.0.len() < tried {
            self.0.resize(tried, (0.0, 0.0));
        }
        for j in 0..tried {
            self.0[j].1 += 1.0;
            if j < a {
                self.0[j].0 += 1.0;
            }
        }
    }

    /// Accepted and trials at depth `j` (0-based).
    fn at(&self, j: usize) -> (f64, f64) {
        self.0.get(j).copied().unwrap_or((0.0, 0.0))
    }
}

/// Chooses each round's draft budgets from measured costs and online
/// acceptance (module docs).
#[derive(Clone, Debug)]
pub struct Planner {
    cfg: PlannerConfig,
    /// Round time without the drafter call, by rows verified.
    verify: BTreeMap<usize, Ema>,
    /// Drafter call time by (sequences, budget).
    draft: BTreeMap<(usize, usize), Ema>,
    /// The plain decoder's step over the no-draft round, by sequences
    /// ([`Planner::observe_plain_step`]).
    step_ratio: BTreeMap<usize, f64>,
    global: DepthCounts,
    seqs: HashMap<usize, DepthCounts>,
    rounds: usize,
    since_draft: usize,
    /// [`Planner::verify_counts`] calls since it last let a draft token
    /// be verified.
    since_verified: usize,
    rng: u64,
    /// Sequence-rounds per chosen budget (`0..=max`).
    histogram: Vec<usize>,
    /// Rounds in which the drafter was not called.
    no_draft_rounds: usize,
    /// Sums over planned rounds of predicted tokens and seconds.
    predicted: (f64, f64),
    predicted_rounds: usize,
    /// The predicted drafter seconds of the round planned last, if it
    /// drafted (its tokens and seconds are `pending`), until
    /// [`Planner::verify_counts`] predicts the round again on the draft in
    /// hand.
    planned_draft_s: Option<f64>,
    /// Consecutive planned rounds in which no draft was predicted to pay.
    losing: usize,
    /// The batch size at which the drafter was switched off.
    off_at: Option<usize>,
    /// The drafting rounds since the last reality check
    /// ([`Planner::observe_round`]).
    window: off::Window,
    /// The deepest draft the drafter returned for a budget at least as
    /// deep (`None` until it returned a shallower one): MagicDec's chain
    /// ends at its `l` whatever the budget.
    depth_cap: Option<usize>,
    /// The prediction of the round planned last, if it drafted (until
    /// [`Planner::observe_round`] takes it).
    pending: Option<(f64, f64)>,
    /// The last reality check's window, if it fell short.
    short_window: Option<off::Window>,
    /// Why the drafter went off ([`Planner::start_run`] undoes an off by
    /// acceptance sooner).
    off_why: off::OffWhy,
    /// This run's drafter was switched back on by that rule.
    rejudged: bool,
    /// Rounds planned since the drafter was switched off.
    off_rounds: usize,
    /// Rounds off after which a run at that batch size tries the drafter
    /// again ([`Planner::start_run`]); doubles with every retry.
    retry_after: usize,
    /// The drafter went off although it would not pay even if every draft
    /// token were accepted: its costs, not its acceptance, lose, and it is
    /// not tried again.
    hopeless: bool,
    /// This round's mean context ([`Planner::set_context`]).
    ctx: f64,
    /// Decayed sums (x², x·y, samples) of the attention fit: x = rows ·
    /// context change, y = time change, per sample against its row count's
    /// value and context when it settled.
    attn: (f64, f64, f64),
    /// Tokens each active sequence may still emit ([`Planner::set_rooms`]).
    rooms: HashMap<usize, usize>,
    /// Acceptance by the drafter's confidence ([`confidence`]).
    conf: confidence::ConfidenceBins,
}

/// Decay of the global acceptance counts per update, and of a sequence's.
const GLOBAL_KEEP: f64 = 0.995;
const SEQ_KEEP: f64 = 0.9;
/// Weight of the global estimate in a sequence's (pseudo-rounds).
const SEQ_PRIOR: f64 = 8.0;
/// Drafting rounds per reality check of the realised rate (two checks in a
/// row must fall short).
pub const REALITY_WINDOW: usize = 8;
/// A window must fall this far below the no-draft rate to switch the
/// drafter off (host noise on a shared machine is a few per cent).
const REALITY_MARGIN: f64 = 0.97;
/// Two short windows whose rounds took their predicted time switch the
/// drafter off by acceptance only if they emitted fewer tokens than
/// predicted by more than this many standard deviations of the accepted
/// draft tokens (a count taken as Poisson: its variance its predicted
/// mean). A drafter that gains a few per cent at a depth-1 acceptance of
/// 0.29 (SpecFormer at batch 1 on lavapipe, one-token drafts) has a window
/// fall short when it accepts at most one token in eight rounds (rounds a
/// per cent over their predicted time), which the
/// binomial count gives 0.28 of windows, so two in a row about one pair in
/// twelve; its traced cells went off by acceptance two and three times in
/// three runs each (docs/bench/lavapipe/issue34-eighth-grid).
const ACCEPT_NOISE_SD: f64 = 2.0;
/// A drafter whose calls cost less than this share of a no-draft round is
/// never switched off: nothing is saved, and after drafting the planner
/// verifies only what pays (prompt lookup).
const FREE_DRAFT: f64 = 0.01;
/// Planned rounds without a paying draft after which the drafter is off.
pub const OFF_AFTER: usize = 4;
/// Rounds the drafter stays off before a run at that batch size tries it
/// again (then twice as many after each retry): the rounds that switched it
/// off may have been one hard prompt's.
pub const RETRY_OFF: usize = 64;
/// Decay per sample of the attention fit's sums.
const ATTN_KEEP: f64 = 0.99;
/// The attention fit's `Σ x²` (rows · keys, squared) and sample count
/// below which the context has not varied enough to fit a cost per key: a
/// few tens of samples some hundreds of keys past where their row count
/// settled (a 64-token run does not get there, and needs no correction).
const ATTN_MIN_VARIATION: f64 = 2.5e5;
const ATTN_MIN_SAMPLES: f64 = 16.0;
/// A drafter switched off is tried again only if, with half the rejections
/// it saw, a draft would be this much faster than none.
const RETRY_GAIN: f64 = 1.1;
/// Samples after which a row count's own average is trusted over the line
/// through the others (a shape's first passes may all include compiles).
const SETTLED: usize = 3;
/// An unsettled row count costing more than this multiple of the settled
/// line is planned at the line's cost, so that it is measured again.
const SUSPECT: f64 = 1.25;
/// How far past the largest settled row count that line is trusted (a
/// multiple of it).
const SUSPECT_REACH: f64 = 4.0 / 3.0;
/// The most a probe may lose, as a share of the time since the last draft.
const PROBE_SHARE: f64 = 0.02;
/// Cost samples are clipped to this multiple of their average.
const SPIKE: f64 = 2.0;
/// A draft must be predicted to be this much faster than none: a smaller
/// gain is within what the cost tables' noise moves (single rounds on a
/// shared 2-core host vary by about ±5 %), and a draft that gains nothing
/// still costs its variance (MagicDec's one-token chain on lavapipe is
/// predicted at 0.94–1.0x of no draft from round to round, and was
/// drafted in some runs and not in others).
const DRAFT_MARGIN: f64 = 1.03;
/// First-depth trials (decayed) after which a run may start off on the
/// acceptance estimates ([`Planner::start_run`]).
const START_TRIALS: f64 = 4.0;

impl Planner {
    pub fn new(cfg: PlannerConfig) -> Result<Planner, SpecError> {
        cfg.validate()?;
        let seed = match cfg.mode {
            PlanMode::Random { seed } => seed,
            _ => 0,
        };
        Ok(Planner {
            histogram: vec![0; cfg.max_budget + 1],
            cfg,
            verify: BTreeMap::new(),
            draft: BTreeMap::new(),
            step_ratio: BTreeMap::new(),
            global: DepthCounts::default(),
            seqs: HashMap::new(),
            rounds: 0,
            since_draft: 0,
            since_verified: 0,
            rng: seed ^ 0x9e37_79b9_7f4a_7c15,
            no_draft_rounds: 0,
            predicted: (0.0, 0.0),
            predicted_rounds: 0,
            planned_draft_s: None,
            losing: 0,
            off_at: None,
            window: Default::default(),
            depth_cap: None,
            pending: None,
            short_window: None,
            off_why: off::OffWhy::default(),
            rejudged: false,
            off_rounds: 0,
            retry_after: RETRY_OFF,
            hopeless: false,
            ctx: 0.0,
            attn: (0.0, 0.0, 0.0),
            rooms: HashMap::new(),
            conf: Default::default(),
        })
    }

    pub fn config(&self) -> &PlannerConfig {
        &self.cfg
    }

    /// Sequence-rounds per budget `0..=max` chosen so far.
    pub fn histogram(&self) -> &[usize] {
        &self.histogram
    }

    /// Rounds that called no drafter.
    pub fn no_draft_rounds(&self) -> usize {
        self.no_draft_rounds
    }

    /// Rounds planned so far.
    pub fn rounds(&self) -> usize {
        self.rounds
    }

    /// Forget a sequence (its slot is reused).
    pub fn reset_seq(&mut self, slot: usize) {
        self.seqs.remove(&slot);
    }

    /// A drafter call for `seqs` sequences with budget `budget` took
    /// `seconds`. `after_draft`: the previous round drafted too. A drafter
    /// that catches up on the rows committed since its last call (Beagle's
    /// memory appends) does that work whenever it next drafts, whether or
    /// not rounds were skipped in between, so a call after skipped rounds
    /// (or the run's first, after the prompt) only lowers the estimate.
    pub fn observe_draft(&mut self, seqs: usize, budget: usize, seconds: f64, after_draft: bool) {
        if budget > 0 && seconds.is_finite() && seconds >= 0.0 {
            let w = self.cfg.smoothing;
            let e = self.draft.entry((seqs, budget)).or_default();
            if after_draft {
                e.update(seconds, w);
            } else {
                e.lower(seconds, w);
            }
        }
    }

    /// The cost tables, to store (`draftc calibrate`).
    pub fn costs(&self) -> Costs {
        Costs {
            verify: self.verify.iter().map(|(&n, e)| (n, e.value)).collect(),
            draft: self
                .draft
                .iter()
                .map(|(&(b, k), e)| (b, k, e.value))
                .collect(),
            step: self.step_ratio.iter().map(|(&b, &r)| (b, r)).collect(),
        }
    }

    /// Starts from stored costs (a cache file). Each counts as one sample,
    /// not a settled average: a stored value may itself be a single
    /// sample that caught a compile, and this run's first samples of the
    /// shape replace it when lower.
    pub fn seed_costs(&mut self, c: &Costs) {
        // Measured at a context the file does not say: taken as this run's.
        let sample = |value: f64| Ema {
            value,
            count: 1,
            ctx: f64::NAN,
            settled_at: None,
        };
        for &(n, t) in &c.verify {
            if n > 0 && t.is_finite() && t > 0.0 {
                self.verify.insert(n, sample(t));
            }
        }
        for &(b, k, t) in &c.draft {
            if b > 0 && k > 0 && t.is_finite() && t >= 0.0 {
                self.draft.insert((b, k), sample(t));
            }
        }
        for &(b, r) in &c.step {
            self.set_step_ratio(b, r);
        }
    }

    /// Takes the cost tables and the global acceptance estimates of
    /// `other` (the warm-up's start-up measurements on the same prompts),
    /// so the run's first rounds are planned from them.
    pub fn adopt_costs(&mut self, other: &Planner) {
        self.verify.clone_from(&other.verify);
        self.draft.clone_from(&other.draft);
        self.step_ratio.clone_from(&other.step_ratio);
        self.global = other.global.clone();
        self.depth_cap = other.depth_cap;
    }

    /// The rest of a round (target pass over `rows` rows, acceptance,
    /// commit, the drafter's observation) took `seconds`.
    /// The context is the one [`Planner::set_context`] gave last.
    pub fn observe_verify(&mut self, rows: usize, seconds: f64) {
        if rows > 0 && seconds.is_finite() && seconds >= 0.0 {
            let w = self.cfg.smoothing;
            let ctx = self.ctx;
            let e = self.verify.entry(rows).or_default();
            if let Some((v0, c0)) = e.settled_at {
                // How far this sample's time and context are from the row
                // count's when it settled: their co-movement over many
                // samples is the attention term.
                let x = rows as f64 * (ctx - c0);
                let y = (seconds - v0).clamp(-v0, v0);
                self.attn = (
                    ATTN_KEEP * self.attn.0 + x * x,
                    ATTN_KEEP * self.attn.1 + x * y,
                    ATTN_KEEP * self.attn.2 + 1.0,
                );
            }
            e.update_at(seconds, w, ctx);
            if e.count == SETTLED && e.ctx.is_finite() {
                e.settled_at = Some((e.value, e.ctx));
            }
        }
    }

    /// The mean context of the sequences this round (committed tokens each
    /// verified row attends to): costs measured at another context are
    /// moved along the attention term ([`Planner::attention_cost`]).
    pub fn set_context(&mut self, ctx: f64) {
        if ctx.is_finite() && ctx >= 0.0 {
            self.ctx = ctx;
        }
    }

    /// Seconds a verified row costs per key it attends to, fitted from how
    /// each row count's time moved with the context (0 until the context
    /// has varied enough to tell).
    pub fn attention_cost(&self) -> f64 {
        if self.attn.0 < ATTN_MIN_VARIATION || self.attn.2 < ATTN_MIN_SAMPLES {
            return 0.0;
        }
        (self.attn.1 / self.attn.0).max(0.0)
    }

    /// Sequence `slot` verified a tree `levels` deep and accepted `accepted`
    /// draft tokens.
    pub fn observe_seq(&mut self, slot: usize, levels: usize, accepted: usize) {
        let s = self.seqs.entry(slot).or_default();
        s.decay(SEQ_KEEP);
        if levels == 0 {
            return;
        }
        s.add(levels, accepted);
        self.global.decay(GLOBAL_KEEP);
        self.global.add(levels, accepted);
    }

    /// A drafter call with budget `budget` returned trees at most `levels`
    /// deep (before the planner cut them).
    pub fn observe_depth(&mut self, budget: usize, levels: usize) {
        if levels > 0 && levels < budget {
            self.depth_cap = Some(self.depth_cap.map_or(levels, |c| c.max(levels)));
        }
    }

    /// Estimated acceptance of sequence `slot` at depth `j` (0-based).
    /// Depth `j`'s prior is depth `j - 1`'s estimate (depth 0's is the
    /// configured prior), so an unexplored depth is expected to do as well
    /// as the one before it and gets tried.
    pub fn alpha(&self, slot: usize, j: usize) -> f64 {
        let s0 = self.cfg.prior_strength;
        let mut global = self.cfg.prior_alpha;
        for d in 0..=j {
            let (ga, gt) = self.global.at(d);
            global = (ga + s0 * global) / (gt + s0);
        }
        let (sa, st) = self.seqs.get(&slot).map_or((0.0, 0.0), |s| s.at(j));
        (sa + SEQ_PRIOR * global) / (st + SEQ_PRIOR)
    }

    /// `P(j)` for `j = 1..=depth`: the chance that sequence `slot` accepts
    /// its first `j` draft tokens.
    fn reach(&self, slot: usize, depth: usize) -> Vec<f64> {
        let mut p = 1.0;
        (0..depth)
            .map(|j| {
                p *= self.alpha(slot, j);
                p
            })
            .collect()
    }

    fn next_random(&mut self) -> u64 {
        // splitmix64
        self.rng = self.rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// The budgets of the next round for the active sequences `slots`.
    pub fn plan(&mut self, slots: &[usize]) -> RoundPlan {
        let b = slots.len();
        let max = self.cfg.max_budget;
        let plan = match self.cfg.mode {
            PlanMode::Random { .. } => RoundPlan {
                budgets: (0..b)
                    .map(|_| (self.next_random() % (max as u64 + 1)) as usize)
                    .collect(),
                predicted: None,
                drafter_off: false,
            },
            PlanMode::Cycle => {
                let w = self.cfg.warm_budgets();
                let r = self.rounds % w.len();
                let mut budgets = vec![w[r]; b];
                if self.cfg.warm_single(r) {
                    budgets.iter_mut().skip(1).for_each(|k| *k = 0);
                }
                RoundPlan {
                    budgets,
                    predicted: None,
                    drafter_off: false,
                }
            }
            PlanMode::Auto => {
                let plan = self.plan_auto(slots);
                if plan.drafter_off {
                    self.off_rounds += 1;
                } else if plan.predicted.is_some() {
                    // A round counts against the drafter when a draft would
                    // not pay even at the batch's average acceptance: a
                    // sequence in a hard stretch gets no draft, but does not
                    // switch the drafter off for the others.
                    self.losing = if self.pays_on_average(b) {
                        0
                    } else {
                        self.losing + 1
                    };
                    if self.losing >= OFF_AFTER && !self.free_drafter(b) {
                        self.switch_off(b, off::OffWhy::Losing);
                    }
                }
                self.pending = plan.predicted.filter(|_| plan.draft_budget() > 0);
                plan
            }
        };
        self.rounds += 1;
        let d = plan.draft_budget();
        if d == 0 {
            self.no_draft_rounds += 1;
            self.since_draft += 1;
        } else {
            self.since_draft = 0;
        }
        for &k in &plan.budgets {
            self.histogram[k.min(max)] += 1;
        }
        if let Some((t, s)) = plan.predicted {
            self.predicted.0 += t / b.max(1) as f64;
            self.predicted.1 += s;
            self.predicted_rounds += 1;
        }
        // A drafting round's seconds less the verify pass priced in (`b`
        // rows and the planned tokens).
        let rows = b + plan.budgets.iter().sum::<usize>();
        self.planned_draft_s = self
            .pending
            .and_then(|(_, s)| Some((s - self.verify_time(rows)?).max(0.0)));
        plan
    }

    /// The calibration rounds that open an auto run with no costs: the
    /// largest budget twice (the first call catches up on the prompt), one
    /// token and no draft (so `V` has row counts to fit a line through and
    /// `D` two budgets to scale between); skipped when a warm-up measured
    /// the costs ([`Planner::adopt_costs`]).
    fn calibration(&self) -> Option<usize> {
        let max = self.cfg.max_budget;
        let order = [max, max, 1, 0];
        (self.rounds < order.len() && self.verify.len() < 3).then(|| order[self.rounds])
    }

    fn plan_auto(&self, slots: &[usize]) -> RoundPlan {
        let b = slots.len();
        let fixed = |k: usize, predicted: Option<(f64, f64)>, off: bool| RoundPlan {
            budgets: vec![k; b],
            predicted,
            drafter_off: off,
        };
        if b == 0 {
            return fixed(0, None, false);
        }
        if self.is_off(b) {
            let v0 = self.baseline_time(b);
            return fixed(0, v0.map(|v| (b as f64, v)), true);
        }
        if let Some(k) = self.calibration() {
            return fixed(k, None, false);
        }
        let Some(v0) = self.verify_time(b) else {
            return fixed(self.cfg.max_budget, None, false);
        };
        let none = (b as f64, v0);
        // P_i(j) per sequence, j = 1..=max.
        let reach: Vec<Vec<f64>> = slots
            .iter()
            .map(|&s| self.reach(s, self.cfg.max_budget))
            .collect();
        let none_rate = none.0 / none.1;
        match self.best_draft(&reach) {
            Some((rate, budgets, pred))
                if rate > DRAFT_MARGIN * none_rate
                    && self.finishes_sooner(slots, &reach, &budgets, DrafterCall::Planned) =>
            {
                RoundPlan {
                    budgets,
                    predicted: Some(pred),
                    drafter_off: false,
                }
            }
            // No draft, unless it is time to probe the best draft: probes
            // keep the acceptance estimates current and cost at most
            // `PROBE_SHARE` of the time spent without drafts.
            Some((_, budgets, pred))
                if self.since_draft + 1 >= self.cfg.probe_every
                    && pred.1 - pred.0 / none_rate
                        <= PROBE_SHARE * self.since_draft as f64 * none.1 =>
            {
                RoundPlan {
                    budgets,
                    predicted: Some(pred),
                    drafter_off: false,
                }
            }
            _ => fixed(0, Some(none), false),
        }
    }

    /// The best draft for sequences with acceptance `reach` (`P_i(j)`):
    /// over every call budget the drafter goes to, the best prefix of
    /// draft tokens (rate, budgets, predicted tokens and seconds).
    #[allow(clippy::type_complexity)]
    fn best_draft(&self, reach: &[Vec<f64>]) -> Option<(f64, Vec<usize>, (f64, f64))> {
        let b = reach.len();
        let deepest = self
            .depth_cap
            .map_or(self.cfg.max_budget, |c| c.min(self.cfg.max_budget));
        let mut best: Option<(f64, Vec<usize>, (f64, f64))> = None;
        for d in 1..=deepest {
            let Some(dt) = self.draft_time(b, d) else {
                continue;
            };
            if let Some(x) = self.best_prefix(reach, &vec![d; b], dt) {
                if best.as_ref().is_none_or(|y| x.0 > y.0) {
                    best = Some(x);
                }
            }
        }
        best
    }

    /// Whether a draft pays for `seqs` sequences at the global acceptance
    /// estimates (no sequence's own): the drafter's worth at this batch
    /// size, whatever one sequence is going through.
    fn pays_on_average(&self, seqs: usize) -> bool {
        // usize::MAX is no sequence's slot: its estimate is the global one.
        let reach = vec![self.reach(usize::MAX, self.cfg.max_budget); seqs];
        self.beats_no_draft(&reach, DRAFT_MARGIN).unwrap_or(true)
    }

    /// Whether the best draft for sequences with acceptance `reach` is
    /// `factor` times faster than the drafter off, the plain decoder's step
    /// (`None` while no-draft rounds have no cost yet).
    fn beats_no_draft(&self, reach: &[Vec<f64>], factor: f64) -> Option<bool> {
        let seqs = reach.len() as f64;
        let v0 = self.baseline_time(reach.len())?;
        Some(
            self.best_draft(reach)
                .is_some_and(|(rate, ..)| rate > factor * seqs / v0),
        )
    }

    /// The planner's tables and estimates, for `DRAFTC_PLAN_DEBUG=1`.
    pub fn describe(&self, seqs: usize) -> String {
        let v: Vec<String> = self
            .verify
            .iter()
            .map(|(n, e)| format!("{n}:{:.2}ms/{}", e.value * 1e3, e.count))
            .collect();
        let d: Vec<String> = self
            .draft
            .iter()
            .map(|((b, k), e)| format!("{b}x{k}:{:.2}ms/{}", e.value * 1e3, e.count))
            .collect();
        let a: Vec<String> = (0..self.cfg.max_budget)
            .map(|j| format!("{:.2}", self.alpha(usize::MAX, j)))
            .collect();
        format!(
            "planner: verify rows [{}], draft [{}], plain step / no-draft round [{}], global acceptance by depth [{}], by confidence [{}], attention {:.3} µs a row per key at context {:.0}, predicted speedup {:?} at {seqs} sequences",
            v.join(" "),
            d.join(" "),
            self.step_ratio
                .iter()
                .map(|(b, r)| format!("{b}:{r:.3}"))
                .collect::<Vec<_>>()
                .join(" "),
            a.join(" "),
            self.describe_confidence(),
            self.attention_cost() * 1e6,
            self.ctx,
            self.predicted_speedup(seqs)
        )
    }

    /// The best set of draft tokens to verify when sequence `i` may verify
    /// up to `depths[i]` of its tokens and `spent` seconds go to the
    /// drafter: the items `P_i(j)` sorted by value, the prefix with the
    /// most tokens per second. `None` when no row count can be predicted.
    /// Returns the rate, the count per sequence and (tokens, seconds).
    #[allow(clippy::type_complexity)]
    fn best_prefix(
        &self,
        reach: &[Vec<f64>],
        depths: &[usize],
        spent: f64,
    ) -> Option<(f64, Vec<usize>, (f64, f64))> {
        let b = reach.len();
        let mut items: Vec<(f64, usize)> = reach
            .iter()
            .zip(depths)
            .enumerate()
            .flat_map(|(i, (p, &d))| p[..d.min(p.len())].iter().map(move |&v| (v, i)))
            .collect();
        items.sort_by(|x, y| y.0.total_cmp(&x.0));
        let (mut tokens, mut best) = (b as f64, None::<(f64, usize, f64, f64)>);
        for (m, &(v, _)) in items.iter().enumerate() {
            tokens += v;
            let Some(vt) = self.verify_time(b + m + 1) else {
                break;
            };
            let time = spent + vt;
            let rate = tokens / time;
            if best.is_none_or(|x| rate > x.0) {
                best = Some((rate, m + 1, tokens, time));
            }
        }
        let (rate, m, tokens, time) = best?;
        let mut counts = vec![0; b];
        for &(_, i) in &items[..m] {
            counts[i] += 1;
        }
        Some((rate, counts, (tokens, time)))
    }

    /// After drafting: how many of each sequence's drafted tokens to verify
    /// (`depths[i]`: sequence `i`'s tree depth), given the `spent` drafter
    /// seconds (a cost already paid). A drafter that drafts for free and
    /// only sometimes (prompt lookup) is planned here, on what it actually
    /// proposed; so is a tree deeper than it is worth verifying. `conf`:
    /// the drafter's probability of each sequence's tokens, depth by depth
    /// along the path to cut by, where it reports them ([`confidence`]).
    /// `None`: verify everything (fixed or random modes, or no costs yet).
    pub fn verify_counts(
        &mut self,
        slots: &[usize],
        depths: &[usize],
        spent: f64,
        conf: Option<&[Vec<f64>]>,
    ) -> Option<Vec<usize>> {
        if self.cfg.mode != PlanMode::Auto || slots.len() != depths.len() {
            return None;
        }
        let b = slots.len();
        let v0 = self.verify_time(b)?;
        let reach: Vec<Vec<f64>> = slots
            .iter()
            .zip(depths)
            .enumerate()
            .map(|(i, (&s, &d))| match conf.and_then(|c| c.get(i)) {
                Some(c) if c.len() >= d => self.reach_by_confidence(s, &c[..d]),
                _ => self.reach(s, d),
            })
            .collect();
        let none_rate = b as f64 / (spent + v0);
        let keep = match self.best_prefix(&reach, depths, spent) {
            Some((rate, counts, _))
                if rate > DRAFT_MARGIN * none_rate
                    && self.finishes_sooner(slots, &reach, &counts, DrafterCall::Spent(spent)) =>
            {
                counts
            }
            // Verified anyway now and then, as `plan` probes: estimates
            // that only a verified draft can raise would otherwise stay
            // where one unlucky stretch left them.
            Some((_, counts, (tokens, time)))
                if self.since_verified + 1 >= self.cfg.probe_every
                    && time - tokens / none_rate
                        <= PROBE_SHARE * self.since_verified as f64 * (spent + v0) =>
            {
                counts
            }
            _ => vec![0; b],
        };
        if keep.iter().any(|&k| k > 0) {
            self.since_verified = 0;
        } else {
            self.since_verified += 1;
        }
        self.predict_again(&reach, &keep);
        Some(keep)
    }

    /// The round planned last, predicted again on the draft in hand: the
    /// tokens its kept draft (`keep[i]` of sequence `i`'s tokens, reaching
    /// `reach[i]`) is expected to add and its verify pass, beside the
    /// drafter seconds `plan` predicted. Prompt lookup proposes only where
    /// the history matches, so a round planned at one token often verifies
    /// none. Counted as planned, its predicted speedup at batch 1 on
    /// lavapipe was 1.28x against 1.15x measured. Counted again here, it
    /// was 1.12x against 1.13x: the same command, one change
    /// (docs/bench/lavapipe/issue34-lookup-prediction). The reality windows
    /// keep the plan's prediction.
    fn predict_again(&mut self, reach: &[Vec<f64>], keep: &[usize]) {
        let (Some((t, s)), Some(draft_s)) = (self.pending, self.planned_draft_s.take()) else {
            return;
        };
        let b = keep.len();
        let rows = b + keep.iter().sum::<usize>();
        let Some(v) = self.verify_time(rows) else {
            return;
        };
        let tokens = b as f64
            + reach
                .iter()
                .zip(keep)
                .map(|(p, &k)| p[..k.min(p.len())].iter().sum::<f64>())
                .sum::<f64>();
        self.predicted.0 += (tokens - t) / b.max(1) as f64;
        self.predicted.1 += draft_s + v - s;
    }

    /// The speedup the planner expects of the rounds it planned, over the
    /// plain decoder's step at `seqs` sequences ([`Planner::baseline_time`]).
    pub fn predicted_speedup(&self, seqs: usize) -> Option<f64> {
        let v0 = self.baseline_time(seqs)?;
        if self.predicted_rounds == 0 {
            return None;
        }
        let n = self.predicted_rounds as f64;
        let tau = self.predicted.0 / n;
        Some(speedup(tau, 0.0, self.predicted.1 / n, v0))
    }
}

#[path = "planner_confidence.rs"]
pub mod confidence;
#[path = "planner_costs.rs"]
mod costs;
#[path = "planner_horizon.rs"]
pub mod horizon;
#[path = "planner_off.rs"]
pub mod off;
use horizon::DrafterCall;

#[cfg(test)]
#[path = "planner_run_tests.rs"]
mod run_tests;
#[cfg(test)]
#[path = "planner_tests.rs"]
mod tests;
