//! Host-side speculative-decoding algorithms (docs/speculative.md): everything a
//! round needs that is plain data on the CPU, no device.
//!
//! | module | owns | papers |
//! | --- | --- | --- |
//! | [`tree`] | [`DraftTree`] and its builders (chain, static, EAGLE-2 dynamic, DuoDecoding multi-sequence), the per-round node budget, greedy acceptance on the host | 000, 002, 003 |
//! | [`builder`] | [`TreeBuilder`]: every tree shape built level by level, so a drafter expands a whole level (of every sequence) in one pass | 002, 003 |
//! | [`prompt_lookup`] | n-gram drafting from the token history (`--drafter prompt-lookup`) | 003 (PLD baseline) |
//! | [`median`] | the median of timing samples, of an even count the side that never favours speculation | |
//! | [`budget`] | hardware-aware draft length from measured verify/draft times and acceptance | 003 §3.1 |
//! | `plan_config` | the planner's settings ([`PlannerConfig`], [`PlanMode`], the warm-up's cycle) and its stored cost tables (`planner::Costs`) | |
//! | [`planner`] | `--speculate auto`: each round's draft budget per sequence, down to none, from costs measured on the device and acceptance per depth estimated online | 004 §2, SpecDec++, SmartSpec |
//!
//! The throughput multiplier of paper 004 lives in [`crate::perf_model`].

pub mod budget;
pub mod builder;
pub mod median;
mod plan_config;
pub mod planner;
pub mod prompt_lookup;
pub mod tree;

pub use budget::{BudgetConfig, BudgetController, Schedule};
pub use builder::{Confidence, TreeBuilder};
pub use planner::{PlanMode, Planner, PlannerConfig, RoundPlan};
pub use prompt_lookup::PromptLookup;
pub use tree::{Accepted, DraftNode, DraftTree, TreeShape};

/// Errors of the speculative-decoding helpers. Everything a user can type
/// (tree shapes, n-gram ranges) is reported here, never by a panic.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SpecError {
    /// A node's parent is not an earlier node.
    #[error("draft tree node {node}: parent {parent} is not an earlier node (nodes are stored parents first)")]
    InvalidParent { node: usize, parent: usize },
    /// Two inputs that must have the same length do not.
    #[error("{what}: expected {expected} entries, found {found}")]
    LengthMismatch {
        what: &'static str,
        expected: usize,
        found: usize,
    },
    /// `--tree` text that does not parse.
    #[error("invalid tree shape `{text}`: {reason}; expected `chain`, `static(3, 2, 1)` (or `3,2,1`), `dynamic(depth=D, topk=K, nodes=N)` or `multi(seqs=S)`")]
    TreeShape { text: String, reason: String },
    /// A configuration value out of its range.
    #[error("{what}: {reason}")]
    InvalidConfig { what: &'static str, reason: String },
}
