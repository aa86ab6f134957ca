//! The one error type of model import: GGUF parsing, dequantisation,
//! conversion, safetensors I/O, tokenizer and fetch. Every variant carries the
//! context a user needs to find the problem (file, tensor name, byte offset,
//! expected vs found); nothing in `model` panics on bad input.

use std::path::PathBuf;

/// Result alias for everything in [`crate::model`].
pub type Result<T, E = ModelError> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },

    #[error("not a GGUF file: magic bytes are {found:02x?}, expected \"GGUF\" (47 47 55 46)")]
    BadMagic { found: [u8; 4] },

    #[error("unsupported GGUF version {found} (draftc reads versions 2 and 3)")]
    UnsupportedVersion { found: u32 },

    #[error(
        "GGUF file truncated while reading {what} at byte offset {offset}: \
         needed {needed} bytes, only {available} left"
    )]
    Truncated {
        what: String,
        offset: u64,
        needed: u64,
        available: u64,
    },

    #[error("corrupt GGUF at byte offset {offset} while reading {what}: {detail}")]
    Corrupt {
        what: String,
        offset: u64,
        detail: String,
    },

    #[error(
        "tensor `{tensor}` has ggml type {ty}, which draftc cannot dequantise \
         (supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, \
         Q4_K, Q5_K, Q6_K)"
    )]
    UnsupportedType { tensor: String, ty: String },

    #[error(
        "tensor `{tensor}`: data at [{start}, {end}) relative to the data section \
         lies outside it ({len} bytes)"
    )]
    TensorOutOfBounds {
        tensor: String,
        start: u64,
        end: u64,
        len: u64,
    },

    #[error("missing metadata key `{key}`")]
    MissingMetadata { key: String },

    #[error("metadata key `{key}`: expected {expected}, found {found}")]
    MetadataType {
        key: String,
        expected: String,
        found: String,
    },

    #[error("missing tensor `{tensor}` in {source_name}")]
    MissingTensor { tensor: String, source_name: String },

    #[error("tensor `{tensor}`: expected shape {expected:?}, found {found:?}")]
    ShapeMismatch {
        tensor: String,
        expected: Vec<u64>,
        found: Vec<u64>,
    },

    #[error("tensor `{tensor}`: expected dtype {expected}, found {found}")]
    DtypeMismatch {
        tensor: String,
        expected: String,
        found: String,
    },

    #[error("safetensors file {}: {detail}", path.display())]
    Safetensors { path: PathBuf, detail: String },

    #[error("model config: {detail}")]
    Config { detail: String },

    #[error("tokenizer: {detail}")]
    Tokenizer { detail: String },

    #[error("token id {id} is out of range (vocabulary size {vocab_size})")]
    TokenOutOfRange { id: u32, vocab_size: usize },

    #[error("fetch failed while {step}: {detail}")]
    Fetch { step: String, detail: String },

    #[error(
        "checksum mismatch for {}: expected SHA-256 {expected}, found {found} \
         (delete the file to download it again)",
        path.display()
    )]
    Checksum {
        path: PathBuf,
        expected: String,
        found: String,
    },
}

impl ModelError {
    /// Wraps an I/O error with the path it happened on.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        ModelError::Io {
            path: path.into(),
            source,
        }
    }
}
