"""What a Kafka instance's checkpoint writes, and what saving it costs, side by side.

Simulates HOURS of the default cluster times SCALE and processes it with one engine
holding all PARTITIONS telemetry partitions (one Kafka instance), live or catching up.
Then saves that one state with ``CheckpointStore.save`` (the global part and a section
per partition, into a local folder) ROUNDS times with each way of writing a state file's
frames, alternating: Arrow IPC uncompressed (before 2026-12-07) and LZ4 (since). Prints
JSON: per way, each save's CPU and wall seconds, the bytes on disk, and the CPU to read
the sections back; and the megabytes of each part of the sections' state, each way.

    python bench/checkpoint_save.py [--hours 0.75] [--scale 16] [--interval 10]
                                    [--catching-up] [--rounds 3] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any, Literal

from cluster_scale import scaled_cluster

from gpuledger.pipeline import checkpoint, state_file
from gpuledger.pipeline.columns import conform
from gpuledger.pipeline.config import ProcessorConfig
from gpuledger.pipeline.partitions import Partitioning
from gpuledger.pipeline.processor import Processor
from gpuledger.pipeline.simulate import SimConfig, simulate
from gpuledger.pipeline.store import open_store
from gpuledger.pipeline.warehouse import Warehouse

WAYS: tuple[Literal["uncompressed", "lz4"], ...] = ("uncompressed", "lz4")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hours", type=float, default=0.75)
    parser.add_argument("--scale", type=float, default=16.0,
                        help="the default cluster (576 GPUs) times this")
    parser.add_argument("--interval", type=int, default=10, help="sample interval, s")
    parser.add_argument("--partitions", type=int, default=12)
    parser.add_argument("--catching-up", action="store_true",
                        help="process as a backlog (minutes close in whole-hour steps)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None, help="write results here")
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="checkpoint-save-"))
    sim = SimConfig(hours=args.hours, chunk_minutes=10, sample_interval_s=args.interval,
                    cluster=scaled_cluster(args.scale))
    n = args.partitions
    proc = Processor(ProcessorConfig(), Warehouse(root / "wh"), telemetry_clock=True,
                     partitioning=Partitioning(n, set(range(n))))
    batches = [{k: conform(v, k) for k, v in b.items()} for b in simulate(sim)]  # type: ignore[arg-type]
    for i, batch in enumerate(batches):
        proc.process(batch, validated=True,
                     behind=args.catching_up and i < len(batches) - 1)
    proc.warehouse.sync()

    keys = proc.sample_keys.split()
    sections = [checkpoint.section(proc, p, {}, keys.get(p)) for p in range(n)]
    original = state_file.FRAME_COMPRESSION
    parts: dict[str, Counter[str]] = {way: Counter() for way in WAYS}
    runs: dict[str, list[dict[str, Any]]] = {way: [] for way in WAYS}
    try:
        for way in WAYS:
            state_file.FRAME_COMPRESSION = way
            for sec in sections:
                for name, value in sec.state.items():
                    parts[way][name] += len(state_file.dump({"v": value}, checkpoint.CLASSES))
        for _ in range(args.rounds):
            for way in WAYS:
                state_file.FRAME_COMPRESSION = way
                folder = root / f"state-{way}"
                store = checkpoint.CheckpointStore(open_store(folder), "bench")
                c0, w0 = time.process_time(), time.perf_counter()
                store.save(proc, {}, {p: {} for p in range(n)})
                cpu, wall = time.process_time() - c0, time.perf_counter() - w0
                size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
                c0 = time.process_time()
                for p in range(n):
                    store.read_partition(p)
                runs[way].append({"save_cpu_s": round(cpu, 3), "save_wall_s": round(wall, 3),
                                  "bytes": size,
                                  "read_sections_cpu_s": round(time.process_time() - c0, 3)})
    finally:
        state_file.FRAME_COMPRESSION = original
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M"), "hours": args.hours, "scale": args.scale,
        "gpus": int(576 * args.scale), "interval_s": args.interval, "partitions": n,
        "catching_up": args.catching_up,
        "section_mb_by_part": {way: {k: round(v / 1e6, 1) for k, v in parts[way].most_common()}
                               for way in WAYS},
        "saves": runs,
    }
    text = json.dumps(result, indent=1)
    print(text)
    if args.json:
        args.json.write_text(text)


if __name__ == "__main__":
    main()
