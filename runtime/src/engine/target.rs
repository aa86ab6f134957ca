//! The target model: a converted checkpoint's `config.json` becomes a
//! [`TargetConfig`], `models/llama.draft` (compiled into the binary)
//! becomes the graph, its plan runs on the [`Executor`] with the
//! checkpoint's weights, and one [`CacheStore`] holds every sequence's KV
//! cache (contiguous per sequence, `capacity` rows each; see
//! `exec/mod.rs`). Prompts are prefilled in passes of at most
//! [`TargetModel::max_rows`] rows (the logits of a pass are
//! `rows × vocab` floats and must fit one binding).

use std::collections::BTreeMap;

use cubecl::prelude::*;
use draftc_codegen::{PlanDType, TargetWeights};
use draftc_ir::{Graph, TargetConfig};
use draftc_ops::{DType, DeviceTensor};

use crate::exec::{CacheStore, ExecError, Executor, HostWeights, Outputs, SeqStep, Step};
use crate::model::config::LlamaConfig;
use crate::model::{ConvertedModel, ModelError};

/// The target model family, compiled into the binary.
pub const LLAMA_DRAFT: &str = include_str!("../../../models/llama.draft");

/// The target families a checkpoint's `model_type` selects: each a model
/// description in `models/`, built into the binary.
pub const FAMILIES: &[(&str, &str)] = &[
    ("llama", LLAMA_DRAFT),
    ("qwen2", include_str!("../../../models/qwen2.draft")),
    ("qwen3", include_str!("../../../models/qwen3.draft")),
    ("gemma3", include_str!("../../../models/gemma3.draft")),
];

/// Why generation failed.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Exec(#[from] ExecError),
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Ops(#[from] draftc_ops::OpsError),
    #[error("{0}")]
    Graph(String),
    #[error("{0}")]
    Invalid(String),
}

/// The family (model file) of a checkpoint's `model_type`: its own name,
/// except Gemma 3's text model (`gemma3_text`), whose file is `gemma3`.
pub fn family_of(model_type: &str) -> &str {
    match model_type {
        "gemma3_text" => "gemma3",
        other => other,
    }
}

/// The description-language view of a checkpoint's hyper-parameters.
pub fn target_config(c: &LlamaConfig) -> TargetConfig {
    let mut t = TargetConfig {
        name: c.model_type.clone(),
        family: family_of(&c.model_type).into(),
        ..TargetConfig::default()
    };
    for (k, v) in [
        ("n", c.num_hidden_layers),
        ("d", c.hidden_size),
        ("h", c.num_attention_heads),
        ("hkv", c.num_key_value_heads),
        ("hd", c.head_dim),
        ("f", c.intermediate_size),
        ("v", c.vocab_size),
        ("max_context", c.max_position_embeddings),
    ] {
        t.ints.insert(k.into(), v as i64);
    }
    t.floats.insert("theta".into(), c.rope_theta);
    t.floats.insert("eps".into(), c.rms_norm_eps);
    t.flags
        .insert("tied_embeddings".into(), c.tie_word_embeddings);
    t.flags
        .insert("rope_llama3".into(), c.rope_scaling.is_some());
    if let Some(g) = &c.gemma {
        // Gemma 3: the embedding scale √d (f32, as transformers' buffer),
        // each layer's window and RoPE base, the scores' scale.
        t.floats.insert(
            "embed_scale".into(),
            (c.hidden_size as f64).sqrt() as f32 as f64,
        );
        t.floats
            .insert("local_theta".into(), g.rope_local_base_freq);
        t.floats
            .insert("attn_scale".into(), g.query_pre_attn_scalar.powf(-0.5));
        t.ints.insert("window".into(), g.sliding_window as i64);
        for i in 0..c.num_hidden_layers {
            t.flags.insert(format!("sliding[{i}]"), g.sliding(i));
        }
    }
    if let Some(s) = &c.rope_scaling {
        t.floats.insert("rope_factor".into(), s.factor);
        t.floats
            .insert("rope_low_freq_factor".into(), s.low_freq_factor);
        t.floats
            .insert("rope_high_freq_factor".into(), s.high_freq_factor);
        t.ints.insert(
            "rope_original_context".into(),
            s.original_max_position_embeddings as i64,
        );
    }
    t
}

/// The target, ready to run passes over a batch of sequences.
pub struct TargetModel<R: Runtime> {
    pub exec: Executor<R>,
    pub caches: CacheStore<R>,
    pub graph: Graph,
    pub target_config: TargetConfig,
    pub weights: TargetWeights,
    pub vocab: usize,
    /// The ids that end a sequence (the checkpoint's eos ids).
    pub eos: Vec<u32>,
    /// Rows per pass at most (prefill chunking).
    pub max_rows: usize,
}

struct NoFiles;
impl draftc_ir::Resolver for NoFiles {
    fn resolve(&self, _: &str) -> Option<(String, String)> {
        None
    }
}

/// Compiles the family's model file (`models/{cfg.family}.draft`) for `cfg`.
pub fn compile_target(cfg: &TargetConfig) -> Result<Graph, EngineError> {
    let family = cfg.family.as_str();
    let Some((_, src)) = FAMILIES.iter().find(|(name, _)| *name == family) else {
        let known: Vec<&str> = FAMILIES.iter().map(|(n, _)| *n).collect();
        return Err(EngineError::Graph(format!(
            "no model file for the target family `{family}` (known: {})",
            known.join(", ")
        )));
    };
    draftc_ir::compile(src, cfg, &BTreeMap::new(), &NoFiles).map_err(|d| {
        EngineError::Graph(format!(
            "models/{family}.draft does not compile for this checkpoint: {}",
            d.iter()
                .map(|x| x.message.clone())
                .collect::<Vec<_>>()
                .join("; ")
        ))
    })
}

impl<R: Runtime> TargetModel<R> {
    /// Loads a converted checkpoint for `slots` sequences of up to
    /// `capacity` tokens each.
    pub fn load(
        client: &ComputeClient<R>,
        model: &ConvertedModel,
        slots: usize,
        capacity: usize,
        dtype: PlanDType,
    ) -> Result<Self, EngineError> {
        let cfg = target_config(&model.config);
        let graph = compile_target(&cfg)?;
        let tw = TargetWeights::new(&cfg, &graph.meta.exports);
        let specs = weight_specs(&graph, &tw)?;
        let weights = HostWeights::from_model(model, &specs)?;
        let mut t = Self::from_parts(client, graph, cfg, weights, slots, capacity, dtype)?;
        t.eos = model.config.eos_token_id.clone();
        Ok(t)
    }

    /// A target from a compiled graph and host weights (tests use tiny random ones).
    pub fn from_parts(
        client: &ComputeClient<R>,
        graph: Graph,
        target_config: TargetConfig,
        weights: HostWeights,
        slots: usize,
        capacity: usize,
        dtype: PlanDType,
    ) -> Result<Self, EngineError> {
        let tw = TargetWeights::new(&target_config, &graph.meta.exports).with_final_norm_of(&graph);
        let exec = Executor::new(client, &graph, &tw, &weights, dtype, true)?;
        let ops_dtype = exec.dtype();
        let vocab = target_config.int("v").unwrap_or(0) as usize;
        // Keep one pass's logits within a 128 MiB binding.
        let max_rows = super::drafters::rows_within_binding(vocab, ops_dtype).min(512);
        Ok(TargetModel {
            exec,
            caches: CacheStore::new(client, slots, capacity, ops_dtype),
            graph,
            target_config,
            weights: tw,
            vocab,
            eos: Vec::new(),
            max_rows,
        })
    }

    pub fn client(&self) -> &ComputeClient<R> {
        self.exec.client()
    }

    /// Committed tokens of the sequence in `slot`.
    pub fn len(&self, slot: usize) -> usize {
        self.caches.len("kv[0]", slot)
    }

    /// One pass: `ids` packed in step order.
    pub fn forward(&mut self, step: &Step, ids: &[u32]) -> Result<Outputs<R>, EngineError> {
        self.check_ids(step, ids, ids.len())?;
        // The pass uploads the ids itself: a replayed pass writes them into
        // the buffer it recorded (`exec/replay.rs`).
        let none = BTreeMap::new();
        Ok(self
            .exec
            .run_uploading(step, &[("ids", ids)], &none, &mut self.caches, None)?)
    }

    /// Fails unless `ids` (and `on_device` ids on the device) fit the step
    /// and the vocabulary.
    fn check_ids(&self, step: &Step, ids: &[u32], on_device: usize) -> Result<(), EngineError> {
        if ids.len() != step.rows() || on_device != ids.len() {
            return Err(EngineError::Invalid(format!(
                "{} ids ({on_device} on the device) for a pass of {} rows",
                ids.len(),
                step.rows()
            )));
        }
        if let Some(&bad) = ids.iter().find(|&&i| i as usize >= self.vocab) {
            return Err(EngineError::Invalid(format!(
                "token id {bad} is outside the vocabulary (size {})",
                self.vocab
            )));
        }
        Ok(())
    }

    /// [`Self::forward`] with the ids already on the device as `dev` (the
    /// previous step's selection, so a decode step uploads no ids); `ids`
    /// is their host copy, checked as in [`Self::forward`].
    pub fn forward_on_device(
        &mut self,
        step: &Step,
        ids: &[u32],
        dev: DeviceTensor<R>,
    ) -> Result<Outputs<R>, EngineError> {
        if dev.dtype() != DType::U32 {
            return Err(EngineError::Invalid("ids on the device must be u32".into()));
        }
        self.check_ids(step, ids, dev.numel())?;
        let inputs = BTreeMap::from([("ids".to_string(), dev)]);
        Ok(self.exec.run(step, &inputs, &mut self.caches, None)?)
    }

    /// Rows `rows` (packed indices) of a `[_, width]` output, as `[rows.len(), width]`.
    pub fn gather(
        &self,
        t: &DeviceTensor<R>,
        rows: &[u32],
    ) -> Result<DeviceTensor<R>, EngineError> {
        let width = *t.shape().last().unwrap_or(&1);
        let all = t.reshape(&[t.numel() / width, width])?;
        let out = DeviceTensor::empty(self.client(), &[rows.len(), width], t.dtype());
        let dst: Vec<u32> = (0..rows.len() as u32).collect();
        draftc_ops::kv::gather_rows(self.client(), &all, rows, &out, &dst)?;
        Ok(out)
    }

    /// Prefills `prompts` (slot, ids) in passes of at most `max_rows` rows;
    /// returns the logits of every prompt's last position, `[prompts, vocab]`
    /// in `prompts` order, and the passes run.
    pub fn prefill(
        &mut self,
        prompts: &[(usize, Vec<u32>)],
        mut on_pass: impl FnMut(&Outputs<R>, &Step, &[u32]) -> Result<(), EngineError>,
    ) -> Result<(DeviceTensor<R>, usize), EngineError> {
        if prompts.iter().any(|(_, p)| p.is_empty()) {
            return Err(EngineError::Invalid("an empty prompt".into()));
        }
        let mut done = vec![0usize; prompts.len()];
        let last = DeviceTensor::<R>::empty(
            self.client(),
            &[prompts.len(), self.vocab],
            self.exec.dtype(),
        );
        let mut passes = 0;
        while done.iter().zip(prompts).any(|(d, (_, p))| *d < p.len()) {
            let mut step = Step::default();
            let mut ids = Vec::new();
            let mut finishing = Vec::new();
            for (i, (slot, p)) in prompts.iter().enumerate() {
                let room = self.max_rows - ids.len();
                if done[i] >= p.len() || room == 0 {
                    continue;
                }
                let n = room.min(p.len() - done[i]);
                step.seqs.push(SeqStep::chain(*slot, done[i] as u32, n));
                ids.extend_from_slice(&p[done[i]..done[i] + n]);
                done[i] += n;
                if done[i] == p.len() {
                    finishing.push((i, ids.len() as u32 - 1));
                }
            }
            // Logits of the finishing rows only (the LM head skips the rest).
            step.output_rows = Some(finishing.iter().map(|f| f.1).collect());
            let out = self.forward(&step, &ids)?;
            on_pass(&out, &step, &ids)?;
            passes += 1;
            let logits = out.get("logits")?;
            let dst: Vec<u32> = finishing.iter().map(|f| f.0 as u32).collect();
            if !dst.is_empty() {
                let all = logits.reshape(&[dst.len(), self.vocab])?;
                let src: Vec<u32> = (0..dst.len() as u32).collect();
                draftc_ops::kv::gather_rows(self.client(), &all, &src, &last, &dst)?;
            }
        }
        Ok((last, passes))
    }
}

/// Every weight the graph's plan binds.
pub fn weight_specs(
    graph: &Graph,
    tw: &TargetWeights,
) -> Result<Vec<draftc_codegen::bind::WeightSpec>, EngineError> {
    let cfg = draftc_codegen::PlanConfig {
        tokens: 1,
        batch: 1,
        context: 0,
        dtype: PlanDType::F32,
        fuse: true,
        // Weights do not depend on the kernel layouts.
        device: Default::default(),
    };
    let plan = draftc_codegen::plan(graph, tw, &cfg).map_err(ExecError::from)?;
    draftc_codegen::pipeline::weights(&plan).map_err(|e| EngineError::Exec(ExecError::Bind(e)))
}
