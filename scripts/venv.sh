#!/usr/bin/env bash
# Creates .venv (first run only) and installs gpuledger into it, editable, with the
# extras named in $1 (comma-separated, e.g. "pipeline" or "pipeline,agent,ops,dev").
# Needs Python >= 3.11 and pip, nothing else: no root, no system packages.
# Installs again only when pyproject.toml changed or an extra is missing; the extras
# installed so far are kept (the stamp file lists them).
set -euo pipefail
cd "$(dirname "$0")/.."
want="${1:?usage: scripts/venv.sh EXTRA[,EXTRA...]}"
PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  if ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    echo "scripts/venv.sh: gpuledger needs Python >= 3.11 ($PY is $("$PY" -V 2>&1 || echo missing));" \
         "set PYTHON=/path/to/python3.11" >&2
    exit 1
  fi
  "$PY" -m venv .venv
fi
stamp=.venv/.gpuledger-installed
have=""
if [ -f "$stamp" ]; then have="$(cat "$stamp")"; fi
missing=""
for extra in ${want//,/ }; do
  case ",$have," in *",$extra,"*) ;; *) missing="$missing $extra" ;; esac
done
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ -n "$missing" ]; then
  all="$(printf '%s\n' ${have//,/ } ${want//,/ } | sort -u | paste -sd, -)"
  echo "installing gpuledger[$all] into .venv (first run: a minute or two)..." >&2
  .venv/bin/python -m pip install --quiet --upgrade pip
  .venv/bin/python -m pip install --quiet -e ".[$all]"
  echo "$all" > "$stamp"
fi
