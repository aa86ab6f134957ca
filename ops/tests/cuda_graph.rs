//! CUDA graphs (`draftc_ops::cuda_graph`): a captured rms_norm → linear →
//! silu replays bit for bit like the same launches run eagerly, for inputs
//! written in place between replays; a capture whose closure allocates
//! fails with the reason and leaves the stream usable. CUDA only (built
//! with `--features cuda-tests`, run from `cuda_all.rs`).
#![cfg(feature = "cuda-tests")]

use cubecl::bytes::Bytes;
use cubecl::cuda::CudaRuntime;
use cubecl::prelude::*;
use draftc_ops::counters::snapshot;
use draftc_ops::cuda_graph::{capture, GraphError};
use draftc_ops::elementwise::silu;
use draftc_ops::launch::flush;
use draftc_ops::linear::{linear, reference as lref, Epilogue, Prologue};
use draftc_ops::rms_norm::rms_norm;
use draftc_ops::tensor::padded_bytes;
use draftc_ops::testing::{assert_close, random_f32, test_client};
use draftc_ops::{DType, DeviceTensor, Result};

const M: usize = 3;
const K: usize = 64;
const N: usize = 40;
const EPS: f32 = 1e-5;

/// The buffers of the captured sequence: input `x`, weights, and the three
/// outputs (`xn = rms_norm(x)`, `h = xn·Wᵀ`, `s = silu(h)`).
struct Step {
    x: DeviceTensor<CudaRuntime>,
    g: DeviceTensor<CudaRuntime>,
    w: DeviceTensor<CudaRuntime>,
    xn: DeviceTensor<CudaRuntime>,
    h: DeviceTensor<CudaRuntime>,
    s: DeviceTensor<CudaRuntime>,
    g_host: Vec<f32>,
    w_host: Vec<f32>,
}

impl Step {
    fn new(client: &ComputeClient<CudaRuntime>) -> Step {
        let g_host = random_f32(11, K, 0.5, 1.5, DType::F32);
        let w_host = random_f32(12, N * K, -0.3, 0.3, DType::F32);
        let up = |data: &[f32], shape: &[usize]| {
            DeviceTensor::upload_f32(client, data, shape, DType::F32).unwrap()
        };
        let zeros = |shape: &[usize]| DeviceTensor::zeros(client, shape, DType::F32);
        Step {
            x: zeros(&[M, K]),
            g: up(&g_host, &[K]),
            w: up(&w_host, &[N, K]),
            xn: zeros(&[M, K]),
            h: zeros(&[M, N]),
            s: zeros(&[M, N]),
            g_host,
            w_host,
        }
    }

    /// The captured sequence (three launch functions, three kernels).
    fn run(&self, client: &ComputeClient<CudaRuntime>) -> Result<()> {
        rms_norm(client, &self.x, &self.g, EPS, &self.xn)?;
        linear(
            client,
            &self.xn,
            &self.w,
            Prologue::None,
            Epilogue::None,
            &self.h,
        )?;
        silu(client, &self.h, &self.s)
    }
}

/// Writes `data` in place into `t`'s buffer (same device address).
fn write(client: &ComputeClient<CudaRuntime>, t: &DeviceTensor<CudaRuntime>, data: &[f32]) {
    let mut bytes = bytemuck::cast_slice::<f32, u8>(data).to_vec();
    bytes.resize(padded_bytes(data.len(), DType::F32), 0);
    client.write(t.handle.clone(), Bytes::from_bytes_vec(bytes));
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn a_replayed_graph_matches_eager_launches_bit_for_bit() {
    let client = test_client();
    let step = Step::new(&client);
    // Warm-up: compiles the three kernels (a capture refuses a first use).
    write(
        &client,
        &step.x,
        &random_f32(1, M * K, -2.0, 2.0, DType::F32),
    );
    step.run(&client).unwrap();
    flush(&client, "warm-up").unwrap();

    let graph = capture(&client, || step.run(&client)).unwrap();
    assert_eq!(graph.kernels(), 3, "one kernel node per launch");
    assert_eq!(graph.captured_launches(), 3);

    for seed in [21u64, 22, 23] {
        let x = random_f32(seed, M * K, -2.0, 2.0, DType::F32);

        // Eager, into the same buffers.
        write(&client, &step.x, &x);
        step.run(&client).unwrap();
        let eager = step.s.download_f32(&client).unwrap();
        let reference: Vec<f32> = {
            let normed = draftc_ops::rms_norm::reference::rms_norm(&x, &step.g_host, EPS);
            lref::linear(
                &normed,
                &step.w_host,
                K,
                lref::Prologue::None,
                lref::Epilogue::None,
            )
            .into_iter()
            .map(draftc_ops::elementwise::reference::silu)
            .collect()
        };
        assert_close("eager vs reference", &eager, &reference, DType::F32).unwrap();

        // Graph: outputs cleared first, so what is read back was written
        // by the replay.
        for t in [&step.xn, &step.h, &step.s] {
            write(&client, t, &vec![0.0; t.numel()]);
        }
        write(&client, &step.x, &x);
        let before = snapshot();
        graph.launch(&client).unwrap();
        let c = snapshot().since(&before);
        assert_eq!((c.launches, c.allocations, c.flushes), (1, 0, 0));
        let replayed = step.s.download_f32(&client).unwrap();
        assert_eq!(bits(&replayed), bits(&eager), "seed {seed}");
    }
}

#[test]
fn a_capture_that_allocates_fails_and_leaves_the_stream_usable() {
    let client = test_client();
    let step = Step::new(&client);
    let x = random_f32(31, M * K, -2.0, 2.0, DType::F32);
    write(&client, &step.x, &x);
    step.run(&client).unwrap();
    let eager = step.s.download_f32(&client).unwrap();

    let err = capture(&client, || {
        // A new buffer inside the capture: refused.
        let scratch = DeviceTensor::zeros(&client, &[M, N], DType::F32);
        silu(&client, &step.h, &scratch)
    })
    .unwrap_err();
    match &err {
        GraphError::NotCapturable(reason) => {
            assert!(reason.contains("allocated"), "{err}")
        }
        other => panic!("expected NotCapturable, got {other:?}"),
    }

    // The stream runs eager work again, with the same result.
    for t in [&step.xn, &step.h, &step.s] {
        write(&client, t, &vec![0.0; t.numel()]);
    }
    write(&client, &step.x, &x);
    step.run(&client).unwrap();
    assert_eq!(bits(&step.s.download_f32(&client).unwrap()), bits(&eager));
}
