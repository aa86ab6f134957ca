#!/usr/bin/env bash
# The whole test suite, with its set-up: installs Mesa's lavapipe (Vulkan on
# the CPU, for CubeCL's wgpu runtime) when it is missing, then runs every
# default test of the workspace, formatting and lints.
#
#   bash tools/test.sh            # default suite (downloads only the pinned
#                                 # OpenAI client into .venv-serve)
#   bash tools/test.sh --ignored  # also the slow tests (real model download)
set -euo pipefail
cd "$(dirname "$0")/.."

source tools/setup.sh
ensure_lavapipe
if ! command -v cargo >/dev/null; then
  echo "error: cargo not found; install a stable Rust toolchain (https://rustup.rs) and re-run" >&2
  exit 1
fi

export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
# A clean CI build gains nothing from incremental state (about 1 GB of it).
if [ "${CI:-}" = "true" ]; then
  export CARGO_INCREMENTAL=0
fi
# The serving tests' client tools (the official OpenAI client, pinned, no
# torch) in .venv-serve.
bash tools/serve/venv.sh >/dev/null

echo "==> cargo fmt --check"
cargo fmt --all -- --check
echo "==> cargo test --workspace"
cargo test --workspace --no-fail-fast
if [ "${1:-}" = "--ignored" ]; then
  ensure_pip
  echo "==> slow tests (cargo test --workspace -- --ignored)"
  cargo test --workspace --lib --bins --tests --no-fail-fast -- --ignored
fi
echo "==> cargo clippy --workspace --all-targets -- -D warnings"
cargo clippy --workspace --all-targets -- -D warnings
echo "==> lines of Rust per crate"
for c in ir ops codegen runtime serve tests; do
  printf '  %-8s %6s\n' "$c" "$(find "$c" -name '*.rs' -print0 | xargs -0 cat 2>/dev/null | wc -l)"
done
