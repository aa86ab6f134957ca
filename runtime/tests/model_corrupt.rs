//! Bad input gives clear errors, never panics: truncated GGUF at every header
//! byte, flipped bytes in tensor headers and metadata, bad magic/version,
//! unsupported quant types, broken safetensors, wrong checksums. All files
//! are built in-process; nothing is downloaded.

mod model_support;

use std::collections::BTreeMap;

use draftc_runtime::model::convert::{convert_gguf, ConvertOptions};
use draftc_runtime::model::dequant::GgmlType;
use draftc_runtime::model::fetch::verify_sha256;
use draftc_runtime::model::gguf::Gguf;
use draftc_runtime::model::gguf_value::GgufValue;
use draftc_runtime::model::safetensors_io::{SafetensorsFile, SafetensorsWriter, WeightDtype};
use draftc_runtime::model::ModelError;
use model_support::*;

fn parse_err(bytes: Vec<u8>) -> String {
    match Gguf::parse(bytes) {
        Ok(_) => panic!("corrupt GGUF parsed without error"),
        Err(e) => e.to_string(),
    }
}

/// One F32 tensor "w" of dims [4, 2]; returns bytes and the offsets of its
/// n_dims, dims[0], type and data-offset fields.
fn one_tensor() -> (Vec<u8>, [usize; 4]) {
    let mut w = GgufWriter::new();
    w.kv("general.name", s("x"));
    w.tensor("w", &[4, 2], GgmlType::F32, f32_bytes(&[1.0; 8]));
    let (bytes, infos_at, _) = w.build_with_offsets();
    let n_dims = infos_at + 8 + 1;
    (
        bytes,
        [n_dims, n_dims + 4, n_dims + 4 + 16, n_dims + 4 + 16 + 4],
    )
}

#[test]
fn bad_magic_and_version() {
    let (mut bytes, _) = one_tensor();
    bytes[..4].copy_from_slice(b"GGML");
    let e = parse_err(bytes);
    assert!(
        e.contains("not a GGUF file") && e.contains("47, 47, 4d, 4c"),
        "{e}"
    );
    for v in [1u32, 4, 0xffff_ffff] {
        let (mut bytes, _) = one_tensor();
        bytes[4..8].copy_from_slice(&v.to_le_bytes());
        assert!(parse_err(bytes).contains(&format!("unsupported GGUF version {v}")));
    }
    assert!(parse_err(Vec::new()).contains("truncated while reading magic"));
}

#[test]
fn every_truncation_is_an_error_naming_what_was_read() {
    let bytes = tiny_llama().build();
    let g = Gguf::parse(bytes.clone()).unwrap();
    let header_end = g.data_offset as usize;
    for cut in 0..bytes.len() {
        // Every header byte; then a sample of data cuts (all end inside data).
        if cut > header_end && cut % 97 != 0 {
            continue;
        }
        let e = match Gguf::parse(bytes[..cut].to_vec()) {
            Ok(_) => panic!("file cut at {cut} of {} parsed", bytes.len()),
            Err(e) => e,
        };
        let msg = e.to_string();
        match e {
            ModelError::Truncated { offset, .. } => assert!(offset as usize <= cut, "{msg}"),
            ModelError::TensorOutOfBounds { .. } => assert!(cut >= header_end - 32, "{msg}"),
            other => panic!("cut at {cut}: unexpected error {other}"),
        }
    }
    let tokens_at = find(&bytes, b"tokenizer.ggml.tokens") + 40;
    let e = parse_err(bytes[..tokens_at].to_vec());
    assert!(
        e.contains("`tokenizer.ggml.tokens`") && e.contains("truncated"),
        "{e}"
    );
    let e = parse_err(bytes[..bytes.len() - 1].to_vec());
    assert!(
        e.contains("tensor `output_norm.weight`") && e.contains("outside"),
        "{e}"
    );
}

fn find(hay: &[u8], needle: &[u8]) -> usize {
    hay.windows(needle.len()).position(|w| w == needle).unwrap()
}

#[test]
fn flipped_tensor_header_fields() {
    let (base, [n_dims, dim0, ty, offset]) = one_tensor();
    let patch = |at: usize, value: &[u8]| {
        let mut b = base.clone();
        b[at..at + value.len()].copy_from_slice(value);
        parse_err(b)
    };
    let e = patch(n_dims, &9u32.to_le_bytes());
    assert!(
        e.contains("tensor info `w`") && e.contains("9 dimensions (expected 1..=4)"),
        "{e}"
    );
    let e = patch(ty, &99u32.to_le_bytes());
    assert!(
        e.contains("tensor info `w`") && e.contains("unknown ggml type 99"),
        "{e}"
    );
    let e = patch(dim0, &u64::MAX.to_le_bytes());
    assert!(e.contains("implausible dimensions"), "{e}");
    let e = patch(dim0, &400u64.to_le_bytes());
    assert!(e.contains("tensor `w`") && e.contains("outside"), "{e}");
    let e = patch(offset, &4u64.to_le_bytes());
    assert!(
        e.contains("data offset 4 is not a multiple of the alignment 32"),
        "{e}"
    );
    let e = patch(offset, &(1u64 << 60).to_le_bytes());
    assert!(e.contains("tensor `w`") && e.contains("outside"), "{e}");
    let e = patch(ty, &GgmlType::Q8_0.0.to_le_bytes());
    assert!(
        e.contains("row length 4 is not a multiple of the Q8_0 block size 32"),
        "{e}"
    );
}

#[test]
fn corrupt_metadata() {
    let mut w = GgufWriter::new();
    w.kv("flag", GgufValue::Bool(true));
    let b = w.build();
    let at = find(&b, b"flag") + 4;
    let mut bad = b.clone();
    bad[at..at + 4].copy_from_slice(&77u32.to_le_bytes());
    assert!(parse_err(bad).contains("unknown value type 77"));
    let mut bad = b.clone();
    bad[at + 4] = 2;
    assert!(parse_err(bad).contains("bool byte is 2"));
    let mut bad = b.clone();
    bad[at - 4] = 0xff;
    assert!(parse_err(bad).contains("not valid UTF-8"));
    // An array claiming 2^60 elements fails fast instead of allocating.
    let mut w = GgufWriter::new();
    w.kv(
        "arr",
        GgufValue::Array(
            draftc_runtime::model::gguf_value::GgufValueType::U32,
            vec![GgufValue::U32(1)],
        ),
    );
    let mut bad = w.build();
    let len_at = find(&bad, b"arr") + 3 + 4 + 4;
    bad[len_at..len_at + 8].copy_from_slice(&(1u64 << 60).to_le_bytes());
    let e = parse_err(bad);
    assert!(e.contains("array `arr`") && e.contains("truncated"), "{e}");
    let mut w = GgufWriter::new();
    w.kv("general.alignment", GgufValue::U32(48));
    assert!(parse_err(w.build()).contains("not a power of two"));
}

#[test]
fn single_byte_flips_never_panic() {
    let bytes = tiny_llama().build();
    let header_end = Gguf::parse(bytes.clone()).unwrap().data_offset as usize;
    // Flip each header byte outside the big token/merge string arrays, and a
    // sample inside them.
    for at in (0..header_end).filter(|i| i % 7 == 0 || *i < 600 || *i > header_end - 1500) {
        for flip in [0x01u8, 0x80, 0xff] {
            let mut b = bytes.clone();
            b[at] ^= flip;
            if let Ok(g) = Gguf::parse(b) {
                for t in g.tensors.clone() {
                    let _ = g.tensor_f32(&t);
                }
            }
        }
    }
}

#[test]
fn unsupported_quant_type_is_named() {
    let mut w = GgufWriter::new();
    w.tensor(
        "blk.0.attn_q.weight",
        &[256, 1],
        GgmlType(16),
        vec![0u8; 66],
    );
    let g = Gguf::parse(w.build()).expect("IQ2_XXS is a known type, so the file parses");
    let e = g.tensor_f32(&g.tensors[0]).unwrap_err().to_string();
    assert!(
        e.contains("`blk.0.attn_q.weight`")
            && e.contains("IQ2_XXS (tag 16)")
            && e.contains("cannot dequantise"),
        "{e}"
    );
    // The message lists every type draftc decodes.
    let supported = e.split("supported: ").nth(1).unwrap_or_default();
    for ty in (0..40).filter_map(GgmlType::from_tag) {
        assert_eq!(
            supported.contains(ty.name()),
            ty.is_supported(),
            "{} in {e}",
            ty.name()
        );
    }

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("q.gguf");
    let opts = ConvertOptions {
        dtype: WeightDtype::F32,
        progress: false,
    };
    let retype = |ty: GgmlType, block_bytes: u64| {
        let mut w = tiny_llama();
        for t in w
            .tensors
            .iter_mut()
            .filter(|t| t.name == "blk.1.ffn_up.weight")
        {
            t.ty = ty;
            t.data = vec![0u8; (FFN * D / 32 * block_bytes) as usize];
        }
        w.build()
    };
    // IQ4_NL has 32-weight blocks, so the file parses and conversion reaches the tensor.
    std::fs::write(&path, retype(GgmlType(20), 18)).unwrap();
    let e = convert_gguf(&path, &dir.path().join("out"), &opts)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("`blk.1.ffn_up.weight`")
            && e.contains("IQ4_NL (tag 20)")
            && e.contains("cannot dequantise"),
        "{e}"
    );
    // Q4_K blocks hold 256 weights: rows of 32 cannot be Q4_K.
    std::fs::write(&path, retype(GgmlType(12), 18)).unwrap();
    let e = convert_gguf(&path, &dir.path().join("out"), &opts)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("blk.1.ffn_up.weight") && e.contains("Q4_K block size 256"),
        "{e}"
    );
}

#[test]
fn broken_safetensors_are_reported() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.safetensors");
    let tensors = vec![
        ("a".to_string(), vec![2u64, 3]),
        ("b".to_string(), vec![4u64]),
    ];
    let mut w =
        SafetensorsWriter::create(&path, WeightDtype::F32, &tensors, &BTreeMap::new()).unwrap();
    w.write_tensor("a", &[1.0; 6]).unwrap();
    w.write_tensor("b", &[2.0; 4]).unwrap();
    w.finish().unwrap();
    let st = SafetensorsFile::open(&path).unwrap();
    assert_eq!(st.tensor_f32("a", &[2, 3]).unwrap(), vec![1.0; 6]);

    let mut expected = tensors.clone();
    expected.push(("model.norm.weight".to_string(), vec![4]));
    let e = st.check_tensors(&expected).unwrap_err().to_string();
    assert!(
        e.contains("missing tensor `model.norm.weight`") && e.contains("m.safetensors"),
        "{e}"
    );
    let e = st.tensor_f32("b", &[5]).unwrap_err().to_string();
    assert!(
        e.contains("tensor `b`: expected shape [5], found [4]"),
        "{e}"
    );

    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() - 3]).unwrap();
    let e = SafetensorsFile::open(&path)
        .err()
        .expect("truncated file is rejected")
        .to_string();
    assert!(
        e.contains("safetensors file") && e.contains("m.safetensors"),
        "{e}"
    );

    let mut w =
        SafetensorsWriter::create(&path, WeightDtype::F32, &tensors, &BTreeMap::new()).unwrap();
    w.write_tensor("a", &[1.0; 6]).unwrap();
    let e = w.write_tensor("a", &[1.0; 6]).unwrap_err().to_string();
    assert!(e.contains("where `b` of shape [4] was declared"), "{e}");
    let w = SafetensorsWriter::create(&path, WeightDtype::F32, &tensors, &BTreeMap::new()).unwrap();
    assert!(w
        .finish()
        .unwrap_err()
        .to_string()
        .contains("`a` declared but never written"));
}

#[test]
fn checksum_mismatch_names_both_hashes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("x.whl");
    std::fs::write(&path, b"not the wheel").unwrap();
    let expected = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70";
    let e = verify_sha256(&path, expected).unwrap_err().to_string();
    assert!(
        e.contains("checksum mismatch") && e.contains(expected) && e.contains("x.whl"),
        "{e}"
    );
    let e = verify_sha256(&dir.path().join("absent"), expected)
        .unwrap_err()
        .to_string();
    assert!(e.contains("absent"), "{e}");
}

#[test]
fn inconsistent_or_unsupported_metadata_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.gguf");
    let opts = ConvertOptions {
        dtype: WeightDtype::F32,
        progress: false,
    };
    let cases: [(&str, GgufValue, &str); 5] = [
        (
            "llama.attention.head_count",
            GgufValue::U32(5),
            "hidden_size 32 is not divisible by num_attention_heads 5",
        ),
        (
            "llama.attention.head_count_kv",
            GgufValue::U32(3),
            "num_attention_heads 2 is not divisible by num_key_value_heads 3",
        ),
        (
            "general.architecture",
            s("gpt2"),
            "architecture `gpt2` is not supported",
        ),
        (
            "tokenizer.ggml.pre",
            s("deepseek-llm"),
            "pre-tokeniser `deepseek-llm` is not supported",
        ),
        (
            "llama.block_count",
            s("two"),
            "metadata key `llama.block_count`: expected an unsigned integer, found String",
        ),
    ];
    for (key, value, expected) in cases {
        let mut w = tiny_llama();
        for (k, v) in w.metadata.iter_mut() {
            if k == key {
                *v = value.clone();
            }
        }
        std::fs::write(&path, w.build()).unwrap();
        let e = convert_gguf(&path, &dir.path().join("out"), &opts)
            .unwrap_err()
            .to_string();
        assert!(e.contains(expected), "{key}: {e}");
    }
    for key in ["llama.embedding_length", "tokenizer.ggml.pre"] {
        let mut w = tiny_llama();
        w.metadata.retain(|(k, _)| k != key);
        std::fs::write(&path, w.build()).unwrap();
        let e = convert_gguf(&path, &dir.path().join("out"), &opts)
            .unwrap_err()
            .to_string();
        assert!(e.contains(&format!("missing metadata key `{key}`")), "{e}");
    }
}

#[test]
fn converted_dir_with_a_missing_tensor_is_rejected_on_open() {
    use draftc_runtime::model::names::expected_tensors;
    use draftc_runtime::model::ConvertedModel;
    let dir = tempfile::tempdir().unwrap();
    let gguf = dir.path().join("tiny.gguf");
    std::fs::write(&gguf, tiny_llama().build()).unwrap();
    let out = dir.path().join("hf");
    let opts = ConvertOptions {
        dtype: WeightDtype::F32,
        progress: false,
    };
    convert_gguf(&gguf, &out, &opts).unwrap();
    let model = ConvertedModel::open(&out).unwrap();
    assert_eq!(
        model.tensor_f32("model.norm.weight").unwrap().len(),
        D as usize
    );
    let e = model
        .tensor_f32("lm_head.weight")
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("missing tensor `lm_head.weight`"), "{e}");

    // Rewrite model.safetensors without one layer norm.
    let dropped = "model.layers.1.input_layernorm.weight";
    let all = expected_tensors(&model.config);
    let kept: Vec<_> = all.iter().filter(|(n, _)| n != dropped).cloned().collect();
    let path = out.join("model.safetensors");
    let values: Vec<Vec<f32>> = kept
        .iter()
        .map(|(n, s)| model.weights.tensor_f32(n, s).unwrap())
        .collect();
    drop(model);
    let mut w =
        SafetensorsWriter::create(&path, WeightDtype::F32, &kept, &BTreeMap::new()).unwrap();
    for ((n, _), v) in kept.iter().zip(&values) {
        w.write_tensor(n, v).unwrap();
    }
    w.finish().unwrap();
    let e = ConvertedModel::open(&out)
        .err()
        .expect("missing tensor is an error")
        .to_string();
    assert!(
        e.contains(&format!("missing tensor `{dropped}`")) && e.contains("model.safetensors"),
        "{e}"
    );
}

/// The tiny transformers-made checkpoint `name` (see target_fixtures.rs)
/// copied into a temporary directory, to be broken there.
fn fixture_copy(name: &str) -> tempfile::TempDir {
    let src = draftc_ir::testing::repo()
        .join("runtime/tests/fixtures/targets")
        .join(name);
    let dir = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(&src).unwrap() {
        let p = e.unwrap().path();
        std::fs::copy(&p, dir.path().join(p.file_name().unwrap())).unwrap();
    }
    dir
}

/// A config edit, then `LlamaConfig::load` of the result.
type ConfigEdit<'a> = dyn Fn(&mut serde_json::Map<String, serde_json::Value>) + 'a;

/// The fixture `name` copied (kept alive by the returned directory) without
/// its generation_config.json, and a loader that applies an edit to its
/// config.json and reads it back.
#[allow(clippy::type_complexity)]
fn config_editor(
    name: &str,
) -> (
    tempfile::TempDir,
    impl Fn(&ConfigEdit<'_>) -> Result<draftc_runtime::model::config::LlamaConfig, String>,
) {
    let dir = fixture_copy(name);
    // config.json alone: generation_config.json's eos ids would join the
    // config's (target_fixtures.rs tests that).
    let _ = std::fs::remove_file(dir.path().join("generation_config.json"));
    let path = dir.path().join("config.json");
    let base: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let load = move |edit: &ConfigEdit<'_>| {
        let mut v = base.clone();
        edit(v.as_object_mut().unwrap());
        std::fs::write(&path, v.to_string()).unwrap();
        draftc_runtime::model::config::LlamaConfig::load(&path).map_err(|e| e.to_string())
    };
    (dir, load)
}

#[test]
fn config_json_is_read_as_transformers_reads_it() {
    let (_dir, load) = config_editor("llama-tied");
    // transformers' LlamaConfig defaults for what may be absent.
    let c = load(&|m| {
        for k in [
            "head_dim",
            "num_key_value_heads",
            "tie_word_embeddings",
            "rope_theta",
            "rms_norm_eps",
            "hidden_act",
            "bos_token_id",
            "eos_token_id",
            "rope_scaling",
        ] {
            m.remove(k);
        }
    })
    .unwrap();
    assert_eq!(
        (c.head_dim, c.num_key_value_heads, c.tie_word_embeddings),
        (8, 4, false)
    );
    assert_eq!((c.rope_theta, c.rms_norm_eps), (10_000.0, 1e-6));
    assert_eq!((c.bos_token_id, c.eos_token_id.clone()), (Some(1), vec![2]));
    // A list of eos ids is kept whole, and written back as transformers does.
    let c = load(&|m| {
        m.insert("eos_token_id".into(), serde_json::json!([2, 5, 7]));
    })
    .unwrap();
    assert_eq!(c.eos_token_id, vec![2, 5, 7]);
    assert!(
        c.to_json().contains("\"eos_token_id\": [\n    2,"),
        "{}",
        c.to_json()
    );
    // Whatever would change the computation and is not implemented is named.
    for (key, value, named) in [
        (
            "model_type",
            serde_json::json!("mistral"),
            "model_type `mistral`",
        ),
        (
            "rope_scaling",
            serde_json::json!({"rope_type": "yarn", "factor": 8.0}),
            "rope_scaling of type `yarn`",
        ),
        (
            "rope_scaling",
            serde_json::json!({"rope_type": "llama3", "factor": 8.0}),
            "needs positive factor, low_freq_factor",
        ),
        ("attention_bias", serde_json::json!(true), "attention_bias"),
        ("mlp_bias", serde_json::json!(true), "mlp_bias"),
        (
            "sliding_window",
            serde_json::json!(4096),
            "sliding_window: 4096",
        ),
        ("hidden_act", serde_json::json!("gelu"), "hidden_act `gelu`"),
        ("eos_token_id", serde_json::json!("2"), "config.json"),
    ] {
        let e = load(&|m| {
            m.insert(key.into(), value.clone());
        })
        .unwrap_err();
        assert!(e.contains(named) && e.contains("config.json"), "{key}: {e}");
    }
    let e = load(&|m| {
        m.remove("model_type");
    })
    .unwrap_err();
    assert!(e.contains("no `model_type`"), "{e}");
}

#[test]
fn a_gemma3_config_is_read_as_transformers_reads_it() {
    let (_dir, load) = config_editor("gemma3-tied");
    let c = load(&|_| {}).unwrap();
    let g = c.gemma.clone().unwrap();
    assert_eq!(
        (0..3).map(|i| g.sliding(i)).collect::<Vec<_>>(),
        [true, false, true],
        "layer_types win over `_sliding_window_pattern`"
    );
    assert_eq!((g.sliding_window, g.query_pre_attn_scalar), (4, 32.0));
    assert_eq!(
        c.hidden_act, "gelu_pytorch_tanh",
        "read from hidden_activation"
    );
    // Gemma3TextConfig's defaults: a tied head, head_dim 256, eos 1, and
    // without `layer_types` every sixth layer global.
    let c = load(&|m| {
        for k in [
            "layer_types",
            "_sliding_window_pattern",
            "tie_word_embeddings",
            "head_dim",
            "eos_token_id",
            "query_pre_attn_scalar",
        ] {
            m.remove(k);
        }
        m.insert("num_hidden_layers".into(), serde_json::json!(12));
        m.insert("hidden_size".into(), serde_json::json!(1024));
    })
    .unwrap();
    let g = c.gemma.clone().unwrap();
    let full: Vec<usize> = (0..12).filter(|&i| !g.sliding(i)).collect();
    assert_eq!(full, [5, 11]);
    assert_eq!((c.tie_word_embeddings, c.head_dim), (true, 256));
    assert_eq!(
        (c.eos_token_id.clone(), g.query_pre_attn_scalar),
        (vec![1], 256.0)
    );
    let c = load(&|m| {
        m.remove("layer_types");
        m.insert("sliding_window_pattern".into(), serde_json::json!(2));
    })
    .unwrap();
    let g = c.gemma.unwrap();
    assert_eq!(
        (0..3).map(|i| g.sliding(i)).collect::<Vec<_>>(),
        [true, false, true]
    );
    // What would change the computation and is not built is named.
    for (key, value, named) in [
        (
            "final_logit_softcapping",
            serde_json::json!(30.0),
            "final_logit_softcapping",
        ),
        (
            "attn_logit_softcapping",
            serde_json::json!(50.0),
            "attn_logit_softcapping",
        ),
        (
            "rope_scaling",
            serde_json::json!({"rope_type": "linear", "factor": 8.0}),
            "rope_scaling",
        ),
        (
            "hidden_activation",
            serde_json::json!("gelu"),
            "hidden_activation `gelu`",
        ),
        (
            "layer_types",
            serde_json::json!(["sliding_attention"]),
            "1 entries for 3 layers",
        ),
        (
            "layer_types",
            serde_json::json!(["sliding_attention", "chunked_attention", "full_attention"]),
            "layer type `chunked_attention`",
        ),
        ("sliding_window", serde_json::json!(0), "sliding_window: 0"),
        (
            "model_type",
            serde_json::json!("gemma3"),
            "multimodal Gemma 3",
        ),
    ] {
        let e = load(&|m| {
            m.insert(key.into(), value.clone());
        })
        .unwrap_err();
        assert!(e.contains(named) && e.contains("config.json"), "{key}: {e}");
    }
}

#[test]
fn a_broken_shard_index_is_named_before_anything_runs() {
    use draftc_runtime::model::ConvertedModel;
    let name = "model.safetensors.index.json";
    let dir = fixture_copy("llama-untied");
    let index_path = dir.path().join(name);
    let base: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&index_path).unwrap()).unwrap();
    ConvertedModel::open(dir.path()).unwrap();
    let open_with = |edit: &dyn Fn(&mut serde_json::Value)| {
        let mut v = base.clone();
        edit(&mut v);
        std::fs::write(&index_path, v.to_string()).unwrap();
        ConvertedModel::open(dir.path()).err().unwrap().to_string()
    };
    let shard_of =
        |v: &serde_json::Value, t: &str| v["weight_map"][t].as_str().unwrap().to_string();
    // A tensor the index places in a shard that does not hold it.
    let other = (1..=4)
        .map(|i| format!("model-0000{i}-of-00004.safetensors"))
        .find(|f| *f != shard_of(&base, "lm_head.weight"))
        .unwrap();
    let e = open_with(&|v| v["weight_map"]["lm_head.weight"] = other.clone().into());
    assert!(e.contains("`lm_head.weight`") && e.contains(&other), "{e}");
    // A shard that leaves the directory, and one that is missing.
    let e = open_with(&|v| v["weight_map"]["lm_head.weight"] = "../x.safetensors".into());
    assert!(
        e.contains("not a file in the checkpoint's directory"),
        "{e}"
    );
    let e = open_with(&|v| v["weight_map"]["lm_head.weight"] = "absent.safetensors".into());
    assert!(e.contains("absent.safetensors"), "{e}");
    // A tensor the index does not list at all.
    let e = open_with(&|v| {
        v["weight_map"]
            .as_object_mut()
            .unwrap()
            .remove("lm_head.weight");
    });
    assert!(
        e.contains("missing tensor `lm_head.weight`") && e.contains(name),
        "{e}"
    );
    let e = open_with(&|v| *v = serde_json::json!({"metadata": {}}));
    assert!(e.contains("no `weight_map`"), "{e}");
}

/// Llama 3.1's RoPE scaling as a GGUF keeps it (llama.cpp's per-frequency
/// factors) gives back parameters that compute the same factors; factors
/// of another kind are refused.
#[test]
fn llama3_scaling_is_recovered_from_rope_factors() {
    use draftc_runtime::model::config::{
        llama3_from_rope_factors, llama3_rope_factors, Llama3Rope, Llama3Tag,
    };
    let llama31 = Llama3Rope {
        rope_type: Llama3Tag,
        factor: 8.0,
        low_freq_factor: 1.0,
        high_freq_factor: 4.0,
        original_max_position_embeddings: 8192,
    };
    for (hd, theta) in [
        (128, 500_000.0),
        (64, 500_000.0),
        (8, 10_000.0),
        (16, 10_000.0),
    ] {
        let factors: Vec<f32> = llama3_rope_factors(hd, theta, &llama31)
            .iter()
            .map(|&x| x as f32)
            .collect();
        let got = llama3_from_rope_factors(&factors, hd, theta)
            .unwrap_or_else(|| panic!("head_dim {hd}: no parameters for {factors:?}"));
        let again = llama3_rope_factors(hd, theta, &got);
        for (a, b) in again.iter().zip(&factors) {
            assert!(
                (a - f64::from(*b)).abs() <= 1e-5 * a,
                "head_dim {hd}: {got:?}"
            );
        }
        if hd == 128 {
            // Enough blended frequencies to fix the parameters themselves.
            assert_eq!(got, llama31);
        }
    }
    // Not Llama 3's: a factor below one, a ramp that is not its blend.
    let ramp: Vec<f32> = (0..64).map(|i| 1.0 + i as f32 * 0.1).collect();
    assert!(llama3_from_rope_factors(&ramp, 128, 500_000.0).is_none());
    assert!(llama3_from_rope_factors(&[0.5; 64], 128, 500_000.0).is_none());
    assert!(
        llama3_from_rope_factors(&[1.0; 3], 128, 500_000.0).is_none(),
        "wrong length"
    );
}
