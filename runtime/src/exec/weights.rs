//! Weights on the host ([`HostWeights`]): deterministic random weights for
//! drafters without trained ones (`--drafter-weights random:SEED`) and for
//! tests, or tensors read from a converted model's safetensors file; and the
//! check of a plan's weight table against them (every missing tensor, wrong
//! shape or dtype named before anything is launched).

use std::collections::BTreeMap;

use draftc_codegen::bind::{self, AvailableTensor, BindError, WeightSpec};

use crate::model::ConvertedModel;

/// Named f32 tensors with their shapes.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HostWeights {
    pub tensors: BTreeMap<String, (Vec<usize>, Vec<f32>)>,
}

/// SplitMix64: a tiny, well-known deterministic generator (random weights
/// must be identical on every machine).
pub(crate) struct SplitMix(u64);

impl SplitMix {
    pub(crate) fn new(seed: u64) -> SplitMix {
        SplitMix(seed ^ 0x9E37_79B9_7F4A_7C15)
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[-1, 1)`.
    pub(crate) fn symmetric(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
}

/// `layers.{i}.rest` → `(i, rest)`.
fn layer_index(name: &str) -> Option<(usize, &str)> {
    let rest = name.strip_prefix("layers.")?;
    let (i, rest) = rest.split_once('.')?;
    Some((i.parse().ok()?, rest))
}

/// Target tensors a drafter tensor may be initialised from, in order of
/// preference: with `drafter_layers` layers of its own, the drafter's
/// `layers.{i}.rest` is the target's `model.layers.{target_layers -
/// drafter_layers + i}.rest`; any name `x` may be `model.x` or `x`; the LM
/// head may be the tied embedding.
pub fn pruned_sources(name: &str, drafter_layers: usize, target_layers: usize) -> Vec<String> {
    let mut out = Vec::new();
    if let Some((i, rest)) = layer_index(name) {
        if let Some(j) = (target_layers + i).checked_sub(drafter_layers) {
            out.push(format!("model.layers.{j}.{rest}"));
        }
        return out;
    }
    out.push(format!("model.{name}"));
    out.push(name.to_string());
    if name == "lm_head.weight" {
        out.push("model.embed_tokens.weight".into());
    }
    out
}

fn name_seed(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    })
}

impl HostWeights {
    /// Deterministic random weights for `specs`: a reduced draft
    /// vocabulary's ids the first `n` tokens, norm scales `1 ± 0.1`,
    /// biases `± 0.02`, layer-sum logits `± 0.5`, matrices uniform in
    /// `± 1/√fan_in` (so activations keep their scale through deep graphs).
    /// Each tensor depends only on `seed` and its name.
    pub fn random(specs: &[WeightSpec], seed: u64) -> HostWeights {
        let mut tensors = BTreeMap::new();
        for s in specs {
            let shape: Vec<usize> = s.shape.iter().map(|&d| d.max(0) as usize).collect();
            let n: usize = shape.iter().product();
            let mut rng = SplitMix::new(seed ^ name_seed(&s.name));
            let lname = s.name.to_ascii_lowercase();
            let data: Vec<f32> = if s.name == bind::DRAFT_VOCAB_IDS {
                // A reduced draft vocabulary's ids: the first n tokens.
                (0..n).map(|i| i as f32).collect()
            } else if lname.contains("norm") {
                (0..n).map(|_| 1.0 + 0.1 * rng.symmetric()).collect()
            } else if lname.ends_with("bias") {
                (0..n).map(|_| 0.02 * rng.symmetric()).collect()
            } else if shape.len() == 1 {
                (0..n).map(|_| 0.5 * rng.symmetric()).collect()
            } else {
                let fan_in = *shape.last().unwrap_or(&1) as f32;
                let a = 1.0 / fan_in.max(1.0).sqrt();
                (0..n).map(|_| a * rng.symmetric()).collect()
            };
            tensors.insert(s.name.clone(), (shape, data));
        }
        HostWeights { tensors }
    }

    /// The tensors `specs` names, read from a converted model (f32).
    pub fn from_model(model: &ConvertedModel, specs: &[WeightSpec]) -> crate::model::Result<Self> {
        let mut tensors = BTreeMap::new();
        for s in specs {
            if tensors.contains_key(&s.name) {
                continue;
            }
            let shape: Vec<u64> = s.shape.iter().map(|&d| d as u64).collect();
            let data = model.weights.tensor_f32(&s.name, &shape)?;
            let shape = shape.iter().map(|&d| d as usize).collect();
            tensors.insert(s.name.clone(), (shape, data));
        }
        Ok(HostWeights { tensors })
    }

    /// Pruned initialisation (paper 004 §3.2): every drafter tensor that has
    /// a counterpart in the target checkpoint with the same shape is copied
    /// from it ([`pruned_sources`]: the drafter's `layers.{i}` are the
    /// target's last layers in order, other names are looked up under
    /// `model.`, a missing LM head is the tied embedding); the rest are
    /// [`HostWeights::random`] with `seed`.
    pub fn pruned(
        specs: &[WeightSpec],
        model: &ConvertedModel,
        seed: u64,
    ) -> crate::model::Result<HostWeights> {
        let mut out = HostWeights::random(specs, seed);
        let drafter_layers = specs
            .iter()
            .filter_map(|s| layer_index(&s.name))
            .map(|(i, _)| i + 1)
            .max()
            .unwrap_or(0);
        let target_layers = model.config.num_hidden_layers;
        for s in specs {
            let shape: Vec<u64> = s.shape.iter().map(|&d| d as u64).collect();
            for src in pruned_sources(&s.name, drafter_layers, target_layers) {
                let fits = model
                    .weights
                    .shape(&src)
                    .is_ok_and(|found| found.iter().copied().eq(shape.iter().copied()));
                if fits {
                    let data = model.weights.tensor_f32(&src, &shape)?;
                    let dims = shape.iter().map(|&d| d as usize).collect();
                    out.tensors.insert(s.name.clone(), (dims, data));
                    break;
                }
            }
        }
        Ok(out)
    }

    /// Merge `other` in (drafter weights plus the target tensors it shares).
    pub fn extend(&mut self, other: HostWeights) {
        self.tensors.extend(other.tensors);
    }

    /// What these weights offer, as codegen's binder sees it.
    pub fn available(&self) -> Vec<AvailableTensor> {
        self.tensors
            .iter()
            .map(|(name, (shape, _))| AvailableTensor {
                name: name.clone(),
                shape: shape.iter().map(|&d| d as i64).collect(),
                dtype: "F32".into(),
            })
            .collect()
    }

    /// Every problem of `table` against these weights, before any launch.
    pub fn check(&self, table: &[WeightSpec]) -> Result<(), Vec<BindError>> {
        // Host weights are f32 and converted to the plan's dtype on upload.
        let table: Vec<WeightSpec> = table
            .iter()
            .map(|s| WeightSpec {
                dtype: draftc_codegen::PlanDType::F32,
                ..s.clone()
            })
            .collect();
        bind::check(&table, &self.available())
    }

    pub fn get(&self, name: &str) -> Option<&(Vec<usize>, Vec<f32>)> {
        self.tensors.get(name)
    }
}

#[cfg(test)]
mod tests {
    use super::pruned_sources;

    #[test]
    fn pruned_sources_take_the_last_layers_in_order() {
        assert_eq!(
            pruned_sources("layers.0.self_attn.q_proj.weight", 2, 30),
            vec!["model.layers.28.self_attn.q_proj.weight"]
        );
        assert_eq!(
            pruned_sources("layers.1.mlp.up_proj.weight", 2, 30),
            vec!["model.layers.29.mlp.up_proj.weight"]
        );
        assert_eq!(
            pruned_sources("embed_tokens.weight", 2, 30),
            vec!["model.embed_tokens.weight", "embed_tokens.weight"]
        );
        assert_eq!(
            pruned_sources("lm_head.weight", 2, 30)
                .last()
                .map(String::as_str),
            Some("model.embed_tokens.weight")
        );
        // More drafter layers than the target has: nothing to copy.
        assert!(pruned_sources("layers.0.x.weight", 40, 30).is_empty());
    }
}
