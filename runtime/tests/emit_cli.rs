//! `draftc emit` as a user runs it: CUDA and WGSL source on stdout, exit 1
//! with a message (never a panic) on bad input.

mod tiny;

use std::process::Output;

use tiny::{draftc, text};

fn assert_exit_1(out: &Output, needle: &str) {
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "stderr:\n{err}");
    assert!(
        err.contains(needle),
        "expected `{needle}` in stderr:\n{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
    assert!(out.stdout.is_empty(), "{}", text(&out.stdout));
}

#[test]
fn emit_cuda_prints_global_kernels() {
    let out = draftc(&["emit", "models/specformer.draft", "--backend", "cuda"]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "stderr:\n{}", text(&out.stderr));
    assert!(stdout.contains("__global__"), "{stdout}");
    assert!(stdout.contains("linear_kernel_f_f32_n_4"), "{stdout}");
    assert!(stdout.contains("//   #0 linear m=16"), "{stdout}");
    assert!(!stdout.contains("@compute"));
}

#[test]
fn emit_wgsl_prints_compute_shaders() {
    let out = draftc(&["emit", "models/specformer.draft", "--backend", "wgsl"]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "stderr:\n{}", text(&out.stderr));
    assert!(stdout.contains("@compute"), "{stdout}");
    assert!(!stdout.contains("__global__"));
}

#[test]
fn emit_defaults_to_cuda_and_takes_the_plan_flags() {
    let out = draftc(&[
        "emit",
        "models/specformer.draft",
        "--tokens",
        "1",
        "--dtype",
        "f16",
        "--set",
        "l=8",
    ]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "stderr:\n{}", text(&out.stderr));
    assert!(stdout.contains("__global__"), "{stdout}");
    assert!(stdout.contains("__half"), "{stdout}");
    assert!(stdout.contains("l = 8, t = 1"), "{stdout}");
}

#[test]
fn emit_bad_input_exits_1_with_a_message() {
    assert_exit_1(
        &draftc(&["emit", "models/does-not-exist.draft"]),
        "cannot read",
    );
    assert_exit_1(
        &draftc(&["emit", "models/specformer.draft", "--backend", "ptx"]),
        "expected cuda or wgsl",
    );
    assert_exit_1(
        &draftc(&["emit", "models/specformer.draft", "--dtype", "bf16"]),
        "expected f32 or f16",
    );
    assert_exit_1(
        &draftc(&["emit", "models/smollm2-135m.draft"]),
        "is a preset",
    );
    let dir = std::env::temp_dir().join(format!("draftc-emit-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("bad.draft");
    std::fs::write(&bad, b"drafter bad\nkind parallel\ny = linaer(x, d) @w\n").unwrap();
    let out = draftc(&["emit", bad.to_str().unwrap(), "--backend", "wgsl"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(!text(&out.stderr).contains("panicked"));
    assert!(out.stdout.is_empty());
}

/// `--target DIR`: a converted checkpoint directory's `config.json` gives
/// the sizes (as the runtime reads it), and the training module scales a
/// Gemma target's final norm by `1 + w` (`FINAL_NORM_OFFSET`); the default
/// target's is `w`.
#[test]
fn emit_torch_against_a_checkpoint_directory() {
    let gemma = "runtime/tests/fixtures/targets/gemma3-tied";
    let out = draftc(&[
        "emit",
        "models/eagle.draft",
        "--backend",
        "torch",
        "--target",
        gemma,
    ]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "stderr:\n{}", text(&out.stderr));
    assert!(stdout.contains("FINAL_NORM_OFFSET = 1.0"), "{stdout}");
    // d = 32 (the fixture's hidden_size): fc maps [e, f] (2d) to d.
    assert!(
        stdout.contains("(\"fc.weight\", [32, 64], \"normal\")"),
        "{stdout}"
    );
    let out = draftc(&["emit", "models/eagle.draft", "--backend", "torch"]);
    assert!(out.status.success(), "stderr:\n{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("FINAL_NORM_OFFSET = 0.0"));
    // A directory without config.json is not a checkpoint (nor a preset).
    assert_exit_1(
        &draftc(&[
            "emit",
            "models/eagle.draft",
            "--backend",
            "torch",
            "--target",
            "runtime/tests/fixtures",
        ]),
        "not found",
    );
}
