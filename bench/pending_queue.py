"""A scheduler history with a long queue: the processor's CPU and memory per day.

The packaged default cluster is oversubscribed: its queue grows from about 70 pending
jobs on the first day to over 3,000 after four weeks (the simulator's schedule). This
benchmark plans DAYS of it once (jobs, scheduler events and inventory; no telemetry, as
in an import of ``sacct`` or pod history), caches the plan's frames under ``--cache``,
then runs the processor over them a day per batch in a child process, and reports for
each simulated day:

- the processor's CPU seconds for the day (all threads);
- its peak RSS while processing that day (``VmHWM``, reset each day);
- the jobs pending at the day's end.

Without telemetry a close step covers up to a day, so the pending facts
(``pending_minute``, ``blocked_minute``, ``frag_minute``'s demand) meet every pending
job in every minute of the day. Prints one JSON object per day, then a summary; ``--json
PATH`` writes them. Usage:

    python bench/pending_queue.py [--days 30] [--cache DIR] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

PLAN = """
import sys
from pathlib import Path
from gpuledger.pipeline.simulate.records import inventory_frame, job_frame
from gpuledger.pipeline.simulate.run import SimConfig, plan
p = plan(SimConfig(hours=float(sys.argv[1])))
out = Path(sys.argv[2])
job_frame(p.schedule.events, p.jobs, p.layout, p.origin_ms).write_ipc(out / "job.arrow")
inventory_frame(p.schedule.inventory, p.layout, p.origin_ms).write_ipc(out / "inventory.arrow")
"""

RUN = """
import json, sys, tempfile, time
from datetime import timedelta
from pathlib import Path
import polars as pl
from gpuledger.pipeline.config import ProcessorConfig
from gpuledger.pipeline.processor import Processor
from gpuledger.pipeline.warehouse import Warehouse

def hwm_mib():
    with open("/proc/self/status") as fh:
        return next(int(x.split()[1]) for x in fh if x.startswith("VmHWM:")) / 1024

src = Path(sys.argv[1])
job = pl.read_ipc(src / "job.arrow")
inv = pl.read_ipc(src / "inventory.arrow")
start = min(job["time"].min(), inv["time"].min())
with tempfile.TemporaryDirectory() as tmp:
    cfg = ProcessorConfig()
    proc = Processor(cfg, Warehouse(Path(tmp), options=cfg.warehouse))
    lo = start
    end = max(job["time"].max(), inv["time"].max())
    n = 0
    while lo <= end:
        hi = lo + timedelta(days=1)
        batch = {"job": job.filter((pl.col("time") >= lo) & (pl.col("time") < hi)),
                 "inventory": inv.filter((pl.col("time") >= lo) & (pl.col("time") < hi))}
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        c0 = time.process_time()
        proc.process(batch)
        cpu = time.process_time() - c0
        n += 1
        pending = sum(j.status == "pending" for j in proc.jobs.jobs.values())
        print(json.dumps({"day": n, "cpu_s": round(cpu, 2), "peak_rss_mib": round(hwm_mib(), 1),
                          "pending_jobs": pending}), flush=True)
        lo = hi
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--days", type=float, default=30.0)
    parser.add_argument("--cache", type=Path, default=None,
                        help="keep the planned frames here (reused when present)")
    parser.add_argument("--json", default=None, help="write the results to this file")
    args = parser.parse_args()
    cache = args.cache or Path(tempfile.mkdtemp(prefix="pending-queue-"))
    cache.mkdir(parents=True, exist_ok=True)
    if not (cache / "job.arrow").exists():
        print(f"planning {args.days:g} days of the default cluster into {cache} ...",
              file=sys.stderr, flush=True)
        subprocess.run([sys.executable, "-c", PLAN, str(args.days * 24), str(cache)],
                       check=True, cwd=tempfile.gettempdir())
    run = subprocess.run([sys.executable, "-c", RUN, str(cache)], stdout=subprocess.PIPE,
                         text=True, cwd=tempfile.gettempdir())
    rows = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    for row in rows:
        print(json.dumps(row))
    if run.returncode != 0 or not rows:
        sys.exit(f"the processor failed (exit {run.returncode}); its error is above")
    last = rows[-7:]
    summary = {"days": len(rows), "cpu_s_total": round(sum(r["cpu_s"] for r in rows), 1),
               "last_week_cpu_s_per_day": round(sum(r["cpu_s"] for r in last) / len(last), 2),
               "last_week_peak_rss_mib": max(r["peak_rss_mib"] for r in last),
               "pending_jobs_at_end": rows[-1]["pending_jobs"]}
    print(json.dumps(summary))
    if args.json:
        Path(args.json).write_text(json.dumps({"days": rows, "summary": summary}, indent=2))


if __name__ == "__main__":
    main()
