"""The simulator source plays one node of the core's simulator in real time."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import polars as pl
import pytest

from gpuledger.agent.sources.simulator import SimulatorNodeError, SimulatorSource
from gpuledger.pipeline.simulate import SimConfig, simulate

START = datetime(2026, 1, 5, tzinfo=UTC)


def test_samples_are_the_simulators_own_for_that_node_and_time() -> None:
    source = SimulatorSource("h100-003", interval_s=10, seed=3, hours=1, start=START)
    at = START + timedelta(minutes=17, seconds=34)               # → the 17:30 sample
    got = source.collect(at)
    batches = list(simulate(SimConfig(start=START, hours=1, seed=3, sample_interval_s=10)))
    frame = pl.concat([b["telemetry"] for b in batches]).filter(
        (pl.col("node") == "h100-003")
        & (pl.col("time") == START + timedelta(minutes=17, seconds=30)))
    want = sorted(frame.to_dicts(), key=lambda r: r["gpu_index"])
    assert len(got) == len(want) > 0
    for g, w in zip(got, want, strict=True):
        assert g["time"] == "2026-01-05T00:17:30.000Z"
        assert (g["gpu_uuid"], g["util_gpu"], g.get("sm_active")) == (
            w["gpu_uuid"], w["util_gpu"], w["sm_active"])
        assert g["processes"] == (w["processes"] or [])
    inv = source.inventory(None, at)
    inv_want = pl.concat([b["inventory"] for b in batches]).filter(
        pl.col("node") == "h100-003").row(0, named=True)
    assert inv["pool"] == inv_want["pool"] and inv["gpu_count"] == inv_want["gpu_count"]
    assert source.inventory("mine", at)["pool"] == "mine"


def test_an_unknown_node_is_refused() -> None:
    with pytest.raises(SimulatorNodeError, match="node: 'gpu-x' is not a node"):
        SimulatorSource("gpu-x", start=START)
