#!/usr/bin/env bash
# The test set-up: .venv with the pipeline, agent, ops and dev extras (scripts/venv.sh),
# the Kafka broker's jars and S3Proxy's (Java 17 and Maven), two older DuckDB releases
# (scripts/duckdb-readers.sh) and every scripts/setup.d/*.sh
# (the Debian packages the tests run for real: each is idempotent and a no-op when its
# part is already in place). The demo needs none of the system parts: scripts/demo.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/venv.sh pipeline,agent,ops,dev
# Kafka broker jars for the tests (tests/kafka_broker.py); ~30 s the first time, then a no-op.
bash scripts/kafka-jars.sh >/dev/null
# S3Proxy for the tests' S3 server (tests/s3_server.py); one jar, a no-op once cached.
bash scripts/s3proxy-jar.sh >/dev/null
# Older DuckDB releases that must open catalog.duckdb (tests/test_catalog_readers.py).
bash scripts/duckdb-readers.sh >/dev/null
for part in scripts/setup.d/*.sh; do
  [ -e "$part" ] || continue
  bash "$part"
done
