//! draftc patch (draftc's third_party/README.md): CUDA stream capture on the
//! server's streams. Not part of the cubecl-cuda 0.10.0 release.
//!
//! A capture records the kernels launched on one stream into a CUDA graph;
//! launching the instantiated graph replays them with the same grids, the
//! same kernel parameters (copied into the graph at capture) and the same
//! device addresses. Everything that is not replay-safe on the stream under
//! capture is refused with an error that also fails the capture: uploads
//! of per-launch metadata, allocations, host<->device copies, flushes and
//! syncs, first-use kernel compilation, dynamic cube counts and buffers of
//! other streams. [`CudaServer::end_capture`] additionally accepts only
//! graphs made of kernel nodes.

use super::CudaServer;
use cubecl_common::{backtrace::BackTrace, stream_id::StreamId};
use cubecl_core::server::{CubeCount, KernelArguments, ServerError, StreamErrorMode};
use cubecl_runtime::{id::KernelId, server::ComputeServer};
use cudarc::driver::sys::{
    CUcontext, CUgraph, CUgraphExec, CUgraphNodeType, CUstream, CUstreamCaptureMode,
    cuCtxPopCurrent_v2, cuCtxPushCurrent_v2, cuGraphDestroy, cuGraphExecDestroy, cuGraphGetNodes,
    cuGraphInstantiateWithFlags, cuGraphLaunch, cuGraphNodeGetType, cuStreamBeginCapture_v2,
    cuStreamEndCapture,
};
use std::ptr::null_mut;

/// draftc patch: the stream a capture is open on (one at a time per server).
#[derive(Debug)]
pub(super) struct Capture {
    stream_id: StreamId,
    sys: CUstream,
    /// The first request refused under this capture, if any.
    refused: Option<String>,
}

/// draftc patch: a captured, instantiated CUDA graph (the graph and its
/// executable; both destroyed on drop).
///
/// Launching it replays the captured kernels on the given stream. Their
/// buffers are bound by device address: every buffer the captured launches
/// used must stay allocated (its handle alive) for as long as the graph is
/// launched, and is read and written in place at every launch.
#[derive(Debug)]
pub struct CudaGraphExec {
    graph: CUgraph,
    exec: CUgraphExec,
    context: CUcontext,
    kernels: usize,
}

// SAFETY: the graph and its executable are plain driver handles, used only
// by `CudaServer::launch_graph` (which runs on the server, one call at a
// time) and destroyed once, on drop; the driver does not tie them to the
// thread that made them.
unsafe impl Send for CudaGraphExec {}
// SAFETY: `&CudaGraphExec` gives no access to the handles but through
// `CudaServer::launch_graph`, serialized by the server.
unsafe impl Sync for CudaGraphExec {}

impl CudaGraphExec {
    /// draftc patch: how many kernel launches the graph replays.
    pub fn kernels(&self) -> usize {
        self.kernels
    }
}

impl Drop for CudaGraphExec {
    fn drop(&mut self) {
        // SAFETY: both handles were made by `end_capture` and are destroyed
        // only here. The context is pushed so the calls work from any
        // thread, and popped again; an executable still running is freed by
        // the driver when it completes. Errors are ignored (nothing to do
        // about them in a drop).
        unsafe {
            let pushed = cuCtxPushCurrent_v2(self.context).result().is_ok();
            let _ = cuGraphExecDestroy(self.exec);
            let _ = cuGraphDestroy(self.graph);
            if pushed {
                let mut previous = null_mut();
                let _ = cuCtxPopCurrent_v2(&mut previous);
            }
        }
    }
}

/// A graph not instantiated yet, destroyed if dropped.
struct OwnedGraph(CUgraph);

impl Drop for OwnedGraph {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: a graph from `cuStreamEndCapture`, destroyed once.
            unsafe {
                let _ = cuGraphDestroy(self.0);
            }
        }
    }
}

fn capture_error(reason: String) -> ServerError {
    ServerError::Generic {
        reason,
        backtrace: BackTrace::capture(),
    }
}

fn describe(err: &ServerError) -> String {
    match err {
        ServerError::Generic { reason, .. } => reason.clone(),
        other => format!("{other}"),
    }
}

impl CudaServer {
    /// draftc patch: starts capturing the work submitted on the stream of
    /// `stream_id` into a CUDA graph, instead of running it.
    ///
    /// Flushes the stream first (as [`ComputeServer::flush`]: fails if the
    /// stream holds errors; frees pending deallocations and rotates the
    /// staged host memory), so neither happens inside the capture. The
    /// capture mode is relaxed: every stream of this device is driven from
    /// this server's one thread, and the stricter modes would make the
    /// driver refuse other streams' ordinary work on it during the capture
    /// (pinned host or synchronous allocations); what the capture stream
    /// itself may do is policed by this patch's hooks and by `end_capture`
    /// accepting kernel nodes only. One capture at a time per server; end
    /// it with [`Self::end_capture`].
    pub fn begin_capture(&mut self, stream_id: StreamId) -> Result<(), ServerError> {
        if let Some(open) = &self.capture {
            return Err(capture_error(format!(
                "a CUDA graph capture is already open on stream {}",
                open.stream_id
            )));
        }
        self.flush(stream_id)?;
        let sys = self.stream_sys(stream_id)?;
        // SAFETY: `sys` is a live stream of this server, its context current.
        unsafe {
            cuStreamBeginCapture_v2(sys, CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)
        }
        .result()
        .map_err(|err| capture_error(format!("cuStreamBeginCapture failed: {err:?}")))?;
        self.capture = Some(Capture {
            stream_id,
            sys,
            refused: None,
        });
        Ok(())
    }

    /// draftc patch: ends the capture opened by [`Self::begin_capture`] on
    /// `stream_id` and instantiates the graph.
    ///
    /// Fails, discarding the graph, if anything submitted during the
    /// capture was refused or failed (the errors are taken off the stream
    /// and named), if the driver invalidated the capture, if the graph holds
    /// anything but kernel nodes, or if instantiation fails. The capture is
    /// ended in every case, so the stream is usable afterwards.
    pub fn end_capture(&mut self, stream_id: StreamId) -> Result<CudaGraphExec, ServerError> {
        let capture = match self.capture.take() {
            Some(capture) if capture.stream_id == stream_id => capture,
            other => {
                self.capture = other;
                return Err(capture_error(format!(
                    "no CUDA graph capture is open on stream {stream_id}"
                )));
            }
        };
        self.unsafe_set_current();
        let mut graph = null_mut();
        // SAFETY: the stream is capturing (begun by `begin_capture`).
        let ended = unsafe { cuStreamEndCapture(capture.sys, &mut graph) }.result();
        let graph = OwnedGraph(graph);

        let errors = self.flush_errors(stream_id);
        if !errors.is_empty() {
            let reasons: Vec<String> = errors.iter().map(describe).collect();
            return Err(capture_error(format!(
                "CUDA graph capture failed: {}",
                reasons.join("; ")
            )));
        }
        ended.map_err(|err| {
            capture_error(format!(
                "CUDA graph capture failed: cuStreamEndCapture: {err:?} (an unsafe call was made during the capture)"
            ))
        })?;

        let kernels = kernel_nodes(graph.0)?;

        let mut exec = null_mut();
        // SAFETY: `graph.0` is a complete graph from `cuStreamEndCapture`.
        unsafe { cuGraphInstantiateWithFlags(&mut exec, graph.0, 0) }
            .result()
            .map_err(|err| capture_error(format!("cuGraphInstantiate failed: {err:?}")))?;
        let graph = core::mem::ManuallyDrop::new(graph);
        Ok(CudaGraphExec {
            graph: graph.0,
            exec,
            context: self.ctx.context,
            kernels,
        })
    }

    /// draftc patch: launches `graph` on the stream of `stream_id`, in order
    /// with the work submitted there before and after. Fails if the stream
    /// holds errors, a capture is open, or the graph was captured on
    /// another device.
    pub fn launch_graph(
        &mut self,
        graph: &CudaGraphExec,
        stream_id: StreamId,
    ) -> Result<(), ServerError> {
        if let Some(open) = &self.capture {
            return Err(capture_error(format!(
                "a CUDA graph can't be launched while a capture is open (stream {})",
                open.stream_id
            )));
        }
        if graph.context != self.ctx.context {
            return Err(capture_error(
                "the CUDA graph was captured on another device".into(),
            ));
        }
        let sys = self.stream_sys(stream_id)?;
        // SAFETY: a live executable of this context, on a live stream of it.
        unsafe { cuGraphLaunch(graph.exec, sys) }
            .result()
            .map_err(|err| capture_error(format!("cuGraphLaunch failed: {err:?}")))
    }

    /// The CUDA stream of `stream_id` (its context made current); fails if
    /// the stream holds errors.
    fn stream_sys(&mut self, stream_id: StreamId) -> Result<CUstream, ServerError> {
        let mut command = self.command_no_inputs(
            stream_id,
            StreamErrorMode {
                ignore: false,
                flush: false,
            },
        )?;
        Ok(command.streams.current().sys)
    }

    /// Whether `stream_id` maps onto the CUDA stream under capture.
    fn under_capture(&mut self, stream_id: StreamId) -> bool {
        let Some(capture) = &self.capture else {
            return false;
        };
        let capturing = capture.sys;
        match self.streams.resolve(stream_id, [].into_iter(), false) {
            Ok(mut streams) => streams.current().sys == capturing,
            Err(_) => false,
        }
    }

    /// draftc patch hook: `what` (a flush, read, write, sync, allocation)
    /// can't run on the stream under capture. The error is returned and
    /// also left on the stream, so the capture fails even if the caller
    /// drops it.
    pub(super) fn refuse_under_capture(
        &mut self,
        stream_id: StreamId,
        what: &str,
    ) -> Result<(), ServerError> {
        if !self.under_capture(stream_id) {
            return Ok(());
        }
        let reason = format!("{what} can't be captured in a CUDA graph (only kernel launches can)");
        if let Some(capture) = &mut self.capture {
            capture.refused.get_or_insert_with(|| reason.clone());
        }
        let err = capture_error(reason);
        if let Ok(mut streams) = self.streams.resolve(stream_id, [].into_iter(), false) {
            streams.current().errors.push(err.clone());
        }
        Err(err)
    }

    /// draftc patch hook: fails if a launch on the stream under capture
    /// would not replay as captured (the returned error fails the capture),
    /// or once a request was refused under this capture: a refused
    /// allocation leaves its handle without memory, which cubecl's stream
    /// resolution would not survive.
    pub(super) fn check_capturable_launch(
        &mut self,
        stream_id: StreamId,
        name: &str,
        kernel_id: &KernelId,
        count: &CubeCount,
        bindings: &KernelArguments,
        grid_constants: bool,
    ) -> Result<(), ServerError> {
        if !self.under_capture(stream_id) {
            return Ok(());
        }
        let refused = self.capture.as_ref().and_then(|c| c.refused.clone());
        if let Some(refused) = refused {
            return Err(capture_error(format!(
                "the launch of {name} was not captured: the capture already failed ({refused})"
            )));
        }
        let info = &bindings.info;
        let uploads_info = if grid_constants {
            info.dynamic_metadata_offset < info.data.len()
        } else {
            !info.data.is_empty()
        };
        let reason = if !self.ctx.module_names.contains_key(kernel_id) {
            "its kernel is not compiled yet (compiling loads a module); launch it once before capturing"
        } else if matches!(count, CubeCount::Dynamic(_)) {
            "its cube count is read back from a device buffer"
        } else if uploads_info {
            "its metadata (tensor shapes and strides; all of it without grid constants) is uploaded at each launch from reused pinned host memory into a pooled device buffer"
        } else if bindings
            .buffers
            .iter()
            .chain(bindings.tensor_maps.iter().map(|map| &map.binding))
            .any(|binding| binding.stream != stream_id)
        {
            "it binds a buffer of another stream (ordered by a cross-stream event)"
        } else {
            return Ok(());
        };
        Err(capture_error(format!(
            "the launch of {name} can't be captured in a CUDA graph: {reason}"
        )))
    }
}

/// The number of kernel nodes of `graph`; fails if it has other nodes
/// (copies, memsets, allocations, frees, events, host calls), which would
/// not replay as the eager work did.
fn kernel_nodes(graph: CUgraph) -> Result<usize, ServerError> {
    let mut count = 0usize;
    // SAFETY: `graph` is a live graph; the first call only counts.
    unsafe { cuGraphGetNodes(graph, null_mut(), &mut count) }
        .result()
        .map_err(|err| capture_error(format!("cuGraphGetNodes failed: {err:?}")))?;
    let mut nodes = vec![null_mut(); count];
    // SAFETY: `nodes` holds `count` slots.
    unsafe { cuGraphGetNodes(graph, nodes.as_mut_ptr(), &mut count) }
        .result()
        .map_err(|err| capture_error(format!("cuGraphGetNodes failed: {err:?}")))?;
    nodes.truncate(count);
    let mut others = Vec::new();
    for node in nodes {
        let mut ty = CUgraphNodeType::CU_GRAPH_NODE_TYPE_EMPTY;
        // SAFETY: `node` is a node of `graph`.
        unsafe { cuGraphNodeGetType(node, &mut ty) }
            .result()
            .map_err(|err| capture_error(format!("cuGraphNodeGetType failed: {err:?}")))?;
        if ty != CUgraphNodeType::CU_GRAPH_NODE_TYPE_KERNEL {
            others.push(format!("{ty:?}"));
        }
    }
    if !others.is_empty() {
        return Err(capture_error(format!(
            "CUDA graph capture failed: the graph holds {} node(s) other than kernels ({}), which would not replay as captured",
            others.len(),
            others.join(", ")
        )));
    }
    Ok(count)
}
