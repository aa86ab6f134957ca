//! Lossless greedy speculative decoding on a tiny random target: for every
//! drafter (prompt lookup as a chain and as a tree, MagicDec
//! self-speculation, SpecFormer and Medusa as chains and static trees,
//! Beagle and SPIRe as chains, static, EAGLE-2 dynamic and DuoDecoding
//! multi-sequence trees, all with deterministic random weights; prompt
//! lookup in front of Beagle and SpecFormer), budgets (fixed, and chosen at
//! random per round and sequence as the `auto` planner may),
//! batch sizes 1, 3 and 16, and f32 and f16 plans, the speculative token ids
//! equal autoregressive decoding's exactly. A faulty drafter (out-of-
//! vocabulary ids, random trees, errors) changes nothing either.

mod tiny;

use tiny::*;

use cubecl::prelude::*;
use draftc_codegen::PlanDType;
use draftc_ops::attention::TREE_ROOT;
use draftc_ops::testing::wgpu_client;
use draftc_runtime::device::gpu_layout_profile;
use draftc_runtime::engine::{
    generate_with_policy, model_drafter, warm_up, weight_specs, DraftCall, DraftPolicy, Drafter,
    EngineError, LookupFirst, PromptLookupDrafter, Sampling, SeqView, TargetModel,
};
use draftc_runtime::exec::{HostWeights, SeqStep, Step};
use draftc_runtime::speculation::planner::confidence::CONF_BINS;
use draftc_runtime::speculation::{
    Confidence, DraftTree, PlanMode, Planner, PlannerConfig, TreeShape,
};

/// A greedy run equal to autoregressive decoding's, without a draft error:
/// its τ.
fn check(t: &mut TargetModel<Wgpu>, d: &mut dyn Drafter<Wgpu>, b: usize, budget: usize) -> f64 {
    clean_lossless_run(t, d, b, budget).stats.tau()
}

/// [`check`] at batch 1 and 3 with each of `budgets`.
fn check_batches(t: &mut TargetModel<Wgpu>, d: &mut dyn Drafter<Wgpu>, budgets: &[usize]) {
    for b in [1, 3] {
        for &budget in budgets {
            check(t, d, b, budget);
        }
    }
}

#[test]
fn prompt_lookup_chain_and_tree_are_lossless() {
    let (mut t, _) = target(3);
    for b in [1, 3] {
        for budget in [1, 3, 8] {
            let tau = check(&mut t, &mut prompt_lookup(budget, 1), b, budget);
            assert!(tau >= 1.0);
            check(&mut t, &mut prompt_lookup(4, 3), b, budget);
        }
    }
}

#[test]
fn model_drafters_are_lossless() {
    let (mut t, tw) = target(3);
    let cases: &[(&str, &[Option<&str>])] = &[
        ("magicdec", &[None]),
        ("specformer", &[None, Some("static(2, 2, 1)")]),
        ("medusa", &[None, Some("2,2")]),
    ];
    for &(name, shapes) in cases {
        for &shape in shapes {
            let mut d = drafter(&t, &tw, name, shape, PlanDType::F32);
            check_batches(&mut t, d.as_mut(), &[2, 4]);
        }
    }
}

/// Prompt lookup in front of a model drafter (`--lookup N`): rounds
/// drafted by lookup and by the model mix within a generation and across
/// a batch (an autoregressive drafter's memory then gets the rows of
/// several rounds at once), and the output is autoregressive decoding's.
#[test]
fn lookup_first_is_lossless() {
    let (mut t, tw) = target(3);
    for (name, shape) in [
        ("beagle", Some("chain")),
        ("beagle", None),
        ("specformer", None),
    ] {
        for n in [1, 2] {
            let inner = drafter(&t, &tw, name, shape, PlanDType::F32);
            let mut d = LookupFirst::new(inner, n).unwrap();
            check_batches(&mut t, &mut d, &[1, 4]);
            let c = d.counts();
            assert!(
                c.by_lookup > 0 && c.by_lookup < c.rounds,
                "{name} {shape:?} lookup {n}: both drafters must draft: {c:?}"
            );
        }
    }
    for n in [0, 4] {
        let inner = drafter(&t, &tw, "beagle", None, PlanDType::F32);
        assert!(LookupFirst::new(inner, n).is_err(), "--lookup {n}");
    }
}

/// Beagle (file: EAGLE-2 dynamic tree) and SPIRe (file: chain) over their
/// memory streams, with every tree builder: the level-by-level drafting,
/// the per-branch visibility of predicted states and the reset to true
/// states every round.
#[test]
fn autoregressive_drafters_are_lossless_for_every_tree_shape() {
    let (mut t, tw) = target(3);
    let cases: &[(&str, &[Option<&str>])] = &[
        (
            "beagle",
            &[
                None,
                Some("chain"),
                Some("static(2, 2)"),
                Some("multi(seqs=3)"),
            ],
        ),
        ("spire", &[None, Some("dynamic(depth=3, topk=2, nodes=6)")]),
    ];
    for &(name, shapes) in cases {
        for &shape in shapes {
            let mut d = drafter(&t, &tw, name, shape, PlanDType::F32);
            check_batches(&mut t, d.as_mut(), &[2, 5]);
        }
    }
    // A GPU picks a dynamic tree's frontiers on the device
    // (`device::TreePicks`): the same trees, read once a round.
    t.exec.set_device(gpu_layout_profile(t.client()));
    for (name, shape) in [
        ("beagle", None),
        ("spire", Some("dynamic(depth=3, topk=2, nodes=6)")),
    ] {
        let mut d = drafter(&t, &tw, name, shape, PlanDType::F32);
        check_batches(&mut t, d.as_mut(), &[2, 5]);
    }
}

/// EAGLE and EAGLE-3 (their own KV cache, `prev` reads, EAGLE-3's fused
/// taps) as a chain, a static and a dynamic tree: committed rows computed
/// from target states once, drafted rows in the cache's tail seen only by
/// their descendants, and output equal to autoregressive decoding's.
#[test]
fn eagle_drafters_are_lossless_for_every_tree_shape() {
    // Four layers: EAGLE-3 taps HS[2], HS[n/2] and HS[n - 3].
    let (mut t, tw) = target_layers(3, 4);
    for name in ["eagle", "eagle3"] {
        for shape in [None, Some("chain"), Some("static(2, 2)")] {
            let mut d = drafter(&t, &tw, name, shape, PlanDType::F32);
            check_batches(&mut t, d.as_mut(), &[2, 5]);
        }
    }
}

/// `--confidence` cuts (one that keeps nothing, and thresholds among the
/// random drafter's probabilities, so rounds vary between empty trees and
/// deeper ones) stay lossless for an autoregressive drafter's chain and
/// dynamic tree and a parallel drafter's chain and static tree; drafters
/// without their own probabilities refuse a cut.
#[test]
fn confidence_cut_drafting_is_lossless() {
    let (mut t, tw) = target(3);
    let cases = [
        ("beagle", None, ["1", "0.05,0.1", "0.1,0.3", "0.2,0.5"]),
        (
            "beagle",
            Some("chain"),
            ["1", "0.05,0.1", "0.1,0.3", "0.2,0.5"],
        ),
        // The random heads' per-position probabilities sit lower.
        (
            "specformer",
            None,
            ["1", "0.001,0.005", "0.005,0.02", "0.01,0.05"],
        ),
        (
            "medusa",
            Some("2,2"),
            ["1", "0.001,0.005", "0.005,0.02", "0.01,0.05"],
        ),
    ];
    for (name, shape, cuts) in cases {
        for cut in cuts {
            let mut d = drafter(&t, &tw, name, shape, PlanDType::F32);
            d.set_confidence(cut.parse::<Confidence>().unwrap())
                .unwrap();
            check_batches(&mut t, d.as_mut(), &[1, 4]);
            let s = spec_run(&mut t, d.as_mut(), 3, 4).unwrap().stats;
            // The random drafter's probabilities straddle these cuts: some
            // rounds verify nothing, others several tokens.
            if cut == "1" {
                assert_eq!(s.drafted, 0, "{name} {shape:?} {cut}");
            } else {
                assert!(
                    0 < s.drafted && s.drafted < 4 * s.seq_rounds,
                    "{name} {shape:?} {cut}: {} drafted in {} rounds",
                    s.drafted,
                    s.seq_rounds
                );
            }
        }
    }
    let cut = "0.1,0.5".parse::<Confidence>().unwrap();
    for (name, shape) in [("magicdec", None), ("beagle", Some("multi(seqs=3)"))] {
        let mut d = drafter(&t, &tw, name, shape, PlanDType::F32);
        let err = d.set_confidence(cut).unwrap_err().to_string();
        assert!(err.contains("--confidence"), "{name}: {err}");
    }
}

/// Checks that every token a drafter drafts is in `allowed`.
struct OnlyFrom<'a> {
    allowed: &'a [u32],
    drafted: usize,
}

impl Watch for OnlyFrom<'_> {
    fn drafted(&mut self, name: &str, _seqs: &[SeqView<'_>], trees: &[DraftTree]) {
        for tok in trees.iter().flat_map(|t| t.tokens()) {
            assert!(
                self.allowed.contains(&tok),
                "{name} drafted {tok}, outside its draft vocabulary"
            );
            self.drafted += 1;
        }
    }
}

/// A reduced draft vocabulary (`draft_vocab 40` of the tiny target's 97
/// tokens, in a shuffled order so that unmapped draft ids would show):
/// every drafter drafts only its tokens, and the output stays the target's.
#[test]
fn reduced_draft_vocabulary_is_lossless() {
    let (mut t, tw) = target(3);
    let ids = Rng(5).subset(t.vocab, 40);
    let cases: &[(&str, &[Option<&str>], bool)] = &[
        ("specformer", &[None, Some("static(2, 2, 1)")], false),
        ("medusa", &[None], false),
        ("beagle", &[None, Some("chain")], false),
        ("spire", &[None], false),
        // The tree's frontiers picked on the device (a GPU's choice):
        // draft ids map to target ids there too.
        ("beagle", &[None], true),
    ];
    let lanes = t.exec.device().clone();
    for &(name, shapes, gpu) in cases {
        t.exec.set_device(if gpu {
            gpu_layout_profile(t.client())
        } else {
            lanes.clone()
        });
        let g = compile_with(name, &tiny_config(), &[("draft_vocab", 40)]);
        assert_eq!(g.meta.reduced_vocab(t.vocab as i64), Some(40));
        let w = drafter_weights(&t, &tw, &g, Some(&ids));
        for &shape in shapes {
            let tree = shape.map(|s| s.parse::<TreeShape>().unwrap());
            let inner = model_drafter(&wgpu_client(), &g, &t, &w, PlanDType::F32, tree).unwrap();
            let mut d = Watched {
                inner,
                watch: OnlyFrom {
                    allowed: &ids,
                    drafted: 0,
                },
            };
            check_batches(&mut t, &mut d, &[4]);
            assert!(
                d.watch.drafted > 0,
                "{name} {shape:?} (GPU {gpu}) drafted nothing"
            );
        }
    }
    t.exec.set_device(lanes);
    // Weights without the ids are an error naming the tensor.
    let g = compile_with("medusa", &tiny_config(), &[("draft_vocab", 40)]);
    let mut w = drafter_weights(&t, &tw, &g, Some(&ids));
    w.tensors.remove("draft_vocab.ids");
    let err = model_drafter(&wgpu_client(), &g, &t, &w, PlanDType::F32, None)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("draft_vocab.ids"), "{err}");
}

/// Sixteen sequences of different lengths in one batch.
#[test]
fn batch_16_is_lossless() {
    let (mut t, tw) = target(16);
    check(&mut t, &mut prompt_lookup(4, 2), 16, 4);
    for name in ["beagle", "specformer"] {
        let mut d = drafter(&t, &tw, name, None, PlanDType::F32);
        check(&mut t, d.as_mut(), 16, 4);
    }
}

/// f16 plans: the speculative run still reproduces f16 autoregressive
/// decoding bit for bit (the same per-element arithmetic in every pass).
#[test]
fn f16_is_lossless() {
    let (mut t, tw) = target_with(3, PlanDType::F16);
    check(&mut t, &mut prompt_lookup(4, 2), 3, 4);
    for name in ["beagle", "magicdec"] {
        let mut d = drafter(&t, &tw, name, None, PlanDType::F16);
        check(&mut t, d.as_mut(), 3, 4);
    }
}

/// The GPU kernel layouts (plane kernels, run on lavapipe's 8-lane planes),
/// f32 and f16: a tree verify pass gives every node the logits, bit for bit, that
/// the decode step autoregressive decoding runs at its position after its
/// path has the same logits. Nodes whose ancestors lie at gaps in the
/// tree's rows (siblings between them) are the hard case: an H100 at batch
/// 16 lost greedy losslessness there while the plane attention took keys by
/// row rather than by place on the path. Speculative runs in these layouts
/// are lossless too.
#[test]
fn gpu_layouts_verify_rows_equal_decode_rows_bit_for_bit() {
    // f32 shows every difference; f16 rounds most of them away, so that a
    // difference flips a token only now and then (as on the H100).
    for dtype in [PlanDType::F32, PlanDType::F16] {
        gpu_layouts_bit_for_bit(dtype);
    }
}

fn gpu_layouts_bit_for_bit(dtype: PlanDType) {
    let (mut t, tw) = target_with(3, dtype);
    let profile = gpu_layout_profile(t.client());
    t.exec.set_device(profile);
    let prompt: Vec<u32> = (0..23).map(|i| (i * 37 + 11) % 97).collect();
    let committed = prompt.len();
    t.prefill(&[(0, prompt)], |_, _, _| Ok(())).unwrap();
    // Node 7's path is 0, 2, 4, 7 and node 5's 0, 1, 3, 5: siblings between.
    let parents = vec![TREE_ROOT, 0, 0, 1, 2, 3, 4, 4];
    let tokens = [40u32, 3, 77, 12, 51, 9, 64, 30];
    let mut depth = vec![0u32; parents.len()];
    for i in 1..parents.len() {
        depth[i] = depth[parents[i] as usize] + 1;
    }
    let step = |positions: Vec<u32>, parents: Option<Vec<u32>>| Step {
        seqs: vec![SeqStep {
            slot: 0,
            positions,
            parents,
            memory_tail: None,
        }],
        ..Step::default()
    };
    let tree_step = step(
        depth.iter().map(|d| committed as u32 + d).collect(),
        Some(parents.clone()),
    );
    let logits = |t: &mut TargetModel<Wgpu>, s: &Step, ids: &[u32]| {
        let o = t.forward(s, ids).unwrap();
        o.get("logits").unwrap().download_f32(t.client()).unwrap()
    };
    let tree = logits(&mut t, &tree_step, &tokens);
    let v = t.vocab;
    for node in [3usize, 5, 6, 7] {
        let mut path = vec![node];
        while parents[*path.last().unwrap()] != TREE_ROOT {
            path.push(parents[*path.last().unwrap()] as usize);
        }
        path.reverse();
        t.caches.truncate(0, committed);
        let mut last = Vec::new();
        for (i, &n) in path.iter().enumerate() {
            last = logits(
                &mut t,
                &step(vec![(committed + i) as u32], None),
                &[tokens[n]],
            );
        }
        let row = &tree[node * v..(node + 1) * v];
        let differ = row
            .iter()
            .zip(&last)
            .filter(|(a, b)| a.to_bits() != b.to_bits())
            .count();
        assert_eq!(
            differ, 0,
            "{dtype:?} node {node} (path {path:?}): {differ} of {v} logits differ"
        );
    }
    t.caches.truncate(0, 0);
    for name in ["beagle", "specformer"] {
        let mut d = drafter(&t, &tw, name, None, dtype);
        check(&mut t, d.as_mut(), 3, 4);
    }
}

/// Caches sized as `draftc generate` sizes them (the longest prompt plus
/// `--max-tokens` plus one) for a run shorter than the warm-up's cycle:
/// the warm-up stays inside them (it once asked for 30-odd tokens
/// whatever the run's length, and a long prompt filled the cache).
#[test]
fn warm_up_fits_caches_sized_for_a_short_run() {
    let max = 4;
    let reqs = prompts(3);
    let capacity = reqs.iter().map(|r| r.prompt.len()).max().unwrap() + max + 1;
    let (mut t, w) = target_sized(3, PlanDType::F32, 7, capacity);
    let mut d = drafter(&t, &w, "beagle", Some("chain"), PlanDType::F32);
    let mut policy = DraftPolicy::auto(3).unwrap();
    warm_up(&mut t, d.as_mut(), &reqs, &Sampling::GREEDY, &mut policy)
        .unwrap_or_else(|e| panic!("warm-up: {e}"));
    let want = draftc_runtime::engine::generate(
        &mut t,
        &reqs,
        max,
        &Sampling::GREEDY,
        None,
        &mut |_, _| {},
    )
    .unwrap()
    .tokens;
    let got = generate_with_policy(
        &mut t,
        d.as_mut(),
        &reqs,
        max,
        &Sampling::GREEDY,
        &mut policy,
        None,
        &mut |_, _| {},
    )
    .unwrap();
    assert_eq!(got.tokens, want);
}

/// Proposes garbage: out-of-vocabulary ids and random trees.
struct Faulty(u64);

impl<R: Runtime> Drafter<R> for Faulty {
    fn name(&self) -> String {
        "faulty".into()
    }
    fn length(&self) -> usize {
        4
    }
    fn draft(&mut self, call: DraftCall<'_, '_, R>) -> Result<Vec<DraftTree>, EngineError> {
        let seqs = call.seqs;
        if self.0 % 5 == 4 {
            self.0 += 1;
            return Err(EngineError::Invalid("drafter crashed".into()));
        }
        Ok(seqs
            .iter()
            .map(|_| {
                let mut tr = DraftTree::new();
                for i in 0..6 {
                    self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1);
                    let tok = (self.0 >> 40) as u32 % 130; // some >= vocab 97
                    let parent = if i == 0 {
                        None
                    } else {
                        Some((self.0 >> 20) as usize % i)
                    };
                    let _ = tr.push(parent, tok, -1.0);
                }
                tr
            })
            .collect())
    }
}

#[test]
fn a_faulty_drafter_cannot_change_the_output() {
    let (mut t, _) = target(3);
    // Its errors are the point: only the tokens are checked.
    for b in [1, 3] {
        lossless_run(&mut t, &mut Faulty(3), b, 6);
    }
}

/// A model drafter whose weights are all NaN (so are its logits and
/// hidden states) and one whose weights are infinite: their trees carry
/// arbitrary ids and NaN log-probabilities, and the output stays exact.
#[test]
fn nan_and_infinite_drafter_weights_change_nothing() {
    let (mut t, tw) = target(3);
    for (name, bad) in [
        ("specformer", f32::NAN),
        ("beagle", f32::NAN),
        ("magicdec", f32::INFINITY),
    ] {
        let g = compile(name, &tiny_config());
        let specs = weight_specs(&g, &t.weights).unwrap();
        let mut w = HostWeights::random(&specs, 5);
        for (k, v) in w.tensors.iter_mut() {
            if !tw.tensors.contains_key(k) || name == "magicdec" {
                v.1.iter_mut().for_each(|x| *x = bad);
            }
        }
        let Ok(mut d) = model_drafter(&wgpu_client(), &g, &t, &w, PlanDType::F32, None) else {
            // Rejected up front is also a contained fault.
            continue;
        };
        let want = reference(&mut t, 3);
        let got = spec_run(&mut t, d.as_mut(), 3, 4)
            .unwrap_or_else(|e| panic!("{name} with {bad} weights: {e}"));
        assert_eq!(got.tokens, want, "{name} with {bad} weights");
    }
}

/// A greedy run of [`prompts`]`(b)` for [`MAX`] tokens under `policy`.
fn planned_run(
    t: &mut TargetModel<Wgpu>,
    d: &mut dyn Drafter<Wgpu>,
    b: usize,
    policy: &mut DraftPolicy,
) -> draftc_runtime::engine::SpecGeneration {
    generate_with_policy(
        t,
        d,
        &prompts(b),
        MAX,
        &Sampling::GREEDY,
        policy,
        None,
        &mut |_, _| {},
    )
    .unwrap()
}

/// A planner whose choices are random (`seed`), budgets up to `max`.
fn random_policy(seed: u64, max: usize) -> DraftPolicy {
    DraftPolicy::Planned(Box::new(
        Planner::new(PlannerConfig {
            mode: PlanMode::Random { seed },
            ..PlannerConfig::auto(max)
        })
        .unwrap(),
    ))
}

/// `--speculate auto` with the planner's choices forced to random: per
/// round and sequence any budget from none to the largest, a drafter that
/// skips rounds and catches up later, and greedy output is still
/// autoregressive decoding's, at batch 1 and 3, for every kind of drafter.
#[test]
fn random_planner_choices_are_lossless() {
    let (mut t, tw) = target(3);
    let mut drafters: Vec<Box<dyn Drafter<Wgpu>>> = vec![
        Box::new(prompt_lookup(4, 1)),
        drafter(&t, &tw, "magicdec", None, PlanDType::F32),
        drafter(&t, &tw, "specformer", None, PlanDType::F32),
        drafter(&t, &tw, "beagle", Some("chain"), PlanDType::F32),
        drafter(&t, &tw, "beagle", None, PlanDType::F32),
    ];
    for d in &mut drafters {
        for b in [1, 3] {
            let want = reference(&mut t, b);
            let (mut skipped, mut drafted) = (0, 0);
            for seed in 0..4 {
                let got = planned_run(&mut t, d.as_mut(), b, &mut random_policy(seed, 4));
                assert_eq!(got.tokens, want, "{} batch {b} seed {seed}", d.name());
                let s = &got.stats;
                assert_eq!(s.draft_errors, 0, "{:?}", s.last_draft_error);
                skipped += s.budget_histogram[0];
                drafted += s.budget_histogram[1..].iter().sum::<usize>();
            }
            // Both kinds of sequence-round happened.
            assert!(skipped > 0 && drafted > 0, "{} batch {b}", d.name());
        }
    }
}

/// Under a planner, model drafters draft with their probabilities (a
/// softmax and top-1 where a fixed budget takes the argmax), the planner
/// learns acceptance by them, and output is still autoregressive
/// decoding's; prompt lookup has no probabilities to give.
#[test]
fn model_drafters_give_the_planner_their_confidences_losslessly() {
    let (mut t, tw) = target(3);
    let mut drafters: Vec<(Box<dyn Drafter<Wgpu>>, bool)> = vec![
        (Box::new(prompt_lookup(4, 1)), false),
        (drafter(&t, &tw, "magicdec", None, PlanDType::F32), true),
        (drafter(&t, &tw, "specformer", None, PlanDType::F32), true),
        (
            drafter(&t, &tw, "beagle", Some("chain"), PlanDType::F32),
            true,
        ),
        (drafter(&t, &tw, "beagle", None, PlanDType::F32), true),
    ];
    for (d, confident) in &mut drafters {
        for b in [1, 3] {
            let want = reference(&mut t, b);
            let mut policy = random_policy(5, 3);
            let got = planned_run(&mut t, d.as_mut(), b, &mut policy);
            assert_eq!(got.tokens, want, "{} batch {b}", d.name());
            let DraftPolicy::Planned(p) = &policy else {
                unreachable!()
            };
            let trials: f64 = (0..CONF_BINS).map(|k| p.confidence_trials(k)).sum();
            assert_eq!(trials > 0.0, *confident, "{} batch {b}: {trials}", d.name());
        }
    }
}

/// A planned run on a real schedule (`auto`): lossless, and it reports
/// what it chose.
#[test]
fn auto_planned_run_is_lossless_and_reports_its_choices() {
    let (mut t, tw) = target(3);
    let mut d = drafter(&t, &tw, "beagle", Some("chain"), PlanDType::F32);
    let mut policy = DraftPolicy::auto(3).unwrap();
    warm_up(
        &mut t,
        d.as_mut(),
        &prompts(3),
        &Sampling::GREEDY,
        &mut policy,
    )
    .unwrap();
    let want = reference(&mut t, 3);
    let got = planned_run(&mut t, d.as_mut(), 3, &mut policy);
    assert_eq!(got.tokens, want);
    let s = &got.stats;
    assert_eq!(s.budget_histogram.len(), 4);
    assert_eq!(s.budget_histogram.iter().sum::<usize>(), s.seq_rounds);
    assert!(s.predicted_speedup.is_some());
}

/// A drafter whose every call costs far more than the target's step (it
/// sleeps): drafts cannot pay, so the planner switches it off within a few
/// rounds (and a second run with the same policy never feeds it), and the
/// output is still autoregressive decoding's.
struct Slow(PromptLookupDrafter);

impl<R: Runtime> Drafter<R> for Slow {
    fn name(&self) -> String {
        "slow".into()
    }
    fn length(&self) -> usize {
        3
    }
    fn draft(&mut self, call: DraftCall<'_, '_, R>) -> Result<Vec<DraftTree>, EngineError> {
        std::thread::sleep(std::time::Duration::from_millis(150));
        self.0.draft(call)
    }
}

impl Slow {
    fn new() -> Slow {
        Slow(prompt_lookup(3, 1))
    }
}

#[test]
fn the_planner_switches_off_a_drafter_that_never_pays() {
    let (mut t, _) = target(3);
    let mut d = Slow::new();
    let want = reference(&mut t, 3);
    let mut policy = DraftPolicy::auto(3).unwrap();
    let mut runs = Vec::new();
    for _ in 0..2 {
        let got = planned_run(&mut t, &mut d, 3, &mut policy);
        assert_eq!(got.tokens, want);
        runs.push(got.stats);
    }
    let first = runs[0]
        .drafter_off_at
        .expect("switched off in the first run");
    assert!(first > 0 && first < MAX, "{first}");
    assert_eq!(runs[1].drafter_off_at, Some(0));
    assert_eq!(runs[1].budget_histogram[1..].iter().sum::<usize>(), 0);
}

/// After a warm-up that measured its costs, a drafter that would not pay
/// even if every draft token were accepted starts off: the run is
/// autoregressive decoding itself, from its first round.
#[test]
fn a_drafter_that_cannot_pay_even_accepting_everything_starts_off() {
    let (mut t, _) = target(3);
    let mut d = Slow::new();
    let want = reference(&mut t, 3);
    let mut policy = DraftPolicy::auto(3).unwrap();
    warm_up(&mut t, &mut d, &prompts(3), &Sampling::GREEDY, &mut policy).unwrap();
    let got = planned_run(&mut t, &mut d, 3, &mut policy);
    assert_eq!(got.tokens, want);
    assert_eq!(got.stats.drafter_off_at, Some(0));
    assert_eq!(got.stats.no_draft_rounds, got.stats.rounds);
    assert_eq!(got.stats.budget_histogram[0], got.stats.seq_rounds);
}
