"""catalog.duckdb opens in the DuckDB an analyst may have, not only in the one that wrote
it: every view and table macro runs, with the same columns and rows, in DuckDB 1.1 (the
oldest the catalog supports) and 1.4 (the 1.x long-term release) as in this one.

The older releases are installed by scripts/duckdb-readers.sh (part of scripts/setup.sh)
into cache folders; each runs in a Python of its own (``-S``: the virtual environment's
DuckDB is not on its path)."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest
from sim_warehouse import build

from gpuledger.pipeline.warehouse import CATALOG, CATALOG_STORAGE_VERSION

READERS = os.environ.get("GPULEDGER_DUCKDB_READERS", "1.1.3 1.4.5").split()
READER_ROOT = Path(os.environ.get("GPULEDGER_DUCKDB_HOME",
                                  Path.home() / ".cache" / "gpuledger"))
STORAGE_NUMBER = {"v1.1.0": 64}
"""DuckDB's storage version number (the file header's) for CATALOG_STORAGE_VERSION."""

# every view and table macro of the file: its columns and its row count
SURVEY = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import duckdb
con = duckdb.connect(sys.argv[2], read_only=True)
out = {"version": duckdb.__version__, "objects": {}, "errors": {}}
views = [r[0] for r in con.execute(
    "SELECT view_name FROM duckdb_views() WHERE NOT internal ORDER BY 1").fetchall()]
macros = [r[0] for r in con.execute(
    "SELECT DISTINCT function_name FROM duckdb_functions() "
    "WHERE function_type = 'table_macro' AND NOT internal ORDER BY 1").fetchall()]
for name, source in [(v, v) for v in views] + [(m, m + "()") for m in macros]:
    try:
        rel = con.sql("SELECT * FROM " + source)
        out["objects"][name] = [rel.columns, con.execute(
            "SELECT count(*) FROM " + source).fetchone()[0]]
    except Exception as exc:
        out["errors"][name] = str(exc).splitlines()[0]
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def catalog(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(tmp_path_factory.mktemp("readers") / "wh") / CATALOG


def _survey(python_path: str, catalog: Path) -> dict[str, object]:
    done = subprocess.run([sys.executable, "-S", "-c", SURVEY, python_path, str(catalog)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    result: dict[str, object] = json.loads(done.stdout)
    return result


def test_catalog_is_written_in_the_older_storage_format(catalog: Path) -> None:
    header = catalog.read_bytes()[:20]
    assert header[8:12] == b"DUCK"
    assert struct.unpack("<Q", header[12:20])[0] == STORAGE_NUMBER[CATALOG_STORAGE_VERSION]


@pytest.mark.parametrize("version", READERS)
def test_older_duckdb_runs_every_view_and_macro(catalog: Path, version: str) -> None:
    folder = READER_ROOT / f"duckdb-{version}"
    assert (folder / ".installed").exists(), (
        f"DuckDB {version} is not installed in {folder}: run scripts/duckdb-readers.sh")
    here = _survey(str(Path(duckdb.__file__).parents[1]), catalog)
    there = _survey(str(folder), catalog)
    assert there["version"] == version
    assert here["errors"] == {} and there["errors"] == {}, there["errors"]
    objects = here["objects"]
    assert isinstance(objects, dict) and len(objects) >= 40  # 33 views, 11 macros today
    # the simulated warehouse gives most of them rows, so the counts say something
    assert sum(1 for _cols, rows in objects.values() if rows) >= 30
    assert there["objects"] == objects
