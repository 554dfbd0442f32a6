"""GPU-minute states, pinned by hand-computed scenarios (docs/metrics.md, GPU state)."""

from __future__ import annotations

from collections.abc import Callable

import polars as pl
import pytest
from conftest import Facts
from events import alloc, at, inventory, job, series

from gpuledger.pipeline.config import ProcessorConfig, Thresholds
from gpuledger.pipeline.facts.gpu_state import STATES


def _states(facts: Facts) -> dict[tuple[int, str], int]:
    gm = facts.table("gpu_minute")
    counts = gm.group_by("gpu_index", "state").len()
    return {(i, s): n for i, s, n in counts.iter_rows()}


def test_each_state_from_a_small_node(process: Callable[..., Facts]) -> None:
    # 4 GPUs over 15 minutes; job j1 holds GPUs 0 and 1 from 10:02 to 10:12 (10 minutes).
    recs = [inventory("n1", at(0), gpus=4)]
    recs += [job("submitted", "j1", at(0), gpus=2),
             job("started", "j1", at(2), allocation=alloc("n1", 0, 1)),
             job("finished", "j1", at(12))]
    recs += series("n1", 0, at(0), 15, sm=0.5, jobs=["j1"])          # busy while held
    recs += series("n1", 1, at(0), 15, sm=0.02)                      # idle while held
    recs += series("n1", 2, at(0), 15, util=0.0)                     # never used: free
    recs += series("n1", 3, at(0), 15, util=50.0, jobs=[None])       # outside the scheduler
    facts = process(recs)
    s = _states(facts)
    assert s[(0, "allocated_busy")] == 10
    assert s[(0, "unaccounted_use")] == 5   # j1's process before/after its allocation
    assert s[(1, "allocated_idle")] == 10
    assert s[(1, "free")] == 5
    assert s[(2, "free")] == 15
    assert s[(3, "unaccounted_use")] == 15
    gm = facts.table("gpu_minute")
    assert gm.height == 60
    assert set(gm["state"].unique()) <= set(STATES)


def test_inefficient_boundaries_and_util_fallback(process: Callable[..., Facts]) -> None:
    recs = [inventory("n1", at(0), gpus=3, card="L40S-48GB")]
    recs += [job("submitted", "j", at(0), gpus=3),
             job("started", "j", at(0), allocation=alloc("n1", 0, 1, 2))]
    # no sm_active: activity = util/100; 5 % is not idle (idle is < 5 %), 30 % is busy
    recs += series("n1", 0, at(0), 5, util=5.0, card="L40S-48GB")
    recs += series("n1", 1, at(0), 5, util=29.0, card="L40S-48GB")
    recs += series("n1", 2, at(0), 5, util=30.0, card="L40S-48GB")
    s = _states(process(recs))
    assert s == {(0, "allocated_inefficient"): 5, (1, "allocated_inefficient"): 5,
                 (2, "allocated_busy"): 5}


def test_readings_are_stored_in_32_bits_and_a_threshold_they_round_below_still_holds(
        process: Callable[..., Facts]) -> None:
    # idle below 70 %: GPU 0 is at exactly 70 % (stored as 0.69999999, 32 bits), GPU 1
    # at 69.99 %; per minute and over the attempt (its idle GPUs), in the processor's
    # 32-bit comparison and in a 64-bit mean of the stored values; the PCIe rate keeps
    # 7 significant digits
    config = ProcessorConfig(thresholds=Thresholds(idle_activity=0.7, efficient_activity=0.8))
    recs = [inventory("n1", at(0), gpus=2),
            job("submitted", "j", at(0), gpus=2),
            job("started", "j", at(0), allocation=alloc("n1", 0, 1)),
            job("finished", "j", at(3))]
    recs += series("n1", 0, at(0), 3, sm=0.7, pcie_rx_bytes_s=1_234_567_891.0)
    recs += series("n1", 1, at(0), 3, sm=0.6999)
    facts = process(recs, config=config)
    assert _states(facts) == {(0, "allocated_inefficient"): 3, (1, "allocated_idle"): 3}
    assert facts.table("job_attempts")["idle_gpus"].to_list() == [1]
    files = sorted((facts.root / "facts" / "gpu_minute").rglob("gpu_minute-*.parquet"))
    schema = pl.read_parquet_schema(files[0])
    readings = ["activity", "sm_active", "util_gpu", "power_w", "mem_used_mib",
                "pcie_rx_bytes_s", "nvlink_tx_bytes_s", "temp_c"]
    assert {c: schema[c] for c in readings} == {c: pl.Float32 for c in readings}
    assert schema["alloc_fraction"] == pl.Float64  # accounting stays 64-bit
    gm = facts.table("gpu_minute").filter(pl.col("gpu_index") == 0)
    assert gm["activity"].to_list() == pytest.approx([0.7] * 3, rel=6e-8)
    assert gm["activity"][0] < 0.7  # 32 bits round 0.7 down, and the state holds
    assert gm["pcie_rx_bytes_s"].to_list() == pytest.approx([1_234_567_891.0] * 3, rel=6e-8)


def test_sm_active_wins_over_util(process: Callable[..., Facts]) -> None:
    recs = [inventory("n1", at(0), gpus=1),
            job("submitted", "j", at(0)), job("started", "j", at(0), allocation=alloc("n1", 0))]
    # util.gpu says 100 % but SMs are active 3 % of the time: idle
    recs += series("n1", 0, at(0), 3, util=100.0, sm=0.03)
    assert _states(process(recs)) == {(0, "allocated_idle"): 3}


def test_unavailable_cases(process: Callable[..., Facts]) -> None:
    recs = [inventory("a", at(0), gpus=2, unhealthy=[1]),            # GPU 1 unhealthy
            inventory("b", at(0), gpus=2, schedulable=False),        # drained
            inventory("c", at(0), gpus=1, health="down")]
    recs += [job("submitted", "j", at(0), gpus=1),
             job("started", "j", at(0), allocation=alloc("b", 0)),   # still runs while drained
             job("submitted", "k", at(0), gpus=1),
             job("started", "k", at(0), allocation=alloc("c", 0))]   # holds a down node's GPU
    recs += series("a", 0, at(0), 4, sm=0.0)
    recs += series("a", 0, at(4), 1, sm=0.0, xid_errors=1)           # XID in minute 4 only
    recs += series("b", 0, at(0), 5, sm=0.9, jobs=["j"])
    facts = process(recs)
    gm = facts.table("gpu_minute")
    counts = gm.group_by("node", "gpu_index", "state").len()
    by = {(n, i, s): c for n, i, s, c in counts.iter_rows()}
    assert by[("a", 0, "free")] == 4
    assert by[("a", 0, "unavailable")] == 1
    assert by[("a", 1, "unavailable")] == 5
    assert by[("b", 0, "allocated_busy")] == 5
    assert by[("b", 1, "unavailable")] == 5
    assert by[("c", 0, "unavailable")] == 5


def test_a_minute_holds_the_seconds_each_allocation_held(process: Callable[..., Facts]) -> None:
    # Changed on purpose by second-accurate accounting (it used to be "the minute belongs to
    # the allocation at its middle"): j holds 10:00:20–10:02:40, k 10:03:40–10:04:20.
    recs = [inventory("n1", at(0), gpus=1),
            job("submitted", "j", at(0)),
            job("started", "j", at(0, 20), allocation=alloc("n1", 0)),
            job("finished", "j", at(2, 40)),
            job("submitted", "k", at(0)),
            job("started", "k", at(3, 40), allocation=alloc("n1", 0)),
            job("finished", "k", at(4, 20))]
    recs += series("n1", 0, at(0), 6, sm=0.0)
    facts = process(recs)
    gm = facts.table("gpu_minute").sort("minute")
    assert gm["state"].to_list() == ["allocated_idle"] * 5 + ["free"]
    assert gm["alloc_fraction"].to_list() == pytest.approx([40 / 60, 1, 40 / 60, 20 / 60,
                                                            20 / 60, 0])
    assert gm["job_id"].to_list() == ["j", "j", "j", "k", "k", None]
    att = {r["job_id"]: r for r in facts.table("job_attempts").iter_rows(named=True)}
    assert att["j"]["allocated_gpu_hours"] == pytest.approx(140 / 3600)   # 2 min 20 s
    assert att["k"]["allocated_gpu_hours"] == pytest.approx(40 / 3600)    # 40 s
    hourly = facts.table("gpu_hourly")
    assert hourly["allocated_gpu_hours"].sum() == pytest.approx(180 / 3600)
    assert hourly["free_gpu_hours"].sum() == pytest.approx((360 - 180) / 3600)


def test_states_add_up_to_capacity(process: Callable[..., Facts]) -> None:
    recs = [inventory("n1", at(0), gpus=8), inventory("n2", at(0), gpus=8)]
    recs += [job("submitted", "j", at(0), gpus=8),
             job("started", "j", at(1), allocation=alloc("n1", *range(8))),
             job("finished", "j", at(7))]
    for i in range(8):
        recs += series("n1", i, at(0), 9, sm=0.1 * i)
    facts = process(recs)
    gm = facts.table("gpu_minute")
    per_minute = gm.group_by("minute").len()
    assert per_minute["len"].unique().to_list() == [16]
    hourly = facts.table("gpu_hourly")
    state_cols = [f"{s}_gpu_hours" for s in STATES]
    total = hourly.select(pl.sum_horizontal(state_cols).sum()).item()
    assert abs(total - hourly["gpu_hours"].sum()) < 1e-9
    assert (hourly["used_gpu_hours"] <= hourly["allocated_gpu_hours"] + 1e-12).all()
