//! Fusion pays: for SpecFormer, Beagle and the Llama target the fused plan
//! has fewer launches and moves fewer bytes than the unfused one. The
//! numbers are printed (`cargo test -- --nocapture`).

mod support;

use draftc_codegen::Totals;
use support::{checked_trace, compile_model, small};

fn totals(name: &str, fuse: bool) -> Totals {
    checked_trace(&compile_model(name), &small(fuse))
        .plan
        .totals
}

#[test]
fn fused_plans_launch_less_and_move_fewer_bytes() {
    println!(
        "{:<12} {:>9} {:>9} {:>16} {:>16}",
        "model", "launches", "unfused", "bytes moved", "unfused"
    );
    for name in [
        "specformer",
        "beagle",
        "llama",
        "spire",
        "medusa",
        "magicdec",
    ] {
        let (f, u) = (totals(name, true), totals(name, false));
        println!(
            "{name:<12} {:>9} {:>9} {:>16} {:>16}",
            f.launches,
            u.launches,
            f.bytes_moved(),
            u.bytes_moved()
        );
        // Fusion never adds work; for the three models below it must remove some.
        assert!(
            f.launches <= u.launches && f.bytes_moved() <= u.bytes_moved(),
            "{name}"
        );
        if ["specformer", "beagle", "llama"].contains(&name) {
            assert!(
                f.launches < u.launches,
                "{name}: {} launches fused vs {} unfused",
                f.launches,
                u.launches
            );
            assert!(
                f.bytes_moved() < u.bytes_moved(),
                "{name}: {} bytes fused vs {} unfused",
                f.bytes_moved(),
                u.bytes_moved()
            );
        }
        // Fusion changes how activations move, never which tensors are bound.
        let table = |fuse| {
            let plan = checked_trace(&compile_model(name), &small(fuse)).plan;
            let mut t = draftc_codegen::pipeline::weights(&plan).expect("consistent weights");
            t.sort_by(|a, b| a.name.cmp(&b.name));
            t
        };
        assert_eq!(table(true), table(false), "{name}");
    }
}

#[test]
fn fused_plan_carries_unfused_totals() {
    let g = compile_model("specformer");
    let plan = draftc_codegen::plan(&g, &support::target(), &small(true)).expect("plans");
    let unfused = totals("specformer", false);
    assert_eq!(plan.unfused, Some(unfused));
    let text = plan.to_string();
    assert!(text.contains("unfused"), "{text}");
}
