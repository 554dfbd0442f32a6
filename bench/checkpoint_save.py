"""What a Kafka instance's checkpoint writes, and what saving it costs, side by side.

Simulates HOURS of the default cluster times SCALE, in one-minute batches, and processes
it live with one engine holding all PARTITIONS telemetry partitions (one Kafka
instance). Then, for each of the ROUNDS minutes after, it processes the minute (a close
step) and saves the state with ``CheckpointStore.save`` (the global part and a section
per partition, into a local folder) each way, in alternating order, twice: once after
the close step, and once more with nothing new (a live service checkpoints every 10 s and
closes every minute: 5 saves of 6 are of that kind). The ways:

- ``whole``: each section holds its partition's frames of the open hours (until
  2026-12-07; frames in LZ4 since that day);
- ``incremental``: each section names its frames by file and index, and a save writes
  only the frames new since the last (``CheckpointStore(incremental=True)``, the Kafka
  service's since 2026-12-07).

Prints JSON: per way and kind of save, each save's CPU and wall seconds and the bytes it
wrote; the CPU to read every section back; and the megabytes of each part of the sections'
state.

    python bench/checkpoint_save.py [--hours 0.75] [--scale 16] [--interval 10]
                                    [--rounds 3] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from cluster_scale import scaled_cluster

from gpuledger.pipeline import checkpoint, state_file
from gpuledger.pipeline.columns import conform
from gpuledger.pipeline.config import ProcessorConfig
from gpuledger.pipeline.partitions import Partitioning
from gpuledger.pipeline.processor import Processor
from gpuledger.pipeline.simulate import SimConfig, simulate
from gpuledger.pipeline.store import Store, open_store
from gpuledger.pipeline.warehouse import Warehouse

WAYS = ("whole", "incremental")


def _written(store: Store, before: dict[str, float]) -> int:
    """The bytes of the files written (new or replaced) since ``before`` was listed."""
    return sum(e.size for e in store.list("") if before.get(e.path) != e.mtime)


def _save(store: checkpoint.CheckpointStore, proc: Processor, n: int) -> dict[str, Any]:
    before = {e.path: e.mtime for e in store.store.list("")}
    c0, w0 = time.process_time(), time.perf_counter()
    store.save(proc, {}, {p: {} for p in range(n)})
    cpu, wall = time.process_time() - c0, time.perf_counter() - w0
    return {"cpu_s": round(cpu, 3), "wall_s": round(wall, 3),
            "bytes_written": _written(store.store, before)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hours", type=float, default=0.75)
    parser.add_argument("--scale", type=float, default=16.0,
                        help="the default cluster (576 GPUs) times this")
    parser.add_argument("--interval", type=int, default=10, help="sample interval, s")
    parser.add_argument("--partitions", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None, help="write results here")
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="checkpoint-save-"))
    sim = SimConfig(hours=args.hours + args.rounds / 60, chunk_minutes=1,
                    sample_interval_s=args.interval, cluster=scaled_cluster(args.scale))
    n = args.partitions
    proc = Processor(ProcessorConfig(), Warehouse(root / "wh"), telemetry_clock=True,
                     partitioning=Partitioning(n, set(range(n))))
    batches = [{k: conform(v, k) for k, v in b.items()} for b in simulate(sim)]  # type: ignore[arg-type]
    for batch in batches[:-args.rounds]:
        proc.process(batch, validated=True)
    stores = {way: checkpoint.CheckpointStore(open_store(root / f"state-{way}"), "bench",
                                              incremental=way == "incremental")
              for way in WAYS}
    first = {way: _save(stores[way], proc, n) for way in WAYS}
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {
        way: {"after_a_close": [], "nothing_new": []} for way in WAYS}
    for i, batch in enumerate(batches[-args.rounds:]):
        proc.process(batch, validated=True)
        order = WAYS if i % 2 == 0 else WAYS[::-1]
        for way in order:
            runs[way]["after_a_close"].append(_save(stores[way], proc, n))
        for way in order:
            runs[way]["nothing_new"].append(_save(stores[way], proc, n))
    read: dict[str, float] = {}
    for way in WAYS:
        reader = checkpoint.CheckpointStore(open_store(root / f"state-{way}"), "bench",
                                            incremental=way == "incremental")
        c0 = time.process_time()
        for p in range(n):
            reader.read_partition(p)
        read[way] = round(time.process_time() - c0, 3)
    keys = proc.sample_keys.split()
    parts: Counter[str] = Counter()
    for p in range(n):
        for name, value in checkpoint.section(proc, p, {}, keys.get(p)).state.items():
            parts[name] += len(state_file.dump({"v": value}, checkpoint.CLASSES))
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M"), "hours": args.hours, "scale": args.scale,
        "gpus": int(576 * args.scale), "interval_s": args.interval, "partitions": n,
        "section_mb_by_part": {k: round(v / 1e6, 1) for k, v in parts.most_common()},
        "first_save": first, "saves": runs, "read_sections_cpu_s": read,
    }
    text = json.dumps(result, indent=1)
    print(text)
    if args.json:
        args.json.write_text(text)


if __name__ == "__main__":
    main()
