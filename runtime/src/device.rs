//! Getting a compute client without panicking: wgpu (Vulkan, Metal, DX12;
//! Mesa's lavapipe on a machine without a GPU) and, with the `cuda`
//! feature, CUDA. A missing adapter becomes an error that says how to get one.
//! [`profile`] describes a client's device for the lowering
//! ([`DeviceProfile`]: which kernel layouts it gets).

use cubecl::features::Plane;
use cubecl::prelude::*;
use cubecl::wgpu::{WgpuDevice, WgpuRuntime};
use draftc_codegen::{DeviceClass, DeviceProfile};

/// How to get a device, printed with every "no device" error.
pub const NO_DEVICE_HELP: &str =
    "no GPU / Vulkan adapter was found. Install your GPU's Vulkan driver, \
or the CPU implementation Mesa lavapipe: `sudo apt-get install -y mesa-vulkan-drivers libvulkan1` \
(set XDG_RUNTIME_DIR to a writable directory to silence Mesa warnings)";

/// The compute backend `--backend` names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// CubeCL's wgpu runtime (Vulkan, Metal, DX12; lavapipe without a GPU).
    Wgpu,
    /// CubeCL's CUDA runtime (a build with the `cuda` feature).
    Cuda,
}

/// Why `--backend cuda` cannot run in a build without the `cuda` feature.
#[cfg(not(feature = "cuda"))]
const NO_CUDA_BUILD: &str = "this draftc was built without CUDA: rebuild with `--features cuda`";

/// Work that runs on whichever runtime `--backend` picked:
/// [`Backend::run`] opens that runtime's client and calls `on` with it.
pub trait OnClient {
    type Output;
    fn on<R: Runtime>(self, client: &ComputeClient<R>) -> Result<Self::Output, String>;
}

impl Backend {
    /// `wgpu` or `cuda`; anything else is an error naming the flag.
    pub fn parse(name: &str) -> Result<Backend, String> {
        match name {
            "wgpu" => Ok(Backend::Wgpu),
            "cuda" => Ok(Backend::Cuda),
            other => Err(format!("--backend must be wgpu or cuda, got `{other}`")),
        }
    }

    /// Opens this backend's client and runs `job` on it; an error when
    /// there is no device or (CUDA) the build lacks the `cuda` feature.
    pub fn run<J: OnClient>(self, job: J) -> Result<J::Output, String> {
        match self {
            Backend::Wgpu => job.on(&wgpu_client()?),
            #[cfg(feature = "cuda")]
            Backend::Cuda => job.on(&cuda_client()?),
            #[cfg(not(feature = "cuda"))]
            Backend::Cuda => Err(NO_CUDA_BUILD.into()),
        }
    }
}

/// The default wgpu device's client, or why there is none.
pub fn wgpu_client() -> Result<ComputeClient<WgpuRuntime>, String> {
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let got = std::panic::catch_unwind(|| WgpuRuntime::client(&WgpuDevice::DefaultDevice));
    std::panic::set_hook(hook);
    got.map_err(|e| {
        let why = e
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        format!("{NO_DEVICE_HELP} ({why})")
    })
}

/// The first CUDA device's client, or why there is none.
#[cfg(feature = "cuda")]
pub fn cuda_client() -> Result<ComputeClient<cubecl::cuda::CudaRuntime>, String> {
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let got = std::panic::catch_unwind(|| {
        cubecl::cuda::CudaRuntime::client(&cubecl::cuda::CudaDevice::new(0))
    });
    std::panic::set_hook(hook);
    got.map_err(|_| {
        "no CUDA device: install the NVIDIA driver and CUDA runtime, or use --backend wgpu".into()
    })
}

/// The profile of `client`'s device, from its properties. cubecl-wgpu
/// withholds plane operations on CPU adapters (lavapipe), so a wgpu device
/// without them is treated as an emulator: it gets the lane layouts, which
/// are also the right fallback for a GPU without subgroups.
pub fn profile<R: Runtime>(client: &ComputeClient<R>) -> DeviceProfile {
    let props = client.properties();
    let hw = &props.hardware;
    let name = R::name(client);
    let plane_ops = props.features.plane.contains(Plane::Ops);
    let class = if name.starts_with("wgpu") && !plane_ops {
        DeviceClass::Emulator
    } else {
        DeviceClass::Gpu
    };
    DeviceProfile {
        name: match class {
            DeviceClass::Emulator => "lavapipe".to_string(),
            DeviceClass::Gpu if name.starts_with("cuda") => "cuda".to_string(),
            DeviceClass::Gpu => "wgpu-gpu".to_string(),
        },
        class,
        plane_size: if hw.plane_size_min == hw.plane_size_max {
            hw.plane_size_max
        } else {
            0
        },
        plane_ops,
        cmma: !props.features.matmul.cmma.is_empty(),
        shared_memory: hw.max_shared_memory_size,
        max_vector: hw.max_vector_size.min(16),
        sms: hw.num_streaming_multiprocessors,
        threads: match class {
            DeviceClass::Emulator => lavapipe_threads(),
            DeviceClass::Gpu => 0,
        },
    }
}

/// Threads lavapipe runs cubes on: `LP_NUM_THREADS` when set, else one per
/// CPU (Mesa's default).
fn lavapipe_threads() -> u32 {
    std::env::var("LP_NUM_THREADS")
        .ok()
        .and_then(|v| v.trim().parse::<u32>().ok())
        .filter(|&t| t > 0)
        .unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map_or(1, |n| n.get().min(u32::MAX as usize) as u32)
        })
}

/// `client`'s profile as a GPU with usable planes: runs the GPU kernel
/// layouts on lavapipe (whose 8-lane planes work although cubecl does not
/// advertise them), for tests.
pub fn gpu_layout_profile<R: Runtime>(client: &ComputeClient<R>) -> DeviceProfile {
    let mut p = profile(client);
    p.class = DeviceClass::Gpu;
    p.plane_ops = true;
    p.name = format!("{} (GPU layouts)", p.name);
    p
}

/// When a pass submits its launches (issue 31; docs/gpu.md, "The launch path").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlushPolicy {
    /// Flush after every launch: lavapipe runs a submission on its own
    /// threads while the host encodes the next launch, which measured
    /// faster there than one flush a pass (7.2–7.4 against 5.2–6.1 tokens/s
    /// at batch 1 on a 2-core host). Also the debug setting that names the
    /// op behind a device error.
    PerLaunch,
    /// Queue every launch of a pass and flush once at its end: on
    /// cubecl-cuda 0.10 a flush is a blocking round trip to the runner
    /// thread, so per-launch flushing keeps host and GPU in lock-step.
    PerPass,
}

impl FlushPolicy {
    /// The environment variable that overrides the device's policy:
    /// `launch` or `pass`.
    pub const ENV: &'static str = "DRAFTC_FLUSH";

    /// The policy for `device`: its class's, unless `DRAFTC_FLUSH` says
    /// `launch` or `pass` (any other value is ignored with a warning).
    pub fn for_device(device: &DeviceProfile) -> FlushPolicy {
        static WARNED: std::sync::Once = std::sync::Once::new();
        let choices = [
            ("launch", FlushPolicy::PerLaunch),
            ("pass", FlushPolicy::PerPass),
        ];
        env_choice(Self::ENV, &choices, &WARNED).unwrap_or_else(|| Self::default_for(device))
    }

    /// The measured better policy of a device class.
    pub fn default_for(device: &DeviceProfile) -> FlushPolicy {
        match device.class {
            DeviceClass::Emulator => FlushPolicy::PerLaunch,
            DeviceClass::Gpu => FlushPolicy::PerPass,
        }
    }

    /// Under [`FlushPolicy::PerPass`], a guard that defers this thread's
    /// per-launch flushes while it lives (work that ends in a read needs no
    /// flush of its own: a read submits what is queued before it).
    pub fn defer(self) -> Option<draftc_ops::launch::DeferFlushes> {
        (self == FlushPolicy::PerPass).then(draftc_ops::launch::defer_flushes)
    }
}

/// Where a dynamic draft tree picks its frontiers (issue 31): on the device
/// (one read a round for the whole tree, but every frontier node expanded:
/// each level's rows must be known before its scores), or on the host (a
/// read of the candidates every level, and the exact cut that stops
/// expanding nodes that cannot make the tree). On lavapipe a read costs
/// little and a drafter pass much: Beagle's file tree (depth 5, top 8) at
/// budget 3 read 1.32x on the host and 0.91x on the device at batch 1. On an
/// H200 (docs/bench/cuda-h200/2026-11-27, one run of 8 and 16 questions)
/// the host's picks also won: 1.05x against 0.73x at batch 1, 0.52x against
/// 0.47x at batch 16, with 217 launches and 3.4 reads a round against 261
/// and 2; a second run (docs/bench/cuda-h200/2026-11-27b) measured 1.05x
/// against 0.79x and 0.53x against 0.44x.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TreePicks {
    Host,
    Device,
}

impl TreePicks {
    /// The environment variable that overrides the default: `host` or
    /// `device`.
    pub const ENV: &'static str = "DRAFTC_TREE_PICKS";

    /// The choice: on the host, for lavapipe and GPUs alike (the one GPU
    /// measurement, above, found the host's picks faster), unless `DRAFTC_TREE_PICKS` says `host` or `device` (any other value
    /// is ignored with a warning).
    pub fn chosen() -> TreePicks {
        static WARNED: std::sync::Once = std::sync::Once::new();
        let choices = [("host", TreePicks::Host), ("device", TreePicks::Device)];
        env_choice(Self::ENV, &choices, &WARNED).unwrap_or(TreePicks::Host)
    }
}

/// The choice environment variable `var` names among `choices`, or `None`
/// when it is unset; any other value is ignored, with one warning (`warned`)
/// that names the accepted values.
fn env_choice<T: Copy>(
    var: &str,
    choices: &[(&str, T)],
    warned: &'static std::sync::Once,
) -> Option<T> {
    let value = std::env::var(var).ok()?;
    let found = choices.iter().find(|(name, _)| *name == value).map(|c| c.1);
    if found.is_none() {
        warned.call_once(|| {
            let names: Vec<String> = choices.iter().map(|c| format!("`{}`", c.0)).collect();
            eprintln!(
                "warning: {var}={value:?} is none of {}; using the device's choice",
                names.join(", ")
            )
        });
    }
    found
}

/// The compute dtype `--dtype NAME` asks for on `client`: `f32`, `f16`, or
/// `auto` (f16 weights and activations with f32 accumulation on a GPU,
/// where decoding is bandwidth-bound; f32 on lavapipe, where the tuned
/// draft settings and the published numbers are f32: f16's gain there
/// depends on the CPU, none on an earlier host, 1.2x on the AVX-512 host
/// of docs/bench/lavapipe/heldout-b1-beagle-f16, where speculation then
/// gains less over it).
pub fn resolve_dtype<R: Runtime>(
    name: &str,
    client: &ComputeClient<R>,
) -> Result<draftc_codegen::PlanDType, String> {
    use draftc_codegen::PlanDType;
    if name == "auto" {
        return Ok(match profile(client).class {
            DeviceClass::Gpu => PlanDType::F16,
            DeviceClass::Emulator => PlanDType::F32,
        });
    }
    PlanDType::parse(name).ok_or_else(|| format!("--dtype must be auto, f32 or f16, got `{name}`"))
}

/// Checks a `--dtype` value before any device is opened.
pub fn check_dtype(name: &str) -> Result<(), String> {
    if name == "auto" || draftc_codegen::PlanDType::parse(name).is_some() {
        Ok(())
    } else {
        Err(format!("--dtype must be auto, f32 or f16, got `{name}`"))
    }
}

#[cfg(test)]
mod tests {
    use super::env_choice;

    /// Unset is no choice, a listed value its choice, any other value no
    /// choice (with a warning). A variable of its own: tests run in
    /// parallel in one process.
    #[test]
    fn env_choice_takes_only_listed_values() {
        const VAR: &str = "DRAFTC_TEST_ENV_CHOICE";
        static WARNED: std::sync::Once = std::sync::Once::new();
        let choices = [("a", 1), ("b", 2)];
        std::env::remove_var(VAR);
        assert_eq!(env_choice(VAR, &choices, &WARNED), None);
        std::env::set_var(VAR, "b");
        assert_eq!(env_choice(VAR, &choices, &WARNED), Some(2));
        std::env::set_var(VAR, "c");
        assert_eq!(env_choice(VAR, &choices, &WARNED), None);
        std::env::remove_var(VAR);
    }
}
