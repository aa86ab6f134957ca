//! Tree verification: which drafted nodes the target accepts, and the bonus
//! token (docs/speculative.md, "The round": accept).
//!
//! # Conventions
//! * A tree has `n >= 1` nodes; `tokens[i]` is node `i`'s token id,
//!   `parents[i]` its parent. **Node 0 is the root**: the last committed token
//!   (its `parents[0]` must be [`TREE_ROOT`]); every other node has
//!   `parents[i] < i`. These are the same arrays the tree attention mask takes
//!   (`SeqBatch::tree`), so one verify forward feeds acceptance directly.
//! * `logits[i]` (`[n, vocab]`) is the target's output at node `i`: the
//!   distribution of the token that *follows* node `i`. `q[i]` (optional,
//!   `[n, vocab]`) is the draft distribution the children of node `i` were
//!   drawn from; rows must be probability distributions.
//! * Output [`Acceptance`]: `accepted` = the accepted nodes in path order
//!   (root excluded), `bonus` = the extra token sampled/argmaxed at the last
//!   accepted node (or the root). The round emits
//!   `tokens[accepted…] ++ [bonus]`, so always at least one token.
//!
//! # Greedy
//! Walk from the root; the first child (in index order) whose token equals
//! the argmax (lowest index on ties) of its parent's logits is accepted;
//! `bonus = argmax(logits[last accepted])`.
//!
//! # Lossless sampling (SpecInfer-style multi-draft speculative sampling)
//! At the current node, `p = softmax(logits[cur] / T)`. Its children are
//! tried in index order: child `c` with token `x` is accepted iff
//! `u_c · q(x) < p(x)` (i.e. with probability `min(1, p(x)/q(x))`), with
//! `u_c = uniform(seed, c, step)` (the crate's counter-based RNG,
//! [`crate::sampling::reference::uniform`]; counter `c` = node index). On
//! rejection `p ← norm(max(0, p − q))` and the next child is tried. When a
//! child is accepted the walk moves to it with a fresh `p`; when none is,
//! the bonus is drawn from the current (residual) `p` by inverse CDF with
//! `u_0 = uniform(seed, 0, step)`. `q = None` means the drafter chose its
//! tokens deterministically (`q` = one-hot on the drafted token). The emitted
//! token then has exactly the target's distribution **provided each child's
//! token was drawn independently from `q[parent]`** (or deterministically
//! when `q` is `None`).
//!
//! Kernel: one cube of [`BLOCK`] units per tree (a batch of same-size trees is
//! one launch); see `kernel.rs`. Reference: `reference.rs`.

mod kernel;
mod launch;
mod reference;

pub use launch::{accept_tree, accept_trees};
pub use reference::{accept_ref, argmax, Outcome};

/// Units per cube of the acceptance kernels (vocabulary chunks).
pub const BLOCK: usize = 64;

/// Largest tree the acceptance kernels take (nodes per tree).
pub const MAX_NODES: usize = 1024;

/// How drafted nodes are accepted.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum AcceptMode {
    /// Exact match with the target's argmax.
    Greedy,
    /// Lossless speculative sampling at `temperature > 0`; `(seed, step)`
    /// select the random stream (use a new `step` every round).
    Sampling {
        temperature: f32,
        seed: u64,
        step: u32,
    },
}

/// Result of accepting one tree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Acceptance {
    /// Accepted node indices in path order (root excluded).
    pub accepted: Vec<u32>,
    /// The bonus token emitted after the accepted path.
    pub bonus: u32,
}
