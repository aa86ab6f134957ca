//! Attention masks and the host-side description of a batch of sequences.
//!
//! Owns [`Mask`] (the comptime mask kind plus its runtime parameters), the
//! predicate [`Mask::visible`] that both the reference and the kernel
//! implement, and [`SeqBatch`] (per-sequence lengths, positions and tree
//! parents) with its validation.
//!
//! Masks are defined on **positions** (`q_pos`, `k_pos`: the token's position in
//! the original text), never on buffer indices — except the tree masks, whose
//! ancestor test is on node indices because sibling nodes share a position.
//!
//! | mask | a query at position `qp` sees a key at position `kp` iff | source |
//! | --- | --- | --- |
//! | `Full` | always (bidirectional) | paper 000 §3.3, draft-dim attention |
//! | `Causal` | `kp <= qp` | standard decoder |
//! | `CrossDiagonal` | `kp < qp` (the diagonal is masked) | paper 002 §4.1, Eq. 2: `Mask[i,j] = 0 for j >= i` |
//! | `InverseBlock { window: k, offset: ε }` | `win(kp) < win(qp)` where `win(p) = (p + k - 1 - ε) / k` | paper 002 §4.2, Fig. 2 (left) |
//! | `SlidingSink { window: w, sink: s }` | `kp <= qp && (kp < s \|\| qp - kp < w)` | paper 004 §3.1 (StreamingLLM mask) |
//! | `Tree` | key is in the committed prefix, or key node is an ancestor of (or is) the query node | docs/speculative.md, "The round": verify |
//! | `TreeSliding { window: w, sink: s }` | `Tree`'s condition and `SlidingSink { w, s }`'s on positions | verify of a sliding-window layer (Gemma 3) |
//!
//! Inverse block (paper 002 §4.2): windows of size `k` start at `n = ε + w·k`
//! and cover positions `n+1 ..= n+k`; "for a query at position n+i, i=1..k,
//! the corresponding local future keys at n+j, 1 ≤ j ≤ k are all masked out".
//! Figure 2 (left) draws this on top of the cross-attention mask (keys
//! `j < i`), so a query sees exactly the keys of all *earlier* windows:
//! `kp < qp` and `win(kp) != win(qp)` ⟺ `win(kp) < win(qp)`. With the formula
//! above, positions `0..=ε` form window 0, `ε+1 ..= ε+k` window 1, and so on.
//!
//! Sliding window + sink (paper 004 §3.1, footnote 4): SPIRe takes positions
//! from the original text, so `qp - kp` is the distance in the text; the
//! window counts the query itself (`w = 1` sees only itself and the sink).
//!
//! Tree over a sliding window (`TreeSliding`): verifying a draft tree in a
//! layer whose causal mask is a sliding window. A node's position is
//! `committed + depth`, so its ancestors sit at exactly the positions the
//! tokens of its path will have once committed, and the window applies to
//! committed keys and ancestors alike: the node sees what autoregressive
//! decoding of its path would see. (`Tree` alone would let it see every
//! committed key; `SlidingSink` alone, sibling branches' nodes.)
//!
//! Tree tail ([`TreeTail`], any mask): the last `lens[s]` keys of sequence
//! `s` are draft-tree states that a query may additionally see only if its
//! bit for that key is set — an autoregressive drafter expanding a tree
//! level by level over its memory stream (Beagle's predicted states) sees
//! the states of its own ancestors, not its cousins'. The positional mask
//! still applies to every key.
//!
//! A query that sees no key at all (e.g. position 0 under `CrossDiagonal`)
//! gets an all-zero output row (softmax over the empty set is defined as 0).

use crate::error::{OpsError, Result};

/// Parent index of a tree node that attaches directly to the committed prefix.
pub const TREE_ROOT: u32 = u32::MAX;

/// Which keys a query may see (see the module table for the exact predicates).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mask {
    /// Bidirectional: every query sees every key of its sequence.
    Full,
    /// `kp <= qp`.
    Causal,
    /// `kp < qp` (Beagle cross attention, diagonal masked).
    CrossDiagonal,
    /// Beagle inverse-block training mask: `win(kp) < win(qp)`.
    InverseBlock { window: u32, offset: u32 },
    /// StreamingLLM: `kp <= qp && (kp < sink || qp - kp < window)`.
    SlidingSink { window: u32, sink: u32 },
    /// Tree verification mask over `[committed KV | tree nodes]`.
    Tree,
    /// Tree verification of a sliding-window layer: `Tree`'s visibility and
    /// `SlidingSink { window, sink }`'s predicate on positions.
    TreeSliding { window: u32, sink: u32 },
}

/// Comptime codes of the mask kinds (the kernel is specialised per kind).
pub(crate) mod code {
    pub const FULL: u32 = 0;
    pub const CAUSAL: u32 = 1;
    pub const CROSS_DIAGONAL: u32 = 2;
    pub const INVERSE_BLOCK: u32 = 3;
    pub const SLIDING_SINK: u32 = 4;
}

impl Mask {
    /// The comptime positional code and the two runtime parameters passed to
    /// the kernel. `Mask::Tree` is the full mask plus tree bits (the kernel's
    /// comptime `tree` flag, set whenever there are tree keys);
    /// `Mask::TreeSliding` the sliding-window mask plus tree bits.
    pub(crate) fn kernel_args(&self) -> (u32, u32, u32) {
        match *self {
            Mask::Full => (code::FULL, 0, 0),
            Mask::Causal => (code::CAUSAL, 0, 0),
            Mask::CrossDiagonal => (code::CROSS_DIAGONAL, 0, 0),
            Mask::InverseBlock { window, offset } => (code::INVERSE_BLOCK, window, offset),
            Mask::SlidingSink { window, sink } => (code::SLIDING_SINK, window, sink),
            Mask::Tree => (code::FULL, 0, 0),
            Mask::TreeSliding { window, sink } => (code::SLIDING_SINK, window, sink),
        }
    }

    /// Whether this is a tree verification mask (`Tree`, `TreeSliding`):
    /// the batch's `parents` describe the last `q_lens[s]` keys of each
    /// sequence as tree nodes, visible only to their descendants.
    pub fn is_tree(&self) -> bool {
        matches!(self, Mask::Tree | Mask::TreeSliding { .. })
    }

    /// Whether a query at position `qp` sees a key at position `kp`: the
    /// positional part of the mask. The tree masks' ancestor test is decided
    /// on node indices (see [`SeqBatch::ancestor_bits`]): `Tree` answers
    /// `true` here, `TreeSliding` its sliding-window predicate.
    pub fn visible(&self, qp: u32, kp: u32) -> bool {
        match *self {
            Mask::Full | Mask::Tree => true,
            Mask::Causal => kp <= qp,
            Mask::CrossDiagonal => kp < qp,
            Mask::InverseBlock { window, offset } => {
                inverse_block_window(kp, window, offset) < inverse_block_window(qp, window, offset)
            }
            Mask::SlidingSink { window, sink } | Mask::TreeSliding { window, sink } => {
                kp <= qp && (kp < sink || qp - kp < window)
            }
        }
    }

    fn validate(&self, op: &'static str) -> Result<()> {
        match *self {
            Mask::InverseBlock { window, offset } if window == 0 || offset >= window => {
                Err(OpsError::InvalidArgument {
                    op,
                    reason: format!(
                        "inverse-block mask needs window >= 1 and offset < window, got window {window}, offset {offset}"
                    ),
                })
            }
            Mask::SlidingSink { window: 0, .. } | Mask::TreeSliding { window: 0, .. } => {
                Err(OpsError::InvalidArgument {
                    op,
                    reason:
                        "sliding-window mask needs window >= 1 (the window counts the query itself)"
                            .into(),
                })
            }
            _ => Ok(()),
        }
    }
}

/// Window index of position `p` for the inverse-block mask (see module docs).
/// Computed in u64 so that positions near `u32::MAX` cannot overflow.
pub fn inverse_block_window(p: u32, window: u32, offset: u32) -> u64 {
    (p as u64 + window as u64 - 1 - offset as u64) / window as u64
}

/// A batch of `b` sequences of different lengths, packed row after row.
///
/// Layouts (row-major): `q`/`out` are `[Σ q_lens, heads, head_dim]`, `k`/`v`
/// are `[Σ k_lens, kv_heads, head_dim]`; sequence `s` owns the query rows
/// `Σ_{t<s} q_lens[t] ..` and the key rows `Σ_{t<s} k_lens[t] ..`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SeqBatch {
    /// Query rows per sequence.
    pub q_lens: Vec<usize>,
    /// Key/value rows per sequence.
    pub k_lens: Vec<usize>,
    /// Position of every query row in its original text, `[Σ q_lens]`.
    pub q_pos: Vec<u32>,
    /// Position of every key row in its original text, `[Σ k_lens]`.
    pub k_pos: Vec<u32>,
    /// Tree masks only ([`Mask::is_tree`]), `[Σ q_lens]`: the parent of each
    /// tree node as a node index local to its sequence, or [`TREE_ROOT`]. The
    /// keys of sequence `s` are `[committed prefix (k_lens[s] - q_lens[s]
    /// rows) | its q_lens[s] nodes]`.
    pub parents: Vec<u32>,
    /// Optional visibility restriction on the last keys of each sequence
    /// (see [`TreeTail`]); not combinable with a tree mask.
    pub tail: Option<TreeTail>,
}

/// Which of the last keys of each sequence each query row may see, as bits:
/// `lens[s]` tail keys for sequence `s`, `words` u32 per query row, bit `j`
/// of row `r` set iff the row may see tail key `j` of its sequence.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TreeTail {
    pub lens: Vec<usize>,
    pub bits: Vec<u32>,
    pub words: usize,
}

impl TreeTail {
    /// From per-sequence tail lengths and, for every query row (packed by
    /// sequence), the tail keys it may see.
    pub fn from_visible(lens: Vec<usize>, visible: &[Vec<usize>]) -> Result<TreeTail> {
        let words = bit_words(&lens);
        let mut bits = vec![0u32; visible.len() * words];
        for (row, keys) in visible.iter().enumerate() {
            for &j in keys {
                if j >= words * 32 {
                    return Err(OpsError::IndexOutOfRange {
                        op: "TreeTail",
                        arg: "visible",
                        position: row,
                        index: j as u64,
                        bound: words * 32,
                    });
                }
                bits[row * words + j / 32] |= 1 << (j % 32);
            }
        }
        Ok(TreeTail { lens, bits, words })
    }

    /// Whether query row `row` may see tail key `j`.
    pub fn sees(&self, row: usize, j: usize) -> bool {
        j / 32 < self.words && (self.bits[row * self.words + j / 32] >> (j % 32)) & 1 == 1
    }
}

impl SeqBatch {
    /// One sequence: `tq` queries that are the last `tq` of `tk` keys
    /// (prefill when `tq == tk`, decode when `tq == 1`); positions `0..tk`.
    pub fn single(tq: usize, tk: usize) -> Self {
        let k_pos: Vec<u32> = (0..tk as u32).collect();
        let q_pos = k_pos[tk.saturating_sub(tq)..].to_vec();
        SeqBatch {
            q_lens: vec![tq],
            k_lens: vec![tk],
            q_pos,
            k_pos,
            parents: Vec::new(),
            tail: None,
        }
    }

    /// `b` sequences of `l` rows each, positions `0..l` (draft-dim attention).
    pub fn uniform(b: usize, l: usize) -> Self {
        let pos: Vec<u32> = (0..b).flat_map(|_| 0..l as u32).collect();
        SeqBatch {
            q_lens: vec![l; b],
            k_lens: vec![l; b],
            q_pos: pos.clone(),
            k_pos: pos,
            parents: Vec::new(),
            tail: None,
        }
    }

    /// One sequence: a draft tree of `parents.len()` nodes over `committed`
    /// committed keys. Node positions are `committed + depth` (a root node has
    /// depth 0); this is also the RoPE position the target should use.
    pub fn tree(committed: usize, parents: &[u32]) -> Result<Self> {
        validate_parents("SeqBatch::tree", parents)?;
        let mut depth = vec![0u32; parents.len()];
        for (i, &p) in parents.iter().enumerate() {
            if p != TREE_ROOT {
                depth[i] = depth[p as usize] + 1;
            }
        }
        let q_pos: Vec<u32> = depth.iter().map(|d| committed as u32 + d).collect();
        let mut k_pos: Vec<u32> = (0..committed as u32).collect();
        k_pos.extend_from_slice(&q_pos);
        Ok(SeqBatch {
            q_lens: vec![parents.len()],
            k_lens: vec![committed + parents.len()],
            q_pos,
            k_pos,
            parents: parents.to_vec(),
            tail: None,
        })
    }

    /// Number of sequences.
    pub fn batch(&self) -> usize {
        self.q_lens.len()
    }

    /// Total query rows.
    pub fn total_q(&self) -> usize {
        self.q_lens.iter().sum()
    }

    /// Total key rows.
    pub fn total_k(&self) -> usize {
        self.k_lens.iter().sum()
    }

    /// First key row of every sequence plus the total, `[b + 1]`.
    pub fn k_starts(&self) -> Vec<usize> {
        prefix_sums(&self.k_lens)
    }

    /// First query row of every sequence plus the total, `[b + 1]`.
    pub fn q_starts(&self) -> Vec<usize> {
        prefix_sums(&self.q_lens)
    }

    /// Checks internal consistency for `mask`.
    pub fn validate(&self, op: &'static str, mask: &Mask) -> Result<()> {
        mask.validate(op)?;
        if self.q_lens.len() != self.k_lens.len() {
            return Err(OpsError::ShapeMismatch {
                op,
                arg: "k_lens",
                expected: format!("[{}] (one length per sequence)", self.q_lens.len()),
                found: vec![self.k_lens.len()],
            });
        }
        if self.batch() == 0 || self.total_q() == 0 {
            return Err(OpsError::EmptyInput {
                op,
                arg: "q_lens",
                shape: self.q_lens.clone(),
            });
        }
        if self.q_pos.len() != self.total_q() {
            return Err(len_err(op, "q_pos", self.total_q(), self.q_pos.len()));
        }
        if self.k_pos.len() != self.total_k() {
            return Err(len_err(op, "k_pos", self.total_k(), self.k_pos.len()));
        }
        if mask.is_tree() {
            if self.parents.len() != self.total_q() {
                return Err(len_err(op, "parents", self.total_q(), self.parents.len()));
            }
            let q_starts = self.q_starts();
            for s in 0..self.batch() {
                if self.k_lens[s] < self.q_lens[s] {
                    return Err(OpsError::InvalidArgument {
                        op,
                        reason: format!(
                            "tree mask: sequence {s} has {} nodes but only {} keys (keys are [committed | nodes])",
                            self.q_lens[s], self.k_lens[s]
                        ),
                    });
                }
                validate_parents(op, &self.parents[q_starts[s]..q_starts[s + 1]])?;
            }
        }
        if let Some(tail) = &self.tail {
            if mask.is_tree() {
                return Err(OpsError::InvalidArgument {
                    op,
                    reason: "a tree tail cannot be combined with a tree mask".into(),
                });
            }
            if tail.lens.len() != self.batch() {
                return Err(len_err(op, "tail.lens", self.batch(), tail.lens.len()));
            }
            for (s, (&t, &k)) in tail.lens.iter().zip(&self.k_lens).enumerate() {
                if t > k {
                    return Err(OpsError::InvalidArgument {
                        op,
                        reason: format!(
                            "tree tail: sequence {s} has {t} tail keys but only {k} keys"
                        ),
                    });
                }
            }
            let need = bit_words(&tail.lens);
            if tail.words < need {
                return Err(len_err(op, "tail.words", need, tail.words));
            }
            if tail.bits.len() != self.total_q() * tail.words {
                return Err(len_err(
                    op,
                    "tail.bits",
                    self.total_q() * tail.words,
                    tail.bits.len(),
                ));
            }
        }
        Ok(())
    }

    /// Tree keys at the end of sequence `s` (nodes for a tree mask, the
    /// tail for a [`TreeTail`], none otherwise).
    pub fn tree_keys(&self, s: usize, mask: &Mask) -> usize {
        match (&self.tail, mask) {
            (_, m) if m.is_tree() => self.q_lens[s].min(self.k_lens[s]),
            (Some(t), _) => t.lens[s],
            (None, _) => 0,
        }
    }

    /// The visibility bits of the tree keys (a tree mask: ancestors; a
    /// tail: its bits) and words per row; `None` when there are no tree keys.
    pub fn tree_bits(&self, mask: &Mask) -> Option<(Vec<u32>, usize)> {
        match (&self.tail, mask) {
            (_, m) if m.is_tree() => Some(self.ancestor_bits()),
            (Some(t), _) => Some((t.bits.clone(), t.words)),
            (None, _) => None,
        }
    }

    /// Tree mask as bits: `words` u32 per query row; bit `j` of row `r` is set
    /// iff node `j` (local to the row's sequence) is an ancestor of, or is,
    /// node `r`. Requires validated parents.
    pub fn ancestor_bits(&self) -> (Vec<u32>, usize) {
        let words = bit_words(&self.q_lens);
        let mut bits = vec![0u32; self.total_q() * words];
        let q_starts = self.q_starts();
        for (s, &q_len) in self.q_lens.iter().enumerate() {
            for node in 0..q_len {
                let row = q_starts[s] + node;
                let mut cur = node as u32;
                loop {
                    bits[row * words + cur as usize / 32] |= 1 << (cur % 32);
                    let p = self.parents[q_starts[s] + cur as usize];
                    if p == TREE_ROOT {
                        break;
                    }
                    cur = p;
                }
            }
        }
        (bits, words)
    }
}

/// Every parent must be [`TREE_ROOT`] or point backwards (`parent < node`).
pub fn validate_parents(op: &'static str, parents: &[u32]) -> Result<()> {
    for (i, &p) in parents.iter().enumerate() {
        if p != TREE_ROOT && p as usize >= i {
            return Err(OpsError::IndexOutOfRange {
                op,
                arg: "parents",
                position: i,
                index: p as u64,
                bound: i,
            });
        }
    }
    Ok(())
}

/// u32 words of tree bits a row needs to cover the longest of `lens`
/// (at least one).
fn bit_words(lens: &[usize]) -> usize {
    lens.iter().copied().max().unwrap_or(0).div_ceil(32).max(1)
}

fn prefix_sums(lens: &[usize]) -> Vec<usize> {
    let mut out = Vec::with_capacity(lens.len() + 1);
    let mut acc = 0;
    out.push(0);
    for &l in lens {
        acc += l;
        out.push(acc);
    }
    out
}

fn len_err(op: &'static str, arg: &'static str, expected: usize, found: usize) -> OpsError {
    OpsError::ShapeMismatch {
        op,
        arg,
        expected: format!("[{expected}]"),
        found: vec![found],
    }
}
