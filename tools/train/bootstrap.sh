#!/usr/bin/env bash
# Creates (or refreshes) the training virtualenv at <repo>/.venv-train.
#
#   bash tools/train/bootstrap.sh        # prints the venv's python path on stdout
#   "$(bash tools/train/bootstrap.sh)" -m draftc_train --help
#
# Idempotent: the sha256 of tools/train/requirements.txt is stored in the
# venv (.venv-train/draftc-requirements.sha256); when it matches, nothing is
# installed. When requirements.txt changes, the pinned set is installed again
# into the same venv. A .pth file in the venv's site-packages points at
# tools/train, so `python -m draftc_train` works from any directory.
#
# Environment: DRAFTC_PYTHON picks the base interpreter (default: python3.11,
# else python3; CPython 3.11 is what the pins were resolved for).
# DRAFTC_TRAIN_VENV overrides the venv location.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
venv="${DRAFTC_TRAIN_VENV:-$repo/.venv-train}"
req="$here/requirements.txt"
stamp="$venv/draftc-requirements.sha256"

log() { echo "bootstrap: $*" >&2; }

base="${DRAFTC_PYTHON:-}"
if [[ -z "$base" ]]; then
    if command -v python3.11 >/dev/null 2>&1; then base=python3.11; else base=python3; fi
fi
ver="$("$base" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
if [[ "$ver" != "3.11" ]]; then
    log "warning: $base is Python $ver; the pins in requirements.txt were resolved for 3.11"
fi

want="$(sha256sum "$req" | cut -d' ' -f1)"
have=""
[[ -f "$stamp" ]] && have="$(cat "$stamp")"

if [[ ! -x "$venv/bin/python" ]]; then
    log "creating $venv with $base ($ver)"
    "$base" -m venv "$venv"
    have=""
fi

if [[ "$have" != "$want" ]]; then
    log "installing $req (this downloads torch and its CUDA wheels, ~3 GB, the first time)"
    rm -f "$stamp"
    "$venv/bin/python" -m pip install --no-input --quiet --disable-pip-version-check \
        -r "$req" >&2
    echo "$want" > "$stamp"
    log "installed; requirements sha256 $want"
else
    log "up to date (requirements sha256 $want)"
fi

site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
echo "$here" > "$site/draftc_train.pth"

"$venv/bin/python" -c 'import draftc_train' >&2
echo "$venv/bin/python"
