"""Exactly-once hand-over of a bridge's records: the state file's outbox with a file sink
and with the agent's spool draining to a real Kafka broker, across crashes at the worst
moments (a torn batch, a batch written but not yet marked done)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from kafka_fixtures import topic_messages

from gpuledger.bridges.mapping import Mapping
from gpuledger.bridges.output import (
    FileSink,
    KafkaSpoolSink,
    Record,
    encode,
    kafka_producer_factory,
)
from gpuledger.bridges.slurm import SlurmBridge, SlurmSource
from gpuledger.bridges.slurm_events import SlurmTracker
from gpuledger.bridges.state import StateError, load_state, save_state

FIX = Path(__file__).parent / "fixtures" / "slurm"


def replay(argv: list[str]) -> str:
    """Slurm's recorded answers (tests/fixtures/slurm, from the real test cluster)."""
    name = {"squeue": "squeue.json", "sinfo": "sinfo.json"}[argv[0]]
    return (FIX / name).read_text()


class Crash(Exception):
    pass


class TornFileSink(FileSink):
    """Writes only the first half of a batch's bytes, then 'crashes'."""

    def complete(self, start: int, records: list[Record]) -> None:
        data = b"".join(encode(r) for r in records)
        with open(self.path, "ab") as f:
            f.write(data[: len(data) // 2])
        raise Crash


class LateCrashFileSink(FileSink):
    """Writes the whole batch, then 'crashes' before the bridge marks it done."""

    def complete(self, start: int, records: list[Record]) -> None:
        super().complete(start, records)
        raise Crash


def bridge(sink: Any, state: Path) -> SlurmBridge:
    return SlurmBridge(SlurmSource(fmt="json", runner=replay), SlurmTracker(Mapping()), sink,
                       state)


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def job_events(records: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    return [(r["job_id"], r["event"], r["time"]) for r in records if r["type"] == "job"]


@pytest.mark.parametrize("crashing", [TornFileSink, LateCrashFileSink])
def test_file_sink_after_a_crash_has_every_record_once(tmp_path: Path,
                                                       crashing: type[FileSink]) -> None:
    clean = tmp_path / "clean.jsonl"
    bridge(FileSink(clean), tmp_path / "clean.state").poll(now=1.0)
    expected = lines(clean)
    assert len(job_events(expected)) >= 8

    out, state = tmp_path / "out.jsonl", tmp_path / "out.state"
    with pytest.raises(Crash):
        bridge(crashing(out), state).poll(now=1.0)
    assert load_state(state)["outbox"] is not None
    restarted = bridge(FileSink(out), state)          # completes the outbox at start
    assert restarted.totals.recovered == len(expected)
    assert load_state(state)["outbox"] is None
    restarted.poll(now=2.0)                           # same view: nothing new
    assert lines(out) == expected


def test_state_file_errors(tmp_path: Path) -> None:
    assert load_state(tmp_path / "none") == {}
    bad = tmp_path / "bad"
    bad.write_text("{not json")
    with pytest.raises(StateError, match="not a bridge state file"):
        load_state(bad)
    save_state(tmp_path / "s", {"memory": {}, "outbox": None})
    assert load_state(tmp_path / "s") == {"memory": {}, "outbox": None}
    assert not (tmp_path / "s.tmp").exists()


def test_kafka_spool_sink_to_a_real_broker_exactly_once(tmp_path: Path, kafka: Any) -> None:
    from kafka.admin import KafkaAdminClient, NewTopic

    prefix = f"t{uuid.uuid4().hex[:8]}."
    jobs_topic, inv_topic = prefix + "sched.events.v1", prefix + "gpu.inventory.v1"
    admin = KafkaAdminClient(bootstrap_servers=kafka.bootstrap)
    admin.create_topics([NewTopic(jobs_topic, 3, 1), NewTopic(inv_topic, 1, 1)])
    admin.close()

    from gpuledger.pipeline.kafka.settings import load_settings

    settings = load_settings(kafka.bootstrap, {})
    state, spool = tmp_path / "k.state", tmp_path / "spool"

    def sink() -> KafkaSpoolSink:
        return KafkaSpoolSink(spool, kafka_producer_factory(settings), jobs_topic, inv_topic)

    # crash after half of the batch went into the spool
    first = sink()
    real_append = first.spool.append
    calls = {"n": 0}

    def append_then_crash(topic: str, key: bytes, value: bytes) -> int:
        calls["n"] += 1
        if calls["n"] > 4:
            raise Crash
        return real_append(topic, key, value)

    first.spool.append = append_then_crash  # type: ignore[method-assign]
    with pytest.raises(Crash):
        bridge(first, state).poll(now=1.0)
    again = bridge(sink(), state)
    again.poll(now=2.0)
    again.sink.close()

    clean = tmp_path / "clean.jsonl"
    bridge(FileSink(clean), tmp_path / "clean.state").poll(now=1.0)
    expected = lines(clean)

    got = [(m.topic, m.key.decode(), json.loads(m.value))
           for m in topic_messages(kafka.bootstrap, jobs_topic, inv_topic, idle_ms=3000)]
    assert sorted(json.dumps(r, sort_keys=True) for _, _, r in got) == \
        sorted(json.dumps(r, sort_keys=True) for r in expected)
    for topic, key, record in got:
        if record["type"] == "job":
            assert (topic, key) == (jobs_topic, record["job_id"])
        else:
            assert (topic, key) == (inv_topic, record["node"])


def _inv(node: str) -> Record:
    return {"v": 1, "type": "inventory", "time": "2026-01-01T00:00:00Z", "node": node}


def test_file_sink_complete_never_pads_or_cuts_a_file(tmp_path: Path) -> None:
    batch = [_inv("a"), _inv("b")]
    data = b"".join(encode(r) for r in batch)
    # a torn batch (a prefix of it is there): the rest is appended
    torn = tmp_path / "torn.jsonl"
    torn.write_bytes(b"old\n" + data[:7])
    FileSink(torn).complete(4, batch)
    assert torn.read_bytes() == b"old\n" + data
    # all there: nothing changes
    FileSink(torn).complete(4, batch)
    assert torn.read_bytes() == b"old\n" + data
    # a new, shorter file (rotated): the batch at its end, no NUL bytes
    short = tmp_path / "short.jsonl"
    short.write_bytes(b"x\n")
    FileSink(short).complete(4096, batch)
    assert short.read_bytes() == b"x\n" + data
    # other bytes at the position (another file): appended on a line of its own
    other = tmp_path / "other.jsonl"
    other.write_bytes(b"0123456789" * 10)
    FileSink(other).complete(4, batch)
    assert other.read_bytes() == b"0123456789" * 10 + b"\n" + data


@pytest.mark.parametrize("content", ["\xff\xfe\x00", '{"memory": 5, "outbox": 7}',
                                     '{"outbox": {"position": -1, "records": []}}',
                                     '{"outbox": {"position": 0, "records": [{"type": "x"}]}}',
                                     "NaN", "[1]", "[" * 100_000])
def test_load_state_refuses_what_is_not_a_state_file(tmp_path: Path, content: str) -> None:
    path = tmp_path / "st"
    path.write_bytes(content.encode("latin-1"))
    with pytest.raises(StateError, match="not a bridge state file"):
        load_state(path)


@pytest.mark.parametrize("fmt", ["json", "text"])
def test_a_fractional_gpu_count_fails_the_poll_and_changes_nothing(tmp_path: Path,
                                                                  fmt: str) -> None:
    """``gres/gpu=1.5`` is no count Slurm writes: the poll fails with the reason (in
    either format; scontrol's text raised a traceback for a bad GRES before), nothing is
    sent, and the next good answer is read as if the bad one had not come."""
    text_fix = {"squeue": "scontrol_jobs.txt", "sinfo": "scontrol_nodes.txt"}
    bad = {"value": True}

    def answers(argv: list[str]) -> str:
        if fmt == "json":
            raw = replay(argv)
            if argv[0] == "squeue" and bad["value"]:
                doc = json.loads(raw)
                doc["jobs"][0]["tres_per_node"] = "gres/gpu=1.5"
                raw = json.dumps(doc)
            return raw
        name = text_fix["squeue" if argv[3] == "job" else "sinfo"]
        raw = (FIX / name).read_text()
        if argv[3] == "job" and bad["value"]:
            raw = raw.replace("TresPerNode=gres:gpu:", "TresPerNode=gres:gpu:1.5,x:", 1)
        return raw

    out, state = tmp_path / "out.jsonl", tmp_path / "out.state"
    b = SlurmBridge(SlurmSource(fmt=fmt, runner=answers), SlurmTracker(Mapping()),
                    FileSink(out), state)
    assert b.poll(now=1.0) is None
    assert b.totals.failed_polls == 1
    assert not out.exists() or out.read_text() == ""
    bad["value"] = False
    assert b.poll(now=2.0) is not None
    assert len(job_events(lines(out))) >= 8

