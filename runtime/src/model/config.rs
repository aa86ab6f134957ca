//! The model hyper-parameters as HuggingFace's `LlamaConfig` spells them
//! (`config.json`), read from GGUF metadata (`llama.*` keys) and validated
//! for internal consistency (heads divide the width, KV heads divide heads).

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::error::{ModelError, Result};
use super::gguf_value::MetadataExt;

/// HF `LlamaConfig` fields draftc writes and reads. Unknown fields in a
/// `config.json` are ignored when loading.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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
    pub bos_token_id: u32,
    pub eos_token_id: u32,
    pub hidden_act: String,
    pub head_dim: usize,
    pub torch_dtype: String,
}

impl LlamaConfig {
    /// Reads the hyper-parameters of a `general.architecture = llama` GGUF.
    /// `tied` says whether the file lacks a separate `output.weight`.
    pub fn from_gguf(meta: &impl MetadataExt, tied: bool, dtype: &str) -> Result<Self> {
        let arch = meta.require_str("general.architecture")?;
        if arch != "llama" {
            return Err(ModelError::Config {
                detail: format!("architecture `{arch}` is not supported (only `llama`)"),
            });
        }
        let u = |k: &str| meta.require_u64(k).map(|v| v as usize);
        let hidden_size = u("llama.embedding_length")?;
        let heads = u("llama.attention.head_count")?;
        let vocab_size = match meta.get_value("llama.vocab_size") {
            Some(_) => u("llama.vocab_size")?,
            None => meta.require_array("tokenizer.ggml.tokens")?.len(),
        };
        let config = LlamaConfig {
            architectures: vec!["LlamaForCausalLM".into()],
            model_type: "llama".into(),
            hidden_size,
            num_hidden_layers: u("llama.block_count")?,
            num_attention_heads: heads,
            num_key_value_heads: match meta.get_value("llama.attention.head_count_kv") {
                Some(_) => u("llama.attention.head_count_kv")?,
                None => heads,
            },
            intermediate_size: u("llama.feed_forward_length")?,
            vocab_size,
            rope_theta: match meta.get_value("llama.rope.freq_base") {
                Some(_) => meta.require_f64("llama.rope.freq_base")?,
                None => 10_000.0,
            },
            rms_norm_eps: meta.require_f64("llama.attention.layer_norm_rms_epsilon")?,
            tie_word_embeddings: tied,
            max_position_embeddings: u("llama.context_length")?,
            bos_token_id: meta.require_u64("tokenizer.ggml.bos_token_id")? as u32,
            eos_token_id: meta.require_u64("tokenizer.ggml.eos_token_id")? as u32,
            hidden_act: "silu".into(),
            head_dim: hidden_size.checked_div(heads).unwrap_or(0),
            torch_dtype: dtype.into(),
        };
        config.validate()?;
        Ok(config)
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
        if self.head_dim * self.num_attention_heads != self.hidden_size
            || !self.head_dim.is_multiple_of(2)
        {
            return fail(format!(
                "head_dim {} must be even and equal hidden_size / num_attention_heads",
                self.head_dim
            ));
        }
        if self.bos_token_id as usize >= self.vocab_size
            || self.eos_token_id as usize >= self.vocab_size
        {
            return fail("bos/eos token id outside the vocabulary".into());
        }
        Ok(())
    }

    /// Loads and validates a `config.json`.
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| ModelError::io(path, e))?;
        let config: LlamaConfig = serde_json::from_str(&text).map_err(|e| ModelError::Config {
            detail: format!("{}: {e}", path.display()),
        })?;
        config.validate()?;
        Ok(config)
    }

    pub fn to_json(&self) -> String {
        // Serialising a struct of plain fields cannot fail.
        serde_json::to_string_pretty(self).unwrap_or_default()
    }
}
