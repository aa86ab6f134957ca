//! The speedup `draftc generate` prints: timed runs of speculative and of
//! autoregressive decoding on the same prompts, alternated, after the
//! printed run; each rate the median of its runs and the speedup the
//! median of each speculative run's rate over the autoregressive runs
//! beside it ([`super::speculative::paired_speedups`]). Both sides are the
//! engine's static run (`engine::generate_with_policy`, `engine::generate`):
//! the measuring lives here, not in the decoding loop.

use cubecl::prelude::*;

use super::speculative::{median, paired_speedups, Middle};
use crate::engine::{
    generate, generate_with_policy, DraftPolicy, Drafter, Request, Sampling, Stops, TargetModel,
};

/// The rates the stats line compares: medians of alternated runs, all
/// after the untimed warm-up.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    /// Speculative tokens/s (of an even count of runs, the slower middle).
    pub spec_tps: f64,
    /// Autoregressive tokens/s (of an even count, the faster middle).
    pub ar_tps: f64,
    /// The median of each speculative run's rate over the autoregressive
    /// runs beside it (of an even count, the lower middle).
    pub speedup: f64,
    /// Runs of each.
    pub runs: usize,
    /// The planner kept the drafter off for every timed speculative run:
    /// each was the autoregressive decoder itself.
    pub all_off: bool,
}

/// A run already made (the printed one): its tokens, rate and whether the
/// planner kept the drafter off from its start.
pub struct FirstRun<'a> {
    pub tokens: &'a [Vec<u32>],
    pub tokens_per_s: f64,
    pub all_off: bool,
}

/// What the runs decode.
pub struct Workload<'a> {
    pub requests: &'a [Request],
    pub max_tokens: usize,
    pub sampling: &'a Sampling,
    pub stop: Stops,
}

/// `runs` autoregressive runs alternated with `runs - 1` more speculative
/// ones after `first`. Greedy runs must all give `first`'s tokens.
pub fn time_against_baseline<R: Runtime>(
    target: &mut TargetModel<R>,
    drafter: &mut dyn Drafter<R>,
    policy: &mut DraftPolicy,
    w: &Workload<'_>,
    first: FirstRun<'_>,
    runs: usize,
) -> Result<Timing, String> {
    let clock = std::time::Instant::now();
    let mut spec_rates = vec![first.tokens_per_s];
    let mut all_off = first.all_off;
    let (mut spec_at, mut ar_rates, mut ar_at) = (vec![0.0], Vec::new(), Vec::new());
    let greedy = w.sampling.is_greedy();
    for run in 0..runs {
        let base = generate(
            target,
            w.requests,
            w.max_tokens,
            w.sampling,
            w.stop.clone(),
            &mut |_, _| {},
        )
        .map_err(|e| e.to_string())?;
        if greedy && base.tokens != first.tokens {
            return Err(
                "internal error: speculative output differs from autoregressive greedy output"
                    .into(),
            );
        }
        ar_rates.push(base.stats.decode_tokens_per_s());
        ar_at.push(clock.elapsed().as_secs_f64());
        if run + 1 < runs {
            let again = generate_with_policy(
                target,
                drafter,
                w.requests,
                w.max_tokens,
                w.sampling,
                policy,
                w.stop.clone(),
                &mut |_, _| {},
            )
            .map_err(|e| e.to_string())?;
            if greedy && again.tokens != first.tokens {
                return Err("internal error: a repeated speculative run gave other tokens".into());
            }
            spec_rates.push(again.stats.decode_tokens_per_s());
            all_off &= again.stats.drafter_off_at == Some(0);
            spec_at.push(clock.elapsed().as_secs_f64());
        }
    }
    let paired = paired_speedups(&spec_rates, &spec_at, &ar_rates, &ar_at);
    Ok(Timing {
        spec_tps: median(&spec_rates, Middle::Lower),
        ar_tps: median(&ar_rates, Middle::Upper),
        speedup: median(&paired, Middle::Lower),
        all_off,
        runs,
    })
}
