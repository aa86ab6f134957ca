//! `draftc convert GGUF --out DIR [--dtype f16|f32]`: GGUF → HF-layout
//! `model.safetensors`, `config.json`, `tokenizer.json`,
//! `tokenizer_config.json`. Does nothing when DIR is already up to date.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, ValueEnum};

use crate::model::convert::{convert_gguf, ConvertOptions, ConvertReport};
use crate::model::safetensors_io::WeightDtype;

/// Element type of the written weights.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum DtypeArg {
    F16,
    F32,
}

impl From<DtypeArg> for WeightDtype {
    fn from(d: DtypeArg) -> Self {
        match d {
            DtypeArg::F16 => WeightDtype::F16,
            DtypeArg::F32 => WeightDtype::F32,
        }
    }
}

#[derive(Args)]
pub struct ConvertArgs {
    /// The GGUF file to import (architecture llama, qwen2, qwen3 or gemma3;
    /// a byte-level BPE or SentencePiece tokenizer).
    pub gguf: PathBuf,
    /// Output directory (created if missing).
    #[arg(long)]
    pub out: PathBuf,
    /// Element type of model.safetensors.
    #[arg(long, value_enum, default_value_t = DtypeArg::F32)]
    pub dtype: DtypeArg,
    /// No progress bars.
    #[arg(long)]
    pub quiet: bool,
}

pub fn run(args: ConvertArgs) -> ExitCode {
    let opts = ConvertOptions {
        dtype: args.dtype.into(),
        progress: !args.quiet,
    };
    match convert_gguf(&args.gguf, &args.out, &opts) {
        Ok(report) => {
            print_report(&report);
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// One line on stderr describing what a conversion did.
pub fn print_report(r: &ConvertReport) {
    if r.skipped {
        eprintln!("{} is up to date; nothing to do", r.out_dir.display());
    } else {
        eprintln!(
            "wrote {} ({} tensors, {:.1} MB) in {:.1} s",
            r.out_dir.display(),
            r.n_tensors,
            r.safetensors_bytes as f64 / 1e6,
            r.seconds
        );
    }
}
