#!/usr/bin/env bash
# On a lent NVIDIA machine (no Rust toolchain, no network): runs what
# tools/gpu/stage.sh prepared here and the device tool carried there.
#
#   bash tools/gpu/run.sh unpack  STAGE   # call 1 (carries .gpu1): unpack only
#   bash tools/gpu/run.sh spec    STAGE [SECONDS]
#                                         # call 3 (slim.sh on 4): EAGLE and Beagle
#                                         # spec benches, default 150 s, after bench
#   bash tools/gpu/run.sh bench   STAGE [SECONDS]
#                                         # call 2 (carries .gpu2 .gpu3): everything
#                                         # below in one command, paced to SECONDS
#                                         # (default 300), report in $OUT
#   bash tools/gpu/run.sh model   STAGE   # reassemble + convert the GGUF
#   bash tools/gpu/run.sh tests   STAGE   # the kernel tests on CUDA
#   bash tools/gpu/run.sh sanitize STAGE  # the same under compute-sanitizer memcheck
#                                         # (global memory only: shared-memory reads
#                                         # past an array but inside the block's
#                                         # allocation go unseen)
#
# `bench` runs, each stage under its own time limit so that one slow or
# failing stage never loses the others' results:
#   1. the GGUF reassembled and converted (f32 safetensors);
#   2. the CUDA kernel tests (ops-* binaries, --features cuda-tests), one
#      run per test module, 8 modules at a time on 2 threads each, 90 s;
#   3. `draftc bench decode` in f16 (eager and replayed, `--replay both`)
#      and f32 at batch 1/4/16/64 with the measured counters (launches,
#      flushes, reads, uploads, allocations, host allocations, host µs per
#      step), and f16 again with DRAFTC_FLUSH=launch (the old
#      per-launch flush) beside it;
#   4. `draftc bench spec` for the shipped Beagle at batch 1 and 16, budgets
#      1 and 3 fixed and planned up to 3 (`--speculate fixed,auto`, issue 34: auto
#      must not be slower than autoregressive decoding at batch 16), up to
#      90 s (before transformers: on an H100 the stages below once left it
#      no time), with the planner's per-round trace in spec.err
#      (DRAFTC_PLAN_DEBUG=rounds);
#   5. transformers on the same converted weights: eager (f16, f32), and
#      torch.compile with the static cache, mode="reduce-overhead" (f16,
#      batch 1 and 64) only when 100 s are left for it (it compiled for
#      127 s on an H100 before its first row);
#   5b. `draftc serve` with speculation off and on at concurrency 1, 4 and
#      16 (tools/serve/bench.py), up to 120 s;
#   6. the fixed Beagle tree again with its frontiers picked on the device
#      (DRAFTC_TREE_PICKS=device; the host picks them by default), up to 40 s;
#   7. compute-sanitizer memcheck, one run per kernel test module (attention
#      and the KV ops first) while the time lasts; the report says which ran.
# Before the kernel tests, `draftc bench replay` checks replayed passes (CUDA
# graphs) against eager ones bit for bit (issue 56); the decode stage
# measures f16 eager and replayed in one run, and replayed without graphs
# (DRAFTC_GRAPHS=off) beside the flush-policy pair.
#
# What comes back in $OUT: report.md (every table), bench.tar.xz (logs,
# JSON, SVG). STAGE is a directory outside the repository that survives
# between calls while the machine stays warm (e.g. /root/stage).
set -uo pipefail
cd "$(dirname "$0")/../.."
what=$1
stage=$2
out=${OUT:-/tmp/out}
mkdir -p "$stage" "$out"
export PATH="$stage/bin:$PATH"
t0=$(date +%s)
say() { echo "[$(($(date +%s) - t0))s] $*"; }

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

model() {
  if [ ! -f "$stage/model/f32/model.safetensors" ]; then
    cat "$stage"/*.gguf.part* >"$stage/model.gguf"
    sha256sum "$stage/model.gguf"
    draftc convert "$stage/model.gguf" --out "$stage/model/f32" --dtype f32 --quiet
  fi
  ls -la "$stage/model/f32"
  nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem,driver_version --format=csv
}

# The test modules of a kernel test binary (ops/tests/cuda_all.rs names one
# per kernel test file), attention and the KV ops first (what speculative
# decoding leans on), then the rest in the binary's own order, so that a
# test file added later is never left out.
FIRST="attention kv linear_rope tree linear"
modules_of() { # binary
  local all
  all=$("$1" --list 2>/dev/null | sed -n 's/^\([a-z_0-9]*\)::.*: test$/\1/p' | awk '!seen[$0]++')
  { for m in $FIRST; do grep -qx "$m" <<<"$all" && echo "$m"; done; echo "$all"; } | awk 'NF && !seen[$0]++'
}

# tests DIR [DEADLINE_EPOCH]: every ops-* test binary, one run per test
# module, TESTS_PARALLEL modules at a time (default 8) on TESTS_THREADS test
# threads each (default 2), logs into DIR; the report lists them in module
# order. (On an H200 the whole binary at 16 threads left two tests
# unfinished after 170 s that pass in about a second alone, 2026-11-27:
# docs/bench/cuda-h200/2026-11-27; not diagnosed. One module at a time on
# one thread, linear_rope alone outlasted its 66 s and eleven modules did
# not run in the 90 s, 2026-11-27b.)
tests() {
  local dir=$1 deadline=${2:-0} status=0 left log rc name mod
  local par=${TESTS_PARALLEL:-8} threads=${TESTS_THREADS:-2}
  local -a order=()
  for t in "$stage"/bin/ops-*; do
    name=$(basename "$t")
    for mod in $(modules_of "$t"); do
      order+=("$t $mod")
      while [ "$(jobs -rp | wc -l)" -ge "$par" ]; do wait -n; done
      log="$dir/$name-$mod.log"
      left=120
      [ "$deadline" -gt 0 ] && left=$((deadline - $(date +%s)))
      [ "$left" -gt 120 ] && left=120
      if [ "$left" -le 2 ]; then
        echo time >"$log.rc"
        continue
      fi
      echo "$left" >"$log.limit"
      (timeout "$left" "$t" --test-threads "$threads" "$mod::" >"$log" 2>&1; echo $? >"$log.rc") &
    done
  done
  wait
  for e in "${order[@]}"; do
    read -r t mod <<<"$e"
    name=$(basename "$t")
    log="$dir/$name-$mod.log"
    rc=$(cat "$log.rc" 2>/dev/null || echo lost)
    if [ "$rc" = 0 ]; then
      echo "PASS $name $mod: $(grep -h '^test result' "$log" | tail -1)"
    elif [ "$rc" = time ]; then
      status=1
      echo "NOT RUN $name $mod (time)"
    elif [ "$rc" = 124 ]; then
      status=1
      echo "TIMEOUT $name $mod ($(cat "$log.limit")s): $(grep -c ' ok$' "$log") passed before it; unfinished:" \
        "$(grep -h '^test .* \.\.\. *$\|has been running' "$log" | sed 's/^test //; s/ \.\.\..*//; s/ has been.*//' | sort -u | tr '\n' ' ')"
    else
      status=1
      echo "FAIL $name $mod (exit $rc)"
      grep -h -A20 'panicked\|FAILED\|failures:' "$log" | head -60
    fi
  done
  return $status
}

# sanitize DIR [DEADLINE_EPOCH]: compute-sanitizer memcheck, one run per test
# module of each binary (the whole binary under memcheck outlasts a share).
sanitize() {
  local dir=$1 deadline=${2:-0} status=0 left
  for t in "$stage"/bin/ops-*; do
    name=$(basename "$t")
    for mod in $(modules_of "$t"); do
      left=120
      [ "$deadline" -gt 0 ] && left=$((deadline - $(date +%s)))
      if [ "$left" -le 5 ]; then
        echo "NOT RUN $name $mod (time)"
        continue
      fi
      [ "$left" -gt 120 ] && left=120
      timeout "$left" compute-sanitizer --tool memcheck --error-exitcode 99 "$t" --test-threads 1 "$mod::" \
        >"$dir/$name-$mod.memcheck" 2>&1
      rc=$?
      if [ $rc = 0 ]; then
        echo "CLEAN $name $mod: $(grep -h '^test result' "$dir/$name-$mod.memcheck" | tail -1)"
      elif [ $rc = 124 ]; then
        echo "TIMEOUT $name $mod (${left}s; no error reported before it)"
        grep -h -m5 -A6 'Invalid\|ERROR SUMMARY' "$dir/$name-$mod.memcheck"
      else
        status=1
        echo "ERROR $name $mod (exit $rc)"
        grep -h -m5 -A6 'Invalid\|ERROR SUMMARY\|panicked' "$dir/$name-$mod.memcheck"
      fi
    done
  done
  return $status
}

case $what in
unpack | stage)
  unpack .gpu1 .gpu2 .gpu3
  ls -la "$stage" "$stage/bin"
  ;;
model)
  unpack .gpu1 .gpu2 .gpu3
  model
  ;;
tests)
  unpack .gpu1 .gpu2 .gpu3
  tests "$out"
  ;;
sanitize)
  unpack .gpu1 .gpu2 .gpu3
  sanitize "$out"
  ;;
bench)
  budget=${3:-300}
  unpack .gpu1 .gpu2 .gpu3
  work=/tmp/gpu-bench
  rm -rf "$work" && mkdir -p "$work"
  report="$out/report.md"
  exec > >(tee "$work/log.txt") 2>&1
  left() { echo $((budget - ($(date +%s) - t0))); }
  {
    echo "# tools/gpu/run.sh bench — $(date -u +%Y-%m-%dT%H:%MZ)"
    echo
    nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem,driver_version --format=csv
    echo
    echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
  } >"$report"
  say "model"
  model >"$work/model.log" 2>&1 || { say "MODEL FAILED"; cat "$work/model.log"; exit 3; }
  m="$stage/model/f32"

  say "replay check (up to 60 s)"
  # Issue 56: replayed passes (CUDA graphs) against eager ones, bit for bit,
  # decode steps and tree verifications at batch 1, 16 and 64.
  mkdir -p "$work/replay"
  timeout 60 draftc bench replay --backend cuda --dtype f16 --model "$m" --batch 1,16,64 --steps 8 \
    --out "$work/replay" 2>"$work/replay/replay.err" >"$work/replay/replay.md" ||
    echo "replay check failed or timed out (exit $?): $(tail -3 "$work/replay/replay.err")"
  { echo; cat "$work/replay/replay.md"; } | tee -a "$report"

  say "kernel tests (up to 90 s)"
  mkdir -p "$work/tests"
  { echo; echo "## CUDA kernel tests"; echo; echo '```'; tests "$work/tests" $(($(date +%s) + 90)); echo '```'; } |
    tee -a "$report"

  say "decode benches"
  for dt in f16 f32; do
    mkdir -p "$work/decode-$dt"
    # f16: eager, then replayed (issue 56), each batch size in one run.
    replay=on; [ $dt = f16 ] && replay=both
    timeout 90 draftc bench decode --backend cuda --dtype $dt --model "$m" --batch 1,4,16,64 --steps 32 \
      --replay $replay --out "$work/decode-$dt" 2>"$work/decode-$dt/decode.err" >"$work/decode-$dt/decode.md" ||
      echo "decode $dt failed or timed out (exit $?): $(tail -3 "$work/decode-$dt/decode.err")"
    { echo; cat "$work/decode-$dt/decode.md"; } >>"$report"
  done
  # f16 at batch 1 and 64 under one environment setting: NAME TITLE VAR=VALUE.
  decode_with() {
    mkdir -p "$work/decode-f16-$1"
    env "$3" timeout 60 draftc bench decode --backend cuda --dtype f16 --model "$m" --batch 1,64 --steps 32 \
      --out "$work/decode-f16-$1" 2>"$work/decode-f16-$1/decode.err" >"$work/decode-f16-$1/decode.md" ||
      echo "decode ($1) failed (exit $?)"
    { echo; echo "### f16 with $3 ($2)"; cat "$work/decode-f16-$1/decode.md"; } >>"$report"
  }
  decode_with flush-launch "a flush after every launch, the policy before issue 31" DRAFTC_FLUSH=launch
  decode_with no-graphs "replayed launch by launch, no CUDA graph" DRAFTC_GRAPHS=off
  cat "$work"/decode-*/decode.md

  say "speculative bench (up to 90 s)"
  spec_s=$(($(left) - 60))
  [ "$spec_s" -gt 90 ] && spec_s=90
  if [ "$spec_s" -gt 20 ]; then
    # The planner's cost tables after each run and one line a round (budget,
    # rows, draft / verify / commit times) go to spec.err: an auto run that
    # loses to the fixed draft can be read from what the planner measured.
    # Fixed budget 1 (one token) beside 3: the draft the planner's probes
    # mostly are, measured on its own.
    DRAFTC_PLAN_DEBUG=rounds timeout "$spec_s" draftc bench spec --backend cuda --prompts mt-bench --prompt-count 8 --model "$m" \
      --batch 1,16 --budget 1,3 --max-tokens 32 --drafter models/beagle.draft --lookup off --lookup 2 --speculate fixed,auto \
      --out "$work/spec" --quiet 2>"$work/spec.err" >"$work/spec.md" || echo "spec: exit $? $(tail -3 "$work/spec.err")"
    { echo; cat "$work/spec.md"; } | tee -a "$report"
  else
    echo "speculative bench skipped: ${spec_s}s left for it" | tee -a "$report"
  fi

  say "serving benchmark (up to 120 s)"
  sv_s=$(($(left) - 150))
  [ "$sv_s" -gt 120 ] && sv_s=120
  if [ "$sv_s" -gt 40 ] && [ -x "$stage/bin/draftc-serve" ]; then
    # `draftc serve` with speculation off and on (the shipped Beagle, the
    # planner up to its tuned budget), closed-loop streamed load at
    # concurrency 1, 4 and 16, alternated per level (tools/serve/bench.py:
    # standard library only; matplotlib draws the plot when present).
    timeout "$sv_s" python3 tools/serve/bench.py --draftc "$stage/bin/draftc" --model "$m" \
      --drafter models/beagle.draft --serve-arg=--backend --serve-arg=cuda --concurrency 1,4,16 \
      --repeat 1 --max-tokens 64 --ready-timeout 60 --out "$work/serve" >"$work/serve.log" 2>&1 ||
      echo "serving bench: exit $? $(tail -3 "$work/serve.log")"
    { echo; echo "## Serving (draftc serve, Beagle against --no-spec)"; echo;
      cat "$work/serve/bench.md" 2>/dev/null || tail -20 "$work/serve.log"; } | tee -a "$report"
    [ -f "$work/serve/bench.png" ] && cp "$work/serve/bench.png" "$out/serve.png"
  else
    echo "serving bench skipped: ${sv_s}s left for it (or no draftc-serve staged)" | tee -a "$report"
  fi

  say "transformers (eager f16 and f32, torch.compile f16)"
  for dt in f16 f32; do
    timeout 60 python3 tools/gpu/hf_decode.py "$m" 1,4,16,64 32 $dt eager 50 \
      >"$work/hf-eager-$dt.md" 2>"$work/hf-eager-$dt.err" || echo "transformers eager $dt: exit $?"
  done
  c_s=$(($(left) - 75))
  [ "$c_s" -gt 150 ] && c_s=150
  if [ "$c_s" -ge 100 ]; then # it compiled for 127 s on an H100 before its first row
    # Compilation and graph capture take a while per batch size: the ends.
    timeout $((c_s + 15)) python3 tools/gpu/hf_decode.py "$m" 1,64 32 f16 compile "$c_s" \
      >"$work/hf-compile-f16.md" 2>"$work/hf-compile-f16.err" || echo "transformers compile: exit $?"
  else
    echo "torch.compile skipped: ${c_s}s left for it" >"$work/hf-compile-f16.md"
  fi
  for f in hf-eager-f16 hf-eager-f32 hf-compile-f16; do
    { echo; echo "## transformers ($f)"; echo; cat "$work/$f.md"; } | tee -a "$report"
  done

  say "the fixed tree with device-picked frontiers (up to 40 s)"
  tp_s=$(($(left) - 40))
  [ "$tp_s" -gt 40 ] && tp_s=40
  if [ "$tp_s" -gt 20 ]; then
    # The stage above picks the file's dynamic tree's frontiers on the
    # host (the exact cut expands fewer nodes, for a read a level); the
    # device's picks read once a round but expand every frontier node
    # (issue 31; 0.73x against 1.05x on an H200 at batch 1, 2026-11-27).
    DRAFTC_TREE_PICKS=device timeout "$tp_s" draftc bench spec --backend cuda --prompts mt-bench --prompt-count 8 \
      --model "$m" --batch 1,16 --budget 3 --max-tokens 32 --drafter models/beagle.draft --lookup off \
      --speculate fixed --out "$work/spec-device-picks" --quiet 2>"$work/spec-device-picks.err" \
      >"$work/spec-device-picks.md" || echo "device picks: exit $? $(tail -3 "$work/spec-device-picks.err")"
    { echo; echo "### DRAFTC_TREE_PICKS=device: the same tree, frontiers picked on the device"; echo;
      cat "$work/spec-device-picks.md"; } | tee -a "$report"
  else
    echo "device-picked tree skipped: ${tp_s}s left for it" | tee -a "$report"
  fi

  say "compute-sanitizer memcheck (the time left)"
  mkdir -p "$work/memcheck"
  { echo; echo "## compute-sanitizer memcheck"; echo; echo '```';
    sanitize "$work/memcheck" $((t0 + budget - 8)); echo '```'; } | tee -a "$report"
  say "done"
  cp "$report" "$work/"
  tar -C /tmp -cJf "$out/bench.tar.xz" gpu-bench
  ls -la "$out"
  ;;
spec)
  # Call 3 (issue 56: EAGLE at batch 1 >= 1.3x over autoregressive): EAGLE
  # and Beagle on MT-Bench at batch 1 and 16, budgets 1 and 3 fixed and
  # planned, replayed verification passes (and graphs) on; after `bench`
  # converted the model into STAGE. Carry nothing but the tree, slimmed with
  # `slim.sh on 4` (EAGLE's and Beagle's weights travel).
  budget=${3:-150}
  unpack .gpu1 .gpu2 .gpu3
  m="$stage/model/f32"
  [ -d "$m" ] || { echo "no converted model under $stage (run.sh bench converts it)" >&2; exit 3; }
  work=/tmp/gpu-spec
  rm -rf "$work" && mkdir -p "$work"
  report="$out/spec.md"
  {
    echo "# tools/gpu/run.sh spec — $(date -u +%Y-%m-%dT%H:%MZ)"
    echo
    echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
  } >"$report"
  for d in eagle beagle; do
    say "spec bench: $d (up to $((budget / 2)) s)"
    DRAFTC_PLAN_DEBUG=rounds timeout $((budget / 2)) draftc bench spec --backend cuda --prompts mt-bench \
      --prompt-count 8 --model "$m" --batch 1,16 --budget 1,3 --max-tokens 64 --drafter "models/$d.draft" \
      --lookup off --speculate fixed,auto --out "$work/$d" --quiet 2>"$work/$d.err" >"$work/$d.md" ||
      echo "$d: exit $? $(tail -3 "$work/$d.err")" | tee -a "$report"
    { echo; cat "$work/$d.md"; } | tee -a "$report"
  done
  cp "$report" "$work/"
  tar -C /tmp -cJf "$out/spec.tar.xz" gpu-spec
  ls -la "$out"
  ;;
*)
  echo "usage: run.sh unpack|bench|spec|model|tests|sanitize STAGE [SECONDS]" >&2
  exit 2
  ;;
esac
