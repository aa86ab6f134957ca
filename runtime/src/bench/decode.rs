//! `draftc bench decode`: autoregressive decoding throughput of the target
//! at several batch sizes, with the bytes a decode step moves (the codegen
//! plan's count: weights once per step, KV rows read, activations) and the
//! bandwidth that implies, next to the machine's rooflines (host memory and
//! the device's own streaming-read probe, `draftc_ops::probe`).
//!
//! Method per batch size `b`: the first `b` prompts of the bench set
//! (chat template), one run of `steps + 2` tokens with the stop token
//! ignored. The prefill produces the first token; the first decode pass is
//! the warm-up (kernel JIT for `b` rows) and is not timed; the timed part
//! is the `steps` decode passes after it. One prefill per batch size, so
//! batch 64 on lavapipe costs one ~4,000-row prefill, not two.

use cubecl::prelude::*;
use draftc_codegen::{PlanConfig, PlanDType};
use draftc_ops::counters::Counts;
use draftc_ops::probe::Roofline;
use serde::Serialize;

use super::prompts::prompt;
use super::Progress;
use crate::engine::{generate, EngineError, Request, Sampling, TargetModel};
use crate::model::tokenizer::ChatMessage;
use crate::model::ConvertedModel;

/// What to measure.
#[derive(Clone, Debug)]
pub struct DecodeConfig {
    pub batches: Vec<usize>,
    /// Timed decode passes per batch size.
    pub steps: usize,
    pub dtype: PlanDType,
    /// Replay settings to measure each batch size with, in order
    /// (`Executor::set_replay`).
    pub replay: Vec<bool>,
}

/// Decode passes before the timed ones: the first compiles kernels and
/// builds plans (its ids come from the prefill's selection: a replay key
/// of its own), the next two record the step for replay, each making
/// buffers of its own (`exec/replay.rs`).
const WARM_UP: usize = 3;

/// One batch size's measurement.
#[derive(Clone, Debug, Serialize)]
pub struct DecodePoint {
    pub batch: usize,
    /// Whether the timed passes could replay (`--replay`).
    pub replay: bool,
    /// Timed passes that were replayed.
    pub replayed_steps: u64,
    pub steps: usize,
    /// Tokens produced by the timed passes (`batch · steps`).
    pub tokens: usize,
    pub seconds: f64,
    pub tokens_per_s: f64,
    pub step_ms: f64,
    /// Mean KV length per sequence over the timed passes.
    pub mean_context: f64,
    /// Bytes one decode step moves (plan count) and per generated token.
    pub bytes_per_step: f64,
    pub bytes_per_token: f64,
    pub flops_per_step: f64,
    /// Implied by the step time: bytes / s and FLOP / s.
    pub achieved_bytes_per_s: f64,
    pub achieved_flops_per_s: f64,
    /// `achieved_bytes_per_s` over the device's streaming-read roofline and
    /// over the host's memory read bandwidth.
    pub fraction_of_device_read: f64,
    pub fraction_of_host_read: f64,
    /// What one decode step asked of the device, measured over the timed
    /// steps (`draftc_ops::counters`, selection included), not taken from
    /// the plan: kernel launches, flushes (submissions), device→host
    /// reads, host→device uploads and device allocations, per step.
    pub launches_per_step: f64,
    pub flushes_per_step: f64,
    pub reads_per_step: f64,
    pub uploads_per_step: f64,
    pub allocations_per_step: f64,
    /// Host heap allocations per step on the thread that issues the passes
    /// (`draftc`'s counting allocator; 0 in a binary without it).
    pub heap_allocations_per_step: f64,
    /// Host microseconds per step: the step's wall time less the time the
    /// host was blocked in reads and flushes (waiting for the device).
    pub host_us_per_step: f64,
    /// The fused plan's launch count for one step (target pass only).
    pub plan_launches_per_step: usize,
    /// Host time issuing one launch, mean over the timed decode passes
    /// (`exec::HostTime`): the cost a launch adds before the device sees
    /// it. On lavapipe, which runs kernels on the submitting CPU threads,
    /// it includes kernel time.
    pub host_us_per_launch: f64,
}

/// The whole report (`decode.json`).
#[derive(Clone, Debug, Serialize)]
pub struct DecodeReport {
    pub device: String,
    pub model: String,
    pub dtype: String,
    pub weight_bytes: usize,
    pub host_read_bytes_per_s: f64,
    pub host_copy_bytes_per_s: f64,
    pub device_read_bytes_per_s: f64,
    pub points: Vec<DecodePoint>,
}

/// Measures decode throughput for every batch size of `cfg`.
pub fn run_decode<R: Runtime>(
    client: &ComputeClient<R>,
    model: &ConvertedModel,
    cfg: &DecodeConfig,
    progress: &Progress,
) -> Result<DecodeReport, EngineError> {
    if cfg.batches.is_empty() || cfg.batches.contains(&0) || cfg.steps == 0 {
        return Err(EngineError::Invalid(
            "give batch sizes >= 1 and at least one decode step".into(),
        ));
    }
    progress.message("measuring memory bandwidth (host and device) …");
    let gpu = crate::device::profile(client).class == draftc_codegen::DeviceClass::Gpu;
    let roofline: Roofline = draftc_ops::probe::roofline(client, gpu)?;
    let max_b = *cfg.batches.iter().max().unwrap_or(&1);
    let mut prompts = Vec::with_capacity(max_b);
    for i in 0..max_b {
        let p = prompt(i);
        prompts.push(
            model
                .tokenizer
                .encode_chat(&[ChatMessage::new("user", p.text)])?,
        );
    }
    let capacity = prompts.iter().map(Vec::len).max().unwrap_or(0) + cfg.steps + WARM_UP + 2;
    progress.message(&format!("loading {} …", model.dir.display()));
    let mut target = TargetModel::load(client, model, max_b, capacity, cfg.dtype)?;
    let mut points = Vec::new();
    if cfg.replay.is_empty() {
        return Err(EngineError::Invalid("no replay setting to measure".into()));
    }
    let runs: Vec<(usize, bool)> = cfg
        .batches
        .iter()
        .flat_map(|&b| cfg.replay.iter().map(move |&r| (b, r)))
        .collect();
    for (i, &(b, replay)) in runs.iter().enumerate() {
        progress.step(
            i,
            runs.len(),
            &format!(
                "batch {b}{}: prefill, {WARM_UP} warm-up passes, then {} timed decode passes",
                if replay { ", replayed" } else { ", eager" },
                cfg.steps
            ),
        );
        target.exec.set_replay(replay);
        let replayed0 = target.exec.replay_stats().0;
        let requests: Vec<Request> = prompts[..b]
            .iter()
            .map(|p| Request { prompt: p.clone() })
            .collect();
        let run = generate(
            &mut target,
            &requests,
            cfg.steps + WARM_UP + 1,
            &Sampling::GREEDY,
            None,
            &mut |_, _| {},
        )?;
        let timed = timed_passes(&run.stats.decode_pass_s, cfg.steps)?;
        // Host issue time of the same timed passes.
        let host = run.stats.decode_pass_host[WARM_UP..WARM_UP + cfg.steps]
            .iter()
            .fold(crate::exec::HostTime::default(), |a, h| {
                crate::exec::HostTime {
                    launches: a.launches + h.launches,
                    issue_s: a.issue_s + h.issue_s,
                    passes: a.passes + h.passes,
                }
            });
        let seconds = timed.iter().sum::<f64>().max(1e-9);
        let counts = run.stats.decode_pass_counts[WARM_UP..WARM_UP + cfg.steps]
            .iter()
            .fold(Counts::default(), |a, c| a.plus(c));
        let per_step = |n: u64| n as f64 / cfg.steps as f64;
        let prompt_mean = requests.iter().map(|r| r.prompt.len()).sum::<usize>() as f64 / b as f64;
        // The timed passes read contexts prompt + W … prompt + W + steps − 1.
        let mean_context = prompt_mean + WARM_UP as f64 + (cfg.steps - 1) as f64 / 2.0;
        let plan = draftc_codegen::plan(
            &target.graph,
            &target.weights,
            &PlanConfig {
                tokens: 1,
                batch: b as i64,
                context: mean_context.round() as i64,
                dtype: cfg.dtype,
                fuse: true,
                device: target.exec.device().clone(),
            },
        )
        .map_err(crate::exec::ExecError::from)?;
        let bytes = plan.totals.bytes_moved() as f64;
        let flops = plan.totals.flops as f64;
        let step_s = seconds / cfg.steps as f64;
        let tokens = b * cfg.steps;
        points.push(DecodePoint {
            batch: b,
            replay,
            replayed_steps: target.exec.replay_stats().0 - replayed0,
            steps: cfg.steps,
            tokens,
            seconds,
            tokens_per_s: tokens as f64 / seconds,
            step_ms: 1e3 * step_s,
            mean_context,
            bytes_per_step: bytes,
            bytes_per_token: bytes / b as f64,
            flops_per_step: flops,
            achieved_bytes_per_s: bytes / step_s,
            achieved_flops_per_s: flops / step_s,
            fraction_of_device_read: bytes / step_s / roofline.device_read,
            fraction_of_host_read: bytes / step_s / roofline.host_read,
            launches_per_step: per_step(counts.launches),
            flushes_per_step: per_step(counts.flushes),
            reads_per_step: per_step(counts.reads),
            uploads_per_step: per_step(counts.uploads),
            allocations_per_step: per_step(counts.allocations),
            heap_allocations_per_step: per_step(counts.heap),
            host_us_per_step: 1e6 * (seconds - counts.blocked_s).max(0.0) / cfg.steps as f64,
            plan_launches_per_step: plan.launches.len(),
            host_us_per_launch: host.us_per_launch(),
        });
    }
    progress.finish();
    Ok(DecodeReport {
        device: super::device_name(client),
        model: model.dir.display().to_string(),
        dtype: cfg.dtype.name().into(),
        weight_bytes: target.exec.weight_bytes(),
        host_read_bytes_per_s: roofline.host_read,
        host_copy_bytes_per_s: roofline.host_copy,
        device_read_bytes_per_s: roofline.device_read,
        points,
    })
}

/// The `steps` timed decode passes of a run: every pass after the first
/// (the warm-up). An error, not a short measurement, when the run stopped
/// early.
fn timed_passes(pass_s: &[f64], steps: usize) -> Result<&[f64], EngineError> {
    match pass_s.get(WARM_UP..WARM_UP + steps) {
        Some(timed) => Ok(timed),
        None => Err(EngineError::Invalid(format!(
            "decode benchmark: expected {} decode passes ({WARM_UP} warm-up + {steps} timed), the run made {}",
            steps + WARM_UP,
            pass_s.len()
        ))),
    }
}

impl DecodeReport {
    /// The markdown table `draftc bench decode` prints.
    pub fn table(&self) -> String {
        let mut s = format!(
            "## autoregressive decode — {}, {} ({} MB of weights)\n\
             rooflines: device streaming read {:.2} GB/s, host read {:.1} GB/s, host copy {:.1} GB/s\n\n\
             | batch | passes | tokens/s | ms/step | context | MB/step | MB/token | GB/s | % device read | % host read | GFLOP/s | launches/step | flushes | reads | uploads | allocations | host allocations | host µs/step | host µs/launch |\n\
             |---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
            self.device,
            self.dtype,
            self.weight_bytes / 1_000_000,
            self.device_read_bytes_per_s / 1e9,
            self.host_read_bytes_per_s / 1e9,
            self.host_copy_bytes_per_s / 1e9,
        );
        for p in &self.points {
            s.push_str(&format!(
                "| {} | {} | {:.2} | {:.1} | {:.0} | {:.1} | {:.1} | {:.2} | {:.0}% | {:.1}% | {:.2} | {:.0} | {:.1} | {:.1} | {:.1} | {:.1} | {:.0} | {:.0} | {:.1} |\n",
                p.batch,
                match (p.replay, p.replayed_steps) {
                    (false, _) => "eager".to_string(),
                    (true, n) => format!("replayed {n}/{}", p.steps),
                },
                p.tokens_per_s,
                p.step_ms,
                p.mean_context,
                p.bytes_per_step / 1e6,
                p.bytes_per_token / 1e6,
                p.achieved_bytes_per_s / 1e9,
                100.0 * p.fraction_of_device_read,
                100.0 * p.fraction_of_host_read,
                p.achieved_flops_per_s / 1e9,
                p.launches_per_step,
                p.flushes_per_step,
                p.reads_per_step,
                p.uploads_per_step,
                p.allocations_per_step,
                p.heap_allocations_per_step,
                p.host_us_per_step,
                p.host_us_per_launch,
            ));
        }
        s
    }

    /// Two panels: tokens/s against batch size, and the implied bandwidth
    /// against the device's streaming-read roofline.
    pub fn write_svg(&self, path: &std::path::Path) -> Result<(), String> {
        use crate::plot::{Panel, Series};
        let modes: Vec<bool> = [false, true]
            .into_iter()
            .filter(|m| self.points.iter().any(|p| p.replay == *m))
            .collect();
        let series = |f: &dyn Fn(&DecodePoint) -> f64, what: &str| -> Vec<Series> {
            modes
                .iter()
                .map(|&m| Series {
                    label: format!("{what}, {}", if m { "replayed" } else { "eager" }),
                    points: self
                        .points
                        .iter()
                        .filter(|p| p.replay == m)
                        .map(|p| (p.batch as f64, f(p)))
                        .collect(),
                })
                .collect()
        };
        let panels = [
            Panel {
                title: "decode throughput".into(),
                x_label: "batch size".into(),
                y_label: "tokens/s".into(),
                log_x: true,
                series: series(
                    &|p| p.tokens_per_s,
                    &format!("autoregressive, {}", self.dtype),
                ),
                reference: None,
            },
            Panel {
                title: "bytes moved per second (plan count)".into(),
                x_label: "batch size".into(),
                y_label: "GB/s".into(),
                log_x: true,
                series: series(&|p| p.achieved_bytes_per_s / 1e9, "decode step"),
                reference: Some((
                    self.device_read_bytes_per_s / 1e9,
                    "device streaming-read roofline".into(),
                )),
            },
        ];
        crate::plot::write_svg(
            path,
            &format!("draftc bench decode — {}", self.device),
            &panels,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::timed_passes;

    #[test]
    fn the_first_three_decode_passes_are_the_warm_up() {
        let passes = [9.0, 8.0, 7.0, 1.0, 2.0, 3.0];
        assert_eq!(timed_passes(&passes, 3).unwrap(), &[1.0, 2.0, 3.0]);
        assert_eq!(timed_passes(&passes, 2).unwrap(), &[1.0, 2.0]);
    }

    #[test]
    fn a_run_that_stopped_early_is_an_error() {
        let err = timed_passes(&[9.0, 8.0, 7.0, 1.0], 3)
            .unwrap_err()
            .to_string();
        assert!(err.contains("expected 6 decode passes"), "{err}");
        assert!(timed_passes(&[], 1).is_err());
    }
}
