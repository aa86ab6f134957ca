//! `draftc check FILE...`: parse and type-check description files against a
//! target preset; exit 0 when all are well-formed, 1 with diagnostics otherwise.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use super::source::{compile_file, load_target, parse_sets, Compiled};

#[derive(Args)]
pub struct CheckArgs {
    /// Model, drafter or preset files (`models/*.draft`).
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    /// Target preset: a name looked up next to the files or a path.
    #[arg(long, default_value = "smollm2-135m")]
    pub target: String,
    /// Override an integer setting, e.g. `--set l=8`.
    #[arg(long = "set", value_name = "NAME=VALUE")]
    pub sets: Vec<String>,
}

pub fn run(args: CheckArgs) -> ExitCode {
    let Ok(sets) = parse_sets(&args.sets) else {
        return ExitCode::FAILURE;
    };
    let Ok((target, _)) = load_target(&args.target, args.files.first().map(|p| p.as_path())) else {
        return ExitCode::FAILURE;
    };
    let mut failed = 0;
    for file in &args.files {
        match compile_file(file, &target, &sets) {
            Ok(Compiled::Graph(g)) => {
                let kind = g
                    .meta
                    .drafter_kind
                    .map(|k| format!(", {}", k.name()))
                    .unwrap_or_default();
                println!(
                    "ok   {} ({} {}{kind}: {} nodes, {} weight tensors)",
                    file.display(),
                    g.kind.keyword(),
                    g.name,
                    g.nodes.len(),
                    g.params().len()
                );
            }
            Ok(Compiled::Preset(cfg)) => println!(
                "ok   {} (preset {} for `{}`)",
                file.display(),
                cfg.name,
                cfg.family
            ),
            Err(_) => failed += 1,
        }
    }
    if failed > 0 {
        eprintln!("{failed} of {} file(s) have errors", args.files.len());
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
