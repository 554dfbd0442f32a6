#!/usr/bin/env bash
# The test set-up: .venv with the pipeline, agent, ops and dev extras (scripts/venv.sh),
# the Kafka broker's jars (Java 17 and Maven) and every scripts/setup.d/*.sh (the Debian
# packages the tests run for real: each is idempotent and a no-op when its part is
# already in place). The demo needs none of the system parts: scripts/demo.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/venv.sh pipeline,agent,ops,dev
# Kafka broker jars for the tests (tests/kafka_broker.py); ~30 s the first time, then a no-op.
bash scripts/kafka-jars.sh >/dev/null
for part in scripts/setup.d/*.sh; do
  [ -e "$part" ] || continue
  bash "$part"
done
