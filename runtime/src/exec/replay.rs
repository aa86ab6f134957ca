//! Replayed passes (issue 56, items 1–3): a pass the executor has run
//! twice with the same launches is reissued from a recording instead of
//! being launched op by op again.
//!
//! Which passes: those whose every step-dependent input reaches the device
//! in the pass's one upload (attention metadata, positions, cache slots;
//! `attention.rs`) or in an input the pass uploads itself from the host
//! (`Executor::run_uploading`: a verification pass's token ids), which is
//! every target decode or verification pass over the executor's own
//! caches, and the drafter passes over their own caches: SpecFormer's;
//! EAGLE's, whose `prev` rows go into buffers kept per row count and whose
//! level-by-level memory tail rides in the step upload; Beagle's, whose
//! memory rows are such inputs too, into its one memory cache, the step
//! upload holding their positions and slots. Not replayed: selected output
//! rows, tail bits on the device, the target's caches, memory rows given
//! on the host. A pass is keyed by what fixes its launches ([`PassKey`]):
//! rows per sequence and slot, tree or chain, the plane attention's key
//! splits, the caller's device inputs, the inputs it uploads, and the
//! cache halves. Each pass of a key that is not replayed runs eagerly
//! inside a capture window (`draftc_ops::replay::record`); once a
//! recording agrees launch for launch with an earlier one of its key
//! (kernels, grids, scalars, offsets; the same buffers, or other kept
//! buffers in the same pattern), it keeps the kept buffers it used for
//! itself (`Recording::pin`, right after its pass, so no other recording
//! shares them) and replays from then on.
//!
//! A replay does what the eager pass does on the host and nothing else:
//! writes the pass's own uploads, reserves the step's rows in every cache,
//! builds the step upload's bytes (`attention::step_upload_bytes`), writes
//! them into the recorded buffer and reissues the launches. A recording
//! whose outputs the caller still holds (last round's logits, hidden
//! states a drafter keeps) waits; a key keeps two recordings, each with its
//! own buffers, so one of them is free. Every buffer a recording binds
//! must be one of its kept buffers, the caller's inputs, the executor's
//! weights or RoPE tables, or the cache halves, which the key pins by
//! identity; otherwise it is not replayed. At most [`MAX_KEYS`] keys are
//! kept (the oldest unsettled one goes first), each pinning its
//! recordings' buffers.
//!
//! On CUDA a key's recording is captured as one CUDA graph when the key
//! settles (`Recording::capture_graph`), so a replay is one driver call; a
//! capture that fails is logged once and the key replays launch by launch.
//! `DRAFTC_GRAPHS=off` keeps every replay launch by launch.
//!
//! `DRAFTC_REPLAY=off` runs every pass eagerly; drafters' executors replay
//! when their inputs stay in buffers of their own, or with
//! `DRAFTC_REPLAY=all` ([`drafter_replay`]). Writes of a pass
//! other than its own uploads and its step upload are rewritten as
//! recorded, and a key settles only when both recordings wrote the same
//! bytes there (constant index lists, as SpecFormer's appends upload).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use cubecl::prelude::*;
use draftc_codegen::{AttentionLayout, BufferClass, Kernel, Plan};
use draftc_ops::attention::Mask;
use draftc_ops::kept::{self, KeptRef};
use draftc_ops::replay::Recording;
use draftc_ops::{DType, DeviceTensor};

use super::attention::{meta_key, step_upload_bytes};
use super::cache::CacheStore;
use super::executor::{ops_mask, ExecError, Outputs};
use super::step::Step;

/// The environment variable that turns replay off (`off`).
pub const ENV: &str = "DRAFTC_REPLAY";

/// Whether passes replay: on unless `DRAFTC_REPLAY=off`.
pub(super) fn enabled() -> bool {
    std::env::var(ENV).map_or(true, |v| v != "off")
}

/// Whether a drafter's executor replays its passes. Drafters that keep
/// their inputs in buffers of their own (`staged`: EAGLE's `prev` rows,
/// Beagle's memory rows) replay unless `DRAFTC_REPLAY=off`; the others
/// (SpecFormer, Medusa) only with `DRAFTC_REPLAY=all`: their passes replay
/// correctly, but their keys follow the verification pass's output
/// buffers, which alternate between its two recordings, and do not settle
/// across runs: each new recording takes buffers of its own, so a steady
/// state would keep allocating.
pub fn drafter_replay(staged: bool) -> bool {
    match std::env::var(ENV) {
        Ok(v) if v == "all" => true,
        Ok(v) if v == "off" => false,
        _ => staged,
    }
}

/// The environment variable that keeps replays launch by launch on CUDA
/// (`off`): no graph is captured.
pub const GRAPHS_ENV: &str = "DRAFTC_GRAPHS";

/// Whether a stable recording is captured as a device graph where the
/// runtime has them (CUDA): on unless `DRAFTC_GRAPHS=off`.
fn graphs_enabled() -> bool {
    std::env::var(GRAPHS_ENV).map_or(true, |v| v != "off")
}

/// Keys kept at most: each pins its recordings' buffers.
const MAX_KEYS: usize = 16;

/// Recordings kept per key, each with its own buffers: a caller still
/// holding one's outputs (last round's logits, hidden states a drafter
/// reads) leaves the other free to replay.
const ENTRIES_PER_KEY: usize = 2;

/// What fixes a replayable pass's launches.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) struct PassKey {
    /// (cache slot, rows) per sequence.
    seqs: Vec<(usize, usize)>,
    tree: bool,
    /// The memory tail's length per sequence over the executor's own cache
    /// (EAGLE drafting level by level; it fixes the mask words a row
    /// takes), `None` without one.
    tails: Option<Vec<usize>>,
    /// Key splits of each plane-layout attention (a grid size).
    splits: Vec<usize>,
    /// The caller's input buffers by name (memory ids).
    inputs: Vec<(String, usize)>,
    /// Inputs the pass uploads from the host itself (names; their buffers
    /// are the recording's writes).
    uploads: Vec<String>,
    /// New memory rows per stream and sequence (their rows are device
    /// inputs, in `inputs`).
    memory: Vec<(String, Vec<usize>)>,
    /// The cache halves' memory ids.
    halves: Vec<usize>,
}

impl PassKey {
    /// The key of a pass, or `None` when the pass is not replayable by
    /// construction (selected rows, memory-tail bits on the device, the
    /// target's caches, attention that is not over this store, memory rows
    /// not given as device inputs or beside another cache). A memory tail
    /// rides in the step upload (its bits with the tree bits).
    pub(super) fn of<R: Runtime>(
        facts: &PlanFacts,
        step: &Step,
        inputs: &BTreeMap<String, DeviceTensor<R>>,
        uploads: &[(&str, &[u32])],
        caches: &CacheStore<R>,
        with_target: bool,
    ) -> Option<(PassKey, Option<Mask>)> {
        let PlanFacts::Replayable { mask, chunks } = facts else {
            return None;
        };
        if with_target || step.output_rows.is_some() || inputs.contains_key(super::MEMORY_TAIL_BITS)
        {
            return None;
        }
        // Memory rows come as device inputs, into the pass's one cache (a
        // replay builds the step upload over it).
        if !step.memory.is_empty()
            && (step.memory.keys().any(|m| !inputs.contains_key(m))
                || caches.caches().len() != 1
                || caches
                    .caches()
                    .iter()
                    .any(|c| step.memory_rows_of(c).is_none()))
        {
            return None;
        }
        let first = caches.caches().into_iter().next();
        let max_keys = step
            .seqs
            .iter()
            .map(|s| first.as_ref().map_or(0, |c| caches.len(c, s.slot)) + s.positions.len())
            .max()
            .unwrap_or(0);
        Some((
            PassKey {
                seqs: step
                    .seqs
                    .iter()
                    .map(|s| (s.slot, s.positions.len()))
                    .collect(),
                tree: step.is_tree(),
                tails: step.seqs.iter().any(|s| s.memory_tail.is_some()).then(|| {
                    step.seqs
                        .iter()
                        .map(|s| s.memory_tail.as_ref().map_or(0, |t| t.len))
                        .collect()
                }),
                splits: chunks
                    .iter()
                    .map(|c| max_keys.div_ceil(*c).max(1))
                    .collect(),
                inputs: inputs
                    .iter()
                    .map(|(n, t)| (n.clone(), t.handle.memory_id()))
                    .collect(),
                uploads: uploads.iter().map(|(n, _)| n.to_string()).collect(),
                memory: step
                    .memory
                    .iter()
                    .map(|(n, m)| (n.clone(), m.lens.clone()))
                    .collect(),
                halves: caches.half_ids(),
            },
            *mask,
        ))
    }
}

/// What a plan says about replaying its passes, found once per plan
/// ([`Replays::facts`]): whether its attentions allow it (all over the
/// executor's own caches; the first one's mask builds the step upload) and
/// the key chunks of its plane-layout attentions.
pub(super) enum PlanFacts {
    Replayable {
        mask: Option<Mask>,
        chunks: Vec<usize>,
    },
    No,
}

impl PlanFacts {
    fn of(plan: &Plan) -> PlanFacts {
        let mut mask = None;
        let mut chunks = Vec::new();
        for l in &plan.launches {
            if let Kernel::Attention {
                mask: m, layout, ..
            } = l.kernel
            {
                let k = plan.buffer(l.inputs[1]);
                if k.class != BufferClass::State || k.name.starts_with("target.") {
                    return PlanFacts::No;
                }
                // The first attention's mask builds the step upload; other
                // masks (Gemma 3's global layers beside sliding ones) share
                // its device arrays (`AttnMeta::for_mask`), uploading nothing.
                mask.get_or_insert(m);
                if let AttentionLayout::Planes { chunk, .. } = layout {
                    chunks.push(chunk as usize);
                }
            }
        }
        PlanFacts::Replayable {
            mask: mask.map(ops_mask),
            chunks,
        }
    }
}

/// A graph output of a recorded pass: its kept buffer and view.
struct OutputView {
    name: String,
    buffer: KeptRef,
    used: u64,
    shape: Vec<usize>,
    dtype: DType,
}

/// One recording of a key.
struct Entry<R: Runtime> {
    rec: Recording<R>,
    /// A second recording of the key agreed with this one.
    stable: bool,
    outputs: Vec<OutputView>,
    mask: Option<Mask>,
}

/// The executor's recorded passes and what became of them.
pub(super) struct Replays<R: Runtime> {
    pub(super) on: bool,
    entries: HashMap<PassKey, Vec<Entry<R>>>,
    /// [`PlanFacts`] by plan rows.
    facts: HashMap<usize, PlanFacts>,
    /// Keys in the order they were first recorded (past [`MAX_KEYS`] the
    /// oldest unsettled one is dropped, [`Replays::forget_one`]).
    order: std::collections::VecDeque<PassKey>,
    /// Passes replayed, and recorded, so far.
    pub(super) replayed: u64,
    pub(super) recorded: u64,
    /// Why the last recorded pass cannot be replayed (`None`: it can).
    pub(super) refusal: Option<String>,
    /// Settled recordings that write into a buffer an earlier launch of
    /// their pass used (`Recording::reused_write`): no graph can hold them.
    pub(super) unfit_for_graphs: u64,
    /// Graphs captured, and why the last capture failed.
    pub(super) graphs: u64,
    pub(super) graph_refusal: Option<String>,
}

impl<R: Runtime> Replays<R> {
    pub(super) fn new() -> Self {
        Replays {
            on: enabled(),
            entries: HashMap::new(),
            facts: HashMap::new(),
            order: Default::default(),
            replayed: 0,
            recorded: 0,
            refusal: None,
            unfit_for_graphs: 0,
            graphs: 0,
            graph_refusal: None,
        }
    }

    /// Forgets every recording (the plans changed).
    pub(super) fn clear(&mut self) {
        self.entries.clear();
        self.facts.clear();
        self.order.clear();
    }

    /// The [`PlanFacts`] of the plan for `rows` rows (found once).
    pub(super) fn facts(&mut self, rows: usize, plan: &Plan) -> &PlanFacts {
        self.facts
            .entry(rows)
            .or_insert_with(|| PlanFacts::of(plan))
    }

    /// Replays the pass of `key` when a stable recording of it is free to
    /// run: `None` (nothing done) otherwise.
    pub(super) fn try_replay(
        &mut self,
        client: &ComputeClient<R>,
        key: &PassKey,
        step: &Step,
        uploads: &[(&str, &[u32])],
        caches: &mut CacheStore<R>,
        flush_each: bool,
    ) -> Option<Result<(Outputs<R>, usize), ExecError>> {
        let e = self
            .entries
            .get(key)?
            .iter()
            .find(|e| e.stable && e.rec.ready())?;
        let names = caches.caches();
        // Every cache takes the step's rows at the same place (what the
        // eager pass's one upload assumed), or this pass runs eagerly.
        let same = step.seqs.iter().all(|s| {
            let l = names.first().map_or(0, |c| caches.len(c, s.slot));
            names.iter().all(|c| caches.len(c, s.slot) == l)
        });
        let step_write = e.rec.step_write();
        if !same || step_write.is_some() == names.is_empty() || e.rec.writes().len() < uploads.len()
        {
            return None;
        }
        let out = (|| {
            let mut slots = Vec::new();
            for (i, c) in names.iter().enumerate() {
                for (s, positions) in step.seqs.iter().zip(appended_positions(step, c)) {
                    let rows = caches.reserve(c, s.slot, positions)?;
                    if i == 0 {
                        slots.extend(rows);
                    }
                }
            }
            // The pass's own uploads first (as the eager pass wrote them),
            // the step's where it wrote it, and the rest as recorded (the
            // same bytes in both recordings that settled the key).
            let mut data: Vec<Vec<u8>> = e.rec.write_data().to_vec();
            for (d, (_, ids)) in data.iter_mut().zip(uploads) {
                *d = draftc_ops::tensor::u32_bytes(ids);
            }
            if let (Some(i), Some(c), Some(mask)) = (step_write, names.first(), e.mask) {
                let key = meta_key(step, mask, caches, c)?;
                let positions = match step.memory_rows_of(c) {
                    Some(m) => std::borrow::Cow::Borrowed(&m.positions),
                    None => std::borrow::Cow::Owned(step.positions()),
                };
                data[i] = step_upload_bytes(&key, &positions, &slots)?;
            }
            e.rec
                .replay(client, data, flush_each)
                .map_err(|r| ExecError::Internal(format!("replay: {r}")))??;
            let mut tensors = BTreeMap::new();
            for o in &e.outputs {
                let h = kept::handle(&o.buffer).ok_or_else(|| {
                    ExecError::Internal("a replayed output's buffer left the pool".into())
                })?;
                let end = h.size_in_used() - o.used;
                let t = DeviceTensor::from_handle(h.offset_end(end), &o.shape, o.dtype)?;
                tensors.insert(o.name.clone(), t);
            }
            Ok((Outputs { tensors }, e.rec.launches()))
        })();
        self.replayed += 1;
        Some(out)
    }

    /// Keeps the recording of an eager pass of `key` when it can be
    /// replayed (see [`PassRecord`]).
    pub(super) fn keep(&mut self, client: &ComputeClient<R>, key: PassKey, pass: PassRecord<R>) {
        self.recorded += 1;
        let uploads = pass.uploads;
        let mut new = match entry(pass) {
            Err(why) => {
                self.refusal = Some(why);
                return;
            }
            Ok(new) => new,
        };
        self.refusal = None;
        if !self.entries.contains_key(&key) {
            if self.order.len() >= MAX_KEYS {
                self.forget_one();
            }
            self.order.push_back(key.clone());
        }
        let list = self.entries.entry(key).or_default();
        let matched = list.iter().position(|o| {
            o.rec.same_structure(&new.rec) && same_constants(&o.rec, &new.rec, uploads)
        });
        let mut settled = Vec::new();
        match matched {
            Some(i) => {
                // The key settles with this recording, whose buffers are
                // its own from now on. Pinned only now, just after its
                // pass: none of them can be another recording's (a pinned
                // buffer is handed to no one), and a key met once costs
                // no buffers. An earlier recording that was not pinned
                // may share buffers with others; it goes.
                new.stable = true;
                new.rec.pin();
                if !list[i].rec.pinned() {
                    list[i] = new;
                    settled.push(i);
                } else if list.len() < ENTRIES_PER_KEY {
                    list.push(new);
                    settled.push(list.len() - 1);
                }
            }
            None => {
                if list.len() >= ENTRIES_PER_KEY {
                    list.remove(0);
                }
                list.push(new);
            }
        }
        let unfit = settled
            .iter()
            .filter(|&&i| list[i].rec.reused_write().is_some())
            .count();
        self.unfit_for_graphs += unfit as u64;
        if graphs_enabled() {
            for i in settled {
                // One graph per recording, captured when its key settles.
                match list[i].rec.capture_graph(client) {
                    Ok(true) => self.graphs += 1,
                    Ok(false) => {}
                    Err(why) => {
                        if self.graph_refusal.is_none() {
                            eprintln!(
                                "draftc: a pass was not captured as a CUDA graph ({why}); \
                                 it replays launch by launch"
                            );
                        }
                        self.graph_refusal = Some(why);
                    }
                }
            }
        }
    }

    /// Forgets the oldest key that has not settled, or the oldest key when
    /// all have: keys met once (an EAGLE first pass's rows follow how many
    /// tokens each sequence accepted) must not push out the settled ones
    /// that repeat every round.
    fn forget_one(&mut self) {
        let settled = |k: &PassKey| {
            self.entries
                .get(k)
                .is_some_and(|l| l.iter().any(|e| e.stable))
        };
        let at = self.order.iter().position(|k| !settled(k)).unwrap_or(0);
        if let Some(old) = self.order.remove(at) {
            self.entries.remove(&old);
        }
    }
}

/// Whether two recordings wrote the same step-upload index and the same
/// bytes in every write a replay does not build (past the `uploads`
/// inputs, other than the step's): those a replay writes as recorded, so
/// they must not depend on the step.
fn same_constants<R: Runtime>(a: &Recording<R>, b: &Recording<R>, uploads: usize) -> bool {
    a.step_write() == b.step_write()
        && a.write_data().len() == b.write_data().len()
        && (uploads..a.write_data().len())
            .filter(|&i| Some(i) != a.step_write())
            .all(|i| a.write_data()[i] == b.write_data()[i])
}

/// An eager pass's recording with what it is judged by.
pub(super) struct PassRecord<'a, R: Runtime> {
    pub(super) rec: Recording<R>,
    pub(super) outputs: &'a Outputs<R>,
    pub(super) step: &'a Step,
    pub(super) caches: &'a CacheStore<R>,
    /// The caches' lengths per sequence before the pass.
    pub(super) lens_before: &'a BTreeMap<String, Vec<usize>>,
    /// Memory ids of the buffers the executor keeps (weights, RoPE
    /// tables) and of the caller's inputs.
    pub(super) owned: BTreeSet<usize>,
    /// The mask of the pass's attentions over its caches.
    pub(super) mask: Option<Mask>,
    /// Inputs the pass uploads itself (its first writes).
    pub(super) uploads: usize,
}

/// The entry of a recorded pass, or why it cannot be replayed.
fn entry<R: Runtime>(pass: PassRecord<R>) -> Result<Entry<R>, String> {
    let PassRecord {
        rec,
        outputs,
        step,
        caches,
        lens_before,
        mut owned,
        mask,
        uploads,
    } = pass;
    let names = caches.caches();
    for c in &names {
        let appended = step.seqs.iter().zip(appended_positions(step, c));
        for (i, (s, positions)) in appended.enumerate() {
            let before = lens_before.get(c).map_or(0, |l| l[i]);
            if caches.len(c, s.slot) != before + positions.len() {
                return Err(format!("cache `{c}` did not take exactly the step's rows"));
            }
        }
    }
    match rec.step_write() {
        Some(i) if names.is_empty() || i < uploads => {
            return Err("the step's upload is not where a replay builds it".into())
        }
        None if !names.is_empty() => {
            return Err("a pass over caches without its step upload".into())
        }
        _ => {}
    }
    if rec.writes().len() < uploads {
        return Err(format!(
            "{} uploads in a pass that uploads {uploads} inputs",
            rec.writes().len()
        ));
    }
    let kept_ids = rec.kept_ids();
    owned.extend(caches.half_ids());
    owned.extend(kept_ids.iter().copied());
    if let Some(id) = rec.buffer_ids().into_iter().find(|id| !owned.contains(id)) {
        return Err(format!(
            "a launch binds buffer {id}, which the pass does not own"
        ));
    }
    let mut views = Vec::new();
    for (name, t) in &outputs.tensors {
        let h = &t.handle;
        let buffer = rec
            .kept()
            .iter()
            .find(|r| kept::handle(r).is_some_and(|k| k.memory_id() == h.memory_id()))
            .ok_or_else(|| format!("output `{name}` is not in a kept buffer"))?;
        let whole = kept::handle(buffer).map_or(0, |k| k.size_in_used());
        let used = h.size_in_used();
        if h.offset_start.unwrap_or(0) != 0 || h.offset_end.unwrap_or(0) != whole - used {
            return Err(format!("output `{name}` is not a buffer's first bytes"));
        }
        views.push(OutputView {
            name: name.clone(),
            buffer: *buffer,
            used,
            shape: t.shape().to_vec(),
            dtype: t.dtype(),
        });
    }
    Ok(Entry {
        rec,
        stable: false,
        outputs: views,
        mask,
    })
}

/// The positions of the rows each sequence of `step` appends to `cache`,
/// in step order: its memory rows for a memory stream's cache, else its
/// step rows.
fn appended_positions<'a>(step: &'a Step, cache: &str) -> impl Iterator<Item = &'a [u32]> {
    let memory = step.memory_rows_of(cache);
    let mut at = 0;
    step.seqs
        .iter()
        .enumerate()
        .map(move |(i, s)| match memory {
            None => s.positions.as_slice(),
            Some(m) => {
                let n = m.lens.get(i).copied().unwrap_or(0);
                let from = at.min(m.positions.len());
                at = (from + n).min(m.positions.len());
                &m.positions[from..at]
            }
        })
}

/// The caches' lengths per sequence of `step` (before a pass).
pub(super) fn lens<R: Runtime>(
    caches: &CacheStore<R>,
    step: &Step,
) -> BTreeMap<String, Vec<usize>> {
    caches
        .caches()
        .into_iter()
        .map(|c| {
            let l = step.seqs.iter().map(|s| caches.len(&c, s.slot)).collect();
            (c, l)
        })
        .collect()
}
