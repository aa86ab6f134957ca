//! draftc patch (third_party/README.md): what a recorded launch keeps so it
//! can be reissued. A server's kernel type is consumed by a launch; a
//! [`ShareKernel`] turns it into a shared form that makes as many launches
//! of the same kernel as needed. The recording itself is in
//! `ComputeClient::start_recording` / `finish_recording` / `replay`.

use crate::{
    compiler::{CompilationError, Compiler, CubeTask},
    id::KernelId,
    kernel::{CompiledKernel, KernelMetadata},
    server::ExecutionMode,
};
use alloc::{boxed::Box, sync::Arc};
use cubecl_ir::StorageType;

/// A server kernel that can be shared between launches.
pub trait ShareKernel: Sized + Send + 'static {
    /// The shared form, kept by a recording.
    type Shared: Clone + Send + Sync + 'static;
    /// This kernel in its shared form.
    fn share(self) -> Self::Shared;
    /// A kernel to launch from the shared form.
    fn from_shared(shared: &Self::Shared) -> Self;
}

impl<C: Compiler> ShareKernel for Box<dyn CubeTask<C>> {
    type Shared = Arc<dyn CubeTask<C>>;

    fn share(self) -> Self::Shared {
        Arc::from(self)
    }

    fn from_shared(shared: &Self::Shared) -> Self {
        Box::new(SharedTask(shared.clone()))
    }
}

/// A shared kernel launched again: forwards everything to the kernel.
struct SharedTask<C: Compiler>(Arc<dyn CubeTask<C>>);

impl<C: Compiler> KernelMetadata for SharedTask<C> {
    fn name(&self) -> &'static str {
        self.0.name()
    }

    fn id(&self) -> KernelId {
        self.0.id()
    }

    fn address_type(&self) -> StorageType {
        self.0.address_type()
    }
}

impl<C: Compiler> CubeTask<C> for SharedTask<C> {
    fn compile(
        &self,
        compiler: &mut C,
        compilation_options: &C::CompilationOptions,
        mode: ExecutionMode,
        address_type: StorageType,
    ) -> Result<CompiledKernel<C>, CompilationError> {
        self.0
            .compile(compiler, compilation_options, mode, address_type)
    }
}
