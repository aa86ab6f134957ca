//! The `draftc` subcommands, one module each. `main.rs` only parses arguments
//! and dispatches here; every command returns an exit code instead of panicking.
