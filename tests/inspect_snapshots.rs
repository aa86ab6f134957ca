//! `draftc inspect` output for every model file, as insta snapshots under
//! `snapshots/inspect/`. A diff here means a model file, the language or the
//! statistics changed: review it like code.

use draftc_tests::{compile_model, graph_models, repo, smollm2};

#[test]
fn inspect_report_of_every_model() {
    let models = graph_models();
    assert!(models.len() >= 6, "{models:?}");
    let mut settings = insta::Settings::clone_current();
    settings.set_snapshot_path(repo().join("snapshots/inspect"));
    settings.set_prepend_module_to_snapshot(false);
    settings.bind(|| {
        for name in &models {
            let g = compile_model(name);
            let report = draftc_runtime::cli::inspect::report(&g, &smollm2(), 1024);
            insta::assert_snapshot!(name.as_str(), report);
        }
    });
}
