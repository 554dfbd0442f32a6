#!/usr/bin/env bash
# Sets up (first run only) and runs the demo on the embedded default cluster.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/gpuledger demo "$@"
