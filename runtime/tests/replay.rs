//! Replayed passes (issue 56): a target decode pass that the executor has
//! recorded twice is reissued from its recording; its logits equal the
//! eager pass's bit for bit, at batch 1, 3 and 16, on the lane layouts
//! (lavapipe's) and the GPU layouts (plane attention, whose key splits
//! change as the context crosses a chunk: the pass is then recorded again,
//! never replayed with the old grid). Speculative decoding with replay
//! gives the tokens it gives without.

mod tiny;

use draftc_codegen::PlanDType;
use draftc_runtime::device::gpu_layout_profile;
use draftc_runtime::engine::TargetModel;
use draftc_runtime::exec::{SeqStep, Step};
use tiny::*;

type Wgpu = cubecl::wgpu::WgpuRuntime;

/// The tiny target for `b` sequences of `capacity` rows, replay on or off.
fn model(b: usize, capacity: usize, gpu: bool, replay: bool) -> TargetModel<Wgpu> {
    let (mut t, _) = target_sized(b, PlanDType::F32, 7, capacity);
    if gpu {
        let p = gpu_layout_profile(t.client());
        t.exec.set_device(p);
    }
    t.exec.set_replay(replay);
    t
}

fn logits(t: &mut TargetModel<Wgpu>, step: &Step, ids: &[u32]) -> Vec<u32> {
    let out = t.forward(step, ids).unwrap();
    let l = out.get("logits").unwrap().download_f32(t.client()).unwrap();
    l.iter().map(|x| x.to_bits()).collect()
}

/// Prefills `b` prompts of `prompt` tokens, then decodes `steps` steps with
/// both models (the ids the eager model picks): every step's logits equal.
/// Returns the passes the replaying model replayed.
fn check(b: usize, prompt: usize, steps: usize, capacity: usize, gpu: bool) -> u64 {
    let mut eager = model(b, capacity, gpu, false);
    let mut fast = model(b, capacity, gpu, true);
    let vocab = eager.vocab as u32;
    let seqs: Vec<SeqStep> = (0..b).map(|s| SeqStep::chain(s, 0, prompt)).collect();
    let step = Step {
        seqs,
        ..Default::default()
    };
    let ids: Vec<u32> = (0..b * prompt)
        .map(|i| (i as u32 * 7 + 3) % vocab)
        .collect();
    assert_eq!(
        logits(&mut eager, &step, &ids),
        logits(&mut fast, &step, &ids)
    );
    let mut next: Vec<u32> = (0..b as u32).map(|s| s + 1).collect();
    for k in 0..steps {
        let pos = (prompt + k) as u32;
        let step = Step {
            seqs: (0..b).map(|s| SeqStep::chain(s, pos, 1)).collect(),
            ..Default::default()
        };
        let a = logits(&mut eager, &step, &next);
        let f = logits(&mut fast, &step, &next);
        assert!(
            a == f,
            "batch {b}, gpu {gpu}: decode step {k} differs from the eager step"
        );
        let v = vocab as usize;
        next = (0..b)
            .map(|s| {
                let row = &a[s * v..(s + 1) * v];
                let best = (0..v)
                    .max_by(|&i, &j| f32::from_bits(row[i]).total_cmp(&f32::from_bits(row[j])))
                    .unwrap_or(0);
                best as u32
            })
            .collect();
    }
    let (replayed, recorded, why) = fast.exec.replay_stats();
    assert_eq!(eager.exec.replay_stats().0, 0);
    // Their writes come before the launches that read them: a CUDA graph
    // can hold every decode pass.
    assert_eq!(fast.exec.graph_unfit(), 0, "batch {b}, gpu {gpu}");
    eprintln!(
        "batch {b} gpu {gpu}: {replayed} replayed, {recorded} recorded, last refusal {why:?}"
    );
    replayed
}

#[test]
fn replayed_decode_steps_equal_eager_steps() {
    for b in [1, 3, 16] {
        for gpu in [false, true] {
            let replayed = check(b, 5, 10, 32, gpu);
            // Two recordings of the decode key, then every step replays.
            assert!(replayed >= 7, "batch {b}, gpu {gpu}: {replayed} replayed");
        }
    }
}

/// The plane attention's key splits go from 1 to 2 at 256 keys: the step
/// at 257 keys is recorded again (a replay of the old grid would read only
/// 256 keys and differ here).
#[test]
fn a_new_key_split_is_recorded_again() {
    let replayed = check(1, 250, 14, 300, true);
    assert!(replayed >= 8, "{replayed} replayed");
}

/// `draftc bench replay`'s check on the tiny target: decode steps and
/// repeated tree verifications, replayed, equal to eager ones bit for bit
/// (the tree passes replay too: their mask bits ride in the one upload).
#[test]
fn the_bench_check_replays_decode_and_tree_verification() {
    use draftc_runtime::bench::replay::{check_replay, table};
    for gpu in [false, true] {
        for b in [1, 3] {
            let mut eager = model(b, 48, gpu, false);
            let mut fast = model(b, 48, gpu, true);
            let prompts: Vec<Vec<u32>> = (0..b)
                .map(|s| (0..4 + s as u32).map(|i| (i * 5 + s as u32) % 20).collect())
                .collect();
            let checks = check_replay(&mut eager, &mut fast, &prompts, 6).unwrap();
            eprintln!("{}", table("lavapipe", &checks));
            assert_eq!(checks.len(), 2);
            for c in &checks {
                assert_eq!(c.first_difference, None, "{c:?}");
                assert!(c.replayed >= 3, "batch {b} gpu {gpu}: {c:?}");
            }
        }
    }
}

/// Speculative rounds replay their verification pass (a chain of the same
/// rows every round) and give the tokens they give eagerly.
#[test]
fn speculative_rounds_replay_their_verification() {
    for (name, tree, budget) in [("beagle", Some("chain"), 3), ("specformer", None, 4)] {
        for b in [1, 3] {
            let mut tokens = Vec::new();
            let mut stats = Vec::new();
            for replay in [false, true] {
                let (mut t, mut d) = gpu_layout_drafter(b, name, tree);
                t.exec.set_replay(replay);
                let run = speculate(&mut t, d.as_mut(), b, budget, &mut |_, _| {});
                tokens.push(run.tokens);
                let (replayed, recorded, why) = t.exec.replay_stats();
                stats.push((
                    run.stats.rounds,
                    replayed,
                    recorded,
                    why.map(str::to_string),
                ));
            }
            eprintln!("{name} batch {b}: (rounds, replayed, recorded, refusal) {stats:?}");
            assert_eq!(
                tokens[0], tokens[1],
                "{name} batch {b}: replay changed the tokens"
            );
            assert_eq!(stats[0].1, 0);
            assert!(
                stats[1].1 > 0,
                "{name} batch {b}: nothing replayed: {stats:?}"
            );
        }
    }
}

/// With replay on, rounds settle too: a key met in a run settles in the
/// next (its recording then keeps its buffers), so a third run of the same
/// requests on the same models replays nearly every verification pass and
/// allocates at most a few buffers after its first round (the first run
/// makes the kept buffers its recordings then keep), with SpecFormer's
/// eager drafter passes and with Beagle's and EAGLE's replayed ones.
#[test]
fn a_repeated_speculative_run_settles() {
    use draftc_ops::counters::snapshot;
    for (name, tree, b) in [
        ("specformer", None, 1),
        ("specformer", None, 3),
        ("beagle", Some("chain"), 3),
        ("eagle", Some("chain"), 3),
    ] {
        let (mut t, mut d) = gpu_layout_drafter(b, name, tree);
        let mut runs = Vec::new();
        for _ in 0..3 {
            let mut at_token = Vec::new();
            let (replayed0, recorded0, _) = t.exec.replay_stats();
            let out = speculate(&mut t, d.as_mut(), b, 4, &mut |_, _| {
                at_token.push(snapshot().allocations)
            });
            let (replayed, recorded, _) = t.exec.replay_stats();
            // (allocations after the first round, replayed, recorded, rounds)
            runs.push((
                at_token[at_token.len() - 1] - at_token[2 * b - 1],
                replayed - replayed0,
                recorded - recorded0,
                out.stats.rounds as u64,
            ));
        }
        eprintln!(
            "{name} batch {b}: (allocations after round 1, replayed, recorded, rounds) {runs:?}"
        );
        let third = runs[2];
        assert_eq!(
            third.2, 0,
            "{name} batch {b}: the third run recorded passes: {runs:?}"
        );
        assert!(10 * third.1 >= 9 * third.3, "{name} batch {b}: {runs:?}");
        assert!(
            third.0 <= 4,
            "{name} batch {b}: the third run allocated {} times: {runs:?}",
            third.0
        );
    }
}

/// Every round's trees, node by node: (token, parent, log-probability
/// bits).
#[derive(Default)]
struct Trees(Vec<Vec<(u32, Option<usize>, u32)>>);

impl Watch for Trees {
    fn drafted(
        &mut self,
        _name: &str,
        _seqs: &[draftc_runtime::engine::SeqView<'_>],
        trees: &[draftc_runtime::speculation::DraftTree],
    ) {
        for t in trees {
            let nodes = (0..t.len())
                .map(|i| {
                    let n = t.node(i);
                    (n.token, n.parent, n.logprob.to_bits())
                })
                .collect();
            self.0.push(nodes);
        }
    }
}

/// A drafter's passes replay when asked (by default for EAGLE and Beagle,
/// with `DRAFTC_REPLAY=all` for SpecFormer; here `Executor::set_replay` on
/// the drafter's executor): every tree it drafts with replay equals the
/// eager one node for node, log-probabilities bit for bit, and at least
/// `share` of its passes replay.
fn draft_passes_replay(name: &str, tree: Option<&str>, share: f64) {
    for b in [1, 3] {
        let mut runs = Vec::new();
        for replay in [false, true] {
            let (mut t, d) = gpu_layout_drafter(b, name, tree);
            let mut d = Watched {
                inner: d,
                watch: Trees::default(),
            };
            t.exec.set_replay(replay);
            d.inner.executor_mut().unwrap().set_replay(replay);
            let out = speculate(&mut t, &mut d, b, 4, &mut |_, _| {});
            let e = d.inner.executor().unwrap();
            let (replayed, recorded, why) = e.replay_stats();
            let passes = e.host_time().passes;
            eprintln!(
                "{name} {tree:?} batch {b} replay {replay}: drafter {replayed} replayed, \
                 {recorded} recorded of {passes} passes ({why:?})"
            );
            runs.push((out.tokens, d.watch.0, replayed, passes));
        }
        let (eager, fast) = (&runs[0], &runs[1]);
        assert_eq!(eager.0, fast.0, "{name} batch {b}: tokens");
        assert_eq!(eager.1.len(), fast.1.len(), "{name} batch {b}: rounds");
        for (r, (a, f)) in eager.1.iter().zip(&fast.1).enumerate() {
            assert!(
                a == f,
                "{name} {tree:?} batch {b}: tree {r} differs: {a:?} against {f:?}"
            );
        }
        assert_eq!(eager.2, 0);
        assert!(
            fast.2 as f64 >= share * fast.3 as f64,
            "{name} {tree:?} batch {b}: {} of {} passes replayed",
            fast.2,
            fast.3
        );
    }
}

/// SpecFormer's drafter passes (its own cache, the target's states as an
/// input) replay.
#[test]
fn specformer_draft_passes_replay_their_drafts() {
    draft_passes_replay("specformer", None, 0.4);
}

/// EAGLE's drafter passes replay, chain and tree: their `prev` rows are
/// packed into buffers kept per row count, their ids ride in the pass's own
/// upload, and a level's memory tail over the drafter's own cache rides in
/// the step upload (keyed by its length). Its first passes, whose rows
/// follow how many tokens each sequence accepted, replay once their count
/// repeats.
#[test]
fn eagle_draft_passes_replay_their_drafts() {
    draft_passes_replay("eagle", Some("chain"), 0.8);
    draft_passes_replay("eagle", None, 0.5);
}

/// Beagle's drafter passes replay, chain and tree: its memory rows (the
/// target's states, then each level's predicted states) are packed into
/// buffers kept per row count and keyed by their count per sequence; the
/// step upload holds the memory rows' positions and cache slots and the
/// tree tail, and the pass uploads its own rows' positions (its queries'
/// RoPE) with its ids. Its first passes' rows follow how many tokens each
/// sequence accepted.
#[test]
fn beagle_draft_passes_replay_their_drafts() {
    draft_passes_replay("beagle", Some("chain"), 0.7);
    draft_passes_replay("beagle", None, 0.5);
}

/// EAGLE's passes at the executor, eager against replayed, bit for bit:
/// rounds of a first pass over each sequence's new committed rows (the
/// cache truncated to them first), then two draft levels of one row a
/// sequence with a memory tail over the drafter's own cache (with and
/// without one). The level passes' step upload once took a kept buffer
/// that an earlier launch of the pass used and let go of: a replay that
/// wrote it before its launches (not where the eager pass did) gave other
/// logits from the first replayed level on. Replays now write where the
/// eager pass did, and an upload being recorded takes no buffer its pass
/// used before.
#[test]
fn eagle_level_passes_replay_bit_for_bit() {
    use draftc_ops::{DType, DeviceTensor};
    use draftc_runtime::exec::{CacheStore, Executor, MemoryTail};
    use std::collections::BTreeMap;
    let (t, tw) = target_layers(3, 4);
    let g = compile("eagle", &t.target_config);
    let w = drafter_weights(&t, &tw, &g, None);
    let c = draftc_ops::testing::wgpu_client();
    let prev_name = g
        .inputs
        .iter()
        .map(|&i| g.node(i).name.clone())
        .find(|n| n != "ids")
        .unwrap();
    for tail in [true, false] {
        let mk = |replay: bool| {
            let mut e =
                Executor::<Wgpu>::new(&c, &g, &t.weights, &w, PlanDType::F32, true).unwrap();
            e.set_device(gpu_layout_profile(&c));
            e.set_replay(replay);
            (e, CacheStore::<Wgpu>::new(&c, 3, 200, DType::F32))
        };
        let (mut ea, mut ca) = mk(false);
        let (mut eb, mut cb) = mk(true);
        let width = 32;
        // The replaying side's `prev` rows stay in one buffer per row count.
        let mut staged: BTreeMap<usize, DeviceTensor<Wgpu>> = BTreeMap::new();
        let (mut committed, mut in_rows) = (vec![5usize, 3, 7], vec![0usize; 3]);
        let mut rng = Rng(17);
        for round in 0..5 {
            for level in 0..3 {
                let mut step = Step::default();
                let mut ids = Vec::new();
                for s in 0..3 {
                    let (positions, memory_tail) = if level == 0 {
                        ca.truncate(s, in_rows[s]);
                        cb.truncate(s, in_rows[s]);
                        ((in_rows[s] as u32..=committed[s] as u32).collect(), None)
                    } else {
                        let t = MemoryTail {
                            len: level,
                            visible: vec![(0..level).collect()],
                        };
                        (vec![(committed[s] + level) as u32], tail.then_some(t))
                    };
                    ids.extend(positions.iter().map(|_| rng.next() as u32 % 50));
                    step.seqs.push(SeqStep {
                        slot: s,
                        positions,
                        parents: None,
                        memory_tail,
                    });
                }
                let rows = ids.len();
                let prev: Vec<f32> = (0..rows * width).map(|_| rng.f() - 0.5).collect();
                let fresh = |p: &[f32]| {
                    DeviceTensor::<Wgpu>::upload_f32(&c, p, &[rows, width], DType::F32).unwrap()
                };
                let kept = staged
                    .entry(rows)
                    .or_insert_with(|| DeviceTensor::empty(&c, &[rows, width], DType::F32))
                    .clone();
                let all: Vec<u32> = (0..rows as u32).collect();
                draftc_ops::kv::gather_rows(&c, &fresh(&prev), &all, &kept, &all).unwrap();
                let mut logits = Vec::new();
                for (e, cache, input) in
                    [(&mut ea, &mut ca, fresh(&prev)), (&mut eb, &mut cb, kept)]
                {
                    let inputs = BTreeMap::from([(prev_name.clone(), input)]);
                    let out = e.run_uploading(&step, &[("ids", &ids)], &inputs, cache, None);
                    let l = out
                        .unwrap()
                        .get("logits")
                        .unwrap()
                        .download_f32(&c)
                        .unwrap();
                    logits.push(l.iter().map(|x| x.to_bits()).collect::<Vec<_>>());
                }
                assert!(
                    logits[0] == logits[1],
                    "tail {tail}: round {round} level {level} differs from the eager pass \
                     ({:?} replayed, recorded)",
                    eb.replay_stats()
                );
                if level == 0 {
                    let name = ca.caches()[0].clone();
                    for (s, r) in in_rows.iter_mut().enumerate() {
                        *r = ca.len(&name, s);
                    }
                }
            }
            for (s, n) in committed.iter_mut().enumerate() {
                *n += 1 + (round + s) % 2;
            }
        }
        let (replayed, _, _) = eb.replay_stats();
        assert!(
            replayed >= 6,
            "tail {tail}: {replayed} level passes replayed"
        );
        // An upload takes no buffer the pass used before it
        // (`draftc_ops::kept::take_ref`): a CUDA graph can hold them.
        assert_eq!(eb.graph_unfit(), 0, "tail {tail}");
    }
}

/// The tiny Qwen 3 and Gemma 3 checkpoints replay their decode passes too,
/// bit for bit: their per-head q/k norms rotate by the step's positions
/// before the K rows are appended (the step upload goes first,
/// `Run::step_upload_ahead`), the append copies out of the temporary into a
/// kept buffer, and Gemma's global layers share the sliding layers'
/// attention metadata (`AttnMeta::for_mask`) instead of uploading their own.
#[test]
fn qwen3_and_gemma3_decode_passes_replay() {
    use draftc_runtime::model::ConvertedModel;
    for name in ["qwen3-tied", "gemma3-tied"] {
        let dir = repo().join("runtime/tests/fixtures/targets").join(name);
        let model = ConvertedModel::open(&dir).unwrap();
        let load = |replay: bool| {
            let mut t = TargetModel::<Wgpu>::load(
                &draftc_ops::testing::wgpu_client(),
                &model,
                2,
                48,
                PlanDType::F32,
            )
            .unwrap();
            t.exec.set_replay(replay);
            t
        };
        let (mut eager, mut fast) = (load(false), load(true));
        let vocab = eager.vocab as u32;
        let prompt = 6;
        let step = Step {
            seqs: (0..2).map(|s| SeqStep::chain(s, 0, prompt)).collect(),
            ..Default::default()
        };
        let ids: Vec<u32> = (0..2 * prompt as u32)
            .map(|i| (i * 5 + 3) % vocab)
            .collect();
        assert_eq!(
            logits(&mut eager, &step, &ids),
            logits(&mut fast, &step, &ids)
        );
        for k in 0..12 {
            let step = Step {
                seqs: (0..2)
                    .map(|s| SeqStep::chain(s, (prompt + k) as u32, 1))
                    .collect(),
                ..Default::default()
            };
            let next = [(k as u32 * 11 + 1) % vocab, (k as u32 * 13 + 2) % vocab];
            assert!(
                logits(&mut eager, &step, &next) == logits(&mut fast, &step, &next),
                "{name}: decode step {k} differs from the eager step"
            );
        }
        let (replayed, recorded, why) = fast.exec.replay_stats();
        eprintln!("{name}: {replayed} replayed, {recorded} recorded, last refusal {why:?}");
        assert!(
            replayed >= 9,
            "{name}: {replayed} replayed (last refusal {why:?})"
        );
    }
}
