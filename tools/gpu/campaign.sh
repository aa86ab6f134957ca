#!/usr/bin/env bash
# One prepared GPU training campaign (issue 32, item 4), sized for a short
# window on a lent NVIDIA machine (no Rust toolchain, no network): the target
# generates more self-distilled data on CUDA, the learned drafters train
# (those with shipped weights continue from them, EAGLE since 2026-11-27b;
# EAGLE-3 starts from its initialisation), each is evaluated on the held-out split
# beside its shipped weights where there are some (same sequences, same
# process), the results are benched with `draftc bench spec`
# on CUDA at batch 1 and 16, and a report comes back with the weights.
#
# Staging here: bash tools/gpu/stage-train.sh (.gpu1: the GGUF's first part;
# .gpu2: the rest, draftc --features cuda, the prompt selections;
# STAGE_NO_BUILD=1 takes target/release/draftc as it is). The GGUF,
# draftc and the shipped weights do not fit one call's 64 MiB, so the
# campaign takes three calls, back to back while the machine stays warm
# (30 s after a call), the last one carrying the shipped weights and data in
# the tracked tree:
#
#   bash tools/gpu/slim.sh on 1   # calls 1-2 (carry .gpu1, then .gpu2):
#       bash tools/gpu/campaign.sh unpack /root/stage
#   bash tools/gpu/slim.sh on 3   # call 3 (no carry; timeout_s 600):
#       bash tools/gpu/campaign.sh run /root/stage 400
#   bash tools/gpu/slim.sh off
#
# After tools/gpu/run.sh's calls on the same warm machine and stage (they
# leave the GGUF's parts and bin/draftc there), one call does it:
# bash tools/gpu/stage-campaign.sh (.gpu4: the prompt selections), slim.sh
# on 3, then carry [.gpu4]: bash tools/gpu/campaign.sh run /root/stage 400.
#
# `run STAGE [SECONDS]` (default 400; the whole run ends within about SECONDS
# plus a minute of slack): converts the GGUF with draftc (once per stage),
# generates data into STAGE/data: greedy later-turn answers, every first turn
# answered again at temperature 0.8, later turns answered with their
# conversation before them, each set with its share of the data time
# (resumable: a rerun on the
# same warm machine goes on where the last stopped), trains the drafters
# side by side on the GPU (CAMPAIGN_PARALLEL at a time, default 2 below
# 200 GB of GPU memory, 4 above; in waves when fewer), each with `--time-budget` its share of the time left,
# `--init-from` its shipped weights and `--eval-init` (the shipped weights on
# the same held-out split, before the first step), exporting into its own
# directory (models/weights is never written), then benches the new weights
# and the shipped ones. A drafter that fails or overruns is logged and the
# others go on. $OUT gets at most 8 files, each under 16 MiB: log.txt,
# report.md (the table), beagle.tar, specformer.tar, medusa.tar, spire.tar
# (weights, manifest, loss curve, summary.json, training log), data.tar (the
# new shard sets' manifests, and their shards when they fit) and bench.tar
# (bench reports, report.json). New weights come back whether or not they
# beat the shipped ones; report.md says which do (ship only those).
#
# Toy run on the CPU (the same path at toy size, so that a GPU run finds no
# new bug; about 11 minutes on 2 busy cores, 2 once the target states of
# its records are cached under target/train/features):
#
#   bash tools/gpu/stage-train.sh && bash tools/gpu/campaign.sh unpack /tmp/cstage
#   OUT=/tmp/cout bash tools/gpu/campaign.sh run /tmp/cstage 900 --toy
#
# --toy (or CAMPAIGN_DEVICE=cpu) runs on the CPU: 2 x 64 later-turn prompts,
# 48 sampled first turns and 16 later turns with context, 8 new tokens each, the first 96 records of data/train cut at 128 tokens (not
# data/train-later), at most 40 steps at batch 4 per drafter, one training at
# a time (CAMPAIGN_PARALLEL=2 runs two side by side, as the GPU does), the bench on
# wgpu (lavapipe) with 1 prompt of 4 tokens. Environment: CAMPAIGN_DRAFTERS
# (default "eagle3 eagle beagle medusa": the EAGLE drafters of issue 33;
# SpecFormer and SPIRe gained under 0.001 acc1 on the H100 run,
# docs/bench/cuda-h100/2026-11-26), CAMPAIGN_PARALLEL,
# CAMPAIGN_THREADS (torch threads per training), CAMPAIGN_PYTHON,
# CAMPAIGN_DATA_MIN_S (the least data time a shard set runs with).
set -uo pipefail
cd "$(dirname "$0")/../.."
repo=$(pwd)
what=${1:-}
stage=${2:-}
usage="usage: campaign.sh unpack STAGE | run STAGE [SECONDS] [--toy]"
[ -n "$stage" ] || { echo "$usage" >&2; exit 2; }
budget=400
toy=0
for a in "${@:3}"; do
  case $a in
  --toy) toy=1 ;;
  [0-9]*) budget=$a ;;
  *) echo "campaign.sh: unknown argument $a" >&2; exit 2 ;;
  esac
done
device=${CAMPAIGN_DEVICE:-cuda}
[ $toy = 1 ] && device=cpu
[ "$device" = cpu ] && toy=1
out=${OUT:-/tmp/out}
t0=$(date +%s)
mkdir -p "$stage" "$out"
stage=$(cd "$stage" && pwd)
elapsed() { echo $(($(date +%s) - t0)); }
left() { echo $((budget - $(elapsed))); }
say() { echo "[$(elapsed)s] $*"; }

# The carried files to the stage; `unpack` ends here.
. tools/gpu/unpack.sh

exec > >(tee "$out/log.txt") 2>&1
tee_pid=$!
run="$stage/run"
rm -rf "$run"
mkdir -p "$run" "$stage/data"
export DRAFTC_BIN="$stage/draftc" DRAFTC_CACHE="$stage/cache" PYTHONUNBUFFERED=1
[ $toy = 1 ] && export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp/xdg} && mkdir -p "$XDG_RUNTIME_DIR"
export PYTHONPATH="$repo/tools/train${PYTHONPATH:+:$PYTHONPATH}"
py=${CAMPAIGN_PYTHON:-python3}
[ -z "${CAMPAIGN_PYTHON:-}" ] && [ -x "$repo/.venv-train/bin/python" ] && py="$repo/.venv-train/bin/python"
mdir="$DRAFTC_CACHE/smollm2-135m-instruct/float32"
read -r -a drafters <<<"${CAMPAIGN_DRAFTERS:-eagle3 eagle beagle medusa}"
timing() { echo "$1 $2" >>"$run/timings"; }
say "campaign: ${budget}s budget, device $device$([ $toy = 1 ] && echo ' (toy)'), drafters ${drafters[*]}"

# --- setup: draftc, the converted target, the prompt selections ------------
t=$(date +%s)
# draftc: stage-train.sh's draftc.xz, or the bin/draftc tools/gpu/run.sh
# unpacked from stage.sh's calls into the same stage.
[ -f "$stage/draftc.xz" ] || [ -x "$DRAFTC_BIN" ] || { [ -x "$stage/bin/draftc" ] && DRAFTC_BIN="$stage/bin/draftc"; }
missing=()
[ -f "$stage/draftc.xz" ] || [ -x "$DRAFTC_BIN" ] || missing+=(draftc.xz)
[ -f "$mdir/model.safetensors" ] || [ -f "$stage/model.gguf" ] || [ "$(ls "$stage"/model.gguf.part* 2>/dev/null | wc -l)" = 2 ] ||
  missing+=(model.gguf.part00+01)
[ -d "$DRAFTC_CACHE/prompts" ] || [ -f "$stage/prompts.tar.xz" ] || missing+=(prompts.tar.xz)
if [ ${#missing[@]} != 0 ]; then
  say "FAILED: the stage lacks ${missing[*]}: take the unpack calls again (carry .gpu1, then .gpu2; a machine"
  say "        given back between calls starts bare), or carry .gpu4 (stage-campaign.sh) after run.sh's calls"
  exit 3
fi
if [ -f "$stage/draftc.xz" ] && { [ ! -x "$DRAFTC_BIN" ] || [ "$stage/draftc.xz" -nt "$DRAFTC_BIN" ]; }; then
  xz -dc "$stage/draftc.xz" >"$DRAFTC_BIN.tmp" && chmod +x "$DRAFTC_BIN.tmp" && mv "$DRAFTC_BIN.tmp" "$DRAFTC_BIN"
fi
if [ ! -f "$mdir/model.safetensors" ]; then
  [ -f "$stage/model.gguf" ] || { cat "$stage"/model.gguf.part* >"$stage/model.gguf.tmp" &&
    mv "$stage/model.gguf.tmp" "$stage/model.gguf"; }
  sha256sum "$stage/model.gguf"
  timeout 300 "$DRAFTC_BIN" convert "$stage/model.gguf" --out "$mdir" --dtype f32 --quiet ||
    { say "FAILED: convert (nothing else can run)"; exit 3; }
fi
[ -d "$DRAFTC_CACHE/prompts" ] || tar -C "$DRAFTC_CACHE" -xJf "$stage/prompts.tar.xz" ||
  { say "FAILED: prompt selections (nothing else can run)"; exit 3; }
if [ "$device" = cuda ]; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  gpu_mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
fi
"$py" -c 'import torch, transformers, tokenizers; print("torch", torch.__version__, "cuda", torch.cuda.is_available(),
"transformers", transformers.__version__, "tokenizers", tokenizers.__version__)' || { say "FAILED: python"; exit 3; }
if [ "$device" = cuda ] && ! "$py" -c 'import sys, torch; sys.exit(not torch.cuda.is_available())'; then
  say "FAILED: torch sees no CUDA device (CAMPAIGN_DEVICE=cpu or --toy runs on the CPU)"
  exit 3
fi
timing setup $(($(date +%s) - t))

# Sizes: the GPU campaign, or the toy one on the CPU.
if [ $toy = 1 ]; then
  threads=${CAMPAIGN_THREADS:-2}
  parallel=${CAMPAIGN_PARALLEL:-1}
  bench_reserve=0 # the toy bench runs after the budget, whatever it takes
  # name source start end tokens [data flags]: greedy later turns, then
  # the first turns answered again by sampling, then later turns with their
  # conversation before them.
  data_sets=("toy-new later-turns 25856 25920 8" "toy-old later-turns 6400 6464 8"
    "toy-t0.8 first-turns 0 48 8 --temperature 0.8 --seed 1" "toy-ctx later-turns 0 16 8 --context 96")
  data_flags=(--batch 32 --device cpu --threads "$threads")
  train_flags=(--device cpu --threads "$threads" --steps 40 --records 96 --max-len 128 --recipe batch=4 --ckpt-every 20)
  later=()
  bench_flags=(--backend wgpu --batch 1 --prompt-count 1 --max-tokens 4)
else
  # Four side by side ran out of memory on an H200 (143 GB; each training
  # keeps its target states on the device: ~137 GB in all, 2026-11-26):
  # two waves of two below 200 GB.
  parallel=${CAMPAIGN_PARALLEL:-$([ "${gpu_mib:-0}" -ge 200000 ] && echo 4 || echo 2)}
  threads=${CAMPAIGN_THREADS:-$((16 / parallel))}
  bench_reserve=100
  # The later turns the shipped data has not got (data/train-later holds
  # 0-6,399, data/train-gpu's 19,456 records 6,400-25,855, not committed),
  # then those of data/train-gpu again (regenerated: its shards do not travel).
  # Then every first turn answered again at temperature 0.8 (up to 256
  # tokens; issue 32, item 3), and later turns with their conversation
  # (context up to 768 tokens), trained at a context of 1,024.
  data_sets=("later-25856 later-turns 25856 36278 64" "t0.8-s1 first-turns 0 8178 256 --temperature 0.8 --seed 1"
    "ctx-0 later-turns 0 6400 128 --context 768" "later-6400 later-turns 6400 25856 64")
  data_flags=(--batch 1024 --device cuda --threads 8)
  train_flags=(--device cuda --threads "$threads" --steps 100000 --recipe batch=64 --ckpt-every 250 --max-len 1024)
  later=(--extra-data "$repo/data/train-later")
  bench_flags=(--backend cuda --batch 1,16 --prompt-count 8 --max-tokens 32)
fi

# --- data: the target's greedy answers, batched, resumable in the stage ------
t=$(date +%s)
data_s=$((($(left) - bench_reserve) / 4))
[ $toy = 1 ] && data_s=600
# Four sets of 16 s each wrote nothing on the H200 (the first had not
# printed its plan after 16 s; docs/bench/cuda-h200/2026-11-27b), where one
# set of 57 s wrote 6,144 records (2026-11-27). So only as many sets run,
# in order, as get CAMPAIGN_DATA_MIN_S each (default 40); the others wait
# for a longer window (a rerun on the same stage resumes them).
n_sets=${#data_sets[@]}
min_set=${CAMPAIGN_DATA_MIN_S:-40}
n_run=$((min_set > 0 ? data_s / min_set : n_sets))
[ "$n_run" -gt "$n_sets" ] && n_run=$n_sets
[ "$n_run" -lt 1 ] && n_run=1
say "data: up to ${data_s}s, $n_run of the $n_sets sets"
extra=()
i=0
for spec in "${data_sets[@]}"; do
  read -r name source start end tokens more <<<"$spec"
  # Each set gets its share of the data time, and what the sets before it
  # left unused.
  i=$((i + 1))
  s=$((data_s * i / n_run - ($(date +%s) - t)))
  if [ "$i" -gt "$n_run" ]; then
    say "data $name: not run (${data_s}s of data time gives ${min_set}s to $n_run sets)"
  elif [ "$s" -gt 5 ]; then
    say "data $name: prompts $start-$((end - 1)) of the $source selection, $tokens new tokens ${more:-greedy}, up to ${s}s"
    # shellcheck disable=SC2086
    timeout "$s" "$py" -m draftc_train data --source "$source" --start "$start" --prompts "$end" \
      --max-new-tokens "$tokens" "${data_flags[@]}" $more --out "$stage/data/$name" 2>&1 |
      tr '\r' '\n' | awk 'NR % 10 == 1 || !/^data \|/'
  fi
  if [ -f "$stage/data/$name/MANIFEST.json" ]; then
    # Trained from a copy inside the repository, so the weights manifests
    # name a repo-relative shard set (data/campaign-NAME, shards ignored by
    # git; data/train-gpu2/README.md), not the stage directory.
    rm -rf "$repo/data/campaign-$name" && cp -r "$stage/data/$name" "$repo/data/campaign-$name"
    extra+=(--extra-data "$repo/data/campaign-$name")
    say "data $name: $("$py" -c 'import json, sys; m = json.load(open(sys.argv[1]))
print(m["counts"]["records"], "records,", m["counts"]["response_tokens"], "response tokens,", m["status"])' \
      "$stage/data/$name/MANIFEST.json")"
  elif [ "$i" -le "$n_run" ]; then
    say "data $name: none (training goes on without it)"
  fi
done
timing data $(($(date +%s) - t))

# --- training: every drafter, side by side, each with its share -------------
# Continuing shipped weights keeps the learning rates their last runs used
# (Beagle 3e-4, Medusa 1e-3; the recipes' defaults are now for training from
# initialisation). Beagle's recipe now includes paper 002's regression loss
# (coefficient 10), which its shipped weights were trained without: on the
# GPU that continuation is new (it ships only if it beats the shipped one).
declare -A flags=(
  [beagle]="--lr 3e-4 --prompt-labels --distill 0.5 --recipe train_mask=0"
  [specformer]=""
  [medusa]="--lr 1e-3"
  [spire]=""
  [eagle3]=""
  [eagle]=""
)
waves=$(((${#drafters[@]} + parallel - 1) / parallel))
t=$(date +%s)
window=$(($(left) - bench_reserve - 15))
[ $toy = 1 ] && [ "$window" -lt 240 ] && window=240
share=$((window / waves))
say "train: ${#drafters[@]} drafters, $parallel at a time ($waves waves of ${share}s), $threads threads each"

train_one() { # drafter seconds
  local d=$1 s=$2 dir="$run/$1" init=()
  mkdir -p "$dir/out"
  # From the shipped weights where they exist (EAGLE-3 has none yet: it
  # trains from the module's initialisation).
  [ -f "$repo/models/weights/$d.safetensors" ] && init=(--init-from "$repo/models/weights/$d.safetensors" --eval-init)
  # shellcheck disable=SC2086
  timeout -k 10 $((s + 60)) "$py" -m draftc_train train "$d" "${train_flags[@]}" --time-budget "$s" \
    "${init[@]}" --export-dir "$dir/out" \
    --summary "$dir/summary.json" --work "$dir/work" "${later[@]}" "${extra[@]}" ${flags[$d]:-} \
    >"$dir/log.txt" 2>&1
  echo $? >"$dir/rc"
}
progress_line() { # the last progress or result line of a drafter's log
  tr '\r' '\n' <"$run/$1/log.txt" 2>/dev/null | grep -E '^(train |target hidden|prompt labels|held-out|--time-budget|wrote)' |
    tail -1 | cut -c1-150 | grep . || echo "starting"
}

for ((w = 0; w < waves; w++)); do
  wave=("${drafters[@]:w*parallel:parallel}")
  s=$((share - 5))
  [ "$w" = $((waves - 1)) ] && s=$(($(left) - bench_reserve - 10))
  [ $toy = 1 ] && [ "$s" -lt 120 ] && s=120
  say "wave $((w + 1)): ${wave[*]}, --time-budget ${s}s each"
  pids=()
  for d in "${wave[@]}"; do
    [ -f "$repo/models/weights/$d.safetensors" ] || say "$d: no shipped weights: trained from its initialisation"
    train_one "$d" "$s" &
    pids+=($!)
  done
  while :; do
    running=0
    for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && running=1; done
    [ $running = 0 ] && break
    sleep 15
    for d in "${wave[@]}"; do [ -f "$run/$d/rc" ] || say "  $d: $(progress_line "$d")"; done
    [ "$device" = cuda ] && say "  gpu: $(nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader)"
  done
  for d in "${wave[@]}"; do
    rc=$(cat "$run/$d/rc" 2>/dev/null || echo none)
    if [ "$rc" = 0 ] && [ -f "$run/$d/summary.json" ]; then
      say "$d: done; $("$py" -m draftc_train campaign-report "$run" --line "$d")"
    else
      say "FAILED: $d (exit $rc); the end of its log:"
      tr '\r' '\n' <"$run/$d/log.txt" | tail -15 | sed 's/^/    /'
    fi
  done
done
timing train $(($(date +%s) - t))

# --- bench: the new weights, then the shipped ones, on the target's device ---
# The new weights are benched from a copy of the descriptions beside them
# (draftc finds a drafter's weights in weights/ next to its .draft file), so
# models/weights is left alone.
t=$(date +%s)
mkdir -p "$run/models/weights"
new=() shipped=()
for d in "${drafters[@]}"; do
  f="$run/$d/out/$d.safetensors"
  [ -f "$f" ] || continue
  cp "models/$d.draft" "$run/models/" && cp "$f" "$run/models/weights/" && new+=(--drafter "$run/models/$d.draft")
  [ -f "models/weights/$d.safetensors" ] && shipped+=(--drafter "models/$d.draft")
done
bench() { # name seconds drafter flags...
  local name=$1 s=$2
  shift 2
  say "bench $name: up to ${s}s"
  timeout -k 5 "$s" "$DRAFTC_BIN" bench spec "${bench_flags[@]}" --model "$mdir" --prompts mt-bench --tree chain \
    --budget 4 --lookup off --out "$run/bench/$name" --quiet "$@" >"$run/bench-$name.md" 2>"$run/bench-$name.err"
  local rc=$?
  cat "$run/bench-$name.md"
  [ $rc = 0 ] || { say "FAILED: bench $name (exit $rc)"; tail -5 "$run/bench-$name.err"; }
}
if [ ${#new[@]} = 0 ]; then
  say "bench: no new weights"
else
  # 55 % of the time left for the new weights (at least 45 s), the rest for
  # the shipped ones; the toy bench takes what it takes.
  s=$(($(left) * 55 / 100))
  [ "$s" -lt 45 ] && s=45
  [ $toy = 1 ] && s=900
  bench new "$s" "${new[@]}"
  s=$(($(left) - 5))
  [ $toy = 1 ] && s=900
  if [ ${#shipped[@]} = 0 ]; then
    say "bench shipped: none of these drafters ships weights"
  elif [ "$s" -ge 20 ]; then bench shipped "$s" "${shipped[@]}"; else say "bench shipped: skipped (${s}s left)"; fi
fi
timing bench $(($(date +%s) - t))

# --- report and what comes back ---------------------------------------------
say "report"
"$py" -m draftc_train campaign-report "$run" --drafters "${drafters[*]}" --budget "$budget" \
  --out "$out/report.md" --json "$run/report.json" || say "FAILED: report"
cat "$out/report.md" 2>/dev/null
limit=$((15 * 1024 * 1024))
for d in "${drafters[@]}"; do
  [ -d "$run/$d" ] || continue
  tar -C "$run/$d" -cf "$out/$d.tar" --exclude work . 2>/dev/null
  [ "$(stat -c %s "$out/$d.tar")" -le $limit ] || { say "$d.tar over 15 MiB: weights left out"; tar -C "$run/$d" -cf "$out/$d.tar" --exclude work --exclude '*.safetensors' .; }
done
tar -C "$stage" -cf "$out/data.tar" data 2>/dev/null
if [ "$(stat -c %s "$out/data.tar" 2>/dev/null || echo 0)" -gt $limit ]; then
  say "data.tar over 15 MiB: manifests only"
  (cd "$stage" && find data -name MANIFEST.json -print0 | tar -cf "$out/data.tar" --null -T -)
fi
(cd "$run" && tar -cf "$out/bench.tar" bench bench-*.md bench-*.err report.json timings 2>/dev/null)
ls -la "$out"
say "done"
# Let tee write the log's end before $OUT is collected.
exec >&- 2>&-
for _ in $(seq 50); do kill -0 "$tee_pid" 2>/dev/null || break; sleep 0.1; done
