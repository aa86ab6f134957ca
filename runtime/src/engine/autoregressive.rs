//! Batched autoregressive generation — the `--no-spec` path and the
//! reference every speculative run must reproduce: prefill every prompt
//! (chunked), then one target pass per token over all unfinished
//! sequences; each sequence stops on its own (end-of-sequence token or
//! `max_tokens`).

use std::time::Instant;

use cubecl::prelude::*;

use super::select::{select_tokens, select_tokens_into, Sampling, SelectOut};
use super::target::{EngineError, TargetModel};
use crate::exec::{SeqStep, Step};

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
/// `on_token(request, id)` sees every token as it is chosen.
pub fn generate<R: Runtime>(
    target: &mut TargetModel<R>,
    requests: &[Request],
    max_tokens: usize,
    sampling: &Sampling,
    stop: Option<u32>,
    on_token: &mut dyn FnMut(usize, u32),
) -> Result<Generation, EngineError> {
    sampling.validate()?;
    let b = requests.len();
    if b > target.caches.slots() {
        return Err(EngineError::Invalid(format!(
            "{b} sequences but the caches were sized for {}",
            target.caches.slots()
        )));
    }
    let mut stats = GenStats {
        sequences: b,
        prompt_tokens: requests.iter().map(|r| r.prompt.len()).sum(),
        ..GenStats::default()
    };
    let mut out = vec![Vec::new(); b];
    if b == 0 || max_tokens == 0 {
        return Ok(Generation { tokens: out, stats });
    }
    for slot in 0..b {
        target.caches.reset(slot);
    }
    // On a GPU the whole run queues its launches; each pass flushes once
    // and the selection's read is the step's only wait.
    let _flushes = target.exec.flush_policy().defer();
    let t0 = Instant::now();
    let prompts: Vec<(usize, Vec<u32>)> = requests
        .iter()
        .enumerate()
        .map(|(i, r)| (i, r.prompt.clone()))
        .collect();
    let (last, passes) = target.prefill(&prompts, |_, _, _| Ok(()))?;
    stats.target_passes += passes;
    let first = select_tokens(target.client(), &last, sampling, 0)?;
    stats.prefill_s = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    let mut active: Vec<usize> = Vec::new();
    for (i, &tok) in first.iter().enumerate() {
        out[i].push(tok);
        on_token(i, tok);
        if Some(tok) != stop && max_tokens > 1 {
            active.push(i);
        }
    }
    let mut step_no = 1u32;
    let mut selected = SelectOut::default();
    // Whether the last selection's rows are this step's ids, in order (no
    // sequence finished since): then they stay on the device.
    let mut same_rows = false;
    while !active.is_empty() {
        let pass_start = Instant::now();
        let host0 = target.exec.host_time();
        let counts0 = draftc_ops::counters::snapshot();
        let step = Step {
            seqs: active
                .iter()
                .map(|&i| SeqStep::chain(i, target.len(i) as u32, 1))
                .collect(),
            ..Step::default()
        };
        let ids: Vec<u32> = active
            .iter()
            .map(|&i| *out[i].last().unwrap_or(&0))
            .collect();
        let o = match selected.last(ids.len()).filter(|_| same_rows) {
            Some(dev) => target.forward_on_device(&step, &ids, dev)?,
            None => target.forward(&step, &ids)?,
        };
        stats.target_passes += 1;
        let next = select_tokens_into(
            target.client(),
            o.get("logits")?,
            sampling,
            step_no,
            &mut selected,
        )?;
        step_no += 1;
        stats.decode_pass_s.push(pass_start.elapsed().as_secs_f64());
        stats
            .decode_pass_host
            .push(target.exec.host_time().since(&host0));
        stats
            .decode_pass_counts
            .push(draftc_ops::counters::snapshot().since(&counts0));
        let mut still = Vec::with_capacity(active.len());
        for (&i, &tok) in active.iter().zip(&next) {
            out[i].push(tok);
            on_token(i, tok);
            if Some(tok) != stop && out[i].len() < max_tokens {
                still.push(i);
            }
        }
        same_rows = still.len() == active.len();
        active = still;
    }
    stats.decode_s = t1.elapsed().as_secs_f64();
    stats.generated_tokens = out.iter().map(Vec::len).sum();
    Ok(Generation { tokens: out, stats })
}
