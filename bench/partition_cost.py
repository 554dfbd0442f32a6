"""What holding many telemetry partitions costs the processor, without Kafka, side by side.

Simulates HOURS of the default cluster (``--scale`` multiplies it), in 10-minute
batches, and processes the same batches in one process, in CPU seconds of this process
(all threads), live (every batch closed as it comes) and catching up (``behind=True``
until the last batch: minutes close in whole-hour steps):

- one engine without partitioning (the embedded bus);
- one engine holding PARTITIONS telemetry partitions (one Kafka instance: the partition
  is a column, one close pass per step for all of them);
- PARTITIONS engines each holding one partition (as many instances as partitions, or
  the service before issue 11: one processor per partition), attempt parts routed to
  the owner in memory.

This is the processor side of ``kafka_throughput.py``'s service figure. Usage:

    python bench/partition_cost.py [--hours 2] [--scale 1] [--partitions 12] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import polars as pl
from cluster_scale import scaled_cluster

from gpuledger.pipeline.columns import conform
from gpuledger.pipeline.config import ProcessorConfig
from gpuledger.pipeline.partitions import Partitioning, partition_of
from gpuledger.pipeline.processor import Processor
from gpuledger.pipeline.simulate import SimConfig, simulate
from gpuledger.pipeline.warehouse import Warehouse

Batch = dict[str, pl.DataFrame]


def _run(batches: list[Batch], split: list[set[int]] | None, count: int, catching_up: bool,
         root: Path) -> dict[str, Any]:
    """Process ``batches`` with one unpartitioned engine (``split`` None) or one engine per
    set of partitions in ``split``."""
    config = ProcessorConfig()
    procs = [Processor(config, Warehouse(root))] if split is None else [
        Processor(config, Warehouse(root), telemetry_clock=True,
                  partitioning=Partitioning(count, set(held))) for held in split]
    # each engine's telemetry, split ahead (the transport's job, not measured)
    sets = [None] if split is None else split
    per_engine = []
    for b in batches:
        part = b["telemetry"]["node"].map_elements(lambda n: partition_of(n, count),
                                                   return_dtype=pl.Int64)
        per_engine.append([b if held is None else
                           {**b, "telemetry": b["telemetry"].filter(part.is_in(list(held)))}
                           for held in sets])
    owner = next(p for p in procs if p.owner)
    c0, w0 = time.process_time(), time.perf_counter()
    for i, per in enumerate(per_engine):
        behind = catching_up and i < len(per_engine) - 1
        for proc, batch in zip(procs, per, strict=True):
            proc.process(batch, validated=True, behind=behind)
        for proc in procs:
            if proc is not owner:
                for frame in proc.outbox:
                    owner.receive_parts(frame)
                proc.outbox.clear()
    for proc in procs:
        if proc is owner:
            continue
        proc.flush()
        for frame in proc.outbox:
            owner.receive_parts(frame)
        proc.outbox.clear()
    owner.flush()
    owner.outbox.clear()
    cpu, wall = time.process_time() - c0, time.perf_counter() - w0
    samples = sum(b["telemetry"].height for b in batches)
    return {
        "samples_per_cpu_s": round(samples / cpu), "cpu_s": round(cpu, 2),
        "wall_s": round(wall, 2), "close_passes": sum(p.counters.close_passes for p in procs),
        "late_samples": sum(p.counters.late_telemetry for p in procs),
        "waiting_attempts": owner.waiting.height,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hours", type=float, default=2.0)
    parser.add_argument("--scale", type=float, default=1.0,
                        help="the default cluster (576 GPUs) times this")
    parser.add_argument("--partitions", type=int, default=12)
    parser.add_argument("--json", type=Path, default=None, help="write results here")
    args = parser.parse_args()
    sim = SimConfig(hours=args.hours, chunk_minutes=10, cluster=scaled_cluster(args.scale))
    batches: list[Batch] = [{k: conform(v, k) for k, v in b.items()}  # type: ignore[arg-type]
                            for b in simulate(sim)]
    samples = sum(b["telemetry"].height for b in batches)
    result: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"), "hours": args.hours, "scale": args.scale,
        "gpu_samples": samples, "partitions": args.partitions,
        "loadavg_at_start": os.getloadavg(),
        "runs": {},
    }
    n = args.partitions
    runs: list[tuple[str, list[set[int]] | None, bool]] = [
        ("one engine, no partitioning, live", None, False),
        ("one engine, no partitioning, catching up", None, True),
        (f"one engine holding {n} partitions, live", [set(range(n))], False),
        (f"one engine holding {n} partitions, catching up", [set(range(n))], True),
        (f"{n} engines of one partition each, live", [{p} for p in range(n)], False),
        (f"{n} engines of one partition each, catching up", [{p} for p in range(n)], True),
    ]
    with tempfile.TemporaryDirectory(prefix="partition-cost-") as tmp:
        for name, split, behind in runs:
            result["runs"][name] = _run(batches, split, n, behind, Path(tmp) / name)
            print(name, result["runs"][name], flush=True)
    result["loadavg_at_end"] = os.getloadavg()
    lines = ["| run | GPU-samples / CPU-s | CPU s | close passes | late |", "|---|---|---|---|---|"]
    for name, r in result["runs"].items():
        lines.append(f"| {name} | {r['samples_per_cpu_s']:,} | {r['cpu_s']} | "
                     f"{r['close_passes']} | {r['late_samples']} |")
    result["table"] = "\n".join(lines)
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
