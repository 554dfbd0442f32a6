"""What sharding and catching up cost the processor, without Kafka, side by side.

Simulates HOURS of the default cluster (``--scale`` multiplies it), in 10-minute
batches, and processes the same batches four ways in one process, in CPU seconds of
this process (all threads):

- one processor, every batch closed as it comes (live);
- one processor catching up (``behind=True`` until the last batch: minutes close in
  whole-hour steps, ``windows.catchup_close_minutes``);
- SHARDS shards (``shard.py``: telemetry split by Kafka's partitioner, scheduler
  events and inventory to every shard, attempt parts routed to the owner in memory),
  live and catching up.

This is the processor side of ``kafka_throughput.py``'s service figure: the service
runs one shard per telemetry partition it is assigned. Usage:

    python bench/shard_cost.py [--hours 2] [--scale 1] [--shards 12] [--json PATH]
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
from gpuledger.pipeline.processor import Processor
from gpuledger.pipeline.shard import Shard
from gpuledger.pipeline.simulate import SimConfig, simulate
from gpuledger.pipeline.warehouse import Warehouse

Batch = dict[str, pl.DataFrame]


def _run(batches: list[Batch], shards: int, catching_up: bool, root: Path) -> dict[str, Any]:
    """Process ``batches`` with one processor (``shards`` 0) or that many shards."""
    config = ProcessorConfig()
    parts = [Shard(p, shards) for p in range(shards)] if shards else [None]
    procs = [Processor(config, Warehouse(root) if s is None else Warehouse(root, s.suffix),
                       telemetry_clock=True, shard=s) for s in parts]
    # each shard's telemetry, split ahead (the transport's job, not measured)
    split = [[b if s is None else {**b, "telemetry": s.mine(b["telemetry"])} for s in parts]
             for b in batches]
    owner = procs[0]
    c0, w0 = time.process_time(), time.perf_counter()
    for i, per_shard in enumerate(split):
        behind = catching_up and i < len(split) - 1
        for proc, batch in zip(procs, per_shard, strict=True):
            proc.process(batch, validated=True, behind=behind)
        for proc in procs[1:]:
            for frame in proc.outbox:
                owner.receive_parts(frame)
            proc.outbox.clear()
    for proc in procs[1:]:
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
    parser.add_argument("--shards", type=int, default=12)
    parser.add_argument("--json", type=Path, default=None, help="write results here")
    args = parser.parse_args()
    sim = SimConfig(hours=args.hours, chunk_minutes=10, cluster=scaled_cluster(args.scale))
    batches: list[Batch] = [{k: conform(v, k) for k, v in b.items()}  # type: ignore[arg-type]
                            for b in simulate(sim)]
    samples = sum(b["telemetry"].height for b in batches)
    result: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"), "hours": args.hours, "scale": args.scale,
        "gpu_samples": samples, "shards": args.shards, "loadavg_at_start": os.getloadavg(),
        "runs": {},
    }
    with tempfile.TemporaryDirectory(prefix="shard-cost-") as tmp:
        for name, shards, behind in (("one processor, live", 0, False),
                                     ("one processor, catching up", 0, True),
                                     (f"{args.shards} shards, live", args.shards, False),
                                     (f"{args.shards} shards, catching up", args.shards, True)):
            result["runs"][name] = _run(batches, shards, behind, Path(tmp) / name)
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
