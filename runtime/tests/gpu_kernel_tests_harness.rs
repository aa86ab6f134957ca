//! The CUDA kernel-test stage of tools/gpu/run.sh (`tests`), run here
//! against a fake test binary (plain bash, no GPU): modules run side by
//! side, each under the stage's deadline, and the report lists them in
//! module order as PASS, FAIL (with the panic), TIMEOUT (with the tests
//! left unfinished) or NOT RUN. Skipped where there is no `bash`.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

const FAKE: &str = r#"#!/usr/bin/env bash
if [ "$1" = --list ]; then
  printf 'kv::a: test\nslow::x: test\nbad::y: test\nkv::b: test\nfast::z: test\n'
  exit 0
fi
case $3 in
kv::) echo "test kv::a ... ok"; echo "test kv::b ... ok"; echo "test result: ok. 2 passed"; exit 0 ;;
slow::) echo "test slow::x ... "; sleep 30; exit 0 ;;
bad::) echo "test bad::y ... FAILED"; echo "thread 'bad::y' panicked at here"; exit 101 ;;
fast::) echo "test result: ok. 1 passed on $2 threads"; exit 0 ;;
esac
"#;

/// Runs run.sh's `tests` function over the fake binary with a deadline
/// `secs` seconds ahead; returns its report and exit status.
fn harness(parallel: u32, secs: u32) -> Option<(String, i32)> {
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("bin");
    fs::create_dir_all(&bin).unwrap();
    let fake = bin.join("ops-fake");
    fs::write(&fake, FAKE).unwrap();
    fs::set_permissions(&fake, fs::Permissions::from_mode(0o755)).unwrap();
    let logs = dir.path().join("logs");
    fs::create_dir_all(&logs).unwrap();
    let run_sh = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tools/gpu/run.sh");
    let script = format!(
        r#"stage={stage}
eval "$(sed -n '/^FIRST=/,/^# sanitize DIR/p' {run_sh})"
TESTS_PARALLEL={parallel} tests {logs} $(($(date +%s) + {secs}))"#,
        stage = dir.path().display(),
        run_sh = run_sh.display(),
        logs = logs.display(),
    );
    let out = match Command::new("bash").arg("-c").arg(script).output() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("skipped: no bash ({e})");
            return None;
        }
    };
    Some((
        String::from_utf8_lossy(&out.stdout).into_owned(),
        out.status.code().unwrap_or(-1),
    ))
}

#[test]
fn modules_run_side_by_side_and_report_in_order() {
    // Six seconds: every module starts at once, each with the whole time
    // left (five or six seconds, as the clock's second turns).
    let Some((report, status)) = harness(8, 6) else {
        return;
    };
    let lines: Vec<&str> = report.lines().collect();
    assert_eq!(
        status, 1,
        "a failure and a timeout fail the stage:\n{report}"
    );
    assert!(
        lines[0].starts_with("PASS ops-fake kv: test result: ok. 2 passed"),
        "{report}"
    );
    assert!(
        lines[1].starts_with("TIMEOUT ops-fake slow (")
            && lines[1].contains("s): 0 passed before it; unfinished: slow::x"),
        "{report}"
    );
    assert_eq!(lines[2], "FAIL ops-fake bad (exit 101)", "{report}");
    assert!(report.contains("panicked at here"), "{report}");
    let fast = lines
        .iter()
        .find(|l| l.starts_with("PASS ops-fake fast"))
        .unwrap();
    assert!(fast.ends_with("on 2 threads"), "{report}");
}

#[test]
fn modules_past_the_deadline_are_not_run() {
    // One at a time: the slow module holds the only slot past the deadline.
    // Eight seconds: a module is not started with two seconds or less left,
    // and the deadline is whole seconds, so with three the slow module was
    // not run whenever the clock's second turned during the first module
    // (CI, 2026-11-28).
    let Some((report, status)) = harness(1, 8) else {
        return;
    };
    assert_eq!(status, 1);
    assert!(report.contains("TIMEOUT ops-fake slow ("), "{report}");
    assert!(report.contains("NOT RUN ops-fake bad (time)"), "{report}");
    assert!(report.contains("NOT RUN ops-fake fast (time)"), "{report}");
}
