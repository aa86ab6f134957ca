//! Generation: the target model bound to `models/llama.draft`
//! ([`TargetModel`]), token selection (greedy, temperature / top-k / top-p
//! with a seed), and the one decoding loop every command drives: rounds
//! over a batch of sequences that join and leave (`rounds.rs`), owned by
//! the continuous [`Engine`] (`draftc serve`) or run as a static batch
//! ([`generate`], [`generate_with_policy`]: `draftc generate`, `bench`).
//!
//! | file | owns |
//! | --- | --- |
//! | `target.rs` | [`TargetModel`]: config → graph → plan → executor, KV caches, prefill in chunks |
//! | `select.rs` | [`Sampling`], [`select_tokens`]: picking next tokens from logits rows on the device |
//! | `continuous.rs` | [`Engine`]: continuous batching — sequences join and leave at round boundaries, each with its own sampling, seed and stop ids; prompt chunks ride in the decoding pass; per-sequence drafts (`draftc serve`); [`EngineStats`] |
//! | `rounds.rs` | the round machine every decoding path runs: a batch of sequences in KV slots, draft → one target pass → the target's choice at every row → accept → commit → observe; the prefix cache |
//! | `rounds_plan.rs` | the planner's side of a round: per-sequence budgets, the drafter's off switch, the planner's books |
//! | `static_run.rs` | a static batch on those rounds, timed (prefill, every decode round) |
//! | `autoregressive.rs` | [`generate`]: the static run with no drafter (`--no-spec`, the baseline), [`GenStats`] |
//! | `drafters.rs` | the [`Drafter`] trait: prompt lookup, self-speculation (MagicDec) |
//! | `parallel_drafter.rs` | [`ParallelDrafter`]: SpecFormer / Medusa, observation gathered per pass and run at the next draft |
//! | `autoregressive_drafter.rs` | [`AutoregressiveDrafter`]: Beagle / SPIRe over memory streams, trees built level by level |
//! | `lookup_first.rs` | [`LookupFirst`]: prompt lookup first, a model drafter where the history has no n-gram match (`--lookup N`) |
//! | `concurrent.rs` | [`ConcurrentDrafter`]: DuoDecoding — a [`TokenDrafter`] on its own thread drafts round r+1 while the target verifies round r; hardware-aware budget; [`LmDrafter`] |
//! | `speculative.rs` | [`generate_speculative`] and [`generate_with_policy`]: the static run with a drafter, sized by a [`DraftPolicy`] (a fixed budget or the planner's per round); [`warm_up`]; [`SpecStats`] |

mod autoregressive;
mod autoregressive_drafter;
mod concurrent;
mod continuous;
mod drafters;
mod eagle_drafter;
mod lookup_first;
mod parallel_drafter;
mod rounds;
mod rounds_plan;
mod select;
mod speculative;
mod static_run;
pub(crate) mod target;

pub use autoregressive::{generate, GenStats, Generation, Request};
pub use autoregressive_drafter::AutoregressiveDrafter;
pub use concurrent::{
    best_path, reroot, BudgetPolicy, ConcurrentDrafter, DraftRequest, DraftWorker, LmDrafter,
    SyncTokenDrafter, TokenDrafter,
};
pub use continuous::{Emitted, Engine, EngineConfig, EngineStats, Finish, SeqParams};
pub use drafters::{
    model_drafter, Committed, DraftCall, Drafter, Observed, PromptLookupDrafter, SelfSpecDrafter,
    SeqView,
};
pub use eagle_drafter::EagleDrafter;
pub use lookup_first::{
    LookupFirst, LookupRounds, MAX_NGRAM as LOOKUP_MAX_NGRAM, MIN_NGRAMS as LOOKUP_MIN_NGRAMS,
};
pub use parallel_drafter::ParallelDrafter;
pub use rounds::check_request;
pub use select::{
    select_tokens, select_tokens_into, top_candidates, top_candidates_into, Kept, Sampling,
    SelectOut, TopOut,
};
pub use speculative::{
    generate_speculative, generate_with_policy, warm_up, DraftPolicy, SpecGeneration, SpecStats,
};
pub use static_run::Stops;
pub use target::{
    compile_target, target_config, weight_specs, EngineError, TargetModel, FAMILIES, LLAMA_DRAFT,
};
