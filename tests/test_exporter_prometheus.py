"""A real Prometheus scrapes the real exporter serving a simulated run's facts; the
values it holds equal the facts in the warehouse."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import polars as pl
import pytest
from prometheus_server import PrometheusServer, prometheus  # noqa: F401  (a fixture)
from test_exporter import by_share

from gpuledger.pipeline.config import ProcessorConfig
from gpuledger.pipeline.exporter import Exporter
from gpuledger.pipeline.facts.gpu_state import ALLOCATED_STATES
from gpuledger.pipeline.processor import Processor
from gpuledger.pipeline.simulate import SimConfig, simulate
from gpuledger.pipeline.warehouse import Warehouse, read_table

ALERTS = Path(__file__).parent.parent / "alerts"


def test_prometheus_holds_the_warehouse_facts(
        tmp_path: Path, prometheus: Callable[..., PrometheusServer]) -> None:  # noqa: F811
    proc = Processor(ProcessorConfig(), Warehouse(tmp_path / "wh"))
    exporter = Exporter(proc.config)
    exporter.attach(proc)
    port = exporter.start("127.0.0.1", 0)
    try:
        server = prometheus(targets=[f"127.0.0.1:{port}"],
                            rule_files=sorted(ALERTS.glob("gpuledger-*.yml")), interval_s=0.5)
        for batch in simulate(SimConfig(hours=1.5, seed=5, sample_interval_s=60)):
            proc.process(batch)
        proc.flush()
        gm = read_table(tmp_path / "wh", "gpu_minute")
        last = gm.filter(pl.col("minute") == pl.col("minute").max())
        minute = last["minute"][0].timestamp()
        server.wait_for("gpuledger_facts_minute_timestamp_seconds",
                        lambda r: bool(r) and float(r[0]["value"][1]) == minute)
        assert all(t["health"] == "up" for t in server.targets_up())
        # by share, as the warehouse's roll-ups count a GPU-minute
        parts = by_share(last)
        allocated = last.filter(pl.col("state").is_in(list(ALLOCATED_STATES)))
        held = parts.filter(pl.col("state").is_in(list(ALLOCATED_STATES)))
        want = dict(held.group_by("pool").agg(pl.col("gpus").sum()).iter_rows())
        got = server.values("sum by (pool) (gpuledger_allocated_gpus)", ["pool"])
        assert got.keys() == {(p,) for p in want}
        for (pool,), v in got.items():
            assert v == pytest.approx(want[pool])
        want_used = dict(held.group_by("pool").agg(pl.col("used").sum()).iter_rows())
        used = server.values("sum by (pool) (gpuledger_used_gpus)", ["pool"])
        assert used.keys() == {(p,) for p in want_used}
        for (pool,), v in used.items():
            assert v == pytest.approx(want_used[pool])
        states = server.values("sum by (state) (gpuledger_gpus)", ["state"])
        want_states = dict(parts.group_by("state").agg(pl.col("gpus").sum()).filter(
            pl.col("gpus") > 0).iter_rows())
        assert {s: v for (s,), v in states.items()} == pytest.approx(want_states)
        # the recording rules evaluate on what was scraped
        total = sum(want.values())
        rec = server.wait_for("pool_card_type:gpuledger_allocated_gpus:sum",
                              lambda r: abs(sum(float(x["value"][1]) for x in r) - total)
                              < 1e-6)
        assert {x["metric"]["pool"] for x in rec} == set(want)
        # job series: one per attempt running in the last minute, as the exporter serves it
        running = allocated.select("job_id").n_unique()
        jobs = server.wait_for("count(gpuledger_job_info)",
                               lambda r: bool(r) and float(r[0]["value"][1]) >= running)
        assert jobs and float(jobs[0]["value"][1]) >= running > 0
        # the alerting rules loaded and are evaluated by the real server
        groups = server.api("rules")["groups"]
        assert {g["name"] for g in groups} == {"gpuledger-alerts", "gpuledger-recording"}
        assert all(r["health"] != "err" for g in groups for r in g["rules"])
    finally:
        exporter.stop()
