//! CUDA graphs (issue 56 item 4): owns capturing a sequence of draftc-ops
//! launches on the calling thread's CUDA stream ([`capture`]) and replaying
//! it with one driver call ([`CudaGraph::launch`]). The driver side is the
//! cubecl-cuda patch (`CudaServer::begin_capture`/`end_capture`/
//! `launch_graph`, third_party/README.md).
//!
//! # What can be captured
//!
//! Only kernel launches whose kernel already ran once (compiled), whose
//! buffers exist, and whose arguments go to the kernel as parameters:
//! launch functions that take [`DeviceTensor::array_arg`] arguments and
//! scalars (`rms_norm`, `linear`, the element-wise ops, ...). A launch with
//! `tensor_arg` arguments uploads their shapes and strides at each launch
//! and is refused, as is anything in the closure that flushes, reads back,
//! uploads or allocates: the capture then fails with the reason, and the
//! stream stays usable.
//!
//! # What a graph binds
//!
//! A replay reads and writes the very buffers the captured launches bound,
//! at their device addresses, with the scalars they were given. New inputs
//! go into those buffers in place (`ComputeClient::write`) before a
//! launch; outputs are read from them after. The caller keeps every tensor
//! the closure used alive for as long as it launches the graph (a dropped
//! buffer goes back to a pool and would be written by the next replay).

use std::cell::Cell;

use cubecl::cuda::{CudaGraphExec, CudaRuntime};
use cubecl::prelude::*;

use crate::counters;
use crate::error::{OpsError, Result};
use crate::launch::defer_flushes;
#[cfg(doc)]
use crate::DeviceTensor;

/// Why a capture failed.
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
pub enum GraphError {
    /// The captured closure returned an error (a launch's validation, or a
    /// refused request reported by the op that made it).
    #[error("CUDA graph capture: the captured work failed: {0}")]
    Work(OpsError),
    /// The closure asked for something a graph can't replay (named; only
    /// kernel launches can be captured).
    #[error("CUDA graph capture: the captured work {0}; only kernel launches can be captured")]
    NotCapturable(String),
    /// The server or the driver refused the capture (the reason names the
    /// launch or request, e.g. a kernel not compiled yet).
    #[error("CUDA graph capture: {0}")]
    Device(String),
}

/// A captured sequence of launches, instantiated and ready to replay
/// (destroyed on drop). See the module docs for what it binds.
#[derive(Debug)]
pub struct CudaGraph {
    exec: CudaGraphExec,
    launches: u64,
}

impl CudaGraph {
    /// Replays the captured kernels on this thread's stream, in order with
    /// the work queued before and after it (writes of new inputs, reads of
    /// outputs). Counted as one launch. A round trip to the device's runner
    /// thread; the kernels run asynchronously.
    pub fn launch(&self, client: &ComputeClient<CudaRuntime>) -> Result<()> {
        const OP: &str = "cuda_graph_launch";
        counters::launch();
        client
            .on_server(|server, stream| server.launch_graph(&self.exec, stream))
            .map_err(|e| OpsError::device(OP, e))?
            .map_err(|e| OpsError::device(OP, e))
    }

    /// Kernels the graph runs per launch (a launch function may launch
    /// more than one).
    pub fn kernels(&self) -> usize {
        self.exec.kernels()
    }

    /// Launch functions ([`finish`](crate::launch::finish) calls) the
    /// closure made while captured.
    pub fn captured_launches(&self) -> u64 {
        self.launches
    }
}

thread_local! {
    static CAPTURING: Cell<bool> = const { Cell::new(false) };
}

/// Ends an open capture if `capture` unwinds or returns early, so the
/// stream never stays in capture mode.
struct OpenCapture<'a> {
    client: &'a ComputeClient<CudaRuntime>,
    open: bool,
}

impl OpenCapture<'_> {
    fn end(&mut self) -> std::result::Result<CudaGraphExec, GraphError> {
        self.open = false;
        CAPTURING.with(|c| c.set(false));
        self.client
            .on_server(|server, stream| server.end_capture(stream))
            .map_err(|e| GraphError::Device(describe(&e)))?
            .map_err(|e| GraphError::Device(describe(&e)))
    }
}

impl Drop for OpenCapture<'_> {
    fn drop(&mut self) {
        if self.open {
            let _ = self.end();
        }
    }
}

/// Runs `f` under CUDA stream capture on this thread's stream and returns
/// its launches as a graph; they do not run now.
///
/// Submits the work queued before (one flush, counted), begins the
/// capture, runs `f` with flushes deferred, ends the capture (in order
/// with `f`'s launches: every server request here is ordered with the
/// launches queued before it) and instantiates the graph. Fails, with the
/// reason, if `f` fails, if `f` flushed, read back, uploaded or allocated
/// (counted on this thread, [`counters`]), or if the server refused a
/// request made under capture; the stream is usable afterwards. Nested
/// captures are refused.
pub fn capture(
    client: &ComputeClient<CudaRuntime>,
    f: impl FnOnce() -> Result<()>,
) -> std::result::Result<CudaGraph, GraphError> {
    if CAPTURING.with(|c| c.replace(true)) {
        return Err(GraphError::NotCapturable(
            "began another capture (nested)".into(),
        ));
    }
    let begun = counters::flush(|| client.on_server(|server, stream| server.begin_capture(stream)));
    match begun {
        Ok(Ok(())) => {}
        Ok(Err(e)) | Err(e) => {
            CAPTURING.with(|c| c.set(false));
            return Err(GraphError::Device(describe(&e)));
        }
    }
    let mut open = OpenCapture { client, open: true };

    let before = counters::snapshot();
    let work = {
        let _defer = defer_flushes();
        f()
    };
    let did = counters::snapshot().since(&before);
    let ended = open.end();

    work.map_err(GraphError::Work)?;
    let mut asked = Vec::new();
    for (n, what) in [
        (did.flushes, "flushed"),
        (did.reads, "read back"),
        (did.uploads, "uploaded"),
        (did.allocations, "allocated a device buffer"),
    ] {
        if n > 0 {
            asked.push(format!("{what} ({n}x)"));
        }
    }
    if !asked.is_empty() {
        return Err(GraphError::NotCapturable(asked.join(", ")));
    }
    Ok(CudaGraph {
        exec: ended?,
        launches: did.launches,
    })
}

/// A server error's reason, without cubecl's backtrace.
fn describe(err: &cubecl::server::ServerError) -> String {
    match err {
        cubecl::server::ServerError::Generic { reason, .. } => reason.clone(),
        other => format!("{other:?}"),
    }
}
