//! SentencePiece vocabularies (`tokenizer.ggml.model = "llama"`) as Gemma 3
//! ships them, turned into the `tokenizer.json` transformers' `GemmaConverter`
//! (`convert_slow_tokenizer.py`, 4.57) writes for `GemmaTokenizerFast`:
//!
//! - pieces: the GGUF tokens, except that USER_DEFINED tokens get their
//!   spaces back as `▁` (llama.cpp's converter stores `▁▁` as two spaces).
//!   Scores for ranking merges: the GGUF score of NORMAL (and UNUSED)
//!   pieces, 0 for CONTROL, USER_DEFINED, UNKNOWN and BYTE pieces, as in the
//!   SentencePiece model (llama.cpp stores −1000 for the added ones; ranking
//!   `▁▁` below the word pieces changes how runs of spaces split).
//! - added tokens: every CONTROL and USER_DEFINED piece, `normalized: false`
//!   (matched on the raw text); special when CONTROL, or bos/eos/unk/pad,
//!   or `<start_of_turn>` / `<end_of_turn>` (GemmaConverter's own list).
//! - normalizer `Replace(" ", "▁")` (no dummy prefix, no NFKC),
//!   pre-tokenizer `Split(" ", MergedWithPrevious)`.
//! - model: BPE with byte fallback, unk `<unk>`, `fuse_unk`; merges are every
//!   pair `(l, r)` with `l`, `r` and `l + r` pieces, ordered as
//!   transformers' `generate_merges` orders them: score of `l + r`
//!   descending, then `l`'s and `r`'s length in characters descending, then
//!   ids of `l + r`, `l`, `r` ascending.
//! - post-processor: `<bos>` first when `tokenizer.ggml.add_bos_token`
//!   (llama.cpp's default for SentencePiece: true), `<eos>` last when
//!   `add_eos_token`; decoder `Replace("▁", " ")`, `ByteFallback`, `Fuse`.
//!
//! Vocabularies that prepend a space (`tokenizer.ggml.add_space_prefix`
//! true or absent, as Llama 2's and Mistral's) are refused: their
//! tokenizer.json needs a different normalizer.

use std::collections::HashMap;

use serde_json::{json, Map, Value};

use super::error::{ModelError, Result};
use super::gguf_value::{GgufValue, MetadataExt};

/// llama.cpp `llama_token_type` values.
const TYPE_UNKNOWN: u64 = 2;
const TYPE_CONTROL: u64 = 3;
const TYPE_USER_DEFINED: u64 = 4;
const TYPE_BYTE: u64 = 6;

/// Pieces GemmaConverter marks special although SentencePiece has them as
/// user-defined in some Gemma releases.
const GEMMA_SPECIAL: [&str; 2] = ["<start_of_turn>", "<end_of_turn>"];

/// The model part of `tokenizer.json` and what the caller reports.
pub(super) struct SpmTokenizer {
    pub tokenizer: Value,
    pub n_merges: usize,
    /// Added tokens marked special, in id order.
    pub special_names: Vec<String>,
}

fn err(detail: impl Into<String>) -> ModelError {
    ModelError::Tokenizer {
        detail: detail.into(),
    }
}

/// A boolean key, `default` when absent.
fn flag(meta: &impl MetadataExt, key: &str, default: bool) -> Result<bool> {
    match meta.get_value(key) {
        None => Ok(default),
        Some(GgufValue::Bool(b)) => Ok(*b),
        Some(v) => v
            .as_u64()
            .map(|n| n != 0)
            .ok_or_else(|| err(format!("{key} is not a boolean ({})", v.value_type()))),
    }
}

/// One token id from metadata, checked against the vocabulary.
fn token_id(meta: &impl MetadataExt, key: &str, n: usize) -> Result<Option<u32>> {
    if meta.get_value(key).is_none() {
        return Ok(None);
    }
    let id = meta.require_u64(key)?;
    if id >= n as u64 {
        return Err(err(format!("{key} = {id} is outside the vocabulary")));
    }
    Ok(Some(id as u32))
}

/// Every merge `(l, r, l + r)` of a vocabulary, as ids, in the order
/// transformers' `generate_merges` gives them. `scores` must hold no NaN
/// and no −0.0 (see [`build`]).
fn generate_merges(pieces: &[String], scores: &[f32]) -> Vec<(u32, u32, u32)> {
    let index: HashMap<&str, u32> = pieces
        .iter()
        .enumerate()
        .map(|(i, p)| (p.as_str(), i as u32))
        .collect();
    let chars: Vec<u32> = pieces.iter().map(|p| p.chars().count() as u32).collect();
    let mut merges = Vec::new();
    for (id, piece) in pieces.iter().enumerate() {
        for (at, _) in piece.char_indices().skip(1) {
            let (l, r) = piece.split_at(at);
            if let (Some(&l), Some(&r)) = (index.get(l), index.get(r)) {
                merges.push((l, r, id as u32));
            }
        }
    }
    merges.sort_unstable_by(|a, b| {
        let (al, ar, am) = (a.0 as usize, a.1 as usize, a.2 as usize);
        let (bl, br, bm) = (b.0 as usize, b.1 as usize, b.2 as usize);
        scores[bm]
            .total_cmp(&scores[am])
            .then(chars[bl].cmp(&chars[al]))
            .then(chars[br].cmp(&chars[ar]))
            .then(am.cmp(&bm))
            .then(al.cmp(&bl))
            .then(ar.cmp(&br))
    });
    merges
}

/// `TemplateProcessing` as `GemmaTokenizerFast.update_post_processor`
/// writes it.
fn post_processor(bos: Option<(&str, u32)>, eos: Option<(&str, u32)>) -> Value {
    let special = |(name, _): (&str, u32), type_id: u32| json!({"SpecialToken": {"id": name, "type_id": type_id}});
    let sequence = |id: &str, type_id: u32| json!({"Sequence": {"id": id, "type_id": type_id}});
    let part = |seq: &str, type_id: u32| -> Vec<Value> {
        bos.map(|t| special(t, type_id))
            .into_iter()
            .chain([sequence(seq, type_id)])
            .chain(eos.map(|t| special(t, type_id)))
            .collect()
    };
    let single = part("A", 0);
    let pair = [part("A", 0), part("B", 1)].concat();
    let mut tokens = Map::new();
    for (name, id) in bos.into_iter().chain(eos) {
        tokens.insert(
            name.to_string(),
            json!({"id": name, "ids": [id], "tokens": [name]}),
        );
    }
    json!({"type": "TemplateProcessing", "single": single, "pair": pair, "special_tokens": tokens})
}

/// Builds the `tokenizer.json` document of a SentencePiece vocabulary.
pub(super) fn build(
    meta: &impl MetadataExt,
    tokens: &[&str],
    types: &[u64],
) -> Result<SpmTokenizer> {
    if flag(meta, "tokenizer.ggml.add_space_prefix", true)? {
        return Err(err(
            "SentencePiece vocabularies that prepend a space (tokenizer.ggml.add_space_prefix true \
             or absent, as Llama 2's and Mistral's) are not supported; Gemma's are",
        ));
    }
    let n = tokens.len();
    let stored = meta.require_array("tokenizer.ggml.scores")?;
    if stored.len() != n {
        return Err(err(format!("{} token scores for {n} tokens", stored.len())));
    }
    let mut pieces = Vec::with_capacity(n);
    let mut scores = Vec::with_capacity(n);
    for (id, ((&token, &ty), score)) in tokens.iter().zip(types).zip(stored).enumerate() {
        let score = score
            .as_f64()
            .filter(|s| !s.is_nan())
            .ok_or_else(|| err(format!("tokenizer.ggml.scores[{id}] is not a number")))?;
        let score = match ty {
            TYPE_CONTROL | TYPE_USER_DEFINED | TYPE_UNKNOWN | TYPE_BYTE => 0.0,
            // + 0.0 turns −0.0 into 0.0: Python compares them equal.
            _ => score as f32 + 0.0,
        };
        pieces.push(if ty == TYPE_USER_DEFINED {
            token.replace(' ', "\u{2581}")
        } else {
            token.to_string()
        });
        scores.push(score);
    }

    let mut vocab = Map::new();
    for (id, piece) in pieces.iter().enumerate() {
        if vocab.insert(piece.clone(), json!(id)).is_some() {
            return Err(err(format!(
                "piece {piece:?} (id {id}) appears twice in the vocabulary"
            )));
        }
    }
    for byte in 0..=255u8 {
        let name = format!("<0x{byte:02X}>");
        if !vocab.contains_key(&name) {
            return Err(err(format!(
                "byte piece {name} is missing: byte fallback needs all 256"
            )));
        }
    }

    let name_of = |key: &str| -> Result<Option<(&str, u32)>> {
        Ok(token_id(meta, key, n)?.map(|id| (pieces[id as usize].as_str(), id)))
    };
    let bos = name_of("tokenizer.ggml.bos_token_id")?;
    let eos = name_of("tokenizer.ggml.eos_token_id")?;
    let unk = match name_of("tokenizer.ggml.unknown_token_id")? {
        Some((name, _)) => Some(name),
        None => vocab.contains_key("<unk>").then_some("<unk>"),
    };
    let pad = name_of("tokenizer.ggml.padding_token_id")?;
    let add_bos = flag(meta, "tokenizer.ggml.add_bos_token", true)?;
    let add_eos = flag(meta, "tokenizer.ggml.add_eos_token", false)?;
    if add_bos && bos.is_none() {
        return Err(err(
            "add_bos_token is set but tokenizer.ggml.bos_token_id is absent",
        ));
    }
    if add_eos && eos.is_none() {
        return Err(err(
            "add_eos_token is set but tokenizer.ggml.eos_token_id is absent",
        ));
    }

    let named_special: Vec<&str> = [bos, eos, pad]
        .into_iter()
        .flatten()
        .map(|(name, _)| name)
        .chain(unk)
        .chain(GEMMA_SPECIAL)
        .collect();
    let mut added = Vec::new();
    let mut special_names = Vec::new();
    for (id, (piece, &ty)) in pieces.iter().zip(types).enumerate() {
        if ty != TYPE_CONTROL && ty != TYPE_USER_DEFINED {
            continue;
        }
        let special = ty == TYPE_CONTROL || named_special.contains(&piece.as_str());
        added.push(json!({
            "id": id, "content": piece, "single_word": false, "lstrip": false,
            "rstrip": false, "normalized": false, "special": special,
        }));
        if special {
            special_names.push(piece.clone());
        }
    }

    let merges: Vec<Value> = generate_merges(&pieces, &scores)
        .into_iter()
        .map(|(l, r, _)| json!([pieces[l as usize], pieces[r as usize]]))
        .collect();
    let n_merges = merges.len();
    let tokenizer = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": "\u{2581}"},
        "pre_tokenizer": {
            "type": "Split", "pattern": {"String": " "},
            "behavior": "MergedWithPrevious", "invert": false,
        },
        "post_processor": post_processor(bos.filter(|_| add_bos), eos.filter(|_| add_eos)),
        "decoder": {
            "type": "Sequence",
            "decoders": [
                {"type": "Replace", "pattern": {"String": "\u{2581}"}, "content": " "},
                {"type": "ByteFallback"},
                {"type": "Fuse"},
            ],
        },
        "model": {
            "type": "BPE", "dropout": null, "unk_token": unk,
            "continuing_subword_prefix": null, "end_of_word_suffix": null,
            "fuse_unk": true, "byte_fallback": true, "ignore_merges": false,
            "vocab": vocab, "merges": merges,
        },
    });
    Ok(SpmTokenizer {
        tokenizer,
        n_merges,
        special_names,
    })
}
