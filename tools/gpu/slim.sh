#!/usr/bin/env bash
# Shrinks what a device call carries (the tracked tree travels with every
# call, and 64 MiB is the limit): `on 1` leaves out the drafter weights,
# snapshots, docs and data (call 1 of tools/gpu/train.sh, calls 1-2 of
# tools/gpu/campaign.sh), `on 2` only the weights other than Beagle's,
# snapshots, docs and the data other than data/eval, `on 4` the same but
# EAGLE's weights travel (run.sh spec, call 3), `on 3` only snapshots and docs (campaign.sh's `run`
# call: every drafter's weights and the data travel); `off` puts them back
# in the index.
# The files stay on disk: they leave the index and are ignored meanwhile.
set -euo pipefail
cd "$(dirname "$0")/../.."
exclude="$(git rev-parse --git-dir)/info/exclude"
off() { # restore only the paths `on` took out (the rest of the index stays as staged)
  mapfile -t taken < <(sed -n '/^# slim.sh begin$/,/^# slim.sh end$/{/^\//s|^/||p}' "$exclude")
  sed -i '/^# slim.sh begin$/,/^# slim.sh end$/d' "$exclude"
  [ ${#taken[@]} = 0 ] || git reset -q -- "${taken[@]}"
}
case ${1:-} in
on)
  off
  paths=(snapshots docs)
  [ "${2:-}" = 3 ] || paths+=(models/weights/specformer.safetensors models/weights/spire.safetensors
    models/weights/medusa.safetensors)
  case ${2:-} in 3 | 4) ;; *) paths+=(models/weights/eagle.safetensors) ;; esac
  [ "${2:-}" = 1 ] && paths+=(models/weights data)
  # The bench (call 2) reads only data/eval (MT-Bench questions): the
  # training manifests and shards stay behind (they would push call 2 past
  # the 64 MiB a call carries beside .gpu2 and .gpu3).
  if [ "${2:-}" = 2 ] || [ "${2:-}" = 4 ]; then
    mapfile -t more < <(git ls-files data | cut -d/ -f1-2 | sort -u | grep -vx 'data/eval')
    paths+=("${more[@]}")
  fi
  echo '# slim.sh begin' >>"$exclude"
  for p in "${paths[@]}"; do
    git rm -r -q --cached "$p"
    echo "/$p" >>"$exclude"
  done
  echo '# slim.sh end' >>"$exclude"
  ;;
off) off ;;
*) echo "usage: slim.sh on 1|2|3|4 | off" >&2; exit 2 ;;
esac
echo "travels: $(git ls-files -z | xargs -0 du -cb | tail -1 | cut -f1) bytes tracked"
