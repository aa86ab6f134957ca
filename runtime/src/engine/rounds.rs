//! The round machine behind [`super::Engine`] and the static batch runs
//! (`draftc generate`, `bench spec`): a [`Batch`] of sequences, each in a
//! KV slot, that join ([`Batch::add`]), leave ([`Batch::cancel`], a stop id,
//! their token budget) and advance one round at a time ([`Batch::step`]):
//! drafts for the sequences a drafter has seen from their first prompt row,
//! one target pass over every decoding sequence's tree plus the next prompt
//! chunks, the target's choice at every row, the longest matching path plus
//! the bonus token, compaction, and the drafter's observation.
//!
//! A batch owns no model: every call borrows the target, the drafter and
//! the draft policy as [`Parts`], so a long-lived engine (`serve`) and a
//! run over borrowed parts (`generate_with_policy`) drive the same rounds.
//! The planner's side (who drafts how much, the drafter's off switch) is in
//! `rounds_plan.rs`.

use std::time::Instant;

use cubecl::prelude::*;
use draftc_ops::sampling::MAX_CANDIDATES;

use super::continuous::{EngineConfig, EngineStats, Finish, SeqParams};
use super::drafters::{Committed, DraftCall, Drafter, Observed, SeqView};
use super::rounds_plan::RoundFacts;
use super::select::{choose_rows, SelectOut};
use super::speculative::{sanitize, DraftPolicy};
use super::target::{EngineError, TargetModel};
use super::Emitted;
use crate::exec::{SeqStep, Step};
use crate::speculation::DraftTree;

/// Shared prompt rows shorter than this are computed, not copied.
const MIN_PREFIX: usize = 4;

/// What a round works on, borrowed for the call.
pub(super) struct Parts<'a, R: Runtime> {
    pub target: &'a mut TargetModel<R>,
    pub drafter: Option<&'a mut dyn Drafter<R>>,
    pub policy: &'a mut DraftPolicy,
}

pub(super) struct Seq {
    pub id: u64,
    pub slot: usize,
    pub prompt_len: usize,
    /// Prompt rows in the cache.
    pub prefilled: usize,
    /// Prompt and generated tokens.
    pub tokens: Vec<u32>,
    pub params: SeqParams,
    /// The drafter has observed every row this sequence committed.
    pub synced: bool,
}

impl Seq {
    pub fn generated(&self) -> usize {
        self.tokens.len() - self.prompt_len
    }
    pub fn decoding(&self) -> bool {
        self.prefilled == self.prompt_len
    }
    /// New tokens it may still emit.
    pub fn room(&self) -> usize {
        self.params.max_tokens - self.generated()
    }
}

/// Tells `drafter` whether to carry its own probabilities in its trees: a
/// planner cuts drafts by them where the drafter reports them (a fixed
/// budget verifies everything and needs none; `DRAFTC_PLAN_CONFIDENCE=off`
/// plans by depth alone, to measure what they change). Returns whether it
/// will.
pub(super) fn use_confidences<R: Runtime>(
    drafter: &mut dyn Drafter<R>,
    policy: &DraftPolicy,
) -> bool {
    let by_confidence = std::env::var("DRAFTC_PLAN_CONFIDENCE").map_or(true, |v| v != "off");
    drafter.set_probabilities(by_confidence && matches!(policy, DraftPolicy::Planned(_)))
}

/// The running sequences and the engine's books.
pub(super) struct Batch {
    pub cfg: EngineConfig,
    pub seqs: Vec<Seq>,
    /// Free slots, the lowest last (taken first).
    pub free: Vec<usize>,
    pub stats: EngineStats,
    /// A static run: the batch only shrinks, and the planner judges it
    /// once, when it starts (a run's end is judged by the caller), not
    /// again at every leave.
    pub fixed: bool,
    /// The decoding batch size the planner last started a stretch at.
    pub planned_batch: usize,
    pub drafter_off: bool,
    /// The drafter reports its own probabilities (a planner cuts by them).
    pub confident: bool,
    /// The last round drafted.
    pub drafted_last: bool,
    /// `DRAFTC_ENGINE_TRACE` is set: a line a round on stderr.
    pub trace: bool,
    /// `DRAFTC_PLAN_DEBUG` is set: the drafter's on/off switches on stderr.
    pub plan_debug: bool,
    /// The smallest batch size the planner switched the drafter off at,
    /// and the rounds it stays off at that size and above.
    pub off_from: Option<usize>,
    pub off_rounds_left: usize,
    pub off_retry: usize,
    /// The prefix cache's slot and the prompt whose rows it holds.
    pub prefix_slot: Option<usize>,
    pub prefix_tokens: Vec<u32>,
    pub selected: SelectOut,
    /// The last round's greedy choices, still on the device, are this
    /// round's ids in order (it had no draft and no prompt rows, every
    /// sequence went on and all are greedy): a round without draft then
    /// uploads no ids, like a plain decoder's step.
    pub ids_on_device: bool,
}

/// One round's target pass, laid out.
struct Pass {
    step: Step,
    ids: Vec<u32>,
    /// Decoding sequences: (index into seqs, first row, rows).
    placed: Vec<(usize, usize, usize)>,
    /// Prompt chunks: (index into seqs, first row, rows).
    chunks: Vec<(usize, usize, usize)>,
    /// Rows of the decoding sequences (roots and trees).
    decode_rows: usize,
}

/// One round's drafts, per decoding sequence.
struct Drafts {
    trees: Vec<DraftTree>,
    /// The drafter's confidence along each tree's likeliest path (planned
    /// runs with a drafter that reports it).
    conf: Vec<Vec<f64>>,
    /// The decoding sequences the drafter drafted for (indices into
    /// `decoding`, so into `trees`).
    drafting: Vec<usize>,
    /// The largest budget of the round.
    budget: usize,
    drafted: bool,
    seconds: f64,
}

impl Batch {
    /// A batch over `slots` KV slots (the last one the prefix cache's when
    /// `cfg.prefix_cache`).
    pub fn new(slots: usize, cfg: EngineConfig, confident: bool, fixed: bool) -> Batch {
        let prefix_slot = (cfg.prefix_cache && slots >= 2).then_some(slots - 1);
        let free = (0..slots - usize::from(prefix_slot.is_some()))
            .rev()
            .collect();
        Batch {
            cfg: EngineConfig {
                prefill_chunk: cfg.prefill_chunk.max(1),
                ..cfg
            },
            seqs: Vec::new(),
            free,
            stats: EngineStats::default(),
            fixed,
            planned_batch: 0,
            drafter_off: false,
            confident,
            drafted_last: false,
            trace: std::env::var_os("DRAFTC_ENGINE_TRACE").is_some(),
            plan_debug: std::env::var_os("DRAFTC_PLAN_DEBUG").is_some(),
            off_from: None,
            off_rounds_left: 0,
            off_retry: super::continuous::STICKY_OFF_ROUNDS,
            prefix_slot,
            prefix_tokens: Vec::new(),
            selected: SelectOut::default(),
            ids_on_device: false,
        }
    }

    /// Adds sequences that join the next round together: the planner
    /// judges the batch they make once.
    /// `max_len`: prompt plus new tokens a sequence may hold at most.
    pub fn add_all<R: Runtime>(
        &mut self,
        cx: &mut Parts<'_, R>,
        seqs: Vec<(u64, Vec<u32>, SeqParams)>,
        max_len: usize,
    ) -> Result<(), EngineError> {
        for (i, (id, prompt, params)) in seqs.iter().enumerate() {
            check_request(prompt, params, cx.target.vocab, max_len)?;
            if self.seqs.iter().any(|s| s.id == *id) || seqs[..i].iter().any(|s| s.0 == *id) {
                return Err(EngineError::Invalid(format!(
                    "sequence {id} is already running"
                )));
            }
        }
        if seqs.len() > self.free.len() {
            return Err(EngineError::Invalid(format!(
                "{} sequences but {} free slots (the caches were sized for {})",
                seqs.len(),
                self.free.len(),
                cx.target.caches.slots()
            )));
        }
        if seqs.is_empty() {
            return Ok(());
        }
        // A new stretch of the batch: the planner judges it afresh (its
        // retry rule may switch an off drafter back on for it).
        self.start_stretch(cx, self.seqs.len() + seqs.len());
        self.ids_on_device = false;
        for (id, prompt, params) in seqs {
            let slot = self.free.pop().unwrap_or_default();
            cx.target.caches.reset(slot);
            if let DraftPolicy::Planned(p) = &mut *cx.policy {
                p.reset_seq(slot);
            }
            let synced = match cx.drafter.as_deref_mut() {
                Some(d) if !self.drafter_off => {
                    d.reset(slot);
                    true
                }
                _ => false,
            };
            self.stats.prompt_tokens += prompt.len();
            let prefilled = self.reuse_prefix(cx, slot, &prompt, synced)?;
            self.seqs.push(Seq {
                id,
                slot,
                prompt_len: prompt.len(),
                prefilled,
                tokens: prompt,
                params,
                synced,
            });
        }
        Ok(())
    }

    /// Copies the prompt rows `prompt` shares with the prefix cache into
    /// `slot` (at least [`MIN_PREFIX`], never the last prompt row, whose
    /// logits pick the first token); returns how many. Only for a sequence
    /// no drafter observes: a drafter's own state would miss those rows.
    fn reuse_prefix<R: Runtime>(
        &mut self,
        cx: &mut Parts<'_, R>,
        slot: usize,
        prompt: &[u32],
        synced: bool,
    ) -> Result<usize, EngineError> {
        let Some(ps) = self.prefix_slot else {
            return Ok(0);
        };
        if synced && cx.drafter.as_deref().is_some_and(|d| d.observes_rows()) {
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
        cx.target.caches.copy_prefix(ps, slot, shared)?;
        self.stats.prefix_rows += shared;
        Ok(shared)
    }

    /// Keeps the prompt of the sequence in `slot` (its rows all in the
    /// cache) as the prefix cache, unless it adds nothing to it.
    fn store_prefix<R: Runtime>(
        &mut self,
        target: &mut TargetModel<R>,
        slot: usize,
        prompt: &[u32],
    ) -> Result<(), EngineError> {
        let Some(ps) = self.prefix_slot else {
            return Ok(());
        };
        if self.prefix_tokens.starts_with(prompt) {
            return Ok(());
        }
        target.caches.reset(ps);
        target.caches.copy_prefix(slot, ps, prompt.len())?;
        self.prefix_tokens = prompt.to_vec();
        Ok(())
    }

    /// Ends sequence `id` now; false if it is not running.
    pub fn cancel<R: Runtime>(&mut self, cx: &mut Parts<'_, R>, id: u64) -> bool {
        match self.seqs.iter().position(|s| s.id == id) {
            Some(i) => {
                let s = self.seqs.remove(i);
                self.release(cx, s.slot);
                true
            }
            None => false,
        }
    }

    fn release<R: Runtime>(&mut self, cx: &mut Parts<'_, R>, slot: usize) {
        cx.target.caches.reset(slot);
        if let Some(d) = cx.drafter.as_deref_mut() {
            d.reset(slot);
        }
        self.free.push(slot);
        // The lowest free slot is taken first: runs are repeatable.
        self.free.sort_unstable_by(|a, b| b.cmp(a));
        self.ids_on_device = false;
    }

    /// One round: drafts, one target pass over every running sequence (and
    /// the next prompt chunks), acceptance and commit. Returns what each
    /// sequence emitted; ended sequences have left the batch.
    pub fn step<R: Runtime>(&mut self, cx: &mut Parts<'_, R>) -> Result<Vec<Emitted>, EngineError> {
        if self.seqs.is_empty() {
            return Ok(Vec::new());
        }
        // On a GPU the round queues its launches; each pass flushes once
        // and the reads (acceptance, a drafter's selections) are the only
        // waits.
        let _flushes = cx.target.exec.flush_policy().defer();
        self.off_rounds_left = self.off_rounds_left.saturating_sub(1);
        if self.off_rounds_left == 0 {
            self.off_from = None;
        }
        let t0 = Instant::now();
        // A static run prefills every prompt before anything decodes, so
        // its sequences stay in step (a batch that shrinks only when they
        // end, as a plain decoder's); a continuous one decodes beside the
        // prompts that join.
        let prefilling = self.seqs.iter().any(|s| !s.decoding());
        let decoding: Vec<usize> = (0..self.seqs.len())
            .filter(|&i| self.seqs[i].decoding() && !(self.fixed && prefilling))
            .collect();
        let budgets = self.budgets(cx, &decoding);
        let mut drafts = self.draft(cx, &decoding, &budgets, t0)?;
        // 2. One pass: every decoding sequence's root and tree, then prompt
        // chunks in joining order.
        let tv = Instant::now();
        let pass = self.lay_out(cx.target.max_rows, &decoding, &mut drafts.trees);
        if pass.ids.is_empty() {
            return Ok(Vec::new());
        }
        if drafts.drafted {
            if let Some(d) = cx.drafter.as_deref_mut() {
                let idx: Vec<usize> = drafts.drafting.iter().map(|&j| decoding[j]).collect();
                let views = views(&self.seqs, &idx);
                let dtrees: Vec<DraftTree> = drafts
                    .drafting
                    .iter()
                    .map(|&j| drafts.trees[j].clone())
                    .collect();
                d.verifying(&views, &dtrees)?;
            }
        }
        let on_device = self
            .selected
            .last(pass.ids.len())
            .filter(|_| self.ids_on_device && pass.ids.len() == decoding.len());
        let out = match on_device {
            Some(dev) => cx.target.forward_on_device(&pass.step, &pass.ids, dev)?,
            None => cx.target.forward(&pass.step, &pass.ids)?,
        };
        self.stats.rounds += 1;
        let choice = self.choose(cx.target, out.get("logits")?, &pass)?;
        let verify_s = tv.elapsed().as_secs_f64();
        // 4. Accept and commit.
        let (gave, per_seq) = self.commit(cx, &out, &pass, &drafts, &choice, verify_s)?;
        self.stats.verify_s += verify_s;
        self.plan_books(
            cx,
            RoundFacts {
                decoding: &decoding,
                per_seq: &per_seq,
                conf: &drafts.conf,
                drafted: drafts.drafted,
                budget: drafts.budget,
                draft_s: drafts.seconds,
                decode_rows: pass.decode_rows,
                prompt_rows: !pass.chunks.is_empty(),
                emitted: gave.tokens,
                started: (t0, tv),
            },
        );
        if self.trace {
            // DRAFTC_ENGINE_TRACE=1: one line a round, times in ms.
            eprintln!(
                "engine round {}: decoding {} (rows {}), prompt rows {}, drafted {}, \
                 emitted {}, draft {:.1} pass+choose {:.1} round {:.1}",
                self.stats.rounds,
                decoding.len(),
                pass.decode_rows,
                pass.ids.len() - pass.decode_rows,
                drafts.drafted,
                gave.tokens,
                drafts.seconds * 1e3,
                verify_s * 1e3,
                t0.elapsed().as_secs_f64() * 1e3
            );
        }
        self.drafted_last = drafts.drafted;
        self.ids_on_device = !drafts.drafted
            && pass.chunks.is_empty()
            && gave.finished.is_empty()
            && pass.decode_rows == decoding.len()
            && decoding
                .iter()
                .all(|&i| self.seqs[i].params.sampling.is_greedy());
        self.stats.generated_tokens += gave.tokens;
        let mut finished = gave.finished;
        finished.sort_unstable();
        for &i in finished.iter().rev() {
            let s = self.seqs.remove(i);
            self.release(cx, s.slot);
        }
        Ok(gave.emitted)
    }

    /// Step 1, the drafts: for the synced decoding sequences, sanitized and cut to
    /// their budgets and room, then to what the planner will verify.
    fn draft<R: Runtime>(
        &mut self,
        cx: &mut Parts<'_, R>,
        decoding: &[usize],
        budgets: &[usize],
        t0: Instant,
    ) -> Result<Drafts, EngineError> {
        let budget = budgets.iter().copied().max().unwrap_or(0);
        let drafting: Vec<usize> = (0..decoding.len())
            .filter(|&j| self.seqs[decoding[j]].synced)
            .collect();
        let mut d = Drafts {
            trees: vec![DraftTree::new(); decoding.len()],
            conf: Vec::new(),
            drafted: budget > 0 && !drafting.is_empty(),
            drafting,
            budget,
            seconds: 0.0,
        };
        let Some(drafter) = cx.drafter.as_deref_mut().filter(|_| d.drafted) else {
            d.drafted = false;
            return Ok(d);
        };
        let vocab = cx.target.vocab;
        let idx: Vec<usize> = d.drafting.iter().map(|&j| decoding[j]).collect();
        let views = views(&self.seqs, &idx);
        let got = match drafter.draft(DraftCall {
            target: cx.target,
            seqs: &views,
            budget,
        }) {
            Ok(t) if t.len() == views.len() => t,
            // A failing drafter costs a round of speed, not correctness.
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
            cx.target.caches.truncate(v.slot, v.committed);
        }
        drop(views);
        // (Near max_tokens the room, not the drafter, cuts the trees.)
        let room_all = decoding.iter().all(|&i| self.seqs[i].room() > budget);
        for (tree, &j) in got.into_iter().zip(&d.drafting) {
            // Never draft past max_tokens: the bonus needs one slot.
            let room = self.seqs[decoding[j]].room().saturating_sub(1);
            d.trees[j] = sanitize(tree, vocab, budgets[j].min(room));
        }
        if let DraftPolicy::Planned(p) = &mut *cx.policy {
            let slots: Vec<usize> = decoding.iter().map(|&i| self.seqs[i].slot).collect();
            let depths: Vec<usize> = d.trees.iter().map(DraftTree::levels).collect();
            if room_all {
                p.observe_depth(budget, depths.iter().copied().max().unwrap_or(0));
            }
            if self.confident {
                d.conf = d.trees.iter().map(DraftTree::path_confidences).collect();
            }
            let spent = t0.elapsed().as_secs_f64();
            let c = self.confident.then_some(&d.conf[..]);
            if let Some(keep) = p.verify_counts(&slots, &depths, spent, c) {
                for (t, k) in d.trees.iter_mut().zip(keep) {
                    if k < t.levels() {
                        *t = t.prune_to_depth(k);
                    }
                }
            }
        }
        d.seconds = t0.elapsed().as_secs_f64();
        self.stats.draft_s += d.seconds;
        Ok(d)
    }

    /// Step 2, the pass: every decoding sequence's root and tree (a batch too
    /// wide for one pass drops the drafts that do not fit), then prompt
    /// chunks in joining order, at most `prefill_chunk` rows while anything
    /// decodes (the whole pass when nothing does).
    fn lay_out(&self, max_rows: usize, decoding: &[usize], trees: &mut [DraftTree]) -> Pass {
        let mut step = Step::default();
        let mut ids: Vec<u32> = Vec::new();
        let mut placed = Vec::new();
        for (j, &i) in decoding.iter().enumerate() {
            let s = &self.seqs[i];
            let committed = s.tokens.len() - 1;
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
                // No draft: the plain decoding step's causal pass (a batch
                // with no tree at all runs no tree-masked attention).
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
        let mut chunks = Vec::new();
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
        if !chunks.is_empty() {
            // Logits only where a choice is made: every decoding row and a
            // prompt's last row (the LM head skips the other prompt rows).
            let mut rows: Vec<u32> = (0..decode_rows as u32).collect();
            rows.extend(
                chunks
                    .iter()
                    .filter(|&&(i, _, n)| self.seqs[i].prefilled + n == self.seqs[i].prompt_len)
                    .map(|&(_, at, n)| (at + n - 1) as u32),
            );
            step.output_rows = Some(rows);
        }
        Pass {
            step,
            ids,
            placed,
            chunks,
            decode_rows,
        }
    }

    /// Step 3, the target's choice at every row that needs one (every decoding
    /// row; a prompt's last row), by row of the pass.
    fn choose<R: Runtime>(
        &mut self,
        target: &TargetModel<R>,
        logits: &draftc_ops::DeviceTensor<R>,
        pass: &Pass,
    ) -> Result<Vec<u32>, EngineError> {
        // (row, sampling, the position the row predicts)
        let mut rows: Vec<(u32, super::Sampling, u32)> = Vec::new();
        for (j, &(i, at, _)) in pass.placed.iter().enumerate() {
            let sampling = self.seqs[i].params.sampling;
            for (k, &pos) in pass.step.seqs[j].positions.iter().enumerate() {
                rows.push(((at + k) as u32, sampling, pos + 1));
            }
        }
        for &(i, at, n) in &pass.chunks {
            let s = &self.seqs[i];
            if s.prefilled + n == s.prompt_len {
                rows.push(((at + n - 1) as u32, s.params.sampling, s.prompt_len as u32));
            }
        }
        let mut by_row = vec![0u32; pass.ids.len()];
        if rows.is_empty() {
            return Ok(by_row);
        }
        // The logits hold the step's output rows only, in their order.
        let packed: Vec<u32> = rows.iter().map(|r| r.0).collect();
        if let Some(out_rows) = &pass.step.output_rows {
            // `lay_out` lists them ascending (decoding rows, then each
            // finished prompt's last row).
            for r in &mut rows {
                r.0 = out_rows.binary_search(&r.0).map_err(|_| {
                    EngineError::Invalid(format!("row {} has no logits in its pass", r.0))
                })? as u32;
            }
        }
        let choice = choose_rows(
            target.client(),
            logits,
            target.vocab,
            &rows,
            &mut self.selected,
        )?;
        for (r, c) in packed.iter().zip(&choice) {
            by_row[*r as usize] = *c;
        }
        Ok(by_row)
    }

    /// Step 4, the commit: accepts every decoding sequence's longest matching path and its
    /// bonus, finishes prompts, compacts the caches and lets the drafter
    /// observe what was committed. Per decoding sequence: (tree depth,
    /// accepted nodes).
    fn commit<R: Runtime>(
        &mut self,
        cx: &mut Parts<'_, R>,
        out: &crate::exec::Outputs<R>,
        pass: &Pass,
        drafts: &Drafts,
        by_row: &[u32],
        verify_s: f64,
    ) -> Result<(RoundOut, Vec<(usize, usize)>), EngineError> {
        let choice_of = |row: usize| -> u32 { by_row.get(row).copied().unwrap_or(0) };
        let mut gave = RoundOut::default();
        let mut paths = Vec::new();
        let mut committed_rows: Vec<Committed> = Vec::new();
        let mut per_seq = Vec::new();
        for (j, &(i, at, n)) in pass.placed.iter().enumerate() {
            let tree = &drafts.trees[j];
            let node_choice: Vec<u32> = (at + 1..at + n).map(choice_of).collect();
            let a = tree
                .longest_accepted_path(choice_of(at), &node_choice)
                .map_err(|e| EngineError::Invalid(e.to_string()))?;
            self.stats
                .record_tree(tree.levels(), a.nodes.len(), tree.len());
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
        for &(i, _, n) in &pass.chunks {
            let s = &self.seqs[i];
            if s.prefilled + n == s.prompt_len && self.prefix_slot.is_some() {
                let (slot, prompt) = (s.slot, s.tokens[..s.prompt_len].to_vec());
                self.store_prefix(cx.target, slot, &prompt)?;
            }
        }
        for &(i, at, n) in &pass.chunks {
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
        cx.target.caches.compact_all(&paths)?;
        if let Some(d) = cx.drafter.as_deref_mut() {
            if drafts.drafted {
                let draft_tokens = drafts.trees.iter().map(DraftTree::len).sum();
                d.verified(verify_s, draft_tokens, &per_seq);
            }
            // Finished sequences leave before the drafter sees them.
            let gone: Vec<usize> = gave.finished.iter().map(|&i| self.seqs[i].slot).collect();
            committed_rows.retain(|c| !gone.contains(&c.slot));
            if !committed_rows.is_empty() {
                d.observe(Observed {
                    client: cx.target.client(),
                    out,
                    committed: &committed_rows,
                })?;
            }
        }
        if !pass.placed.is_empty() && !drafts.drafted {
            self.stats.no_draft_rounds += 1;
        }
        Ok((gave, per_seq))
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
    /// Indices (into the batch's sequences) of those that ended.
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
