//! draftc-runtime: weights, tokenizer, executor, KV cache, speculative decoding
//! engine, and the command implementations behind the `draftc` binary.

pub mod bench;
pub mod cli;
pub mod device;
pub mod engine;
pub mod exec;
pub mod model;
pub mod perf_model;
pub mod plot;
pub mod speculation;
