//! `draftc serve`: runs the `draftc-serve` binary (the `serve/` crate)
//! that sits beside `draftc`, with the same arguments, so the HTTP stack
//! never enters the runtime (as `cargo` runs `cargo-*` subcommands). On
//! Unix the process is replaced, so signals (SIGTERM's drain) reach the
//! server itself.

use std::path::PathBuf;
use std::process::{Command, ExitCode};

/// The server binary beside the running `draftc`.
pub fn server_binary() -> Result<PathBuf, String> {
    let me = std::env::current_exe().map_err(|e| format!("cannot locate draftc: {e}"))?;
    let name = format!("draftc-serve{}", std::env::consts::EXE_SUFFIX);
    let path = me.with_file_name(&name);
    if path.is_file() {
        Ok(path)
    } else {
        Err(format!(
            "{} not found: build it beside draftc with `cargo build --release -p draftc-serve` \
             (tools/demo.sh and tools/test.sh do)",
            path.display()
        ))
    }
}

pub fn run(args: Vec<String>) -> ExitCode {
    let bin = match server_binary() {
        Ok(b) => b,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut cmd = Command::new(&bin);
    cmd.args(&args);
    #[cfg(unix)]
    {
        use std::os::unix::process::CommandExt;
        let e = cmd.exec();
        eprintln!("error: cannot run {}: {e}", bin.display());
        ExitCode::FAILURE
    }
    #[cfg(not(unix))]
    match cmd.status() {
        Ok(s) if s.success() => ExitCode::SUCCESS,
        Ok(_) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: cannot run {}: {e}", bin.display());
            ExitCode::FAILURE
        }
    }
}
