//! What one forward pass processes, shared by the executor and the
//! interpreter: per sequence, its cache slot, the positions of its new rows
//! (and, for tree verification, their parents), plus new memory rows; and
//! [`HostTensor`], the host-side value type.

use std::collections::BTreeMap;

/// One sequence's part of a pass.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SeqStep {
    /// Cache slot of the sequence (row block `slot · capacity` of every cache).
    pub slot: usize,
    /// Text position of each new row (RoPE and mask positions).
    pub positions: Vec<u32>,
    /// Tree verification: parent of each new row (local index, or
    /// `draftc_ops::attention::TREE_ROOT`). Causal attentions over a cache
    /// then use the tree mask, sliding-window ones the tree mask over their
    /// window.
    pub parents: Option<Vec<u32>>,
    /// Tree drafting over memory streams: which of the last memory rows
    /// (draft states of earlier tree levels) each new row may see.
    pub memory_tail: Option<MemoryTail>,
}

/// An input of [`crate::exec::Executor::run`] that no plan names: the
/// bits of this pass's [`MemoryTail`]s, `[rows, words]` u32 on the device
/// (`draftc_ops::attention::TreeTail`'s layout, words as
/// [`Step::memory_tree_tail`] gives them). When given, they replace the
/// bits of the steps' `visible` lists, whose lengths still count: a
/// drafter that expands its tree on the device (`draftc_ops::tree_frontier`)
/// knows each row's ancestors only there.
pub const MEMORY_TAIL_BITS: &str = "#memory tail bits";

/// An input of [`crate::exec::Executor::run`] that no plan names, uploaded
/// by the executor itself in a pass with memory rows: the positions of the
/// step's rows, `[rows]` u32 (its queries' RoPE reads them; the step
/// upload holds the memory rows' positions).
pub const STEP_POSITIONS: &str = "#step positions";

/// The last `len` rows of every memory cache of a sequence are states
/// drafted this round; row `i` of the pass may see those listed in
/// `visible[i]` (indices into the tail: its ancestors' states). The memory
/// mask still applies; committed rows are not restricted. In a pass with no
/// memory rows at all, the tail is the drafter's own cache instead (EAGLE:
/// `len` counts this pass's rows too, and a row sees its own).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemoryTail {
    pub len: usize,
    pub visible: Vec<Vec<usize>>,
}

impl SeqStep {
    /// `n` new rows at positions `start..start + n`.
    pub fn chain(slot: usize, start: u32, n: usize) -> SeqStep {
        SeqStep {
            slot,
            positions: (start..start + n as u32).collect(),
            parents: None,
            memory_tail: None,
        }
    }
}

/// New rows of a memory stream (Beagle states, SPIRe feedback memory) for
/// one pass: `data` is `[Σ lens, d]`, packed by sequence in step order. The
/// executor also takes the rows as a device tensor: an input named after the
/// stream (`states`, `mem[0]`) replaces `data`, which may then be empty.
#[derive(Clone, Debug, PartialEq)]
pub struct MemoryRows {
    pub data: Vec<f32>,
    pub lens: Vec<usize>,
    /// Text position of every row.
    pub positions: Vec<u32>,
}

/// One forward pass over a batch: rows of all sequences are packed in order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Step {
    pub seqs: Vec<SeqStep>,
    /// New memory rows by stream name as printed (`states`, `mem[0]`).
    pub memory: BTreeMap<String, MemoryRows>,
    /// The rows (packed indices, in this order) whose graph outputs the
    /// caller reads, e.g. only a prompt chunk's last row needs `logits`:
    /// every graph output is then `[output_rows.len(), …]`, and a linear
    /// that writes one (the LM head) runs on those rows alone. `None`: every
    /// row. Emitted streams (`hidden[i]`) and appends always cover every row.
    pub output_rows: Option<Vec<u32>>,
}

impl Step {
    /// Total new rows.
    pub fn rows(&self) -> usize {
        self.seqs.iter().map(|s| s.positions.len()).sum()
    }

    /// The new memory rows that cache `cache` takes in this pass, when it
    /// is a memory stream's cache (`<stream>.kv`) and the stream has rows.
    pub fn memory_rows_of(&self, cache: &str) -> Option<&MemoryRows> {
        self.memory.get(cache.strip_suffix(".kv")?)
    }

    /// Positions of all rows, packed.
    pub fn positions(&self) -> Vec<u32> {
        self.seqs
            .iter()
            .flat_map(|s| s.positions.iter().copied())
            .collect()
    }

    /// New rows per sequence.
    pub fn lens(&self) -> Vec<usize> {
        self.seqs.iter().map(|s| s.positions.len()).collect()
    }

    pub fn is_tree(&self) -> bool {
        self.seqs.iter().any(|s| s.parents.is_some())
    }

    /// The batch of an attention over a cache whose sequences hold
    /// `k_lens` keys at `k_pos` (packed), and its mask: in a tree pass a
    /// causal attention that does not read a memory stream (`memory`) uses
    /// the tree mask, and a sliding-window one (Gemma 3's local layers) the
    /// tree mask within its window, each with every row's parent (a
    /// sequence without a tree is a chain: root, then each row's
    /// predecessor) — a sliding-window mask alone would let a node see the
    /// nodes of sibling branches inside its window; the memory tail applies
    /// to memory attention and to a drafter's own cache drafting a tree
    /// (EAGLE: no memory rows). The executor and the interpreter both build
    /// it here.
    pub fn cache_batch(
        &self,
        mask: draftc_ops::attention::Mask,
        k_lens: Vec<usize>,
        k_pos: Vec<u32>,
        memory: bool,
    ) -> Result<(draftc_ops::attention::SeqBatch, draftc_ops::attention::Mask), draftc_ops::OpsError>
    {
        use draftc_ops::attention::{Mask, SeqBatch, TREE_ROOT};
        let mask = match mask {
            _ if !self.is_tree() || memory => mask,
            Mask::Causal => Mask::Tree,
            Mask::SlidingSink { window, sink } => Mask::TreeSliding { window, sink },
            _ => mask,
        };
        let mut parents = Vec::new();
        if mask.is_tree() {
            for seq in &self.seqs {
                match &seq.parents {
                    Some(p) => parents.extend_from_slice(p),
                    None => parents.extend((0..seq.positions.len() as u32).map(|i| {
                        if i == 0 {
                            TREE_ROOT
                        } else {
                            i - 1
                        }
                    })),
                }
            }
        }
        let own_tail = self.memory.is_empty() && self.seqs.iter().any(|s| s.memory_tail.is_some());
        let batch = SeqBatch {
            q_lens: self.lens(),
            k_lens,
            q_pos: self.positions(),
            k_pos,
            parents,
            tail: if memory || own_tail {
                self.memory_tree_tail()?
            } else {
                None
            },
        };
        Ok((batch, mask))
    }

    /// The tree tail of memory attention for this pass (`None` when no
    /// sequence has one), packed over the rows in step order.
    pub fn memory_tree_tail(
        &self,
    ) -> Result<Option<draftc_ops::attention::TreeTail>, draftc_ops::OpsError> {
        if self.seqs.iter().all(|s| s.memory_tail.is_none()) {
            return Ok(None);
        }
        let mut lens = Vec::with_capacity(self.seqs.len());
        let mut visible = Vec::with_capacity(self.rows());
        for s in &self.seqs {
            match &s.memory_tail {
                Some(t) => {
                    lens.push(t.len);
                    for i in 0..s.positions.len() {
                        visible.push(t.visible.get(i).cloned().unwrap_or_default());
                    }
                }
                None => {
                    lens.push(0);
                    visible.extend((0..s.positions.len()).map(|_| Vec::new()));
                }
            }
        }
        draftc_ops::attention::TreeTail::from_visible(lens, &visible).map(Some)
    }
}

/// A host tensor: row-major f32 or u32 data with its shape.
#[derive(Clone, Debug, PartialEq)]
pub enum HostTensor {
    F32 { shape: Vec<usize>, data: Vec<f32> },
    U32 { shape: Vec<usize>, data: Vec<u32> },
}

impl HostTensor {
    pub fn f32(shape: Vec<usize>, data: Vec<f32>) -> HostTensor {
        debug_assert_eq!(shape.iter().product::<usize>(), data.len());
        HostTensor::F32 { shape, data }
    }

    pub fn u32(shape: Vec<usize>, data: Vec<u32>) -> HostTensor {
        debug_assert_eq!(shape.iter().product::<usize>(), data.len());
        HostTensor::U32 { shape, data }
    }

    pub fn shape(&self) -> &[usize] {
        match self {
            HostTensor::F32 { shape, .. } | HostTensor::U32 { shape, .. } => shape,
        }
    }

    pub fn numel(&self) -> usize {
        self.shape().iter().product()
    }

    /// The data as f32 (u32 converted).
    pub fn to_f32(&self) -> Vec<f32> {
        match self {
            HostTensor::F32 { data, .. } => data.clone(),
            HostTensor::U32 { data, .. } => data.iter().map(|&x| x as f32).collect(),
        }
    }
}

/// Named host inputs of a pass (graph input node name → tensor).
pub type Inputs = BTreeMap<String, HostTensor>;
