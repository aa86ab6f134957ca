//! Attention benchmarks at SmolLM2-135M shapes (9 query heads, 3 KV heads,
//! head_dim 64): context attention (decode and prefill), draft-dim attention
//! (paper 000, chunked), tree verification (64 nodes over 1024 committed),
//! sliding window + sink, and cubek 0.2's attention (full/causal only, MHA)
//! at the same sizes. Prints GB/s (compulsory traffic: q, k, v, out once)
//! and GFLOP/s (4·hd per visible query-key pair per head).
//!
//! `cargo bench -p draftc-ops --bench attention [--features cubek-compare]`
//! (the cubek rows need the feature: it builds cubek-attention, minutes).

use std::time::{Duration, Instant};

use cubecl::prelude::*;
use cubecl::wgpu::WgpuRuntime;
#[cfg(feature = "cubek-compare")]
use cubek::attention::definition::{AccumulatorPrecision, AttentionGlobalTypes, AttentionOptions};
use draftc_ops::attention::{
    attention_rows, draft_dim_attention, AttnDims, AttnMeta, Mask, SeqBatch,
};
use draftc_ops::testing::{random_f32, wgpu_client};
use draftc_ops::{DType, DeviceTensor};

type R = WgpuRuntime;

const SMOL: AttnDims = AttnDims {
    heads: 9,
    kv_heads: 3,
    head_dim: 64,
};

/// Mean seconds per call: one warm-up (JIT), then calls until 0.5 s or 20 calls.
fn time(client: &ComputeClient<R>, mut f: impl FnMut()) -> f64 {
    f();
    cubecl::future::block_on(client.sync()).expect("sync");
    let start = Instant::now();
    let mut n = 0;
    while n < 20 && (n < 2 || start.elapsed() < Duration::from_millis(500)) {
        f();
        cubecl::future::block_on(client.sync()).expect("sync");
        n += 1;
    }
    start.elapsed().as_secs_f64() / n as f64
}

fn visible_pairs(batch: &SeqBatch, mask: Mask) -> usize {
    let (qs, ks) = (batch.q_starts(), batch.k_starts());
    let (anc, words) = if mask == Mask::Tree {
        batch.ancestor_bits()
    } else {
        (vec![], 0)
    };
    let mut pairs = 0;
    for s in 0..batch.batch() {
        let tree_base = ks[s + 1] - batch.q_lens[s];
        for r in qs[s]..qs[s + 1] {
            pairs += (ks[s]..ks[s + 1])
                .filter(|&j| match mask {
                    Mask::Tree => {
                        j < tree_base
                            || anc[r * words + (j - tree_base) / 32] >> ((j - tree_base) % 32) & 1
                                == 1
                    }
                    m => m.visible(batch.q_pos[r], batch.k_pos[j]),
                })
                .count();
        }
    }
    pairs
}

fn row(name: &str, secs: f64, bytes: usize, flops: usize) {
    println!(
        "| {name:<44} | {:>9.3} | {:>7.2} | {:>8.2} |",
        secs * 1e3,
        bytes as f64 / secs / 1e9,
        flops as f64 / secs / 1e9
    );
}

fn ours(
    client: &ComputeClient<R>,
    name: &str,
    dims: AttnDims,
    batch: &SeqBatch,
    mask: Mask,
    dtype: DType,
) {
    let (tq, tk) = (batch.total_q(), batch.total_k());
    let t = |rows: usize, h: usize, seed: u64| {
        let data = random_f32(seed, rows * h * dims.head_dim, -1.0, 1.0, dtype);
        DeviceTensor::<R>::upload_f32(client, &data, &[rows, h, dims.head_dim], dtype)
            .expect("upload")
    };
    let (q, k, v, out) = (
        t(tq, dims.heads, 1),
        t(tk, dims.kv_heads, 2),
        t(tk, dims.kv_heads, 3),
        t(tq, dims.heads, 4),
    );
    let meta = AttnMeta::new(client, batch, mask).expect("meta");
    let secs = time(client, || {
        attention_rows(client, &q, &k, &v, dims, &meta, 0..tq, &out).expect("attention")
    });
    let bytes = (2 * tq * dims.heads + 2 * tk * dims.kv_heads) * dims.head_dim * dtype.size();
    row(
        name,
        secs,
        bytes,
        4 * dims.head_dim * dims.heads * visible_pairs(batch, mask),
    );
}

fn draft_dim(client: &ComputeClient<R>, bt: usize, l: usize, chunk: usize) {
    let dims = SMOL;
    let t = |h: usize, seed: u64| {
        let data = random_f32(seed, bt * l * h * dims.head_dim, -1.0, 1.0, DType::F32);
        DeviceTensor::<R>::upload_f32(client, &data, &[bt, l, h * dims.head_dim], DType::F32)
            .expect("upload")
    };
    let (q, k, v, out) = (
        t(dims.heads, 1),
        t(dims.kv_heads, 2),
        t(dims.kv_heads, 3),
        t(dims.heads, 4),
    );
    let secs = time(client, || {
        draft_dim_attention(client, &q, &k, &v, dims, chunk, &out).expect("draft-dim")
    });
    let bytes = (2 * dims.heads + 2 * dims.kv_heads) * bt * l * dims.head_dim * 4;
    row(
        &format!("draft-dim bt={bt} l={l} chunk={chunk} f32"),
        secs,
        bytes,
        4 * dims.head_dim * dims.heads * bt * l * l,
    );
}

#[cfg(feature = "cubek-compare")]
fn cubek_attention(client: &ComputeClient<R>, heads: usize, seq: usize, causal: bool) {
    let hd = 64;
    let shape = [1, heads, seq, hd];
    let t = |seed: u64| {
        let data = random_f32(seed, heads * seq * hd, -1.0, 1.0, DType::F32);
        let handle = client.create_from_slice(f32::as_bytes(&data));
        let strides = [heads * seq * hd, seq * hd, hd, 1];
        unsafe { TensorBinding::<R>::from_raw_parts(handle, strides.into(), shape.into()) }
    };
    let (q, k, v, out) = (t(1), t(2), t(3), t(4));
    let types = AttentionGlobalTypes::from_single_float_dtype(
        f32::as_type_native_unchecked(),
        u8::as_type_native_unchecked().storage_type(),
    );
    let run = || {
        cubek::attention::launch::launch_ref::<R>(
            cubek::attention::launch::Strategy::Unit(
                cubek::attention::launch::BlueprintStrategy::Inferred(()),
            ),
            client,
            q.clone(),
            k.clone(),
            v.clone(),
            None,
            out.clone(),
            &types,
            AttentionOptions {
                causal,
                accumulator_precision: AccumulatorPrecision::Loose,
            },
        )
    };
    if let Err(e) = run() {
        println!(
            "| cubek Unit h={heads} t={seq} causal={causal:<5}               | unavailable: {e:?}"
        );
        return;
    }
    let secs = time(client, || {
        run().expect("cubek attention");
    });
    let pairs = if causal {
        seq * (seq + 1) / 2
    } else {
        seq * seq
    };
    let name = format!(
        "cubek Unit MHA h={heads} t={seq} {} f32",
        if causal { "causal" } else { "full" }
    );
    row(
        &name,
        secs,
        4 * heads * seq * hd * 4,
        4 * hd * heads * pairs,
    );
}

fn main() {
    let client = wgpu_client();
    println!("| case                                         | ms/call   | GB/s    | GFLOP/s  |");
    println!("|----------------------------------------------|-----------|---------|----------|");
    for t in [1024, 4096] {
        ours(
            &client,
            &format!("decode causal t={t} f32"),
            SMOL,
            &SeqBatch::single(1, t),
            Mask::Causal,
            DType::F32,
        );
        ours(
            &client,
            &format!("decode causal t={t} f16"),
            SMOL,
            &SeqBatch::single(1, t),
            Mask::Causal,
            DType::F16,
        );
    }
    let g8 = AttnDims {
        heads: 8,
        kv_heads: 1,
        head_dim: 64,
    };
    let gemma = AttnDims {
        heads: 4,
        kv_heads: 1,
        head_dim: 256,
    };
    for (b, t, dims, what) in [
        (16, 128, SMOL, ""),
        (16, 1024, SMOL, ""),
        (16, 128, g8, ", group 8"),
        (16, 128, gemma, ", group 4 hd 256"),
    ] {
        let per = SeqBatch::single(1, t);
        let batch = SeqBatch {
            q_lens: vec![1; b],
            k_lens: vec![t; b],
            q_pos: (0..b).flat_map(|_| per.q_pos.clone()).collect(),
            k_pos: (0..b).flat_map(|_| per.k_pos.clone()).collect(),
            parents: Vec::new(),
            tail: None,
        };
        ours(
            &client,
            &format!("decode causal {b} rows over t={t}{what} f32"),
            dims,
            &batch,
            Mask::Causal,
            DType::F32,
        );
    }
    ours(
        &client,
        "prefill causal t=512 f32",
        SMOL,
        &SeqBatch::single(512, 512),
        Mask::Causal,
        DType::F32,
    );
    let win = Mask::SlidingSink {
        window: 64,
        sink: 1,
    };
    ours(
        &client,
        "sliding w=64 sink=1, 8 q over t=4096 f32",
        SMOL,
        &SeqBatch::single(8, 4096),
        win,
        DType::F32,
    );
    let parents: Vec<u32> = (0..64u32)
        .map(|i| {
            if i == 0 {
                draftc_ops::attention::TREE_ROOT
            } else {
                (i - 1) / 4
            }
        })
        .collect();
    let tree = SeqBatch::tree(1024, &parents).expect("tree");
    ours(
        &client,
        "tree 64 nodes over 1024 committed f32",
        SMOL,
        &tree,
        Mask::Tree,
        DType::F32,
    );
    ours(
        &client,
        "tree 64 nodes over 1024 committed f16",
        SMOL,
        &tree,
        Mask::Tree,
        DType::F16,
    );
    draft_dim(&client, 4096, 4, 3072);
    draft_dim(&client, 4096, 8, 3072);
    draft_dim(&client, 4096, 8, 1 << 20);
    let mha = AttnDims {
        heads: 9,
        kv_heads: 9,
        head_dim: 64,
    };
    for (seq, causal) in [(512, false), (512, true), (1024, true)] {
        let mask = if causal { Mask::Causal } else { Mask::Full };
        let name = format!(
            "ours MHA h=9 t={seq} {} f32",
            if causal { "causal" } else { "full" }
        );
        ours(
            &client,
            &name,
            mha,
            &SeqBatch::single(seq, seq),
            mask,
            DType::F32,
        );
        #[cfg(feature = "cubek-compare")]
        cubek_attention(&client, 9, seq, causal);
    }
}
