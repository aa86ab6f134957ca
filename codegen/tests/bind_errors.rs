//! The binder checks the plan's weight table against the tensors a weights
//! file holds before anything runs; each error names the tensor, what was
//! expected and what was found. Target-owned weights bind to the target's
//! tensors through the model file's exports.

mod support;

use draftc_codegen::bind::{check, AvailableTensor, BindError};
use draftc_codegen::pipeline::weights;
use support::{compile_model, small, target};

fn table(name: &str) -> Vec<draftc_codegen::bind::WeightSpec> {
    let plan = draftc_codegen::plan(&compile_model(name), &target(), &small(true)).expect("plans");
    weights(&plan).expect("consistent")
}

fn all_of(t: &[draftc_codegen::bind::WeightSpec]) -> Vec<AvailableTensor> {
    t.iter()
        .map(|w| AvailableTensor {
            name: w.name.clone(),
            shape: w.shape.clone(),
            dtype: "F32".into(),
        })
        .collect()
}

#[test]
fn complete_file_binds() {
    for name in ["specformer", "beagle", "llama", "magicdec"] {
        let t = table(name);
        assert_eq!(check(&t, &all_of(&t)), Ok(()), "{name}");
    }
}

#[test]
fn target_owned_weights_use_the_exports() {
    // Beagle's `target.embed` binds the target's embedding by its export.
    let names: Vec<String> = table("beagle").into_iter().map(|w| w.name).collect();
    assert!(
        names.contains(&"model.embed_tokens.weight".to_string()),
        "{names:?}"
    );
    // A reduced draft vocabulary reads the head rows the runtime gathers.
    let names: Vec<String> = table("specformer").into_iter().map(|w| w.name).collect();
    assert!(
        names.contains(&draftc_codegen::bind::DRAFT_VOCAB_HEAD.to_string())
            && !names.contains(&"model.embed_tokens.weight".to_string()),
        "{names:?}"
    );
    let beagle: Vec<String> = table("beagle").into_iter().map(|w| w.name).collect();
    assert!(
        beagle.contains(&"model.norm.weight".to_string()),
        "{beagle:?}"
    );
    // Tied weights appear once: llama's embedding and LM head.
    let llama = table("llama");
    let tied = llama
        .iter()
        .filter(|w| w.name == "model.embed_tokens.weight")
        .count();
    assert_eq!(tied, 1);
}

#[test]
fn missing_tensor_is_named_with_its_expected_shape() {
    let t = table("specformer");
    let mut avail = all_of(&t);
    avail.retain(|a| a.name != "downsample.weight");
    let errs = check(&t, &avail).expect_err("missing");
    assert_eq!(
        errs,
        vec![BindError::Missing {
            tensor: "downsample.weight".into(),
            expected: vec![576, 2304],
            expected_dtype: "f32"
        }]
    );
    assert_eq!(
        errs[0].to_string(),
        "weight `downsample.weight` is missing: expected [576, 2304] f32"
    );
}

#[test]
fn wrong_shape_names_expected_and_found() {
    let t = table("specformer");
    let mut avail = all_of(&t);
    for a in &mut avail {
        if a.name == "positional_ffn.bias" {
            a.shape = vec![576];
        }
    }
    let errs = check(&t, &avail).expect_err("wrong shape");
    assert_eq!(errs.len(), 1);
    assert_eq!(
        errs[0].to_string(),
        "weight `positional_ffn.bias` has the wrong shape: expected [2304], found [576]"
    );
}

#[test]
fn wrong_dtype_names_expected_and_found() {
    let t = table("beagle");
    let mut avail = all_of(&t);
    for a in &mut avail {
        if a.name == "mlp.down_proj.weight" {
            a.dtype = "BF16".into();
        }
    }
    let errs = check(&t, &avail).expect_err("wrong dtype");
    assert_eq!(
        errs.iter().map(ToString::to_string).collect::<Vec<_>>(),
        vec!["weight `mlp.down_proj.weight` has the wrong dtype: expected f32, found BF16"]
    );
}

#[test]
fn every_problem_is_reported() {
    let t = table("beagle");
    let errs = check(&t, &[]).expect_err("nothing available");
    assert_eq!(errs.len(), t.len());
}
