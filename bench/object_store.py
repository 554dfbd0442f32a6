"""Processor throughput on an ``s3://`` warehouse beside the same run on a local folder.

The S3 server is S3Proxy on loopback (``tests/s3_server.py``; ``scripts/s3proxy-jar.sh``
resolves its jar), or the endpoint of ``GPULEDGER_TEST_S3_ENDPOINT``. The simulation
(default: 12 hours of the built-in 576-GPU cluster at 30-second samples) is made once,
in memory; then the same batches go through ``Processor`` into a local folder and into
a bucket, alternately, ``--rounds`` times each. A run's time ends when its last
generation is published (uploads and manifests included). On a machine shared with
other work, the best run of each is the fairer figure (a neighbour's burst slows one
run, never speeds one up); both the best and the median are printed. Usage:

    python bench/object_store.py [--hours 12] [--interval 30] [--rounds 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from s3_server import s3_from_env, start_s3

from gpuledger.pipeline.config import ProcessorConfig
from gpuledger.pipeline.processor import Processor
from gpuledger.pipeline.simulate import SimConfig, simulate
from gpuledger.pipeline.warehouse import Warehouse


def run(batches: list[dict[str, pl.DataFrame]], location: str) -> tuple[float, Warehouse]:
    config = ProcessorConfig()
    t0 = time.perf_counter()
    warehouse = Warehouse(location, options=config.warehouse)
    proc = Processor(config, warehouse)
    for batch in batches:
        proc.process(batch, validated=True)
    proc.flush()  # publishes the last generation and the catalog
    warehouse.close()
    return time.perf_counter() - t0, warehouse


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hours", type=float, default=12.0)
    ap.add_argument("--interval", type=int, default=30, help="sample interval, s")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="gpuledger-s3-bench-"))
    server = s3_from_env() or start_s3(work / "s3")
    os.environ.update(server.env())
    try:
        batches = list(simulate(SimConfig(hours=args.hours, sample_interval_s=args.interval)))
        samples = sum(b["telemetry"].height for b in batches)
        print(f"{samples:,} GPU samples, {len(batches)} batches", file=sys.stderr)
        times: dict[str, list[float]] = {"local": [], "s3": []}
        objects: dict[str, int] = {}
        for r in range(args.rounds):
            for kind in ("local", "s3"):
                where = str(work / f"local-{r}") if kind == "local" else \
                    server.bucket() + "/wh"
                seconds, wh = run(batches, where)
                times[kind].append(seconds)
                objects[kind] = wh.publisher.objects_written
                print(f"round {r + 1} {kind}: {seconds:.1f} s "
                      f"({samples / seconds:,.0f} samples/s, {wh.publisher.objects_written} "
                      f"objects, {wh.publisher.bytes_written / 1e6:.1f} MB)", file=sys.stderr)
        print("| warehouse | runs (s) | best (s) | median (s) | GPU samples/s (best) "
              "| objects written |")
        print("|---|---|---:|---:|---:|---:|")
        for kind, key in (("local folder", "local"), ("s3:// (S3Proxy, loopback)", "s3")):
            runs = ", ".join(f"{t:.1f}" for t in times[key])
            best, med = min(times[key]), statistics.median(times[key])
            print(f"| {kind} | {runs} | {best:.1f} | {med:.1f} | {samples / best:,.0f} "
                  f"| {objects[key]} |")
        best = min(times["local"]) / min(times["s3"])
        median = statistics.median(times["local"]) / statistics.median(times["s3"])
        print(f"\ns3 / local throughput: {best:.2f} best run, {median:.2f} median "
              "(target ≥ 0.9)")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
