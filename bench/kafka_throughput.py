"""Kafka transport benchmark: produce, wire size, consume ceiling, processor, freshness,
for both Kafka clients and several wire variants side by side in one run.

Against a broker it starts itself (``tests/kafka_broker.py``, the jars of
``scripts/kafka-jars.sh``) or an existing one (``--bootstrap``). For each *variant*
FORMAT/CODEC/BATCH_MINUTES (wire format, the producer's compression, simulated minutes
per ``KafkaSink`` batch, i.e. per message of a node); the first is the baseline:

1. produce: HOURS of the default simulated cluster (576 GPUs, 10 s samples; ``--scale``
   multiplies it) to fresh topics (12 telemetry partitions) with ``KafkaSink``
   (kafka-python, acks=all, idempotent, the variant's codec). Agent-side GPU-samples
   per CPU-second (simulation not counted), value bytes per GPU-sample, and, for a
   broker started here, the telemetry topic's ``.log`` bytes on disk per GPU-sample
   (after compression);
2. per client (``GPULEDGER_KAFKA_CLIENT``: kafka-python with the C ``crc32c`` when
   installed, confluent-kafka): the *ceiling* (the telemetry topic read by that client's
   consumer with the service's fetch settings, doing nothing with it), the same read
   plus ``wire.decode``, and the *service* (``KafkaProcessorService`` until idle) in
   GPU-samples per CPU-second of this process (``time.process_time``, all threads, so
   librdkafka's and Polars' threads count), and service / ceiling. On the baseline
   also kafka-python with its pure-Python CRC32C and with its default fetch settings,
   and a cProfile of the service for the first two variants (where the time goes);
3. freshness, per client: a producer process publishes one simulated 10 s round of the
   cluster every ROUND_MS (simulated time runs 10 s / ROUND_MS faster than the wall
   clock) while the service runs with ``allowed_lateness_s`` = LATENESS; the wall time
   from producing a sample to the processor closing its minute (and to the gpu_minute
   Parquet file of its hour being written), and what it means at real time.

Prints one JSON object (with ``table``, the markdown table of bench/README.md);
``--json PATH`` writes it too. Usage:

    python bench/kafka_throughput.py [--hours 2] [--variants arrow-v1/gzip/10 ...]
        [--clients kafka-python confluent] [--freshness-seconds 100] [--bootstrap H:P]
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import gzip
import json
import multiprocessing as mp
import os
import pstats
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
from cluster_scale import scaled_cluster

from gpuledger.contract.schema import RECORD_TYPES
from gpuledger.pipeline.columns import conform
from gpuledger.pipeline.config import ProcessorConfig, Windows
from gpuledger.pipeline.decode import encode_jsonl
from gpuledger.pipeline.kafka.client import open_consumer
from gpuledger.pipeline.kafka.producer import KEYS, KafkaSink, producer_config
from gpuledger.pipeline.kafka.service import KafkaProcessorService, ServiceOptions, _messages
from gpuledger.pipeline.kafka.settings import KafkaSettings, Topics
from gpuledger.pipeline.kafka.topics import create_topics
from gpuledger.pipeline.kafka.wire import (
    ARROW,
    FORMAT_HEADER,
    JSONL,
    TYPE_HEADER,
    decode,
    encode,
)
from gpuledger.pipeline.processor import Processor
from gpuledger.pipeline.simulate import SimConfig, simulate

REPO = Path(__file__).resolve().parents[1]
FORMATS = {"arrow-v1": ARROW, "jsonl-v1": JSONL}
TELEMETRY_PARTITIONS = 12
# The service's telemetry consumer settings (service.py, ServiceOptions defaults).
FETCH = {"max_poll_records": 20_000, "fetch_max_bytes": 64 << 20,
         "max_partition_fetch_bytes": 16 << 20}
POLL_TIMEOUT_MS = 500

Batch = dict[str, pl.DataFrame]


# --------------------------------------------------------------------------- load


def _cpu_jiffies(pid: int | str) -> int:
    """utime + stime of a process (all its threads), in clock ticks."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def _machine_busy() -> int:
    """Busy clock ticks of all CPUs since boot (all but idle and iowait)."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return sum(values) - values[3] - values[4]


class LoadWatch:
    """What else the machine was doing: 1-min load average samples and CPU shares."""

    def __init__(self, broker_pid: int | None, interval_s: float = 2.0) -> None:
        self.broker_pid = broker_pid
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(interval_s,), daemon=True)
        self._t0 = time.monotonic()
        self._busy0 = _machine_busy()
        self._self0 = _cpu_jiffies("self")
        self._broker0 = _cpu_jiffies(broker_pid) if broker_pid else 0
        self._thread.start()

    def _run(self, interval_s: float) -> None:
        while not self._stop.wait(interval_s):
            self.samples.append(os.getloadavg()[0])

    def summary(self, children_ticks: int = 0) -> dict[str, Any]:
        self._stop.set()
        self._thread.join()
        hz = os.sysconf("SC_CLK_TCK")
        wall = time.monotonic() - self._t0
        busy1 = _machine_busy()
        ncpu = os.cpu_count() or 1
        machine = (busy1 - self._busy0) / hz / wall
        own = (_cpu_jiffies("self") - self._self0 + children_ticks) / hz / wall
        broker = ((_cpu_jiffies(self.broker_pid) - self._broker0) / hz / wall
                  if self.broker_pid else 0.0)
        loads = self.samples or [os.getloadavg()[0]]
        return {
            "cpus": ncpu,
            "wall_s": round(wall, 1),
            "loadavg_1min_mean": round(float(np.mean(loads)), 2),
            "loadavg_1min_max": round(float(np.max(loads)), 2),
            "machine_busy_cores": round(machine, 2),
            "this_benchmark_cores": round(own, 2),
            "broker_cores": round(broker, 2),
            "other_processes_cores": round(max(machine - own - broker, 0.0), 2),
        }


# --------------------------------------------------------------------------- broker


@contextlib.contextmanager
def _broker(bootstrap: str | None, workdir: Path) -> Iterator[tuple[str, Path | None, int | None]]:
    """(bootstrap, log dir or None, broker pid or None)."""
    if bootstrap:
        yield bootstrap, None, None
        return
    sys.path.insert(0, str(REPO / "tests"))
    from kafka_broker import start_broker  # type: ignore[import-not-found]

    t0 = time.monotonic()
    broker = start_broker(workdir / "broker")
    print(f"broker up in {time.monotonic() - t0:.1f} s at {broker.bootstrap}", file=sys.stderr)
    try:
        yield broker.bootstrap, workdir / "broker" / "data", broker.pid
    finally:
        broker.stop()


def _code() -> dict[str, Any]:
    """Which code ran: the gpuledger package's folder (the checkout's, with its commit and
    uncommitted files, or another copy), and kafka-python's CRC32C (the C ``crc32c``
    package when installed, else kafka-python's pure-Python one)."""
    import subprocess

    import kafka
    from kafka.record import util

    import gpuledger.pipeline as package

    where = Path(package.__file__).resolve().parents[2]
    info: dict[str, Any] = {
        "gpuledger_from": str(where), "from_this_checkout": where == REPO / "pipeline",
        "kafka_python": kafka.__version__,
        "crc32c": "C (crc32c package)" if util.crc32c_c is not None else "pure Python",
    }
    with contextlib.suppress(ImportError):
        import confluent_kafka

        info["confluent_kafka"] = confluent_kafka.version()[0]
        info["librdkafka"] = confluent_kafka.libversion()[0]
    if info["from_this_checkout"]:
        with contextlib.suppress(OSError, subprocess.CalledProcessError):
            git = ["git", "-C", str(REPO)]
            info["commit"] = subprocess.run([*git, "rev-parse", "--short", "HEAD"],
                                            capture_output=True, text=True,
                                            check=True).stdout.strip()
            info["uncommitted"] = subprocess.run(
                [*git, "status", "--porcelain", "--", "pipeline", "agents"],
                capture_output=True, text=True, check=True).stdout.split("\n")[:-1]
    return info


def _settings(bootstrap: str, prefix: str, client: str = "kafka-python") -> KafkaSettings:
    return KafkaSettings(bootstrap=bootstrap, topics=Topics().prefixed(prefix),
                         client_id=f"bench-{prefix.rstrip('.')}", client=client)


def _topic_disk_bytes(log_dir: Path | None, topic: str) -> int | None:
    """Bytes of the topic's segment files (.log) under the broker's log dir."""
    if log_dir is None:
        return None
    total = 0
    for part in log_dir.glob(f"{topic}-*"):
        if part.name.rsplit("-", 1)[0] != topic:
            continue
        total += sum(f.stat().st_size for f in part.glob("*.log"))
    return total


# --------------------------------------------------------------------------- produce


KEEP_EVERY = 10


def _gzip_cost(values: list[bytes], every: int) -> dict[str, float]:
    """CPU seconds gzip would take over all telemetry values, from a 1-in-``every`` sample,
    at kafka-python's level (9, ``kafka.codec.gzip_encode``) and at level 1."""
    out: dict[str, float] = {}
    for level in (9, 1):
        c0 = time.process_time()
        for v in values:
            gzip.compress(v, compresslevel=level)
        out[f"gzip{level}_cpu_s_estimate"] = round((time.process_time() - c0) * every, 2)
    return out


class CountingSink(KafkaSink):
    """A KafkaSink that also counts value bytes and messages per topic."""

    def __init__(self, settings: KafkaSettings, fmt: bytes, codec: str = "gzip") -> None:
        super().__init__(settings, fmt, compression_type=None if codec == "none" else codec)
        self.topic_bytes: dict[str, int] = {}
        self.topic_messages: dict[str, int] = {}
        self.kept: list[bytes] = []  # every KEEP_EVERY-th telemetry value
        send = self.producer.send
        telemetry = settings.topics.telemetry

        def counting_send(topic: str, **kwargs: Any) -> Any:
            n = self.topic_messages.get(topic, 0)
            self.topic_bytes[topic] = self.topic_bytes.get(topic, 0) + len(kwargs["value"])
            self.topic_messages[topic] = n + 1
            if topic == telemetry and n % KEEP_EVERY == 0:
                self.kept.append(kwargs["value"])
            return send(topic, **kwargs)

        self.producer.send = counting_send


def _produce(settings: KafkaSettings, fmt: bytes, batches: list[Batch],
             log_dir: Path | None, codec: str = "gzip") -> dict[str, Any]:
    create_topics(settings, telemetry_partitions=TELEMETRY_PARTITIONS)
    samples = sum(b["telemetry"].height for b in batches)
    sink = CountingSink(settings, fmt, codec)
    c0, w0 = time.process_time(), time.perf_counter()
    for batch in batches:
        sink.publish_batch(batch)
    sink.close()  # flush: every message acknowledged (acks=all)
    cpu, wall = time.process_time() - c0, time.perf_counter() - w0
    topic = settings.topics.telemetry
    value = sink.topic_bytes.get(topic, 0)
    disk = _topic_disk_bytes(log_dir, topic)
    return {
        "gpu_samples": samples,
        "telemetry_messages": sink.topic_messages.get(topic, 0),
        "messages_all_topics": sink.messages,
        "produce_wall_s": round(wall, 2),
        "produce_cpu_s": round(cpu, 2),
        "produce_samples_per_s": round(samples / wall),
        "produce_samples_per_cpu_s": round(samples / cpu),
        "value_bytes_per_sample": round(value / samples, 1),
        "value_bytes_per_message": round(value / max(sink.topic_messages.get(topic, 1), 1)),
        "disk_bytes_per_sample": None if disk is None else round(disk / samples, 1),
        "compression_ratio": None if not disk else round(value / disk, 2),
        "telemetry_value_bytes": value,
        "telemetry_disk_bytes": disk,
        **(_gzip_cost(sink.kept, KEEP_EVERY) if codec == "gzip" else {}),
    }


# --------------------------------------------------------------------------- ceiling


def _ceiling(settings: KafkaSettings, samples: int, messages: int,
             with_decode: bool, fetch: dict[str, int] | None = None) -> dict[str, Any]:
    """Read the telemetry topic to its end with ``settings.client``; nothing else (or only
    wire.decode). ``fetch``: the consumer's fetch settings (default: the service's)."""
    fetch = FETCH if fetch is None else fetch
    consumer = open_consumer(settings, group_id=f"ceiling-{uuid.uuid4().hex}",
                             enable_auto_commit=False, auto_offset_reset="earliest", **fetch)
    consumer.subscribe([settings.topics.telemetry])
    got = nbytes = decoded = 0
    c0, w0 = time.process_time(), time.perf_counter()
    try:
        while got < messages:
            records = consumer.poll(timeout_ms=POLL_TIMEOUT_MS,
                                    max_records=fetch.get("max_poll_records", 500))
            if with_decode:
                for msgs in _messages(records).values():
                    decoded += decode(msgs, "telemetry").frames["telemetry"].height
                    got += len(msgs)
            else:
                for recs in records.values():
                    got += len(recs)
                    nbytes += sum(len(r.value) for r in recs)
            if time.perf_counter() - w0 > 600:
                raise TimeoutError(f"ceiling read {got} of {messages} messages in 600 s")
        cpu, wall = time.process_time() - c0, time.perf_counter() - w0
    finally:
        consumer.close(autocommit=False)
    if with_decode and decoded != samples:
        raise AssertionError(f"decoded {decoded} samples, produced {samples}")
    return {"samples_per_cpu_s": round(samples / cpu), "cpu_s": round(cpu, 3),
            "wall_s": round(wall, 2)}


@contextlib.contextmanager
def _kafka_python_crc(native: bool) -> Iterator[None]:
    """kafka-python's CRC32C: the C ``crc32c`` package (when installed) or its own
    pure-Python one; ``calc_crc32c`` binds it as a default argument, so swap that."""
    from kafka.record import util

    saved = util.calc_crc32c.__defaults__
    if not native or util.crc32c_c is None:
        util.calc_crc32c.__defaults__ = (util.crc32c_py,)
    try:
        yield
    finally:
        util.calc_crc32c.__defaults__ = saved


# --------------------------------------------------------------------------- processor


def _service(settings: KafkaSettings, warehouse: Path, group: str,
             config: ProcessorConfig | None = None,
             idle_s: float | None = 2.0) -> KafkaProcessorService:
    return KafkaProcessorService(settings, config or ProcessorConfig(), warehouse,
                                 ServiceOptions(group_id=group, exit_when_idle_s=idle_s))


def _processor(settings: KafkaSettings, samples: int, tmp: Path) -> dict[str, Any]:
    service = _service(settings, tmp / f"wh-{uuid.uuid4().hex}", f"proc-{uuid.uuid4().hex}")
    # The CPU of the idle wait before exiting is left out: caught up = last input handled.
    handle = service._handle
    caught: list[tuple[float, float]] = []

    def timed_handle(by_topic: Any, telemetry: bool) -> int:
        n = handle(by_topic, telemetry)
        if n and service.counters().records_in["telemetry"] >= samples:
            caught.append((time.process_time(), time.perf_counter()))
        return n

    service._handle = timed_handle  # type: ignore[method-assign]
    try:
        c0, w0 = time.process_time(), time.perf_counter()
        service.run()
        cpu, wall = time.process_time() - c0, time.perf_counter() - w0
    finally:
        service.close()
    counters = service.counters()
    got = counters.records_in["telemetry"]
    if got != samples:
        raise AssertionError(f"processor read {got} samples, produced {samples}")
    return {
        "samples_per_cpu_s": round(samples / cpu),
        "samples_per_wall_s": round(samples / wall),
        "cpu_s": round(cpu, 2), "wall_s": round(wall, 2),
        "cpu_s_until_caught_up": round(caught[0][0] - c0, 2) if caught else None,
        "minutes_closed": counters.minutes_closed,
        "late_samples": counters.late_telemetry,
        "checkpoints": service.stats.checkpoints,
        "dead_letters": service.stats.dead_letters,
    }


# (file suffix, function) -> label, for the breakdown of a profiled service run.
BREAKDOWN = {
    ("kafka/consumer/group.py", "poll"): "KafkaConsumer.poll (fetch, all consumers)",
    ("gpuledger/pipeline/kafka/client_confluent.py", "poll"):
        "ConfluentConsumer.poll (all consumers)",
    ("gpuledger/pipeline/kafka/service.py", "_drain_globals"): "service._drain_globals",
    ("gpuledger/pipeline/kafka/service.py", "_messages"): "service._messages",
    ("gpuledger/pipeline/kafka/wire.py", "decode"): "wire.decode",
    ("gpuledger/pipeline/kafka/service.py", "_last_message_times"):
        "service._last_message_times",
    ("gpuledger/pipeline/kafka/service.py", "_time_limit"): "service._time_limit",
    ("gpuledger/pipeline/kafka/service.py", "_caught_up"): "service._caught_up",
    ("gpuledger/pipeline/processor.py", "process"): "Processor.process",
    ("gpuledger/pipeline/processor.py", "_ingest"): "Processor._ingest",
    ("gpuledger/pipeline/processor.py", "close_until"): "Processor.close_until",
    ("gpuledger/pipeline/processor.py", "_close"): "Processor._close",
    ("gpuledger/pipeline/processor.py", "_write_hours"): "Processor._write_hours",
    ("gpuledger/pipeline/processor.py", "flush"): "Processor.flush",
    ("gpuledger/pipeline/kafka/service.py", "_checkpoint"): "service._checkpoint",
}


def _profile(settings: KafkaSettings, tmp: Path) -> dict[str, Any]:
    """cProfile of a service run over the same topics, timed in process CPU seconds.

    The timer is ``time.process_time`` (all threads), so a function's cumulative time is
    the CPU the process spent while the main thread was in it, Polars' worker threads
    included; waiting (poll timeouts, the idle exit) costs nothing.
    """
    service = _service(settings, tmp / f"wh-{uuid.uuid4().hex}", f"prof-{uuid.uuid4().hex}")
    prof = cProfile.Profile(time.process_time)
    try:
        prof.runcall(service.run)
    finally:
        service.close()
    stats: dict[Any, Any] = pstats.Stats(prof).stats  # type: ignore[attr-defined]
    total = max(ct for (_f, _l, name), (_cc, _nc, _tt, ct, _c) in stats.items()
                if name == "run" and _f.endswith("kafka/service.py"))
    ours = sorted(((ct, f"{_short(file)}:{line}({name})")
                   for (file, line, name), (_cc, _nc, _tt, ct, _c) in stats.items()
                   if "/gpuledger/" in file), reverse=True)
    breakdown: dict[str, float] = {}
    for (file, _line, name), (_cc, _nc, _tt, ct, _c) in stats.items():
        for (suffix, fn), label in BREAKDOWN.items():
            if name == fn and file.endswith(suffix):
                breakdown[label] = breakdown.get(label, 0.0) + ct
    return {
        "timer": "process CPU seconds (all threads) while the main thread is in a function",
        "total_s": round(total, 2),
        "top10_gpuledger_cumulative": [
            {"function": where, "cum_s": round(ct, 2), "share": round(ct / total, 3)}
            for ct, where in ours[:10]],
        "breakdown_cum_s": {k: round(v, 2) for k, v in sorted(
            breakdown.items(), key=lambda kv: -kv[1])},
    }


def _short(path: str) -> str:
    i = path.find("/gpuledger/")
    return path[i + 1:] if i >= 0 else path


# --------------------------------------------------------------------------- freshness


Send = tuple[str, bytes, bytes, list[tuple[str, bytes]]]  # topic, key, value, headers


def _rounds(minutes: int, fmt: bytes, topics: Topics) -> list[tuple[int, list[Send]]]:
    """The simulation cut into 10 s rounds, encoded: (event time ms, messages of the round).

    One message per node (telemetry, inventory) or job (scheduler events) per round, as
    ``KafkaSink`` would send them, encoded ahead of time: a node agent encodes its own
    sample, so only the sending is timed. Scheduler and inventory records go with the
    round of their time (floored to 10 s), so a job's start is published with, never
    after, the first sample it covers.
    """
    out: list[tuple[int, list[Send]]] = []
    # live input starts at the wall clock (simulated time then runs ahead of it)
    start = datetime.now(UTC).replace(second=0, microsecond=0)
    for chunk in simulate(SimConfig(start=start, hours=minutes / 60, chunk_minutes=1)):
        keys = np.sort(chunk["telemetry"]["time"].dt.epoch("ms").unique().to_numpy())
        per_round: dict[int, list[Send]] = {int(k): [] for k in keys}
        for kind in RECORD_TYPES:
            frame = conform(chunk[kind], kind)
            if frame.is_empty():
                continue
            ms = frame["time"].dt.epoch("ms").to_numpy()
            rnd = keys[np.clip(np.searchsorted(keys, ms, side="right") - 1, 0, None)]
            groups: dict[tuple[int, str], list[int]] = {}
            for i, (r, key) in enumerate(zip(rnd.tolist(), frame[KEYS[kind]].to_list(),
                                             strict=True)):
                groups.setdefault((r, str(key)), []).append(i)
            lines: list[bytes] = []
            if fmt == JSONL:
                lines = encode_jsonl(frame, kind).split(b"\n")[:-1]
                assert len(lines) == frame.height
            headers = [(FORMAT_HEADER, fmt), (TYPE_HEADER, kind.encode())]
            topic = topics.for_record_type(kind)
            for (r, key), rows in groups.items():
                if fmt == JSONL:
                    value = b"".join(lines[i] + b"\n" for i in rows)
                else:
                    value = encode(frame[rows], kind, fmt)
                per_round[r].append((topic, key.encode(), value, headers))
        out.extend(sorted(per_round.items()))
    return out


def _live_producer(bootstrap: str, prefix: str, fmt: str, minutes: int, round_ms: float,
                   max_s: float, out: str, ready: Any, go: Any) -> None:
    """Child process: publish one 10 s round every round_ms; write the stamps as JSON.

    Each round is sent with KafkaSink's producer settings and flushed (acknowledged)
    before the next; the stamp is taken just before the first send of the round.
    """
    from kafka import KafkaProducer

    settings = _settings(bootstrap, prefix)
    rounds = _rounds(minutes, FORMATS[fmt], settings.topics)
    producer = KafkaProducer(**producer_config(settings))
    ready.set()
    go.wait()
    stamps: list[tuple[int, float, float]] = []
    messages = late = 0
    c0 = time.process_time()
    t0 = time.time()
    for i, (event_ms, sends) in enumerate(rounds):
        pause = t0 + i * round_ms / 1000 - time.time()
        if pause > 0:
            time.sleep(pause)
        elif pause < -round_ms / 1000:
            late += 1
        if time.time() - t0 > max_s:
            break
        sent = time.time()
        for topic, key, value, headers in sends:
            producer.send(topic, key=key, value=value, headers=headers)
        producer.flush()
        messages += len(sends)
        stamps.append((event_ms, sent, time.time()))
    cpu = time.process_time() - c0
    producer.close()
    Path(out).write_text(json.dumps({
        "stamps": stamps, "messages": messages, "rounds_late": late, "send_cpu_s": cpu,
    }))


def _freshness(bootstrap: str, fmt: str, seconds: float, round_ms: float, lateness_s: int,
               warmup_s: float, tmp: Path, client: str = "kafka-python") -> dict[str, Any]:
    """Produce-to-close times with simulated time compressed 10 s : round_ms.

    The simulated time starts at the wall clock, as live input does (it then runs
    ahead of it; ``max_future_s`` is raised to match), so the service is never
    *catching up* on past input (``Processor.catching_up``).

    A minute [m, m+60) closes when the watermark (newest telemetry time minus the
    lateness, capped by the partitions with unread data) reaches m+60, i.e. once the
    round with event time >= m+60+lateness (the *closing round*) has been read.

    - closing delay: wall time from producing the closing round to the minute closing.
      It does not depend on the compression, except through load.
    - compressed end-to-end: wall time from producing a round to its minute closing, as
      measured (the wait for the closing round is compressed by the speed-up).
    - real time: what a sample's freshness is when rounds come every 10 s:
      (closing round time - sample time) + closing delay = lateness + 10..60 s + delay.
    - Parquet: gpu_minute facts are written once per hour (the hour's file, when its
      last minute closes; checkpoints do not write facts), so the same at hour scale.
    """
    prefix = f"bench.{uuid.uuid4().hex[:8]}.live."
    settings = _settings(bootstrap, prefix, client)
    create_topics(settings, telemetry_partitions=TELEMETRY_PARTITIONS)
    n_rounds = int(seconds * 1000 / round_ms)
    minutes = -(-n_rounds // 6) + 1
    ctx = mp.get_context("spawn")
    ready, go = ctx.Event(), ctx.Event()
    out = tmp / f"stamps-{prefix}.json"
    child = ctx.Process(target=_live_producer, args=(
        bootstrap, prefix, fmt, minutes, round_ms, seconds * 1.5, str(out), ready, go),
        daemon=True)
    child.start()
    if not ready.wait(300):
        child.kill()
        raise TimeoutError("live producer not ready in 300 s")

    # simulated time starts at the wall clock and runs ahead of it by the speed-up
    ahead_s = int(seconds * 1.5 * 10_000 / round_ms) + 3600
    config = ProcessorConfig(windows=Windows(allowed_lateness_s=lateness_s,
                                             max_future_s=ahead_s))
    service = _service(settings, tmp / f"wh-{prefix}", f"live-{prefix}", config, idle_s=None)
    closes: list[tuple[float, datetime]] = []
    files: list[tuple[float, datetime]] = []

    def follow(proc: Processor) -> None:
        """Time the engine's closes (one engine holds every partition of the instance)."""
        close_until = proc.close_until
        write_part = proc.warehouse.write_part

        def hooked_close(end: datetime) -> None:
            close_until(end)
            assert proc.closed_until is not None
            closes.append((time.time(), proc.closed_until))

        def hooked_write(table: str, when: datetime, frame: pl.DataFrame,
                         sort_by: list[str], hourly: bool = True,
                         merge: bool = False, suffix: str | None = None) -> Path:
            path = write_part(table, when, frame, sort_by, hourly, merge, suffix)
            if table == "gpu_minute" and proc.closed_until is not None \
                    and when + timedelta(hours=1) <= proc.closed_until:
                files.append((time.time(), when))
            return path

        proc.close_until = hooked_close  # type: ignore[method-assign]
        proc.warehouse.write_part = hooked_write  # type: ignore[method-assign]

    service.on_engine.append(follow)
    lag: list[tuple[float, int]] = []

    def conductor() -> None:
        # Start producing once the group has assigned the partitions, so the first
        # rounds are not read in a burst after the join; stop once all is read.
        while not service.telemetry.assignment() and not service.stop.is_set():
            time.sleep(0.05)
        go.set()
        t_go = time.time()
        while child.is_alive():
            child.join(1.0)
            rounds_sent = int((time.time() - t_go) * 1000 / round_ms)
            lag.append((time.time() - t_go, rounds_sent))
        if out.exists():
            produced = json.loads(out.read_text())["messages"]
            deadline = time.monotonic() + 120
            while service.stats.messages < produced and time.monotonic() < deadline:
                time.sleep(0.2)
        service.stop.set()

    watcher = threading.Thread(target=conductor, daemon=True)
    c0 = time.process_time()
    watcher.start()
    try:
        service.run()
    finally:
        service.close()
        watcher.join(10)
    service_cpu = time.process_time() - c0
    child.join(30)
    result = json.loads(out.read_text())
    stamps = [(int(e), float(a), float(b)) for e, a, b in result["stamps"]]
    samples = service.counters().records_in["telemetry"]
    span_s = stamps[-1][1] - stamps[0][1]
    analysis = _analyse(stamps, closes, files, lateness_s, warmup_s)
    return {
        "format": fmt, "client": client, "round_ms": round_ms,
        "speedup": round(10_000 / round_ms, 1),
        "allowed_lateness_s": lateness_s, "warmup_excluded_s": warmup_s,
        "rounds": len(stamps), "rounds_late_at_producer": result["rounds_late"],
        "gpu_samples": samples, "late_samples": service.counters().late_telemetry,
        "produce_span_s": round(span_s, 1),
        "live_rate_samples_per_s": round(samples / span_s),
        "service_cpu_s": round(service_cpu, 1),
        "service_cores_used": round(service_cpu / span_s, 2),
        "producer_send_cpu_s": round(result["send_cpu_s"], 1),
        **analysis,
    }


def _pct(values: list[float]) -> dict[str, float | int | None]:
    if not values:
        return {"n": 0, "p50": None, "p99": None, "max": None}
    a = np.asarray(values)
    return {"n": len(values), "p50": round(float(np.percentile(a, 50)), 3),
            "p99": round(float(np.percentile(a, 99)), 3), "max": round(float(a.max()), 3)}


def _analyse(stamps: list[tuple[int, float, float]], closes: list[tuple[float, datetime]],
             files: list[tuple[float, datetime]], lateness_s: int,
             warmup_s: float) -> dict[str, Any]:
    ev = np.array([s[0] for s in stamps], dtype=np.int64)
    sent = np.array([s[1] for s in stamps])
    t_first = sent[0]
    close_ms = np.array([int(c.timestamp() * 1000) for _w, c in closes], dtype=np.int64)
    close_wall = np.array([w for w, _c in closes])
    file_hours = {int(h.timestamp() * 1000): w for w, h in reversed(files)}  # first write

    def closed_at(end_ms: int) -> float | None:
        i = int(np.searchsorted(close_ms, end_ms, side="left"))
        return None if i >= len(close_ms) else float(close_wall[i])

    def closing_round(end_ms: int) -> int | None:
        i = int(np.searchsorted(ev, end_ms + lateness_s * 1000, side="left"))
        return None if i >= len(ev) else i

    delays: list[float] = []
    compressed: list[float] = []
    real: list[float] = []
    delay_over_time: list[tuple[float, float]] = []
    for minute in np.unique(ev // 60_000 * 60_000):
        end = int(minute) + 60_000
        r, w = closing_round(end), closed_at(end)
        if r is None or w is None or sent[r] - t_first < warmup_s:
            continue
        delay = w - sent[r]
        delays.append(delay)
        delay_over_time.append((float(sent[r] - t_first), delay))
        for i in np.nonzero(ev // 60_000 * 60_000 == minute)[0]:
            compressed.append(w - sent[i])
            real.append((ev[r] - ev[i]) / 1000 + delay)
    file_delay: list[float] = []
    file_real: list[float] = []
    for hour_ms, w in sorted(file_hours.items()):
        r = closing_round(hour_ms + 3_600_000)
        if r is None or sent[r] - t_first < warmup_s:
            continue
        delay = w - sent[r]
        file_delay.append(delay)
        in_hour = (ev >= hour_ms) & (ev < hour_ms + 3_600_000)
        file_real.extend(((ev[r] - ev[in_hour]) / 1000 + delay).tolist())
    half = len(delay_over_time) // 2
    return {
        "minute_close_delay_s": _pct(delays),
        "minute_close_delay_first_half_p50_s": _pct([d for _t, d in delay_over_time[:half]])[
            "p50"],
        "minute_close_delay_second_half_p50_s": _pct([d for _t, d in delay_over_time[half:]])[
            "p50"],
        "sample_to_minute_closed_compressed_s": _pct(compressed),
        "sample_to_minute_closed_real_time_s": _pct(real),
        "gpu_minute_file_delay_s": _pct(file_delay),
        "sample_to_gpu_minute_file_real_time_s": _pct(file_real),
    }


# --------------------------------------------------------------------------- main


DEFAULT_VARIANTS = [
    "arrow-v1/gzip/10", "jsonl-v1/gzip/10", "arrow-v1/lz4/10", "jsonl-v1/lz4/10",
    "arrow-v1/zstd/10", "jsonl-v1/zstd/10", "arrow-v1/snappy/10", "arrow-v1/none/10",
    "jsonl-v1/none/10", "arrow-v1/lz4/1", "jsonl-v1/lz4/1", "arrow-v1/lz4/60",
]
CODECS = ("gzip", "lz4", "zstd", "snappy", "none")


def _variant(text: str) -> tuple[str, str, int]:
    """FORMAT/CODEC/BATCH_MINUTES, e.g. arrow-v1/lz4/10."""
    fmt, codec, minutes = text.split("/")
    if fmt not in FORMATS or codec not in CODECS or not minutes.isdigit():
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected FORMAT/CODEC/MINUTES with FORMAT in {sorted(FORMATS)}, "
            f"CODEC in {CODECS}")
    return fmt, codec, int(minutes)


def _run_variant(bootstrap: str, log_dir: Path | None, tmp: Path, label: str, fmt: str,
                 codec: str, batches: list[Batch], clients: list[str], baseline: bool,
                 profile: bool) -> dict[str, Any]:
    """Produce one topic set, then read it with every client: ceiling, fetch + decode,
    the service (and, on the baseline, kafka-python without the C CRC and with its
    default fetch settings)."""
    step = _step(label)
    prefix = f"bench.{uuid.uuid4().hex[:8]}.{fmt.split('-')[0]}.{codec}."
    settings = _settings(bootstrap, prefix)
    r: dict[str, Any] = {"label": label, "format": fmt, "codec": codec}
    r["produce"] = step("produce", _produce, settings, FORMATS[fmt], batches, log_dir, codec)
    samples, messages = r["produce"]["gpu_samples"], r["produce"]["telemetry_messages"]
    r["samples_per_message"] = round(samples / messages, 1)
    reads: dict[str, dict[str, Any]] = {}
    runs: list[tuple[str, str, bool, dict[str, int] | None]] = []
    for client in clients:
        runs.append((client, client, True, None))
    if baseline and "kafka-python" in clients:
        runs.append(("kafka-python, pure-Python CRC", "kafka-python", False, None))
        runs.append(("kafka-python, default fetch settings", "kafka-python", True, {}))
    for name, client, native_crc, fetch in runs:
        cs = _settings(bootstrap, prefix, client)
        with _kafka_python_crc(native_crc):
            out: dict[str, Any] = {"ceiling": step(f"ceiling {name}", _ceiling, cs, samples,
                                                   messages, False, fetch)}
            if fetch is None:
                out["fetch_and_decode"] = step(f"fetch+decode {name}", _ceiling, cs, samples,
                                               messages, True)
                out["service"] = step(f"service {name}", _processor, cs, samples, tmp)
                rate = out["service"]["samples_per_cpu_s"]
                out["service_to_ceiling"] = round(rate / out["ceiling"]["samples_per_cpu_s"], 3)
                out["service_to_fetch_and_decode"] = round(
                    rate / out["fetch_and_decode"]["samples_per_cpu_s"], 3)
                if profile:
                    out["profile"] = step(f"profile {name}", _profile, cs, tmp)
        reads[name] = out
    r["reads"] = reads
    return r


def _table(variants: list[dict[str, Any]]) -> str:
    """The side-by-side table (markdown) of a run, for bench/README.md."""
    names = sorted({n for v in variants for n in v["reads"]},
                   key=lambda n: (n != "kafka-python", n != "confluent", n))
    head = ("| format / codec / batch | samples per message | disk B / sample | produce "
            "samples / CPU-s | " + " | ".join(
                f"{n}: ceiling | {n}: service | {n}: ratio" for n in names) + " |")
    lines = [head, "|" + "---|" * (4 + 3 * len(names))]
    for v in variants:
        p = v["produce"]
        cells = [v["label"], f"{v['samples_per_message']:,}",
                 str(p["disk_bytes_per_sample"]), f"{p['produce_samples_per_cpu_s']:,}"]
        for n in names:
            read = v["reads"].get(n)
            if read is None:
                cells += ["", "", ""]
                continue
            cells.append(f"{read['ceiling']['samples_per_cpu_s']:,}")
            if "service" in read:
                cells += [f"{read['service']['samples_per_cpu_s']:,}",
                          f"{read['service_to_ceiling']:.2f}"]
            else:
                cells += ["", ""]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hours", type=float, default=2.0, help="simulated hours to produce")
    parser.add_argument("--scale", type=float, default=1.0,
                        help="the default cluster (576 GPUs) scaled by this factor "
                        "(bench/cluster_scale.py): 16 gives 9,216 GPUs on 1,536 nodes")
    parser.add_argument("--variants", nargs="+", type=_variant,
                        default=[_variant(v) for v in DEFAULT_VARIANTS],
                        help="FORMAT/CODEC/BATCH_MINUTES: wire format, the producer's "
                        "compression, simulated minutes per KafkaSink batch (one message "
                        "per node per batch); the first is the baseline")
    parser.add_argument("--clients", nargs="+", choices=["kafka-python", "confluent"],
                        default=["kafka-python", "confluent"])
    parser.add_argument("--bootstrap", default=None,
                        help="use this broker (PLAINTEXT) instead of starting one; disk "
                        "bytes are then not measured")
    parser.add_argument("--no-profile", action="store_true", help="skip the cProfile runs")
    parser.add_argument("--freshness-seconds", type=float, default=100.0,
                        help="wall seconds of live producing (0: skip)")
    parser.add_argument("--freshness-format", choices=list(FORMATS), default="jsonl-v1",
                        help="what the live producer sends (node agents send jsonl-v1)")
    parser.add_argument("--freshness-clients", nargs="+", choices=["kafka-python", "confluent"],
                        default=["kafka-python", "confluent"],
                        help="the service's client in the freshness runs (one run each)")
    parser.add_argument("--round-ms", type=float, default=150.0,
                        help="wall ms between 10 s sample rounds in the freshness run")
    parser.add_argument("--lateness", type=int, default=10,
                        help="allowed_lateness_s for the freshness run (default config: 120)")
    parser.add_argument("--warmup", type=float, default=10.0,
                        help="seconds of the freshness run left out of its statistics")
    parser.add_argument("--json", type=Path, default=None, help="write results here")
    args = parser.parse_args()

    started = datetime.now(UTC)
    result: dict[str, Any] = {
        "date": started.strftime("%Y-%m-%d"), "hours": args.hours, "scale": args.scale,
        "telemetry_partitions": TELEMETRY_PARTITIONS, "fetch_settings": FETCH,
        "loadavg_at_start": os.getloadavg(), "code": _code(),
    }
    with tempfile.TemporaryDirectory(prefix="kafka-bench-") as tmp_name:
        tmp = Path(tmp_name)
        with _broker(args.bootstrap, tmp) as (bootstrap, log_dir, broker_pid):
            watch = LoadWatch(broker_pid)
            simulated: dict[int, list[Batch]] = {}
            result["simulate_s"] = 0.0
            result["variants"] = []
            for i, (fmt, codec, minutes) in enumerate(args.variants):
                if minutes not in simulated:
                    t0 = time.perf_counter()
                    simulated[minutes] = list(simulate(SimConfig(
                        hours=args.hours, chunk_minutes=minutes,
                        cluster=scaled_cluster(args.scale))))
                    result["simulate_s"] += round(time.perf_counter() - t0, 1)
                r = _run_variant(bootstrap, log_dir, tmp, f"{fmt} / {codec} / {minutes} min",
                                 fmt, codec, simulated[minutes], args.clients,
                                 baseline=i == 0, profile=not args.no_profile and i < 2)
                r["batch_minutes"] = minutes
                result["variants"].append(r)
                print(_table(result["variants"][-1:]).split("\n")[-1], file=sys.stderr,
                      flush=True)
            simulated.clear()
            if args.freshness_seconds > 0:
                result["freshness"] = {client: _step("freshness")(
                    f"live run {client}", _freshness, bootstrap, args.freshness_format,
                    args.freshness_seconds, args.round_ms, args.lateness, args.warmup, tmp,
                    client) for client in args.freshness_clients}
            result["load"] = watch.summary()
    result["targets"] = {"processor_samples_per_cpu_s": 1_000_000, "ratio_to_ceiling": 0.8}
    result["loadavg_at_end"] = os.getloadavg()
    result["table"] = _table(result["variants"])
    text = json.dumps(result, indent=2, default=str)
    print(text)
    print(result["table"], file=sys.stderr)
    if args.json:
        args.json.write_text(text + "\n")


def _step(name: str) -> Callable[..., dict[str, Any]]:
    """A runner that logs each step of ``name`` and notes the load after it."""
    def run(what: str, fn: Callable[..., dict[str, Any]], *args: Any) -> dict[str, Any]:
        t0 = time.perf_counter()
        print(f"[{name}] {what} ...", file=sys.stderr, flush=True)
        out = fn(*args)
        out["loadavg_1min_after"] = round(os.getloadavg()[0], 2)
        print(f"[{name}] {what} done in {time.perf_counter() - t0:.1f} s", file=sys.stderr,
              flush=True)
        return out
    return run


if __name__ == "__main__":
    main()
