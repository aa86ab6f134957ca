#!/usr/bin/env bash
# N `draftc serve` replicas behind the SGLang Model Gateway (PyPI `smg`,
# installed here into .venv-gateway), all on loopback:
#
#   bash tools/serve-cluster.sh N [--gateway-port P] [--replica-port-base B] [--run-dir D]
#                                 [--policy power_of_two|round_robin|…] [-- SERVE ARGS…]
#
# Replica i listens on B+i (default B = 8100), the gateway on P (default
# 30000, its Prometheus exporter on P+1). SERVE ARGS go to every replica
# (`--model DIR`, `--drafter …`, `--no-spec`, …). The gateway routes with
# power-of-two choices over the replicas' /v1/loads and retries a request
# that a replica answers 429/503 (or cannot take) on another one. The
# script prints the gateway's URL, writes the replicas' and the gateway's
# pids and logs under the run directory, and stops everything on SIGINT /
# SIGTERM. docs/serving.md shows the same with HAProxy.
set -euo pipefail
cd "$(dirname "$0")/.."
n="${1:?usage: tools/serve-cluster.sh N [--gateway-port P] [--replica-port-base B] [--run-dir D] [-- SERVE ARGS]}"
shift
gw_port=30000
base=8100
run_dir=""
policy=power_of_two
while [ $# -gt 0 ]; do
  case "$1" in
    --gateway-port) gw_port="$2"; shift 2 ;;
    --replica-port-base) base="$2"; shift 2 ;;
    --run-dir) run_dir="$2"; shift 2 ;;
    --policy) policy="$2"; shift 2 ;;
    --) shift; break ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
run_dir="${run_dir:-$(mktemp -d /tmp/draftc-cluster.XXXXXX)}"
mkdir -p "$run_dir"
# DRAFTC_SERVE_BIN: a draftc-serve binary to run (the tests give theirs).
serve_bin="${DRAFTC_SERVE_BIN:-target/release/draftc-serve}"
if [ ! -x "$serve_bin" ]; then
  cargo build --release -p draftc-serve >&2
fi
venv=.venv-gateway
if [ ! -x "$venv/bin/smg" ]; then
  echo "==> installing the SGLang Model Gateway (smg==1.13.0) into $venv" >&2
  python3 -m venv "$venv" >&2
  "$venv/bin/pip" install -q --disable-pip-version-check smg==1.13.0 >&2
fi
# 200 from URL? (python3, which the gateway's virtualenv needs anyway: no curl)
ok() {
  python3 -c 'import sys, urllib.request
try:
    sys.exit(0 if urllib.request.urlopen(sys.argv[1], timeout=5).status == 200 else 1)
except Exception:
    sys.exit(1)' "$1"
}
pids=()
stop() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap stop EXIT
trap 'exit 0' INT TERM
urls=()
for i in $(seq 1 "$n"); do
  port=$((base + i))
  "$serve_bin" --host 127.0.0.1 --port "$port" "$@" >"$run_dir/replica-$i.log" 2>&1 &
  pids+=($!)
  echo "$!" >"$run_dir/replica-$i.pid"
  urls+=("http://127.0.0.1:$port")
done
for u in "${urls[@]}"; do
  for _ in $(seq 1 2400); do
    if ok "$u/health"; then break; fi
    sleep 0.5
  done
  ok "$u/health" || { echo "replica $u did not become ready (logs in $run_dir)" >&2; exit 1; }
done
"$venv/bin/smg" launch --host 127.0.0.1 --port "$gw_port" \
  --worker-urls "${urls[@]}" \
  --policy "$policy" --load-monitor-interval 1 \
  --worker-startup-check-interval 1 \
  --health-check-interval-secs 1 --health-failure-threshold 1 \
  --prometheus-host 127.0.0.1 --prometheus-port $((gw_port + 1)) \
  >"$run_dir/gateway.log" 2>&1 &
pids+=($!)
echo "$!" >"$run_dir/gateway.pid"
for _ in $(seq 1 600); do
  if ok "http://127.0.0.1:$gw_port/v1/models"; then break; fi
  sleep 0.2
done
echo "gateway http://127.0.0.1:$gw_port over ${urls[*]} (logs and pids in $run_dir)"
wait
