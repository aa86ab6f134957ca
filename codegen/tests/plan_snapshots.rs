//! The fused plan of every model in `models/` (t = 16, batch 1, context 0,
//! f32), as insta snapshots under `snapshots/plans/`. A diff here means the
//! fusion policy, the lowering or the cost model changed: review it like
//! code. (Emitted kernel source is snapshotted separately.)

mod support;

use support::{checked_trace, compile_model, graph_models, repo, small, target};

#[test]
fn plan_of_every_model() {
    let models = graph_models();
    assert!(models.len() >= 6, "{models:?}");
    let mut settings = insta::Settings::clone_current();
    settings.set_snapshot_path(repo().join("snapshots/plans"));
    settings.set_prepend_module_to_snapshot(false);
    settings.bind(|| {
        for name in &models {
            let g = compile_model(name);
            checked_trace(&g, &small(true));
            let plan = draftc_codegen::plan(&g, &target(), &small(true)).expect("plans");
            insta::assert_snapshot!(name.as_str(), plan.to_string());
        }
    });
}

#[test]
fn plans_are_deterministic() {
    for name in graph_models() {
        let g = compile_model(&name);
        let a = draftc_codegen::plan(&g, &target(), &small(true)).expect("plans");
        let b = draftc_codegen::plan(&g.clone(), &target(), &small(true)).expect("plans");
        assert_eq!(a, b, "{name}");
        assert_eq!(a.to_string(), b.to_string(), "{name}");
    }
}
