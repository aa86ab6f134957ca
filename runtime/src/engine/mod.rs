//! Generation: the target model bound to `models/llama.draft`
//! ([`TargetModel`]), token selection (greedy, temperature / top-k / top-p
//! with a seed), and autoregressive batched generation ([`generate`]) —
//! the `--no-spec` baseline the speculative engine must reproduce exactly.
//!
//! | file | owns |
//! | --- | --- |
//! | `target.rs` | [`TargetModel`]: config → graph → plan → executor, KV caches, prefill in chunks |
//! | `select.rs` | [`Sampling`], [`select_tokens`]: picking next tokens from logits rows on the device |
//! | `autoregressive.rs` | [`generate`]: batched decoding, per-sequence stop, [`GenStats`] |

mod autoregressive;
mod select;
pub(crate) mod target;

pub use autoregressive::{generate, GenStats, Generation, Request};
pub use select::{select_tokens, Sampling};
pub use target::{
    compile_target, target_config, weight_specs, EngineError, TargetModel, LLAMA_DRAFT,
};
