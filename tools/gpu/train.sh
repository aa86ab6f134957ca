#!/usr/bin/env bash
# On a lent NVIDIA machine (no Rust toolchain, no network): generates more
# self-distilled data with the target and trains Beagle on it, from what
# tools/gpu/stage-train.sh staged here. The working tree and the GGUF do not
# fit one device call (64 MiB), so it takes two, the second while the
# machine is still warm:
#
#   bash tools/gpu/train.sh unpack STAGE          # call 1: keep the GGUF's first part
#   bash tools/gpu/train.sh run STAGE [SECONDS]   # call 2: the rest, then all steps
#
# `run` converts the GGUF with draftc, smoke-tests data generation and
# training on CUDA (it stops if training fails, and goes on without new
# data if generation fails), generates the
# later-turn responses not yet in data/train-later (into STAGE/train-gpu,
# copied to data/train-gpu),
# continues Beagle from its shipped weights on all data within the time
# left of SECONDS (default 560), and benches the result with draftc on CUDA
# at batch 1 and 16. What comes back in $OUT: log.txt, the weights and
# manifest, the loss curve, train-gpu.tar (shards + MANIFEST.json) and
# spec.tar (bench report).
set -uo pipefail
cd "$(dirname "$0")/../.."
what=$1
stage=$2
budget=${3:-560}
out=${OUT:-/tmp/out}
t0=$(date +%s)
mkdir -p "$stage" "$out"
left() { echo $((budget - ($(date +%s) - t0))); }
say() { echo "[$(($(date +%s) - t0))s] $*"; }

usage="usage: train.sh unpack|run STAGE [SECONDS]"
# The carried files to the stage; `unpack` ends here.
. tools/gpu/unpack.sh

exec > >(tee "$out/log.txt") 2>&1
repo=$(pwd)
export DRAFTC_BIN="$stage/draftc" DRAFTC_CACHE="$stage/cache" PYTHONUNBUFFERED=1
mdir="$DRAFTC_CACHE/smollm2-135m-instruct/float32"
xz -dc "$stage/draftc.xz" >"$DRAFTC_BIN" && chmod +x "$DRAFTC_BIN"
cat "$stage"/model.gguf.part* >"$stage/model.gguf"
sha256sum "$stage/model.gguf"
"$DRAFTC_BIN" convert "$stage/model.gguf" --out "$mdir" --dtype f32 --quiet || exit 3
sha256sum "$mdir/model.safetensors"
mkdir -p "$DRAFTC_CACHE" && tar -C "$DRAFTC_CACHE" -xJf "$stage/prompts.tar.xz"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
python3 -c 'import torch, transformers, tokenizers; print("torch", torch.__version__, "transformers", transformers.__version__, "tokenizers", tokenizers.__version__)'

cd tools/train
py="python3 -m draftc_train"
threads=(--threads 8)
beagle=(--prompt-labels --distill 0.5 --recipe train_mask=0)
say "smoke: data and training on CUDA"
timeout 150 $py data --source later-turns --start 6400 --prompts 6464 --max-new-tokens 8 --batch 64 \
  --device cuda "${threads[@]}" --out /tmp/smoke-data 2>&1 | tr '\r' '\n' | grep -v '^data |' || true
smoke_data=(--extra-data /tmp/smoke-data)
[ -f /tmp/smoke-data/MANIFEST.json ] || { say "SMOKE FAILED: data (training goes on without new data)"; smoke_data=(); }
timeout 150 $py train beagle --device cuda "${threads[@]}" --steps 4 --records 64 --no-export --work /tmp/smoke-train \
  --recipe batch=4 --ckpt-every 2 "${smoke_data[@]}" "${beagle[@]}" 2>&1 | tr '\r' '\n' |
  grep -v '^[a-z -]* | ' || true
[ -f /tmp/smoke-train/ckpt.pt ] || { say "SMOKE FAILED: train"; exit 3; }

# Data: what is left of the later-turn selection (6,400 of it are data/train-later).
# Written under the stage, which outlives a call (each call re-syncs the
# working tree and would delete data/train-gpu), so a later call resumes it.
data_s=$(($(left) / 4))
[ ${#smoke_data[@]} = 0 ] && data_s=0
say "data: up to ${data_s}s"
[ "$data_s" -gt 0 ] && timeout "$data_s" $py data --source later-turns --start 6400 --prompts 36278 --max-new-tokens 64 \
  --batch 1024 --device cuda "${threads[@]}" --out "$stage/train-gpu" 2>&1 | tr '\r' '\n' | awk 'NR % 20 == 1 || !/^data \|/'
rm -rf "$repo/data/train-gpu"
[ -d "$stage/train-gpu" ] && cp -r "$stage/train-gpu" "$repo/data/train-gpu"
extra=(--extra-data "$repo/data/train-later")
[ -f "$repo/data/train-gpu/MANIFEST.json" ] && extra+=(--extra-data "$repo/data/train-gpu")
tar -C "$repo/data" -cf "$out/train-gpu.tar" train-gpu 2>/dev/null

# Training: continue the shipped Beagle; leave ~150 s for export and the bench.
train_s=$(($(left) - 150))
say "train: ${train_s}s"
timeout $((train_s + 60)) $py train beagle --device cuda "${threads[@]}" --steps 100000 --time-budget "$train_s" \
  --init-from "$repo/models/weights/beagle.safetensors" --lr 3e-4 --recipe batch=64 --ckpt-every 250 \
  --work /tmp/work-beagle "${extra[@]}" "${beagle[@]}" 2>&1 | tr '\r' '\n' |
  awk 'NR % 25 == 1 || !/^(train beagle|target hidden|prompt labels) \|/'
cp "$repo"/models/weights/beagle.{safetensors,json,loss.svg} "$out"/ 2>/dev/null

# Bench: the Beagle now in models/weights, on CUDA, beside autoregressive decoding.
bench_s=$(($(left) - 10))
say "bench: ${bench_s}s"
cd "$repo"
timeout "$bench_s" "$DRAFTC_BIN" bench spec --backend cuda --model "$mdir" --prompts mt-bench --prompt-count 8 \
  --batch 1,16 --max-tokens 32 --drafter models/beagle.draft --tree chain --budget 3 \
  --confidence 0.05,0.3 --lookup off --lookup 2 --out /tmp/spec --quiet 2>&1 | tail -40
tar -C /tmp -cf "$out/spec.tar" spec 2>/dev/null
say "done"
