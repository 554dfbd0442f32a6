#!/usr/bin/env bash
# Sets up (first run only) and runs the whole test suite, then ruff and mypy.
# Arguments go to pytest (then it runs as asked, in one run: `bash scripts/test.sh -k slurm`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/mypy
if [ "$#" -gt 0 ]; then
    exec .venv/bin/python -m pytest -n 2 "$@"
fi

# The real-Slurm scenarios spend minutes waiting for their jobs to run (a worker of the
# suite held idle for ~4 minutes): they run in a pytest of their own, beside the rest,
# and their report follows the suite's. Both must pass.
SLURM=(tests/test_import_sacct_slurmdbd.py tests/test_bridge_slurm.py)
side_log=$(mktemp "${TMPDIR:-/tmp}/gpuledger-slurm-tests.XXXXXX")
.venv/bin/python -m pytest -p no:cacheprovider "${SLURM[@]}" > "$side_log" 2>&1 &
side=$!
trap 'kill "$side" 2> /dev/null || true; rm -f "$side_log"' EXIT
ignore=()
for module in "${SLURM[@]}"; do ignore+=("--ignore=$module"); done
status=0
.venv/bin/python -m pytest -n 2 "${ignore[@]}" || status=$?
side_status=0
wait "$side" || side_status=$?
[ "$side_status" -eq 5 ] && side_status=0  # none of them selected (PYTEST_ADDOPTS=-k ...)
echo
echo "== the real-Slurm scenarios (${SLURM[*]}), run beside the suite =="
cat "$side_log"
if [ "$status" -ne 0 ] || [ "$side_status" -ne 0 ]; then
    echo "tests failed: the suite exited $status, the real-Slurm scenarios $side_status" >&2
    exit 1
fi
