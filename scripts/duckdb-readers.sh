#!/usr/bin/env bash
# Installs older DuckDB releases (Python packages, from the package index) into cache
# folders, for the test that opens `catalog.duckdb` with the DuckDB an analyst may have
# (tests/test_catalog_readers.py): the oldest release the catalog supports and the 1.x
# long-term release. Nothing downloads them at test time.
#
#   bash scripts/duckdb-readers.sh        # prints one folder per version when done
#
# Environment:
#   GPULEDGER_DUCKDB_READERS  the versions, space-separated (default below; must match
#                             tests/test_catalog_readers.py)
#   GPULEDGER_DUCKDB_HOME     cache root (default ~/.cache/gpuledger); each version goes
#                             to <root>/duckdb-<version>
#
# Idempotent: a version already in its folder is not installed again. Needs .venv
# (scripts/venv.sh) for its pip.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSIONS="${GPULEDGER_DUCKDB_READERS:-1.1.3 1.4.5}"
ROOT="${GPULEDGER_DUCKDB_HOME:-$HOME/.cache/gpuledger}"
[ -x .venv/bin/python ] || { echo "duckdb-readers.sh: error: no .venv; run scripts/venv.sh first" >&2; exit 1; }
for version in $VERSIONS; do
  target="$ROOT/duckdb-$version"
  if [ -f "$target/.installed" ]; then
    echo "$target"
    continue
  fi
  echo "duckdb-readers.sh: installing DuckDB $version into $target (first run only) ..." >&2
  tmp="$target.tmp.$$"
  rm -rf "$tmp"
  # --no-deps: DuckDB's Python package needs nothing else to open a file and run SQL
  .venv/bin/python -m pip install --quiet --no-deps --target "$tmp" "duckdb==$version"
  rm -rf "$target"
  mv "$tmp" "$target"
  touch "$target/.installed"
  echo "$target"
done
