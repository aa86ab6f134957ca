//! Getting a compute client without panicking: wgpu (Vulkan, Metal, DX12;
//! Mesa's lavapipe on a machine without a GPU) and, with the `cuda`
//! feature, CUDA. A missing adapter becomes an error that says how to get one.

use cubecl::prelude::*;
use cubecl::wgpu::{WgpuDevice, WgpuRuntime};

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
