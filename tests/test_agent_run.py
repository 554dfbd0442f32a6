"""The agent loop on a real spool: numbering, attribution, inventory, failures, restarts."""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from agent_sources import TinySource

from gpuledger.agent.attribution import Chain
from gpuledger.agent.attribution.static import StaticAttribution
from gpuledger.agent.config import AgentConfig, InventoryConfig
from gpuledger.agent.run import Agent, SharedSpool
from gpuledger.agent.spool import SpoolError
from gpuledger.pipeline.decode import decode_jsonl

T0 = datetime(2026, 1, 5, 10, 0, tzinfo=UTC)
TEL, INV = "t.tel", "t.inv"


def _config(**inventory: object) -> AgentConfig:
    inv = replace(InventoryConfig(), check_s=1e-9, **inventory)  # type: ignore[arg-type]
    return AgentConfig(node="gpu-a-001", agent_id="agent-7", interval_s=0.05, inventory=inv)


def _agent(folder: Path, source: TinySource, **inventory: object) -> Agent:
    spool = SharedSpool(folder, max_bytes=1 << 20, segment_bytes=1 << 16)
    chain = Chain([StaticAttribution(gpus={"0": "job-17"})])
    return Agent(_config(**inventory), source, chain, spool, None, TEL, INV)


def _spooled(agent: Agent) -> list[tuple[str, bytes, list[dict[str, object]]]]:
    assert agent.spool is not None
    return [(m.topic, m.key, [json.loads(line) for line in m.value.splitlines()])
            for m in agent.spool.pending()]


def test_cycles_number_attribute_and_spool_contract_records(tmp_path: Path) -> None:
    source = TinySource(gpus=3)
    agent = _agent(tmp_path / "spool", source, pool="train")
    for k in range(4):
        agent.cycle(T0 + timedelta(seconds=10 * k))
    msgs = _spooled(agent)
    tel = [recs for topic, _, recs in msgs if topic == TEL]
    inv = [recs for topic, _, recs in msgs if topic == INV]
    assert {key for _, key, _ in msgs} == {b"gpu-a-001"}
    assert len(tel) == 4 and len(inv) == 1                       # inventory unchanged
    samples = [r for recs in tel for r in recs]
    assert [r["seq"] for r in samples] == list(range(12))        # the agent's numbering
    assert {(r["node"], r["agent"]) for r in samples} == {("gpu-a-001", "agent-7")}
    assert samples[0]["processes"] == [{"pid": 100, "used_mib": 3.0, "job_id": "job-17"}]
    assert samples[1]["processes"] == [] and samples[2]["processes"] == []
    assert inv[0][0]["pool"] == "train" and inv[0][0]["gpu_count"] == 3
    data = b"".join(m.value for m in agent.spool.pending())       # type: ignore[union-attr]
    decoded = decode_jsonl(data, now=T0 + timedelta(minutes=1))
    assert decoded.rejects.height == 0
    assert decoded.frames["telemetry"].height == 12 and decoded.frames["inventory"].height == 1


class GlitchingSource(TinySource):
    """GPU 1 reports more memory used than it has, GPU 0's processes add up to more."""

    def collect(self, now: datetime | None = None) -> list[dict[str, Any]]:
        records = super().collect(now)
        records[1]["mem_used_mib"] = 99_000.0
        records[0]["processes"] = [{"pid": 100, "used_mib": 60_000.0, "job_id": None},
                                   {"pid": 101, "used_mib": 30_000.0, "job_id": None}]
        return records


def test_memory_readings_that_contradict_the_gpu_are_left_out(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A driver glitch: more memory used than the GPU has (81,559 MiB), or processes
    adding up to more. The processor rejects such a sample whole, activity and all; the
    agent leaves out the reading that cannot be right, keeps the rest, counts it and
    warns once per field."""
    agent = _agent(tmp_path / "spool", GlitchingSource(gpus=3), pool="train")
    with caplog.at_level(logging.WARNING, logger="gpuledger.agent"):
        for k in range(2):
            agent.cycle(T0 + timedelta(seconds=10 * k))
    samples = [r for topic, _, recs in _spooled(agent) if topic == TEL for r in recs]
    assert len(samples) == 6
    gpu0, gpu1 = samples[0], samples[1]
    assert "mem_used_mib" not in gpu1 and gpu1["util_gpu"] == 10.0
    assert gpu0["mem_used_mib"] == 4.0
    assert [sorted(p) for p in gpu0["processes"]] == [["job_id", "pid"]] * 2
    assert samples[2]["mem_used_mib"] == 4.0                     # GPU 2 untouched
    assert agent.inconsistent_memory == 4                          # 2 readings × 2 cycles
    warnings = [r.getMessage() for r in caplog.records if "omitted" in r.getMessage()]
    assert len(warnings) == 2
    assert "GPU 1: mem_used_mib omitted from the sample (99000 MiB used of 81559" in \
        " ".join(warnings)
    assert "GPU 0: the processes' used_mib omitted from the sample (processes' memory " \
        "adds up to 90000 MiB of 81559" in " ".join(warnings)
    data = b"".join(m.value for m in agent.spool.pending())       # type: ignore[union-attr]
    decoded = decode_jsonl(data, now=T0 + timedelta(minutes=1))
    assert decoded.rejects.height == 0 and decoded.frames["telemetry"].height == 6
    from prometheus_client import generate_latest

    from gpuledger.agent.metrics import registry_for

    exported = generate_latest(registry_for(agent)).decode()
    assert 'gpuledger_agent_source_series_skipped_total{reason="inconsistent_memory"} 4.0' \
        in exported


def test_inventory_again_when_it_changes(tmp_path: Path) -> None:
    source = TinySource(gpus=2)
    agent = _agent(tmp_path / "spool", source)
    agent.cycle(T0)
    agent.cycle(T0 + timedelta(seconds=10))
    source.unhealthy = {1}                                        # a GPU is lost
    agent.cycle(T0 + timedelta(seconds=20))
    agent.cycle(T0 + timedelta(seconds=30))
    inv = [recs[0] for topic, _, recs in _spooled(agent) if topic == INV]
    assert [(r["health"], r["unhealthy_gpus"]) for r in inv] == [("ok", []), ("degraded", [1])]
    assert inv[0]["pool"] == "default" and agent.publisher.published == 2


def test_an_inventory_a_full_spool_dropped_is_spooled_again(tmp_path: Path) -> None:
    """An outage long enough to fill the spool dropped the oldest segment, which held
    the start-up inventory; it was spooled again only at the next change or republish
    (an hour by default), and meanwhile the processor rejected every sample of a node
    it had never seen. Now a drop makes the inventory due at once."""
    spool = SharedSpool(tmp_path / "spool", max_bytes=8192, segment_bytes=4096)
    agent = Agent(_config(), TinySource(gpus=4), Chain([]), spool, None, TEL, INV)
    k = 0
    while spool.dropped_messages == 0:
        agent.cycle(T0 + timedelta(seconds=10 * k))
        k += 1
    agent.cycle(T0 + timedelta(seconds=10 * k))
    assert [topic for topic, _, _ in _spooled(agent)].count(INV) == 1
    assert agent.publisher.published == 2


def test_seq_survives_a_restart_and_failures_spool_nothing(tmp_path: Path) -> None:
    source = TinySource(gpus=2)
    agent = _agent(tmp_path / "spool", source)
    agent.cycle(T0)
    agent.cycle(T0 + timedelta(seconds=10))
    source.fail = True
    agent.cycle(T0 + timedelta(seconds=20))
    assert agent.collect_errors == 1 and not agent.last_success
    assert agent.health()[0] is False and "driver hiccup" in agent.health()[1]
    restarted = _agent(tmp_path / "spool", TinySource(gpus=2))
    restarted.cycle(T0 + timedelta(seconds=30))
    seqs = [r["seq"] for topic, _, recs in _spooled(restarted) if topic == TEL for r in recs]
    assert seqs == [0, 1, 2, 3, 4, 5]
    assert restarted.health()[0] is True


def test_run_loop_stops_on_the_event(tmp_path: Path) -> None:
    source = TinySource(gpus=1)
    agent = _agent(tmp_path / "spool", source)
    stop = threading.Event()
    runner = threading.Thread(target=agent.run, args=(stop,))
    runner.start()
    deadline = time.monotonic() + 10
    while source.calls < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    stop.set()
    runner.join(timeout=10)
    assert not runner.is_alive() and source.calls >= 3
    assert agent.seq == source.calls


def test_shared_spool_serves_from_memory_exactly_what_the_disk_holds(tmp_path: Path) -> None:
    import random

    from gpuledger.agent.spool import Spool

    rng = random.Random(5)
    folder = tmp_path / "spool"
    shared = SharedSpool(folder, max_bytes=16384, segment_bytes=4096, cache_bytes=3000)
    for step in range(900):
        append_share = 0.9 if step < 300 else 0.1 if step < 600 else 0.6   # fill, drain, mix
        op = rng.random()
        if op < append_share:
            shared.append("t", b"k", bytes(rng.randrange(10, 400)))
        else:
            pending = shared.pending(rng.randrange(1, 20))
            if pending:
                shared.ack(pending[rng.randrange(len(pending))].number)
        on_disk = Spool(folder, max_bytes=16384, segment_bytes=4096)
        assert [m.number for m in shared.pending()] == [m.number for m in on_disk.pending()], step
        assert [m.value for m in shared.pending(5)] == [m.value for m in on_disk.pending(5)]
        if step == 599:
            assert shared.backlog == 0                 # drained: served from memory again
    assert shared.dropped_messages > 0                 # the bound was hit along the way


def test_seq_continues_from_the_spool_without_the_seq_file(tmp_path: Path) -> None:
    agent = _agent(tmp_path / "spool", TinySource(gpus=3))
    for k in range(3):
        agent.cycle(T0 + timedelta(seconds=10 * k))
    (tmp_path / "spool" / "agent.seq").unlink()        # lost, or written long ago
    again = _agent(tmp_path / "spool", TinySource(gpus=3))
    assert again.seq == 9
    again.close()
    assert (tmp_path / "spool" / "agent.seq").read_text() == "9"


@pytest.mark.parametrize(("text", "reason"), [
    ("-50", "out of range"),
    ("99999999999999999999999999", "out of range"),
    ("lots", "not a whole number"),
    ("\xff", "ordinal not in range"),
])
def test_a_bad_seq_file_is_said_and_the_sequence_restarts_safely(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, text: str, reason: str) -> None:
    folder = tmp_path / "spool"
    folder.mkdir()
    (folder / "agent.seq").write_text(text, encoding="latin-1")
    with caplog.at_level(logging.WARNING):
        agent = _agent(folder, TinySource(gpus=2))
    assert agent.seq == 0
    said = [r.getMessage() for r in caplog.records if "seq file" in r.getMessage()]
    assert len(said) == 1 and reason in said[0] and "\n" not in said[0]
    agent.cycle(T0)
    seqs = [r["seq"] for topic, _, recs in _spooled(agent) if topic == TEL for r in recs]
    assert seqs == [0, 1]


@pytest.mark.parametrize("value", [b"not json", b"[" * 100_000, b'{"seq": -1}'])
def test_an_unreadable_newest_spooled_sample_is_said_and_the_seq_file_used(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, value: bytes) -> None:
    """The newest telemetry message in the spool names the next seq; one that cannot be
    read (nested deeper than Python's JSON reader goes: a RecursionError stopped the
    agent's start) is said in one warning and the seq file is used."""
    agent = _agent(tmp_path / "spool", TinySource(gpus=2))
    agent.cycle(T0)
    assert agent.spool is not None
    agent.spool.append(TEL, b"node-a", value)
    agent.close()
    with caplog.at_level(logging.WARNING):
        again = _agent(tmp_path / "spool", TinySource(gpus=2))
    assert again.seq == 2                              # from the seq file
    assert any("no readable seq" in r.getMessage() for r in caplog.records)
    again.close()


def test_a_seq_folder_is_a_start_up_error_and_writing_never_crashes(tmp_path: Path) -> None:
    folder = tmp_path / "spool"
    (folder / "agent.seq").mkdir(parents=True)
    with pytest.raises(SpoolError, match=r"agent\.seq is a folder, not a file"):
        _agent(folder, TinySource(gpus=1))
    (folder / "agent.seq").rmdir()
    agent = _agent(folder, TinySource(gpus=1))
    (folder / "agent.seq").mkdir()             # made a folder while the agent runs
    agent.cycle(T0)                            # writes the seq file: a warning, no crash
    agent.close()
    assert not (folder / "agent.tmp").exists()


def test_the_run_loop_survives_a_failing_cycle(tmp_path: Path) -> None:
    agent = _agent(tmp_path / "spool", TinySource(gpus=1))
    calls: list[int] = []

    def broken(now: datetime | None = None) -> list[dict[str, object]]:
        calls.append(1)
        if len(calls) >= 3:
            stop.set()
        raise OSError("disk gone")

    agent.cycle = broken  # type: ignore[method-assign]
    stop = threading.Event()
    agent.run(stop)
    assert len(calls) >= 3


def test_the_spool_ignores_files_that_are_not_its_segments(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    folder = tmp_path / "spool"
    spool = SharedSpool(folder, max_bytes=1 << 20, segment_bytes=1 << 16)
    spool.append(TEL, b"k", b"v")
    (folder / "zzz.seg").write_text("")
    (folder / "12.seg").write_bytes(b"junk")
    with caplog.at_level(logging.WARNING):
        again = SharedSpool(folder, max_bytes=1 << 20, segment_bytes=1 << 16)
    assert [m.value for m in again.pending()] == [b"v"]
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2 and all("not a segment name" in m for m in said)
    with pytest.raises(SpoolError, match="is a file, not a folder"):
        SharedSpool(folder / "zzz.seg")
