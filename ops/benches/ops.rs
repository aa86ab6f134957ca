//! `cargo bench -p draftc-ops`: kernel throughput at SmolLM2-135M shapes
//! (d 576, FFN 1536, vocab 49152) on the default wgpu device, next to the
//! machine's native memory bandwidth.
//!
//! Tables: native copy/sum bandwidth; the skinny-GEMM table (linear at
//! m = 1, 2, 4, 8, 16, 64: time, GB/s of weights streamed, GFLOP/s, ratio to
//! m = 1); then the other ops (GB/s of bytes read + written once).
//! `DRAFTC_BENCH_QUICK=1` runs fewer shapes (for a smoke run);
//! `DRAFTC_BENCH_ONLY=linear|other` runs one table. With `--features
//! cubek-compare`, the skinny-GEMM table also times cubek 0.2's matmul on the
//! same problem (W read through a transposed [k, n] view, no copy).

use std::time::{Duration, Instant};

use cubecl::prelude::*;
use draftc_ops::elementwise::{binary, BinaryOp};
use draftc_ops::linear::{linear, linear_lanes, Epilogue, Prologue, UNIT_COLUMNS};
use draftc_ops::sampling::{sample, SamplingParams};
use draftc_ops::testing::{random_f32, random_u32, wgpu_client};
use draftc_ops::{argmax_topk, embedding, group_rms_norm, layer_sum, rms_norm, rope, softmax};
use draftc_ops::{DType, DeviceTensor};

type R = cubecl::wgpu::WgpuRuntime;

/// Best wall time of `f` (launch + sync) after one warm-up call (JIT). The
/// minimum, not the median: lavapipe runs on the same CPU cores as everything
/// else on the machine, and the minimum is the least disturbed sample.
fn time(client: &ComputeClient<R>, mut f: impl FnMut()) -> Duration {
    f();
    cubecl::future::block_on(client.sync()).expect("sync");
    let mut samples = Vec::new();
    let start = Instant::now();
    while samples.len() < 5 || (start.elapsed() < Duration::from_millis(600) && samples.len() < 50)
    {
        let t = Instant::now();
        f();
        cubecl::future::block_on(client.sync()).expect("sync");
        samples.push(t.elapsed());
    }
    samples.into_iter().min().unwrap_or_default()
}

fn gbs(bytes: usize, d: Duration) -> f64 {
    bytes as f64 / d.as_secs_f64() / 1e9
}

fn native_bandwidth(client: &ComputeClient<R>) {
    println!("## memory bandwidth: host (Rust) and device (streaming-read probe)");
    let (read, copy) = draftc_ops::probe::host_bandwidth();
    // The ops benches run on lavapipe (the contiguous-chunk probe).
    let device = draftc_ops::probe::device_read_bandwidth(client, false).expect("probe");
    println!("| test | GB/s |\n|---|---|");
    println!("| host: copy 256 MiB (read+write) | {:.1} |", copy / 1e9);
    println!("| host: sum 256 MiB, every core | {:.1} |", read / 1e9);
    println!("| device: stream_sum 64 MiB | {:.2} |\n", device / 1e9);
}

fn up(client: &ComputeClient<R>, shape: &[usize], dtype: DType, seed: u64) -> DeviceTensor<R> {
    let n = shape.iter().product();
    DeviceTensor::upload_f32(client, &random_f32(seed, n, -1.0, 1.0, dtype), shape, dtype)
        .expect("upload")
}

fn skinny_gemm(client: &ComputeClient<R>, quick: bool) {
    // Fixed cost of one launch + flush + sync, for reading the table.
    let tiny = up(client, &[4], DType::F32, 9);
    let d0 = time(client, || {
        binary(client, &tiny, &tiny, BinaryOp::Add, &tiny).expect("add")
    });
    println!(
        "(fixed cost of one launch + flush + sync, measured on a 4-element add: {:.3} ms)\n",
        d0.as_secs_f64() * 1e3
    );
    println!("## linear / skinny GEMM (y = x·Wᵀ, W [out, in]); weights streamed once per call");
    println!("| dtype | in→out | epilogue | m | time | weight GB/s | GFLOP/s | ratio to m=1 |");
    println!("|---|---|---|---|---|---|---|---|");
    let shapes: &[(usize, usize)] = if quick {
        &[(576, 1536)]
    } else {
        &[(576, 1536), (1536, 576), (576, 49152)]
    };
    for dtype in [DType::F32, DType::F16] {
        for &(k, n) in shapes {
            let w = up(client, &[n, k], dtype, 1);
            let mut base = None;
            for m in [1usize, 2, 4, 8, 16, 64] {
                let x = up(client, &[m, k], dtype, 2);
                let out = DeviceTensor::empty(client, &[m, n], dtype);
                let d = time(client, || {
                    linear(client, &x, &w, Prologue::None, Epilogue::None, &out).expect("linear")
                });
                let b = *base.get_or_insert(d);
                let wbytes = n * k * dtype.size();
                println!(
                    "| {dtype} | {k}→{n} | none | {m} | {:.3} ms | {:.2} | {:.2} | {:.2} |",
                    d.as_secs_f64() * 1e3,
                    gbs(wbytes, d),
                    2.0 * (m * n * k) as f64 / d.as_secs_f64() / 1e9,
                    d.as_secs_f64() / b.as_secs_f64()
                );
            }
        }
    }
    unit_columns_table(client, quick);
    #[cfg(feature = "cubek-compare")]
    for &(k, n) in shapes {
        for m in [1usize, 8, 16] {
            cubek_linear(client, k, n, m);
        }
    }
    // Fused variants at m = 8 (verification width).
    let dtype = DType::F32;
    let (k, n, m) = (576, 1536, 8);
    let (x, w, wu, g) = (
        up(client, &[m, k], dtype, 3),
        up(client, &[n, k], dtype, 4),
        up(client, &[n, k], dtype, 5),
        up(client, &[k], dtype, 6),
    );
    let out = DeviceTensor::empty(client, &[m, n], dtype);
    let d = time(client, || {
        linear(
            client,
            &x,
            &w,
            Prologue::RmsNorm {
                weight: &g,
                eps: 1e-5,
            },
            Epilogue::SwiGlu { up: &wu },
            &out,
        )
        .expect("linear")
    });
    println!(
        "| f32 | 576→1536 | rms prologue + SwiGLU (2 weights) | 8 | {:.3} ms | {:.2} | {:.2} | |\n",
        d.as_secs_f64() * 1e3,
        gbs(2 * n * k * 4, d),
        4.0 * (m * n * k) as f64 / d.as_secs_f64() / 1e9
    );
}

/// Time of each columns-per-unit variant of the lane layout at the
/// target's shapes and verification widths (f32): the measurements the
/// lowering's choice (`DeviceProfile::linear_layout`) is checked against.
fn unit_columns_table(client: &ComputeClient<R>, quick: bool) {
    println!("\n## lane layout: time (ms) by columns per unit (f32)");
    print!("| in→out | epilogue | m |");
    for c in UNIT_COLUMNS {
        print!(" {c} |");
    }
    println!();
    println!("|---|---|---|{}", "---|".repeat(UNIT_COLUMNS.len()));
    let shapes: &[(usize, usize, bool)] = if quick {
        &[(576, 576, false)]
    } else {
        &[
            (576, 192, false),
            (576, 576, false),
            (576, 1536, true),
            (1536, 576, false),
            (576, 49152, false),
        ]
    };
    let dtype = DType::F32;
    for &(k, n, swiglu) in shapes {
        let w = up(client, &[n, k], dtype, 1);
        let wu = up(client, &[n, k], dtype, 5);
        for m in [1usize, 2, 4, 8] {
            let x = up(client, &[m, k], dtype, 2);
            let out = DeviceTensor::empty(client, &[m, n], dtype);
            print!(
                "| {k}→{n} | {} | {m} |",
                if swiglu { "swiglu" } else { "none" }
            );
            for c in UNIT_COLUMNS {
                let d = time(client, || {
                    let epi = if swiglu {
                        Epilogue::SwiGlu { up: &wu }
                    } else {
                        Epilogue::None
                    };
                    linear_lanes(client, &x, &w, Prologue::None, epi, &out, c).expect("linear")
                });
                print!(" {:.3} |", d.as_secs_f64() * 1e3);
            }
            println!();
        }
    }
    println!();
}

/// cubek 0.2 matmul on `x [1, m, k] · Wᵀ` with W `[n, k]` viewed as
/// `[1, k, n]` through strides (no transpose copy); checked against `linear`.
#[cfg(feature = "cubek-compare")]
fn cubek_linear(client: &ComputeClient<R>, k: usize, n: usize, m: usize) {
    use cubecl::prelude::TensorBinding;
    use cubek::matmul::{definition::MatmulElems, launch::Strategy};
    use cubek::std::InputBinding;
    let dtype = DType::F32;
    let (x, w) = (up(client, &[m, k], dtype, 2), up(client, &[n, k], dtype, 1));
    let ours = DeviceTensor::empty(client, &[m, n], dtype);
    linear(client, &x, &w, Prologue::None, Epilogue::None, &ours).expect("linear");
    let want = ours.download_f32(client).expect("download");
    let f32_ty = f32::as_type_native_unchecked().storage_type();
    for (name, strategy) in [
        ("Auto", Strategy::Auto),
        ("SimpleUnit", Strategy::SimpleUnit(Default::default())),
    ] {
        // SAFETY: shapes and strides describe the tensors' own allocations.
        let (lhs, rhs, out) = unsafe {
            (
                TensorBinding::<R>::from_raw_parts(
                    x.handle.clone(),
                    [m * k, k, 1].into(),
                    [1, m, k].into(),
                ),
                TensorBinding::<R>::from_raw_parts(
                    w.handle.clone(),
                    [n * k, 1, k].into(),
                    [1, k, n].into(),
                ),
                TensorBinding::<R>::from_raw_parts(
                    ours.handle.clone(),
                    [m * n, n, 1].into(),
                    [1, m, n].into(),
                ),
            )
        };
        let run = || {
            let mut dtypes = MatmulElems::from_single_dtype(f32::as_type_native_unchecked());
            cubek::matmul::launch::launch_ref(
                &strategy,
                client,
                InputBinding::Normal(lhs.clone(), f32_ty),
                InputBinding::Normal(rhs.clone(), f32_ty),
                out.clone(),
                &mut dtypes,
            )
        };
        if let Err(e) = run() {
            println!("| f32 | {k}→{n} | cubek {name} | {m} | unavailable: {e:?} | | | |");
            continue;
        }
        let d = time(client, || run().expect("cubek matmul"));
        let got = ours.download_f32(client).expect("download");
        let err = got
            .iter()
            .zip(&want)
            .fold(0f32, |a, (g, w)| a.max((g - w).abs()));
        println!(
            "| f32 | {k}→{n} | cubek {name} (max |Δ| vs linear {err:.1e}) | {m} | {:.3} ms | {:.2} | {:.2} | |",
            d.as_secs_f64() * 1e3,
            gbs(n * k * 4, d),
            2.0 * (m * n * k) as f64 / d.as_secs_f64() / 1e9
        );
    }
}

fn other_ops(client: &ComputeClient<R>, quick: bool) {
    println!("## other ops (GB/s = bytes read + written once / time)");
    println!("| op | shape | dtype | time | GB/s |\n|---|---|---|---|---|");
    let row = |name: &str, shape: String, dtype: DType, bytes: usize, d: Duration| {
        println!(
            "| {name} | {shape} | {dtype} | {:.3} ms | {:.2} |",
            d.as_secs_f64() * 1e3,
            gbs(bytes, d)
        );
    };
    let ts: &[usize] = if quick { &[64] } else { &[64, 4096] };
    for dtype in [DType::F32, DType::F16] {
        let e = dtype.size();
        for &t in ts {
            let x = up(client, &[t, 576], dtype, 1);
            let w = up(client, &[576], dtype, 2);
            let out = DeviceTensor::empty(client, &[t, 576], dtype);
            let d = time(client, || {
                rms_norm::rms_norm(client, &x, &w, 1e-5, &out).expect("rms")
            });
            row("rms_norm", format!("[{t}, 576]"), dtype, 2 * t * 576 * e, d);
            let xg = up(client, &[t, 4, 576], dtype, 3);
            let wg = up(client, &[4, 576], dtype, 4);
            let og = DeviceTensor::empty(client, &[t, 4 * 576], dtype);
            let d = time(client, || {
                group_rms_norm::group_rms_norm(client, &xg, &wg, 1e-5, &og).expect("grms")
            });
            row(
                "group_rms_norm",
                format!("[{t}, 4, 576]"),
                dtype,
                2 * t * 4 * 576 * e,
                d,
            );
            let a = up(client, &[t, 1536], dtype, 5);
            let b = up(client, &[t, 1536], dtype, 6);
            let o = DeviceTensor::empty(client, &[t, 1536], dtype);
            let d = time(client, || {
                binary(client, &a, &b, BinaryOp::SwiGlu, &o).expect("swiglu")
            });
            row("swiglu", format!("[{t}, 1536]"), dtype, 3 * t * 1536 * e, d);
            let d = time(client, || {
                binary(client, &a, &b, BinaryOp::Add, &o).expect("add")
            });
            row("add", format!("[{t}, 1536]"), dtype, 3 * t * 1536 * e, d);
            let q = up(client, &[t, 9, 64], dtype, 7);
            let pos = DeviceTensor::upload_u32(client, &(0..t as u32).collect::<Vec<_>>(), &[t])
                .expect("pos");
            let d = time(client, || {
                rope::rope(client, &q, &pos, 1e5, &q).expect("rope")
            });
            row("rope", format!("[{t}, 9, 64]"), dtype, 2 * t * 576 * e, d);
            let table = up(client, &[49152, 576], dtype, 8);
            let ids =
                DeviceTensor::upload_u32(client, &random_u32(9, t, 49152), &[t]).expect("ids");
            let o = DeviceTensor::empty(client, &[t, 576], dtype);
            let d = time(client, || {
                embedding::embedding(client, &table, &ids, &o).expect("emb")
            });
            row(
                "embedding (incl. id check)",
                format!("{t} ids of [49152, 576]"),
                dtype,
                2 * t * 576 * e,
                d,
            );
            let xs = up(client, &[4, t, 576], dtype, 10);
            let lw = up(client, &[4], dtype, 11);
            let o = DeviceTensor::empty(client, &[t, 576], dtype);
            let d = time(client, || {
                layer_sum::layer_sum(client, &xs, &lw, &o).expect("ls")
            });
            row(
                "layer_sum (L=4)",
                format!("[4, {t}, 576]"),
                dtype,
                5 * t * 576 * e,
                d,
            );
        }
        let bs: &[usize] = if quick { &[1] } else { &[1, 64] };
        for &b in bs {
            let logits = up(client, &[b, 49152], dtype, 12);
            let o = DeviceTensor::empty(client, &[b, 49152], dtype);
            let d = time(client, || {
                softmax::softmax(client, &logits, 0.8, &o).expect("softmax")
            });
            row(
                "softmax",
                format!("[{b}, 49152]"),
                dtype,
                2 * b * 49152 * e,
                d,
            );
            let ids = DeviceTensor::empty(client, &[b], DType::U32);
            let d = time(client, || {
                argmax_topk::argmax(client, &logits, &ids).expect("argmax")
            });
            row("argmax", format!("[{b}, 49152]"), dtype, b * 49152 * e, d);
            let (v, i) = (
                DeviceTensor::empty(client, &[b, 8], dtype),
                DeviceTensor::empty(client, &[b, 8], DType::U32),
            );
            let d = time(client, || {
                argmax_topk::topk(client, &logits, 8, &v, &i).expect("topk")
            });
            row("top-8", format!("[{b}, 49152]"), dtype, b * 49152 * e, d);
            for (label, top_k, top_p) in [
                ("sample (full vocab)", 0, 1.0),
                ("sample (top-k 40, top-p 0.9)", 40, 0.9),
            ] {
                let p = SamplingParams {
                    temperature: 0.8,
                    top_k,
                    top_p,
                    seed: 1,
                    step: 0,
                };
                let d = time(client, || sample(client, &logits, p, &ids).expect("sample"));
                row(label, format!("[{b}, 49152]"), dtype, b * 49152 * e, d);
            }
        }
    }
    println!();
}

fn main() {
    // `cargo bench` passes `--bench`; ignore arguments.
    let quick = std::env::var_os("DRAFTC_BENCH_QUICK").is_some();
    let client = wgpu_client();
    native_bandwidth(&client);
    println!(
        "device: {:?}\n",
        client
            .properties()
            .hardware
            .num_cpu_cores
            .map(|c| format!("{c} CPU cores"))
            .unwrap_or_else(|| "GPU".into())
    );
    let only = std::env::var("DRAFTC_BENCH_ONLY").unwrap_or_default();
    if only.is_empty() || only == "linear" {
        skinny_gemm(&client, quick);
    }
    if only.is_empty() || only == "other" {
        other_ops(&client, quick);
    }
}
