"""Kafka soak: the processor service at full rate for MINUTES; its RSS and consumer lag.

Against a broker it starts itself (``tests/kafka_broker.py``) or ``--bootstrap``:

- a producer process simulates the default cluster (576 GPUs, 10 s samples; ``--arrivals``
  scales its job arrivals) over a long span and publishes it with ``KafkaSink`` as fast
  as it can (gzip, acks=all), in batches of CHUNK_MINUTES (one message per node per
  batch);
- the service runs as its own process, as ``gpuledger process --kafka ...`` (the command a
  deployment runs) sets it up (``--cli`` runs that very command; by default a child
  process builds the same service with a workaround for a cold-start crash, see
  ``_service``), from the start of the topics, checkpointing every 10 s;
- every 10 s: the service's VmRSS (``/proc/<pid>/status``), the consumer lag (end
  offsets minus the group's committed offsets, in messages; commits follow checkpoints,
  so up to 10 s behind), the checkpoint file's size (the processor's state, pickled)
  and the service's own progress line (samples, closed minutes, late samples).

After MINUTES the producer stops and the service gets SIGTERM (it writes partial hours,
checkpoints and exits 0); a SIGTERM to this script ends the run the same way, early.
Pass: RSS growth after the warm-up under 5 % (issue 11's target for 2 hours), peak of
the last third of the samples after the warm-up against the peak of the first third
(RSS is spiky; medians and a slope are reported too). The warm-up should cover the
first simulated day and its compaction (ended jobs are remembered 24 h): about 20
minutes at full rate here. Prints one JSON object; ``--json PATH``
writes it too. Usage:

    python bench/kafka_soak.py [--minutes 30] [--warmup-minutes 10] [--chunk-minutes 1]
        [--format jsonl-v1] [--arrivals 1.0] [--cli] [--bootstrap HOST:PORT]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
FORMATS = ("arrow-v1", "jsonl-v1")
PROGRESS = re.compile(r"messages=(\d+) .*samples=(\d+) lag=(\d+) closed_until=(.+?) "
                      r"dead_letters=(\d+) late=(\d+)(?: rss_mib=\d+ memory_released_mib=(\d+))?")


@contextlib.contextmanager
def _broker(bootstrap: str | None, workdir: Path) -> Iterator[tuple[str, Path | None]]:
    if bootstrap:
        yield bootstrap, None
        return
    sys.path.insert(0, str(REPO / "tests"))
    from kafka_broker import start_broker  # type: ignore[import-not-found]

    broker = start_broker(workdir / "broker")
    try:
        yield broker.bootstrap, workdir / "broker" / "data"
    finally:
        broker.stop()


def _write_atomic(path: str, doc: dict[str, Any]) -> None:
    """The progress file is read while the producer runs: never a half-written one."""
    tmp = Path(f"{path}.tmp")
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, path)


def _producer(bootstrap: str, prefix: str, fmt: str, sim_hours: float, chunk_minutes: int,
              compression: str, arrivals: float, out: str, stop: Any) -> None:
    """Child process: publish the simulation as fast as possible until ``stop``."""
    from cluster_scale import scaled_cluster

    from gpuledger.pipeline.kafka.producer import KafkaSink
    from gpuledger.pipeline.kafka.settings import KafkaSettings, Topics
    from gpuledger.pipeline.kafka.wire import ARROW, JSONL
    from gpuledger.pipeline.simulate import SimConfig, simulate

    settings = KafkaSettings(bootstrap=bootstrap, topics=Topics().prefixed(prefix))
    overrides: dict[str, Any] = {} if compression == "gzip" else {"compression_type": None}
    sink = KafkaSink(settings, ARROW if fmt == "arrow-v1" else JSONL, **overrides)
    samples = 0
    exhausted = True
    t0 = time.perf_counter()
    cluster = None if arrivals == 1.0 else scaled_cluster(1.0, arrivals)
    for batch in simulate(SimConfig(hours=sim_hours, chunk_minutes=chunk_minutes,
                                    cluster=cluster)):
        if stop.is_set():
            exhausted = False
            break
        sink.publish_batch(batch)
        samples += batch["telemetry"].height
        _write_atomic(out, {"samples": samples, "messages": sink.messages})
    sink.close()
    _write_atomic(out, {
        "samples": samples, "messages": sink.messages, "bytes": sink.bytes,
        "wall_s": time.perf_counter() - t0, "cpu_s": time.process_time(),
        "input_exhausted": exhausted,
    })


def _service(bootstrap: str, prefix: str, group: str, warehouse: str, log: str) -> None:
    """Child process: what ``gpuledger process --kafka`` runs (``--cli`` runs the very
    command), logging to ``log``."""
    import logging

    from gpuledger.pipeline.config import ProcessorConfig
    from gpuledger.pipeline.kafka.service import KafkaProcessorService, ServiceOptions
    from gpuledger.pipeline.kafka.settings import KafkaSettings, Topics

    logging.basicConfig(filename=log, level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("kafka").setLevel(logging.WARNING)
    settings = KafkaSettings(bootstrap=bootstrap, topics=Topics().prefixed(prefix))
    service = KafkaProcessorService(settings, ProcessorConfig(), Path(warehouse),
                                    ServiceOptions(group_id=group))
    service.install_signal_handlers()
    try:
        service.run()
    finally:
        service.close()


def _rss_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def _size_mib(folder: Path) -> float | None:
    """The checkpoints' size: every shard's whole state, pickled."""
    try:
        return round(sum(p.stat().st_size for p in folder.glob("*.checkpoint")) / 2**20, 2)
    except OSError:
        return None


def _cpu_s(pid: int) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Lag:
    """Telemetry end offsets minus the group's committed offsets, in messages."""

    def __init__(self, bootstrap: str, topic: str, group: str) -> None:
        from kafka import KafkaAdminClient, KafkaConsumer

        self.topic, self.group = topic, group
        self.admin = KafkaAdminClient(bootstrap_servers=bootstrap)
        self.consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)

    def __call__(self) -> int | None:
        from kafka import TopicPartition

        parts = self.consumer.partitions_for_topic(self.topic) or set()
        tps = [TopicPartition(self.topic, p) for p in parts]
        ends = self.consumer.end_offsets(tps)
        committed = self.admin.list_group_offsets({self.group: tps}).get(self.group, {})
        return int(sum(max(end - max(getattr(committed.get(tp), "offset", 0) or 0, 0), 0)
                       for tp, end in ends.items()))

    def close(self) -> None:
        self.consumer.close()
        self.admin.close()


def _last_progress(log: Path) -> dict[str, Any] | None:
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return None
    found = PROGRESS.findall(text)
    if not found:
        return None
    messages, samples, lag, closed, dead, late, released = found[-1]
    return {"messages": int(messages), "samples": int(samples), "service_lag": int(lag),
            "closed_until": closed, "dead_letters": int(dead), "late": int(late),
            "memory_released_mib": int(released) if released else None}


class ServiceProcess:
    """The service in its own process: the CLI command, or ``_service`` in a child."""

    def __init__(self, cli: bool, ctx: Any, bootstrap: str, prefix: str, group: str,
                 warehouse: Path, log: Path) -> None:
        self.popen: subprocess.Popen[bytes] | None = None
        self.child: Any = None
        if cli:
            with log.open("wb") as log_fh:
                self.popen = subprocess.Popen(
                    [sys.executable, "-m", "gpuledger.cli.main", "process", "--kafka",
                     bootstrap, "--topic-prefix", prefix, "--group", group,
                     "--warehouse", str(warehouse)],
                    stdout=log_fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            self.pid = self.popen.pid
        else:
            self.child = ctx.Process(target=_service, args=(
                bootstrap, prefix, group, str(warehouse), str(log)))
            self.child.start()
            self.pid = int(self.child.pid)

    def alive(self) -> bool:
        if self.popen is not None:
            return self.popen.poll() is None
        return bool(self.child.is_alive())

    def stop(self) -> int | None:
        """SIGTERM (the service writes partial hours, checkpoints, exits); its exit code."""
        if self.alive():
            os.kill(self.pid, signal.SIGTERM)
        if self.popen is not None:
            try:
                return self.popen.wait(120)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                return self.popen.wait()
        self.child.join(120)
        if self.child.is_alive():
            self.child.kill()
            self.child.join()
        code: int | None = self.child.exitcode
        return code


def _load() -> float:
    return round(os.getloadavg()[0], 2)


def _stop_on_sigterm() -> threading.Event:
    """SIGTERM ends the run early as if its minutes were up: the producer, the service
    and the broker are stopped and the summary is written (a kill of this process alone
    would leave its children running)."""
    asked = threading.Event()
    signal.signal(signal.SIGTERM, lambda _sig, _frame: asked.set())
    return asked


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0, help="wall minutes to run")
    parser.add_argument("--warmup-minutes", type=float, default=None,
                        help="left out of the growth figure (default: min(10, minutes / 3)); "
                        "state fills for a simulated day (ended jobs are remembered 24 h), "
                        "see simulated_hours_at_warmup_end")
    parser.add_argument("--interval", type=float, default=10.0, help="seconds between samples")
    parser.add_argument("--format", choices=FORMATS, default="jsonl-v1",
                        help="what the producer sends (node agents send jsonl-v1)")
    parser.add_argument("--chunk-minutes", type=int, default=1,
                        help="simulated minutes per published batch: one message per node per "
                        "chunk (default 1; with 10, a message spans more than the 120 s "
                        "lateness and most samples of a concurrent run arrive late)")
    parser.add_argument("--compression", choices=("gzip", "none"), default="gzip",
                        help="producer compression (gzip: KafkaSink's default)")
    parser.add_argument("--sim-hours", type=float, default=None,
                        help="simulated span available to the producer (default: minutes × 8, "
                        "enough for ~27,000 GPU-samples/s, at most 1000: the simulator plans "
                        "the span up front, 400 h in ~40 s, 1000 h in ~5 minutes, inside the "
                        "warm-up; the run ends early when the producer has sent it all)")
    parser.add_argument("--arrivals", type=float, default=1.0,
                        help="scale the default cluster's job arrivals (1: as packaged, whose "
                        "queue grows without bound, 73 to 3,319 pending jobs in 29 simulated "
                        "days, and the processor's state with it; 0.9: a busy queue that "
                        "stays under about 400, for a soak that measures leaks alone)")
    parser.add_argument("--bootstrap", default=None, help="use this broker (PLAINTEXT)")
    parser.add_argument("--cli", action="store_true",
                        help="run the service as `gpuledger process --kafka` (no workaround)")
    parser.add_argument("--json", type=Path, default=None, help="write results here")
    args = parser.parse_args()
    asked_to_stop = _stop_on_sigterm()
    warmup = args.warmup_minutes if args.warmup_minutes is not None else min(10, args.minutes / 3)
    sim_hours = args.sim_hours or min(args.minutes * 8, 1000.0)

    prefix = f"soak.{uuid.uuid4().hex[:8]}."
    group = f"soak-{uuid.uuid4().hex[:8]}"
    samples_log: list[dict[str, Any]] = []
    result: dict[str, Any] = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d"), "minutes": args.minutes,
        "warmup_minutes": warmup, "format": args.format, "compression": args.compression,
        "chunk_minutes": args.chunk_minutes, "arrivals": args.arrivals,
        "sim_hours_available": sim_hours, "loadavg_at_start": os.getloadavg(),
    }
    with tempfile.TemporaryDirectory(prefix="kafka-soak-") as tmp_name, \
            _broker(args.bootstrap, Path(tmp_name)) as (bootstrap, log_dir):
        tmp = Path(tmp_name)
        from gpuledger.pipeline.kafka.settings import KafkaSettings, Topics
        from gpuledger.pipeline.kafka.topics import create_topics

        settings = KafkaSettings(bootstrap=bootstrap, topics=Topics().prefixed(prefix))
        create_topics(settings, telemetry_partitions=12)
        ctx = mp.get_context("spawn")
        stop = ctx.Event()
        prod_out = tmp / "producer.json"
        producer = ctx.Process(target=_producer, daemon=True, args=(
            bootstrap, prefix, args.format, sim_hours, args.chunk_minutes, args.compression,
            args.arrivals, str(prod_out), stop))
        producer.start()
        service_log = tmp / "service.log"
        service = ServiceProcess(args.cli, ctx, bootstrap, prefix, group, tmp / "wh",
                                 service_log)
        lag = Lag(bootstrap, settings.topics.telemetry, group)
        checkpoint = tmp / "wh" / "state" / group
        t0 = time.monotonic()
        end = t0 + args.minutes * 60
        try:
            while time.monotonic() < end and service.alive() and not asked_to_stop.is_set():
                asked_to_stop.wait(max(0.0, min(args.interval, end - time.monotonic())))
                produced = json.loads(prod_out.read_text()) if prod_out.exists() else {}
                row = {"t_s": round(time.monotonic() - t0, 1),
                       "rss_mib": _rss_mib(service.pid),
                       "checkpoint_mib": _size_mib(checkpoint),
                       "service_cpu_s": _cpu_s(service.pid),
                       "lag_messages": lag(),
                       "produced_samples": produced.get("samples", 0),
                       "loadavg_1min": _load(),
                       **(_last_progress(service_log) or {})}
                samples_log.append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)
                if not producer.is_alive() and row["lag_messages"] == 0:
                    break  # input exhausted and all of it read
        finally:
            stop.set()
            producer.join(120)
            exit_code = service.stop()
            lag.close()
        result["service"] = "gpuledger process (CLI)" if args.cli else \
            "KafkaProcessorService in a child process, cold-start workaround"
        result["service_exit_code"] = exit_code
        text_log = service_log.read_text(errors="replace")
        result["cold_start_workaround_uses"] = text_log.count("cold-start workaround")
        result["service_crashed"] = "Traceback" in text_log
        result["producer"] = json.loads(prod_out.read_text()) if prod_out.exists() else None
        final = _last_progress(service_log)
        result["service_last_progress"] = final
        if log_dir is not None:
            result["broker_log_dir_mib"] = round(
                sum(f.stat().st_size for f in log_dir.rglob("*.log")) / 2**20, 1)
        tail = service_log.read_text(errors="replace").splitlines()[-5:]
        result["service_log_tail"] = tail
    result.update(_summary(samples_log, warmup))
    result["samples"] = samples_log
    result["loadavg_at_end"] = os.getloadavg()
    text = json.dumps(result, indent=2, default=str)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")


SIM_START = datetime(2026, 1, 5, tzinfo=UTC)  # SimConfig's default start


def _sim_hours(rows: list[dict[str, Any]]) -> float | None:
    """Simulated hours the service had closed by the last of ``rows`` (from its log)."""
    for row in reversed(rows):
        if row.get("closed_until") and row["closed_until"] != "None":
            closed = datetime.fromisoformat(row["closed_until"])
            return round((closed - SIM_START).total_seconds() / 3600, 2)
    return None


def _summary(rows: list[dict[str, Any]], warmup_min: float) -> dict[str, Any]:
    rss = [(r["t_s"], r["rss_mib"]) for r in rows if r.get("rss_mib") is not None]
    if not rss:
        return {"pass": False, "why": "no RSS samples"}
    after = [(t, m) for t, m in rss if t >= warmup_min * 60]
    before = [(t, m) for t, m in rss if t < warmup_min * 60]
    base = before[-1][1] if before else (after[0][1] if after else None)
    out: dict[str, Any] = {
        "simulated_hours_at_warmup_end": _sim_hours([r for r in rows
                                                     if r["t_s"] < warmup_min * 60]),
        "simulated_hours_at_end": _sim_hours(rows),
        "rss_first_mib": round(rss[0][1], 1),
        "rss_at_warmup_end_mib": None if base is None else round(base, 1),
        "rss_peak_mib": round(max(m for _t, m in rss), 1),
        "rss_last_mib": round(rss[-1][1], 1),
    }
    if len(after) >= 3:
        # RSS is spiky (hour writes, checkpoints), so windows are compared peak to peak:
        # the first third after the warm-up against the last third.
        third = len(after) // 3
        first, last = [m for _t, m in after[:third]], [m for _t, m in after[-third:]]
        growth = (max(last) - max(first)) / max(first)
        ts = [t for t, _m in after]
        ms = [m for _t, m in after]
        mean_t, mean_m = sum(ts) / len(ts), sum(ms) / len(ms)
        slope = (sum((t - mean_t) * (m - mean_m) for t, m in after)
                 / max(sum((t - mean_t) ** 2 for t in ts), 1e-9))
        out.update(
            rss_peak_after_warmup_mib=round(max(ms), 1),
            rss_first_third_after_warmup_peak_mib=round(max(first), 1),
            rss_last_third_peak_mib=round(max(last), 1),
            rss_growth_after_warmup=round(growth, 4),
            rss_growth_after_warmup_medians=round(
                statistics.median(last) / statistics.median(first) - 1, 4),
            rss_slope_after_warmup_mib_per_min=round(slope * 60, 2),
        )
        out["pass"] = growth < 0.05
    else:
        out["pass"] = None
        out["why"] = "fewer than 3 samples after the warm-up"
    done = [r for r in rows if "samples" in r]
    if len(done) >= 2:
        a, b = done[0], done[-1]
        span = b["t_s"] - a["t_s"]
        if span > 0:
            out["processed_samples_per_s"] = round((b["samples"] - a["samples"]) / span)
            if a.get("service_cpu_s") is not None and b.get("service_cpu_s") is not None:
                cpu = b["service_cpu_s"] - a["service_cpu_s"]
                out["service_cores_used"] = round(cpu / span, 2)
                if cpu > 0:
                    out["processed_samples_per_cpu_s"] = round(
                        (b["samples"] - a["samples"]) / cpu)
        out["produced_samples_per_s"] = round(
            (rows[-1]["produced_samples"] - rows[0]["produced_samples"])
            / max(rows[-1]["t_s"] - rows[0]["t_s"], 1e-9))
    lags = [r["lag_messages"] for r in rows if r.get("lag_messages") is not None]
    if lags:
        out["lag_messages_max"] = max(lags)
        out["lag_messages_last"] = lags[-1]
    loads = [r["loadavg_1min"] for r in rows]
    out["loadavg_1min_mean"] = round(sum(loads) / len(loads), 2)
    return out


if __name__ == "__main__":
    main()
