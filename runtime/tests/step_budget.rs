//! What a decode step and a speculative round ask of the device, measured
//! by `draftc_ops::counters` on lavapipe (issue 31): the flush policy of
//! each device profile, one read per step, and ceilings on launches,
//! uploads and allocations that hold the ground gained so far (lower them
//! as the step gets leaner; a step that gets heavier fails here).
//!
//! Steady state: the first decode step (kernel compilation, plan building)
//! is left out.

mod tiny;

use draftc_codegen::PlanDType;
use draftc_ops::counters::Counts;
use draftc_runtime::device::{gpu_layout_profile, FlushPolicy};
use draftc_runtime::engine::{generate, Sampling};
use tiny::*;

/// Layers of the tiny target.
const LAYERS: u64 = 2;

/// Per decode step after the first, at batch `b`, with the GPU layouts
/// (and their flush policy) when `gpu`.
fn decode_counts(b: usize, gpu: bool) -> (Vec<Counts>, Vec<Vec<u32>>) {
    let (mut t, _) = target_with(b, PlanDType::F32);
    if gpu {
        let p = gpu_layout_profile(t.client());
        t.exec.set_device(p);
    }
    let run = generate(
        &mut t,
        &prompts(b),
        10,
        &Sampling::GREEDY,
        None,
        &mut |_, _| {},
    )
    .unwrap();
    (run.stats.decode_pass_counts[1..].to_vec(), run.tokens)
}

fn max_of(counts: &[Counts], f: impl Fn(&Counts) -> u64) -> u64 {
    counts.iter().map(f).max().unwrap_or(0)
}

#[test]
fn gpu_profile_flushes_once_and_reads_once_per_step() {
    if std::env::var_os(FlushPolicy::ENV).is_some() {
        eprintln!("skipped: {} overrides the policy", FlushPolicy::ENV);
        return;
    }
    for b in [1, 3] {
        let (counts, _) = decode_counts(b, true);
        assert!(!counts.is_empty());
        for c in &counts {
            assert_eq!(c.flushes, 1, "batch {b}: {c:?}");
            assert_eq!(c.reads, 1, "batch {b}: {c:?}");
        }
    }
}

#[test]
fn lavapipe_keeps_a_flush_per_launch() {
    if std::env::var_os(FlushPolicy::ENV).is_some() {
        eprintln!("skipped: {} overrides the policy", FlushPolicy::ENV);
        return;
    }
    let (counts, _) = decode_counts(1, false);
    for c in &counts {
        assert_eq!(c.flushes, c.launches, "{c:?}");
        assert_eq!(c.reads, 1, "{c:?}");
    }
}

#[test]
fn deferred_flushing_changes_no_token() {
    for b in [1, 3] {
        let (_, lanes) = decode_counts(b, false);
        let (_, planes) = decode_counts(b, true);
        // Different kernel layouts, same greedy tokens on this target (the
        // executor-vs-interpreter tests bound their numerical difference).
        assert_eq!(lanes, planes, "batch {b}");
    }
}

/// Ceilings measured on this tree (issue 31's budget is ≤ 5 launches a
/// layer + 4, ≤ 1 upload, 0 allocations; the step is not there yet).
#[test]
fn decode_step_stays_within_its_measured_ceilings() {
    for (b, gpu) in [(1, false), (1, true), (3, false), (3, true)] {
        let (counts, _) = decode_counts(b, gpu);
        let launches = max_of(&counts, |c| c.launches);
        let uploads = max_of(&counts, |c| c.uploads);
        let allocations = max_of(&counts, |c| c.allocations);
        eprintln!(
            "batch {b} gpu {gpu}: {launches} launches, {uploads} uploads, {allocations} allocations"
        );
        assert!(
            launches <= LAUNCHES_PER_LAYER * LAYERS + LAUNCHES_OUTSIDE,
            "batch {b} gpu {gpu}: {launches} launches"
        );
        assert!(
            uploads <= UPLOADS_PER_LAYER * LAYERS + UPLOADS_OUTSIDE,
            "batch {b} gpu {gpu}: {uploads} uploads"
        );
        assert!(
            allocations <= ALLOCS_PER_LAYER * LAYERS + ALLOCS_OUTSIDE,
            "batch {b} gpu {gpu}: {allocations} allocations"
        );
    }
}

// Measured: a layer is the Q, K and V projections, RoPE on Q, attention,
// the o-projection, gate·up and down (the linears fuse their norms and
// residuals) and RoPE on K fused with both KV appends: 9 launches; outside
// the layers, the embedding, the LM head (final norm fused) and argmax.
// Uploads: the ids, the positions, the append slots and the attention
// metadata (3 arrays), once per pass. Allocations: the uploads, the pass's
// outputs (logits and each layer's emitted hidden state, which callers may
// keep) and the selection's output.
const LAUNCHES_PER_LAYER: u64 = 9;
const LAUNCHES_OUTSIDE: u64 = 3;
const UPLOADS_PER_LAYER: u64 = 0;
const UPLOADS_OUTSIDE: u64 = 6;
const ALLOCS_PER_LAYER: u64 = 1;
const ALLOCS_OUTSIDE: u64 = 9;
