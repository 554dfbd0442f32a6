"""The lean base install: the agent side must not pull the heavy pipeline libraries."""

from __future__ import annotations

import re
import subprocess
import sys
from importlib.metadata import requires

HEAVY = ("polars", "duckdb", "pyarrow", "numpy")


def test_base_requirements_exclude_heavy_libraries() -> None:
    reqs = requires("gpuledger") or []
    base = [r for r in reqs if "extra" not in r]
    assert base, "the base install has its own requirements"
    for r in base:
        assert not r.lower().startswith(HEAVY), r
    pipeline = [r for r in reqs if "pipeline" in r.replace('"', "'").split("extra == ")[-1]
                and "extra" in r]
    names = {m.group(0).lower() for r in pipeline if (m := re.match(r"[A-Za-z0-9_.-]+", r))}
    assert names >= {"polars", "duckdb", "pyarrow"}


def test_contract_and_cli_import_without_heavy_libraries() -> None:
    blocker = "; ".join(f"sys.modules[{m!r}] = None" for m in HEAVY)
    code = (f"import sys; {blocker}; import gpuledger.contract.schema, gpuledger.cli.main; "
            "from gpuledger.cli.main import main; "
            "sys.exit(main(['query', '--warehouse', '.', 'SELECT 1']))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2, done.stderr
    assert "needs the pipeline extra" in done.stderr
