//! Recorded passes (issue 56): a capture window that proves a pass is
//! replayable, and its replay.
//!
//! [`record`] runs a closure (a pass: launches, kept buffers, writes into
//! kept buffers) and notes what it did: the
//! launches in order (cubecl's client records them, a patch in
//! `third_party/cubecl-runtime`), the kept buffers it took and the kept
//! buffers it wrote. The recording fails with its reason when anything in
//! the window would not happen again on a replay: an allocation (other than
//! a kept buffer made on first use, which stays in the pool and is what a
//! replay binds), a read, a
//! flush (unless the window allows them: a wgpu replay flushes where the
//! eager pass did), or an upload into a new buffer.
//!
//! [`Recording::replay`] reissues the launches with their arguments as
//! recorded (no shape checks, argument building or kernel lookup in
//! draftc), after writing the new data of each recorded write into the
//! same buffer. A recording names its kept buffers without holding them
//! (other passes use them in between); a replay first checks that nothing
//! else holds them ([`ReplayError::Busy`] otherwise: run the pass eagerly),
//! then holds them while it is issued. Buffers that are not kept (weights,
//! caches, the caller's inputs) are the caller's to keep alive and
//! unchanged in place: `buffer_ids` lists every buffer a recording binds.

use std::cell::RefCell;
use std::collections::BTreeSet;

use cubecl::client::RecordedLaunch;
use cubecl::prelude::*;
use cubecl::server::Handle;

use crate::counters::{snapshot, Counts};
use crate::error::{OpsError, Result};
use crate::kept::{self, KeptRef};

/// Why a pass cannot be recorded for replay.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum NotReplayable {
    #[error("this thread is already recording a pass")]
    Nested,
    #[error("the pass {what} inside the capture window ({n}×); a replay would not do it again")]
    Forbidden { what: &'static str, n: u64 },
}

/// Why a recording could not be replayed now (nothing was issued).
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum ReplayError {
    #[error("a buffer of the recording is held elsewhere (run the pass eagerly)")]
    Busy,
    #[error("write {index} of the recording is {expected} bytes, given {found}")]
    WriteSize {
        index: usize,
        expected: usize,
        found: usize,
    },
    #[error("the recording writes {expected} buffers, given {found}")]
    Writes { expected: usize, found: usize },
}

/// A write noted while recording: the kept buffer, the bytes written and
/// how many launches came before it.
type Noted = (KeptRef, Vec<u8>, usize);

thread_local! {
    /// The kept buffers written (and their bytes) while this thread records.
    static WRITES: RefCell<Option<Vec<Noted>>> = const { RefCell::new(None) };
    /// Which of them is the step's upload ([`mark_step_write`]).
    static STEP_WRITE: std::cell::Cell<Option<usize>> = const { std::cell::Cell::new(None) };
}

/// Notes a write of `bytes` into kept buffer `r`, after `launches` of the
/// pass's launches, when this thread records.
pub(crate) fn note_write(r: KeptRef, bytes: &[u8], launches: usize) {
    WRITES.with(|w| {
        if let Some(w) = w.borrow_mut().as_mut() {
            w.push((r, bytes.to_vec(), launches));
        }
    });
}

/// Marks this thread's last write as the step's upload (the one a replay
/// builds anew from the step; `runtime/src/exec/replay.rs`), when it
/// records a pass.
pub fn mark_step_write() {
    WRITES.with(|w| {
        if let Some(w) = w.borrow().as_ref() {
            STEP_WRITE.with(|s| s.set(w.len().checked_sub(1)));
        }
    });
}

/// A recorded pass: its launches, the kept buffers it used and the kept
/// buffers it wrote (with their sizes), in order.
pub struct Recording<R: Runtime> {
    launches: Vec<RecordedLaunch<R>>,
    kept: Vec<KeptRef>,
    writes: Vec<(KeptRef, usize)>,
    /// The bytes each write wrote when recorded.
    write_data: Vec<Vec<u8>>,
    /// Which write was the step's upload ([`mark_step_write`]).
    step_write: Option<usize>,
    /// How many launches came before each write: a replay writes there
    /// too (a kept buffer that a launch used and let go of earlier in the
    /// pass may be the one a later upload took).
    write_at: Vec<usize>,
    /// The launches captured as a CUDA graph ([`Recording::capture_graph`]):
    /// a `cuda_graph::CudaGraph` where the runtime is CUDA.
    graph: Option<Box<dyn std::any::Any + Send>>,
    /// The kept buffers, held once [`Recording::pin`] set them aside.
    pins: Vec<Handle>,
}

/// Whether a capture window lets its pass flush.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flushes {
    /// The pass's flushes are deferred, and one inside is refused (a CUDA
    /// graph cannot hold one); the caller flushes after the window.
    Forbid,
    /// The pass flushes as it would eagerly (lavapipe's flush after each
    /// launch); a replay then flushes after each launch too.
    Allow,
}

/// Runs `f` inside a capture window on this thread and returns its result
/// with the recording, or why it is not replayable. `f` always runs as it
/// would outside the window (only its flushes are deferred under
/// [`Flushes::Forbid`]).
pub fn record<R: Runtime, T>(
    client: &ComputeClient<R>,
    flushes: Flushes,
    f: impl FnOnce() -> T,
) -> (T, std::result::Result<Recording<R>, NotReplayable>) {
    if !client.start_recording() {
        return (f(), Err(NotReplayable::Nested));
    }
    let noting = kept::start_noting();
    WRITES.with(|w| *w.borrow_mut() = Some(Vec::new()));
    STEP_WRITE.with(|s| s.set(None));
    let before = snapshot();
    let out = {
        let _defer = (flushes == Flushes::Forbid).then(crate::launch::defer_flushes);
        f()
    };
    let mut d = snapshot().since(&before);
    if flushes == Flushes::Allow {
        d.flushes = 0;
    }
    let noted = WRITES.with(|w| w.borrow_mut().take()).unwrap_or_default();
    let step_write = STEP_WRITE.with(|s| s.take());
    let writes: Vec<(KeptRef, usize)> = noted.iter().map(|(r, b, _)| (*r, b.len())).collect();
    let write_at: Vec<usize> = noted.iter().map(|w| w.2).collect();
    let write_data: Vec<Vec<u8>> = noted.into_iter().map(|(_, b, _)| b).collect();
    let (kept, made) = if noting {
        kept::finish_noting()
    } else {
        (Vec::new(), 0)
    };
    // A kept buffer made inside the window stays in the pool: it is what
    // a replay binds, not an allocation a replay would skip.
    d.allocations -= made.min(d.allocations);
    let launches = client.finish_recording().unwrap_or_default();
    let recording = match forbidden(&d, writes.len() as u64) {
        Some(e) => Err(e),
        None if !noting => Err(NotReplayable::Nested),
        None => Ok(Recording {
            launches,
            kept,
            writes,
            write_data,
            step_write,
            write_at,
            graph: None,
            pins: Vec::new(),
        }),
    };
    (out, recording)
}

/// The first thing a window's counts show that a replay would not redo.
fn forbidden(d: &Counts, writes: u64) -> Option<NotReplayable> {
    let f = |what, n| Some(NotReplayable::Forbidden { what, n });
    if d.allocations > 0 {
        return f("allocated", d.allocations);
    }
    if d.reads > 0 {
        return f("read back", d.reads);
    }
    if d.flushes > 0 {
        return f("flushed", d.flushes);
    }
    if d.uploads > writes {
        return f("uploaded into a new buffer", d.uploads - writes);
    }
    None
}

impl<R: Runtime> Recording<R> {
    /// Captures the recorded launches as one device graph where the
    /// runtime has them (CUDA: `cuda_graph::capture` around a replay of the
    /// launches; they do not run now), so that [`Recording::replay`] issues
    /// them with one driver call. `Ok(false)`: this runtime has no graphs.
    /// `Err`: why the capture failed; the recording still replays launch by
    /// launch.
    pub fn capture_graph(
        &mut self,
        client: &ComputeClient<R>,
    ) -> std::result::Result<bool, String> {
        #[cfg(feature = "cuda")]
        {
            if let Some(i) = self.reused_write() {
                // A graph's writes all come before its launches.
                return Err(format!(
                    "write {i} goes into a buffer an earlier launch of the pass used"
                ));
            }
            use cubecl::cuda::CudaRuntime;
            use std::any::Any;
            let any: &dyn Any = client;
            let launches: &dyn Any = &self.launches;
            if let (Some(c), Some(l)) = (
                any.downcast_ref::<ComputeClient<CudaRuntime>>(),
                launches.downcast_ref::<Vec<RecordedLaunch<CudaRuntime>>>(),
            ) {
                let g = crate::cuda_graph::capture(c, || {
                    c.replay(l);
                    for _ in l {
                        crate::counters::launch();
                    }
                    Ok(())
                })
                .map_err(|e| e.to_string())?;
                self.graph = Some(Box::new(g));
                return Ok(true);
            }
        }
        let _ = client;
        Ok(false)
    }

    /// The first write into a kept buffer that a launch before it bound
    /// (the pool handed the buffer out again within the pass), if any: it
    /// must happen between the launches, where the eager pass did it, so
    /// the recording gets no graph.
    pub fn reused_write(&self) -> Option<usize> {
        self.writes
            .iter()
            .zip(&self.write_at)
            .position(|((r, _), &at)| {
                kept::handle(r).is_some_and(|h| {
                    let id = h.memory_id();
                    self.launches[..at.min(self.launches.len())]
                        .iter()
                        .any(|l| l.buffer_ids().any(|b| b == id))
                })
            })
    }

    /// Whether the launches replay as one captured graph.
    pub fn has_graph(&self) -> bool {
        self.graph.is_some()
    }

    /// Launches recorded.
    pub fn launches(&self) -> usize {
        self.launches.len()
    }

    /// The kernels' names, in order.
    pub fn kernel_names(&self) -> Vec<&'static str> {
        self.launches.iter().map(|l| l.name()).collect()
    }

    /// The kept buffers the pass took.
    pub fn kept(&self) -> &[KeptRef] {
        &self.kept
    }

    /// The kept buffers the pass wrote, with their sizes, in order.
    pub fn writes(&self) -> &[(KeptRef, usize)] {
        &self.writes
    }

    /// The bytes of each write as recorded.
    pub fn write_data(&self) -> &[Vec<u8>] {
        &self.write_data
    }

    /// Which write was the step's upload ([`mark_step_write`]).
    pub fn step_write(&self) -> Option<usize> {
        self.step_write
    }

    /// Sets the recording's kept buffers aside for it: the pool hands them
    /// to no one else while the recording lives, so other passes cannot be
    /// holding them when it replays (a drafter keeping a verification's
    /// hidden states, the engine its logits). Other passes make their own.
    pub fn pin(&mut self) {
        if self.pins.is_empty() {
            self.pins = self.kept.iter().filter_map(kept::handle).collect();
        }
    }

    /// Whether [`Recording::pin`] set its buffers aside.
    pub fn pinned(&self) -> bool {
        !self.pins.is_empty()
    }

    /// Whether nothing but the pool (and the recording's pin) holds any of
    /// its kept buffers (a [`Recording::replay`] now would not be refused as
    /// busy).
    pub fn ready(&self) -> bool {
        if self.pins.is_empty() {
            self.kept.iter().all(kept::is_free)
        } else {
            self.pins.iter().all(|h| kept::free_but_for(h, 1))
        }
    }

    /// Every buffer a launch binds, by memory id (`Handle::memory_id`).
    pub fn buffer_ids(&self) -> BTreeSet<usize> {
        self.launches.iter().flat_map(|l| l.buffer_ids()).collect()
    }

    /// The memory ids of the kept buffers the pass took.
    pub fn kept_ids(&self) -> BTreeSet<usize> {
        self.kept
            .iter()
            .filter_map(kept::handle)
            .map(|h| h.memory_id())
            .collect()
    }

    /// Whether `other` recorded the same launches (kernels, grids, scalars,
    /// buffers and offsets) and the same writes.
    pub fn same_as(&self, other: &Self) -> bool {
        self.launches.len() == other.launches.len()
            && self
                .launches
                .iter()
                .zip(&other.launches)
                .all(|(a, b)| a.same_as(b))
            && self.writes == other.writes
    }

    /// Whether `other` recorded the same launches up to which kept buffers
    /// they use: kernels, grids, scalars, offsets and sizes equal, every
    /// other buffer the same, and kept buffers used in the same pattern (a
    /// recording of the pass that took other free buffers).
    pub fn same_structure(&self, other: &Self) -> bool {
        self.structural_difference(other).is_none()
    }

    /// Where `other` differs from this recording beyond which kept
    /// buffers it uses (see [`Recording::same_structure`]), in words.
    pub fn structural_difference(&self, other: &Self) -> Option<String> {
        if self.launches.len() != other.launches.len() {
            return Some(format!(
                "{} launches against {}",
                self.launches.len(),
                other.launches.len()
            ));
        }
        if let Some(i) = (0..self.launches.len())
            .find(|&i| !self.launches[i].same_but_buffers(&other.launches[i]))
        {
            let (a, b) = (&self.launches[i], &other.launches[i]);
            return Some(format!(
                "launch {i} ({}): grid {:?} against {:?}, scalars {:?} against {:?}",
                a.name(),
                a.cubes(),
                b.cubes(),
                a.scalars(),
                b.scalars()
            ));
        }
        if !self
            .writes
            .iter()
            .map(|w| w.1)
            .eq(other.writes.iter().map(|w| w.1))
        {
            return Some("the uploads' sizes".into());
        }
        if self.write_at != other.write_at {
            return Some("the uploads' places among the launches".into());
        }
        let roles = |r: &Self| -> Vec<usize> {
            let kept = r.kept_ids();
            let mut seen: Vec<usize> = Vec::new();
            r.launches
                .iter()
                .flat_map(|l| l.buffer_ids())
                .map(|id| {
                    if !kept.contains(&id) {
                        return id;
                    }
                    let i = seen.iter().position(|&s| s == id).unwrap_or_else(|| {
                        seen.push(id);
                        seen.len() - 1
                    });
                    usize::MAX - i
                })
                .collect()
        };
        let (a, b) = (roles(self), roles(other));
        a.iter()
            .zip(&b)
            .position(|(x, y)| x != y)
            .map(|i| format!("binding {i}: buffers used in another pattern"))
    }

    /// The first launch (index, and both kernels' names) where `other`
    /// differs, for a reason in a log or a test failure.
    pub fn first_difference(&self, other: &Self) -> Option<(usize, &'static str, &'static str)> {
        let n = self.launches.len().max(other.launches.len());
        (0..n).find_map(|i| match (self.launches.get(i), other.launches.get(i)) {
            (Some(a), Some(b)) if a.same_as(b) => None,
            (a, b) => Some((
                i,
                a.map_or("(none)", |l| l.name()),
                b.map_or("(none)", |l| l.name()),
            )),
        })
    }

    /// Reissues the pass: its launches, with `data[i]` written into the
    /// recording's write `i` where the eager pass wrote it among them (with
    /// a graph, every write first: a recording whose write reuses a buffer
    /// an earlier launch bound gets no graph), ending each launch as an
    /// eager launch ends when `flush_each` (lavapipe's policy: flushed
    /// unless the thread defers flushes), or flushing once at the end. Fails before issuing anything when the
    /// data do not fit the writes or a kept buffer is held elsewhere.
    pub fn replay(
        &self,
        client: &ComputeClient<R>,
        data: Vec<Vec<u8>>,
        flush_each: bool,
    ) -> std::result::Result<Result<()>, ReplayError> {
        if data.len() != self.writes.len() {
            return Err(ReplayError::Writes {
                expected: self.writes.len(),
                found: data.len(),
            });
        }
        for (index, ((_, expected), d)) in self.writes.iter().zip(&data).enumerate() {
            if d.len() != *expected {
                return Err(ReplayError::WriteSize {
                    index,
                    expected: *expected,
                    found: d.len(),
                });
            }
        }
        if !self.ready() {
            return Err(ReplayError::Busy);
        }
        // Held while the pass is issued (a pinned recording holds them).
        let held: Vec<Handle> = self.kept.iter().filter_map(kept::handle).collect();
        if held.len() != self.kept.len() {
            return Err(ReplayError::Busy);
        }
        Ok(self.issue(client, data, flush_each))
    }

    fn issue(&self, client: &ComputeClient<R>, data: Vec<Vec<u8>>, flush_each: bool) -> Result<()> {
        let mut writes = self.writes.iter().zip(&self.write_at).zip(data).peekable();
        // The writes due before launch `at` (all of them with a graph).
        let mut write_until = |at: usize| -> Result<()> {
            while let Some((((r, bytes), _), d)) = writes.next_if(|((_, &w), _)| w <= at) {
                let h = kept::handle(r).ok_or_else(|| OpsError::Device {
                    op: "replay",
                    message: "a recorded write's buffer left the pool".into(),
                })?;
                let class = h.size_in_used() as usize;
                crate::counters::write();
                client.write(
                    h.offset_end((class - bytes) as u64),
                    cubecl::bytes::Bytes::from_bytes_vec(d),
                );
            }
            Ok(())
        };
        #[cfg(feature = "cuda")]
        if let Some(g) = &self.graph {
            use cubecl::cuda::CudaRuntime;
            use std::any::Any;
            let any: &dyn Any = client;
            if let (Some(c), Some(g)) = (
                any.downcast_ref::<ComputeClient<CudaRuntime>>(),
                g.downcast_ref::<crate::cuda_graph::CudaGraph>(),
            ) {
                write_until(usize::MAX)?;
                g.launch(c)?;
                return crate::launch::flush(client, "replayed graph");
            }
        }
        if flush_each {
            // As an eager launch ends: flushed unless the thread defers.
            for (i, l) in self.launches.iter().enumerate() {
                write_until(i)?;
                client.replay(std::slice::from_ref(l));
                crate::launch::finish(client, "replayed pass")?;
            }
        } else {
            // The launches between writes in one call each.
            let mut from = 0;
            for &at in self.write_at.iter().chain([&self.launches.len()]) {
                let at = at.clamp(from, self.launches.len());
                client.replay(&self.launches[from..at]);
                write_until(at)?;
                from = at;
            }
            for _ in &self.launches {
                crate::counters::launch();
            }
            crate::launch::flush(client, "replayed pass")?;
        }
        write_until(usize::MAX)
    }
}
