//! The [`Executor`]: runs a codegen [`Plan`] on a CubeCL client. It keeps
//! one plan per row count (rows of all sequences packed, so a plan built
//! for `t = rows, batch = 1` serves any ragged batch — only attention sees
//! sequence boundaries, and it takes them from the [`Step`]), the weights
//! uploaded in the plan's dtype, and maps each [`Kernel`] to its
//! `draftc-ops` launch.
//!
//! Buffers: intermediates share the allocator slots `schedule` chose (one
//! device allocation per slot); outputs get their own. KV-cache rows:
//! projections that write "into the cache" (fused) or a `kv_append`
//! (unfused) produce this pass's new rows; RoPE applies to them; the
//! attention launch first appends them to the [`CacheStore`] at each
//! sequence's next rows, then attends over each sequence's cache range.
//! In a tree pass (the step has parents), causal attentions over a cache
//! use the tree mask instead.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use cubecl::prelude::*;
use draftc_codegen::bind::BindError;

use draftc_codegen::{BufferId, CodegenError, Kernel, Plan, PlanConfig, PlanDType, TargetWeights};
use draftc_codegen::{DeviceProfile, LinearLayout};
use draftc_ir::graph::{Graph, ValueId};
use draftc_ir::op::{Mask as IrMask, Op};
use draftc_ops::attention::{AttnMeta, Mask};

use draftc_ops::linear_plane::PlaneShape;
use draftc_ops::{DType, DeviceTensor, OpsError};

use super::arena::pass_buffer;
use super::bound::weight;
use super::cache::CacheStore;
use super::replay::{self, PassKey, PassRecord, Replays};
use super::step::Step;
use super::timing::{HostTime, Profile};
use super::weights::HostWeights;
use crate::device::FlushPolicy;
use draftc_ops::replay::Flushes;

/// Why a pass could not run.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    #[error(transparent)]
    Ops(#[from] OpsError),
    #[error(transparent)]
    Codegen(#[from] CodegenError),
    #[error("the weights do not fit the plan:\n{}", list(.0))]
    Bind(Vec<BindError>),
    #[error("input `{name}` missing: expected {expected}")]
    MissingInput { name: String, expected: String },
    #[error("input `{name}` has {found} elements, the plan expects shape {expected:?}")]
    InputShape {
        name: String,
        expected: Vec<i64>,
        found: usize,
    },
    #[error(
        "KV cache `{cache}` of sequence slot {slot} is full: {need} rows needed, capacity {capacity} \
         (raise the capacity, e.g. a smaller --max-tokens or fewer sequences)"
    )]
    CacheFull {
        cache: String,
        slot: usize,
        need: usize,
        capacity: usize,
    },
    #[error("unsupported: {0}")]
    Unsupported(String),
    #[error("internal error: {0}")]
    Internal(String),
}

fn list(errors: &[BindError]) -> String {
    errors
        .iter()
        .map(|e| format!("  {e}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Where the new rows of a pending cache write come from.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum RowSource {
    /// One row per step row (self-attention).
    Step,
    /// The new rows of a memory stream.
    Memory(String),
}

/// The values a pass produced, by name: graph outputs (`logits`), emitted
/// streams (`hidden[3]`), appended memory rows (`states`, `mem[0]`).
pub struct Outputs<R: Runtime> {
    pub tensors: BTreeMap<String, DeviceTensor<R>>,
}

impl<R: Runtime> Outputs<R> {
    pub fn get(&self, name: &str) -> Result<&DeviceTensor<R>, ExecError> {
        self.tensors
            .get(name)
            .ok_or_else(|| ExecError::Internal(format!("the pass produced no `{name}`")))
    }
}

/// Runs one graph's plans with bound weights.
pub struct Executor<R: Runtime> {
    client: ComputeClient<R>,
    graph: Graph,
    canonical: Graph,
    target: TargetWeights,
    dtype: PlanDType,
    fuse: bool,
    weights: BTreeMap<String, DeviceTensor<R>>,
    /// Plans by pass rows, shared with the pass that runs one (no copy).
    plans: HashMap<usize, Arc<Plan>>,
    /// The device the plans are lowered for (kernel layouts).
    device: DeviceProfile,
    /// Launches issued and the host time spent issuing them.
    host: HostTime,
    /// Per-launch wall times when profiling (`DRAFTC_PROFILE=1`).
    profile: Option<Profile>,
    /// When a pass flushes: the device's policy or `DRAFTC_FLUSH`.
    flush: FlushPolicy,
    /// RoPE frequencies by (head_dim, theta bits): per-model constants,
    /// uploaded once.
    rope_freqs: HashMap<(usize, u64), DeviceTensor<R>>,
    /// Recorded passes, replayed once stable (`replay.rs`).
    replays: Replays<R>,
}

/// The RoPE frequencies of the graph's attentions with `rope_scaling`
/// (Llama 3), by (head_dim, theta bits): placed in the executor's frequency
/// cache up front, so every RoPE launch of that shape reads the scaled ones.
/// Two attentions of one shape, one scaled and one not, are an error (their
/// kernels would share one table).
fn scaled_rope_freqs<R: Runtime>(
    client: &ComputeClient<R>,
    graph: &Graph,
) -> Result<HashMap<(usize, u64), DeviceTensor<R>>, ExecError> {
    let mut seen: HashMap<(usize, u64), Option<draftc_ir::op::RopeScaling>> = HashMap::new();
    for id in graph.ids() {
        if let Op::Attention(a) = &graph.node(id).op {
            if let Some(theta) = a.rope {
                let key = (a.head_dim as usize, theta.get().to_bits());
                let scaling = a.rope_scaling.as_deref().copied();
                if *seen.entry(key).or_insert(scaling) != scaling {
                    return Err(ExecError::Internal(format!(
                        "attentions with head_dim {} and RoPE θ {} differ in rope_scaling",
                        key.0,
                        theta.get()
                    )));
                }
            }
        }
    }
    let mut out = HashMap::new();
    for ((hd, bits), s) in seen {
        if let Some(s) = s {
            let f = rope_inv_freq(hd, f64::from_bits(bits), Some(&s));
            out.insert((hd, bits), draftc_ops::rope::upload_freqs(client, &f)?);
        }
    }
    Ok(out)
}

/// The RoPE frequencies of one attention (`[head_dim / 2]`): HF's
/// `inv_freq` for base `theta`, scaled as Llama 3's when `scaling` is given.
/// The executor's tables and the interpreter both come from here.
pub(super) fn rope_inv_freq(
    head_dim: usize,
    theta: f64,
    scaling: Option<&draftc_ir::op::RopeScaling>,
) -> Vec<f32> {
    use draftc_ops::rope::reference::{inv_freq, inv_freq_llama3};
    match scaling {
        Some(s) => inv_freq_llama3(
            head_dim,
            theta as f32,
            s.factor.get() as f32,
            s.low_freq_factor.get() as f32,
            s.high_freq_factor.get() as f32,
            s.original_context as f32,
        ),
        None => inv_freq(head_dim, theta as f32),
    }
}

/// `inputs` with each of `uploads` uploaded (`DeviceTensor::upload_u32`,
/// a kept buffer written in place) under its name.
fn with_uploads<R: Runtime>(
    client: &ComputeClient<R>,
    uploads: &[(&str, &[u32])],
    inputs: &BTreeMap<String, DeviceTensor<R>>,
) -> Result<BTreeMap<String, DeviceTensor<R>>, ExecError> {
    let mut all = inputs.clone();
    for (name, data) in uploads {
        let t = DeviceTensor::upload_u32(client, data, &[data.len()])?;
        all.insert(name.to_string(), t);
    }
    Ok(all)
}

/// The ops dtype of a plan dtype.
pub fn ops_dtype(d: PlanDType) -> DType {
    match d {
        PlanDType::F32 => DType::F32,
        PlanDType::F16 => DType::F16,
    }
}

/// How `ops` launches a linear of a given layout (`ops::linear::linear_in`).
pub type LinearLaunch = draftc_ops::linear::Layout;

/// The `ops` launch of `layout`.
pub fn linear_launch(layout: LinearLayout) -> LinearLaunch {
    match layout {
        LinearLayout::Lanes { cols } => LinearLaunch::Lanes {
            cols: cols as usize,
        },
        LinearLayout::Planes {
            plane,
            planes,
            ksplit,
            cols,
        } => LinearLaunch::Planes(PlaneShape {
            plane,
            planes,
            ksplit,
            cols,
        }),
    }
}

/// The ops mask of an IR mask (same predicates, u32 parameters).
pub(crate) fn ops_mask(m: IrMask) -> Mask {
    match m {
        IrMask::Causal => Mask::Causal,
        IrMask::Full => Mask::Full,
        IrMask::CrossDiagonal => Mask::CrossDiagonal,
        IrMask::InverseBlock { window, offset } => Mask::InverseBlock {
            window: window as u32,
            offset: offset as u32,
        },
        IrMask::SlidingWindow { window, sink } => Mask::SlidingSink {
            window: window as u32,
            sink: sink as u32,
        },
        IrMask::Tree => Mask::Tree,
    }
}

pub(super) fn us(shape: &[i64]) -> Vec<usize> {
    shape.iter().map(|&d| d.max(0) as usize).collect()
}

impl<R: Runtime> Executor<R> {
    /// Checks `weights` against the plan's weight table (every problem named
    /// before anything launches) and uploads the needed tensors as `dtype`.
    pub fn new(
        client: &ComputeClient<R>,
        graph: &Graph,
        target: &TargetWeights,
        weights: &HostWeights,
        dtype: PlanDType,
        fuse: bool,
    ) -> Result<Self, ExecError> {
        let device = crate::device::profile(client);
        let cfg = PlanConfig {
            tokens: 1,
            batch: 1,
            context: 0,
            dtype,
            fuse,
            device: device.clone(),
        };
        let trace = draftc_codegen::trace(graph, target, &cfg)?;
        let table = draftc_codegen::pipeline::weights(&trace.plan).map_err(ExecError::Bind)?;
        weights.check(&table).map_err(ExecError::Bind)?;
        let dev = super::bound::upload(client, &trace.plan, &table, weights, ops_dtype(dtype))?;
        let mut plans = HashMap::new();
        plans.insert(1, Arc::new(trace.plan));
        let rope_freqs = scaled_rope_freqs(client, graph)?;
        Ok(Executor {
            client: client.clone(),
            graph: graph.clone(),
            canonical: trace.canonical,
            target: target.clone(),
            dtype,
            fuse,
            weights: dev,
            plans,
            flush: FlushPolicy::for_device(&device),
            rope_freqs,
            replays: Replays::new(),
            device,
            host: HostTime::default(),
            profile: std::env::var_os("DRAFTC_PROFILE")
                .is_some_and(|v| v == "1")
                .then(Profile::default),
        })
    }

    pub fn client(&self) -> &ComputeClient<R> {
        &self.client
    }

    /// Launches issued so far and the host time they took.
    pub fn host_time(&self) -> HostTime {
        self.host
    }

    /// The device profile the plans are lowered for.
    pub fn device(&self) -> &DeviceProfile {
        &self.device
    }

    /// Lowers later passes for `device` (plans are rebuilt; weights are
    /// layout-independent): e.g. [`crate::device::gpu_layout_profile`] runs
    /// the GPU kernel layouts on lavapipe.
    pub fn set_device(&mut self, device: DeviceProfile) {
        if device != self.device {
            self.flush = FlushPolicy::for_device(&device);
            self.device = device;
            self.plans.clear();
            self.replays.clear();
        }
    }

    /// When this executor's passes flush (the device profile's policy,
    /// unless `DRAFTC_FLUSH` overrides it).
    pub fn flush_policy(&self) -> FlushPolicy {
        self.flush
    }

    /// A weight this executor bound, by binder name (`model.norm.weight`).
    pub fn weight(&self, name: &str) -> Option<&DeviceTensor<R>> {
        self.weights.get(name)
    }

    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    pub fn dtype(&self) -> DType {
        ops_dtype(self.dtype)
    }

    /// Bytes of weights on the device.
    pub fn weight_bytes(&self) -> usize {
        self.weights
            .values()
            .map(|t| t.numel() * t.dtype().size())
            .sum()
    }

    /// Turns per-launch profiling on (device synchronised after every launch).
    pub fn set_profiling(&mut self, on: bool) {
        self.profile = on.then(Profile::default);
    }

    /// What profiling measured so far.
    pub fn profile(&self) -> Option<&Profile> {
        self.profile.as_ref()
    }

    /// The plan for a pass of `rows` packed rows (built once, then cached).
    pub fn plan(&mut self, rows: usize) -> Result<&Plan, ExecError> {
        if !self.plans.contains_key(&rows) {
            let cfg = PlanConfig {
                tokens: rows as i64,
                batch: 1,
                context: 0,
                dtype: self.dtype,
                fuse: self.fuse,
                device: self.device.clone(),
            };
            let plan = draftc_codegen::trace(&self.graph, &self.target, &cfg)?.plan;
            self.plans.insert(rows, Arc::new(plan));
        }
        Ok(&self.plans[&rows])
    }

    /// Runs one pass. `inputs` are the graph's input values by name (ids as
    /// u32, taps as floats in the executor's dtype); `caches` holds this
    /// graph's own caches, `target_caches` the target's (for `target.kv[i]`).
    pub fn run(
        &mut self,
        step: &Step,
        inputs: &BTreeMap<String, DeviceTensor<R>>,
        caches: &mut CacheStore<R>,
        target_caches: Option<&mut CacheStore<R>>,
    ) -> Result<Outputs<R>, ExecError> {
        self.run_uploading(step, &[], inputs, caches, target_caches)
    }

    /// [`Executor::run`] with u32 inputs given on the host (`uploads`, by
    /// name: a verification pass's token ids), uploaded by the pass itself:
    /// a replayed pass writes them into the buffers it recorded.
    pub fn run_uploading(
        &mut self,
        step: &Step,
        uploads: &[(&str, &[u32])],
        inputs: &BTreeMap<String, DeviceTensor<R>>,
        caches: &mut CacheStore<R>,
        target_caches: Option<&mut CacheStore<R>>,
    ) -> Result<Outputs<R>, ExecError> {
        let rows = step.rows();
        if rows == 0 {
            return Err(ExecError::Unsupported("a pass with no rows".into()));
        }
        self.plan(rows)?;
        self.host.passes += 1;
        // A pass over memory rows uploads its own rows' positions (its
        // queries' RoPE) with its inputs: the step upload holds the memory
        // rows' positions, and a replay writes both anew.
        let positions;
        let mut with_positions;
        let uploads = if step.memory.is_empty() {
            uploads
        } else {
            positions = step.positions();
            with_positions = uploads.to_vec();
            with_positions.push((super::STEP_POSITIONS, &positions));
            &with_positions
        };
        let plan = Arc::clone(&self.plans[&rows]);
        let key = if self.replays.on && self.profile.is_none() {
            let facts = self.replays.facts(rows, &plan);
            PassKey::of(
                facts,
                step,
                inputs,
                uploads,
                caches,
                target_caches.is_some(),
            )
        } else {
            None
        };
        let Some((key, mask)) = key else {
            let inputs = with_uploads(&self.client, uploads, inputs)?;
            return self.run_eager(&plan, step, &inputs, caches, target_caches, true);
        };
        let t = std::time::Instant::now();
        let flush_each = self.flush == FlushPolicy::PerLaunch;
        if let Some(r) =
            self.replays
                .try_replay(&self.client, &key, step, uploads, caches, flush_each)
        {
            let (out, launches) = r?;
            self.host.launches += launches as u64;
            self.host.issue_s += t.elapsed().as_secs_f64();
            return Ok(out);
        }
        let before = replay::lens(caches, step);
        let client = self.client.clone();
        // As the eager pass flushes: once at its end under the per-pass
        // policy (after the window), after each launch under per-launch.
        let per_pass = self.flush == FlushPolicy::PerPass;
        let window = if per_pass {
            Flushes::Forbid
        } else {
            Flushes::Allow
        };
        let mut all = BTreeMap::new();
        let (out, rec) = draftc_ops::replay::record(&client, window, || {
            all = with_uploads(&client, uploads, inputs)?;
            self.run_eager(&plan, step, &all, caches, None, !per_pass)
        });
        let out = out?;
        if per_pass {
            draftc_ops::launch::flush(&client, "pass").map_err(|e| {
                ExecError::Internal(format!("a recorded pass failed on the device: {e}"))
            })?;
        }
        match rec {
            Ok(rec) => {
                let owned = self
                    .weights
                    .values()
                    .chain(self.rope_freqs.values())
                    .chain(inputs.values())
                    .map(|t| t.handle.memory_id())
                    .collect();
                let pass = PassRecord {
                    rec,
                    outputs: &out,
                    step,
                    caches,
                    lens_before: &before,
                    owned,
                    mask,
                    uploads: uploads.len(),
                };
                self.replays.keep(&client, key, pass);
            }
            Err(e) => self.replays.refusal = Some(e.to_string()),
        }
        Ok(out)
    }

    /// Passes replayed and recorded so far, and why the last recorded pass
    /// cannot be replayed (`None`: it can).
    pub fn replay_stats(&self) -> (u64, u64, Option<&str>) {
        (
            self.replays.replayed,
            self.replays.recorded,
            self.replays.refusal.as_deref(),
        )
    }

    /// Device graphs captured so far (CUDA), and why the last capture
    /// failed.
    pub fn graph_stats(&self) -> (u64, Option<&str>) {
        (self.replays.graphs, self.replays.graph_refusal.as_deref())
    }

    /// Settled recordings that write into a buffer an earlier launch of
    /// their pass used: they replay with their writes between the
    /// launches, and no CUDA graph can hold them.
    pub fn graph_unfit(&self) -> u64 {
        self.replays.unfit_for_graphs
    }

    /// Whether this executor replays its passes.
    pub fn replay_on(&self) -> bool {
        self.replays.on
    }

    /// Turns replay on or off for this executor (on unless
    /// `DRAFTC_REPLAY=off`); off forgets every recording.
    pub fn set_replay(&mut self, on: bool) {
        self.replays.on = on;
        if !on {
            self.replays.clear();
        }
    }

    /// One pass launched op by op. `flush`: flush at its end under the
    /// per-pass policy (a recorded pass is flushed by its window instead).
    fn run_eager(
        &mut self,
        plan: &Arc<Plan>,
        step: &Step,
        inputs: &BTreeMap<String, DeviceTensor<R>>,
        caches: &mut CacheStore<R>,
        mut target_caches: Option<&mut CacheStore<R>>,
        flush: bool,
    ) -> Result<Outputs<R>, ExecError> {
        let rows = step.rows();
        let plan = Arc::clone(plan);
        let mut run = Run {
            client: &self.client,
            plan: &plan,
            graph: &self.canonical,
            step,
            dtype: ops_dtype(self.dtype),
            weights: &self.weights,
            bufs: vec![None; plan.buffers.len()],
            slot_handles: Vec::new(),
            pending: BTreeMap::new(),
            memory: BTreeMap::new(),
            attn_metas: Vec::new(),
            rope_freqs: &mut self.rope_freqs,
            positions: Vec::new(),
            row_indices: Vec::new(),
            rope_pending: BTreeMap::new(),
            reserved_ahead: None,
            tail_bits: None,
            output_bufs: Vec::new(),
            selected: Vec::new(),
        };
        run.select_outputs()?;
        run.slot_handles = plan
            .slots
            .iter()
            .map(|&b| pass_buffer(&self.client, rows, b.max(16) as usize))
            .collect();
        let pass_start = std::time::Instant::now();
        let deferred = self.flush.defer();
        run.bind_inputs(inputs)?;
        for launch in &plan.launches {
            let t = std::time::Instant::now();
            run.launch(launch, caches, target_caches.as_deref_mut())
                .map_err(|e| match e {
                    ExecError::Ops(o) => ExecError::Internal(format!(
                        "launch #{} ({}): {o}",
                        launch.id.0,
                        launch.kernel.family()
                    )),
                    e => e,
                })?;
            self.host.launches += 1;
            self.host.issue_s += t.elapsed().as_secs_f64();
            if let Some(p) = &mut self.profile {
                cubecl::future::block_on(self.client.sync())
                    .map_err(|e| ExecError::Internal(format!("device sync: {e:?}")))?;
                let shape = match launch.kernel {
                    draftc_codegen::kernel::Kernel::Linear { k, n, .. } => format!(" {k}->{n}"),
                    _ => String::new(),
                };
                p.add(
                    &format!("{}{shape} ({rows} rows)", launch.kernel.family()),
                    t.elapsed().as_secs_f64(),
                );
            }
        }
        if deferred.is_some() && flush {
            drop(deferred);
            draftc_ops::launch::flush(&self.client, "pass").map_err(|e| {
                ExecError::Internal(format!(
                    "a pass of {} launches failed on the device: {e} \
                     ({}=launch flushes after every launch and names the op)",
                    plan.launches.len(),
                    FlushPolicy::ENV
                ))
            })?;
        }
        let out = run.outputs();
        if let Some(p) = &mut self.profile {
            p.passes += 1;
            p.total_s += pass_start.elapsed().as_secs_f64();
        }
        out
    }
}

/// State of one pass.
pub(super) struct Run<'a, R: Runtime> {
    pub(super) client: &'a ComputeClient<R>,
    pub(super) plan: &'a Plan,
    pub(super) graph: &'a Graph,
    pub(super) step: &'a Step,
    pub(super) dtype: DType,
    pub(super) weights: &'a BTreeMap<String, DeviceTensor<R>>,
    pub(super) bufs: Vec<Option<DeviceTensor<R>>>,
    pub(super) slot_handles: Vec<cubecl::server::Handle>,
    /// New cache rows not yet appended, by cache half buffer.
    pub(super) pending: BTreeMap<BufferId, (DeviceTensor<R>, RowSource)>,
    /// Uploaded memory rows by stream name.
    pub(super) memory: BTreeMap<String, DeviceTensor<R>>,
    /// Attention metadata already uploaded in this pass.
    pub(super) attn_metas: Vec<(super::attention::MetaKey, AttnMeta<R>)>,
    /// The executor's RoPE frequencies by (head_dim, theta bits).
    pub(super) rope_freqs: &'a mut HashMap<(usize, u64), DeviceTensor<R>>,
    /// Position ids already uploaded in this pass, by row source (every
    /// RoPE of a pass rotates the same rows' positions).
    pub(super) positions: Vec<(RowSource, DeviceTensor<R>)>,
    /// Row-index lists already uploaded in this pass (KV appends).
    pub(super) row_indices: Vec<draftc_ops::kv::RowIndex<R>>,
    /// Pending cache rows whose RoPE runs fused with their append: (kv
    /// heads, head_dim, theta bits) by cache half buffer.
    pub(super) rope_pending: BTreeMap<BufferId, (usize, usize, u64)>,
    /// The step's rows of a cache, reserved before its append was due
    /// (`Run::step_upload_ahead`): the append takes them.
    pub(super) reserved_ahead: Option<(String, Vec<u32>)>,
    /// The memory tail's bits on the device, when the caller computed them
    /// there (the input [`super::MEMORY_TAIL_BITS`]); they replace the
    /// host bits of the step's `MemoryTail`.
    pub(super) tail_bits: Option<DeviceTensor<R>>,
    /// The buffers of the graph's outputs when the step selects output rows
    /// (`Step::output_rows`), and those already computed on those rows.
    pub(super) output_bufs: Vec<BufferId>,
    pub(super) selected: Vec<BufferId>,
}

impl<R: Runtime> Run<'_, R> {
    fn launch(
        &mut self,
        launch: &draftc_codegen::Launch,
        caches: &mut CacheStore<R>,
        target: Option<&mut CacheStore<R>>,
    ) -> Result<(), ExecError> {
        let c = self.client;
        match launch.kernel {
            Kernel::Linear { .. } => self.linear(launch, caches, target)?,
            Kernel::RmsNorm { d, eps, .. } => {
                let d = d as usize;
                let x = self.tensor(launch.inputs[0])?;
                let rows = x.numel() / d;
                let x = x.reshape(&[rows, d])?;
                let out = self.tensor(launch.outputs[0])?.reshape(&[rows, d])?;
                let w = weight(self.weights, launch, 0)?;
                draftc_ops::rms_norm::rms_norm(c, &x, w, eps.get() as f32, &out)?;
            }
            Kernel::GroupRmsNorm {
                rows,
                groups,
                d,
                eps,
            } => {
                let shape = [rows as usize, groups as usize, d as usize];
                let x = self.tensor(launch.inputs[0])?.reshape(&shape)?;
                let out = self.tensor(launch.outputs[0])?.reshape(&shape)?;
                let w = weight(self.weights, launch, 0)?;
                draftc_ops::group_rms_norm::group_rms_norm(c, &x, w, eps.get() as f32, &out)?;
            }
            // A rotation before the pass's first append reads the step's
            // positions: the step upload goes first (`step_upload_ahead`).
            Kernel::Rope { .. } => {
                self.step_upload_ahead(caches, target)?;
                self.rope(launch)?
            }
            Kernel::HeadNorm { .. } => {
                self.step_upload_ahead(caches, target)?;
                self.head_norm(launch)?
            }
            Kernel::RopeQkvAppend {
                heads,
                head_dim,
                theta,
                ..
            } => {
                let (h, hd) = (heads as usize, head_dim as usize);
                self.rope_qkv_append(launch, h, hd, theta.get().to_bits(), caches, target)?;
            }
            Kernel::KvAppend { .. } => self.kv_append(launch)?,
            Kernel::Attention {
                heads,
                kv_heads,
                head_dim,
                mask,
                layout,
                ..
            } => self.attention(
                launch, heads, kv_heads, head_dim, mask, layout, caches, target,
            )?,
            Kernel::DraftDimAttention { .. } => self.draft_dim_attention(launch)?,
            Kernel::Embedding { .. } => self.embedding(launch)?,
            Kernel::Elementwise { .. } => self.elementwise(launch)?,
            Kernel::LayerSum { .. } => self.layer_sum(launch)?,
            Kernel::StridedCopy { .. } => self.strided_copy(launch)?,
        }
        Ok(())
    }

    /// Evaluated shape of graph value `v` in this plan.
    fn value_shape(&self, v: ValueId) -> Result<Vec<i64>, ExecError> {
        let vals: BTreeMap<String, i64> = self.plan.symbols.iter().cloned().collect();
        self.graph
            .node(v)
            .ty
            .dims
            .iter()
            .map(|d| {
                d.eval(&vals)
                    .ok_or_else(|| ExecError::Internal(format!("dim `{d}` has no value")))
            })
            .collect()
    }

    /// The smaller operand `b` of element-wise `launch` expanded to the
    /// output's shape (numpy broadcasting on the graph values' shapes).
    pub(super) fn broadcast(
        &mut self,
        launch: &draftc_codegen::Launch,
        b: &DeviceTensor<R>,
    ) -> Result<DeviceTensor<R>, ExecError> {
        let node = launch.nodes[0];
        let operands = self.graph.node(node).inputs.clone();
        let mut shapes = Vec::new();
        for v in operands {
            shapes.push(self.value_shape(v)?);
        }
        let small = shapes
            .iter()
            .min_by_key(|s| s.iter().product::<i64>())
            .cloned()
            .unwrap_or_default();
        let big = self.value_shape(node)?;
        let (width, rows) = broadcast_rows(&big, &small)?;
        let total: usize = us(&big).iter().product();
        let t = DeviceTensor::empty(self.client, &[total / width, width], self.dtype);
        let dst: Vec<u32> = (0..rows.len() as u32).collect();
        let b2 = b.reshape(&[b.numel() / width, width])?;
        draftc_ops::kv::gather_rows(self.client, &b2, &rows, &t, &dst)?;
        Ok(t.reshape(&[total])?)
    }

    /// Graph outputs, emitted streams and appended rows by name.
    fn outputs(mut self) -> Result<Outputs<R>, ExecError> {
        let g = self.graph;
        let mut named: Vec<(String, ValueId, bool)> = g
            .outputs
            .iter()
            .map(|&v| (g.node(v).name.clone(), v, true))
            .collect();
        named.extend(
            g.emits
                .iter()
                .map(|(s, i, v)| (format!("{s}[{i}]"), *v, false)),
        );
        named.extend(g.appends.iter().map(|(s, v)| (s.to_string(), *v, false)));
        let mut tensors = BTreeMap::new();
        for (name, v, output) in named {
            let b = self.value_buffer(v)?;
            let mut t = self.tensor(b)?;
            if let (true, Some(rows)) = (output, &self.step.output_rows) {
                if !self.selected.contains(&b) {
                    t = self.pick_rows(&t, rows)?;
                }
            }
            tensors.insert(name, t);
        }
        Ok(Outputs { tensors })
    }

    /// Checks the step's output rows and finds the buffers they select.
    fn select_outputs(&mut self) -> Result<(), ExecError> {
        let Some(rows) = &self.step.output_rows else {
            return Ok(());
        };
        let n = self.step.rows();
        if let Some(bad) = rows.iter().find(|&&r| r as usize >= n) {
            return Err(ExecError::Unsupported(format!(
                "output row {bad} of a pass of {n} rows"
            )));
        }
        let g = self.graph;
        self.output_bufs = g
            .outputs
            .iter()
            .map(|&v| self.value_buffer(v))
            .collect::<Result<_, _>>()?;
        Ok(())
    }

    /// Rows `rows` of a graph output computed on every row of the pass.
    fn pick_rows(&self, t: &DeviceTensor<R>, rows: &[u32]) -> Result<DeviceTensor<R>, ExecError> {
        let n = self.step.rows();
        let width = t.numel() / n.max(1);
        let mut shape = t.shape().to_vec();
        if shape.first() != Some(&n) || width * n != t.numel() {
            return Err(ExecError::Unsupported(format!(
                "output rows of an output of shape {shape:?} (a pass of {n} rows)"
            )));
        }
        shape[0] = rows.len();
        let out = DeviceTensor::empty(self.client, &shape, t.dtype());
        if !rows.is_empty() {
            let dst: Vec<u32> = (0..rows.len() as u32).collect();
            let flat = out.reshape(&[rows.len(), width])?;
            draftc_ops::kv::gather_rows(self.client, &t.reshape(&[n, width])?, rows, &flat, &dst)?;
        }
        Ok(out)
    }

    /// The buffer holding value `v` (through views).
    fn value_buffer(&self, mut v: ValueId) -> Result<BufferId, ExecError> {
        loop {
            if let Some(b) = self.plan.buffers.iter().find(|b| b.value == Some(v)) {
                return Ok(b.id);
            }
            let node = self.graph.node(v);
            match node.op {
                Op::Reshape { .. } if !node.inputs.is_empty() => v = node.inputs[0],
                _ => {
                    return Err(ExecError::Internal(format!(
                        "no buffer holds `{}`",
                        node.name
                    )))
                }
            }
        }
    }
}

pub(super) fn gcd(a: i64, b: i64) -> i64 {
    if b == 0 {
        a.abs()
    } else {
        gcd(b, a % b)
    }
}

/// Numpy broadcasting of `small` to `big` at row granularity: the width of
/// the trailing dims the two share, and for every row of `big` the row of
/// `small` it reads.
pub(crate) fn broadcast_rows(big: &[i64], small: &[i64]) -> Result<(usize, Vec<u32>), ExecError> {
    let big = us(big);
    let mut small = us(small);
    if small.len() > big.len() {
        return Err(ExecError::Internal(format!(
            "cannot broadcast {small:?} to {big:?}"
        )));
    }
    while small.len() < big.len() {
        small.insert(0, 1);
    }
    let mut split = big.len();
    while split > 0 && small[split - 1] == big[split - 1] {
        split -= 1;
    }
    let width: usize = big[split..].iter().product();
    let outer = &big[..split];
    let mut rows = Vec::with_capacity(outer.iter().product());
    let n: usize = outer.iter().product();
    for i in 0..n {
        let mut rem = i;
        let mut idx = 0usize;
        let mut stride = 1usize;
        for d in (0..split).rev() {
            let c = rem % big[d];
            rem /= big[d];
            if small[d] != 1 && small[d] != big[d] {
                return Err(ExecError::Internal(format!(
                    "cannot broadcast {small:?} to {big:?}"
                )));
            }
            if small[d] != 1 {
                idx += c * stride;
            }
            stride *= small[d];
        }
        rows.push(idx as u32);
    }
    Ok((width.max(1), rows))
}
