//! The slow tier runs the prepared GPU training campaign
//! (`tools/gpu/campaign.sh`) end to end at toy size on the CPU, so that a
//! lent GPU finds no new bug in it: data generation, every default drafter's
//! training (EAGLE and EAGLE-3 from their initialisation, the others from
//! their shipped weights), the held-out evaluation, the bench on lavapipe and
//! the report. Needs the training virtualenv and the converted target;
//! without the virtualenv it says so and passes.

mod tiny;

use std::process::Command;

use draftc_runtime::model::convert::ConvertOptions;
use draftc_runtime::model::fetch::{cache_dir, fetch, SMOLLM2_135M_INSTRUCT};
use draftc_runtime::model::safetensors_io::WeightDtype;

#[test]
#[ignore = "slow: the GPU campaign at toy size on the CPU (about 15 minutes on 2 cores); needs the training virtualenv"]
fn gpu_campaign_runs_at_toy_size_on_the_cpu() {
    let Some(_py) = tiny::python() else { return };
    let opts = ConvertOptions {
        dtype: WeightDtype::F32,
        progress: false,
    };
    let report = fetch(&SMOLLM2_135M_INSTRUCT, &cache_dir().unwrap(), &opts).unwrap();
    let stage = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir().unwrap();
    // The stage as the unpack calls leave it: draftc, the converted target
    // and the prompt selections (the training tools build those from the
    // wheels here; the campaign's own cache is the stage's).
    std::fs::copy(env!("CARGO_BIN_EXE_draftc"), stage.path().join("draftc")).unwrap();
    let cache = stage.path().join("cache");
    let mdir = cache.join("smollm2-135m-instruct");
    std::fs::create_dir_all(&mdir).unwrap();
    std::os::unix::fs::symlink(&report.convert.out_dir, mdir.join("float32")).unwrap();
    let prep = tiny::run_checked(
        Command::new(tiny::repo().join(".venv-train/bin/python"))
            .current_dir(tiny::repo().join("tools/train"))
            .args(["-c", PROMPTS]),
    );
    assert!(prep.0, "prompt selections:\n{}", prep.1);
    std::os::unix::fs::symlink(cache_dir().unwrap().join("prompts"), cache.join("prompts"))
        .unwrap();
    let (ok, text) = tiny::run_checked(
        Command::new("bash")
            .current_dir(tiny::repo())
            .env("OUT", out.path())
            .env("XDG_RUNTIME_DIR", std::env::temp_dir())
            .args(["tools/gpu/campaign.sh", "run"])
            .arg(stage.path())
            .args(["900", "--toy"]),
    );
    println!("{text}");
    assert!(ok, "campaign.sh failed");
    let report = std::fs::read_to_string(out.path().join("report.md")).unwrap();
    for d in ["eagle3", "eagle", "beagle", "medusa"] {
        let row = report
            .lines()
            .find(|l| l.starts_with(&format!("| {d} |")))
            .unwrap_or_else(|| panic!("no row for {d}:\n{report}"));
        assert!(row.trim_end().ends_with("| ok |"), "{d}: {row}");
        assert!(
            out.path().join(format!("{d}.tar")).is_file(),
            "{d}.tar did not come back"
        );
    }
    assert!(!text.contains("FAILED"), "a stage failed:\n{text}");
}

/// Builds (or finds cached) the ShareGPT prompt selections the campaign's
/// data stage reads, and the conversations its later turns with context
/// read where the wheel is not (the stage's cache has none), as the GPU
/// stage scripts write them.
const PROMPTS: &str = "
from tokenizers import Tokenizer
from draftc_train import prompts as P, data as D
tok = Tokenizer.from_file(str(D.default_model_dir() / 'tokenizer.json'))
for s in P.SOURCES:
    P.training_prompts(tok, s)
P.write_contexts(tok, 6400)
";
