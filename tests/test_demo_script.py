"""`bash scripts/demo.sh` needs Python and pip only: run in a copy of the repository with
`apt-get`, `sudo`, `java`, `mvn` (and `curl`, `wget`) shadowed by failing stubs first on
PATH, it creates its own .venv, installs the project with pip, and still builds the
warehouse and prints the answers; none of the stubs is ever called.

pip runs offline here (`PIP_NO_INDEX`): the packages it would download are this test
environment's own, made visible through PYTHONPATH, so the test needs no network; the
script itself is unchanged."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

from gpuledger.pipeline.query import connect

REPO = Path(__file__).resolve().parents[1]
FORBIDDEN = ("apt-get", "sudo", "java", "mvn", "curl", "wget")


def _copy_repo(dest: Path) -> None:
    """The repository's files as a clone has them (tracked and new, not ignored)."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO,
                           capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, files):
        src = REPO / name
        if src.is_file():
            target = dest / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(src.read_bytes())
            target.chmod(src.stat().st_mode)


def test_demo_script_runs_without_root_apt_java_or_maven(tmp_path: Path) -> None:
    repo = tmp_path / "gpuledger"
    _copy_repo(repo)
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    calls = tmp_path / "calls.log"
    for name in FORBIDDEN:
        stub = stubs / name
        stub.write_text(f'#!/bin/sh\necho "{name} $*" >> {calls}\nexit 99\n')
        stub.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PIP_"))}
    env.update({
        "PATH": f"{stubs}{os.pathsep}{env['PATH']}",
        "PYTHON": sys.executable,
        "PYTHONPATH": sysconfig.get_paths()["purelib"],
        "PIP_NO_INDEX": "1", "PIP_NO_BUILD_ISOLATION": "0",
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    })
    proc = subprocess.run(["bash", "scripts/demo.sh", "--hours", "0.25", "--quiet"],
                          cwd=repo, env=env, capture_output=True, text=True, timeout=300,
                          check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert not calls.exists(), calls.read_text()
    # its own .venv, holding the copy's code, with the pipeline extra only
    assert (repo / ".venv/bin/gpuledger").is_file()
    assert (repo / ".venv/.gpuledger-installed").read_text().strip() == "pipeline"
    where = subprocess.run([str(repo / ".venv/bin/python"), "-c",
                            "import gpuledger.pipeline.demo as d; print(d.__file__)"],
                           env=env, capture_output=True, text=True, check=True).stdout
    assert where.startswith(str(repo)), where
    # the answers
    for heading in ("== Allocation vs use by pool and card type",
                    "== Allocation vs use by team", "== Top 10 wasting jobs",
                    "== Queue wait by queue"):
        assert heading in proc.stdout, proc.stdout[:2000]
    # the warehouse
    catalog = repo / "warehouse/catalog.duckdb"
    assert catalog.is_file()
    assert list((repo / "warehouse/facts/gpu_minute").rglob("*.parquet"))
    con = connect(repo / "warehouse")          # read-only, locked down
    try:
        gpus = con.execute("SELECT count(DISTINCT (node, gpu_index)) FROM gpu_minute").fetchone()
    finally:
        con.close()
    assert gpus == (576,)
    # a second run installs nothing again
    again = subprocess.run(["bash", "scripts/demo.sh", "--hours", "0.1", "--quiet",
                            "--warehouse", str(tmp_path / "wh2")], cwd=repo, env=env,
                           capture_output=True, text=True, timeout=300, check=False)
    assert again.returncode == 0, again.stderr[-4000:]
    assert "installing" not in again.stderr
    assert not calls.exists()
