//! A drafter's reduced draft vocabulary (`draft_vocab N`, as EAGLE-3 does):
//! the target token ids it predicts over, the rows of the target's LM head
//! it reads, and the map from draft ids back to target ids.
//!
//! The ids ship in the drafter's weights file as `draft_vocab.ids` (`[N]`
//! integers; draft id `i` is target id `ids[i]`). The head rows
//! (`draft_vocab.lm_head`, `[N, d]`) are never stored: [`DraftVocab::bind`]
//! gathers them from the target's head when the drafter is built. Tokens
//! outside the subset are never drafted. Verification is the target's and
//! drafts are deterministic (a point-mass proposal), so greedy and sampled
//! outputs are exactly those of the target with any subset.

use draftc_codegen::bind::{WeightSpec, DRAFT_VOCAB_HEAD, DRAFT_VOCAB_IDS};
use draftc_ir::Graph;

use super::HostWeights;

/// The target ids of a reduced draft vocabulary, in draft-id order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DraftVocab {
    ids: Vec<u32>,
}

impl DraftVocab {
    /// Checks `ids` against a target vocabulary of `vocab` tokens: non-empty,
    /// every id inside it, no id twice.
    pub fn new(ids: Vec<u32>, vocab: usize) -> Result<DraftVocab, String> {
        if ids.is_empty() {
            return Err(format!("`{DRAFT_VOCAB_IDS}` is empty"));
        }
        let mut seen = vec![false; vocab];
        for (i, &id) in ids.iter().enumerate() {
            match seen.get_mut(id as usize) {
                None => {
                    return Err(format!(
                        "`{DRAFT_VOCAB_IDS}`[{i}] = {id} is outside the target's vocabulary \
                         of {vocab} tokens"
                    ))
                }
                Some(true) => return Err(format!("`{DRAFT_VOCAB_IDS}`[{i}] = {id} appears twice")),
                Some(s) => *s = true,
            }
        }
        Ok(DraftVocab { ids })
    }

    /// The subset a drafter's weights carry (`draft_vocab.ids`), or `None`
    /// when the drafter predicts over the whole vocabulary of `vocab` tokens.
    pub fn of(graph: &Graph, weights: &HostWeights, vocab: usize) -> Result<Option<Self>, String> {
        let Some(n) = graph.meta.reduced_vocab(vocab as i64) else {
            return Ok(None);
        };
        let (shape, data) = weights.get(DRAFT_VOCAB_IDS).ok_or_else(|| {
            format!(
                "drafter `{}` has `draft_vocab {n}` but its weights have no `{DRAFT_VOCAB_IDS}` \
                 (the target ids of its vocabulary)",
                graph.name
            )
        })?;
        if shape.as_slice() != [n as usize] {
            return Err(format!(
                "`{DRAFT_VOCAB_IDS}` has shape {shape:?}, expected [{n}] (`draft_vocab {n}`)"
            ));
        }
        let mut ids = Vec::with_capacity(data.len());
        for (i, &x) in data.iter().enumerate() {
            if !(x >= 0.0 && x.fract() == 0.0 && x < u32::MAX as f32) {
                return Err(format!("`{DRAFT_VOCAB_IDS}`[{i}] = {x} is not a token id"));
            }
            ids.push(x as u32);
        }
        DraftVocab::new(ids, vocab).map(Some)
    }

    /// The target ids, in draft-id order (the map a device lookup applies,
    /// `draftc_ops::embedding::lookup_u32`).
    pub fn ids(&self) -> &[u32] {
        &self.ids
    }

    /// The target id of draft id `draft`. An id past the subset (only a
    /// faulty selection could produce one) maps to the subset's first token:
    /// a valid id that verification may reject.
    pub fn to_target(&self, draft: u32) -> u32 {
        self.ids.get(draft as usize).copied().unwrap_or(self.ids[0])
    }

    /// Replaces the draft ids of candidate lists by target ids.
    pub fn map_candidates(&self, cands: &mut [Vec<(u32, f32)>]) {
        for (t, _) in cands.iter_mut().flatten() {
            *t = self.to_target(*t);
        }
    }

    /// Puts the ids into `weights` as `draft_vocab.ids` (f32, exact below
    /// 2^24): all a drafter with a head of its own needs.
    pub fn put_ids(&self, weights: &mut HostWeights) {
        weights.tensors.insert(
            DRAFT_VOCAB_IDS.to_string(),
            (
                vec![self.ids.len()],
                self.ids.iter().map(|&i| i as f32).collect(),
            ),
        );
    }

    /// Puts the subset into `weights`: `draft_vocab.ids` (as f32, exact
    /// below 2^24) and `draft_vocab.lm_head`, the rows of `head` (the
    /// target's LM head, `[v, d]`) in draft-id order.
    pub fn bind(
        &self,
        weights: &mut HostWeights,
        head: &(Vec<usize>, Vec<f32>),
    ) -> Result<(), String> {
        let (shape, data) = head;
        let [v, d] = shape.as_slice() else {
            return Err(format!(
                "the target's LM head has shape {shape:?}, expected [v, d]"
            ));
        };
        if data.len() != v * d {
            return Err(format!(
                "the target's LM head holds {} values, not {v} × {d}",
                data.len()
            ));
        }
        let mut rows = Vec::with_capacity(self.ids.len() * d);
        for &id in &self.ids {
            let id = id as usize;
            if id >= *v {
                return Err(format!(
                    "draft vocabulary id {id} is outside the target's LM head ({v} rows)"
                ));
            }
            rows.extend_from_slice(&data[id * d..(id + 1) * d]);
        }
        self.put_ids(weights);
        weights.tensors.insert(
            DRAFT_VOCAB_HEAD.to_string(),
            (vec![self.ids.len(), *d], rows),
        );
        Ok(())
    }
}

/// The tensors a weights file holds for `specs` (a plan's weight table)
/// of a drafter with a reduced vocabulary of `reduced` tokens: its ids
/// (`draft_vocab.ids`, `[N]`) always, in place of the derived head rows
/// (`draft_vocab.lm_head`, `[N, d]`) where it reads the target's head.
/// Returns whether the head rows are to be gathered from the target's
/// head ([`DraftVocab::bind`]); a drafter with a head of its own (EAGLE-3's
/// `lm_head`) reads none.
pub fn file_specs(specs: &mut Vec<WeightSpec>, reduced: Option<i64>) -> bool {
    let mut gathers = false;
    for s in specs.iter_mut().filter(|s| s.name == DRAFT_VOCAB_HEAD) {
        s.name = DRAFT_VOCAB_IDS.into();
        s.shape.truncate(1);
        gathers = true;
    }
    if let (Some(n), false) = (reduced, gathers) {
        specs.push(WeightSpec {
            name: DRAFT_VOCAB_IDS.into(),
            shape: vec![n],
            dtype: draftc_codegen::PlanDType::F32,
        });
    }
    gathers
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_checked_and_mapped() {
        assert!(DraftVocab::new(vec![], 10).is_err());
        assert!(DraftVocab::new(vec![3, 10], 10)
            .unwrap_err()
            .contains("outside"));
        assert!(DraftVocab::new(vec![3, 3], 10)
            .unwrap_err()
            .contains("twice"));
        let v = DraftVocab::new(vec![7, 2, 5], 10).unwrap();
        assert_eq!(v.to_target(0), 7);
        assert_eq!(v.to_target(2), 5);
        assert_eq!(v.to_target(9), 7);
        let mut c = vec![vec![(1, 0.5), (0, 0.1)]];
        v.map_candidates(&mut c);
        assert_eq!(c, vec![vec![(2, 0.5), (7, 0.1)]]);
    }

    #[test]
    fn bind_gathers_the_head_rows_in_draft_order() {
        let head = (vec![4, 2], vec![0., 1., 10., 11., 20., 21., 30., 31.]);
        let mut w = HostWeights::default();
        DraftVocab::new(vec![3, 1], 4)
            .unwrap()
            .bind(&mut w, &head)
            .unwrap();
        assert_eq!(w.get(DRAFT_VOCAB_HEAD).unwrap().1, vec![30., 31., 10., 11.]);
        assert_eq!(w.get(DRAFT_VOCAB_IDS).unwrap(), &(vec![2], vec![3., 1.]));
        assert!(DraftVocab::new(vec![3], 9)
            .unwrap()
            .bind(&mut w, &(vec![2, 2], vec![0.; 4]))
            .is_err());
    }
}
