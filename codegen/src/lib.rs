//! draftc-codegen: lowering passes from the typed graph to a [`Plan`] of
//! fused kernel launches (see ARCHITECTURE.md). The passes, one file each,
//! run in the order [`pipeline`] lists: `canonicalize` → `fuse` → `lower` →
//! `schedule` → `bind`.
//!
//! Layers and their names: `ir::Graph` (typed graph) → [`FusedGroup`]
//! (fusion decision) → [`Plan`] / [`Launch`] with a [`Kernel`] (launched
//! kernel, named after the `draftc-ops` function it calls).
//!
//! **Invariant:** codegen never needs a device and does not depend on
//! cubecl or `draftc-ops`.

pub mod bind;
pub mod canonicalize;
pub mod check;
pub mod device;
pub mod error;
pub mod fuse;
pub mod kernel;
pub mod lower;
pub mod pipeline;
pub mod plan;
pub mod schedule;
pub mod torch;

pub use device::{AttentionLayout, DeviceClass, DeviceProfile, LinearLayout};
pub use error::CodegenError;
pub use fuse::{FusedGroup, GroupKind};
pub use kernel::Kernel;
pub use lower::TargetWeights;
pub use pipeline::{plan, trace};
pub use plan::{
    Buffer, BufferClass, BufferId, Launch, LaunchId, Plan, PlanConfig, PlanDType, Totals,
};
