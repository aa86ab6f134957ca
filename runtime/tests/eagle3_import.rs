//! EAGLE-3 heads trained elsewhere load into `models/eagle3.draft`
//! (`runtime/src/model/eagle3_head.rs`): a random head for a tiny eight-layer
//! Llama, saved as SpecForge and SafeAILab/EAGLE save heads (a
//! `model.safetensors` in f32; a `pytorch_model.bin` in f16 with the
//! target's embedding beside it), by `tools/fixtures/eagle3_head.py`, which
//! also runs the head as vLLM does (no row for token 0, draft id i is target
//! id i + d2t[i]) and records the greedy chain of three it drafts after each
//! prompt. Through `draftc`'s own drafter construction (`make_drafter`,
//! what `--drafter-weights DIR` does) the engine drafts the same chain with
//! the same log-probabilities, decodes losslessly, and refuses, by the
//! field's name, a head whose config does not fit the target.

mod tiny;

use std::path::{Path, PathBuf};

use draftc_codegen::PlanDType;
use draftc_ops::testing::wgpu_client;
use draftc_runtime::cli::drafter::{make_drafter, DrafterChoice};
use draftc_runtime::engine::{
    generate, generate_speculative, Request, Sampling, SeqView, SpecGeneration, Stops, TargetModel,
};
use draftc_runtime::model::ConvertedModel;
use draftc_runtime::speculation::DraftTree;
use serde::Deserialize;
use tiny::{repo, Watch, Watched};

type Wgpu = cubecl::wgpu::WgpuRuntime;

#[derive(Deserialize)]
struct Reference {
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    prompt: Vec<u32>,
    next: u32,
    chain: Vec<Step>,
}

#[derive(Deserialize)]
struct Step {
    token: u32,
    logprob: f32,
}

const HEADS: [&str; 2] = ["head-safetensors", "head-bin"];

fn fixture(p: &str) -> PathBuf {
    repo().join("runtime/tests/fixtures/eagle3-head").join(p)
}

fn reference() -> Reference {
    let text = std::fs::read_to_string(fixture("reference.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn target(slots: usize) -> (ConvertedModel, TargetModel<Wgpu>) {
    let model = ConvertedModel::open(&fixture("target")).unwrap();
    let t = TargetModel::load(&wgpu_client(), &model, slots, 96, PlanDType::F32).unwrap();
    (model, t)
}

/// `models/eagle3.draft` with the head at `weights`, as `--drafter-weights`
/// builds it, drafting chains of `budget`.
fn drafter(
    model: &ConvertedModel,
    t: &TargetModel<Wgpu>,
    weights: &str,
    budget: usize,
) -> Result<Box<dyn draftc_runtime::engine::Drafter<Wgpu>>, String> {
    let eagle3 = repo().join("models/eagle3.draft");
    let choice = DrafterChoice::plain(
        &eagle3.display().to_string(),
        weights,
        budget,
        Some("chain"),
    )?;
    make_drafter(&wgpu_client(), &choice, model, t, PlanDType::F32).map(|b| b.drafter)
}

/// The first draft of sequence 0.
#[derive(Default)]
struct FirstDraft(Option<(Vec<u32>, DraftTree)>);

impl Watch for FirstDraft {
    fn drafted(&mut self, _name: &str, seqs: &[SeqView<'_>], trees: &[DraftTree]) {
        if self.0.is_none() {
            self.0 = Some((seqs[0].tokens.to_vec(), trees[0].clone()));
        }
    }
}

#[test]
fn a_head_drafts_the_chain_vllm_computes() {
    let r = reference();
    for head in HEADS {
        for case in &r.cases {
            let (model, mut t) = target(1);
            let inner = drafter(&model, &t, &fixture(head).display().to_string(), 3).unwrap();
            let mut d = Watched {
                inner,
                watch: FirstDraft::default(),
            };
            let request = Request {
                prompt: case.prompt.clone(),
            };
            generate_speculative(
                &mut t,
                &mut d,
                &[request],
                2,
                &Sampling::GREEDY,
                3,
                None,
                &mut |_, _| {},
            )
            .unwrap();
            let (tokens, tree) = d.watch.0.expect("a round was drafted");
            assert_eq!(
                tokens.last(),
                Some(&case.next),
                "{head}: the target's next token"
            );
            let mut at = None;
            let mut chain = Vec::new();
            while let Some(&c) = tree.children(at).first() {
                chain.push((tree.node(c).token, tree.node(c).logprob));
                at = Some(c);
            }
            let want: Vec<u32> = case.chain.iter().map(|s| s.token).collect();
            let got: Vec<u32> = chain.iter().map(|c| c.0).collect();
            assert_eq!(
                got, want,
                "{head}, prompt {:?}: the drafted chain",
                case.prompt
            );
            for (i, (c, s)) in chain.iter().zip(&case.chain).enumerate() {
                assert!(
                    (c.1 - s.logprob).abs() < 1e-4,
                    "{head}, prompt {:?}, depth {}: log-probability {} against the reference's {}",
                    case.prompt,
                    i + 1,
                    c.1,
                    s.logprob
                );
            }
        }
    }
}

/// Greedy decoding of the reference prompts, `max` tokens each, with the
/// head at `head` drafting chains of `budget`, checked equal to plain
/// greedy decoding on the same target.
fn assert_lossless(head: &Path, max: usize, budget: usize) -> SpecGeneration {
    let prompts: Vec<Vec<u32>> = reference().cases.into_iter().map(|c| c.prompt).collect();
    let requests = tiny::requests(&prompts);
    let (model, mut t) = target(requests.len());
    let plain = generate(
        &mut t,
        &requests,
        max,
        &Sampling::GREEDY,
        Stops::default(),
        &mut |_, _| {},
    )
    .unwrap()
    .tokens;
    let (_, mut th) = target(requests.len());
    let mut d = drafter(&model, &th, &head.display().to_string(), budget).unwrap();
    let spec = tiny::greedy_speculative(&mut th, d.as_mut(), &requests, max, budget).unwrap();
    assert_eq!(
        spec.tokens,
        plain,
        "{}: speculative output differs",
        head.display()
    );
    spec
}

#[test]
fn decoding_with_a_head_is_lossless() {
    for head in HEADS {
        assert!(assert_lossless(&fixture(head), 24, 4).stats.rounds > 0);
    }
}

/// A change to a head's `config.json`.
type Edit = Box<dyn FnOnce(&mut serde_json::Value)>;

/// A copy of the safetensors head with `config.json` changed by `edit`.
fn edited(edit: impl FnOnce(&mut serde_json::Value)) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let src = fixture("head-safetensors");
    std::fs::copy(
        src.join("model.safetensors"),
        dir.path().join("model.safetensors"),
    )
    .unwrap();
    let mut c: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    edit(&mut c);
    std::fs::write(dir.path().join("config.json"), c.to_string()).unwrap();
    dir
}

#[test]
fn a_head_for_another_target_is_refused_by_name() {
    let (model, t) = target(1);
    let cases: Vec<(&str, Edit)> = vec![
        ("hidden_size", Box::new(|c| c["hidden_size"] = 64.into())),
        ("vocab_size", Box::new(|c| c["vocab_size"] = 49152.into())),
        (
            "num_key_value_heads",
            Box::new(|c| c["num_key_value_heads"] = 4.into()),
        ),
        (
            "num_hidden_layers",
            Box::new(|c| c["num_hidden_layers"] = 2.into()),
        ),
        (
            "rope_theta",
            Box::new(|c| c["rope_theta"] = 500000.0.into()),
        ),
        (
            "norm_before_residual",
            Box::new(|c| c["norm_before_residual"] = true.into()),
        ),
        (
            "eagle_aux_hidden_state_layer_ids",
            Box::new(|c| {
                c["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = serde_json::json!([1, 3, 4])
            }),
        ),
        (
            "rope_scaling",
            Box::new(|c| {
                c["rope_scaling"] = serde_json::json!({"rope_type": "llama3", "factor": 8.0})
            }),
        ),
        (
            "architectures",
            Box::new(|c| c["architectures"] = serde_json::json!(["LlamaForCausalLM"])),
        ),
    ];
    for (field, edit) in cases {
        let dir = edited(edit);
        let err = match drafter(&model, &t, &dir.path().display().to_string(), 3) {
            Ok(_) => panic!("{field}: a mismatched head was accepted"),
            Err(e) => e,
        };
        assert!(
            err.contains(field),
            "{field}: the error does not name it: {err}"
        );
    }
    // d2t that maps two draft ids to one target id.
    let dir = rewritten(
        |_| {},
        |name, _, data| {
            if name == "d2t" {
                data[1] = data[0] - 1.0; // draft id 1 -> the target id of draft id 0
            }
            true
        },
    );
    let err = drafter(&model, &t, &dir.path().display().to_string(), 3)
        .err()
        .expect("a d2t with a repeated target id was accepted");
    assert!(err.contains("d2t") && err.contains("twice"), "{err}");
}

/// A head over the whole vocabulary (`draft_vocab_size` = `vocab_size`, no
/// `d2t`, as some SpecForge heads are) runs without a draft vocabulary:
/// the description's `draft_vocab` is overridden, its head is `[v, d]`, and
/// decoding stays lossless.
#[test]
fn a_head_over_the_whole_vocabulary_needs_no_d2t() {
    let config: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(fixture("head-safetensors/config.json")).unwrap(),
    )
    .unwrap();
    let vocab = config["vocab_size"].as_u64().unwrap();
    let whole = |c: &mut serde_json::Value| c["draft_vocab_size"] = vocab.into();
    let dir = rewritten(whole, |name, shape, data| {
        if name == "lm_head.weight" {
            // Every target row: the draft rows cycled (any values do).
            let d = shape[1] as usize;
            *data = (0..vocab as usize * d)
                .map(|i| data[i % data.len()])
                .collect();
            shape[0] = vocab;
        }
        name != "d2t"
    });
    let spec = assert_lossless(dir.path(), 16, 3);
    assert!(spec.stats.drafted > 0, "the head drafted nothing");
    // Below the vocabulary without d2t: refused by name.
    let mut c: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("config.json")).unwrap())
            .unwrap();
    c["draft_vocab_size"] = 100.into();
    std::fs::write(dir.path().join("config.json"), c.to_string()).unwrap();
    let (model, t) = target(1);
    let err = drafter(&model, &t, &dir.path().display().to_string(), 3)
        .err()
        .expect("a reduced head without d2t was accepted");
    assert!(err.contains("d2t"), "{err}");
}

/// A copy of the safetensors head with its config changed by `config` and
/// every tensor but `t2d` passed through `tensor` (name, shape, values; it
/// drops those it returns false for), written back as f32.
fn rewritten(
    config: impl FnOnce(&mut serde_json::Value),
    mut tensor: impl FnMut(&str, &mut Vec<u64>, &mut Vec<f32>) -> bool,
) -> tempfile::TempDir {
    let dir = edited(config);
    let f = draftc_runtime::model::safetensors_io::SafetensorsFile::open(&fixture(
        "head-safetensors/model.safetensors",
    ))
    .unwrap();
    let mut tensors = Vec::new();
    for name in f.names().unwrap().into_iter().filter(|n| n != "t2d") {
        let mut shape = f.shape(&name).unwrap();
        let mut data = f.tensor_f32(&name, &shape).unwrap();
        if tensor(&name, &mut shape, &mut data) {
            tensors.push((name, shape, data));
        }
    }
    write_f32_safetensors(&dir.path().join("model.safetensors"), &tensors);
    dir
}

fn write_f32_safetensors(path: &std::path::Path, tensors: &[(String, Vec<u64>, Vec<f32>)]) {
    use safetensors::tensor::{serialize_to_file, Dtype, TensorView};
    let bytes: Vec<Vec<u8>> = tensors
        .iter()
        .map(|(_, _, d)| d.iter().flat_map(|x| x.to_le_bytes()).collect())
        .collect();
    let views: Vec<(String, TensorView<'_>)> = tensors
        .iter()
        .zip(&bytes)
        .map(|((n, s, _), b)| {
            let shape: Vec<usize> = s.iter().map(|&d| d as usize).collect();
            (n.clone(), TensorView::new(Dtype::F32, shape, b).unwrap())
        })
        .collect();
    serialize_to_file(views, None, path).unwrap();
}
