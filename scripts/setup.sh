#!/usr/bin/env bash
# Creates .venv and installs gpuledger with the pipeline and dev extras, then runs every
# scripts/setup.d/*.sh (system packages and services the tests need: each is idempotent
# and a no-op when its part is already in place).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.gpuledger-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  .venv/bin/python -m pip install --quiet --upgrade pip
  .venv/bin/python -m pip install --quiet -e ".[pipeline,agent,ops,dev]"
  touch "$stamp"
fi
# Kafka broker jars for the tests (tests/kafka_broker.py); ~30 s the first time, then a no-op.
bash scripts/kafka-jars.sh >/dev/null
for part in scripts/setup.d/*.sh; do
  [ -e "$part" ] || continue
  bash "$part"
done
