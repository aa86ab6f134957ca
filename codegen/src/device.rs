//! Device profiles: what the lowering must know about the device a plan runs
//! on to pick each kernel's variant and launch shape. A profile is plain
//! data (no device is opened here): the runtime fills one from its compute
//! client's properties, and `draftc plan --device NAME` uses a preset.
//!
//! Two families of kernel layouts exist (issue 15, docs/gpu.md):
//! * **lanes**, shaped for Mesa's lavapipe, where a SIMD lane is a unit and
//!   time follows the number of vector loads (`ops::linear`);
//! * **planes**, shaped for GPUs: a plane (warp) per output column group,
//!   lanes streaming consecutive 16-byte vectors (`ops::linear_plane`).
//!
//! A CPU emulator always gets the lanes family (its numbers must not get
//! worse); a GPU whose planes cubecl can use gets the planes family. A GPU
//! without usable plane operations falls back to lanes.

use std::fmt;

/// Whether the device emulates a GPU on CPU cores or is one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DeviceClass {
    /// A CPU implementation of the API (Mesa lavapipe).
    Emulator,
    /// A real GPU (CUDA, or wgpu on Vulkan / Metal / DX12).
    Gpu,
}

/// The facts the lowering uses about one device.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct DeviceProfile {
    /// A short name shown in plans (`lavapipe`, `cuda`, `wgpu-gpu`, or the
    /// runtime's name).
    pub name: String,
    pub class: DeviceClass,
    /// Lanes per plane (warp / subgroup) when fixed; 0 when it varies.
    pub plane_size: u32,
    /// Plane operations (`plane_sum`, shuffles) are available.
    pub plane_ops: bool,
    /// Cooperative matrix-multiply (tensor cores) is available.
    pub cmma: bool,
    /// Shared memory per cube, bytes.
    pub shared_memory: usize,
    /// Widest vector (elements) a kernel may load: 4 on wgpu, any on CUDA
    /// (kept at 16 here).
    pub max_vector: usize,
    /// Streaming multiprocessors, when the runtime reports them.
    pub sms: Option<u32>,
    /// Threads an emulator runs cubes on (lavapipe: `LP_NUM_THREADS`, else
    /// one per CPU); 0 on a GPU. The lane layout's columns per unit depend
    /// on it ([`DeviceProfile::linear_layout`]).
    pub threads: u32,
}

/// Output columns per unit the lane layout may use (`ops::linear::UNIT_COLUMNS`).
pub const LANE_COLUMNS: [u32; 5] = [8, 12, 16, 24, 32];
/// Largest register block (rows × columns per unit) of the lane layout:
/// bigger unrolled bodies take lavapipe's JIT much longer to compile.
const LANE_REGISTERS: u32 = 128;

/// Rows per register block of the lane layout for `m` rows (as `ops::linear`
/// picks it).
pub fn lane_rows_per_block(m: i64) -> u32 {
    match m {
        ..=1 => 1,
        2 => 2,
        3 | 4 => 4,
        _ => 8,
    }
}

/// The lane layout's columns per unit for `n` outputs, `m` rows and
/// `threads` threads: the count with the least modelled time. Lavapipe's
/// time follows vector loads (ops/src/linear.rs): per reduction step a unit
/// loads one weight vector per column (two with SwiGLU's up weight), one
/// `x` vector per row of its block and, with a norm prologue, one of the
/// norm weight; more columns per unit amortise the `x` loads over more
/// columns but leave fewer cubes, which the threads run in whole rounds.
/// 576 outputs make 9 cubes of 8 × 8 columns (5 rounds on 2 threads) or 6
/// of 8 × 12 (3 rounds): 12 columns win there, 32 on the 49,152-row LM head
/// (measured: `cargo bench -p draftc-ops --bench ops`, docs/bench). Ties go
/// to fewer columns (smaller kernels).
pub fn lane_columns(n: i64, m: i64, norm: bool, swiglu: bool, threads: u32) -> u32 {
    let mb = lane_rows_per_block(m);
    let n = n.max(1) as u64;
    let threads = threads.max(1) as u64;
    let cost = |cols: u32| {
        let cubes = n.div_ceil(8 * cols as u64);
        let rounds = cubes.div_ceil(threads);
        let loads = cols * (1 + swiglu as u32) + mb + norm as u32;
        rounds * loads as u64
    };
    LANE_COLUMNS
        .into_iter()
        .filter(|&c| c * mb <= LANE_REGISTERS)
        .min_by_key(|&c| (cost(c), c))
        .unwrap_or(LANE_COLUMNS[0])
}

/// Planes per cube of the GPU linear layout (128 threads with 32 lanes).
const PLANES: u32 = 4;

impl DeviceProfile {
    /// Mesa's lavapipe (Vulkan on CPU cores): planes of 8 run but cubecl
    /// does not advertise them, no tensor cores.
    pub fn lavapipe() -> DeviceProfile {
        DeviceProfile {
            name: "lavapipe".into(),
            class: DeviceClass::Emulator,
            plane_size: 8,
            plane_ops: false,
            cmma: false,
            shared_memory: 32 << 10,
            max_vector: 4,
            sms: None,
            // The 2 cores of the machine CI runs on.
            threads: 2,
        }
    }

    /// An NVIDIA H100 through cubecl-cuda (the card docs/bench/cuda-h100 measured).
    pub fn cuda_h100() -> DeviceProfile {
        DeviceProfile {
            name: "cuda".into(),
            class: DeviceClass::Gpu,
            plane_size: 32,
            plane_ops: true,
            cmma: true,
            shared_memory: 227 << 10,
            max_vector: 16,
            sms: Some(132),
            threads: 0,
        }
    }

    /// A GPU through wgpu (Vulkan, Metal, DX12) with 32-lane subgroups.
    pub fn wgpu_gpu() -> DeviceProfile {
        DeviceProfile {
            name: "wgpu-gpu".into(),
            class: DeviceClass::Gpu,
            plane_size: 32,
            plane_ops: true,
            cmma: false,
            shared_memory: 32 << 10,
            max_vector: 4,
            sms: None,
            threads: 0,
        }
    }

    /// The preset `--device NAME` names.
    pub fn preset(name: &str) -> Option<DeviceProfile> {
        match name {
            "lavapipe" => Some(DeviceProfile::lavapipe()),
            "cuda" => Some(DeviceProfile::cuda_h100()),
            "wgpu-gpu" => Some(DeviceProfile::wgpu_gpu()),
            _ => None,
        }
    }

    /// The names [`DeviceProfile::preset`] accepts.
    pub const PRESETS: &'static str = "cuda, lavapipe or wgpu-gpu";

    /// Whether GPU (plane) layouts apply: a GPU with usable planes of a
    /// known size.
    pub fn uses_planes(&self) -> bool {
        self.class == DeviceClass::Gpu
            && self.plane_ops
            && matches!(self.plane_size, 4 | 8 | 16 | 32 | 64 | 128)
    }

    /// The layout of a linear launch: `m` rows, reduction `k` (in `groups`
    /// norm groups), `n` outputs, `elem` bytes per element, with a norm
    /// prologue and/or a SwiGLU epilogue (a second weight).
    #[allow(clippy::too_many_arguments)]
    pub fn linear_layout(
        &self,
        m: i64,
        k: i64,
        n: i64,
        groups: i64,
        elem: usize,
        norm: bool,
        swiglu: bool,
    ) -> LinearLayout {
        if !self.uses_planes() {
            return LinearLayout::Lanes {
                cols: lane_columns(n, m, norm, swiglu, self.threads),
            };
        }
        // 16-byte vectors along the reduction of one norm group.
        let seg = (k / groups.max(1)).max(1);
        let width = [16 / elem.max(1), 4, 2, 1]
            .into_iter()
            .find(|&w| w >= 1 && w <= self.max_vector && seg % w as i64 == 0)
            .unwrap_or(1) as i64;
        let vectors = k / width;
        // Split the reduction between planes while each lane keeps at least
        // two vector loads per pass (the grouped prologue reduces per group
        // inside one plane).
        let mut ksplit = 1u32;
        if groups <= 1 {
            while ksplit < PLANES && vectors >= 2 * self.plane_size as i64 * (2 * ksplit) as i64 {
                ksplit *= 2;
            }
        }
        // Two columns per plane for very wide outputs (the LM head): half the
        // cubes, and each x vector serves two weight rows.
        let cols = if n >= 16_384 { 2 } else { 1 };
        LinearLayout::Planes {
            plane: self.plane_size,
            planes: PLANES,
            ksplit,
            cols,
        }
    }
}

impl DeviceProfile {
    /// The layout of an attention launch over the KV cache: the GPU layout
    /// (a plane per query row, KV head and key split, serving the whole
    /// query-head group) where the head fits the planes, else lanes.
    pub fn attention_layout(&self, heads: i64, kv_heads: i64, head_dim: i64) -> AttentionLayout {
        let plane = self.plane_size as i64;
        let fits = self.uses_planes()
            && kv_heads > 0
            && heads % kv_heads == 0
            && heads / kv_heads <= 8
            && head_dim % plane == 0
            && head_dim / plane <= 8
            && head_dim <= 128;
        if fits {
            AttentionLayout::Planes {
                plane: self.plane_size,
                planes: PLANES,
                chunk: ATTENTION_CHUNK,
            }
        } else {
            AttentionLayout::Lanes
        }
    }
}

/// Keys per split of the GPU attention layout (flash-decoding): contexts
/// longer than this are spread over several cubes and merged.
const ATTENTION_CHUNK: u32 = 256;

impl Default for DeviceProfile {
    /// Plans default to lavapipe, the device every test and CI run has.
    fn default() -> DeviceProfile {
        DeviceProfile::lavapipe()
    }
}

/// The kernel layout a linear launch uses (`ops::linear` or
/// `ops::linear_plane` with this shape).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LinearLayout {
    /// Lavapipe-shaped (`ops::linear`): a unit owns `cols` adjacent columns
    /// ([`lane_columns`]).
    Lanes { cols: u32 },
    /// GPU-shaped (`ops::linear_plane::PlaneShape`): `planes` planes of
    /// `plane` lanes per cube, `ksplit` planes per column group, `cols`
    /// columns per group.
    Planes {
        plane: u32,
        planes: u32,
        ksplit: u32,
        cols: u32,
    },
}

/// The kernel layout an attention launch uses (`ops::attention::attention_rows`
/// or `ops::attention::attention_planes` with this shape).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AttentionLayout {
    /// One unit per (query row, the query heads of one KV head that fit:
    /// `ops::attention::lane_heads_per_unit`).
    Lanes,
    /// `planes` planes of `plane` lanes per (query row, KV head, split of
    /// `chunk` keys).
    Planes { plane: u32, planes: u32, chunk: u32 },
}

impl fmt::Display for AttentionLayout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AttentionLayout::Lanes => write!(f, "lanes"),
            AttentionLayout::Planes {
                plane,
                planes,
                chunk,
            } => write!(f, "planes({planes}x{plane}, chunk={chunk})"),
        }
    }
}

impl fmt::Display for LinearLayout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LinearLayout::Lanes { cols } => write!(f, "lanes(cols={cols})"),
            LinearLayout::Planes {
                plane,
                planes,
                ksplit,
                cols,
            } => write!(f, "planes({planes}x{plane}, ksplit={ksplit}, cols={cols})"),
        }
    }
}

impl fmt::Display for DeviceProfile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn emulators_keep_the_lane_layout() {
        let lp = DeviceProfile::lavapipe();
        assert!(matches!(
            lp.linear_layout(1, 576, 1536, 1, 4, true, true),
            LinearLayout::Lanes { .. }
        ));
        // A GPU without plane operations falls back too.
        let mut gpu = DeviceProfile::wgpu_gpu();
        gpu.plane_ops = false;
        assert!(matches!(
            gpu.linear_layout(1, 576, 1536, 1, 2, true, true),
            LinearLayout::Lanes { .. }
        ));
    }

    /// The choices the ops bench's lane-layout table measured best on 2
    /// threads (docs/bench/lavapipe/lane-columns.md).
    #[test]
    fn lane_columns_follow_the_measured_table() {
        let cols = |n, m, swiglu| lane_columns(n, m, false, swiglu, 2);
        // 576- and 192-wide outputs: 12 columns (6 and 2 cubes).
        for m in [1, 2, 4, 8] {
            assert_eq!(cols(576, m, false), 12, "576, m = {m}");
        }
        assert_eq!(cols(192, 1, false), 12);
        // The LM head: as wide as the register block allows.
        assert_eq!(cols(49_152, 1, false), 32);
        assert_eq!(cols(49_152, 4, false), 32);
        assert_eq!(cols(49_152, 8, false), 16);
        // Every choice is a listed variant within the register budget.
        for n in [1, 7, 64, 100, 192, 300, 576, 960, 1536, 49_152] {
            for m in 1..=20 {
                for threads in [0, 1, 2, 3, 8, 64] {
                    let c = lane_columns(n, m, m % 2 == 0, m % 3 == 0, threads);
                    assert!(LANE_COLUMNS.contains(&c));
                    assert!(c * lane_rows_per_block(m) <= LANE_REGISTERS);
                }
            }
        }
    }

    #[test]
    fn gpu_layouts_split_long_reductions_and_pair_wide_outputs() {
        let h = DeviceProfile::cuda_h100();
        let layout = |k, n, g, e| match h.linear_layout(1, k, n, g, e, false, false) {
            LinearLayout::Planes { ksplit, cols, .. } => (ksplit, cols),
            LinearLayout::Lanes { .. } => panic!("lanes on a GPU"),
        };
        // 576 f16 = 72 vectors: one plane per column.
        assert_eq!(layout(576, 1536, 1, 2), (1, 1));
        // down_proj 1536 -> 576: 192 f16 vectors, 384 f32 vectors.
        assert_eq!(layout(1536, 576, 1, 2), (2, 1));
        assert_eq!(layout(1536, 576, 1, 4), (4, 1));
        // The LM head pairs columns; grouped prologues never split.
        assert_eq!(layout(576, 49_152, 1, 2), (1, 2));
        assert_eq!(layout(2304, 576, 4, 4), (1, 1));
    }

    #[test]
    fn attention_planes_need_a_head_that_fits_the_plane() {
        let h = DeviceProfile::cuda_h100();
        assert!(matches!(
            h.attention_layout(9, 3, 64),
            AttentionLayout::Planes { .. }
        ));
        // 48 dims on 32 lanes, 9 heads per KV head: lanes.
        assert_eq!(h.attention_layout(9, 3, 48), AttentionLayout::Lanes);
        assert_eq!(h.attention_layout(18, 2, 64), AttentionLayout::Lanes);
        assert_eq!(
            DeviceProfile::lavapipe().attention_layout(9, 3, 64),
            AttentionLayout::Lanes
        );
    }

    #[test]
    fn presets_parse() {
        for name in ["cuda", "lavapipe", "wgpu-gpu"] {
            assert_eq!(DeviceProfile::preset(name).unwrap().name, name);
        }
        assert!(DeviceProfile::preset("tpu").is_none());
    }
}
