"""Catching up through Kafka: a backlog of a large fleet, processed by one instance.

Produces HOURS of the default cluster scaled by SCALE (``--scale 16``: 9,216 GPUs on
1,536 nodes) at INTERVAL-second samples to fresh topics (12 telemetry partitions;
``arrow-v1``, zstd, 10-minute ``KafkaSink`` batches: one message per node and batch),
simulated and published batch by batch so the backlog never sits in memory. Then, with
the topic complete (the service starts behind it, as after an outage), one
``gpuledger process`` instance runs in a child process until it has read everything:

- wall seconds from start to caught up (every sample read and its minutes closed), and
  to exit (flush, checkpoint);
- the child's CPU seconds and peak RSS (its own high-water mark, ``VmHWM``: a spawned
  child's ``ru_maxrss`` keeps its parent's from before ``exec``);
- the consume ceiling: the same topic read by the same client with the service's fetch
  settings and nothing else, in the same run.

Against a broker the script starts (``tests/kafka_broker.py``) or ``--bootstrap``.
With ``--instances N``, N instances then read the same backlog side by side in one new
group (one warehouse folder), each reporting its samples and CPU seconds, and the facts
of both runs are compared view by view (rows and an order-free hash of every row).

Target (issue 11): a 1-hour backlog of the ``--scale 16`` fleet at 1 s sampling in ≤ 60 s
wall on the 2-core machine; each of two instances ≥ 0.8 of the one-instance rate. Usage:

    python bench/catch_up.py [--hours 1] [--scale 16] [--interval 1]
        [--client confluent] [--instances 2] [--json PATH] [--keep DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from cluster_scale import scaled_cluster
from kafka_throughput import FETCH, TELEMETRY_PARTITIONS, _broker, _code, _settings

from gpuledger.pipeline.config import ProcessorConfig
from gpuledger.pipeline.kafka.client import open_consumer
from gpuledger.pipeline.kafka.producer import KafkaSink
from gpuledger.pipeline.kafka.topics import create_topics
from gpuledger.pipeline.kafka.wire import ARROW
from gpuledger.pipeline.simulate import SimConfig, simulate


def _produce(bootstrap: str, prefix: str, sim: SimConfig) -> dict[str, Any]:
    settings = _settings(bootstrap, prefix)
    create_topics(settings, telemetry_partitions=TELEMETRY_PARTITIONS)
    sink = KafkaSink(settings, ARROW, compression_type="zstd")
    samples, t0, sim_s = 0, time.perf_counter(), 0.0
    for batch in simulate(sim):
        sim_s += time.perf_counter() - t0
        samples += batch["telemetry"].height
        sink.publish_batch(batch)
        t0 = time.perf_counter()
    sink.close()
    return {"gpu_samples": samples, "simulate_s": round(sim_s, 1),
            "telemetry_messages": sink.messages}


def _ceiling(bootstrap: str, prefix: str, client: str, messages_hint: int) -> dict[str, Any]:
    settings = _settings(bootstrap, prefix, client)
    consumer = open_consumer(settings, group_id=f"ceiling-{uuid.uuid4().hex}",
                             enable_auto_commit=False, auto_offset_reset="earliest", **FETCH)
    topic = settings.topics.telemetry
    from kafka import TopicPartition

    tps = [TopicPartition(topic, p) for p in range(TELEMETRY_PARTITIONS)]
    consumer.assign(tps)
    for tp in tps:
        consumer.seek_to_beginning(tp)
    ends = consumer.end_offsets(tps)
    read = dict.fromkeys(tps, 0)
    c0, w0, n = time.process_time(), time.perf_counter(), 0
    while any(read[tp] < ends[tp] for tp in tps):
        for tp, recs in consumer.poll(timeout_ms=500, max_records=20_000).items():
            n += len(recs)
            read[tp] = max(read[tp], recs[-1].offset + 1)
    cpu, wall = time.process_time() - c0, time.perf_counter() - w0
    consumer.close()
    return {"messages": n, "cpu_s": round(cpu, 2), "wall_s": round(wall, 2)}


def _peak_rss_mib() -> int:
    """This process's own peak RSS (``VmHWM``), in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return round(int(line.split()[1]) / 1024)
    return 0


FACT_VIEWS = ("gpu_minute", "gpu_hourly", "frag_minute", "pending_minute", "blocked_minute",
              "job_attempts", "job_gpu", "preemptions", "rejects")


def _facts(root: Path) -> dict[str, list[int]]:
    """Each fact view's rows, an order-free hash of its rows, and the same with floats
    rounded to 6 decimals (before fixed-point sums, 55b92de, float sums added up in
    another order differed in their last digit), read through the analysts' read-only
    connection."""
    import polars as pl

    from gpuledger.pipeline.query import connect

    con = connect(root)
    try:
        out = {}
        for view in FACT_VIEWS:
            rows = pl.from_arrow(con.sql(f"SELECT * FROM {view}").to_arrow_table())
            assert isinstance(rows, pl.DataFrame)
            near = rows.with_columns(pl.col(pl.Float64).round(6))
            out[view] = [rows.height, int(rows.hash_rows().sum() or 0),
                         int(near.hash_rows().sum() or 0)]
        return out
    finally:
        con.close()


def _service(bootstrap: str, prefix: str, client: str, samples: int, root: str,
             out: Any, group: str, profile: str | None = None,
             max_poll_samples: int | None = None) -> None:
    """The child: run the service until it has read and closed everything (of the
    partitions it holds, with others of ``group``). ``profile``: write a cProfile of
    the run there (its figures then include the profiler's overhead)."""
    import cProfile

    from gpuledger.pipeline.kafka.service import KafkaProcessorService, ServiceOptions

    settings = _settings(bootstrap, prefix, client)
    options = ServiceOptions(group_id=group, exit_when_idle_s=4.0)
    if max_poll_samples is not None:
        options.max_poll_samples = max_poll_samples
    service = KafkaProcessorService(settings, ProcessorConfig(), Path(root), options)
    handle = service._handle
    caught: list[float] = []
    polls: list[int] = []

    def timed(by_topic: Any, telemetry: bool) -> int:
        if telemetry:
            polls.append(sum(len(m) for m in by_topic.values()))
        n = handle(by_topic, telemetry)
        if n and not caught and service.counters().records_in["telemetry"] >= samples:
            caught.append(time.perf_counter())
        return n

    service._handle = timed  # type: ignore[method-assign]
    profiler = cProfile.Profile() if profile else None
    c0, w0 = time.process_time(), time.perf_counter()
    try:
        if profiler is not None:
            profiler.runcall(service.run)
        else:
            service.run()
    finally:
        service.close()
    if profiler is not None and profile:
        profiler.dump_stats(profile)
    wall, cpu = time.perf_counter() - w0, round(time.process_time() - c0, 1)
    c = service.counters()
    read = c.records_in["telemetry"]
    out.send({
        "wall_to_caught_up_s": round(caught[0] - w0, 1) if caught else None,
        "wall_to_exit_s": round(wall, 1), "cpu_s": cpu,
        "peak_rss_mib": _peak_rss_mib(),
        "samples": read, "samples_per_cpu_s": round(read / cpu) if cpu else None,
        "late_samples": c.late_telemetry,
        "close_passes": c.close_passes, "minutes_closed": c.minutes_closed,
        "gpu_minute_rows": c.fact_rows.get("gpu_minute", 0),
        "max_poll_samples": options.max_poll_samples,
        "telemetry_polls": len(polls), "largest_poll_messages": max(polls, default=0),
    })


def _run_instances(bootstrap: str, prefix: str, client: str, samples: int, root: Path,
                   n: int, profile: Path | None = None,
                   max_poll_samples: int | None = None) -> list[dict[str, Any]]:
    """``n`` service instances in one new consumer group, one child process each,
    sharing one warehouse folder; each one's figures."""
    ctx = mp.get_context("spawn")
    group = f"catchup-{uuid.uuid4().hex}"
    pipes, children = [], []
    for _ in range(n):
        here, there = ctx.Pipe()
        child = ctx.Process(target=_service, args=(
            bootstrap, prefix, client, samples, str(root), there, group,
            None if profile is None else str(profile), max_poll_samples))
        child.start()
        pipes.append(here)
        children.append(child)
    out = [p.recv() for p in pipes]
    for child in children:
        child.join()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hours", type=float, default=1.0)
    parser.add_argument("--scale", type=float, default=16.0)
    parser.add_argument("--interval", type=int, default=1, help="sample interval, s")
    parser.add_argument("--client", choices=["kafka-python", "confluent"], default="confluent")
    parser.add_argument("--instances", type=int, default=1,
                        help="then run this many instances in one group side by side, "
                        "each one's samples per CPU-second against the one instance's")
    parser.add_argument("--max-poll-samples", default=None,
                        help="comma-separated: run the one instance once with each "
                        "max_poll_samples, in turn, on the same backlog (each in its own "
                        "warehouse; the facts compared with the first run's); by default "
                        "once with the service's default")
    parser.add_argument("--bootstrap", default=None)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--profile", type=Path, default=None,
                        help="write a cProfile of the one-instance run here (its rates "
                             "then include the profiler's overhead)")
    parser.add_argument("--keep", type=Path, default=None,
                        help="work in this new folder and keep it (the warehouses wh/ and "
                        "wh-n/, the broker's logs) instead of a temporary one")
    args = parser.parse_args()
    sim = SimConfig(hours=args.hours, chunk_minutes=10, sample_interval_s=args.interval,
                    cluster=scaled_cluster(args.scale))
    result: dict[str, Any] = {"date": time.strftime("%Y-%m-%d"), "hours": args.hours,
                              "scale": args.scale, "interval_s": args.interval,
                              "client": args.client, "code": _code(),
                              "loadavg_at_start": os.getloadavg()}
    if args.keep is not None:
        args.keep.mkdir(parents=True, exist_ok=False)
    with (contextlib.nullcontext(str(args.keep)) if args.keep is not None
          else tempfile.TemporaryDirectory(prefix="catch-up-")) as tmp_name:
        tmp = Path(tmp_name)
        with _broker(args.bootstrap, tmp) as (bootstrap, _log_dir, _pid):
            prefix = f"c{uuid.uuid4().hex[:8]}."
            t0 = time.perf_counter()
            result["produce"] = _produce(bootstrap, prefix, sim)
            result["produce"]["wall_s"] = round(time.perf_counter() - t0, 1)
            print("produced", result["produce"], file=sys.stderr, flush=True)
            result["ceiling"] = _ceiling(bootstrap, prefix, args.client, 0)
            print("ceiling", result["ceiling"], file=sys.stderr, flush=True)
            samples = result["produce"]["gpu_samples"]
            result["service"] = _run_instances(bootstrap, prefix, args.client, samples,
                                               tmp / "wh", 1, args.profile)[0]
            if args.max_poll_samples:
                first = _facts(tmp / "wh")
                result["by_max_poll_samples"] = []
                for i, value in enumerate(args.max_poll_samples.split(",")):
                    root = tmp / f"wh-poll-{i}"
                    run = _run_instances(bootstrap, prefix, args.client, samples, root, 1,
                                         max_poll_samples=int(value))[0]
                    run["facts_differ"] = [v for v, f in _facts(root).items()
                                           if f != first[v]]
                    print("max_poll_samples", value, run, file=sys.stderr, flush=True)
                    result["by_max_poll_samples"].append(run)
            if args.instances > 1:
                result["instances"] = _run_instances(bootstrap, prefix, args.client,
                                                     samples, tmp / "wh-n", args.instances)
                one, many = _facts(tmp / "wh"), _facts(tmp / "wh-n")
                result["facts_one_instance"] = {v: n for v, (n, _h, _r) in one.items()}
                result["facts_differ"] = [v for v in FACT_VIEWS if one[v] != many[v]]
                result["facts_differ_beyond_1e-6"] = [
                    v for v in FACT_VIEWS if one[v][0::2] != many[v][0::2]]
                print("facts differ in", result["facts_differ"], "beyond 1e-6 in",
                      result["facts_differ_beyond_1e-6"], file=sys.stderr, flush=True)
    c = result["ceiling"]
    samples = result["produce"]["gpu_samples"]
    for inst in result.get("instances", []):
        inst["ratio_to_one_instance"] = round(
            inst["samples_per_cpu_s"] / result["service"]["samples_per_cpu_s"], 3)
    result["ceiling"]["samples_per_cpu_s"] = round(samples / max(c["cpu_s"], 1e-9))
    result["target"] = {"wall_to_caught_up_s": 60}
    result["loadavg_at_end"] = os.getloadavg()
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    main()
