#!/usr/bin/env bash
# Here (with a Rust toolchain): builds what tools/gpu/run.sh runs on a lent
# NVIDIA machine, which has no Rust toolchain and no network, and stages it
# in three carry folders small enough for one device call each (64 MiB):
#   .gpu1/  draftc and draftc-serve (release, --features cuda), xz-compressed;
#           half the GGUF
#   .gpu2/  the other half of the GGUF
#   .gpu3/  the kernel tests (--features cuda-tests) as one binary, xz-compressed
# The folders are git-ignored (.git/info/exclude). The tracked tree travels
# with every call too and is larger than what is left beside .gpu1 or .gpu2:
# take those calls with `tools/gpu/slim.sh on 1` (call with .gpu1) and
# `on 2` (.gpu2 and .gpu3), and `slim.sh off` afterwards:
#   call 1: carry [.gpu1]        bash tools/gpu/run.sh unpack /root/stage
#   call 2: carry [.gpu2, .gpu3] bash tools/gpu/run.sh bench /root/stage 300
#   call 3: carry []             bash tools/gpu/run.sh spec /root/stage 150
#           (`slim.sh on 4`: EAGLE's and Beagle's weights travel; issue 56's
#           EAGLE-at-batch-1 bar, replay and graphs on)
# (the second within the 30 s a machine stays warm). `on 2` leaves out the
# weights of SpecFormer, SPIRe, Medusa and EAGLE (a bench of those needs them
# carried) and the training data. Measured on 2026-11-29: call 1 carries
# 4.6 MB of tracked files beside .gpu1's 60.7 MB, call 2 11.9 MB beside
# 51.5 MB (64 MiB = 67.1 MB a call).
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p "$(git rev-parse --git-dir)/info"
exclude="$(git rev-parse --git-dir)/info/exclude"
grep -qsx '/.gpu1/' "$exclude" || printf '/.gpu1/\n/.gpu2/\n/.gpu3/\n' >>"$exclude"
rm -rf .gpu1 .gpu2 .gpu3
mkdir -p .gpu1 .gpu2 .gpu3

cargo build --release -p draftc-runtime -p draftc-serve --features cuda
strip -o .gpu1/draftc target/release/draftc
xz -T2 -6 .gpu1/draftc
# The server binary `draftc serve` runs (beside draftc in the stage's bin/),
# for run.sh's serving benchmark. In call 1, which has room for it (slim
# `on 1` leaves about 3 MB of tracked files beside .gpu1's 55 MB).
strip -o .gpu1/draftc-serve target/release/draftc-serve
xz -T2 -6 .gpu1/draftc-serve

# One binary holding every kernel test file (ops/tests/cuda_all.rs): thirteen
# separately linked binaries would not fit a device call.
cargo test --release -p draftc-ops --features cuda-tests --test cuda_all --no-run --message-format=json 2>/dev/null |
  python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["test"]:
        print(m["target"]["name"], m["executable"])
' | while read -r name exe; do
  strip -o ".gpu3/ops-$name" "$exe"
  xz -T2 -6 ".gpu3/ops-$name"
done

gguf=$(ls "${DRAFTC_CACHE:-$HOME/.cache/draftc}"/smollm2-135m-instruct/*.gguf)
split -n 2 -d "$gguf" .gpu1/model.gguf.part
mv .gpu1/model.gguf.part01 .gpu2/
du -sh .gpu1 .gpu2 .gpu3
