"""Processor throughput on the embedded bus, beside the decode ceiling, in one run.

Simulates HOURS of the default cluster, publishes it to the embedded bus in
micro-batches of BATCH_MINUTES, then measures (CPU seconds, all threads):

- ceiling: the fastest plain decode of the same bus messages (Arrow IPC → Polars);
- processor: decode + validate + facts + Parquet writes, through ``Processor``.

GPU-samples per CPU-second is the per-core rate. The catalog built at the end takes this
release's template of the views from the user's cache folder when it is there
(``catalog_template.py``; the first run on a machine builds it, about 0.08 CPU-s more):
``catalog_template`` in the output says which. ``GPULEDGER_CACHE_DIR=`` (empty) runs
without a cache folder, as the first run on a machine. Usage:

    python bench/processor_throughput.py [--hours 6] [--batch-minutes 60] [--interval 10]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import polars as pl

from gpuledger.pipeline import catalog_template
from gpuledger.pipeline.bus import EmbeddedBus, decode_message, marking_last
from gpuledger.pipeline.config import ProcessorConfig
from gpuledger.pipeline.processor import Processor
from gpuledger.pipeline.simulate import SimConfig, simulate
from gpuledger.pipeline.warehouse import Warehouse, template_key


def _fill(hours: float, batch_minutes: int, interval_s: int = 10) -> tuple[EmbeddedBus, int]:
    bus = EmbeddedBus()
    samples = 0
    pending: list[dict[str, pl.DataFrame]] = []
    per = max(batch_minutes // 10, 1)
    for batch in simulate(SimConfig(hours=hours, chunk_minutes=10,
                                    sample_interval_s=interval_s)):
        samples += batch["telemetry"].height
        pending.append(batch)
        if len(pending) == per:
            bus.publish_batch({k: pl.concat([b[k] for b in pending]) for k in pending[0]})
            pending = []
    if pending:
        bus.publish_batch({k: pl.concat([b[k] for b in pending]) for k in pending[0]})
    return bus, samples


def _copy(bus: EmbeddedBus) -> EmbeddedBus:
    twin = EmbeddedBus()
    twin._messages.extend(bus._messages)  # the same bytes, consumed independently
    twin._batch_marks.extend(bus._batch_marks)
    twin._count = bus._count
    return twin


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hours", type=float, default=6.0)
    parser.add_argument("--batch-minutes", type=int, default=60)
    parser.add_argument("--interval", type=int, default=10, help="sample interval, s")
    parser.add_argument("--json", type=Path, default=None, help="write results here")
    args = parser.parse_args()
    bus, samples = _fill(args.hours, args.batch_minutes, args.interval)

    ceiling_bus = _copy(bus)
    c0, w0 = time.process_time(), time.perf_counter()
    decoded = 0
    while ceiling_bus._messages:
        _kind, data = ceiling_bus._messages.popleft()
        decoded += decode_message(data).height
    ceiling_cpu, ceiling_wall = time.process_time() - c0, time.perf_counter() - w0

    cached = catalog_template.cached(template_key()) is not None
    with tempfile.TemporaryDirectory() as tmp:
        proc = Processor(ProcessorConfig(), Warehouse(Path(tmp)))
        c0, w0 = time.process_time(), time.perf_counter()
        # as the demo and ingest hand batches over: the last one's minutes are closed by
        # the flush, in one pass
        for batch, last in marking_last(bus.batches()):
            proc.process(batch, close=not last)
        proc.flush()
        cpu, wall = time.process_time() - c0, time.perf_counter() - w0

    result = {
        "hours": args.hours, "batch_minutes": args.batch_minutes,
        "sample_interval_s": args.interval, "gpu_samples": samples,
        "ceiling_samples_per_cpu_s": samples / ceiling_cpu,
        "ceiling_wall_s": ceiling_wall,
        "processor_samples_per_cpu_s": samples / cpu,
        "processor_samples_per_wall_s": samples / wall,
        "processor_cpu_s": cpu, "processor_wall_s": wall,
        "ratio_to_ceiling": (samples / cpu) / (samples / ceiling_cpu),
        "catalog_template": "cached" if cached else "built by this run",
    }
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
