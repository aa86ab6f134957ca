#!/usr/bin/env bash
# The main job, with its set-up. Today: check every description file against
# the SmolLM2-135M preset and show what draftc derives from SpecFormer's
# (typed graph, parameter split, FLOPs). Speculative generation against the
# real target arrives with the runtime (see README "Status").
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v cargo >/dev/null; then
  echo "error: cargo not found; install a stable Rust toolchain (https://rustup.rs) and re-run" >&2
  exit 1
fi
cargo build --release -p draftc-runtime --bin draftc
./target/release/draftc check models/*.draft
./target/release/draftc inspect models/specformer.draft
