//! Builds a HuggingFace `tokenizer.json` (and `tokenizer_config.json` with
//! the chat template) from a GGUF's `tokenizer.ggml.*` metadata.
//!
//! Supported: `tokenizer.ggml.model = "gpt2"` (byte-level BPE) with the
//! pre-tokenisers of `tokenizer.ggml.pre` as llama.cpp names them: `smollm`
//! (`Sequence[Digits(individual_digits), ByteLevel]`; ByteLevel alone merges
//! digit runs and mis-tokenises e.g. "ones:\n\n1."), `qwen2` and
//! `llama-bpe` (Llama 3), each a regex split before ByteLevel as their
//! `tokenizer.json` files write it (`qwen2` splits digits one by one,
//! `llama-bpe` in runs of up to three). Tokens of type CONTROL (3) or
//! USER_DEFINED (4) become special added tokens. And
//! `tokenizer.ggml.model = "llama"` (SentencePiece) as Gemma 3 ships it,
//! built as transformers' `GemmaTokenizerFast` (see [`super::tokenizer_spm`]).
//! The result is loaded back with the `tokenizers` crate before it is
//! returned, so a vocabulary the crate rejects (duplicate tokens, merges of
//! unknown tokens) fails here.

use serde_json::{json, Map, Value};

use super::error::{ModelError, Result};
use super::gguf_value::{GgufValue, MetadataExt};
use super::tokenizer_spm;

/// The split regex of Qwen 2's `tokenizer.json` (llama.cpp `qwen2`).
const SPLIT_QWEN2: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// The split regex of Llama 3's `tokenizer.json` (llama.cpp `llama-bpe`).
const SPLIT_LLAMA3: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// llama.cpp `llama_token_type` values that mark special tokens.
const TOKEN_TYPE_CONTROL: u64 = 3;
const TOKEN_TYPE_USER_DEFINED: u64 = 4;

/// The two JSON documents, serialised.
pub struct TokenizerFiles {
    pub tokenizer_json: String,
    pub tokenizer_config_json: String,
    pub vocab_size: usize,
    pub n_merges: usize,
    pub n_special: usize,
}

fn err(detail: impl Into<String>) -> ModelError {
    ModelError::Tokenizer {
        detail: detail.into(),
    }
}

/// The `tokenizer.json` document of a byte-level BPE (`gpt2`) vocabulary,
/// its number of merges and its special tokens.
fn build_gpt2(
    meta: &impl MetadataExt,
    tokens: &[&str],
    types: &[u64],
) -> Result<(Value, usize, Vec<String>)> {
    // Without `tokenizer.ggml.pre`, llama.cpp falls back to GPT-2's splitting,
    // which differs from ours on digits: refuse rather than mis-tokenise.
    let pre = meta.require_str("tokenizer.ggml.pre")?;
    let split = match pre {
        "smollm" => None,
        "qwen2" => Some(SPLIT_QWEN2),
        "llama-bpe" => Some(SPLIT_LLAMA3),
        _ => {
            return Err(err(format!(
                "pre-tokeniser `{pre}` is not supported (`smollm`, `qwen2` or `llama-bpe`)"
            )))
        }
    };
    let merges = meta.require_str_array("tokenizer.ggml.merges")?;

    let mut vocab = Map::new();
    let mut added = Vec::new();
    let mut special_names = Vec::new();
    for (id, (&token, &ty)) in tokens.iter().zip(types).enumerate() {
        if vocab.insert(token.to_string(), json!(id)).is_some() {
            return Err(err(format!(
                "token {token:?} (id {id}) appears twice in the vocabulary"
            )));
        }
        if ty == TOKEN_TYPE_CONTROL || ty == TOKEN_TYPE_USER_DEFINED {
            added.push(json!({
                "id": id, "content": token, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": true,
            }));
            special_names.push(token.to_string());
        }
    }
    let merge_pairs = merges
        .iter()
        .enumerate()
        .map(|(i, m)| match m.split_once(' ') {
            Some((a, b)) if !a.is_empty() && !b.is_empty() => Ok(json!([a, b])),
            _ => Err(err(format!(
                "merge #{i} {m:?} is not two tokens separated by a space"
            ))),
        })
        .collect::<Result<Vec<Value>>>()?;
    let n_merges = merge_pairs.len();

    let byte_level = |trim_offsets: bool| json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": trim_offsets, "use_regex": true});
    let pre_tokenizer = match split {
        None => json!({
            "type": "Sequence",
            "pretokenizers": [
                {"type": "Digits", "individual_digits": true},
                byte_level(true),
            ],
        }),
        Some(pattern) => json!({
            "type": "Sequence",
            "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": false},
                {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false},
            ],
        }),
    };
    let tokenizer = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": byte_level(false),
        "decoder": byte_level(true),
        "model": {
            "type": "BPE", "dropout": null, "unk_token": null,
            "continuing_subword_prefix": null, "end_of_word_suffix": null,
            "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
            "vocab": vocab, "merges": merge_pairs,
        },
    });
    Ok((tokenizer, n_merges, special_names))
}

/// Builds `tokenizer.json` and `tokenizer_config.json` from GGUF metadata.
pub fn build_tokenizer(meta: &impl MetadataExt) -> Result<TokenizerFiles> {
    let model = meta.require_str("tokenizer.ggml.model")?;
    if model != "gpt2" && model != "llama" {
        return Err(err(format!(
            "tokenizer.ggml.model `{model}` is not supported (byte-level BPE `gpt2` or \
             SentencePiece `llama`)"
        )));
    }
    let tokens = meta.require_str_array("tokenizer.ggml.tokens")?;
    let types: Vec<u64> = match meta.get_value("tokenizer.ggml.token_type") {
        None => vec![1; tokens.len()],
        Some(_) => meta
            .require_array("tokenizer.ggml.token_type")?
            .iter()
            .map(|v| v.as_u64().unwrap_or(0))
            .collect(),
    };
    if types.len() != tokens.len() {
        return Err(err(format!(
            "{} token types for {} tokens",
            types.len(),
            tokens.len()
        )));
    }
    let (tokenizer, n_merges, special_names) = if model == "gpt2" {
        build_gpt2(meta, &tokens, &types)?
    } else {
        let spm = tokenizer_spm::build(meta, &tokens, &types)?;
        (spm.tokenizer, spm.n_merges, spm.special_names)
    };

    let tokenizer_json = serde_json::to_string(&tokenizer).map_err(|e| err(e.to_string()))?;
    tokenizers::Tokenizer::from_bytes(tokenizer_json.as_bytes())
        .map_err(|e| err(format!("the built tokenizer.json does not load: {e}")))?;

    let token_name = |key: &str| -> Result<Option<String>> {
        match meta.get_value(key) {
            None => Ok(None),
            Some(_) => {
                let id = meta.require_u64(key)? as usize;
                let name = tokens
                    .get(id)
                    .ok_or_else(|| err(format!("{key} = {id} is outside the vocabulary")))?;
                Ok(Some(name.to_string()))
            }
        }
    };
    let mut config = Map::new();
    config.insert("tokenizer_class".into(), json!("PreTrainedTokenizerFast"));
    for (field, key) in [
        ("bos_token", "tokenizer.ggml.bos_token_id"),
        ("eos_token", "tokenizer.ggml.eos_token_id"),
        ("unk_token", "tokenizer.ggml.unknown_token_id"),
        ("pad_token", "tokenizer.ggml.padding_token_id"),
    ] {
        if let Some(name) = token_name(key)? {
            config.insert(field.into(), json!(name));
        }
    }
    config.insert("additional_special_tokens".into(), json!(special_names));
    config.insert("add_prefix_space".into(), json!(false));
    config.insert("clean_up_tokenization_spaces".into(), json!(false));
    let arch = meta
        .get_value("general.architecture")
        .and_then(|v| v.as_str())
        .unwrap_or("llama");
    if let Some(len) = meta
        .get_value(&format!("{arch}.context_length"))
        .and_then(GgufValue::as_u64)
    {
        config.insert("model_max_length".into(), json!(len));
    }
    if let Some(t) = meta.get_value("tokenizer.chat_template") {
        let t = t
            .as_str()
            .ok_or_else(|| err("tokenizer.chat_template is not a string"))?;
        config.insert("chat_template".into(), json!(t));
    }
    let tokenizer_config_json =
        serde_json::to_string_pretty(&Value::Object(config)).map_err(|e| err(e.to_string()))?;
    Ok(TokenizerFiles {
        tokenizer_json,
        tokenizer_config_json,
        vocab_size: tokens.len(),
        n_merges,
        n_special: special_names.len(),
    })
}
