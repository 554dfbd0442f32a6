"""``gpuledger diagnose`` on an ``s3://`` warehouse beside the same warehouse in a folder.

The S3 server is S3Proxy on loopback (``tests/s3_server.py``), or the endpoint of
``GPULEDGER_TEST_S3_ENDPOINT``. The demo (``--hours`` of the built-in 576-GPU cluster,
seed 7) is written once into a folder and once into a bucket; then ``diagnose --json
--dry-run`` runs on each, alternately, ``--rounds`` times, each run a child process
(``cli_child.py``: wall, CPU with children, peak RSS), first over the hourly files, then
after ``compact --force`` over one object a day (read an hour at a time). The S3 server's
own CPU is not counted. Every run must print the same rows. Usage:

    python bench/diagnose_store.py [--hours 12] [--rounds 3] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from cli_child import ChildRun, run_cli

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from s3_server import s3_from_env, start_s3


def _checked(run: ChildRun, what: str) -> ChildRun:
    if run.exit != 0:
        raise SystemExit(f"{what} failed ({run.exit}): {run.stderr[-2000:]}")
    return run


def _rows(run: ChildRun) -> list[str]:
    return sorted(run.stdout.splitlines())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hours", type=float, default=12.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", type=Path, default=None, help="write results here")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="gpuledger-diagnose-bench-"))
    server = s3_from_env() or start_s3(work / "s3")
    os.environ.update(server.env())
    result: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M"), "hours": args.hours,
                              "loadavg_at_start": os.getloadavg(), "layouts": {}}
    try:
        where = {"folder": str(work / "wh"), "s3": server.bucket() + "/wh"}
        for name, location in where.items():
            _checked(run_cli(["demo", "--hours", str(args.hours), "--quiet",
                              "--warehouse", location]), f"demo into the {name}")
        for layout in ("hourly files", "compacted days"):
            if layout == "compacted days":
                for name, location in where.items():
                    _checked(run_cli(["compact", "--warehouse", location, "--before",
                                      "2100-01-01T00:00Z", "--force"]), f"compact {name}")
            runs: dict[str, list[ChildRun]] = {name: [] for name in where}
            for _ in range(args.rounds):
                for name, location in where.items():
                    runs[name].append(_checked(run_cli(
                        ["diagnose", "--warehouse", location, "--json", "--dry-run",
                         "--quiet"]), f"diagnose {name}"))
            first = _rows(runs["folder"][0])
            same = all(_rows(r) == first for rs in runs.values() for r in rs) and bool(first)
            result["layouts"][layout] = {
                name: {"wall_s": [round(r.wall_s, 2) for r in rs],
                       "cpu_s": [round(r.cpu_s, 2) for r in rs],
                       "peak_rss_mib": round(max(r.peak_rss_mib for r in rs)),
                       "median_wall_s": round(statistics.median(r.wall_s for r in rs), 2),
                       "median_cpu_s": round(statistics.median(r.cpu_s for r in rs), 2)}
                for name, rs in runs.items()}
            result["layouts"][layout]["same_rows"] = same
            result["layouts"][layout]["rows"] = len(first)
            print(layout, json.dumps(result["layouts"][layout]), file=sys.stderr, flush=True)
    finally:
        server.stop()
    result["loadavg_at_end"] = os.getloadavg()
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
