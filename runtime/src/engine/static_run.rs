//! A static batch on the continuous engine's rounds: every request joins
//! at once, the batch runs until the last one ends, and the run is timed
//! (prefill, then every decode round: wall time, host issue time, device
//! counters). [`super::generate`] (no drafter) and
//! [`super::generate_with_policy`] are this one loop with and without a
//! drafter; `draftc generate`, `bench spec` and `draftc serve` all decode
//! through [`Batch::step`].

use std::time::Instant;

use cubecl::prelude::*;

use super::continuous::{EngineConfig, EngineStats, SeqParams};
use super::rounds::{use_confidences, Batch, Parts};
use super::select::Sampling;
use super::target::EngineError;
use super::Request;

/// What a static run produced.
#[derive(Default)]
pub(super) struct StaticRun {
    /// Per request, the generated ids (a stop id included).
    pub tokens: Vec<Vec<u32>>,
    pub stats: EngineStats,
    /// Until every prompt was in the cache (its first token chosen).
    pub prefill_s: f64,
    pub prefill_rounds: usize,
    pub decode_s: f64,
    /// Every round after the prefill's.
    pub decode_rounds: Vec<RoundTimes>,
}

/// One decode round's costs.
pub(super) struct RoundTimes {
    pub seconds: f64,
    pub host: crate::exec::HostTime,
    pub counts: draftc_ops::counters::Counts,
}

impl StaticRun {
    /// A round in which the planner switched the drafter off, as a static
    /// run counts it: 0 before the first decode round, else the decode
    /// round's number (from 1).
    pub fn off_round(&self) -> Option<usize> {
        self.stats
            .drafter_off_at
            .map(|r| (r + 1).saturating_sub(self.prefill_rounds))
    }
}

/// The ids that end a sequence (a model's eos ids; Llama 3 has three);
/// none when empty. `None` and `Some(id)` convert into it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stops(pub Vec<u32>);

impl Stops {
    pub fn contains(&self, id: u32) -> bool {
        self.0.contains(&id)
    }
}

impl From<Option<u32>> for Stops {
    fn from(id: Option<u32>) -> Stops {
        Stops(id.into_iter().collect())
    }
}

impl From<Vec<u32>> for Stops {
    fn from(ids: Vec<u32>) -> Stops {
        Stops(ids)
    }
}

/// Runs `requests` as one batch to the end: up to `max_tokens` new tokens
/// each, any of `stop` ending a sequence. `on_token(request, id)` sees every
/// token as it is chosen.
pub(super) fn run_static<R: Runtime>(
    cx: &mut Parts<'_, R>,
    requests: &[Request],
    max_tokens: usize,
    sampling: &Sampling,
    stop: Stops,
    on_token: &mut dyn FnMut(usize, u32),
) -> Result<StaticRun, EngineError> {
    sampling.validate()?;
    let b = requests.len();
    if b > cx.target.caches.slots() {
        return Err(EngineError::Invalid(format!(
            "{b} sequences but the caches were sized for {}",
            cx.target.caches.slots()
        )));
    }
    let mut run = StaticRun {
        tokens: vec![Vec::new(); b],
        ..StaticRun::default()
    };
    if b == 0 || max_tokens == 0 {
        return Ok(run);
    }
    let confident = match cx.drafter.as_deref_mut() {
        Some(d) => use_confidences(d, cx.policy),
        None => false,
    };
    // The whole pass for prompt rows: every prompt is in the cache before
    // (nearly) anything decodes, as a static run expects.
    let cfg = EngineConfig {
        prefill_chunk: cx.target.max_rows,
        prefix_cache: false,
    };
    let mut batch = Batch::new(cx.target.caches.slots(), cfg, confident, true);
    // A sampled sequence's tokens are keyed by its seed and positions
    // alone; request `i` of the batch samples with `seed ^ i << 32`, so the
    // same prompt twice gives two samples, and the first request's (the
    // only one of a single prompt) is what a server request with `seed`
    // gives.
    let seqs = requests
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let params = SeqParams {
                max_tokens,
                sampling: Sampling {
                    seed: sampling.seed ^ (i as u64) << 32,
                    ..*sampling
                },
                stop_ids: stop.0.clone(),
            };
            (i as u64, r.prompt.clone(), params)
        })
        .collect();
    // The last token chosen needs no cache row.
    let max_len = cx.target.caches.capacity() + 1;
    batch.add_all(cx, seqs, max_len)?;
    let t0 = Instant::now();
    let mut decode_start: Option<Instant> = None;
    while !batch.seqs.is_empty() {
        let prefilling = decode_start.is_none();
        let started = Instant::now();
        let host0 = cx.target.exec.host_time();
        let counts0 = draftc_ops::counters::snapshot();
        for e in batch.step(cx)? {
            let i = e.id as usize;
            for t in e.tokens {
                run.tokens[i].push(t);
                on_token(i, t);
            }
        }
        if prefilling {
            run.prefill_rounds += 1;
            if batch.seqs.iter().all(|s| s.decoding()) {
                run.prefill_s = t0.elapsed().as_secs_f64();
                decode_start = Some(Instant::now());
            }
        } else {
            run.decode_rounds.push(RoundTimes {
                seconds: started.elapsed().as_secs_f64(),
                host: cx.target.exec.host_time().since(&host0),
                counts: draftc_ops::counters::snapshot().since(&counts0),
            });
        }
    }
    if let Some(d) = cx.drafter.as_deref_mut() {
        d.finished()?;
    }
    run.decode_s = decode_start.map_or(0.0, |t| t.elapsed().as_secs_f64());
    run.stats = batch.stats;
    Ok(run)
}
