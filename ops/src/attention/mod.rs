//! Attention family: one fused flash-style kernel (Q·Kᵀ, mask, online softmax,
//! ·V in one launch) with the mask kind chosen at comptime, grouped-query
//! heads, scale 1/√head_dim (or any other: [`AttnMeta::with_scale`]), masks
//! defined on token positions, and batches of sequences of different lengths.
//!
//! | file | owns |
//! | --- | --- |
//! | `mask.rs` | [`Mask`] and its exact definitions (paper citations there), [`SeqBatch`] |
//! | `reference.rs` | [`attention_ref`] / [`attention_ref_scaled`], the plain-Rust oracle |
//! | `kernel.rs` | the `#[cube]` kernel |
//! | `launch.rs` | safe launch functions: [`attention`], [`draft_dim_attention`], [`AttnMeta`] |
//! | `decode.rs` | the GPU layout ([`attention_planes`]): a plane per (row, KV head, key split) serving the whole query-head group, flash-decoding splits |
//!
//! Layouts (row-major, contiguous): `q`, `out` `[Σ q_lens, heads, head_dim]`;
//! `k`, `v` `[Σ k_lens, kv_heads, head_dim]`; sequences packed one after the
//! other (see [`SeqBatch`]). Draft-dim attention (paper 000 §3.3) views a
//! `[b·t, l, heads·head_dim]` tensor as `b·t` sequences of `l` rows with the
//! `Full` mask and launches at most `chunk` of them at a time.
//!
//! Limits: `head_dim <= 256` (per-unit accumulators), positions `< 2^31`,
//! every buffer within the 128 MiB binding limit.

pub(crate) mod decode;
mod kernel;
mod launch;
mod mask;
mod reference;

pub use decode::{attention_planes, supports as planes_support, AttnPlaneShape};
pub use launch::{attention, attention_rows, draft_dim_attention, key_base_bytes, AttnMeta};
pub use mask::{inverse_block_window, validate_parents, Mask, SeqBatch, TreeTail, TREE_ROOT};
pub use reference::{attention_ref, attention_ref_scaled};
// For `crate::source` (kernel source text without a device).
pub(crate) use decode::{attention_combine, decode_attention};
pub(crate) use kernel::fused_attention;

/// Largest supported head dimension.
pub const MAX_HEAD_DIM: usize = 256;

/// The per-head accumulator sizes (in scalars) of the lanes attention
/// kernel, each a comptime variant: a head is held in the smallest that
/// fits, and the kernel's loops over it are unrolled (`kernel.rs`).
pub const HEAD_DIM_CAPS: [usize; 3] = [64, 128, MAX_HEAD_DIM];

/// The accumulator size for heads of `head_dim` (≤ [`MAX_HEAD_DIM`]).
pub fn head_dim_cap(head_dim: usize) -> usize {
    HEAD_DIM_CAPS
        .into_iter()
        .find(|&c| c >= head_dim)
        .unwrap_or(MAX_HEAD_DIM)
}

/// Most accumulator vectors (per query head, times the heads a unit
/// serves) a unit of the lanes kernel holds when it serves several heads: a
/// 256-wide head in vectors of 4, the largest a unit of one head holds but
/// for odd head sizes (vectors of 1 or 2), which keep a unit a head. Bigger
/// unrolled bodies compile superlinearly slower on lavapipe: a tree-masked
/// unit of 4 × 64 vectors took 18 s to compile against 2.9 s for 64.
pub const LANE_UNIT_VECTORS: usize = 64;

/// Query heads one unit of the lanes kernel serves: the largest divisor of
/// the group (query heads per KV head) whose accumulators fit in
/// [`LANE_UNIT_VECTORS`]. Each K and V vector a unit loads then serves all
/// of them. On lavapipe time follows the number of loads: with SmolLM2's
/// group of 3 (64-wide heads, 3 × 16 vectors), sixteen decode rows over
/// 128 keys took 1.69 ms with a unit per query head and 0.74 ms with a unit
/// per group, one row over 1,024 keys 1.84 → 0.88 ms, a 512-row prefill
/// 105 → 30 ms (`cargo bench -p draftc-ops --bench attention`). It depends
/// on the model's shape alone, never on the row count, so a verification
/// row and a decode row at the same position run the same code.
pub fn lane_heads_per_unit(group: usize, head_dim: usize) -> usize {
    let vectors = head_dim_cap(head_dim) / crate::block::widest_vector(head_dim, 4);
    (1..=group.max(1))
        .rev()
        .find(|&g| group.is_multiple_of(g) && g * vectors <= LANE_UNIT_VECTORS)
        .unwrap_or(1)
}

/// Head counts and head size of one attention call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AttnDims {
    /// Query heads `h`.
    pub heads: usize,
    /// Key/value heads `hkv`; `heads % kv_heads == 0` (grouped-query attention).
    pub kv_heads: usize,
    /// Size of one head; the softmax scale is `1/√head_dim` unless the
    /// metadata sets another ([`AttnMeta::with_scale`]).
    pub head_dim: usize,
}

impl AttnDims {
    /// Checks `h, hkv, hd >= 1`, `h % hkv == 0`, `hd <= MAX_HEAD_DIM`.
    pub fn validate(&self, op: &'static str) -> crate::Result<()> {
        let AttnDims {
            heads,
            kv_heads,
            head_dim,
        } = *self;
        let reason = if heads == 0 || kv_heads == 0 || head_dim == 0 {
            format!("heads, kv_heads and head_dim must be >= 1, got {self:?}")
        } else if heads % kv_heads != 0 {
            format!("heads ({heads}) must be a multiple of kv_heads ({kv_heads})")
        } else if head_dim > MAX_HEAD_DIM {
            format!("head_dim {head_dim} exceeds the supported maximum {MAX_HEAD_DIM}")
        } else {
            return Ok(());
        };
        Err(crate::OpsError::InvalidArgument { op, reason })
    }
}

#[cfg(test)]
mod tests {
    use super::lane_heads_per_unit;

    #[test]
    fn a_lane_unit_serves_the_group_that_fits() {
        // (group, head_dim) -> heads a unit serves.
        for (group, hd, want) in [
            (3, 64, 3),  // SmolLM2: 3 × 16 vectors
            (4, 64, 4),  // Llama 3.2 1B: 4 × 16
            (2, 128, 2), // Qwen 3 0.6B: 2 × 32
            (7, 64, 1),  // Qwen 2.5 0.5B: 7 × 16 does not fit, 7 is prime
            (8, 64, 4),  // 4 × 16 of a group of 8
            (4, 256, 1), // Gemma 3 270M: one 256-wide head is 64 vectors
            (4, 50, 2),  // vectors of 2: 32 a head
            (3, 3, 1),   // vectors of 1: 64 a head
            (1, 64, 1),
        ] {
            assert_eq!(
                lane_heads_per_unit(group, hd),
                want,
                "group {group}, head {hd}"
            );
        }
    }
}
