"""The memory and CPU of compaction's moment, each in a fresh process.

First the processor runs the default cluster for 25.5 simulated hours with compaction
off, into a warehouse folder (the first day's hourly files, as the processor wrote
them). Then, in a child process each, on a copy of that folder:

- ``compact``: the first day compacted (every table), as the processor does once a day;
- ``hour``: then an hour of ``gpu_minute`` written again into the compacted day
  (``merge``: late rows, a replay);

each reporting its peak RSS over its start (sampled every 2 ms) and its CPU seconds,
with the rows of the day's ``gpu_minute`` object and its bytes' digest, so that two
checkouts can be compared (same bytes, less memory). ``--bucket-rows`` sets
``warehouse.compact_bucket_rows``. Usage:

    python bench/compaction_moment.py [--bucket-rows 16384] [--runs 2] [--json PATH]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

DAY = datetime(2026, 1, 5, tzinfo=UTC)
KEYS = ["minute", "node", "gpu_index", "job_id"]


def build(root: Path) -> None:
    """25.5 simulated hours of the default cluster, compaction off."""
    from gpuledger.pipeline.config import ProcessorConfig, WarehouseOptions
    from gpuledger.pipeline.processor import Processor
    from gpuledger.pipeline.simulate import SimConfig, simulate
    from gpuledger.pipeline.warehouse import Warehouse

    proc = Processor(ProcessorConfig(), Warehouse(root, options=WarehouseOptions(compact=False)))
    for batch in simulate(SimConfig(hours=25.5)):
        proc.process(batch)
    proc.flush()


def _rss_mib() -> float:
    with open("/proc/self/status") as fh:
        line = next(x for x in fh if x.startswith("VmRSS"))
    return int(line.split()[1]) / 1024


def moment(root: Path, bucket_rows: int) -> dict[str, Any]:
    """In this (fresh) process: the day's compaction, then an hour written into it."""
    from gpuledger.pipeline.config import WarehouseOptions
    from gpuledger.pipeline.warehouse import Warehouse

    wh = Warehouse(root, options=WarehouseOptions(compact_bucket_rows=bucket_rows))
    hour = wh.read(wh.part_path("gpu_minute", DAY + timedelta(hours=7)))
    assert hour is not None
    peak = [0.0]

    def sample() -> None:
        while True:
            peak[0] = max(peak[0], _rss_mib())
            time.sleep(0.002)

    threading.Thread(target=sample, daemon=True).start()
    out: dict[str, Any] = {}
    for name, step in (
            ("compact", lambda: wh.compact_unit("warehouse", DAY + timedelta(days=1))),
            ("hour", lambda: wh.write_part("gpu_minute", DAY + timedelta(hours=7), hour,
                                           KEYS, merge=True))):
        time.sleep(0.5)
        base = peak[0] = _rss_mib()
        cpu = time.process_time()
        step()
        wh.publisher.commit(wait=True)
        out[f"{name}_cpu_s"] = round(time.process_time() - cpu, 2)
        out[f"{name}_peak_over_start_mib"] = round(peak[0] - base, 1)
    day = wh.read_bytes(wh.part_path("gpu_minute", DAY, False))
    assert day is not None
    out["day_bytes"] = len(day)
    out["day_md5"] = hashlib.md5(day).hexdigest()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bucket-rows", type=int, default=16_384)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--json", default=None, help="write results to this file")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(moment(Path(args.child), args.bucket_rows)))
        return
    rows = []
    with tempfile.TemporaryDirectory(prefix="gpuledger-moment-") as tmp:
        source = Path(tmp) / "built"
        build(source)
        for run in range(args.runs):
            rows.append(on_a_copy(source, Path(tmp) / f"run{run}", [
                __file__, "--child", "{copy}", "--bucket-rows", str(args.bucket_rows)]))
            print(json.dumps(rows[-1]), flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=2)


def on_a_copy(source: Path, copy: Path, argv: list[str]) -> dict[str, Any]:
    """Run ``python argv`` (``{copy}`` replaced by the copy's path) on a copy of the
    warehouse folder ``source``; the JSON object its last line printed. The copy is
    removed after."""
    shutil.copytree(source, copy)
    try:
        child = subprocess.run([sys.executable, *(a.replace("{copy}", str(copy)) for a in argv)],
                               capture_output=True, text=True, check=True)
        return dict(json.loads(child.stdout.strip().splitlines()[-1]))
    finally:
        shutil.rmtree(copy)


if __name__ == "__main__":
    main()
