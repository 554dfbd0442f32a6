"""Every command with a progress bar draws it on stderr; stdout holds the summary alone,
so that `gpuledger import openb … > summary.txt` stays clean."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from test_import_openb import NODES, PODS
from test_import_pods import COLUMNS
from test_import_pods import _write as write_pods
from test_import_slurm_sacct import HEADER, ROWS
from test_simulate import SMALL

from gpuledger.cli.main import main

BAR = "━"  # what rich draws a bar with


def _run(argv: list[str], label: str, summary: str,
         capsys: pytest.CaptureFixture[str]) -> str:
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert label in captured.err and BAR in captured.err, captured.err[-500:]
    assert label not in captured.out and BAR not in captured.out
    assert summary in captured.out
    return captured.out


def test_demo_simulate_and_ingest(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cluster = tmp_path / "small.yaml"
    cluster.write_text(yaml.safe_dump(SMALL))
    _run(["demo", "--cluster", str(cluster), "--hours", "0.25", "--interval", "60",
          "--warehouse", str(tmp_path / "demo")], "simulating 0.25 h and processing",
         "processed", capsys)
    events = tmp_path / "events"
    _run(["simulate", "--cluster", str(cluster), "--hours", "0.25", "--interval", "60",
          "--out", str(events)], "simulating 0.25 h", "telemetry.jsonl", capsys)
    _run(["ingest", *map(str, sorted(events.glob("*.jsonl"))), "--warehouse",
          str(tmp_path / "ingested")], "ingesting", "ingested", capsys)


def test_imports(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sacct = tmp_path / "sacct.txt"
    sacct.write_text(HEADER + "\n" + "\n".join(ROWS) + "\n")
    _run(["import", "slurm-sacct", str(sacct), "--warehouse", str(tmp_path / "sacct")],
         "importing sacct", "sacct:", capsys)
    pods, nodes, _ = write_pods(tmp_path)
    columns = ",".join(f"{k}={v}" for k, v in COLUMNS.items())
    _run(["import", "pods", str(pods), "--columns", columns, "--nodes", str(nodes),
          "--warehouse", str(tmp_path / "pods")], "importing pods", "pods:", capsys)


def test_import_openb(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _run(["import", "openb", "--nodes", str(NODES), "--pods", str(PODS), "--from-hours",
          "3552", "--hours", "0.25", "--warehouse", str(tmp_path / "openb")],
         "importing openb", "openb:", capsys)
