"""Catching up on past input: nodes read a whole message behind the others hold the
windows (``Processor.advance`` with ``behind``), live they stop after node_stall_s."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path

import polars as pl
from test_simulate import SMALL

from gpuledger.pipeline import checkpoint
from gpuledger.pipeline.config import ProcessorConfig
from gpuledger.pipeline.processor import Processor
from gpuledger.pipeline.simulate import SimConfig, parse_cluster, simulate
from gpuledger.pipeline.warehouse import Warehouse


def _lagging_replay(root: Path, behind: bool,
                    now: Callable[[], datetime] | None = None) -> Processor:
    """Replay 10-minute messages where, after the first, half the nodes come one message
    late: their samples of minutes 10-20 are read with the others' of minutes 20-30."""
    batches = list(simulate(SimConfig(hours=3.0, seed=3, cluster=parse_cluster(SMALL))))
    nodes = sorted(set(batches[0]["telemetry"]["node"].to_list()))
    slow = set(nodes[::2])
    # close whatever the watermark passed at every batch, as after each 2 s of a replay
    windows = replace(ProcessorConfig().windows, catchup_close_interval_s=0.0)
    proc = Processor(replace(ProcessorConfig(), windows=windows), Warehouse(root),
                     telemetry_clock=True, now=now)
    proc.process(batches[0], validated=True, behind=behind)  # every node seen once
    held = batches[1]["telemetry"].clear()
    for batch in batches[1:]:
        tel = batch["telemetry"]
        fast = tel.filter(~pl.col("node").is_in(slow))
        now = {**batch, "telemetry": pl.concat([held, fast])}
        proc.process(now, validated=True, behind=behind)  # the held batch still waits
        held = tel.filter(pl.col("node").is_in(slow))
    proc.process({"telemetry": held}, validated=True)
    proc.flush()
    return proc


def test_a_node_read_a_message_behind_holds_the_windows_while_catching_up(
    tmp_path: Path,
) -> None:
    caught_up = _lagging_replay(tmp_path / "live", behind=False)
    replay = _lagging_replay(tmp_path / "replay", behind=True)
    # live, a node silent for 10 minutes (> node_stall_s) no longer holds the windows
    assert caught_up.counters.late_telemetry > 0
    # catching up on past input, it does: nothing is late
    assert replay.counters.late_telemetry == 0
    assert replay.counters.close_passes >= 10  # it closed minutes meanwhile
    assert replay.counters.records_in["telemetry"] == caught_up.counters.records_in["telemetry"]


def test_live_a_silent_node_stops_holding_after_node_stall_even_when_behind(
    tmp_path: Path,
) -> None:
    """Input near the wall clock is live, not a replay: a node silent longer than
    node_stall_s (a dead agent) must not hold every other node's facts for an hour."""
    start = SimConfig().start
    live = _lagging_replay(tmp_path / "live", behind=True,
                           now=lambda: start + timedelta(hours=3, minutes=1))
    assert live.counters.late_telemetry > 0


def test_minutes_held_back_stay_pending_across_a_restart(tmp_path: Path) -> None:
    """A checkpoint taken while catching up keeps the held-back closes pending, so the
    restarted service closes them even if no more input comes."""
    windows = replace(ProcessorConfig().windows, catchup_close_interval_s=3600.0)
    config = replace(ProcessorConfig(), windows=windows)
    batches = list(simulate(SimConfig(hours=1.0, seed=3, cluster=parse_cluster(SMALL))))
    proc = Processor(config, Warehouse(tmp_path / "a"), telemetry_clock=True)
    for batch in batches[:3]:  # 30 minutes: no whole hour passed yet
        proc.process(batch, validated=True, behind=True)
    assert proc.close_pending and proc.counters.close_passes == 0
    checkpoint.save(proc, {}, tmp_path / "state.checkpoint")
    again = Processor(config, Warehouse(tmp_path / "a"), telemetry_clock=True)
    assert checkpoint.load(again, tmp_path / "state.checkpoint") == {}
    assert again.close_pending
    held = again.closed_until
    again.advance()  # caught up: what the watermark passed closes now
    assert not again.close_pending
    assert again.closed_until is not None and held is not None and again.closed_until > held
