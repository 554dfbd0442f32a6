#!/usr/bin/env bash
# Sets up (first run only) and runs the whole test suite, then ruff and mypy.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/mypy
exec .venv/bin/python -m pytest -n 2 "$@"
