//! Every kernel test file as one binary, built only with `--features
//! cuda-tests`: a lent GPU machine has no Rust toolchain, so
//! tools/gpu/stage.sh carries the tests there as programs, and one binary
//! (thirteen files linked once instead of thirteen times) fits a device
//! call beside the model.
//! Without the feature only the check that no file is missing from the
//! list runs; the files run as their own binaries as usual.

#[cfg(feature = "cuda-tests")]
#[path = "argmax_topk.rs"]
mod argmax_topk;
#[cfg(feature = "cuda-tests")]
#[path = "attention/main.rs"]
mod attention;
#[cfg(feature = "cuda-tests")]
#[path = "cuda_graph.rs"]
mod cuda_graph;
#[cfg(feature = "cuda-tests")]
#[path = "elementwise.rs"]
mod elementwise;
#[cfg(feature = "cuda-tests")]
#[path = "embedding.rs"]
mod embedding;
#[cfg(feature = "cuda-tests")]
#[path = "head_norm.rs"]
mod head_norm;
#[cfg(feature = "cuda-tests")]
#[path = "kept.rs"]
mod kept;
#[cfg(feature = "cuda-tests")]
#[path = "kv.rs"]
mod kv;
#[cfg(feature = "cuda-tests")]
#[path = "layer_sum.rs"]
mod layer_sum;
#[cfg(feature = "cuda-tests")]
#[path = "linear.rs"]
mod linear;
#[cfg(feature = "cuda-tests")]
#[path = "linear_rope.rs"]
mod linear_rope;
#[cfg(feature = "cuda-tests")]
#[path = "probe.rs"]
mod probe;
#[cfg(feature = "cuda-tests")]
#[path = "replay.rs"]
mod replay;
#[cfg(feature = "cuda-tests")]
#[path = "rms_norm.rs"]
mod rms_norm;
#[cfg(feature = "cuda-tests")]
#[path = "rope.rs"]
mod rope;
#[cfg(feature = "cuda-tests")]
#[path = "sampling.rs"]
mod sampling;
#[cfg(feature = "cuda-tests")]
#[path = "softmax.rs"]
mod softmax;
#[cfg(feature = "cuda-tests")]
#[path = "tree.rs"]
mod tree;
#[cfg(feature = "cuda-tests")]
#[path = "tree_frontier.rs"]
mod tree_frontier;

/// A new kernel test file (or test directory with a `main.rs`) must join
/// the list above, or the GPU run would silently skip it.
#[test]
fn every_kernel_test_file_is_included() {
    let me = include_str!("cuda_all.rs");
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    for entry in std::fs::read_dir(&dir).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name().to_string_lossy().into_owned();
        let file = if entry.path().join("main.rs").is_file() {
            format!("{name}/main.rs")
        } else if name.ends_with(".rs") && name != "cuda_all.rs" {
            name
        } else {
            continue;
        };
        assert!(
            me.contains(&format!("#[path = \"{file}\"]")),
            "ops/tests/{file} is missing from ops/tests/cuda_all.rs"
        );
    }
}
