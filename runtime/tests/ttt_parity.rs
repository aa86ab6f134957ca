//! The trainer's training-time test (`ttt_loss` in
//! tools/train/draftc_train/losses.py) simulates what the engine's EAGLE
//! drafter computes: for EAGLE and EAGLE-3 on a tiny random target (four
//! layers) with random drafter weights, the engine drafts a greedy chain of
//! four after a prompt, and `python -m draftc_train ttt-parity` runs the
//! simulation's steps over the same tokens, target states and weights:
//! step i's output at the round's depth-i query must pick the engine's
//! depth-i token with its log-probability (f32, 1e-4).
//!
//! Needs the training virtualenv (`bash tools/train/bootstrap.sh`); without
//! it the test says so and passes, so the default suite never needs torch.

mod tiny;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use cubecl::prelude::*;
use draftc_codegen::bind::DRAFT_VOCAB_HEAD;
use draftc_codegen::PlanDType;
use draftc_ops::testing::wgpu_client;
use draftc_runtime::engine::{
    generate_speculative, model_drafter, Committed, Request, Sampling, SeqView, TargetModel,
};
use draftc_runtime::exec::{HostWeights, Outputs};
use draftc_runtime::speculation::{DraftTree, TreeShape};
use tiny::*;

/// Depth of the chain compared.
const DEPTH: usize = 4;

/// Records sequence 0's first draft and the target states (`hidden[i]`)
/// of every position it committed.
#[derive(Default)]
struct FirstDraft {
    first: Option<(Vec<u32>, DraftTree)>,
    /// tap -> position -> row.
    hidden: BTreeMap<String, BTreeMap<u32, Vec<f32>>>,
}

impl Watch for FirstDraft {
    fn observed(&mut self, c: &ComputeClient<Wgpu>, out: &Outputs<Wgpu>, committed: &[Committed]) {
        for x in committed.iter().filter(|x| x.slot == 0) {
            for (name, t) in out.tensors.iter().filter(|(n, _)| n.starts_with("hidden[")) {
                let d = *t.shape().last().unwrap();
                let data = t.download_f32(c).unwrap();
                for (&r, &p) in x.rows.iter().zip(&x.positions) {
                    let row = data[r as usize * d..][..d].to_vec();
                    self.hidden.entry(name.clone()).or_default().insert(p, row);
                }
            }
        }
    }
    fn drafted(&mut self, _name: &str, seqs: &[SeqView<'_>], trees: &[DraftTree]) {
        if self.first.is_none() {
            self.first = Some((seqs[0].tokens.to_vec(), trees[0].clone()));
        }
    }
}

/// Drafts a chain of [`DEPTH`] with drafter `name` after `prompt` and
/// writes the case for the Python side into `dir/NAME.{py,safetensors}`;
/// `skew` is added to the depth-3 log-probability written (a mutation).
fn dump(name: &str, prompt: &[u32], dir: &Path, skew: f32) {
    dump_on(name, name, target_layers(1, 4), prompt, dir, skew);
}

/// [`dump`] over the target `(t, tw)`, written as `case`.
fn dump_on(
    case: &str,
    name: &str,
    (mut t, tw): (TargetModel<Wgpu>, HostWeights),
    prompt: &[u32],
    dir: &Path,
    skew: f32,
) {
    let g = compile(name, &t.target_config);
    let w = drafter_weights(&t, &tw, &g, None);
    let inner = model_drafter(
        &wgpu_client(),
        &g,
        &t,
        &w,
        PlanDType::F32,
        Some(TreeShape::Chain),
    )
    .unwrap();
    let mut d = Watched {
        inner,
        watch: FirstDraft::default(),
    };
    let request = Request {
        prompt: prompt.to_vec(),
    };
    let greedy = Sampling::GREEDY;
    generate_speculative(
        &mut t,
        &mut d,
        &[request],
        2,
        &greedy,
        DEPTH,
        None,
        &mut |_, _| {},
    )
    .unwrap();
    let (tokens, tree) = d.watch.first.clone().expect("a round was drafted");
    // The chain: every node's first child from the root.
    let mut chain = Vec::new();
    let mut at = None;
    while let Some(&c) = tree.children(at).first() {
        chain.push((tree.node(c).token, tree.node(c).logprob));
        at = Some(c);
    }
    assert_eq!(chain.len(), DEPTH, "{name}: a chain of {DEPTH}");
    // Positions 0..=root hold the committed tokens, then the drafted ones
    // (their target states do not exist: zeros, which no compared query sees).
    let root = tokens.len() - 1;
    let mut ids: Vec<f32> = tokens.iter().map(|&x| x as f32).collect();
    ids.extend(chain[..DEPTH - 1].iter().map(|c| c.0 as f32));
    let n = ids.len() as u64;
    let mut dump: Vec<Named> = vec![
        ("ids".into(), vec![1, n], ids),
        ("root".into(), vec![1], vec![root as f32]),
        (
            "draft".into(),
            vec![DEPTH as u64],
            chain.iter().map(|c| c.0 as f32).collect(),
        ),
        (
            "logprob".into(),
            vec![DEPTH as u64],
            chain
                .iter()
                .enumerate()
                .map(|(i, c)| c.1 + if i == 2 { skew } else { 0.0 })
                .collect(),
        ),
    ];
    for (tap, rows) in &d.watch.hidden {
        let i: i64 = tap
            .trim_start_matches("hidden[")
            .trim_end_matches(']')
            .parse()
            .unwrap();
        let dim = rows.values().next().unwrap().len();
        let mut data = vec![0.0f32; n as usize * dim];
        for p in 0..root as u32 {
            let row = rows
                .get(&p)
                .unwrap_or_else(|| panic!("{tap} at {p} not seen"));
            data[p as usize * dim..][..dim].copy_from_slice(row);
        }
        dump.push((format!("hidden:{i}"), vec![1, n, dim as u64], data));
    }
    let exports: Vec<String> = t
        .weights
        .exports
        .values()
        .map(|v| format!("{v}.weight"))
        .collect();
    for (k, (shape, data)) in w.tensors.iter().chain(&tw.tensors) {
        let key = if exports.contains(k) {
            format!("target:{k}")
        } else if w.tensors.contains_key(k) && k != DRAFT_VOCAB_HEAD {
            format!("param:{k}")
        } else {
            continue;
        };
        if dump.iter().any(|x| x.0 == key) {
            continue;
        }
        dump.push((key, shape.iter().map(|&x| x as u64).collect(), data.clone()));
    }
    write(&dir.join(format!("{case}.safetensors")), &dump);
    let module = draftc_codegen::torch::torch_module(&g, &t.weights).unwrap();
    std::fs::write(dir.join(format!("{case}.py")), module).unwrap();
}

/// `python -m draftc_train ttt-parity DIR NAMES`: (passed, its output).
fn check(py: &Path, dir: &Path, names: &[&str]) -> (bool, String) {
    run_checked(
        Command::new(py)
            .current_dir(repo().join("tools/train"))
            .args(["-m", "draftc_train", "ttt-parity"])
            .arg(dir)
            .args(names),
    )
}

const PROMPT: &[u32] = &[5, 17, 3, 90, 44, 2, 61, 5, 17, 3];

#[test]
fn training_time_test_steps_are_the_engines_draft() {
    let Some(py) = python() else { return };
    let dir = tempfile::tempdir().unwrap();
    for name in ["eagle", "eagle3"] {
        dump(name, PROMPT, dir.path(), 0.0);
    }
    let (ok, text) = check(&py, dir.path(), &["eagle", "eagle3"]);
    println!("{text}");
    assert!(ok, "training-time test parity failed:\n{text}");
}

/// The same on a tiny Gemma 3 target (`models/gemma3.draft`): EAGLE's
/// features are the target's states through its final norm `x̂·(1 + w)`
/// (the module's `FINAL_NORM_OFFSET`), its inputs the embedding table's
/// rows as stored (the target scales its own by √d, the drafter does not).
#[test]
fn training_time_test_matches_the_engine_on_a_gemma_target() {
    let Some(py) = python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let case = "eagle_gemma";
    dump_on(
        case,
        "eagle",
        gemma_target_layers(1, 4),
        PROMPT,
        dir.path(),
        0.0,
    );
    let module = std::fs::read_to_string(dir.path().join(format!("{case}.py"))).unwrap();
    assert!(module.contains("FINAL_NORM_OFFSET = 1.0"), "{case}");
    let (ok, text) = check(&py, dir.path(), &[case]);
    println!("{text}");
    assert!(
        ok,
        "training-time test parity failed on a Gemma target:\n{text}"
    );
}

/// Mutation: a depth-3 log-probability off by 1e-3 fails the check.
#[test]
fn ttt_parity_catches_a_wrong_probability() {
    let Some(py) = python() else { return };
    let dir = tempfile::tempdir().unwrap();
    dump("eagle3", PROMPT, dir.path(), 1e-3);
    let (ok, text) = check(&py, dir.path(), &["eagle3"]);
    assert!(!ok, "a wrong probability passed:\n{text}");
}
