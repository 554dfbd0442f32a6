"""What the hardening of issue 12 costs: decoding and validating recorded telemetry (with
the physical limits, the line-length and nesting checks), validation alone, and opening
the warehouse through the locked-down reader.

Run it on this branch, and on another with ``PYTHONPATH=<its agents>:<its pipeline>`` to
compare (the script only uses functions both have)::

    python bench/hardening.py --lines 1000000
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import duckdb
import polars as pl

from gpuledger.pipeline.config import ProcessorConfig
from gpuledger.pipeline.decode import Decoded, decode_jsonl_files
from gpuledger.pipeline.demo import run_demo
from gpuledger.pipeline.query import connect
from gpuledger.pipeline.simulate import SimConfig, simulate, write_jsonl
from gpuledger.pipeline.validate import check


def best(runs: int, work: object) -> tuple[float, float]:
    """Median and best wall time of ``runs`` calls of ``work``."""
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        work()  # type: ignore[operator]
        times.append(time.perf_counter() - started)
    return statistics.median(times), min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lines", type=int, default=1_000_000, help="telemetry lines to decode")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "gl-hardening")
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    sim = SimConfig(hours=1.0, seed=7, sample_interval_s=10)
    sample = args.work / "sample"
    if not (sample / "telemetry.jsonl").exists():
        write_jsonl(simulate(sim), sample)
    lines = (sample / "telemetry.jsonl").read_bytes().splitlines(keepends=True)
    big = args.work / f"telemetry-{args.lines}.jsonl"
    if not big.exists():
        with big.open("wb") as f:
            for i in range(args.lines):
                f.write(lines[i % len(lines)])
    now = datetime(2026, 1, 6, tzinfo=UTC)

    decoded: list[Decoded] = []

    def decode() -> None:
        decoded[:] = list(decode_jsonl_files([big], now=now))

    med, top = best(args.runs, decode)
    rows = sum(d.rows for d in decoded)
    print(f"decode+validate {args.lines:,} telemetry lines: median {med:.2f} s "
          f"({args.lines / med:,.0f} lines/s), best {top:.2f} s; {rows:,} valid",
          file=sys.stderr)
    frame = pl.concat([d.frames["telemetry"] for d in decoded])
    med, top = best(args.runs * 3, lambda: check(frame, "telemetry", now=now))
    print(f"validate alone: median {med * 1000:.0f} ms ({frame.height / med:,.0f} rows/s), "
          f"best {top * 1000:.0f} ms", file=sys.stderr)

    wh = args.work / "wh"
    if not (wh / "catalog.duckdb").exists():
        run_demo(SimConfig(hours=1.0, seed=7, sample_interval_s=30), ProcessorConfig(), wh)
    sql = "SELECT count(*) FROM gpu_minute"

    def guarded() -> None:
        con = connect(wh)
        con.execute(sql).fetchall()
        con.close()

    def plain() -> None:  # the baseline: what the locked-down reader adds to it
        con = duckdb.connect(str(wh / "catalog.duckdb"), read_only=True)
        con.execute(sql).fetchall()
        con.close()

    for label, work in (("read-only connect + query", guarded), ("plain duckdb", plain)):
        med, top = best(args.runs * 10, work)
        print(f"{label}: median {med * 1000:.1f} ms, best {top * 1000:.1f} ms",
              file=sys.stderr)


if __name__ == "__main__":
    main()
