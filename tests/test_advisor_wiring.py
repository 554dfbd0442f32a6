"""The diagnosis on a real warehouse (``gpuledger diagnose``, the ``job_diagnosis`` view),
and the advisor's plug-in points: the recommendation column, the Job board panel, the
report section and the alert evidence line."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import polars as pl
import pytest
import sim_warehouse
from events import alloc, at, frames, inventory, job, series
from rich.console import Console

from gpuledger.cli.main import main
from gpuledger.pipeline import query
from gpuledger.pipeline.advisor.diagnosis import JOB_DIAGNOSIS
from gpuledger.pipeline.advisor.diagnosis_batch import diagnose_warehouse
from gpuledger.pipeline.advisor.output import print_section
from gpuledger.pipeline.advisor.patterns import PATTERNS
from gpuledger.pipeline.advisor.wiring import (
    JOB_PANEL_SQL,
    job_board_panel,
    whatif_answer,
    whatif_section,
    with_cause,
)
from gpuledger.pipeline.alerts.engine import AlertEngine
from gpuledger.pipeline.alerts.sinks import ListSink
from gpuledger.pipeline.analyst_report.answers import answer_all
from gpuledger.pipeline.analyst_report.html import render_html
from gpuledger.pipeline.analyst_report.terminal import print_report
from gpuledger.pipeline.config import ProcessorConfig
from gpuledger.pipeline.dashboards.builders import Board
from gpuledger.pipeline.processor import Processor
from gpuledger.pipeline.warehouse import Warehouse, published_files


@pytest.fixture(scope="module")
def wh(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return sim_warehouse.build(tmp_path_factory.mktemp("sim") / "wh", diagnose=False)


def _files(root: Path) -> dict[str, bytes]:
    """The published job_diagnosis files by logical name, with their bytes."""
    return {name: (root / obj).read_bytes() for name, obj in published_files(root).items()
            if name.startswith("facts/job_diagnosis/")}


def test_diagnose_writes_the_job_diagnosis_fact(wh: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    # the processor made the (empty) view before any diagnosis
    _, rows = query.run(wh, "SELECT count(*) FROM job_diagnosis")
    assert rows == [(0,)]
    assert main(["diagnose", "--warehouse", str(wh), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "Idle and inefficient GPU-hours by pattern" in out and "wrote" in out
    _, rows = query.run(wh, "SELECT pattern, sum(gpu_hours), count(DISTINCT job_id) "
                               "FROM job_diagnosis GROUP BY ALL")
    got = {p: h for p, h, _ in rows}
    assert set(got) <= set(PATTERNS) and len(got) >= 4
    # every attempt's shares add up to 1, and the GPU-hours to its idle + inefficient ones
    d = sim_warehouse.table(wh, "job_diagnosis")
    assert d.schema == JOB_DIAGNOSIS
    sums = d.group_by("job_id", "attempt").agg(pl.col("share").sum(), pl.col("gpu_hours").sum())
    assert sums["share"].to_list() == pytest.approx([1.0] * sums.height)
    _, waste = query.run(wh, "SELECT job_id, attempt, coalesce(idle_gpu_hours, 0) "
                             "+ coalesce(inefficient_gpu_hours, 0) FROM attempts "
                             "WHERE started_at IS NOT NULL")
    want = {(j, a): w for j, a, w in waste if w * 60 >= 0.01}
    got_hours = {(j, a): g for j, a, _s, g in sums.iter_rows()}
    assert got_hours == pytest.approx(want, abs=1e-6)
    # a re-run writes the same bytes; --dry-run writes nothing; --json prints the rows
    before = _files(wh)
    assert main(["diagnose", "--warehouse", str(wh), "--quiet"]) == 0
    assert _files(wh) == before
    capsys.readouterr()
    assert main(["diagnose", "--warehouse", str(wh), "--quiet", "--json", "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == d.height and json.loads(lines[0])["pattern"] in PATTERNS


def test_diagnose_covers_shared_gpus_and_leaves_running_attempts_unended(
        wh: Path) -> None:
    # gpu_minute names one job per GPU: the other job of a shared GPU is still diagnosed
    # (as unknown), and an attempt still running has no ended_at
    diagnosed = diagnose_warehouse(wh, write=False).rows
    _, rows = query.run(wh, "SELECT job_id, attempt, ended_at, coalesce(idle_gpu_hours, 0) "
                            "+ coalesce(inefficient_gpu_hours, 0) FROM attempts "
                            "WHERE started_at IS NOT NULL")
    ends = {(j, a): e for j, a, e, _w in rows}
    waste = {(j, a): w for j, a, _e, w in rows}
    gm = sim_warehouse.table(wh, "gpu_minute")
    named = set(gm.select("job_id", "attempt").drop_nulls().unique().iter_rows())
    unnamed = {k for j, a, _e, w in rows if w > 0.05 and (k := (j, a)) not in named}
    assert unnamed, "the simulated warehouse has no attempt only on shared GPUs"
    per = diagnosed.group_by("job_id", "attempt").agg(pl.col("gpu_hours").sum(),
                                                      pl.col("ended_at").first())
    got = {(j, a): (g, e) for j, a, g, e in per.iter_rows()}
    for k in unnamed:
        assert got[k][0] == pytest.approx(waste[k])
    assert any(e is None for e in ends.values())
    for k, (_g, e) in got.items():
        assert e == ends[k], k


def test_diagnose_reports_a_missing_warehouse(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diagnose", "--warehouse", str(tmp_path / "nope"), "--quiet"]) == 2
    assert capsys.readouterr().err.strip() == (
        f"gpuledger: error: {tmp_path / 'nope'}: no such folder")
    (tmp_path / "empty").mkdir()
    assert main(["diagnose", "--warehouse", str(tmp_path / "empty"), "--quiet"]) == 2
    assert capsys.readouterr().err.strip() == (
        f"gpuledger: error: {tmp_path / 'empty'}: not a gpuledger warehouse (no facts/ folder)")


def test_job_board_panel_and_recommendation_column(wh: Path) -> None:
    main(["diagnose", "--warehouse", str(wh), "--quiet"])
    board = Board("j", "t", "d")
    job_board_panel(board)
    panel = board.json([])["panels"][-1]
    assert panel["title"] == "Why idle or inefficient (diagnosis)"
    assert "FROM job_diagnosis" in panel["targets"][0]["rawSql"]
    # the panel's SQL runs on the warehouse for a job that has a diagnosis
    d = sim_warehouse.table(wh, "job_diagnosis")
    job_id = d.sort("gpu_hours", descending=True)["job_id"][0]
    cols, rows = query.run(wh, JOB_PANEL_SQL.replace("${job:sqlstring}", f"'{job_id}'"))
    assert cols[:3] == ["attempt", "pattern", "gpu_hours"] and rows
    recs = sim_warehouse.table(wh, "recommendations").filter(pl.col("job_id").is_not_null())
    both = with_cause(recs, d)
    assert both.height == recs.height
    assert both["diagnosis"].drop_nulls().is_in(list(PATTERNS)).all()
    assert both["diagnosis"].null_count() < both.height


def test_report_section(wh: Path) -> None:
    # as one of the report's answers, drawn by its own renderers
    report = answer_all(wh)
    report.answers.append(whatif_answer(wh))
    console = Console(width=120, record=True)
    print_report(report, console, 10)
    text = console.export_text()
    assert "What if: the same history under other policies" in text and "fgd" in text
    page = render_html(report, str(wh), datetime(2026, 1, 6, tzinfo=UTC), 10)
    assert 'id="whatif"' in page or "What if: the same history" in page
    # and on its own
    section = whatif_section(wh)
    labels = [r[0] for r in section.rows]
    assert labels[0] == "observed" and labels[1] == "as-run" and "fgd" in labels
    assert labels[-1].startswith("calibration error (as-run")
    assert section.columns[0] == "policy" and len(section.rows[0]) == len(section.columns)
    console = Console(width=150, record=True)
    print_section(section, console)
    assert "What if" in console.export_text()
    # 80 columns (a pipe): headers and names wrap, no figure is cut ("1,05…")
    console = Console(width=80, record=True)
    print_section(section, console)
    narrow = console.export_text()
    assert "…" not in narrow and max(map(len, narrow.splitlines())) <= 80
    words = set(narrow.split())
    for row in section.rows:
        for v in row[1:]:
            assert v is None or (f"{v:,}" if isinstance(v, float) else str(v)) in words, v


def _telemetry(node: str, gpu: int, job_id: str, minutes: int, sm: float) -> list[dict[str, Any]]:
    return series(node, gpu, at(0), minutes, sm=sm, jobs=[job_id], seq0=gpu * 10_000,
                  pcie_rx_bytes_s=0.8e9, pcie_tx_bytes_s=0.2e9, dram_active=0.05)


def test_low_utilisation_alert_names_its_likely_cause(tmp_path: Path) -> None:
    """A job starved at 6 % with quiet PCIe: the alert's evidence says input-bound."""
    recs = [inventory("n1", at(0), gpus=2),
            job("submitted", "slow", at(0)), job("started", "slow", at(0),
                                                 allocation=alloc("n1", 0)),
            job("finished", "slow", at(40)),
            *_telemetry("n1", 0, "slow", 45, 0.06), *series("n1", 1, at(0), 45, sm=0.0)]
    config = ProcessorConfig()
    proc = Processor(config, Warehouse(tmp_path / "wh"))
    sink = ListSink()
    engine = AlertEngine(config, [sink])
    engine.attach(proc)
    t = at(0)
    while t <= at(45):
        proc.process(frames([r for r in recs if t <= r["time"] < t + timedelta(minutes=5)]))
        t += timedelta(minutes=5)
    proc.flush()
    fire = next(e for e in sink.events if e.name == "GpuJobLowUtilisation")
    assert fire.evidence["likely_cause"] == "input_bound"
    assert "PCIe 1.0 GB/s" in fire.evidence["likely_cause_evidence"]
    assert "Likely cause: input-bound (activity 6 %" in fire.description
    assert "DataLoader workers" in fire.description


def test_the_whatif_rows_round_as_the_reports_sql_does() -> None:
    """The report's other sections are rounded by DuckDB (halves away from zero); the
    what-if rows read 0.2 for a value the summary showed as 0.3."""
    import random

    import duckdb

    from gpuledger.pipeline.advisor.output import sql_round

    rng = random.Random(7)
    values = [0.25, -0.25, 0.35, 2.675, 1.005, 0.05, 0.0, -0.0, 1e-12, 12345.65, 2.5, -1.5,
              *[rng.uniform(-1e4, 1e4) for _ in range(300)],
              *[round(rng.uniform(0, 100), 3) for _ in range(300)]]
    con = duckdb.connect()
    for digits in (0, 1, 2, 3):
        expected = [r[0] for r in con.execute(
            f"SELECT round(v, {digits}) FROM unnest(?::DOUBLE[]) t(v)", [values]).fetchall()]
        assert [sql_round(v, digits) for v in values] == expected, digits
    assert sql_round(0.25, 1) == 0.3 and round(0.25, 1) == 0.2
    assert sql_round(float("nan"), 1) != sql_round(float("nan"), 1)
