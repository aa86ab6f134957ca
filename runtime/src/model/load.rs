//! Opening a model directory (what `draftc convert` / `draftc fetch` write,
//! or a Hugging Face checkpoint as `save_pretrained` writes it, sharded or
//! not): config, weights and tokenizer, checked against each other before
//! anything runs — every tensor the config implies must be present with its
//! shape, and every tokenizer id must have an embedding row (a vocabulary
//! padded past the tokenizer, as Qwen's is, is fine).

use std::path::{Path, PathBuf};

use super::config::LlamaConfig;
use super::error::{ModelError, Result};
use super::names::expected_tensors;
use super::shards::ModelWeights;
use super::tokenizer::Tokenizer;

/// A converted model, loaded and validated.
pub struct ConvertedModel {
    pub dir: PathBuf,
    pub config: LlamaConfig,
    pub weights: ModelWeights,
    pub tokenizer: Tokenizer,
}

impl ConvertedModel {
    /// Loads `dir/{config.json, model.safetensors (or its shards),
    /// tokenizer.json, tokenizer_config.json}` and cross-checks them.
    pub fn open(dir: &Path) -> Result<Self> {
        let config = LlamaConfig::load(&dir.join("config.json"))?;
        let weights = ModelWeights::open_dir(dir)?;
        weights.check_tensors(&expected_tensors(&config))?;
        let tokenizer = Tokenizer::from_dir(dir)?;
        if tokenizer.vocab_size() > config.vocab_size {
            return Err(ModelError::Config {
                detail: format!(
                    "config.json has vocab_size {} but tokenizer.json has {} tokens (more ids than embedding rows)",
                    config.vocab_size,
                    tokenizer.vocab_size()
                ),
            });
        }
        Ok(ConvertedModel {
            dir: dir.to_path_buf(),
            config,
            weights,
            tokenizer,
        })
    }

    /// One weight as f32 by HF name, with its expected shape checked.
    pub fn tensor_f32(&self, name: &str) -> Result<Vec<f32>> {
        let shape = expected_tensors(&self.config)
            .into_iter()
            .find(|(n, _)| n == name)
            .map(|(_, s)| s)
            .ok_or_else(|| ModelError::MissingTensor {
                tensor: name.to_string(),
                source_name: format!(
                    "the tensors a {}-layer Llama has",
                    self.config.num_hidden_layers
                ),
            })?;
        self.weights.tensor_f32(name, &shape)
    }
}
