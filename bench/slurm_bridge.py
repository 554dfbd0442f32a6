"""Cost of one Slurm bridge poll on a large cluster, without the controller.

Scales the real Slurm 22.05 capture in tests/fixtures/slurm/ to N jobs (distinct ids,
same shapes) and times what the bridge does per poll: parse ``squeue --json`` (or
scontrol's text), diff against the previous poll, and the size of the state file it
rewrites. The squeue/scontrol calls themselves are the controller's cost, not measured.

    python bench/slurm_bridge.py --jobs 10000
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from pathlib import Path

from gpuledger.bridges.mapping import Mapping
from gpuledger.bridges.slurm_events import SlurmTracker
from gpuledger.bridges.slurm_parse import parse_scontrol_jobs, parse_squeue_json

FIX = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "slurm"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    n = parser.parse_args().jobs
    doc = json.loads((FIX / "squeue.json").read_text())
    base = doc["jobs"]
    jobs = []
    for i in range(n):
        job = copy.deepcopy(base[i % len(base)])
        job["job_id"] = 1000 + i
        jobs.append(job)
    doc["jobs"] = jobs
    text = json.dumps(doc, indent=2)
    lines = (FIX / "scontrol_jobs.txt").read_text().splitlines()
    scontrol = "\n".join(
        line.replace(line.split()[0], f"JobId={1000 + i}", 1)
        for i in range(n) for line in [lines[i % len(lines)]])

    t0 = time.perf_counter()
    snapshot = parse_squeue_json(text)
    t1 = time.perf_counter()
    tracker = SlurmTracker(Mapping())
    first, _ = tracker.step(snapshot, None, time.time())
    t2 = time.perf_counter()
    steady, _ = tracker.step(snapshot, None, time.time())
    t3 = time.perf_counter()
    parse_scontrol_jobs(scontrol)
    t4 = time.perf_counter()
    state = len(json.dumps(tracker.to_json()))
    print(f"{n:,} jobs: squeue --json {len(text) / 1e6:.1f} MB parsed in {t1 - t0:.2f} s; "
          f"scontrol text {len(scontrol) / 1e6:.1f} MB parsed in {t4 - t3:.2f} s; "
          f"first diff {t2 - t1:.2f} s ({len(first):,} records), steady diff "
          f"{t3 - t2:.2f} s ({len(steady)} records); state file {state / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
