//! The `draftc-serve` binary; `draftc serve …` runs it (it sits beside
//! `draftc`), so the HTTP stack stays out of the `draftc` binary.

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    draftc_serve::run(draftc_serve::args::ServeArgs::parse())
}
