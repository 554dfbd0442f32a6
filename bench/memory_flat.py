"""Peak resident memory of the processor as the processed span grows.

The simulator runs in one process and streams its batches (Arrow IPC, length-prefixed)
through a pipe into a second process that runs only the processor and writes the
warehouse, so the peak RSS reported is the processor's alone (the simulator plans the
whole span up front and would otherwise blur the figure). State is bounded by open
windows and running jobs, so 7 days should peak within 10 % of 1 day. Usage:

    python bench/memory_flat.py [--days 1 7]
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
import io, resource, struct, sys, tempfile, time
from pathlib import Path
import polars as pl
from gpuledger.pipeline.config import ProcessorConfig
from gpuledger.pipeline.processor import Processor
from gpuledger.pipeline.warehouse import Warehouse
inp = sys.stdin.buffer
samples = 0
with tempfile.TemporaryDirectory() as tmp:
    proc = Processor(ProcessorConfig(), Warehouse(Path(tmp)))
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
print(f"{peak_kib} {samples} {wall:.1f}")
"""


def run(hours: float) -> tuple[int, int, float]:
    """Peak RSS (KiB), samples processed and wall seconds of the processor process."""
    producer = subprocess.Popen([sys.executable, "-c", PRODUCER, str(hours)],
                                stdout=subprocess.PIPE, cwd=tempfile.gettempdir())
    consumer = subprocess.run([sys.executable, "-c", CONSUMER], stdin=producer.stdout,
                              capture_output=True, text=True, check=True,
                              cwd=tempfile.gettempdir())
    producer.wait()
    peak, samples, wall = consumer.stdout.split()
    return int(peak), int(samples), float(wall)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--days", type=float, nargs="+", default=[1, 7])
    parser.add_argument("--json", default=None, help="write results to this file")
    args = parser.parse_args()
    rows = []
    for days in args.days:
        peak_kib, samples, wall = run(days * 24)
        rows.append({"days": days, "processor_peak_rss_mib": round(peak_kib / 1024, 1),
                     "gpu_samples": samples, "wall_s": wall})
        print(json.dumps(rows[-1]), flush=True)
    if len(rows) > 1:
        growth = rows[-1]["processor_peak_rss_mib"] / rows[0]["processor_peak_rss_mib"] - 1
        print(json.dumps({"growth_first_to_last": round(growth, 4)}))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
