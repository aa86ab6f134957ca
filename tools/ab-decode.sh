#!/usr/bin/env bash
# Old against new draftc, alternately in one run, on the same host: each
# round runs `bench decode` with OLD then NEW (same batch sizes and steps)
# and prints tokens/s per batch size, then the mean of each and NEW/OLD.
# Alternating keeps a host that speeds up or slows down during the run from
# favouring either binary.
#
#   bash tools/ab-decode.sh OLD_BIN NEW_BIN [ROUNDS] [BATCHES] [STEPS]
#   e.g. bash tools/ab-decode.sh /tmp/draftc-old target/release/draftc 3 1,16 8
set -euo pipefail
old=$1 new=$2 rounds=${3:-3} batches=${4:-1,16} steps=${5:-8}
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-/tmp/draftc-xdg-$(id -u)}"
mkdir -p "$XDG_RUNTIME_DIR"
work=$(mktemp -d)
# tokens/s per batch from a decode.md table: "| batch | tokens/s | ..."
rates() { awk -F'|' '/^\| [0-9]+ \|/ { gsub(/ /, "", $2); gsub(/ /, "", $3); print $2, $3 }' "$1"; }
for r in $(seq 1 "$rounds"); do
  for which in old new; do
    bin=$old
    [ "$which" = new ] && bin=$new
    "$bin" bench decode --batch "$batches" --steps "$steps" --out "$work/$which-$r" 2>/dev/null >"$work/$which-$r.md"
    rates "$work/$which-$r.md" | while read -r b tps; do
      echo "round $r $which batch $b: $tps tokens/s"
      echo "$which $b $tps" >>"$work/all"
    done
  done
done
echo
echo "| batch | old tokens/s (mean of $rounds) | new tokens/s | new / old |"
echo "|---|---|---|---|"
awk '{ s[$1" "$2] += $3; n[$1" "$2] += 1; b[$2] = 1 }
  END { for (x in b) { o = s["old "x] / n["old "x]; w = s["new "x] / n["new "x];
        printf "| %s | %.2f | %.2f | %.3f |\n", x, o, w, w / o } }' "$work/all" | sort -t'|' -k2 -n
rm -rf "$work"
