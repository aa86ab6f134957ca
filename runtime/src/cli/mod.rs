//! The `draftc` subcommands, one module each. `main.rs` only parses arguments
//! and dispatches here; every command returns an exit code instead of panicking.

pub mod bench;
pub mod calibrate;
pub mod check;
pub mod convert;
pub mod drafter;
pub mod emit;
pub mod fetch;
pub mod generate;
pub mod inspect;
pub mod perf_model;
pub mod plan;
pub mod serve;
pub mod source;
pub mod tuned;
