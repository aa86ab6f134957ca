//! The plan ("plan" layer): ordered kernel launches for one concrete
//! configuration (tokens, batch, draft length, dtype), each with the graph
//! nodes it implements, its kernel and sizes, its buffers and weights, and
//! its FLOPs and bytes moved; the buffer table with the allocator's slots;
//! totals, and beside them the unfused plan's totals. `Display` prints the
//! readable table that `draftc plan` shows and `snapshots/plans/` keeps.
//!
//! **Invariant:** a plan is deterministic — everything is in vectors in
//! launch / definition order, nothing comes from hash-map iteration.

use std::fmt;

use draftc_ir::ValueId;

use crate::device::DeviceProfile;
use crate::fuse::FusedGroup;
use crate::kernel::{Cost, Kernel};

/// The compute dtype `float` values get in this plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PlanDType {
    F32,
    F16,
}

impl PlanDType {
    pub fn size(self) -> i64 {
        match self {
            PlanDType::F32 => 4,
            PlanDType::F16 => 2,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            PlanDType::F32 => "f32",
            PlanDType::F16 => "f16",
        }
    }
    pub fn parse(s: &str) -> Option<PlanDType> {
        match s {
            "f32" => Some(PlanDType::F32),
            "f16" => Some(PlanDType::F16),
            _ => None,
        }
    }
}

/// The concrete configuration a plan is built for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlanConfig {
    /// `t`: tokens per sequence in this pass.
    pub tokens: i64,
    /// Sequences in the batch (rows of all sequences are packed).
    pub batch: i64,
    /// Tokens already in the KV caches / memory streams.
    pub context: i64,
    pub dtype: PlanDType,
    /// Apply `fuse` (false: every op lowered on its own, `--no-fuse`).
    pub fuse: bool,
    /// The device whose kernel variants the plan picks.
    pub device: DeviceProfile,
}

impl Default for PlanConfig {
    fn default() -> PlanConfig {
        PlanConfig {
            tokens: 16,
            batch: 1,
            context: 0,
            dtype: PlanDType::F32,
            fuse: true,
            device: DeviceProfile::default(),
        }
    }
}

/// Index of a launch in `Plan::launches`; `Display` is `#N`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LaunchId(pub u32);

/// Index of a buffer in `Plan::buffers`; `Display` is `bN`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BufferId(pub u32);

impl BufferId {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for LaunchId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{}", self.0)
    }
}

impl fmt::Display for BufferId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "b{}", self.0)
    }
}

/// Who owns a buffer's memory.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum BufferClass {
    /// Supplied by the runtime: token ids, hidden-state taps, memory rows.
    Input,
    /// Read after the plan ran: outputs, emitted streams, appended rows.
    Output,
    /// Per-sequence state kept across steps (KV caches).
    State,
    /// Intermediate; placed in a reusable slot by `schedule`.
    Temp,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Buffer {
    pub id: BufferId,
    /// Graph value name, or a descriptive name for launch temporaries (`x.q`).
    pub name: String,
    /// The graph value it holds, if any.
    pub value: Option<ValueId>,
    pub shape: Vec<i64>,
    /// Bytes per element.
    pub elem: i64,
    pub class: BufferClass,
    /// Allocator slot (Temp only), set by `schedule`.
    pub slot: Option<u32>,
}

impl Buffer {
    pub fn bytes(&self) -> i64 {
        self.shape.iter().product::<i64>() * self.elem
    }
}

/// One weight tensor a launch reads.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct WeightRef {
    /// safetensors tensor name.
    pub name: String,
    pub shape: Vec<i64>,
    pub dtype: PlanDType,
    /// Bound as `1 + w` (the scale of a Gemma RMS norm, `unit_offset`):
    /// the executor uploads that tensor under [`WeightRef::device_name`].
    pub plus_one: bool,
}

impl WeightRef {
    /// The weight as a norm of kind `w` reads it.
    pub fn with_norm(mut self, w: draftc_ir::op::NormWeight) -> WeightRef {
        self.plus_one = w == draftc_ir::op::NormWeight::UnitOffset;
        self
    }

    /// The name the device copy goes by: the tensor's, or `1 + name`.
    pub fn device_name(&self) -> std::borrow::Cow<'_, str> {
        if self.plus_one {
            format!("1 + {}", self.name).into()
        } else {
            self.name.as_str().into()
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Launch {
    pub id: LaunchId,
    pub kernel: Kernel,
    /// What part of its group this launch computes (`q_proj`, `core`, …; empty if all).
    pub part: &'static str,
    /// Graph nodes this launch implements (fused ones included).
    pub nodes: Vec<ValueId>,
    pub inputs: Vec<BufferId>,
    pub outputs: Vec<BufferId>,
    pub weights: Vec<WeightRef>,
    pub cost: Cost,
    /// The first output may share memory with `inputs[i]` (in-place residual).
    pub alias: Option<usize>,
    /// Set by `schedule`: the output was placed in that input's slot.
    pub in_place: bool,
}

/// Sums over a plan.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Totals {
    pub launches: i64,
    pub flops: i64,
    pub read: i64,
    pub written: i64,
    pub weights: i64,
    /// Sum of the allocator's slot sizes (peak intermediate memory).
    pub temp_peak: i64,
    /// Sum of all intermediate buffers without reuse.
    pub temp_naive: i64,
}

impl Totals {
    /// Bytes read plus bytes written, weights included.
    pub fn bytes_moved(&self) -> i64 {
        self.read + self.written
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    pub name: String,
    pub config: PlanConfig,
    /// Values of the symbols dims were evaluated with (`t`, `b`, `l`).
    pub symbols: Vec<(String, i64)>,
    /// Node names of the (canonical) graph the plan was built from.
    pub node_names: Vec<String>,
    pub groups: Vec<FusedGroup>,
    pub launches: Vec<Launch>,
    pub buffers: Vec<Buffer>,
    /// Byte size of each allocator slot.
    pub slots: Vec<i64>,
    pub totals: Totals,
    /// Totals of the same graph planned with `fuse = false`.
    pub unfused: Option<Totals>,
    /// Weights the runtime applies outside the launches: a memory stream's
    /// learned fusion of target taps (EAGLE-3's `fc`), run on the rows the
    /// target commits.
    pub seed_weights: Vec<WeightRef>,
}

impl Plan {
    pub fn buffer(&self, id: BufferId) -> &Buffer {
        &self.buffers[id.index()]
    }

    pub fn node_name(&self, id: ValueId) -> &str {
        self.node_names
            .get(id.index())
            .map(String::as_str)
            .unwrap_or("?")
    }

    /// Sum the launches' costs and the allocator's figures.
    pub fn compute_totals(&mut self) {
        let mut t = Totals {
            launches: self.launches.len() as i64,
            ..Totals::default()
        };
        for l in &self.launches {
            t.flops += l.cost.flops;
            t.read += l.cost.read;
            t.written += l.cost.written;
            t.weights += l.cost.weights;
        }
        t.temp_peak = self.slots.iter().sum();
        t.temp_naive = self
            .buffers
            .iter()
            .filter(|b| b.class == BufferClass::Temp)
            .map(Buffer::bytes)
            .sum();
        self.totals = t;
    }
}

/// `1,234,567` (shared with `draftc inspect`).
pub use draftc_ir::stats::thousands;

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &self.config;
        let syms: Vec<String> = self
            .symbols
            .iter()
            .filter(|(k, _)| k != "b")
            .map(|(k, v)| format!("{k} = {v}"))
            .collect();
        writeln!(
            f,
            "plan {} — {}, batch {}, context {}, {}, {}, {}",
            self.name,
            syms.join(", "),
            c.batch,
            c.context,
            c.dtype.name(),
            if c.fuse { "fused" } else { "unfused" },
            c.device
        )?;
        writeln!(f)?;
        let kernel_of = |l: &Launch| {
            let kernel = l.kernel.to_string();
            if l.part.is_empty() {
                kernel
            } else {
                format!("{} {kernel}", l.part)
            }
        };
        // GPU layouts lengthen linear launches; the column grows with them.
        let width = self
            .launches
            .iter()
            .map(|l| kernel_of(l).chars().count())
            .max()
            .unwrap_or(0)
            .max(66);
        writeln!(
            f,
            "{:>4}  {:<width$} {:>14} {:>12}  nodes → outputs",
            "#", "kernel", "FLOPs", "bytes"
        )?;
        for l in &self.launches {
            let nodes: Vec<&str> = l.nodes.iter().map(|n| self.node_name(*n)).collect();
            let outs: Vec<String> = l
                .outputs
                .iter()
                .map(|b| {
                    let buf = self.buffer(*b);
                    format!("{} {}{:?}", b, buf.name, buf.shape)
                })
                .collect();
            let kernel = kernel_of(l);
            writeln!(
                f,
                "{:>4}  {:<width$} {:>14} {:>12}  {} → {}{}",
                l.id.0,
                kernel,
                thousands(l.cost.flops),
                thousands(l.cost.read + l.cost.written),
                nodes.join(", "),
                outs.join(", "),
                if l.in_place { " (in place)" } else { "" }
            )?;
        }
        for w in &self.seed_weights {
            writeln!(
                f,
                "      memory seed: {}{:?}, applied by the runtime to the rows the target commits",
                w.name, w.shape
            )?;
        }
        writeln!(f)?;
        let t = &self.totals;
        writeln!(f, "totals ({}):", if c.fuse { "fused" } else { "unfused" })?;
        row(f, "launches", t.launches, self.unfused.map(|u| u.launches))?;
        row(f, "FLOPs", t.flops, self.unfused.map(|u| u.flops))?;
        row(
            f,
            "bytes moved",
            t.bytes_moved(),
            self.unfused.map(|u| u.bytes_moved()),
        )?;
        row(
            f,
            "  of which weights",
            t.weights,
            self.unfused.map(|u| u.weights),
        )?;
        row(
            f,
            "temp memory (peak)",
            t.temp_peak,
            self.unfused.map(|u| u.temp_peak),
        )?;
        row(
            f,
            "temp memory (no reuse)",
            t.temp_naive,
            self.unfused.map(|u| u.temp_naive),
        )?;
        writeln!(f, "  allocator slots: {}", self.slots.len())
    }
}

fn row(f: &mut fmt::Formatter<'_>, what: &str, v: i64, unfused: Option<i64>) -> fmt::Result {
    match unfused {
        Some(u) => writeln!(
            f,
            "  {what:<24} {:>16}   unfused {:>16}",
            thousands(v),
            thousands(u)
        ),
        None => writeln!(f, "  {what:<24} {:>16}", thousands(v)),
    }
}
