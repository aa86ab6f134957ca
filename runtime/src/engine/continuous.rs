//! The continuous-batching engine (issue 53): sequences join and leave the
//! running batch at round boundaries, each with its own sampling settings,
//! seed, token budget and stop ids, and every round drafts, verifies,
//! accepts and commits for all of them in one target pass.
//!
//! - **Joining.** [`Engine::add`] takes a free KV slot at once; its prompt is
//!   prefilled in chunks that ride in the same target pass as the decoding
//!   sequences' rows, at most [`EngineConfig::prefill_chunk`] prompt rows a
//!   round while anything decodes (the whole pass when nothing does), so a
//!   long prompt does not stall the others.
//! - **Leaving.** A sequence ends on a stop id or its token budget, or is
//!   cancelled ([`Engine::cancel`]); its slot is free for the next round.
//! - **Choosing tokens.** Every row of the pass is given the target's own
//!   choice: the argmax for a greedy sequence, a sample keyed by the
//!   sequence's seed and the *position* it predicts for a sampled one
//!   (`draftc_ops::sampling`, one row at a time). A draft node is accepted
//!   when it equals the target's choice at its parent (the longest such
//!   path, as for greedy), and the choice after the last accepted node is
//!   the bonus token. With deterministic drafts this is lossless for
//!   sampling too (the probability that the sampled token equals the draft
//!   token is p(draft), and a rejection leaves the sample's distribution
//!   conditioned on differing from it), and it makes a sequence's text a
//!   function of its prompt and seed alone: whatever else runs, and
//!   whatever was drafted, the tokens are those of autoregressive decoding
//!   with the same per-position keys. Top-k and top-p apply unchanged.
//! - **Drafting.** A drafter sees a sequence from the first row of its
//!   prompt (`synced`); the [`DraftPolicy`] sizes each synced sequence's
//!   draft every round, a planner under the current batch, down to none.
//!   When the planner switches the drafter off, every running sequence
//!   stops drafting (the drafter forgets it, so nothing is spent on it);
//!   sequences that join later are drafted for again.

use cubecl::prelude::*;

use super::drafters::Drafter;
use super::rounds::{check_request, use_confidences, Batch, Parts};
use super::select::Sampling;
use super::speculative::DraftPolicy;
use super::target::{EngineError, TargetModel};

/// What a sequence asks for.
#[derive(Clone, Debug, PartialEq)]
pub struct SeqParams {
    /// New tokens at most (at least 1).
    pub max_tokens: usize,
    pub sampling: Sampling,
    /// Ids that end the sequence (the stop id is kept in its output).
    pub stop_ids: Vec<u32>,
}

/// Why a sequence ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finish {
    /// A stop id.
    Stop,
    /// `max_tokens` reached.
    Length,
}

/// What one round gave a sequence.
#[derive(Clone, Debug, PartialEq)]
pub struct Emitted {
    pub id: u64,
    /// New tokens, in order (a stop id included).
    pub tokens: Vec<u32>,
    /// Set when the sequence ended this round (its slot is free again).
    pub finish: Option<Finish>,
}

/// Engine settings.
#[derive(Clone, Copy, Debug)]
pub struct EngineConfig {
    /// Prompt rows prefilled per round while other sequences decode.
    pub prefill_chunk: usize,
    /// Keep the last prefilled prompt's KV rows in a slot of their own (the
    /// target's last) and start a new prompt that shares a prefix with it
    /// from a copy of those rows (a chat template's system turn), for
    /// sequences no drafter observes.
    pub prefix_cache: bool,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            prefill_chunk: 64,
            prefix_cache: false,
        }
    }
}

/// Rounds a planner's off stays off at larger batch sizes, at first.
pub(super) const STICKY_OFF_ROUNDS: usize = 128;

/// Counters since the engine (or a static run) started.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EngineStats {
    /// Target passes.
    pub rounds: usize,
    /// Rounds with decoding sequences in which nothing was drafted.
    pub no_draft_rounds: usize,
    /// Decoding sequences summed over rounds (each a verification).
    pub seq_rounds: usize,
    pub prompt_tokens: usize,
    pub generated_tokens: usize,
    /// Draft tokens verified and accepted.
    pub drafted: usize,
    pub accepted: usize,
    /// Per draft depth `j` (0 = the first drafted token): sequence-rounds
    /// whose tree had a node at depth `j`, and those that accepted one.
    pub depth_drafted: Vec<usize>,
    pub depth_accepted: Vec<usize>,
    /// Prompt rows copied from the prefix cache instead of computed.
    pub prefix_rows: usize,
    /// Rounds whose drafter failed (each a plain decoding round).
    pub draft_errors: usize,
    pub last_draft_error: Option<String>,
    /// Seconds spent drafting, and in the target pass with the choice of
    /// tokens.
    pub draft_s: f64,
    pub verify_s: f64,
    /// The round (`rounds` then) at which the planner last switched the
    /// drafter off.
    pub drafter_off_at: Option<usize>,
}

impl EngineStats {
    /// A verified tree of `levels` levels and `nodes` nodes accepted
    /// `accepted` of them.
    pub(super) fn record_tree(&mut self, levels: usize, accepted: usize, nodes: usize) {
        self.seq_rounds += 1;
        self.drafted += nodes;
        self.accepted += accepted;
        if self.depth_drafted.len() < levels {
            self.depth_drafted.resize(levels, 0);
            self.depth_accepted.resize(levels, 0);
        }
        for j in 0..levels {
            self.depth_drafted[j] += 1;
            if j < accepted {
                self.depth_accepted[j] += 1;
            }
        }
    }
}

/// The running batch over one target (and optionally one drafter), owned:
/// the long-lived engine of `draftc serve`.
pub struct Engine<R: Runtime> {
    pub target: TargetModel<R>,
    drafter: Option<Box<dyn Drafter<R>>>,
    policy: DraftPolicy,
    batch: Batch,
}

impl<R: Runtime> Engine<R> {
    /// An engine over `target`'s slots; no drafter: plain decoding.
    pub fn new(
        target: TargetModel<R>,
        drafter: Option<Box<dyn Drafter<R>>>,
        policy: DraftPolicy,
        cfg: EngineConfig,
    ) -> Self {
        let mut drafter = drafter;
        let confident = match &mut drafter {
            Some(d) => use_confidences(d.as_mut(), &policy),
            None => false,
        };
        let batch = Batch::new(target.caches.slots(), cfg, confident, false);
        Engine {
            target,
            drafter,
            policy,
            batch,
        }
    }

    /// The batch and the parts its rounds borrow.
    fn split(&mut self) -> (&mut Batch, Parts<'_, R>) {
        let parts = Parts {
            target: &mut self.target,
            drafter: match &mut self.drafter {
                Some(d) => Some(d.as_mut()),
                None => None,
            },
            policy: &mut self.policy,
        };
        (&mut self.batch, parts)
    }

    /// The target, the drafter and the policy back (after a warm-up run).
    pub fn into_parts(self) -> (TargetModel<R>, Option<Box<dyn Drafter<R>>>, DraftPolicy) {
        (self.target, self.drafter, self.policy)
    }

    pub fn policy(&self) -> &DraftPolicy {
        &self.policy
    }

    /// Sequences in the batch (prefilling or decoding).
    pub fn running(&self) -> usize {
        self.batch.seqs.len()
    }

    pub fn free_slots(&self) -> usize {
        self.batch.free.len()
    }

    /// KV rows held by running sequences.
    pub fn kv_rows(&self) -> usize {
        self.batch
            .seqs
            .iter()
            .map(|s| self.target.len(s.slot))
            .sum()
    }

    /// Prompt plus generated tokens a sequence may hold at most.
    pub fn max_len(&self) -> usize {
        self.target.caches.capacity().saturating_sub(1)
    }

    pub fn stats(&self) -> &EngineStats {
        &self.batch.stats
    }

    /// The target's passes replayed, and recorded, so far, and the CUDA
    /// graphs captured (`exec/replay.rs`).
    pub fn replay_counts(&self) -> (u64, u64, u64) {
        let (replayed, recorded, _) = self.target.exec.replay_stats();
        (replayed, recorded, self.target.exec.graph_stats().0)
    }

    pub fn drafter_name(&self) -> Option<String> {
        self.drafter.as_ref().map(|d| d.name())
    }

    /// Checks a request without adding it (the server answers 400 before
    /// queueing it).
    pub fn check(&self, prompt: &[u32], params: &SeqParams) -> Result<(), EngineError> {
        check_request(prompt, params, self.target.vocab, self.max_len())
    }

    /// Adds a sequence to the batch; it joins the next round.
    pub fn add(&mut self, id: u64, prompt: Vec<u32>, params: SeqParams) -> Result<(), EngineError> {
        let max_len = self.max_len();
        let (batch, mut cx) = self.split();
        batch.add_all(&mut cx, vec![(id, prompt, params)], max_len)
    }

    /// Ends sequence `id` now; false if it is not running.
    pub fn cancel(&mut self, id: u64) -> bool {
        let (batch, mut cx) = self.split();
        batch.cancel(&mut cx, id)
    }

    /// Ends every sequence (after a failed round: the caches may be dirty).
    pub fn cancel_all(&mut self) -> Vec<u64> {
        let ids: Vec<u64> = self.batch.seqs.iter().map(|s| s.id).collect();
        for id in &ids {
            self.cancel(*id);
        }
        ids
    }

    /// One round: drafts, one target pass over every running sequence (and
    /// the next prompt chunks), acceptance and commit. Returns what each
    /// sequence emitted; ended sequences have left the batch.
    pub fn step(&mut self) -> Result<Vec<Emitted>, EngineError> {
        let (batch, mut cx) = self.split();
        batch.step(&mut cx)
    }
}
