#!/usr/bin/env bash
# Creates (once) the serving tools' virtualenv .venv-serve with the pinned
# packages of tools/serve/requirements.txt (the OpenAI client the tests use)
# and, with --plot, requirements-plot.txt (matplotlib, for bench.py's plot);
# prints its python's path. A pin not yet installed is installed.
set -euo pipefail
cd "$(dirname "$0")/../.."
venv=.venv-serve
reqs=(tools/serve/requirements.txt)
[ "${1:-}" = --plot ] && reqs+=(tools/serve/requirements-plot.txt)
stamp="$venv/.installed"
needed=$(grep -hv '^#' "${reqs[@]}" | sed '/^$/d')
if [ ! -x "$venv/bin/python" ]; then
  rm -rf "$venv"
  echo "==> creating $venv" >&2
  if ! python3 -m venv "$venv" >&2; then
    # Debian's python3 keeps venv (ensurepip) in a package of its own.
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq python3-venv >&2
    rm -rf "$venv"
    python3 -m venv "$venv" >&2
  fi
fi
if [ -f "$stamp" ]; then
  missing=$(grep -vxF -f "$stamp" <<<"$needed" || true)
else
  missing=$needed
fi
if [ -n "$missing" ]; then
  echo "==> pip install $(echo $missing) into $venv" >&2
  # shellcheck disable=SC2086
  "$venv/bin/pip" install -q --disable-pip-version-check $missing >&2
  printf '%s\n' "$missing" >>"$stamp"
fi
echo "$PWD/$venv/bin/python"
