//! SentencePiece vocabularies (`tokenizer.ggml.model = "llama"`, Gemma 3's
//! layout): `build_tokenizer` against `tests/fixtures/spm/`, written by
//! `tools/fixtures/spm_vocab.py` — a tiny GGUF, the `tokenizer.json` Python
//! `tokenizers` builds from it the way transformers' GemmaConverter does
//! (cross-checked there against llama.cpp's SPM algorithm and the
//! SentencePiece library), and the ids of 32 strings. Ignored: the real
//! Gemma 3 270M GGUF, when present, against ids that reference gives.

use std::path::{Path, PathBuf};

use draftc_runtime::model::gguf::Gguf;
use draftc_runtime::model::gguf_value::{GgufValue, MetadataExt};
use draftc_runtime::model::tokenizer::Tokenizer;
use draftc_runtime::model::tokenizer_build::{build_tokenizer, TokenizerFiles};
use serde_json::Value;

fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/spm")
}

fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

/// GGUF metadata as a plain list, so tests can change keys.
struct Meta(Vec<(String, GgufValue)>);

impl MetadataExt for Meta {
    fn get_value(&self, key: &str) -> Option<&GgufValue> {
        self.0.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }
}

impl Meta {
    fn fixture() -> Self {
        Meta(
            Gguf::open(&fixture_dir().join("tiny_spm.gguf"))
                .unwrap()
                .metadata,
        )
    }

    fn set(mut self, key: &str, value: Option<GgufValue>) -> Self {
        self.0.retain(|(k, _)| k != key);
        if let Some(v) = value {
            self.0.push((key.to_string(), v));
        }
        self
    }
}

fn built() -> (TokenizerFiles, Value) {
    let files = build_tokenizer(&Meta::fixture()).unwrap();
    let json = serde_json::from_str(&files.tokenizer_json).unwrap();
    (files, json)
}

/// The whole document equals the reference: vocabulary, merges in order,
/// added tokens, normaliser, pre-tokeniser, post-processor, decoder.
#[test]
fn spm_tokenizer_json_equals_the_reference() {
    let (files, ours) = built();
    let reference = read_json(&fixture_dir().join("tokenizer.reference.json"));
    let cases = read_json(&fixture_dir().join("cases.json"));
    assert_eq!(
        files.vocab_size as u64,
        cases["vocab_size"].as_u64().unwrap()
    );
    assert_eq!(files.n_merges as u64, cases["n_merges"].as_u64().unwrap());
    for key in [
        "added_tokens",
        "normalizer",
        "pre_tokenizer",
        "post_processor",
        "decoder",
        "truncation",
        "padding",
    ] {
        assert_eq!(ours[key], reference[key], "{key}");
    }
    let (m, r) = (&ours["model"], &reference["model"]);
    assert_eq!(m["vocab"], r["vocab"], "vocab");
    let merges = m["merges"].as_array().unwrap();
    let want = r["merges"].as_array().unwrap();
    assert_eq!(merges.len(), want.len());
    for (i, (a, b)) in merges.iter().zip(want).enumerate() {
        assert_eq!(a, b, "merge #{i}");
    }
    for key in [
        "type",
        "dropout",
        "unk_token",
        "continuing_subword_prefix",
        "end_of_word_suffix",
        "fuse_unk",
        "byte_fallback",
        "ignore_merges",
    ] {
        assert_eq!(m[key], r[key], "model.{key}");
    }
    let special = reference["added_tokens"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["special"] == true)
        .count();
    assert_eq!(files.n_special, special);
}

/// Ids of the fixture strings equal the reference's, through draftc's own
/// tokenizer wrapper (no BOS: draftc encodes without special tokens), and
/// decoding gives the text back; with special tokens, `<bos>` comes first.
#[test]
fn spm_ids_equal_the_reference() {
    let (files, _) = built();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("tokenizer.json"), &files.tokenizer_json).unwrap();
    std::fs::write(
        dir.path().join("tokenizer_config.json"),
        &files.tokenizer_config_json,
    )
    .unwrap();
    let tok = Tokenizer::from_dir(dir.path()).unwrap();
    let raw = tokenizers::Tokenizer::from_bytes(files.tokenizer_json.as_bytes()).unwrap();
    let fx = read_json(&fixture_dir().join("cases.json"));
    let bos = fx["bos_id"].as_u64().unwrap() as u32;
    let cases = fx["cases"].as_array().unwrap();
    assert!(cases.len() >= 30);
    let mut failures = Vec::new();
    for case in cases {
        let text = case["text"].as_str().unwrap();
        let want: Vec<u32> = case["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        // A raw prompt is encoded as transformers' `tokenizer(text)`:
        // <bos> first (the GGUF's add_bos_token), then the text's ids.
        let ids = tok.encode(text).unwrap();
        if ids.first() != Some(&bos) || ids[1..] != want[..] {
            failures.push(format!(
                "{text:?}: ours {ids:?}, reference <bos> + {want:?}"
            ));
            continue;
        }
        let ids = &ids[1..];
        let decoded = tok.decode(ids).unwrap();
        assert_eq!(decoded, case["decoded"].as_str().unwrap(), "{text:?}");
        if !text.contains('\u{2581}') {
            assert_eq!(decoded, text, "round trip");
        }
        let with_bos = raw.encode(text, true).unwrap().get_ids().to_vec();
        assert_eq!(
            with_bos,
            [&[bos][..], &want].concat(),
            "{text:?} with <bos>"
        );
    }
    assert!(
        failures.is_empty(),
        "{} of {} strings differ:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

/// No chat template in the GGUF: none in tokenizer_config.json either (the
/// CLI then asks for --raw). Special names come from the ids; only CONTROL
/// pieces (and Gemma's turn markers) count as additional special tokens.
#[test]
fn spm_tokenizer_config_names_the_special_tokens() {
    let (files, ours) = built();
    let config: Value = serde_json::from_str(&files.tokenizer_config_json).unwrap();
    assert!(config.get("chat_template").is_none(), "{config}");
    assert_eq!(config["bos_token"], "<bos>");
    assert_eq!(config["eos_token"], "<eos>");
    assert_eq!(config["unk_token"], "<unk>");
    assert_eq!(config["pad_token"], "<pad>");
    assert_eq!(config["model_max_length"], 32768);
    let names: Vec<&str> = config["additional_special_tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(names.len(), files.n_special);
    assert!(names.contains(&"<start_of_turn>") && names.contains(&"<unused5>"));
    assert!(!names.contains(&"[multimodal]") && !names.contains(&"\n"));
    // User-defined space runs are added tokens in their `▁` form.
    let added = ours["added_tokens"].as_array().unwrap();
    assert!(added
        .iter()
        .any(|t| t["content"] == "\u{2581}\u{2581}" && t["special"] == false));
    assert!(!added.iter().any(|t| t["content"] == "  "));
}

#[test]
fn spm_without_bos_or_with_eos_changes_the_post_processor() {
    let encode = |meta: Meta| {
        let files = build_tokenizer(&meta).unwrap();
        let tok = tokenizers::Tokenizer::from_bytes(files.tokenizer_json.as_bytes()).unwrap();
        tok.encode("Hello world", true).unwrap().get_ids().to_vec()
    };
    let plain = encode(Meta::fixture().set("tokenizer.ggml.add_bos_token", None));
    assert_eq!(plain.first(), Some(&2), "llama.cpp's default adds <bos>");
    let body = plain[1..].to_vec();
    let none =
        encode(Meta::fixture().set("tokenizer.ggml.add_bos_token", Some(GgufValue::Bool(false))));
    assert_eq!(none, body);
    let both =
        encode(Meta::fixture().set("tokenizer.ggml.add_eos_token", Some(GgufValue::Bool(true))));
    assert_eq!(both, [&[2][..], &body, &[1]].concat());
}

#[test]
fn unsupported_sentencepiece_vocabularies_are_refused_by_name() {
    let refuse = |meta: Meta| build_tokenizer(&meta).err().unwrap().to_string();
    let e = refuse(Meta::fixture().set(
        "tokenizer.ggml.model",
        Some(GgufValue::String("bert".into())),
    ));
    assert!(
        e.contains("tokenizer.ggml.model `bert` is not supported"),
        "{e}"
    );
    // Llama 2 / Mistral style: a dummy-prefix space (absent means true).
    for value in [None, Some(GgufValue::Bool(true))] {
        let e = refuse(Meta::fixture().set("tokenizer.ggml.add_space_prefix", value));
        assert!(e.contains("add_space_prefix"), "{e}");
    }
    let e = refuse(Meta::fixture().set("tokenizer.ggml.scores", None));
    assert!(e.contains("tokenizer.ggml.scores"), "{e}");
    // A byte piece renamed: byte fallback would silently lose that byte.
    let meta = Meta::fixture();
    let tokens: Vec<GgufValue> = meta
        .require_array("tokenizer.ggml.tokens")
        .unwrap()
        .iter()
        .map(|t| match t.as_str() {
            Some("<0x41>") => GgufValue::String("<0x41x>".into()),
            _ => t.clone(),
        })
        .collect();
    let ty = meta.get_value("tokenizer.ggml.tokens").unwrap().clone();
    let GgufValue::Array(elem, _) = ty else {
        panic!("tokens are not an array")
    };
    let e = refuse(meta.set(
        "tokenizer.ggml.tokens",
        Some(GgufValue::Array(elem, tokens)),
    ));
    assert!(e.contains("<0x41>"), "{e}");
}

/// The real Gemma 3 270M GGUF (`$DRAFTC_GEMMA_GGUF`, else the one `draftc
/// fetch gemma-3-270m` downloads, fetched here if missing): sizes and ids
/// as the reference tokenizer built from the same file gives them. With
/// `$DRAFTC_SPM_DUMP` set, the built tokenizer.json is written there.
#[test]
#[ignore = "downloads the Gemma 3 270M GGUF (253 MB) unless $DRAFTC_GEMMA_GGUF names it"]
fn real_gemma3_tokenizer_matches_reference_ids() {
    let path = match std::env::var_os("DRAFTC_GEMMA_GGUF") {
        Some(p) => PathBuf::from(p),
        None => {
            use draftc_runtime::model::convert::ConvertOptions;
            use draftc_runtime::model::fetch::{cache_dir, fetch, GEMMA3_270M};
            use draftc_runtime::model::safetensors_io::WeightDtype;
            let opts = ConvertOptions {
                dtype: WeightDtype::F32,
                progress: false,
            };
            fetch(&GEMMA3_270M, &cache_dir().unwrap(), &opts)
                .unwrap()
                .gguf
        }
    };
    let gguf = Gguf::open(&path).unwrap();
    let t0 = std::time::Instant::now();
    let files = build_tokenizer(&gguf).unwrap();
    eprintln!("build_tokenizer: {:.2?}", t0.elapsed());
    if let Some(dump) = std::env::var_os("DRAFTC_SPM_DUMP") {
        std::fs::write(dump, &files.tokenizer_json).unwrap();
    }
    assert_eq!(
        (files.vocab_size, files.n_merges, files.n_special),
        (262_144, 514_906, 6249)
    );
    let config: Value = serde_json::from_str(&files.tokenizer_config_json).unwrap();
    assert!(config.get("chat_template").is_none());
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("tokenizer.json"), &files.tokenizer_json).unwrap();
    let tok = Tokenizer::from_file(&dir.path().join("tokenizer.json")).unwrap();
    assert_eq!(tok.vocab_size(), 262_144);
    let cases: [(&str, &[u32]); 12] = [
        (
            "Hello, world! How are you today?",
            &[9259, 236764, 1902, 236888, 2088, 659, 611, 3124, 236881],
        ),
        ("  two leading spaces", &[138, 13498, 5830, 9952]),
        (
            "multiple    internal     spaces",
            &[43819, 140, 21621, 141, 35220],
        ),
        (
            "def f(x):\n    return x * 2  # comment\n",
            &[
                2063, 517, 236769, 236781, 1473, 107, 140, 2060, 1123, 808, 236743, 236778, 138,
                236865, 5739, 107,
            ],
        ),
        (
            "\ttab\tseparated\t\tvalues",
            &[255968, 4823, 255968, 74010, 255969, 7558],
        ),
        (
            "xxx                                        y",
            &[41128, 167, 145, 236762],
        ),
        (
            "naïve café résumé — “quotes” ‘single’ …",
            &[
                1789, 238527, 560, 33443, 118515, 2192, 999, 52231, 236919, 2141, 18999, 236858,
                7881,
            ],
        ),
        (
            "emoji 😀🎉👍🏽 family 👨\u{200d}👩\u{200d}👧\u{200d}👦",
            &[
                67906, 163543, 242061, 240493, 242713, 2523, 236743, 243874, 237243, 243767,
                237243, 244814, 237243, 244990,
            ],
        ),
        (
            "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n",
            &[
                105, 2364, 107, 3689, 563, 236743, 236778, 236862, 236778, 236881, 106, 107, 105,
                4368, 107,
            ],
        ),
        (
            "日本語のテキストです。",
            &[94951, 236945, 95830, 3652, 236924],
        ),
        (
            "<table><tr><td>cell</td></tr></table> <h1>Title</h1>",
            &[168, 173, 175, 5447, 183, 181, 176, 236743, 184, 7396, 191],
        ),
        (
            "rare: \u{1F9EC} \u{10348} \u{0}",
            &[
                43128, 236787, 236743, 253633, 236743, 478, 382, 379, 374, 236743, 238,
            ],
        ),
    ];
    for (text, want) in cases {
        let ids = tok.encode(text).unwrap();
        assert_eq!((ids[0], &ids[1..]), (2, want), "{text:?} after <bos> (2)");
        assert_eq!(tok.decode(&ids[1..]).unwrap(), text);
    }
}
