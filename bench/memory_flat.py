"""Peak resident memory of the processor as the processed span grows.

The simulator runs in one process and streams its batches (Arrow IPC, length-prefixed)
through a pipe into a second process that runs only the processor and writes the
warehouse, so the peak RSS reported is the processor's alone (the simulator plans the
whole span up front and would otherwise blur the figure). State is bounded by open
windows and running jobs, so 7 days should peak within 10 % of 1 day. Compaction's sorts
run in a child process of the processor (``warehouse.compact_worker``); the largest
child's peak (its ``VmHWM``) is reported beside the processor's, and the peak of the two
together while a child runs (RSS and PSS, sampled every 10 ms). Usage:

    python bench/memory_flat.py [--days 1 7] [--compact-worker on|off]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile

PRODUCER = """
import io, struct, sys
from gpuledger.pipeline.simulate import SimConfig, simulate
out = sys.stdout.buffer
for batch in simulate(SimConfig(hours=float(sys.argv[1]))):
    for kind in ("telemetry", "inventory", "job"):
        buf = io.BytesIO()
        batch[kind].write_ipc(buf)
        data = buf.getvalue()
        name = kind.encode()
        out.write(struct.pack("<BI", len(name), len(data)) + name + data)
    out.write(struct.pack("<BI", 0, 0))
out.flush()
"""

CONSUMER = """
import io, resource, struct, sys, tempfile, threading, time
from pathlib import Path
import polars as pl
from gpuledger.pipeline.config import ProcessorConfig, WarehouseOptions
from gpuledger.pipeline.processor import Processor
from gpuledger.pipeline.warehouse import Warehouse
inp = sys.stdin.buffer
options = WarehouseOptions(compact_worker=sys.argv[1] == "on")
samples = 0
together = [0, 0]  # peak RSS and PSS of the processor and compaction's child together, KiB

def kib(path, field):
    try:
        with open(path) as fh:
            return next(int(x.split()[1]) for x in fh if x.startswith(field))
    except (OSError, StopIteration):
        return 0

def watch(wh):
    while True:
        child = wh.compaction_child
        if child is None:
            time.sleep(0.05)
            continue
        rss = kib("/proc/self/status", "VmRSS:") + kib(f"/proc/{child}/status", "VmRSS:")
        pss = kib("/proc/self/smaps_rollup", "Pss:") + kib(f"/proc/{child}/smaps_rollup", "Pss:")
        together[0], together[1] = max(together[0], rss), max(together[1], pss)
        time.sleep(0.01)

with tempfile.TemporaryDirectory() as tmp:
    proc = Processor(ProcessorConfig(), Warehouse(Path(tmp), options=options))
    threading.Thread(target=watch, args=(proc.warehouse,), daemon=True).start()
    batch = {}
    t = time.perf_counter()
    while True:
        head = inp.read(5)
        if len(head) < 5:
            break
        n, size = struct.unpack("<BI", head)
        if n == 0:
            proc.process(batch)
            samples += batch.get("telemetry", pl.DataFrame()).height
            batch = {}
            continue
        kind = inp.read(n).decode()
        batch[kind] = pl.read_ipc(io.BytesIO(inp.read(size)))
    proc.flush()
    wall = time.perf_counter() - t
peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
worker_kib = proc.warehouse.compaction_peak_rss_kib
print(f"{peak_kib} {worker_kib} {together[0]} {together[1]} {samples} {wall:.1f}")
"""


def run(hours: float, worker: str = "on") -> tuple[int, int, int, int, int, float]:
    """Peak RSS (KiB) of the processor process and of its largest child (compaction's
    sorts, ``sort_worker.py``; 0 if none ran); the peak of the two together while a child
    runs, as RSS (code both map counted twice) and as PSS (shared pages split between
    them), sampled every 10 ms; samples processed and wall seconds."""
    producer = subprocess.Popen([sys.executable, "-c", PRODUCER, str(hours)],
                                stdout=subprocess.PIPE, cwd=tempfile.gettempdir())
    consumer = subprocess.run([sys.executable, "-c", CONSUMER, worker], stdin=producer.stdout,
                              capture_output=True, text=True, check=True,
                              cwd=tempfile.gettempdir())
    producer.wait()
    peak, child, rss, pss, samples, wall = consumer.stdout.split()
    return int(peak), int(child), int(rss), int(pss), int(samples), float(wall)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--days", type=float, nargs="+", default=[1, 7])
    parser.add_argument("--compact-worker", choices=["on", "off"], default="on",
                        help="warehouse.compact_worker: compaction's sorts in a child "
                        "process (on, the default) or in the processor (off)")
    parser.add_argument("--json", default=None, help="write results to this file")
    args = parser.parse_args()
    rows = []
    for days in args.days:
        peak_kib, worker_kib, rss_kib, pss_kib, samples, wall = run(days * 24,
                                                                    args.compact_worker)
        rows.append({"days": days, "processor_peak_rss_mib": round(peak_kib / 1024, 1),
                     "compaction_worker_peak_rss_mib": round(worker_kib / 1024, 1),
                     "together_peak_rss_mib": round(rss_kib / 1024, 1),
                     "together_peak_pss_mib": round(pss_kib / 1024, 1),
                     "gpu_samples": samples, "wall_s": wall})
        print(json.dumps(rows[-1]), flush=True)
    if len(rows) > 1:
        growth = rows[-1]["processor_peak_rss_mib"] / rows[0]["processor_peak_rss_mib"] - 1
        # a child runs from the first compaction on (not in 1 day): its first peak
        firsts = [r["compaction_worker_peak_rss_mib"] for r in rows
                  if r["compaction_worker_peak_rss_mib"]]
        worker = rows[-1]["compaction_worker_peak_rss_mib"] / firsts[0] - 1 \
            if len(firsts) > 1 else None
        print(json.dumps({"growth_first_to_last": round(growth, 4),
                          "worker_growth_first_to_last":
                              None if worker is None else round(worker, 4)}))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
