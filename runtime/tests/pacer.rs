//! `--time-budget` pacing of the trainer (tools/train/draftc_train/schedule.py,
//! plain Python without torch): a run whose steps begin near its deadline
//! is cut before its first re-fit, and one with its budget ahead is left
//! alone between re-fits. Skipped where there is no `python3`.

use std::path::Path;
use std::process::Command;

const SCENARIOS: &str = r#"
import sys, time
sys.path.insert(0, sys.argv[1])
from draftc_train.schedule import Pacer
# Steps begin with 10 s of a 176 s budget left, at 4.5 s a step (the toy
# campaign's EAGLE-3 on a busy host): cut at step 2, before any re-fit.
p = Pacer(176, time.time() - 166, 40, 0.3, 4, 2)
p.last, p.n = time.time() - 4.5, 1
print("near", p.after_step(2, 40, False))
# Most of a 600 s budget ahead: a slow warm-up step cuts nothing.
p = Pacer(600, time.time(), 400, 0.3, 4, 2)
p.last, p.n = time.time() - 5.0, 1
print("ahead", p.after_step(2, 400, False))
"#;

#[test]
fn a_run_near_its_deadline_is_cut_before_its_first_refit() {
    let tools = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tools/train");
    let out = match Command::new("python3")
        .arg("-c")
        .arg(SCENARIOS)
        .arg(&tools)
        .output()
    {
        Ok(o) => o,
        Err(e) => {
            eprintln!("skipped: no python3 ({e})");
            return;
        }
    };
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines, ["near 3", "ahead None"], "{text}");
}
