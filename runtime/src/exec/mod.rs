//! Running plans: the [`Executor`] (a codegen [`Plan`](draftc_codegen::Plan)
//! launched through `draftc-ops` on any CubeCL runtime), the reference
//! [`interpret`]er (the same graph evaluated node by node with the ops'
//! plain-Rust references, the executor's oracle), and what both share: the
//! description of one forward pass ([`Step`]), host tensors, weights, and
//! the KV caches ([`CacheStore`] on the device, [`HostCaches`] on the host).
//!
//! | file | owns |
//! | --- | --- |
//! | `step.rs` | [`Step`], [`SeqStep`], [`MemoryRows`], [`HostTensor`] |
//! | `weights.rs` | [`HostWeights`]: random, from safetensors, checked against a plan |
//! | `bound.rs` | the executor's device weights: tensors read alone, stacked q/k/v projections |
//! | `draft_vocab.rs` | [`DraftVocab`]: a reduced draft vocabulary's ids, head rows and id map |
//! | `cache.rs` | [`CacheStore`] (device) and [`HostCaches`]: per-sequence K/V with a capacity |
//! | `executor.rs` | [`Executor`]: plan cache, buffer slots, a pass's launches and outputs, flush policy |
//! | `launch.rs` | each kernel family's launch: `Kernel` → `draftc-ops` (linear layouts and epilogues, RoPE, appends, …) |
//! | `buffers.rs` | a pass's buffers: inputs bound, the tensor behind each plan buffer, per-pass uploads |
//! | `arena.rs` | a pass's buffers (slots, pending K/V, outputs), from the thread's kept buffers (`draftc_ops::kept`) |
//! | `timing.rs` | [`HostTime`] (host time issuing launches) and [`Profile`] (`DRAFTC_PROFILE=1`) |
//! | `replay.rs` | recorded passes: which passes replay, their keys, a replay's host work |
//! | `qkv.rs` | a self-attention's fused q/k/v step: projection, RoPE and KV append in one launch |
//! | `interpret.rs` | [`interpret`]: graph evaluation on the host |
//!
//! Cache layout (written down here because every part relies on it):
//! contiguous per sequence. Each cache half is `[slots · capacity, width]`;
//! sequence slot `s` owns rows `s · capacity ..`, its committed rows first.
//! A pass appends its new rows after them; the engine later truncates or
//! compacts (accepted tree path) through [`CacheStore`].

mod arena;
mod attention;
mod bound;
mod buffers;
mod cache;
mod draft_vocab;
mod executor;
mod interpret;
mod launch;
mod qkv;
mod replay;
mod step;
mod timing;
mod weights;

pub use cache::{CacheStore, HostCaches};
pub use draft_vocab::{file_specs, DraftVocab};
pub use executor::{linear_launch, ops_dtype, ExecError, Executor, LinearLaunch, Outputs};
pub use interpret::{interpret, HostOutputs};
pub use replay::drafter_replay;
pub use step::{
    HostTensor, MemoryRows, MemoryTail, SeqStep, Step, MEMORY_TAIL_BITS, STEP_POSITIONS,
};
pub use timing::{HostTime, Profile};
pub use weights::HostWeights;
