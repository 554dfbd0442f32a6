#!/usr/bin/env bash
# The demo on the embedded default cluster. Needs Python >= 3.11 and pip only (no root,
# no system packages, no Java): sets up .venv with the pipeline extra (first run only),
# then runs `gpuledger demo` with the arguments given (see `gpuledger demo --help`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/venv.sh pipeline
exec .venv/bin/gpuledger demo "$@"
