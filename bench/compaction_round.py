"""One day's round of compaction with its sorts in a child process and in place, side by
side, alternating, each in a fresh process.

Builds the first day's hourly files as ``compaction_moment.py`` does (25.5 simulated
hours of the default cluster, compaction off), then compacts a copy of them ``--runs``
times each way (``warehouse.compact_worker`` on, off, on, off, …), reporting the CPU
seconds of the round (the process's and its children's), its wall time, the child's peak
RSS and the digest of the day's ``gpu_minute`` object (the same bytes either way).
Usage:

    python bench/compaction_round.py [--runs 3] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

from compaction_moment import build, on_a_copy

ROUND = r"""
import hashlib, json, os, sys, time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from gpuledger.pipeline.config import WarehouseOptions
from gpuledger.pipeline.warehouse import Warehouse
DAY = datetime(2026, 1, 5, tzinfo=UTC)
wh = Warehouse(Path(sys.argv[1]), options=WarehouseOptions(compact_worker=sys.argv[2] == "on"))

def cpu():
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system

c, w = cpu(), time.perf_counter()
with wh.compaction_round():
    days = wh.compact_unit("warehouse", DAY + timedelta(days=1))
wh.publisher.commit(wait=True)
out = {"table_days": days, "cpu_s": round(cpu() - c, 2),
       "wall_s": round(time.perf_counter() - w, 2),
       "child_peak_rss_mib": round(wh.compaction_peak_rss_kib / 1024, 1)}
day = wh.read_bytes(wh.part_path("gpu_minute", DAY, False))
out["day_md5"] = hashlib.md5(day).hexdigest()
print(json.dumps(out))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", default=None, help="write results to this file")
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="gpuledger-round-") as tmp:
        source = Path(tmp) / "built"
        build(source)
        for run in range(args.runs):
            for worker in ("on", "off"):
                rows.append({"compact_worker": worker, **on_a_copy(
                    source, Path(tmp) / f"run{run}-{worker}", ["-c", ROUND, "{copy}", worker])})
                print(json.dumps(rows[-1]), flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=2)


if __name__ == "__main__":
    main()
