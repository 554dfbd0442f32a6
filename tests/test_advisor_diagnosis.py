"""Diagnosis of idle and inefficient GPU-minutes on synthetic minute series.

Each series is a job's GPU-minutes in the ``gpu_minute`` table's columns, built minute by
minute with the values a pattern shows; the state column follows the activity with the
default thresholds (idle < 5 %, inefficient < 30 %).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from gpuledger.pipeline.advisor.diagnosis import (
    DiagnosisConfig,
    DiagnosisState,
    diagnose,
    dominant,
    finish,
    update,
)
from gpuledger.pipeline.advisor.patterns import (
    CHECKPOINT,
    COMMUNICATION,
    INFERENCE,
    INPUT,
    MEMORY,
    NO_PROCESS,
    UNKNOWN,
)

T0 = datetime(2026, 1, 5, tzinfo=UTC)
Minute = Callable[[int], dict[str, Any]]


def series(minutes: int, values: Minute, *, job_id: str = "j", gpus: int = 1,
           job_type: str = "training", card: str = "H100-SXM5-80GB",
           dcgm: bool = True, nvlink: bool = True, start: int = 0) -> pl.DataFrame:
    """``gpus`` GPUs × ``minutes`` minutes; ``values(m)`` gives activity (and overrides)."""
    rows = []
    for m in range(minutes):
        v = {"activity": 0.9, "dram": 0.3, "pcie": 2e9, "nvl": 10e9, "processes": 1,
             **values(m)}
        act = v["activity"]
        state = ("allocated_idle" if act < 0.05 else "allocated_inefficient" if act < 0.3
                 else "allocated_busy")
        for g in range(gpus):
            rows.append({
                "minute": T0 + timedelta(minutes=start + m), "node": "n1", "gpu_index": g,
                "pool": "train", "card_type": card, "state": state, "alloc_fraction": 1.0,
                "jobs_on_gpu": 1, "job_id": job_id, "attempt": 0, "team": "t", "queue": "q",
                "job_type": job_type, "activity": act, "telemetry_samples": 6,
                "util_gpu": act * 100, "sm_active": act if dcgm else None,
                "dram_active": v["dram"] if dcgm else None,
                "pcie_rx_bytes_s": v["pcie"] * 0.8, "pcie_tx_bytes_s": v["pcie"] * 0.2,
                "nvlink_rx_bytes_s": v["nvl"] / 2 if nvlink else None,
                "nvlink_tx_bytes_s": v["nvl"] / 2 if nvlink else None,
                "processes": v["processes"], "idle_threshold": 0.05,
                "efficient_threshold": 0.30})
    return pl.DataFrame(rows)


def _patterns(frame: pl.DataFrame) -> dict[str, float]:
    out = diagnose(frame)
    return dict(out.select("pattern", "gpu_hours").iter_rows())


def _top(frame: pl.DataFrame) -> str:
    return str(dominant(diagnose(frame))["pattern"].item())


def test_input_bound_saw_tooth_between_loading_gaps() -> None:
    """Bursts of 7 busy minutes, 3 starved minutes at 3 %, links quiet: input-bound."""
    rows = series(120, lambda m: {"activity": 0.85 if m % 10 < 7 else 0.03, "pcie": 1e9})
    got = _patterns(rows)
    low_minutes = sum(1 for m in range(3, 120) if m % 10 >= 7)
    assert got[INPUT] * 60 == pytest.approx(low_minutes)
    assert set(got) == {INPUT}


def test_input_bound_steadily_starved() -> None:
    rows = series(90, lambda m: {"activity": 0.2 + 0.05 * (m % 3 == 0), "dram": 0.06,
                                 "pcie": 3e9})
    assert _top(rows) == INPUT
    ev = diagnose(rows).filter(pl.col("pattern") == INPUT).row(0, named=True)
    assert "PCIe 3.0 GB/s" in ev["evidence"] and "links and memory quiet" in ev["evidence"]
    assert "DataLoader workers" in ev["remedy"]


def test_communication_bound_needs_several_gpus_and_busy_links() -> None:
    comm = lambda m: {"activity": 0.18, "nvl": 220e9, "dram": 0.1}  # noqa: E731
    rows = series(60, comm, gpus=4)
    assert _top(rows) == COMMUNICATION
    assert diagnose(rows).filter(pl.col("pattern") == COMMUNICATION)["evidence"].item() \
        .startswith("SM active 18 % on 4 GPUs")
    # one GPU: the same traffic cannot be communication between GPUs
    assert COMMUNICATION not in _patterns(series(60, comm, gpus=1))


def test_memory_bound() -> None:
    rows = series(60, lambda m: {"activity": 0.2, "dram": 0.75})
    assert _top(rows) == MEMORY
    assert "DRAM active 75 % vs SM active 20 %" in diagnose(rows).filter(
        pl.col("pattern") == MEMORY)["evidence"].item()


def test_checkpoint_stalls_periodic_drops() -> None:
    """Busy at 90 % with a one-minute drop to 5 % every 15 minutes."""
    rows = series(150, lambda m: {"activity": 0.05 if m % 15 == 14 else 0.9})
    got = _patterns(rows)
    assert got[CHECKPOINT] * 60 == 10  # drops at minutes 14, 29, ..., 149
    assert set(got) == {CHECKPOINT}


def test_underfilled_inference_follows_the_day() -> None:
    """An inference service over 24 hours: activity follows the hour of day."""
    def load(m: int) -> dict[str, Any]:
        hour = (m // 60) % 24
        return {"activity": 0.12 + 0.4 * max(0.0, 1 - abs(hour - 16) / 12)}
    rows = series(24 * 60, load, job_type="inference", card="L40S-48GB", dcgm=False,
                  nvlink=False)
    out = diagnose(rows)
    # the first 3 minutes are start-up (unknown); every other low minute is the service's
    assert dict(out.select("pattern", "gpu_hours").iter_rows()) == pytest.approx(
        {INFERENCE: (rows.filter(pl.col("activity") < 0.3).height - 3) / 60, UNKNOWN: 3 / 60})
    top = dominant(out).row(0, named=True)
    assert top["pattern"] == INFERENCE
    assert "hourly mean from 12 % to" in top["evidence"]
    assert "scale replicas" in top["remedy"]


def test_held_with_no_process() -> None:
    rows = series(30, lambda m: {"activity": 0.0, "processes": 0}, job_type="interactive")
    got = diagnose(rows).row(0, named=True)
    assert got["pattern"] == NO_PROCESS and got["gpu_hours"] == pytest.approx(0.5)
    assert got["evidence"] == "no process on the GPU for 30 GPU-minutes"
    assert "release the GPUs" in got["remedy"]


@pytest.mark.parametrize("case", [
    "idle_notebook", "single_drop", "startup", "shared", "partial", "no_telemetry", "busy"])
def test_series_that_must_stay_unknown(case: str) -> None:
    if case == "idle_notebook":  # a process, almost no activity, no bursts
        rows = series(120, lambda m: {"activity": 0.003}, job_type="interactive")
    elif case == "single_drop":  # one drop in an otherwise busy hour: not periodic
        rows = series(70, lambda m: {"activity": 0.04 if m == 40 else 0.9})
    elif case == "startup":  # the first minutes of an attempt
        rows = series(30, lambda m: {"activity": 0.04 if m < 3 else 0.9})
    elif case == "shared":  # two jobs on one GPU: whose activity is it?
        rows = series(60, lambda m: {"activity": 0.1, "dram": 0.05}).with_columns(
            pl.lit(2).alias("jobs_on_gpu"))
    elif case == "partial":  # held for 20 s of each minute: the rest is someone else's
        rows = series(60, lambda m: {"activity": 0.1, "dram": 0.05}).with_columns(
            pl.lit(1 / 3).alias("occupied_share"), pl.lit(1 / 3).alias("alloc_fraction"))
    elif case == "no_telemetry":
        rows = series(60, lambda m: {"activity": 0.0}).with_columns(
            pl.lit(0).alias("telemetry_samples"), pl.lit(None, pl.Float64).alias("activity"))
    else:  # nothing to diagnose
        assert diagnose(series(60, lambda m: {"activity": 0.9})).is_empty()
        return
    got = _patterns(rows)
    assert set(got) == {UNKNOWN}, got


def test_no_pattern_from_fields_the_card_does_not_report() -> None:
    """On an L40S (util.gpu only, PCIe only) busy PCIe with low activity on a 4-GPU job
    and high DRAM cannot be claimed as communication- or memory-bound."""
    rows = series(60, lambda m: {"activity": 0.15, "pcie": 25e9, "dram": 0.9}, gpus=4,
                  card="L40S-48GB", dcgm=False, nvlink=False)
    got = _patterns(rows)
    assert COMMUNICATION not in got and MEMORY not in got


def test_incremental_equals_batch_and_state_is_bounded() -> None:
    """Batches of 7 minutes give the same rows as one batch; the window keeps at most
    2·35 + 4 minutes per GPU."""
    rows = pl.concat([
        series(180, lambda m: {"activity": 0.85 if m % 10 < 7 else 0.03}, job_id="a", gpus=2),
        series(180, lambda m: {"activity": 0.05 if m % 15 == 14 else 0.9}, job_id="b"),
        series(120, lambda m: {"activity": 0.2, "dram": 0.75}, job_id="c", start=30),
    ])
    batch = diagnose(rows)
    cfg = DiagnosisConfig()
    state = DiagnosisState()
    minutes = rows["minute"].unique().sort()
    biggest = 0
    for i in range(0, minutes.len(), 7):
        chunk = rows.filter(pl.col("minute").is_in(minutes[i:i + 7].implode()))
        state = update(state, chunk, cfg)
        per_gpu = state.window.group_by("job_id", "node", "gpu_index").len()["len"].max()
        biggest = max(biggest, int(per_gpu or 0))
    assert biggest <= 2 * cfg.window_minutes + 4
    done = finish(state, pl.DataFrame({"job_id": ["a", "b", "c"], "attempt": [0, 0, 0]}), cfg)
    assert done.state.window.is_empty() and done.state.totals.is_empty()
    assert_frame_equal(done.rows.sort("job_id", "pattern"), batch.sort("job_id", "pattern"),
                       check_exact=False, rel_tol=1e-9)
    assert sorted(batch["pattern"].unique()) == [CHECKPOINT, INPUT, MEMORY, UNKNOWN]  # start-up
    # shares of each attempt add up to 1
    assert batch.group_by("job_id").agg(pl.col("share").sum())["share"].to_list() == (
        pytest.approx([1.0, 1.0, 1.0]))
