//! The model hyper-parameters as HuggingFace's `LlamaConfig` spells them
//! (`config.json`), read from GGUF metadata (`llama.*` keys) or from a
//! `config.json` the way transformers reads it (its defaults for absent
//! fields, one eos id or a list), and validated for internal consistency
//! (heads divide the width, KV heads divide heads). A field that would change
//! the computation and that draftc does not implement (`rope_scaling`,
//! `attention_bias`, `mlp_bias`, `sliding_window`, another `model_type` or
//! activation) is an error naming it, never silently ignored.

use std::path::Path;

use serde::{Deserialize, Serialize, Serializer};

use super::error::{ModelError, Result};
use super::gguf_value::MetadataExt;

/// HF `LlamaConfig` fields draftc writes and reads.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LlamaConfig {
    pub architectures: Vec<String>,
    pub model_type: String,
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub intermediate_size: usize,
    pub vocab_size: usize,
    pub rope_theta: f64,
    pub rms_norm_eps: f64,
    pub tie_word_embeddings: bool,
    pub max_position_embeddings: usize,
    /// Unused by draftc; absent in a Qwen 2 config that sets none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bos_token_id: Option<u32>,
    /// Every id that ends a sequence (Llama 3 lists three; none: a run ends
    /// at its token limit, as transformers' would); written as one number
    /// when there is one, as transformers does.
    #[serde(serialize_with = "one_or_list")]
    pub eos_token_id: Vec<u32>,
    pub hidden_act: String,
    pub head_dim: usize,
    pub torch_dtype: String,
    /// Llama 3's RoPE scaling (`rope_type: llama3`); the only kind read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rope_scaling: Option<Llama3Rope>,
    /// Gemma 3's layers (`model_type: gemma3_text`), written back as
    /// transformers writes them.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub gemma: Option<GemmaLayers>,
}

/// What a Gemma 3 text model adds to the Llama fields: which layers attend
/// through a sliding window (and with which RoPE base), and the scores'
/// scale.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GemmaLayers {
    /// Keys a sliding layer's query sees, itself included (`q - k < w`).
    pub sliding_window: usize,
    /// Per layer, `sliding_attention` or `full_attention`.
    pub layer_types: Vec<String>,
    /// The sliding layers' RoPE base (the full layers use `rope_theta`).
    pub rope_local_base_freq: f64,
    /// Scores are scaled by `query_pre_attn_scalar ** -0.5`.
    pub query_pre_attn_scalar: f64,
}

impl GemmaLayers {
    /// Whether layer `i` attends through the sliding window.
    pub fn sliding(&self, i: usize) -> bool {
        self.layer_types.get(i).map(String::as_str) == Some("sliding_attention")
    }
}

/// `rope_scaling` with `rope_type: llama3` (Llama 3.1 and later), written
/// back as transformers writes it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Llama3Rope {
    pub rope_type: Llama3Tag,
    pub factor: f64,
    pub low_freq_factor: f64,
    pub high_freq_factor: f64,
    pub original_max_position_embeddings: usize,
}

/// Serialises as `"llama3"`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Llama3Tag;

impl Serialize for Llama3Tag {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str("llama3")
    }
}

fn one_or_list<S: Serializer>(ids: &[u32], s: S) -> std::result::Result<S::Ok, S::Error> {
    match ids {
        [one] => s.serialize_u32(*one),
        _ => ids.serialize(s),
    }
}

/// A token id field that transformers accepts as a number or a list.
#[derive(Deserialize)]
#[serde(untagged)]
enum Ids {
    One(u32),
    Many(Vec<u32>),
}

impl Ids {
    fn into_vec(self) -> Vec<u32> {
        match self {
            Ids::One(i) => vec![i],
            Ids::Many(v) => v,
        }
    }
}

/// `config.json` as transformers writes it: what `LlamaConfig` defaults
/// may be absent; unknown fields are ignored.
#[derive(Deserialize)]
struct HfConfig {
    #[serde(default)]
    architectures: Vec<String>,
    model_type: Option<String>,
    hidden_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    intermediate_size: usize,
    vocab_size: usize,
    rope_theta: Option<f64>,
    rms_norm_eps: Option<f64>,
    tie_word_embeddings: Option<bool>,
    max_position_embeddings: Option<usize>,
    bos_token_id: Option<Ids>,
    eos_token_id: Option<Ids>,
    hidden_act: Option<String>,
    head_dim: Option<usize>,
    torch_dtype: Option<String>,
    rope_scaling: Option<serde_json::Value>,
    attention_bias: Option<bool>,
    mlp_bias: Option<bool>,
    sliding_window: Option<serde_json::Value>,
    use_sliding_window: Option<bool>,
    // Gemma 3 (`gemma3_text`).
    hidden_activation: Option<String>,
    layer_types: Option<Vec<String>>,
    sliding_window_pattern: Option<usize>,
    #[serde(rename = "_sliding_window_pattern")]
    sliding_window_pattern_private: Option<usize>,
    rope_local_base_freq: Option<f64>,
    query_pre_attn_scalar: Option<f64>,
    final_logit_softcapping: Option<serde_json::Value>,
    attn_logit_softcapping: Option<serde_json::Value>,
    dtype: Option<String>,
}

impl HfConfig {
    /// The config with transformers' `LlamaConfig` defaults filled in, or
    /// an error naming the first field draftc cannot honour.
    fn into_llama(self) -> Result<LlamaConfig> {
        let refuse = |detail: String| {
            Err(ModelError::Config {
                detail: format!(
                    "{detail} (Llama, Qwen 2, Qwen 3 and Gemma 3 checkpoints run today; issue 54)"
                ),
            })
        };
        if self.model_type.as_deref() == Some("gemma3_text") {
            return self.into_gemma3();
        }
        // Per family, what transformers' config class defaults and which
        // fields it has: Qwen2Config has no bias switches (q/k/v biases are
        // always there, `models/qwen2.draft`); Qwen2Config and Qwen3Config
        // keep `sliding_window` unused unless `use_sliding_window` and
        // default no bos/eos id; Qwen3Config defaults `head_dim` to 128,
        // not hidden / heads, and has `attention_bias` (false).
        let (model_type, qwen) = match self.model_type.as_deref() {
            Some("llama") => ("llama", false),
            Some("qwen2") => ("qwen2", true),
            Some("qwen3") => ("qwen3", true),
            Some("gemma3") => {
                return refuse(
                    "model_type `gemma3` is the multimodal Gemma 3; give its text model \
                     (`gemma3_text`, Gemma3ForCausalLM, as Gemma 3 270M and 1B ship)"
                        .into(),
                )
            }
            Some(other) => return refuse(format!("model_type `{other}` is not supported")),
            None => return refuse("config.json has no `model_type`".into()),
        };
        let qwen2 = model_type == "qwen2";
        let qwen3 = model_type == "qwen3";
        let mut rope_scaling = None;
        if let Some(scaling) = self.rope_scaling.filter(|v| !v.is_null()) {
            let kind = ["rope_type", "type"]
                .iter()
                .find_map(|k| scaling.get(k).and_then(|t| t.as_str()))
                .unwrap_or("(unnamed)");
            if kind != "llama3" || qwen {
                return refuse(format!("rope_scaling of type `{kind}` is not supported"));
            }
            let num = |k: &str| scaling.get(k).and_then(|v| v.as_f64()).filter(|x| *x > 0.0);
            let (Some(factor), Some(low), Some(high), Some(original)) = (
                num("factor"),
                num("low_freq_factor"),
                num("high_freq_factor"),
                num("original_max_position_embeddings"),
            ) else {
                return refuse(
                    "rope_scaling `llama3` needs positive factor, low_freq_factor, \
                     high_freq_factor and original_max_position_embeddings"
                        .into(),
                );
            };
            if high <= low {
                return refuse(
                    "rope_scaling `llama3`: high_freq_factor must exceed low_freq_factor".into(),
                );
            }
            rope_scaling = Some(Llama3Rope {
                rope_type: Llama3Tag,
                factor,
                low_freq_factor: low,
                high_freq_factor: high,
                original_max_position_embeddings: original as usize,
            });
        }
        if self.attention_bias == Some(true) && !qwen2 {
            return refuse("`attention_bias: true` (q/k/v/o biases) is not supported".into());
        }
        if self.mlp_bias == Some(true) && !qwen2 {
            return refuse("`mlp_bias: true` is not supported".into());
        }
        let windowed = !qwen || self.use_sliding_window == Some(true);
        if let Some(w) = self.sliding_window.filter(|v| !v.is_null() && windowed) {
            return refuse(format!("`sliding_window: {w}` is not supported"));
        }
        let hidden_act = self.hidden_act.unwrap_or_else(|| "silu".into());
        if hidden_act != "silu" {
            return refuse(format!(
                "hidden_act `{hidden_act}` is not supported (only `silu`)"
            ));
        }
        let (bos, eos) = if qwen {
            (vec![], vec![])
        } else {
            (vec![1], vec![2])
        };
        let bos = self.bos_token_id.map(Ids::into_vec).unwrap_or(bos);
        let bos_token_id = match bos[..] {
            [] => None,
            [one] => Some(one),
            _ => return refuse(format!("bos_token_id must be one id, found {bos:?}")),
        };
        let eos_token_id = self.eos_token_id.map(Ids::into_vec).unwrap_or(eos);
        let heads = self.num_attention_heads;
        Ok(LlamaConfig {
            architectures: self.architectures,
            model_type: model_type.into(),
            hidden_size: self.hidden_size,
            num_hidden_layers: self.num_hidden_layers,
            num_attention_heads: heads,
            num_key_value_heads: self.num_key_value_heads.unwrap_or(heads),
            intermediate_size: self.intermediate_size,
            vocab_size: self.vocab_size,
            rope_theta: self.rope_theta.unwrap_or(10_000.0),
            rms_norm_eps: self.rms_norm_eps.unwrap_or(1e-6),
            tie_word_embeddings: self.tie_word_embeddings.unwrap_or(false),
            max_position_embeddings: self.max_position_embeddings.unwrap_or(if qwen {
                32_768
            } else {
                2048
            }),
            bos_token_id,
            eos_token_id,
            hidden_act,
            head_dim: self.head_dim.unwrap_or(if qwen3 {
                128
            } else {
                self.hidden_size.checked_div(heads).unwrap_or(0)
            }),
            torch_dtype: self
                .torch_dtype
                .or(self.dtype)
                .unwrap_or_else(|| "float32".into()),
            rope_scaling,
            gemma: None,
        })
    }

    /// A Gemma 3 text model (`gemma3_text`) with `Gemma3TextConfig`'s
    /// defaults: sliding layers by `layer_types`, or where there is none by
    /// `sliding_window_pattern` (layer i slides unless (i + 1) % pattern ==
    /// 0), scores scaled by `query_pre_attn_scalar ** -0.5`, a tied head
    /// unless said otherwise. Soft-capping, RoPE scaling and attention
    /// biases are refused by name.
    fn into_gemma3(self) -> Result<LlamaConfig> {
        let refuse = |detail: String| {
            Err(ModelError::Config {
                detail: format!("Gemma 3: {detail} is not supported (issue 54)"),
            })
        };
        for (field, v) in [
            ("final_logit_softcapping", &self.final_logit_softcapping),
            ("attn_logit_softcapping", &self.attn_logit_softcapping),
            ("rope_scaling", &self.rope_scaling),
        ] {
            if let Some(v) = v.as_ref().filter(|v| !v.is_null()) {
                return refuse(format!("`{field}: {v}`"));
            }
        }
        if self.attention_bias == Some(true) {
            return refuse("`attention_bias: true`".into());
        }
        let act = self
            .hidden_activation
            .or(self.hidden_act)
            .unwrap_or_else(|| "gelu_pytorch_tanh".into());
        if act != "gelu_pytorch_tanh" {
            return refuse(format!(
                "hidden_activation `{act}` (only `gelu_pytorch_tanh`)"
            ));
        }
        let n = self.num_hidden_layers;
        let layer_types = match self.layer_types {
            Some(t) => t,
            None => {
                let pattern = self
                    .sliding_window_pattern
                    .or(self.sliding_window_pattern_private)
                    .unwrap_or(6)
                    .max(1);
                (0..n)
                    .map(|i| {
                        if (i + 1) % pattern == 0 {
                            "full_attention"
                        } else {
                            "sliding_attention"
                        }
                        .to_string()
                    })
                    .collect()
            }
        };
        if layer_types.len() != n {
            return refuse(format!(
                "`layer_types` of {} entries for {n} layers",
                layer_types.len()
            ));
        }
        if let Some(t) = layer_types
            .iter()
            .find(|t| *t != "sliding_attention" && *t != "full_attention")
        {
            return refuse(format!("layer type `{t}`"));
        }
        let sliding_window = match self.sliding_window {
            None => 4096,
            Some(v) => match v.as_u64() {
                Some(w) if w > 0 => w as usize,
                _ => return refuse(format!("`sliding_window: {v}`")),
            },
        };
        let head_dim = self.head_dim.unwrap_or(256);
        let bos = self.bos_token_id.map(Ids::into_vec).unwrap_or(vec![2]);
        let bos_token_id = match bos[..] {
            [] => None,
            [one] => Some(one),
            _ => return refuse(format!("bos_token_id {bos:?} (one id)")),
        };
        let heads = self.num_attention_heads;
        Ok(LlamaConfig {
            architectures: self.architectures,
            model_type: "gemma3_text".into(),
            hidden_size: self.hidden_size,
            num_hidden_layers: n,
            num_attention_heads: heads,
            num_key_value_heads: self.num_key_value_heads.unwrap_or(heads),
            intermediate_size: self.intermediate_size,
            vocab_size: self.vocab_size,
            rope_theta: self.rope_theta.unwrap_or(1_000_000.0),
            rms_norm_eps: self.rms_norm_eps.unwrap_or(1e-6),
            tie_word_embeddings: self.tie_word_embeddings.unwrap_or(true),
            max_position_embeddings: self.max_position_embeddings.unwrap_or(131_072),
            bos_token_id,
            eos_token_id: self.eos_token_id.map(Ids::into_vec).unwrap_or(vec![1]),
            hidden_act: act,
            head_dim,
            torch_dtype: self
                .torch_dtype
                .or(self.dtype)
                .unwrap_or_else(|| "float32".into()),
            rope_scaling: None,
            gemma: Some(GemmaLayers {
                sliding_window,
                layer_types,
                rope_local_base_freq: self.rope_local_base_freq.unwrap_or(10_000.0),
                query_pre_attn_scalar: self.query_pre_attn_scalar.unwrap_or(256.0),
            }),
        })
    }
}

impl LlamaConfig {
    /// Reads the hyper-parameters of a `general.architecture = llama`,
    /// `qwen2`, `qwen3` or `gemma3` GGUF (its `{arch}.*` keys). `tied` says
    /// whether the file lacks a separate `output.weight`.
    ///
    /// A Gemma 3 GGUF does not store which layers slide, the scores' scale
    /// or the local RoPE base; they are what llama.cpp assumes when it runs
    /// one (`llama-model.cpp`): every sixth layer global, scores scaled by
    /// 1/√head_dim (the 62-layer 27B: by (hidden / heads)^-1/2), local base
    /// 10000. RoPE scaling (`gemma3.rope.scaling.*`, the 4B–27B models) is
    /// refused by name.
    pub fn from_gguf(meta: &impl MetadataExt, tied: bool, dtype: &str) -> Result<Self> {
        let arch = meta.require_str("general.architecture")?;
        let (class, model_type, max_default) = match arch {
            "llama" => ("LlamaForCausalLM", "llama", 2048),
            "qwen2" => ("Qwen2ForCausalLM", "qwen2", 32_768),
            "qwen3" => ("Qwen3ForCausalLM", "qwen3", 40_960),
            "gemma3" => ("Gemma3ForCausalLM", "gemma3_text", 131_072),
            _ => {
                return Err(ModelError::Config {
                    detail: format!(
                        "architecture `{arch}` is not supported (`llama`, `qwen2`, `qwen3` or \
                         `gemma3`; issue 54)"
                    ),
                })
            }
        };
        let key = |k: &str| format!("{arch}.{k}");
        let u = |k: &str| meta.require_u64(&key(k)).map(|v| v as usize);
        let hidden_size = u("embedding_length")?;
        let heads = u("attention.head_count")?;
        let vocab_size = match meta.get_value(&key("vocab_size")) {
            Some(_) => u("vocab_size")?,
            None => meta.require_array("tokenizer.ggml.tokens")?.len(),
        };
        let n = u("block_count")?;
        // Heads of their own size (Qwen 3, Gemma 3), else hidden / heads.
        let head_dim = match meta.get_value(&key("attention.key_length")) {
            Some(_) => u("attention.key_length")?,
            None => hidden_size.checked_div(heads).unwrap_or(0),
        };
        let gemma = if arch == "gemma3" {
            if let Some(k) = [
                "gemma3.rope.scaling.type",
                "gemma3.rope.scaling.factor",
                "gemma3.attn_logit_softcapping",
                "gemma3.final_logit_softcapping",
            ]
            .into_iter()
            .find(|k| meta.get_value(k).is_some())
            {
                return Err(ModelError::Config {
                    detail: format!("Gemma 3: `{k}` is not supported (issue 54)"),
                });
            }
            let scalar = if n == 62 {
                hidden_size.checked_div(heads).unwrap_or(head_dim)
            } else {
                head_dim
            };
            Some(GemmaLayers {
                sliding_window: u("attention.sliding_window")?,
                layer_types: (0..n)
                    .map(|i| {
                        if i % 6 == 5 {
                            "full_attention"
                        } else {
                            "sliding_attention"
                        }
                        .to_string()
                    })
                    .collect(),
                rope_local_base_freq: 10_000.0,
                query_pre_attn_scalar: scalar as f64,
            })
        } else {
            None
        };
        let config = LlamaConfig {
            architectures: vec![class.into()],
            model_type: model_type.into(),
            hidden_size,
            num_hidden_layers: n,
            num_attention_heads: heads,
            num_key_value_heads: match meta.get_value(&key("attention.head_count_kv")) {
                Some(_) => u("attention.head_count_kv")?,
                None => heads,
            },
            intermediate_size: u("feed_forward_length")?,
            vocab_size,
            rope_theta: match meta.get_value(&key("rope.freq_base")) {
                Some(_) => meta.require_f64(&key("rope.freq_base"))?,
                None => 10_000.0,
            },
            rms_norm_eps: meta.require_f64(&key("attention.layer_norm_rms_epsilon"))?,
            tie_word_embeddings: tied,
            max_position_embeddings: match meta.get_value(&key("context_length")) {
                Some(_) => u("context_length")?,
                None => max_default,
            },
            bos_token_id: Some(meta.require_u64("tokenizer.ggml.bos_token_id")? as u32),
            eos_token_id: vec![meta.require_u64("tokenizer.ggml.eos_token_id")? as u32],
            hidden_act: if gemma.is_some() {
                "gelu_pytorch_tanh"
            } else {
                "silu"
            }
            .into(),
            head_dim,
            torch_dtype: dtype.into(),
            gemma,
            rope_scaling: None,
        };
        config.validate()?;
        Ok(config)
    }

    /// The eos ids of a `generation_config.json` beside the config (what
    /// transformers' `generate` stops on: Llama 3.1's and Gemma 3's
    /// instruction models list their end-of-turn token there), added after
    /// the config's own. An absent file or field adds nothing.
    fn add_generation_eos(&mut self, path: &Path) -> Result<()> {
        #[derive(Deserialize)]
        struct Generation {
            eos_token_id: Option<Ids>,
        }
        let Ok(text) = std::fs::read_to_string(path) else {
            return Ok(());
        };
        let g: Generation = serde_json::from_str(&text).map_err(|e| ModelError::Config {
            detail: format!("{}: {e}", path.display()),
        })?;
        for id in g.eos_token_id.map(Ids::into_vec).unwrap_or_default() {
            if !self.eos_token_id.contains(&id) {
                self.eos_token_id.push(id);
            }
        }
        Ok(())
    }

    /// Checks the relations the runtime relies on.
    pub fn validate(&self) -> Result<()> {
        let fail = |detail: String| Err(ModelError::Config { detail });
        if self.num_attention_heads == 0 || self.num_key_value_heads == 0 {
            return fail("head counts must be positive".into());
        }
        if !self.hidden_size.is_multiple_of(self.num_attention_heads) {
            return fail(format!(
                "hidden_size {} is not divisible by num_attention_heads {}",
                self.hidden_size, self.num_attention_heads
            ));
        }
        if !self
            .num_attention_heads
            .is_multiple_of(self.num_key_value_heads)
        {
            return fail(format!(
                "num_attention_heads {} is not divisible by num_key_value_heads {}",
                self.num_attention_heads, self.num_key_value_heads
            ));
        }
        // Qwen 3's model file takes `head_dim=hd`; Llama's and Qwen 2's
        // derive it from hidden / heads, so theirs must agree.
        let own_head_dim = self.model_type == "qwen3" || self.gemma.is_some();
        if !self.head_dim.is_multiple_of(2)
            || self.head_dim == 0
            || (!own_head_dim && self.head_dim * self.num_attention_heads != self.hidden_size)
        {
            return fail(format!(
                "head_dim {} must be even and equal hidden_size / num_attention_heads",
                self.head_dim
            ));
        }
        if self
            .bos_token_id
            .is_some_and(|b| b as usize >= self.vocab_size)
            || self
                .eos_token_id
                .iter()
                .any(|&e| e as usize >= self.vocab_size)
        {
            return fail("bos/eos token id outside the vocabulary".into());
        }
        Ok(())
    }

    /// Loads and validates a `config.json`.
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| ModelError::io(path, e))?;
        let hf: HfConfig = serde_json::from_str(&text).map_err(|e| ModelError::Config {
            detail: format!("{}: {e}", path.display()),
        })?;
        let config = hf.into_llama().map_err(|e| match e {
            ModelError::Config { detail } => ModelError::Config {
                detail: format!("{}: {detail}", path.display()),
            },
            e => e,
        })?;
        let mut config = config;
        config.add_generation_eos(&path.with_file_name("generation_config.json"))?;
        config.validate()?;
        Ok(config)
    }

    pub fn to_json(&self) -> String {
        // Serialising a struct of plain fields cannot fail.
        serde_json::to_string_pretty(self).unwrap_or_default()
    }
}

/// The factors llama.cpp's converter stores as `rope_freqs.weight` for
/// Llama 3's RoPE scaling (`convert_hf_to_gguf.py`, `LlamaModel`): per
/// frequency `i < head_dim / 2`, the divisor of `inv_freq[i]` (1 for high
/// frequencies, `factor` for low ones, blended between), in f64 as Python
/// computes them.
pub fn llama3_rope_factors(head_dim: usize, theta: f64, s: &Llama3Rope) -> Vec<f64> {
    let original = s.original_max_position_embeddings as f64;
    let (low_wavelen, high_wavelen) = (original / s.low_freq_factor, original / s.high_freq_factor);
    (0..head_dim / 2)
        .map(|i| {
            let f = 1.0 / theta.powf((2 * i) as f64 / head_dim as f64);
            let wavelen = 2.0 * std::f64::consts::PI / f;
            if wavelen < high_wavelen {
                1.0
            } else if wavelen > low_wavelen {
                s.factor
            } else {
                let smooth = (original / wavelen - s.low_freq_factor)
                    / (s.high_freq_factor - s.low_freq_factor);
                1.0 / ((1.0 - smooth) / s.factor + smooth)
            }
        })
        .collect()
}

/// Llama 3 scaling parameters that reproduce a GGUF's `rope_freqs` factors
/// for this head size, or `None` when no such parameters exist (another
/// kind of per-frequency factors). A GGUF keeps only the factors, and for a
/// given head size several parameter sets give the same ones; any of them
/// computes the same frequencies, so the first consistent one is returned:
/// `low_freq_factor` 1, and `high_freq_factor` and the original context
/// from the blended frequencies (two or more of them fix both; with one or
/// none, `high_freq_factor` 4, Llama 3.1's). Each candidate is checked by
/// recomputing every factor (relative 1e-5: the file stores f32).
pub fn llama3_from_rope_factors(
    factors: &[f32],
    head_dim: usize,
    theta: f64,
) -> Option<Llama3Rope> {
    if factors.len() != head_dim / 2 || factors.iter().any(|r| !(r.is_finite() && *r >= 1.0)) {
        return None;
    }
    let factor = f64::from(factors.iter().copied().fold(1.0f32, f32::max));
    let inv = |i: usize| 1.0 / theta.powf((2 * i) as f64 / head_dim as f64);
    let two_pi = 2.0 * std::f64::consts::PI;
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-5 * b.abs().max(1.0);
    // The blended frequencies: smooth s = (1/r − 1/factor) / (1 − 1/factor),
    // linear in inv_freq: s = a·f + b with a = original / (2π(high − low)),
    // b = −low / (high − low).
    let blended: Vec<(f64, f64)> = factors
        .iter()
        .enumerate()
        .filter(|(_, &r)| !close(f64::from(r), 1.0) && !close(f64::from(r), factor))
        .map(|(i, &r)| {
            (
                inv(i),
                (1.0 / f64::from(r) - 1.0 / factor) / (1.0 - 1.0 / factor),
            )
        })
        .collect();
    let low = 1.0;
    let (high, original) = match blended[..] {
        [(f0, s0), .., (f1, s1)] => {
            let a = (s1 - s0) / (f1 - f0);
            let b = s0 - a * f0;
            if a <= 0.0 || b >= 0.0 {
                return None;
            }
            let high = low - low / b;
            (high, a * two_pi * (high - low))
        }
        // One blended frequency: an integer original context, and the
        // high factor that blends it by s.
        [(f, s)] => {
            let original = ((s * 3.0 + low) * two_pi / f).round().max(1.0);
            (low + (original * f / two_pi - low) / s, original)
        }
        [] => {
            // Only unscaled and fully scaled frequencies: an original
            // context just below the shortest fully scaled wavelength.
            let shortest = factors
                .iter()
                .enumerate()
                .filter(|(_, &r)| close(f64::from(r), factor))
                .map(|(i, _)| two_pi / inv(i))
                .fold(f64::INFINITY, f64::min);
            (
                4.0,
                if shortest.is_finite() {
                    shortest * 0.999
                } else {
                    1.0
                },
            )
        }
    };
    if !(high > low && original.is_finite() && original >= 1.0) {
        return None;
    }
    // The fitted high factor carries the file's f32 rounding: the value
    // rounded to 4 decimals first (Llama 3.1's 4.0), as fitted otherwise.
    [(high * 1e4).round() / 1e4, high]
        .into_iter()
        .map(|high| Llama3Rope {
            rope_type: Llama3Tag,
            factor,
            low_freq_factor: low,
            high_freq_factor: high,
            original_max_position_embeddings: original.round() as usize,
        })
        .find(|s| {
            llama3_rope_factors(head_dim, theta, s)
                .iter()
                .zip(factors)
                .all(|(x, &r)| close(*x, f64::from(r)))
        })
}
