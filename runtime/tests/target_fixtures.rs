//! draftc against transformers on tiny random checkpoints that transformers
//! itself made and ran (`runtime/tests/fixtures/targets/`, written by
//! `tools/fixtures/tiny_targets.py`, which records the versions): a Llama
//! with a tied head in one `model.safetensors`, one with its own head, a
//! list of eos ids and four shards behind an index, a Qwen 2 (q/k/v
//! biases, `models/qwen2.draft`, chosen by `model_type`), a Llama with
//! Llama 3.1's RoPE scaling (`rope_scaling=llama3`), and a Qwen 3 (per-head
//! q/k norms, `head_dim` apart from hidden / heads) and a Gemma 3 (sliding
//! and global layers, a window the prompts cross, unit-offset norms before
//! and after each block, GeGLU, a scores' scale apart from 1/√hd), both
//! made by `tools/fixtures/tiny_targets_recent.py` with a newer
//! transformers. Each opens as a
//! Hugging Face directory, matches transformers' first-step logits and
//! greedy ids, and decodes the same ids speculatively (prompt lookup, and
//! model drafters on random weights whose `target.lm_head` is the
//! checkpoint's head). Each also ships as a GGUF that the `gguf` package
//! wrote (`model.gguf`, `tools/fixtures/gguf_targets.py`: llama.cpp's
//! names, keys and Q/K permutation); converted by `draftc convert`, it gives
//! the same logits and ids.

use std::path::PathBuf;

use draftc_codegen::PlanDType;
use draftc_ops::testing::wgpu_client;
use draftc_runtime::engine::{generate, weight_specs, Request, Sampling, Stops, TargetModel};
use draftc_runtime::exec::HostWeights;
use draftc_runtime::model::ConvertedModel;
use serde::Deserialize;

mod tiny;

type Wgpu = cubecl::wgpu::WgpuRuntime;

#[derive(Deserialize)]
struct Expected {
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    text: String,
    prompt: Vec<u32>,
    greedy: Vec<u32>,
    first_logits: Vec<f32>,
}

fn dir(name: &str) -> PathBuf {
    tiny::repo()
        .join("runtime/tests/fixtures/targets")
        .join(name)
}

fn open(name: &str) -> (ConvertedModel, Expected) {
    let d = dir(name);
    let model = ConvertedModel::open(&d).unwrap_or_else(|e| panic!("{name}: {e}"));
    let text = std::fs::read_to_string(d.join("expected.json")).unwrap();
    (model, serde_json::from_str(&text).unwrap())
}

fn load(model: &ConvertedModel, e: &Expected) -> TargetModel<Wgpu> {
    let capacity = e
        .cases
        .iter()
        .map(|c| c.prompt.len() + c.greedy.len() + 16)
        .max()
        .unwrap_or(0);
    TargetModel::load(
        &wgpu_client(),
        model,
        e.cases.len(),
        capacity,
        PlanDType::F32,
    )
    .unwrap()
}

fn requests(e: &Expected) -> Vec<Request> {
    e.cases
        .iter()
        .map(|c| Request {
            prompt: c.prompt.clone(),
        })
        .collect()
}

/// The last-row logits of every case's prompt, prefilled together
/// (`[cases, vocab]`, row-major).
fn first_logits(t: &mut TargetModel<Wgpu>, e: &Expected) -> Vec<f32> {
    let prompts: Vec<(usize, Vec<u32>)> = e
        .cases
        .iter()
        .map(|c| c.prompt.clone())
        .enumerate()
        .collect();
    let (last, _) = t.prefill(&prompts, |_, _, _| Ok(())).unwrap();
    last.download_f32(t.client()).unwrap()
}

/// transformers' greedy ids for each case, and draftc's autoregressive ones
/// for the same prompts (no stop id: transformers ran to the limit).
fn greedy(t: &mut TargetModel<Wgpu>, e: &Expected) -> (Vec<Vec<u32>>, Vec<Vec<u32>>) {
    let want: Vec<Vec<u32>> = e.cases.iter().map(|c| c.greedy.clone()).collect();
    let n = e.cases[0].greedy.len();
    let got = generate(
        t,
        &requests(e),
        n,
        &Sampling::GREEDY,
        Stops::default(),
        &mut |_, _| {},
    )
    .unwrap()
    .tokens;
    (want, got)
}

const NAMES: [&str; 6] = [
    "llama-tied",
    "llama-untied",
    "qwen2-tied",
    "llama3-scaled",
    "qwen3-tied",
    "gemma3-tied",
];
/// The fixtures with a GGUF beside them (`llama3-scaled`'s keeps its RoPE
/// scaling as llama.cpp does, only as per-frequency factors,
/// `rope_freqs.weight`, which `draftc convert` turns back into parameters).
const GGUF_NAMES: [&str; 5] = [
    "llama-tied",
    "llama-untied",
    "qwen2-tied",
    "qwen3-tied",
    "llama3-scaled",
];

#[test]
fn checkpoints_open_as_transformers_saved_them() {
    let (tied, _) = open("llama-tied");
    assert!(tied.config.tie_word_embeddings);
    assert_eq!(tied.config.eos_token_id, vec![2]);
    let (untied, _) = open("llama-untied");
    assert!(!untied.config.tie_word_embeddings);
    assert_eq!(untied.config.eos_token_id.len(), 2, "a list of eos ids");
    assert!(dir("llama-untied")
        .join("model.safetensors.index.json")
        .is_file());
    assert!(untied
        .weights
        .names()
        .contains(&"lm_head.weight".to_string()));
    let (qwen2, _) = open("qwen2-tied");
    assert_eq!(qwen2.config.model_type, "qwen2");
    assert!(qwen2
        .weights
        .names()
        .contains(&"model.layers.1.self_attn.k_proj.bias".to_string()));
    let (qwen3, _) = open("qwen3-tied");
    assert_eq!(qwen3.config.model_type, "qwen3");
    assert_eq!(
        qwen3.config.head_dim, 24,
        "its own head_dim, not hidden / heads"
    );
    assert!(qwen3
        .weights
        .names()
        .contains(&"model.layers.1.self_attn.k_norm.weight".to_string()));
    let (gemma3, _) = open("gemma3-tied");
    assert_eq!(gemma3.config.model_type, "gemma3_text");
    assert!(gemma3
        .weights
        .names()
        .contains(&"model.layers.2.post_feedforward_layernorm.weight".to_string()));
    for (model, name) in [
        (&tied, "llama-tied"),
        (&qwen3, "qwen3-tied"),
        (&gemma3, "gemma3-tied"),
        (&untied, "llama-untied"),
        (&qwen2, "qwen2-tied"),
    ] {
        // The tokenizer encodes the recorded texts to the recorded prompts.
        let (_, e) = open(name);
        for c in &e.cases {
            assert_eq!(model.tokenizer.encode(&c.text).unwrap(), c.prompt, "{name}");
        }
    }
}

#[test]
fn first_step_logits_match_transformers() {
    for name in NAMES {
        let (model, e) = open(name);
        let mut t = load(&model, &e);
        let got = first_logits(&mut t, &e);
        let v = t.vocab;
        for (i, c) in e.cases.iter().enumerate() {
            assert_eq!(c.first_logits.len(), v, "{name}");
            for (j, (&a, &b)) in got[i * v..(i + 1) * v]
                .iter()
                .zip(&c.first_logits)
                .enumerate()
            {
                assert!(
                    (a - b).abs() <= 1e-4 * (1.0 + b.abs()),
                    "{name} {:?}: logit {j}: draftc {a}, transformers {b}",
                    c.text
                );
            }
        }
    }
}

#[test]
fn greedy_ids_match_transformers_autoregressive_and_speculative() {
    for name in NAMES {
        let (model, e) = open(name);
        let mut t = load(&model, &e);
        let (want, ar) = greedy(&mut t, &e);
        assert_eq!(ar, want, "{name}: autoregressive");
        let reqs = requests(&e);
        let n = e.cases[0].greedy.len();

        let mut lookup = tiny::prompt_lookup(4, 2);
        let spec = tiny::greedy_speculative(&mut t, &mut lookup, &reqs, n, 4).unwrap();
        assert_eq!(spec.tokens, want, "{name}: prompt lookup");

        // Model drafters on random weights, their shared tensors (and
        // `target.lm_head`) the checkpoint's.
        let specs = weight_specs(&t.graph, &t.weights).unwrap();
        let tw = HostWeights::from_model(&model, &specs).unwrap();
        for drafter in ["medusa", "beagle", "eagle", "magicdec"] {
            let mut d = tiny::drafter(&t, &tw, drafter, None, PlanDType::F32);
            let spec = tiny::greedy_speculative(&mut t, d.as_mut(), &reqs, n, 3).unwrap();
            assert_eq!(spec.tokens, want, "{name}: {drafter}");
        }
    }
}

#[test]
fn a_list_of_eos_ids_stops_on_any_of_them() {
    // The untied checkpoint lists two eos ids, both reached mid-way by its
    // greedy runs (the fixture chose them so): a run stops at the first of
    // either.
    let (model, e) = open("llama-untied");
    let mut t = load(&model, &e);
    let eos = model.config.eos_token_id.clone();
    assert_eq!(t.eos, eos);
    let reqs = requests(&e);
    let n = e.cases[0].greedy.len();
    let stops = Stops(t.eos.clone());
    let run = generate(&mut t, &reqs, n, &Sampling::GREEDY, stops, &mut |_, _| {}).unwrap();
    let mut stopped = 0;
    for (got, c) in run.tokens.iter().zip(&e.cases) {
        let end = c
            .greedy
            .iter()
            .position(|x| eos.contains(x))
            .map_or(c.greedy.len(), |p| p + 1);
        stopped += (end < c.greedy.len()) as usize;
        assert_eq!(got, &c.greedy[..end], "{:?}", c.text);
    }
    assert!(stopped >= 2, "both eos ids end some run early");
}

#[test]
fn gguf_written_by_the_gguf_package_converts_to_the_same_model() {
    use draftc_runtime::model::convert::{convert_gguf, ConvertOptions};
    use draftc_runtime::model::safetensors_io::WeightDtype;
    for name in GGUF_NAMES {
        let (hf, e) = open(name);
        let out = tempfile::tempdir().unwrap();
        let opts = ConvertOptions {
            dtype: WeightDtype::F32,
            progress: false,
        };
        convert_gguf(&dir(name).join("model.gguf"), out.path(), &opts)
            .unwrap_or_else(|err| panic!("{name}: {err}"));
        let model = ConvertedModel::open(out.path()).unwrap();
        assert_eq!(model.config.model_type, hf.config.model_type, "{name}");
        assert_eq!(
            model.config.tie_word_embeddings, hf.config.tie_word_embeddings,
            "{name}"
        );
        // Every tensor equals the checkpoint's (Q/K un-permuted for Llama).
        for n in hf.weights.names() {
            let shape = hf.weights.shape(&n).unwrap();
            assert_eq!(
                model.weights.tensor_f32(&n, &shape).unwrap(),
                hf.weights.tensor_f32(&n, &shape).unwrap(),
                "{name}: {n}"
            );
        }
        let (want, got) = greedy(&mut load(&model, &e), &e);
        assert_eq!(got, want, "{name} from its GGUF");
    }
}

/// A Gemma 3 GGUF as llama.cpp's converter lays it out
/// (`tools/fixtures/gguf_gemma3.py`: norms stored as 1 + w, no Q/K
/// permutation, no `output.weight`) converts to the checkpoint's tensors.
/// Such a file does not say which layers slide or how the scores scale:
/// the converted config says what llama.cpp assumes (every sixth layer
/// global, 1/√head_dim), so its logits are the checkpoint's under those
/// settings, not transformers' (whose fixture slides layers 0 and 2 only
/// and scales by 32^-1/2).
#[test]
fn a_gemma3_gguf_converts_to_the_checkpoint_under_llama_cpps_assumptions() {
    use draftc_runtime::model::convert::{convert_gguf, ConvertOptions};
    use draftc_runtime::model::safetensors_io::WeightDtype;
    let (mut hf, e) = open("gemma3-tied");
    let out = tempfile::tempdir().unwrap();
    let opts = ConvertOptions {
        dtype: WeightDtype::F32,
        progress: false,
    };
    convert_gguf(&dir("gemma3-tied").join("model.gguf"), out.path(), &opts).unwrap();
    let model = ConvertedModel::open(out.path()).unwrap();
    assert_eq!(model.config.model_type, "gemma3_text");
    assert!(model.config.tie_word_embeddings);
    let g = model.config.gemma.clone().unwrap();
    assert_eq!((0..3).map(|i| g.sliding(i)).collect::<Vec<_>>(), [true; 3]);
    assert_eq!((g.sliding_window, g.query_pre_attn_scalar), (4, 16.0));
    for n in hf.weights.names() {
        let shape = hf.weights.shape(&n).unwrap();
        let (a, b) = (
            model.weights.tensor_f32(&n, &shape).unwrap(),
            hf.weights.tensor_f32(&n, &shape).unwrap(),
        );
        // Norms come back from 1 + w minus one: within an ulp of one.
        let tol = if n.ends_with("norm.weight") {
            1e-7
        } else {
            0.0
        };
        for (x, y) in a.iter().zip(&b) {
            assert!((x - y).abs() <= tol, "{n}: {x} vs {y}");
        }
    }
    hf.config.gemma = Some(g);
    let from_gguf = first_logits(&mut load(&model, &e), &e);
    let from_hf = first_logits(&mut load(&hf, &e), &e);
    for (i, (a, b)) in from_gguf.iter().zip(&from_hf).enumerate() {
        assert!(
            (a - b).abs() <= 1e-5 * (1.0 + b.abs()),
            "logit {i}: {a} vs {b}"
        );
    }
}

#[test]
fn llama3_rope_scaling_is_read_and_changes_the_logits() {
    let (model, e) = open("llama3-scaled");
    let s = model.config.rope_scaling.expect("rope_scaling read");
    assert_eq!(
        (
            s.factor,
            s.low_freq_factor,
            s.high_freq_factor,
            s.original_max_position_embeddings
        ),
        (8.0, 1.0, 4.0, 16)
    );
    // The same weights without the scaling give other logits (so the
    // logits test above does check the scaled frequencies).
    let mut plain = draftc_runtime::engine::target_config(&model.config);
    plain.flags.insert("rope_llama3".into(), false);
    let g = draftc_runtime::engine::compile_target(&plain).unwrap();
    let tw = draftc_codegen::TargetWeights::new(&plain, &g.meta.exports);
    let specs = weight_specs(&g, &tw).unwrap();
    let w = HostWeights::from_model(&model, &specs).unwrap();
    let mut t = TargetModel::from_parts(
        &wgpu_client(),
        g,
        plain,
        w,
        e.cases.len(),
        64,
        PlanDType::F32,
    )
    .unwrap();
    let got = first_logits(&mut t, &e);
    let v = t.vocab;
    let far = e
        .cases
        .iter()
        .enumerate()
        .filter(|(i, c)| {
            got[i * v..(i + 1) * v]
                .iter()
                .zip(&c.first_logits)
                .any(|(a, b)| (a - b).abs() > 1e-3)
        })
        .count();
    assert!(
        far >= e.cases.len() - 1,
        "unscaled RoPE matched transformers' scaled logits"
    );
}

#[test]
fn generation_config_eos_ids_are_stop_ids_too() {
    // transformers' `generate` stops on generation_config.json's eos ids
    // (instruction models list their end-of-turn token there): they join
    // config.json's, in that order; a malformed file is an error naming it.
    use draftc_runtime::model::config::LlamaConfig;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.json");
    std::fs::copy(self::dir("llama-tied").join("config.json"), &config).unwrap();
    assert_eq!(LlamaConfig::load(&config).unwrap().eos_token_id, vec![2]);
    let generation = dir.path().join("generation_config.json");
    std::fs::write(&generation, r#"{"eos_token_id": [7, 2, 9]}"#).unwrap();
    assert_eq!(
        LlamaConfig::load(&config).unwrap().eos_token_id,
        vec![2, 7, 9]
    );
    std::fs::write(&generation, r#"{"eos_token_id": 300}"#).unwrap();
    let err = LlamaConfig::load(&config).unwrap_err().to_string();
    assert!(err.contains("eos"), "{err}");
    std::fs::write(&generation, r#"{"eos_token_id": "x"}"#).unwrap();
    let err = LlamaConfig::load(&config).unwrap_err().to_string();
    assert!(err.contains("generation_config.json"), "{err}");
}
