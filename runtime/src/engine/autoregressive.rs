//! Batched autoregressive generation — the `--no-spec` path and the
//! reference every speculative run must reproduce: the engine's static run
//! with no drafter (prefill every prompt, chunked, then one target pass per
//! token over all unfinished sequences; each sequence stops on its own,
//! end-of-sequence token or `max_tokens`), and its per-pass timings.

use cubecl::prelude::*;

use super::rounds::Parts;
use super::select::Sampling;
use super::speculative::DraftPolicy;
use super::static_run::{run_static, Stops};
use super::target::{EngineError, TargetModel};

/// One sequence to generate for.
#[derive(Clone, Debug)]
pub struct Request {
    pub prompt: Vec<u32>,
}

/// Counters and wall times of a run.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GenStats {
    pub sequences: usize,
    pub prompt_tokens: usize,
    pub generated_tokens: usize,
    /// Target passes (prefill chunks included).
    pub target_passes: usize,
    pub prefill_s: f64,
    pub decode_s: f64,
    /// Wall time of every decode pass after the first token, in order
    /// (token selection included); their sum is at most `decode_s`.
    pub decode_pass_s: Vec<f64>,
    /// The target executor's launches and host issue time in each of those
    /// passes (`exec::HostTime`).
    pub decode_pass_host: Vec<crate::exec::HostTime>,
    /// What each of those steps asked of the device, measured
    /// (`draftc_ops::counters`): launches, flushes, reads, uploads,
    /// allocations, and time blocked on the device.
    pub decode_pass_counts: Vec<draftc_ops::counters::Counts>,
}

impl GenStats {
    /// Generated tokens per second of decoding (prefill excluded).
    pub fn decode_tokens_per_s(&self) -> f64 {
        self.generated_tokens as f64 / self.decode_s.max(1e-9)
    }
}

/// What a run produced: per request, the generated ids (stop token included).
#[derive(Clone, Debug, Default)]
pub struct Generation {
    pub tokens: Vec<Vec<u32>>,
    pub stats: GenStats,
}

/// Generates up to `max_tokens` per request with `sampling`; `stop`: the
/// end-of-sequence id that ends a sequence (kept in its output).
/// `on_token(request, id)` sees every token as it is chosen. The engine's
/// rounds with no drafter: prefill every prompt (chunked), then one
/// target pass per token over all unfinished sequences.
pub fn generate<R: Runtime>(
    target: &mut TargetModel<R>,
    requests: &[Request],
    max_tokens: usize,
    sampling: &Sampling,
    stop: impl Into<Stops>,
    on_token: &mut dyn FnMut(usize, u32),
) -> Result<Generation, EngineError> {
    let mut policy = DraftPolicy::Fixed(0);
    let mut cx = Parts {
        target,
        drafter: None,
        policy: &mut policy,
    };
    let stop = stop.into();
    let run = run_static(&mut cx, requests, max_tokens, sampling, stop, on_token)?;
    let stats = GenStats {
        sequences: requests.len(),
        prompt_tokens: requests.iter().map(|r| r.prompt.len()).sum(),
        generated_tokens: run.tokens.iter().map(Vec::len).sum(),
        target_passes: run.stats.rounds,
        prefill_s: run.prefill_s,
        decode_s: run.decode_s,
        decode_pass_s: run.decode_rounds.iter().map(|r| r.seconds).collect(),
        decode_pass_host: run.decode_rounds.iter().map(|r| r.host).collect(),
        decode_pass_counts: run.decode_rounds.iter().map(|r| r.counts).collect(),
    };
    Ok(Generation {
        tokens: run.tokens,
        stats,
    })
}
