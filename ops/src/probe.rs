//! Streaming-read probe: the device's own memory roofline, measured with
//! the simplest kernel that reads every byte once. Benchmarks report kernel
//! bandwidth as a fraction of this (what the runtime can stream at all) next
//! to the host's native bandwidth.
//!
//! `stream_sum` splits a 1-D `x` into `units` contiguous chunks of
//! `Vector<F, N>`s and writes each chunk's sum (f32 accumulation) to
//! `out[unit]`; `units` must divide the vector count. Per-unit contiguous
//! chunks were the fastest read pattern on lavapipe (measured: 1.2 GB/s
//! contiguous vs 0.66 GB/s unit-strided on the 2-vCPU CI machine, where
//! llvmpipe's cost is per 32-bit element loaded, whatever the vector width).

use std::time::{Duration, Instant};

use cubecl::prelude::*;

use crate::block::vector_width;
use crate::error::{OpsError, Result};
use crate::launch::{cube_count, expect_dtype, expect_float, expect_nonempty, finish};
use crate::tensor::{DType, DeviceTensor};

/// Units per cube.
pub const BLOCK: usize = 64;

/// Unit `u` sums `per_unit` vectors of `x` into `out[u]`: its contiguous
/// chunk `[u·per_unit, (u+1)·per_unit)`, or with `strided` the vectors
/// `u, u + units, …`, so the units of a plane read adjacent 16-byte
/// vectors (coalesced, the GPU pattern; contiguous chunks give each lane
/// its own stream, and an H100 read them at 374 GB/s).
#[cube(launch_unchecked)]
pub fn stream_sum_kernel<F: Float + CubeElement, N: Size>(
    x: &Array<Vector<F, N>>,
    out: &mut Array<f32>,
    units: usize,
    per_unit: usize,
    #[comptime] strided: bool,
) {
    let u = CUBE_POS * comptime!(BLOCK) + UNIT_POS as usize;
    if u < units {
        let mut acc = Vector::<f32, N>::new(0.0);
        for i in 0..per_unit {
            let at = if comptime!(strided) {
                i * units + u
            } else {
                u * per_unit + i
            };
            acc += Vector::<f32, N>::cast_from(x[at]);
        }
        let mut s = 0f32;
        #[unroll]
        for i in 0..N::value() {
            s += acc[i];
        }
        out[u] = s;
    }
}

/// `(units, elements per unit)` of a probe launch: `x` float and not empty,
/// `out` f32 `[units]`, `units` dividing `x`'s length.
fn check_units<R: Runtime>(
    client: &ComputeClient<R>,
    op: &'static str,
    x: &DeviceTensor<R>,
    out: &DeviceTensor<R>,
) -> Result<(usize, usize)> {
    expect_float(client, op, "x", x)?;
    expect_nonempty(op, "x", x)?;
    expect_nonempty(op, "out", out)?;
    expect_dtype(op, "out", out, DType::F32)?;
    let (len, units) = (x.numel(), out.numel());
    if !len.is_multiple_of(units) {
        return Err(OpsError::InvalidArgument {
            op,
            reason: format!("{units} units do not divide {len} elements"),
        });
    }
    Ok((units, len / units))
}

/// `out[u] = Σ x[u·len/units .. (u+1)·len/units]` for `out` `[units]` (f32);
/// `units` must divide `x.numel()`.
pub fn stream_sum<R: Runtime>(
    client: &ComputeClient<R>,
    x: &DeviceTensor<R>,
    out: &DeviceTensor<R>,
) -> Result<()> {
    launch_stream_sum(client, "stream_sum", x, out, false).map(|_| ())
}

/// `out[u] = Σ_i x[i·units·w + u·w .. i·units·w + (u+1)·w]` for `out`
/// `[units]` (f32), `w` the vector width the launch takes (the largest of
/// 4, 2, 1 that divides `len / units`): unit `u` reads every `units`-th
/// vector, the coalesced pattern of GPUs. `units` must divide `x.numel()`.
/// Returns `w`.
pub fn stream_sum_strided<R: Runtime>(
    client: &ComputeClient<R>,
    x: &DeviceTensor<R>,
    out: &DeviceTensor<R>,
) -> Result<usize> {
    launch_stream_sum(client, "stream_sum_strided", x, out, true)
}

/// Either read pattern of [`stream_sum_kernel`]; returns the vector width.
fn launch_stream_sum<R: Runtime>(
    client: &ComputeClient<R>,
    op: &'static str,
    x: &DeviceTensor<R>,
    out: &DeviceTensor<R>,
    strided: bool,
) -> Result<usize> {
    let (units, per) = check_units(client, op, x, out)?;
    let n = vector_width(client, per);
    let count = cube_count(op, units.div_ceil(BLOCK))?;
    crate::dispatch_float!(x.dtype(), op, F => {
        // SAFETY: `units · per` = len (checked above) and `n` divides
        // `per`: unit u < units reads vectors u·per/n + i (contiguous) or
        // i·units + u (strided) for i < per/n, all < len/n, and writes
        // out[u] only.
        unsafe {
            stream_sum_kernel::launch_unchecked::<F, R>(
                client, count, CubeDim::new_1d(BLOCK as u32), n,
                x.array_arg(), out.array_arg(), units, per / n, strided,
            )
        }
    })?;
    finish(client, op)?;
    Ok(n)
}

/// Memory bandwidths measured on this machine, in bytes per second.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Roofline {
    /// Host: reading a 256 MiB f32 buffer on every core (best of 3).
    pub host_read: f64,
    /// Host: `copy_from_slice` of 256 MiB (bytes read + written).
    pub host_copy: f64,
    /// Device: [`device_read_bandwidth`] (best of several runs).
    pub device_read: f64,
}

/// Host memory bandwidth: a parallel sum (one thread per core, 8
/// independent accumulators so the adds vectorise) and a single-threaded
/// copy, each the best of 3 passes over 256 MiB.
pub fn host_bandwidth() -> (f64, f64) {
    let n = 64 << 20;
    let src: Vec<f32> = (0..n).map(|i| (i % 1024) as f32).collect();
    let mut dst = vec![0f32; n];
    let threads = std::thread::available_parallelism().map_or(1, |t| t.get());
    let (mut read, mut copy) = (Duration::MAX, Duration::MAX);
    let mut sink = 0f32;
    for _ in 0..3 {
        let t = Instant::now();
        let partial: Vec<f32> = std::thread::scope(|s| {
            let handles: Vec<_> = src
                .chunks(n.div_ceil(threads))
                .map(|chunk| {
                    s.spawn(move || {
                        let mut acc = [0f32; 8];
                        for c in chunk.chunks_exact(8) {
                            for k in 0..8 {
                                acc[k] += c[k];
                            }
                        }
                        acc.iter().sum::<f32>()
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or(0.0))
                .collect()
        });
        read = read.min(t.elapsed());
        sink += partial.iter().sum::<f32>();
        let t = Instant::now();
        dst.copy_from_slice(&src);
        copy = copy.min(t.elapsed());
    }
    std::hint::black_box((sink, &dst));
    let bytes = (4 * n) as f64;
    (bytes / read.as_secs_f64(), 2.0 * bytes / copy.as_secs_f64())
}

/// The device's streaming-read bandwidth, best of at least 5 timed runs
/// after a warm-up (JIT). Lavapipe (`gpu` false): [`stream_sum`] over
/// 64 MiB of f32 in 4096 contiguous chunks, one launch a run. A GPU:
/// [`stream_sum_strided`] over 120 MiB (over an H100's 50 MB L2, within
/// wgpu's 128 MiB binding limit) with 2^18 units, sixteen launches a run (one
/// read takes about 40 µs on an H100, not much more than the sync that ends
/// a run), so that neither the sync, the L2, nor too few threads in flight
/// is what gets measured.
pub fn device_read_bandwidth<R: Runtime>(client: &ComputeClient<R>, gpu: bool) -> Result<f64> {
    let (n, units, launches) = if gpu {
        (30 << 20, 1 << 18, 16)
    } else {
        (16 << 20, 4096, 1)
    };
    let x = DeviceTensor::<R>::zeros(client, &[n], DType::F32);
    let out = DeviceTensor::<R>::empty(client, &[units], DType::F32);
    let sync = || {
        cubecl::future::block_on(client.sync()).map_err(|e| OpsError::Device {
            op: "stream_sum",
            message: format!("{e:?}"),
        })
    };
    let run = || -> Result<()> {
        for _ in 0..launches {
            if gpu {
                stream_sum_strided(client, &x, &out)?;
            } else {
                stream_sum(client, &x, &out)?;
            }
        }
        sync()
    };
    run()?;
    let mut best = Duration::MAX;
    let start = Instant::now();
    let mut runs = 0;
    while runs < 5 || (runs < 20 && start.elapsed() < Duration::from_secs(2)) {
        let t = Instant::now();
        run()?;
        best = best.min(t.elapsed());
        runs += 1;
    }
    Ok((4 * n * launches) as f64 / best.as_secs_f64())
}

/// Host and device rooflines ([`host_bandwidth`], [`device_read_bandwidth`];
/// `gpu`: the device is a GPU, measured with its coalesced read pattern).
pub fn roofline<R: Runtime>(client: &ComputeClient<R>, gpu: bool) -> Result<Roofline> {
    let (host_read, host_copy) = host_bandwidth();
    Ok(Roofline {
        host_read,
        host_copy,
        device_read: device_read_bandwidth(client, gpu)?,
    })
}

/// Plain-Rust oracle.
pub mod reference {
    /// Sums of `units` equal contiguous chunks of `x`.
    pub fn stream_sum(x: &[f32], units: usize) -> Vec<f32> {
        x.chunks(x.len() / units).map(|c| c.iter().sum()).collect()
    }

    /// [`super::stream_sum_strided`] with vectors of `w`: unit `u` sums
    /// vectors `u, u + units, …` of `x`.
    pub fn stream_sum_strided(x: &[f32], units: usize, w: usize) -> Vec<f32> {
        let mut out = vec![0f32; units];
        for (v, chunk) in x.chunks(w).enumerate() {
            out[v % units] += chunk.iter().sum::<f32>();
        }
        out
    }
}
