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

use std::time::Instant;

use cubecl::prelude::*;
use draftc_ops::sampling::{SamplingParams, MAX_CANDIDATES};
use draftc_ops::{DType, DeviceTensor};

use super::drafters::{Committed, Drafter, SeqView};
use super::select::{argmax_on_device, Sampling, SelectOut};
use super::speculative::{sanitize, DraftPolicy};
use super::target::{EngineError, TargetModel};
use crate::exec::{SeqStep, Step};
use crate::spec::DraftTree;

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
const STICKY_OFF_ROUNDS: usize = 128;

/// Shared prompt rows shorter than this are computed, not copied.
const MIN_PREFIX: usize = 4;

/// Counters since the engine started.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EngineStats {
    /// Target passes.
    pub rounds: usize,
    /// Rounds with decoding sequences in which nothing was drafted.
    pub no_draft_rounds: usize,
    pub prompt_tokens: usize,
    pub generated_tokens: usize,
    /// Draft tokens verified and accepted.
    pub drafted: usize,
    pub accepted: usize,
    /// Prompt rows copied from the prefix cache instead of computed.
    pub prefix_rows: usize,
    /// Rounds whose drafter failed (each a plain decoding round).
    pub draft_errors: usize,
    pub last_draft_error: Option<String>,
}

struct Seq {
    id: u64,
    slot: usize,
    prompt_len: usize,
    /// Prompt rows in the cache.
    prefilled: usize,
    /// Prompt and generated tokens.
    tokens: Vec<u32>,
    params: SeqParams,
    /// The drafter has observed every row this sequence committed.
    synced: bool,
}

impl Seq {
    fn generated(&self) -> usize {
        self.tokens.len() - self.prompt_len
    }
    fn decoding(&self) -> bool {
        self.prefilled == self.prompt_len
    }
}

/// The running batch over one target (and optionally one drafter).
pub struct Engine<R: Runtime> {
    pub target: TargetModel<R>,
    drafter: Option<Box<dyn Drafter<R>>>,
    policy: DraftPolicy,
    cfg: EngineConfig,
    seqs: Vec<Seq>,
    /// Free slots, the lowest last (taken first).
    free: Vec<usize>,
    stats: EngineStats,
    /// The decoding batch size the planner last started a stretch at.
    planned_batch: usize,
    drafter_off: bool,
    /// The drafter reports its own probabilities (a planner cuts by them).
    confident: bool,
    /// The last round drafted.
    drafted_last: bool,
    /// `DRAFTC_ENGINE_TRACE` is set: a line a round on stderr.
    trace: bool,
    /// `DRAFTC_PLAN_DEBUG` is set: the drafter's on/off switches on stderr.
    plan_debug: bool,
    /// The smallest batch size the planner switched the drafter off at,
    /// and the rounds it stays off at that size and above.
    off_from: Option<usize>,
    off_rounds_left: usize,
    off_retry: usize,
    /// The prefix cache's slot and the prompt whose rows it holds.
    prefix_slot: Option<usize>,
    prefix_tokens: Vec<u32>,
    selected: SelectOut,
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
        // A planner cuts drafts by the drafter's own confidences where it
        // reports them; a fixed budget verifies everything and needs none.
        let confident = match (&mut drafter, &policy) {
            (Some(d), DraftPolicy::Planned(_)) => d.set_probabilities(true),
            _ => false,
        };
        let slots = target.caches.slots();
        let prefix_slot = (cfg.prefix_cache && slots >= 2).then_some(slots - 1);
        let free = (0..slots - usize::from(prefix_slot.is_some()))
            .rev()
            .collect();
        Engine {
            target,
            drafter,
            policy,
            cfg: EngineConfig {
                prefill_chunk: cfg.prefill_chunk.max(1),
                ..cfg
            },
            seqs: Vec::new(),
            free,
            stats: EngineStats::default(),
            planned_batch: 0,
            drafter_off: false,
            confident,
            drafted_last: false,
            trace: std::env::var_os("DRAFTC_ENGINE_TRACE").is_some(),
            plan_debug: std::env::var_os("DRAFTC_PLAN_DEBUG").is_some(),
            off_from: None,
            off_rounds_left: 0,
            off_retry: STICKY_OFF_ROUNDS,
            prefix_slot,
            prefix_tokens: Vec::new(),
            selected: SelectOut::default(),
        }
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
        self.seqs.len()
    }

    pub fn free_slots(&self) -> usize {
        self.free.len()
    }

    /// KV rows held by running sequences.
    pub fn kv_rows(&self) -> usize {
        self.seqs.iter().map(|s| self.target.len(s.slot)).sum()
    }

    /// Prompt plus generated tokens a sequence may hold at most.
    pub fn max_len(&self) -> usize {
        self.target.caches.capacity().saturating_sub(1)
    }

    pub fn stats(&self) -> &EngineStats {
        &self.stats
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
        self.check(&prompt, &params)?;
        if self.seqs.iter().any(|s| s.id == id) {
            return Err(EngineError::Invalid(format!(
                "sequence {id} is already running"
            )));
        }
        let slot = self.free.pop().ok_or_else(|| {
            EngineError::Invalid(format!(
                "all {} slots are taken",
                self.target.caches.slots()
            ))
        })?;
        self.target.caches.reset(slot);
        if let DraftPolicy::Planned(p) = &mut self.policy {
            p.reset_seq(slot);
        }
        // A new stretch of the batch: the planner judges it afresh (its
        // retry rule may switch an off drafter back on for it).
        let batch = self.seqs.len() + 1;
        self.start_stretch(batch);
        let synced = match &mut self.drafter {
            Some(d) if !self.drafter_off => {
                d.reset(slot);
                true
            }
            _ => false,
        };
        self.stats.prompt_tokens += prompt.len();
        let prefilled = self.reuse_prefix(slot, &prompt, synced)?;
        self.seqs.push(Seq {
            id,
            slot,
            prompt_len: prompt.len(),
            prefilled,
            tokens: prompt,
            params,
            synced,
        });
        Ok(())
    }

    /// Copies the prompt rows `prompt` shares with the prefix cache into
    /// `slot` (at least [`MIN_PREFIX`], never the last prompt row, whose
    /// logits pick the first token); returns how many. Only for a sequence
    /// no drafter observes: a drafter's own state would miss those rows.
    fn reuse_prefix(
        &mut self,
        slot: usize,
        prompt: &[u32],
        synced: bool,
    ) -> Result<usize, EngineError> {
        let Some(ps) = self.prefix_slot else {
            return Ok(0);
        };
        if synced && self.drafter.as_ref().is_some_and(|d| d.observes_rows()) {
            return Ok(0);
        }
        let shared = prompt
            .iter()
            .zip(&self.prefix_tokens)
            .take_while(|(a, b)| a == b)
            .count()
            .min(prompt.len() - 1);
        if shared < MIN_PREFIX {
            return Ok(0);
        }
        self.target.caches.copy_prefix(ps, slot, shared)?;
        self.stats.prefix_rows += shared;
        Ok(shared)
    }

    /// Keeps the prompt of the sequence in `slot` (its rows all in the
    /// cache) as the prefix cache, unless it adds nothing to it.
    fn store_prefix(&mut self, slot: usize, prompt: &[u32]) -> Result<(), EngineError> {
        let Some(ps) = self.prefix_slot else {
            return Ok(());
        };
        if self.prefix_tokens.starts_with(prompt) {
            return Ok(());
        }
        self.target.caches.reset(ps);
        self.target.caches.copy_prefix(slot, ps, prompt.len())?;
        self.prefix_tokens = prompt.to_vec();
        Ok(())
    }

    /// Ends sequence `id` now; false if it is not running.
    pub fn cancel(&mut self, id: u64) -> bool {
        match self.seqs.iter().position(|s| s.id == id) {
            Some(i) => {
                let s = self.seqs.remove(i);
                self.release(s.slot);
                true
            }
            None => false,
        }
    }

    /// Ends every sequence (after a failed round: the caches may be dirty).
    pub fn cancel_all(&mut self) -> Vec<u64> {
        let ids: Vec<u64> = self.seqs.iter().map(|s| s.id).collect();
        for id in &ids {
            self.cancel(*id);
        }
        ids
    }

    fn release(&mut self, slot: usize) {
        self.target.caches.reset(slot);
        if let Some(d) = &mut self.drafter {
            d.reset(slot);
        }
        self.free.push(slot);
        // The lowest free slot is taken first: runs are repeatable.
        self.free.sort_unstable_by(|a, b| b.cmp(a));
    }

    /// Stops drafting for every running sequence (the planner switched the
    /// drafter off); sequences that join later draft again.
    fn go_off(&mut self) {
        self.drafter_off = true;
        for s in &mut self.seqs {
            if s.synced {
                s.synced = false;
                if let Some(d) = &mut self.drafter {
                    d.reset(s.slot);
                }
            }
        }
    }

    /// A planner's judgement of a batch of `batch` sequences starting now
    /// (a join, a leave): whether the drafter is off for it.
    fn start_stretch(&mut self, batch: usize) {
        let DraftPolicy::Planned(p) = &mut self.policy else {
            return;
        };
        if self.drafter.is_none() {
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
    fn budgets(&mut self, decoding: &[usize]) -> Vec<usize> {
        let mut budgets = vec![0; decoding.len()];
        if self.drafter.is_none() || decoding.is_empty() {
            return budgets;
        }
        match &mut self.policy {
            DraftPolicy::Fixed(k) => {
                for (b, &i) in budgets.iter_mut().zip(decoding) {
                    if self.seqs[i].synced {
                        *b = *k;
                    }
                }
            }
            DraftPolicy::Planned(_) => {
                let batch = decoding.len();
                if batch != self.planned_batch {
                    self.start_stretch(batch);
                }
                let mut went_off = false;
                if let DraftPolicy::Planned(p) = &mut self.policy {
                    if self.drafter_off || !decoding.iter().any(|&i| self.seqs[i].synced) {
                        p.rounds_off(batch, 1, batch);
                    } else {
                        let slots: Vec<usize> =
                            decoding.iter().map(|&i| self.seqs[i].slot).collect();
                        let ctx = decoding
                            .iter()
                            .map(|&i| self.seqs[i].tokens.len())
                            .sum::<usize>() as f64
                            / batch as f64;
                        p.set_context(ctx);
                        p.set_rooms(decoding.iter().map(|&i| {
                            let s = &self.seqs[i];
                            (s.slot, s.params.max_tokens - s.generated())
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
                            self.drafter_off = true;
                            went_off = true;
                        } else {
                            for ((b, &k), &i) in budgets.iter_mut().zip(&plan.budgets).zip(decoding)
                            {
                                if self.seqs[i].synced {
                                    *b = k;
                                }
                            }
                        }
                    }
                }
                if went_off {
                    self.went_off(batch);
                }
            }
        }
        if self.drafter_off {
            self.go_off();
            budgets.iter_mut().for_each(|b| *b = 0);
        }
        budgets
    }

    /// One round: drafts, one target pass over every running sequence (and
    /// the next prompt chunks), acceptance and commit. Returns what each
    /// sequence emitted; ended sequences have left the batch.
    pub fn step(&mut self) -> Result<Vec<Emitted>, EngineError> {
        if self.seqs.is_empty() {
            return Ok(Vec::new());
        }
        self.off_rounds_left = self.off_rounds_left.saturating_sub(1);
        if self.off_rounds_left == 0 {
            self.off_from = None;
        }
        let t0 = Instant::now();
        let vocab = self.target.vocab;
        let decoding: Vec<usize> = (0..self.seqs.len())
            .filter(|&i| self.seqs[i].decoding())
            .collect();
        let budgets = self.budgets(&decoding);
        let budget = budgets.iter().copied().max().unwrap_or(0);
        // 1. Draft, for the synced decoding sequences.
        let drafting: Vec<usize> = decoding
            .iter()
            .copied()
            .filter(|&i| self.seqs[i].synced)
            .collect();
        let mut trees: Vec<DraftTree> = vec![DraftTree::new(); decoding.len()];
        let mut conf: Vec<Vec<f64>> = Vec::new();
        let drafted = budget > 0 && !drafting.is_empty();
        let mut draft_s = 0.0;
        if drafted {
            let views = views(&self.seqs, &drafting);
            let got = match self.drafter.as_mut() {
                Some(d) => d.draft(&mut self.target, &views, budget),
                None => Ok(Vec::new()),
            };
            let got = match got {
                Ok(t) if t.len() == views.len() => t,
                Ok(t) => {
                    self.stats.draft_errors += 1;
                    self.stats.last_draft_error =
                        Some(format!("{} trees for {} sequences", t.len(), views.len()));
                    vec![DraftTree::new(); views.len()]
                }
                Err(e) => {
                    self.stats.draft_errors += 1;
                    self.stats.last_draft_error = Some(e.to_string());
                    vec![DraftTree::new(); views.len()]
                }
            };
            // Verification starts from the committed rows, whatever the
            // drafter wrote into the target's caches.
            for v in &views {
                self.target.caches.truncate(v.slot, v.committed);
            }
            drop(views);
            // (Near max_tokens the room, not the drafter, cuts the trees.)
            let room_all = decoding.iter().all(|&i| {
                let s = &self.seqs[i];
                s.params.max_tokens - s.generated() > budget
            });
            for (tree, &i) in got.into_iter().zip(&drafting) {
                let j = decoding.iter().position(|&d| d == i).unwrap_or(0);
                let s = &self.seqs[i];
                // Never draft past max_tokens: the bonus needs one slot.
                let room = (s.params.max_tokens - s.generated()).saturating_sub(1);
                trees[j] = sanitize(tree, vocab, budgets[j].min(room));
            }
            if let DraftPolicy::Planned(p) = &mut self.policy {
                let slots: Vec<usize> = decoding.iter().map(|&i| self.seqs[i].slot).collect();
                let depths: Vec<usize> = trees.iter().map(DraftTree::levels).collect();
                if room_all {
                    p.observe_depth(budget, depths.iter().copied().max().unwrap_or(0));
                }
                if self.confident {
                    conf = trees.iter().map(DraftTree::path_confidences).collect();
                }
                let spent = t0.elapsed().as_secs_f64();
                let c = self.confident.then_some(&conf[..]);
                if let Some(keep) = p.verify_counts(&slots, &depths, spent, c) {
                    for (t, k) in trees.iter_mut().zip(keep) {
                        if k < t.levels() {
                            *t = t.prune_to_depth(k);
                        }
                    }
                }
            }
            draft_s = t0.elapsed().as_secs_f64();
        }
        // 2. One pass: every decoding sequence's root and tree, then prompt
        // chunks in joining order.
        let tv = Instant::now();
        let max_rows = self.target.max_rows;
        let mut step = Step::default();
        let mut ids: Vec<u32> = Vec::new();
        // (index into seqs, first row, rows)
        let mut placed: Vec<(usize, usize, usize)> = Vec::new();
        for (j, &i) in decoding.iter().enumerate() {
            let s = &self.seqs[i];
            let committed = s.tokens.len() - 1;
            // A batch too wide for one pass drops the drafts that do not fit.
            let decode_left = decoding.len() - j - 1;
            if ids.len() + 1 + trees[j].len() + decode_left > max_rows {
                trees[j] = DraftTree::new();
            }
            let tree = &trees[j];
            let mut positions = vec![committed as u32];
            positions.extend(tree.positions(committed + 1));
            placed.push((i, ids.len(), positions.len()));
            step.seqs.push(SeqStep {
                slot: s.slot,
                positions,
                parents: (!tree.is_empty()).then(|| tree.verify_parents()),
                memory_tail: None,
            });
            ids.extend(tree.verify_tokens(s.tokens[committed]));
        }
        let decode_rows = ids.len();
        let mut chunk_left = if decoding.is_empty() {
            max_rows
        } else {
            self.cfg
                .prefill_chunk
                .min(max_rows.saturating_sub(decode_rows))
        };
        let mut chunks: Vec<(usize, usize, usize)> = Vec::new();
        for (i, s) in self.seqs.iter().enumerate() {
            if s.decoding() || chunk_left == 0 {
                continue;
            }
            let n = chunk_left.min(s.prompt_len - s.prefilled);
            chunks.push((i, ids.len(), n));
            step.seqs
                .push(SeqStep::chain(s.slot, s.prefilled as u32, n));
            ids.extend_from_slice(&s.tokens[s.prefilled..s.prefilled + n]);
            chunk_left -= n;
        }
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        if drafted {
            let views = views(&self.seqs, &drafting);
            let dtrees: Vec<DraftTree> = drafting
                .iter()
                .map(|i| trees[decoding.iter().position(|d| d == i).unwrap_or(0)].clone())
                .collect();
            if let Some(d) = self.drafter.as_mut() {
                d.verifying(&views, &dtrees)?;
            }
        }
        let out = self.target.forward(&step, &ids)?;
        self.stats.rounds += 1;
        let logits = out.get("logits")?;
        // 3. The target's choice at every row that needs one.
        // (row, sampling, the position the row predicts)
        let mut rows: Vec<(u32, Sampling, u32)> = Vec::new();
        for (j, &(i, at, _)) in placed.iter().enumerate() {
            let sampling = self.seqs[i].params.sampling;
            for (k, &pos) in step.seqs[j].positions.iter().enumerate() {
                rows.push(((at + k) as u32, sampling, pos + 1));
            }
        }
        for &(i, at, n) in &chunks {
            let s = &self.seqs[i];
            if s.prefilled + n == s.prompt_len {
                rows.push(((at + n - 1) as u32, s.params.sampling, s.prompt_len as u32));
            }
        }
        let choice = choose(
            self.target.client(),
            logits,
            vocab,
            &rows,
            &mut self.selected,
        )?;
        let mut by_row = vec![0u32; ids.len()];
        for (r, c) in rows.iter().zip(&choice) {
            by_row[r.0 as usize] = *c;
        }
        let choice_of = |row: usize| -> u32 { by_row.get(row).copied().unwrap_or(0) };
        let verify_s = tv.elapsed().as_secs_f64();
        // 4. Accept and commit.
        let mut gave = RoundOut::default();
        let mut paths = Vec::new();
        let mut committed_rows: Vec<Committed> = Vec::new();
        let mut per_seq = Vec::new();
        for (j, &(i, at, n)) in placed.iter().enumerate() {
            let tree = &trees[j];
            let node_choice: Vec<u32> = (at + 1..at + n).map(choice_of).collect();
            let a = tree
                .longest_accepted_path(choice_of(at), &node_choice)
                .map_err(|e| EngineError::Invalid(e.to_string()))?;
            self.stats.drafted += tree.len();
            self.stats.accepted += a.nodes.len();
            per_seq.push((tree.levels(), a.nodes.len()));
            let s = &mut self.seqs[i];
            let committed = s.tokens.len() - 1;
            let keep: Vec<usize> = std::iter::once(0)
                .chain(a.nodes.iter().map(|&k| k + 1))
                .collect();
            let new: Vec<u32> = a
                .nodes
                .iter()
                .map(|&k| tree.nodes()[k].token)
                .chain(std::iter::once(a.bonus))
                .collect();
            if gave.push(i, s, &new) {
                continue;
            }
            if s.synced {
                committed_rows.push(Committed {
                    slot: s.slot,
                    rows: keep.iter().map(|&k| (at + k) as u32).collect(),
                    positions: (committed as u32..(committed + keep.len()) as u32).collect(),
                });
            }
            paths.push((s.slot, committed, keep));
        }
        for &(i, _, n) in &chunks {
            let s = &self.seqs[i];
            if s.prefilled + n == s.prompt_len && self.prefix_slot.is_some() {
                let (slot, prompt) = (s.slot, s.tokens[..s.prompt_len].to_vec());
                self.store_prefix(slot, &prompt)?;
            }
        }
        for &(i, at, n) in &chunks {
            let s = &mut self.seqs[i];
            if s.synced {
                committed_rows.push(Committed {
                    slot: s.slot,
                    rows: (at as u32..(at + n) as u32).collect(),
                    positions: (s.prefilled as u32..(s.prefilled + n) as u32).collect(),
                });
            }
            s.prefilled += n;
            if s.prefilled == s.prompt_len {
                gave.push(i, s, &[choice_of(at + n - 1)]);
            }
        }
        self.target.caches.compact_all(&paths)?;
        if let Some(d) = self.drafter.as_mut() {
            if drafted {
                let draft_tokens = trees.iter().map(DraftTree::len).sum();
                d.verified(verify_s, draft_tokens, &per_seq);
            }
            // Finished sequences leave before the drafter sees them.
            let gone: Vec<usize> = gave.finished.iter().map(|&i| self.seqs[i].slot).collect();
            committed_rows.retain(|c| !gone.contains(&c.slot));
            if !committed_rows.is_empty() {
                d.observe(self.target.client(), &out, &committed_rows)?;
            }
        }
        if !decoding.is_empty() && !drafted {
            self.stats.no_draft_rounds += 1;
        }
        // The planner's books: acceptance always; costs only for passes
        // without prompt rows (its tables are per verify width).
        if let DraftPolicy::Planned(p) = &mut self.policy {
            for (j, &i) in decoding.iter().enumerate() {
                let (levels, acc) = per_seq[j];
                if drafted && self.seqs[i].synced {
                    p.observe_seq(self.seqs[i].slot, levels, acc);
                    if let Some(c) = conf.get(j) {
                        p.observe_confidence(&c[..c.len().min(levels)], acc);
                    }
                }
            }
            if chunks.is_empty() && !decoding.is_empty() && !self.drafter_off {
                let batch = decoding.len();
                if drafted {
                    p.observe_draft(batch, budget, draft_s, self.drafted_last);
                }
                p.observe_verify(decode_rows, tv.elapsed().as_secs_f64());
                p.observe_round(batch, gave.tokens, t0.elapsed().as_secs_f64(), drafted);
            }
        }
        if self.trace {
            // DRAFTC_ENGINE_TRACE=1: one line a round, times in ms.
            eprintln!(
                "engine round {}: decoding {} (rows {decode_rows}), prompt rows {}, drafted {drafted}, \
                 emitted {}, draft {:.1} pass+choose {:.1} round {:.1}",
                self.stats.rounds,
                decoding.len(),
                ids.len() - decode_rows,
                gave.tokens,
                draft_s * 1e3,
                verify_s * 1e3,
                t0.elapsed().as_secs_f64() * 1e3
            );
        }
        self.drafted_last = drafted;
        self.stats.generated_tokens += gave.tokens;
        gave.finished.sort_unstable();
        for &i in gave.finished.iter().rev() {
            let s = self.seqs.remove(i);
            self.release(s.slot);
        }
        Ok(gave.emitted)
    }
}

/// What the drafter sees of the sequences `idx` (indices into `seqs`).
fn views<'a>(seqs: &'a [Seq], idx: &[usize]) -> Vec<SeqView<'a>> {
    idx.iter()
        .map(|&i| {
            let s = &seqs[i];
            SeqView {
                slot: s.slot,
                tokens: &s.tokens,
                committed: s.tokens.len() - 1,
            }
        })
        .collect()
}

/// What a round gave its sequences.
#[derive(Default)]
struct RoundOut {
    emitted: Vec<Emitted>,
    /// Indices (into the engine's sequences) of those that ended.
    finished: Vec<usize>,
    /// Tokens emitted in all.
    tokens: usize,
}

impl RoundOut {
    /// Sequence `i` (`s`) emits `new` up to its stop id or token budget;
    /// returns whether it ended.
    fn push(&mut self, i: usize, s: &mut Seq, new: &[u32]) -> bool {
        let (tokens, finish) = take_tokens(s, new);
        self.tokens += tokens.len();
        self.emitted.push(Emitted {
            id: s.id,
            tokens,
            finish,
        });
        if finish.is_some() {
            self.finished.push(i);
        }
        finish.is_some()
    }
}

/// Appends `new` to `s` up to its stop id or token budget; what was kept
/// and whether the sequence ended.
fn take_tokens(s: &mut Seq, new: &[u32]) -> (Vec<u32>, Option<Finish>) {
    let mut kept = Vec::new();
    for &t in new {
        s.tokens.push(t);
        kept.push(t);
        if s.params.stop_ids.contains(&t) {
            return (kept, Some(Finish::Stop));
        }
        if s.generated() >= s.params.max_tokens {
            return (kept, Some(Finish::Length));
        }
    }
    (kept, None)
}

/// Checks a request against the engine's sizes.
pub fn check_request(
    prompt: &[u32],
    params: &SeqParams,
    vocab: usize,
    max_len: usize,
) -> Result<(), EngineError> {
    params.sampling.validate()?;
    if params.sampling.top_k > MAX_CANDIDATES {
        return Err(EngineError::Invalid(format!(
            "top_k must be at most {MAX_CANDIDATES}, got {}",
            params.sampling.top_k
        )));
    }
    if prompt.is_empty() {
        return Err(EngineError::Invalid("the prompt has no tokens".into()));
    }
    if let Some(&bad) = prompt.iter().find(|&&t| t as usize >= vocab) {
        return Err(EngineError::Invalid(format!(
            "token id {bad} is outside the vocabulary (size {vocab})"
        )));
    }
    if params.max_tokens == 0 {
        return Err(EngineError::Invalid("max_tokens must be at least 1".into()));
    }
    if prompt.len().saturating_add(params.max_tokens) > max_len {
        return Err(EngineError::Invalid(format!(
            "the prompt ({} tokens) and max_tokens ({}) exceed the context of {max_len} tokens",
            prompt.len(),
            params.max_tokens
        )));
    }
    Ok(())
}

/// The target's choice at each of `rows` (row of `logits`, sampling,
/// position the row predicts): one argmax over the pass for the greedy
/// rows, a sample per sampled row keyed by the sequence's seed and that
/// position. One read of the device for all.
fn choose<R: Runtime>(
    client: &ComputeClient<R>,
    logits: &DeviceTensor<R>,
    vocab: usize,
    rows: &[(u32, Sampling, u32)],
    selected: &mut SelectOut,
) -> Result<Vec<u32>, EngineError> {
    let all_rows = logits.numel() / vocab.max(1);
    let all = logits.reshape(&[all_rows, vocab])?;
    let mut reads: Vec<DeviceTensor<R>> = Vec::new();
    let any_greedy = rows.iter().any(|r| r.1.is_greedy());
    if any_greedy {
        reads.push(argmax_on_device(client, &all, selected)?);
    }
    for &(row, s, pos) in rows.iter().filter(|r| !r.1.is_greedy()) {
        let one = DeviceTensor::<R>::empty(client, &[1, vocab], all.dtype());
        draftc_ops::kv::gather_rows(client, &all, &[row], &one, &[0])?;
        let out = DeviceTensor::<R>::empty(client, &[1], DType::U32);
        let params = SamplingParams {
            temperature: s.temperature,
            top_k: s.top_k,
            top_p: s.top_p,
            seed: s.seed,
            step: pos,
        };
        draftc_ops::sampling::sample(client, &one, params, &out)?;
        reads.push(out);
    }
    let refs: Vec<&DeviceTensor<R>> = reads.iter().collect();
    let got = DeviceTensor::download_u32_all(client, &refs)?;
    let mut sampled = got.iter().skip(usize::from(any_greedy));
    let greedy = if any_greedy { got.first() } else { None };
    Ok(rows
        .iter()
        .map(|&(row, s, _)| {
            if s.is_greedy() {
                greedy
                    .and_then(|g| g.get(row as usize).copied())
                    .unwrap_or(0)
            } else {
                sampled.next().and_then(|v| v.first().copied()).unwrap_or(0)
            }
        })
        .collect())
}
