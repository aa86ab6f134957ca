//! Benchmarks behind `draftc bench`: what they measure, how, and the reports
//! (markdown table on stdout, JSON and an SVG plot on disk).
//!
//! | file | owns |
//! | --- | --- |
//! | `against_baseline.rs` | `draftc generate`'s speedup: alternated speculative and autoregressive runs, medians, paired speedups |
//! | `prompts.rs` | the fixed prompt set (chat, code, summarisation with copying, math) |
//! | `decode.rs` | autoregressive decode tokens/s per batch size, bytes per token, fraction of the rooflines |
//! | `replay.rs` | replayed target passes (decode, tree verify) against eager ones, bit for bit |
//! | `speculative.rs` | drafters × batch sizes × budgets: τ, k, κ, tokens/s, speedup over autoregressive, acceptance per draft position |
//!
//! Long runs show progress on stderr ([`Progress`]); timings are wall
//! clock around synchronised device work.

pub mod against_baseline;
pub mod decode;
pub mod prompts;
pub mod replay;
pub mod speculative;

use std::io::IsTerminal;

use cubecl::prelude::*;
use indicatif::{ProgressBar, ProgressStyle};

/// Progress of a benchmark on stderr (hidden with `--quiet`): a bar on a
/// terminal, one line per step otherwise (CI logs, redirected runs).
pub struct Progress {
    bar: ProgressBar,
    lines: bool,
}

impl Progress {
    pub fn new(enabled: bool) -> Progress {
        let lines = enabled && !std::io::stderr().is_terminal();
        let bar = if enabled && !lines {
            let bar = ProgressBar::new(0);
            if let Ok(style) =
                ProgressStyle::with_template("{elapsed:>4} [{bar:24}] {pos}/{len} {msg}")
            {
                bar.set_style(style.progress_chars("=> "));
            }
            bar
        } else {
            ProgressBar::hidden()
        };
        Progress { bar, lines }
    }

    /// A note before the measured part starts.
    pub fn message(&self, msg: &str) {
        if self.lines {
            eprintln!("{msg}");
        }
        self.bar.set_message(msg.to_string());
        self.bar.tick();
    }

    /// Configuration `i` of `n` starts.
    pub fn step(&self, i: usize, n: usize, msg: &str) {
        if self.lines {
            eprintln!("[{}/{n}] {msg}", i + 1);
        }
        self.bar.set_length(n as u64);
        self.bar.set_position(i as u64);
        self.bar.set_message(msg.to_string());
    }

    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

/// The runtime's name and the host's core count (on a machine without a
/// GPU the wgpu device is lavapipe, running on those cores).
pub fn device_name<R: Runtime>(client: &ComputeClient<R>) -> String {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    format!("{} on a host with {cores} cores", R::name(client))
}
