#!/usr/bin/env bash
# On a lent NVIDIA machine (no Rust toolchain, no network): runs what
# tools/gpu/stage.sh prepared here and the device tool carried there.
#
#   bash tools/gpu/run.sh stage   STAGE   # only unpack what this call carried
#   bash tools/gpu/run.sh model   STAGE   # reassemble + convert the GGUF
#   bash tools/gpu/run.sh tests   STAGE   # the kernel tests on CUDA
#   bash tools/gpu/run.sh sanitize STAGE  # the same under compute-sanitizer memcheck
#                                         # (global memory only: shared-memory reads
#                                         # past an array but inside the block's
#                                         # allocation go unseen)
#   bash tools/gpu/run.sh bench   STAGE   # decode + speculative benches on CUDA,
#                                         # and transformers' decode on the same weights
#
# STAGE is a directory outside the repository that survives between calls
# while the machine stays warm (e.g. /root/stage). Results go to $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
what=$1
stage=$2
out=${OUT:-/tmp/out}
mkdir -p "$stage" "$out"
export PATH="$stage/bin:$PATH"

unpack() { # carried .xz programs into $stage/bin, GGUF parts into $stage; once per carry
  mkdir -p "$stage/bin"
  for d in "$@"; do
    [ -d "$d" ] || continue
    for f in "$d"/*.xz; do
      [ -e "$f" ] || continue
      bin="$stage/bin/$(basename "$f" .xz)"
      [ "$bin" -nt "$f" ] || { xz -dc "$f" >"$bin" && chmod +x "$bin"; }
    done
    for f in "$d"/*.part*; do
      [ -e "$f" ] || continue
      [ "$stage/$(basename "$f")" -nt "$f" ] || cp "$f" "$stage/"
    done
  done
}

case $what in
stage)
  unpack .gpu1 .gpu2 .gpu3
  ls -la "$stage" "$stage/bin"
  ;;
model)
  unpack .gpu1 .gpu2 .gpu3
  if [ ! -f "$stage/model/f32/model.safetensors" ]; then
    cat "$stage"/*.gguf.part* >"$stage/model.gguf"
    sha256sum "$stage/model.gguf"
    draftc convert "$stage/model.gguf" --out "$stage/model/f32" --dtype f32 --quiet
  fi
  ls -la "$stage/model/f32"
  nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem --format=csv
  ;;
tests)
  unpack .gpu1 .gpu2 .gpu3
  status=0
  for t in "$stage"/bin/ops-*; do
    name=$(basename "$t")
    if "$t" --test-threads 4 >"$out/$name.log" 2>&1; then
      echo "PASS $name: $(grep -h '^test result' "$out/$name.log" | tail -1)"
    else
      status=1
      echo "FAIL $name"
      grep -h -A20 'panicked\|FAILED\|failures:' "$out/$name.log" | head -60
    fi
  done
  exit $status
  ;;
sanitize)
  unpack .gpu1 .gpu2 .gpu3
  status=0
  for t in "$stage"/bin/ops-*; do
    name=$(basename "$t")
    if timeout 120 compute-sanitizer --tool memcheck --error-exitcode 99 "$t" --test-threads 1 \
      >"$out/$name.memcheck" 2>&1; then
      echo "CLEAN $name"
    else
      status=1
      echo "ERROR $name (exit $?)"
      grep -h -m5 -A6 'Invalid\|ERROR SUMMARY\|panicked' "$out/$name.memcheck"
    fi
  done
  exit $status
  ;;
bench)
  unpack .gpu1 .gpu2 .gpu3
  model="$stage/model/f32"
  # GPU kernel layouts (plane linears, plane decode attention) in f16 and
  # f32; the tables include launches per step and host us per launch.
  for dt in f16 f32; do
    mkdir -p "$out/$dt"
    draftc bench decode --backend cuda --dtype $dt --model "$model" --batch 1,4,16,64 --steps 32 \
      --out "$out/$dt" 2>"$out/$dt/decode.err" | tee "$out/$dt/decode.md"
    python3 tools/gpu/hf_decode.py "$model" 1,4,16,64 32 $dt 2>"$out/$dt/hf_decode.err" \
      | tee "$out/$dt/hf_decode.md"
  done
  draftc bench spec --backend cuda --prompts mt-bench --prompt-count 16 --model "$model" \
    --batch 1,16 --budget 3,4 --max-tokens 48 --out "$out" 2>"$out/spec.err" | tee "$out/spec.md"
  ;;
*)
  echo "usage: run.sh stage|model|tests|bench STAGE" >&2
  exit 2
  ;;
esac
