"""Properties of the whole pipeline over a simulated cluster (real Parquet, real DuckDB)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import polars as pl
import pytest
from fact_views import view
from test_simulate import SMALL

from gpuledger.pipeline import query
from gpuledger.pipeline.config import ProcessorConfig
from gpuledger.pipeline.demo import run_demo
from gpuledger.pipeline.facts.gpu_state import STATES
from gpuledger.pipeline.ingest import ingest
from gpuledger.pipeline.simulate import SimConfig, parse_cluster, simulate, write_jsonl
from gpuledger.pipeline.warehouse import published_files, read_table

HOURS = 2.0


def _sim(seed: int = 7) -> SimConfig:
    return SimConfig(hours=HOURS, seed=seed, cluster=parse_cluster(SMALL))


def digest(root: Path) -> dict[str, str]:
    """Hash of every fact file, published or replaced (the catalog embeds its own path,
    so it is left out)."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted((root / "facts").rglob("*.parquet"))}


def published_digest(root: Path) -> dict[str, str]:
    """Hash of every published fact file, by its logical name. (An ingest ending inside a
    minute closes that minute in a step of its own, after saving a state inside it: the
    day's roll-up written in the step before is replaced, and kept for readers, as any
    replaced object is.)"""
    return {name: hashlib.sha256((root / obj).read_bytes()).hexdigest()
            for name, obj in sorted(published_files(root).items())
            if name.startswith("facts/") and name.endswith(".parquet")}


@pytest.fixture(scope="module")
def demo_wh(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("demo")
    run_demo(_sim(), ProcessorConfig(), root)
    return root


def table(root: Path, name: str) -> pl.DataFrame:
    """A table's rows (``gpu_minute`` through its view: spans of GPUs without telemetry
    expanded)."""
    if name == "gpu_minute":
        return view(root, name)
    return read_table(root, name)


def test_same_seed_gives_identical_files(demo_wh: Path, tmp_path: Path) -> None:
    run_demo(_sim(), ProcessorConfig(), tmp_path / "again")
    assert digest(tmp_path / "again") == digest(demo_wh)
    run_demo(_sim(seed=8), ProcessorConfig(), tmp_path / "other")
    assert digest(tmp_path / "other") != digest(demo_wh)


def test_states_of_each_pool_minute_add_up_to_capacity(demo_wh: Path) -> None:
    gm = table(demo_wh, "gpu_minute")
    assert set(gm["state"].unique()) <= set(STATES)
    capacity = sum(g["nodes"] * g["gpus_per_node"] for g in SMALL["node_groups"])  # type: ignore[index]
    per_minute = gm.group_by("minute").len()
    assert per_minute["len"].unique().to_list() == [capacity]
    assert gm.select(pl.struct("minute", "node", "gpu_index").is_unique().all()).item()
    hourly = table(demo_wh, "gpu_hourly")
    states = hourly.select(pl.sum_horizontal([f"{s}_gpu_hours" for s in STATES]))
    assert states.to_series().sum() == pytest.approx(hourly["gpu_hours"].sum())
    assert hourly["gpu_hours"].sum() == pytest.approx(capacity * HOURS)


def test_used_never_exceeds_allocated(demo_wh: Path) -> None:
    for name in ("job_attempts", "gpu_hourly", "gpu_daily"):
        t = table(demo_wh, name)
        assert t.height > 0
        assert (t["used_gpu_hours"] <= t["allocated_gpu_hours"] + 1e-9).all(), name
    att = table(demo_wh, "job_attempts")
    assert (att["idle_gpu_hours"] + att["inefficient_gpu_hours"]
            <= att["allocated_gpu_hours"] + 1e-9).all()


def test_fragmentation_bounds(demo_wh: Path) -> None:
    frag = table(demo_wh, "frag_minute")
    assert frag.height > 0
    assert (frag["frag_1"] == 0).all()
    for k in ("frag_2", "frag_4", "frag_8", "frag_node"):
        assert frag[k].is_between(0, 1).all()
    # larger jobs are never easier to place
    assert (frag["frag_2"] <= frag["frag_4"] + 1e-12).all()
    assert (frag["frag_4"] <= frag["frag_8"] + 1e-12).all()
    assert (frag["blocked_gpus"] <= frag["pending_gpus"]).all()


def test_queue_waits_and_job_totals_are_consistent(demo_wh: Path) -> None:
    att = table(demo_wh, "job_attempts")
    waits = att["queue_wait_s"].drop_nulls()
    assert (waits >= 0).all() and waits.max() > 0
    # exact to the second: the shares of all GPU-minutes (Σ fraction × seconds held / 60)
    # add up to the jobs' allocated GPU-minutes, ended and running, but for the minutes
    # a held GPU was unavailable: the GPU's time, not the jobs'
    gm = table(demo_wh, "gpu_minute").filter(pl.col("state") != "unavailable")
    running = table(demo_wh, "running_attempts")
    jobs_min = (att["allocated_gpu_hours"].sum() + running["allocated_gpu_hours"].sum()) * 60
    assert gm["alloc_fraction"].sum() == pytest.approx(jobs_min, rel=1e-9)
    # and each ended attempt's GPUs add up to its total
    per_gpu = table(demo_wh, "job_gpu").group_by("job_id", "attempt").agg(
        pl.col("allocated_gpu_hours").sum().alias("gpu_parts"))
    both = att.join(per_gpu, on=["job_id", "attempt"])
    assert both.height > 10
    assert (both["allocated_gpu_hours"] - both["gpu_parts"]).abs().max() < 1e-6


def test_catalog_views_answer(demo_wh: Path) -> None:
    for name in ("attempts", "utilisation_by_pool", "utilisation_by_team", "queue_wait",
                 "job_gpu_memory", "borrowing", "preemption_cost", "fragmentation",
                 "team_recommendations", "pending_minute", "blocked_minute", "candidates"):
        columns, _rows = query.run(demo_wh, f"SELECT * FROM {name} LIMIT 5")
        assert columns, name
    _, rows = query.run(demo_wh, "SELECT count(*) FROM utilisation_by_pool")
    assert rows[0][0] == 3


def test_ingest_of_the_same_events_gives_the_same_facts(demo_wh: Path, tmp_path: Path) -> None:
    events = tmp_path / "events"
    write_jsonl(simulate(_sim()), events)
    files = sorted(events.glob("*.jsonl"))
    first = tmp_path / "ingest1"
    result = ingest(files, first, ProcessorConfig())
    assert result.rejects.height == 0
    assert len(published_digest(first)) > 10
    assert published_digest(first) == published_digest(demo_wh)   # JSON path == bus path
    ingest(files, first, ProcessorConfig())          # again, into the same warehouse
    assert published_digest(first) == published_digest(demo_wh)
