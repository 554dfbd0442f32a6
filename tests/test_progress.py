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


def test_diagnose_draws_one_bar_not_a_line_an_hour(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`diagnose` said "diagnosing N% …" once per hour of history it read (the
    openb trace: 1,209 lines); it draws the bar the imports draw."""
    cluster = tmp_path / "small.yaml"
    cluster.write_text(yaml.safe_dump(SMALL))
    wh = tmp_path / "demo"
    assert main(["demo", "--cluster", str(cluster), "--hours", "3", "--interval", "120",
                 "--warehouse", str(wh), "--quiet"]) == 0
    capsys.readouterr()
    _run(["diagnose", "--warehouse", str(wh), "--dry-run"], "diagnosing", "", capsys)
    assert main(["diagnose", "--warehouse", str(wh), "--dry-run"]) == 0
    err = capsys.readouterr().err
    assert err.count("diagnosing") == 1 and "100.0%" in err


def test_a_bar_stops_where_the_work_failed(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An import refused midway (the second of two exports does not read) leaves its bar
    where the reading stopped, above the error (it was drawn full)."""
    good, bad = tmp_path / "day1.txt", tmp_path / "day2.txt"
    good.write_text(HEADER + "\n" + "\n".join(ROWS) + "\n")
    fields = ROWS[0].split("|")
    fields[HEADER.split("|").index("Submit")] = "yesterday"
    bad.write_text(HEADER + "\n" + "|".join(fields) + "\n")
    assert main(["import", "slurm-sacct", str(good), str(bad), "--warehouse",
                 str(tmp_path / "wh")]) == 2
    err = capsys.readouterr().err
    assert "reading sacct" in err and BAR in err and "is not a time" in err, err
    assert "100.0%" not in err
