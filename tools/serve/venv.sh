#!/usr/bin/env bash
# Creates (once) the serving tools' virtualenv .venv-serve with the pinned
# packages of tools/serve/requirements.txt and prints its python's path.
# Re-created when the requirements change.
set -euo pipefail
cd "$(dirname "$0")/../.."
venv=.venv-serve
req=tools/serve/requirements.txt
stamp="$venv/.requirements"
if [ ! -x "$venv/bin/python" ] || ! cmp -s "$req" "$stamp"; then
  echo "==> creating $venv (pip install -r $req)" >&2
  rm -rf "$venv"
  if ! python3 -m venv "$venv" >&2; then
    # Debian's python3 keeps venv (ensurepip) in a package of its own.
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq python3-venv >&2
    rm -rf "$venv"
    python3 -m venv "$venv" >&2
  fi
  "$venv/bin/pip" install -q --disable-pip-version-check -r "$req" >&2
  cp "$req" "$stamp"
fi
echo "$PWD/$venv/bin/python"
