//! The executor (plan of fused kernels on wgpu) against the reference
//! interpreter (graph node by node, ops references on the host), for every
//! model in `models/`, on random weights and random small configurations:
//! target sizes (layers, d, heads, kv heads, f, vocab; tied or untied head,
//! RoPE plain or scaled as Llama 3.1's; Qwen 3's head size apart from
//! d / h), draft length `l`,
//! batch size, ragged rows per sequence, fused or unfused plans. Each case
//! runs three passes through the caches — a prefill, an extension, and a
//! tree-verification pass (parents given) — and compares every output
//! (`logits`, emitted streams, appended memory rows) to f32 1e-4.

use std::collections::BTreeMap;

use draftc_codegen::{PlanConfig, PlanDType, TargetWeights};
use draftc_ir::graph::Graph;
use draftc_ir::op::{Cache, InputSource, Op};
use draftc_ir::types::DType as IrDType;
use draftc_ir::TargetConfig;
use draftc_ops::attention::TREE_ROOT;
use draftc_ops::testing::{assert_close_tol, wgpu_client};
use draftc_ops::{DType, DeviceTensor};
use draftc_runtime::device::gpu_layout_profile;
use draftc_runtime::exec::{
    interpret, CacheStore, Executor, HostCaches, HostTensor, HostWeights, MemoryRows, MemoryTail,
    SeqStep, Step,
};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use tiny::Rng;

mod tiny;

type Wgpu = cubecl::wgpu::WgpuRuntime;

use draftc_ir::testing::{graph_models as models, repo, ModelsDir};

#[derive(Clone, Debug)]
struct Config {
    layers: i64,
    heads: i64,
    kv_heads: i64,
    head_dim: i64,
    f: i64,
    vocab: i64,
    l: i64,
    /// New rows per sequence in each of the first two passes.
    rows: Vec<(usize, usize)>,
    fuse: bool,
    /// The target's LM head is its embedding (`tied_embeddings`) or a
    /// tensor of its own.
    tied: bool,
    /// RoPE scaled as Llama 3.1's (over a 16-token pre-training context, so
    /// every frequency of these heads changes).
    scaled: bool,
    seed: u64,
    /// Lower for a GPU profile: the plane layouts run on lavapipe.
    gpu: bool,
}

fn config() -> impl Strategy<Value = Config> {
    (
        // Even: SpecFormer taps `target.hidden[n/2]`.
        prop_oneof![Just(2i64), Just(4)],
        prop_oneof![Just((1i64, 1i64)), Just((2, 1)), Just((4, 2)), Just((2, 2))],
        prop_oneof![Just(4i64), Just(8)],
        4i64..=24,
        17i64..=70,
        2i64..=4,
        prop::collection::vec((1usize..=4, 1usize..=3), 1..=3),
        any::<bool>(),
        any::<bool>(),
        any::<u64>(),
    )
        .prop_map(
            |(layers, (heads, kv_heads), head_dim, f, vocab, l, rows, fuse, tied, seed)| Config {
                layers,
                heads,
                kv_heads,
                head_dim,
                f,
                vocab,
                l,
                rows,
                fuse,
                tied,
                scaled: seed.is_multiple_of(2),
                seed,
                gpu: false,
            },
        )
}

fn tiny_target(c: &Config) -> TargetConfig {
    let src = std::fs::read_to_string(repo().join("models/smollm2-135m.draft")).unwrap();
    let mut t = draftc_ir::parse_preset(&src).unwrap();
    draftc_ir::testing::gemma_settings(&mut t);
    for (k, v) in [
        ("n", c.layers),
        ("d", c.heads * c.head_dim),
        ("h", c.heads),
        ("hkv", c.kv_heads),
        // A model file that takes `head_dim=hd` (Qwen 3) gets heads of
        // another size than d / h, so its query width differs from d.
        ("hd", c.head_dim + 4),
        ("f", c.f),
        ("v", c.vocab),
    ] {
        t.ints.insert(k.into(), v);
    }
    t.flags.insert("tied_embeddings".into(), c.tied);
    t.flags.insert("rope_llama3".into(), c.scaled);
    if c.scaled {
        for (k, v) in [
            ("rope_factor", 8.0),
            ("rope_low_freq_factor", 1.0),
            ("rope_high_freq_factor", 4.0),
        ] {
            t.floats.insert(k.into(), v);
        }
        t.ints.insert("rope_original_context".into(), 16);
    }
    t
}

fn compile(name: &str, target: &TargetConfig, c: &Config) -> Graph {
    let src = std::fs::read_to_string(repo().join("models").join(format!("{name}.draft"))).unwrap();
    let mut sets = BTreeMap::new();
    if draftc_ir::header(&src).is_some_and(|(k, _)| k == draftc_ir::ItemKind::Drafter) {
        sets.insert("l".to_string(), c.l);
    }
    draftc_ir::compile(&src, target, &sets, &ModelsDir).unwrap_or_else(|d| panic!("{name}: {d:?}"))
}

fn weight_table(g: &Graph, tw: &TargetWeights) -> Vec<draftc_codegen::bind::WeightSpec> {
    let cfg = PlanConfig {
        tokens: 1,
        batch: 1,
        context: 0,
        dtype: PlanDType::F32,
        fuse: false,
        ..Default::default()
    };
    let plan = draftc_codegen::plan(g, tw, &cfg).unwrap();
    draftc_codegen::pipeline::weights(&plan).unwrap()
}

fn reads_target_caches(g: &Graph) -> bool {
    g.nodes
        .iter()
        .any(|n| matches!(&n.op, Op::Attention(a) if matches!(a.cache, Cache::Target(_))))
}

/// The pass's inputs (host) for `g` and `step`.
fn inputs_for(
    g: &Graph,
    step: &mut Step,
    c: &Config,
    d: usize,
    rng: &mut Rng,
) -> BTreeMap<String, HostTensor> {
    let rows = step.rows() as i64;
    let mut vals = g.symbol_values.clone();
    vals.insert("t".into(), rows);
    vals.insert("b".into(), 1);
    let mut out = BTreeMap::new();
    for &i in &g.inputs {
        let node = g.node(i);
        let shape: Vec<usize> = node
            .ty
            .dims
            .iter()
            .map(|d| d.eval(&vals).unwrap() as usize)
            .collect();
        let n: usize = shape.iter().product();
        let t = match (&node.op, node.ty.dtype) {
            (Op::Input(InputSource::External), IrDType::U32) => HostTensor::u32(
                shape,
                (0..n)
                    .map(|_| (rng.next() % c.vocab as u64) as u32)
                    .collect(),
            ),
            _ => HostTensor::f32(shape, (0..n).map(|_| rng.f()).collect()),
        };
        out.insert(node.name.clone(), t);
    }
    for m in &g.memories {
        let lens = step.lens();
        let total: usize = lens.iter().sum();
        step.memory.insert(
            m.name.to_string(),
            MemoryRows {
                data: (0..total * d).map(|_| rng.f()).collect(),
                lens,
                positions: step.positions(),
            },
        );
    }
    out
}

fn upload(
    client: &cubecl::client::ComputeClient<Wgpu>,
    inputs: &BTreeMap<String, HostTensor>,
) -> BTreeMap<String, DeviceTensor<Wgpu>> {
    inputs
        .iter()
        .map(|(k, t)| {
            let d = match t {
                HostTensor::U32 { shape, data } => {
                    DeviceTensor::upload_u32(client, data, shape).unwrap()
                }
                HostTensor::F32 { shape, data } => {
                    DeviceTensor::upload_f32(client, data, shape, DType::F32).unwrap()
                }
            };
            (k.clone(), d)
        })
        .collect()
}

fn check_model(name: &str, c: &Config) -> Result<(), TestCaseError> {
    // EAGLE-3 taps HS[n − 3]: it needs four layers at least.
    let deeper;
    let c = if name == "eagle3" && c.layers < 4 {
        deeper = Config {
            layers: 4,
            ..c.clone()
        };
        &deeper
    } else {
        c
    };
    let client = wgpu_client();
    let target = tiny_target(c);
    let llama = compile("llama", &target, c);
    let tw = TargetWeights::new(&target, &llama.meta.exports);
    let g = compile(name, &target, c);
    let mut specs = weight_table(&g, &tw);
    let with_target = reads_target_caches(&g);
    if with_target {
        specs.extend(weight_table(&llama, &tw));
    }
    let weights = HostWeights::random(&specs, c.seed);
    let d = (c.heads * c.head_dim) as usize;
    let mut rng = Rng(c.seed ^ 0x5eed);
    let batch = c.rows.len();
    let capacity = 64;
    let mut exec = Executor::<Wgpu>::new(&client, &g, &tw, &weights, PlanDType::F32, c.fuse)
        .map_err(|e| TestCaseError::fail(format!("{name}: {e}")))?;
    if c.gpu {
        exec.set_device(gpu_layout_profile(&client));
        let plan = exec
            .plan(1)
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        let planes = plan.launches.iter().any(|l| {
            matches!(
                l.kernel,
                draftc_codegen::Kernel::Linear {
                    layout: draftc_codegen::LinearLayout::Planes { .. },
                    ..
                }
            )
        });
        let linears = plan
            .launches
            .iter()
            .any(|l| matches!(l.kernel, draftc_codegen::Kernel::Linear { .. }));
        prop_assert!(
            planes || !linears,
            "{name}: no plane layout in {}",
            exec.device()
        );
        if name == "llama" {
            let attn = plan.launches.iter().any(|l| {
                matches!(
                    l.kernel,
                    draftc_codegen::Kernel::Attention {
                        layout: draftc_codegen::AttentionLayout::Planes { .. },
                        ..
                    }
                )
            });
            prop_assert!(attn, "llama: attention kept the lane layout");
        }
    }
    let mut dev_caches = CacheStore::<Wgpu>::new(&client, batch, capacity, DType::F32);
    let mut host_caches = HostCaches::new(batch);
    let mut dev_target = CacheStore::<Wgpu>::new(&client, batch, capacity, DType::F32);
    let mut host_target = HostCaches::new(batch);
    let mut committed = vec![0usize; batch];
    if with_target {
        // Fill the target's caches with a target prefill first.
        let mut texec =
            Executor::<Wgpu>::new(&client, &llama, &tw, &weights, PlanDType::F32, c.fuse).unwrap();
        if c.gpu {
            texec.set_device(gpu_layout_profile(&client));
        }
        let mut step = Step {
            seqs: (0..batch).map(|s| SeqStep::chain(s, 0, 3)).collect(),
            ..Step::default()
        };
        let inputs = inputs_for(&llama, &mut step, c, d, &mut rng);
        texec
            .run(&step, &upload(&client, &inputs), &mut dev_target, None)
            .unwrap();
        interpret(
            &llama,
            &tw,
            &weights,
            &step,
            &inputs,
            &mut host_target,
            None,
        )
        .unwrap();
        committed = vec![3; batch];
    }
    // Pass 3 (graphs with memory streams): tree drafting over the memory,
    // the last 3 memory rows restricted per row.
    let passes = if g.memories.is_empty() { 3 } else { 4 };
    for pass in 0..passes {
        let seqs: Vec<SeqStep> = (0..batch)
            .map(|s| {
                let start = committed[s] as u32;
                match pass {
                    0 => SeqStep::chain(s, start, c.rows[s].0),
                    1 => SeqStep::chain(s, start, c.rows[s].1),
                    2 => SeqStep {
                        slot: s,
                        positions: vec![start, start + 1, start + 1, start + 2],
                        parents: Some(vec![TREE_ROOT, 0, 0, 2]),
                        memory_tail: None,
                    },
                    _ => SeqStep {
                        slot: s,
                        positions: vec![start + 3, start + 4, start + 4],
                        parents: None,
                        memory_tail: Some(MemoryTail {
                            len: 3,
                            visible: vec![vec![0], vec![0, 1], vec![2]],
                        }),
                    },
                }
            })
            .collect();
        for (s, q) in seqs.iter().enumerate() {
            if pass < 2 {
                committed[s] += q.positions.len();
            }
        }
        let mut step = Step {
            seqs,
            ..Step::default()
        };
        let inputs = inputs_for(&g, &mut step, c, d, &mut rng);
        let got = exec
            .run(
                &step,
                &upload(&client, &inputs),
                &mut dev_caches,
                with_target.then_some(&mut dev_target),
            )
            .map_err(|e| TestCaseError::fail(format!("{name} pass {pass}: {e}")))?;
        let want = interpret(
            &g,
            &tw,
            &weights,
            &step,
            &inputs,
            &mut host_caches,
            with_target.then_some(&mut host_target),
        )
        .map_err(|e| TestCaseError::fail(format!("{name} pass {pass} (interpreter): {e}")))?;
        prop_assert!(!want.tensors.is_empty());
        for (out, w) in &want.tensors {
            let t = got
                .get(out)
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            let a = t.download_f32(&client).unwrap();
            assert_close_tol(
                &format!("{name} pass {pass} `{out}`"),
                &a,
                &w.to_f32(),
                1e-4,
            )?;
        }
        if pass >= 2 && with_target {
            // A drafter must not leave tentative rows in the target's caches.
            for s in 0..batch {
                dev_target.truncate(s, 3);
                host_target.truncate(s, 3);
            }
        }
    }
    Ok(())
}

fn cases() -> u32 {
    std::env::var("DRAFTC_EXEC_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn executor_equals_interpreter_for_every_model(c in config()) {
        let all = models();
        prop_assert!(all.len() >= 6, "{all:?}");
        for name in &all {
            check_model(name, &c)?;
        }
        // The target both ways: RoPE plain and scaled in every case.
        check_model("llama", &Config { scaled: !c.scaled, ..c.clone() })?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1, failure_persistence: None, ..ProptestConfig::default() })]

    /// The GPU kernel layouts (plane linears) give the interpreter's
    /// results for every model, run on lavapipe's 8-lane planes.
    #[test]
    fn executor_with_gpu_layouts_equals_interpreter(
        // head_dim 8 fills lavapipe's 8-lane planes, so attention takes the
        // GPU layout too.
        c in config().prop_map(|c| Config { gpu: true, head_dim: 8, ..c }),
    ) {
        for name in &models() {
            check_model(name, &c)?;
        }
    }
}

/// A pass over ragged prompts, every row's logits, then the same pass with
/// `output_rows`: the LM head on those rows alone.
fn logits_of(
    t: &mut draftc_runtime::engine::TargetModel<Wgpu>,
    lens: &[usize],
    rows: Option<Vec<u32>>,
) -> Result<Vec<f32>, String> {
    let mut step = Step::default();
    let mut ids = Vec::new();
    for (s, &n) in lens.iter().enumerate() {
        t.caches.reset(s);
        step.seqs.push(SeqStep::chain(s, 0, n));
        ids.extend((0..n as u32).map(|i| (i * 7 + s as u32 * 13) % 90 + 1));
    }
    step.output_rows = rows;
    let out = t.forward(&step, &ids).map_err(|e| e.to_string())?;
    out.get("logits")
        .map_err(|e| e.to_string())?
        .download_f32(t.client())
        .map_err(|e| e.to_string())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 4, failure_persistence: None, ..ProptestConfig::default() })]

    /// `Step::output_rows` gives exactly those rows of the full pass's
    /// logits (bit for bit: the head computes each row alone), in their
    /// order, for f32 and f16, lane and plane layouts; none gives an empty
    /// tensor, a row past the pass an error.
    #[test]
    fn selected_output_rows_equal_those_rows_of_the_full_pass(
        lens in prop::collection::vec(1usize..9, 1..4),
        pick in prop::collection::vec(any::<prop::sample::Index>(), 0..6),
        f16 in any::<bool>(),
        gpu in any::<bool>(),
    ) {
        let dtype = if f16 { PlanDType::F16 } else { PlanDType::F32 };
        let (mut t, _) = tiny::target_with(lens.len(), dtype);
        if gpu {
            let p = gpu_layout_profile(t.client());
            t.exec.set_device(p);
        }
        let rows_total: usize = lens.iter().sum();
        let v = t.vocab;
        let all = logits_of(&mut t, &lens, None).unwrap();
        prop_assert_eq!(all.len(), rows_total * v);
        let rows: Vec<u32> = pick.iter().map(|i| i.index(rows_total) as u32).collect();
        let got = logits_of(&mut t, &lens, Some(rows.clone())).unwrap();
        prop_assert_eq!(got.len(), rows.len() * v);
        for (j, &r) in rows.iter().enumerate() {
            let r = r as usize;
            prop_assert_eq!(&got[j * v..(j + 1) * v], &all[r * v..(r + 1) * v], "row {}", r);
        }
        let past = logits_of(&mut t, &lens, Some(vec![rows_total as u32]));
        prop_assert!(past.is_err_and(|e| e.contains("output row")), "a row past the pass");
    }
}
