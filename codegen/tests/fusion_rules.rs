//! Data-driven tests of canonicalize and fuse: every `tests/data/NAME.draft`
//! is compiled against SmolLM2-135M, canonicalized and fused; the printed
//! canonical graph and the fused groups must equal `tests/data/NAME.groups`.
//! `UPDATE_EXPECT=1 cargo test -p draftc-codegen --test fusion_rules`
//! rewrites the expectations (review the diff).

mod support;

use std::fmt::Write;

use draftc_codegen::GroupKind;
use support::{checked_trace, compile_src, repo, small};

/// The one helper: compile, run the passes, compare with the expectation.
fn check(name: &str) {
    let dir = repo().join("codegen/tests/data");
    let src = std::fs::read_to_string(dir.join(format!("{name}.draft"))).expect("input exists");
    let g = compile_src(&src);
    let tr = checked_trace(&g, &small(true));
    let mut out = String::from("canonical:\n");
    out.push_str(&draftc_ir::print::body(&tr.canonical));
    out.push_str("fused groups:\n");
    for gr in tr.groups.iter().filter(|g| g.kind == GroupKind::Fused) {
        let _ = writeln!(out, "  {}", gr.describe(&tr.canonical));
    }
    let unfused = checked_trace(&g, &small(false)).plan.totals;
    let _ = writeln!(
        out,
        "launches: {} fused, {} unfused",
        tr.plan.totals.launches, unfused.launches
    );
    let path = dir.join(format!("{name}.groups"));
    if std::env::var_os("UPDATE_EXPECT").is_some() {
        std::fs::write(&path, &out).expect("writable");
        return;
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_default();
    assert_eq!(out, expected, "{name}: got\n{out}");
}

#[test]
fn norm_linear() {
    check("norm_linear");
}

#[test]
fn shared_norm() {
    check("shared_norm");
}

#[test]
fn group_norm_downsample() {
    check("group_norm_downsample");
}

#[test]
fn linear_residual() {
    check("linear_residual");
}

#[test]
fn swiglu_block() {
    check("swiglu_block");
}

#[test]
fn attention_block() {
    check("attention_block");
}

#[test]
fn lm_head() {
    check("lm_head");
}

#[test]
fn canonical() {
    check("canonical");
}
