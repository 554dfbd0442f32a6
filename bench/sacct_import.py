"""Slurm accounting history at scale: one ``sacct`` export against daily exports.

Writes the ``sacct --parsable2`` history of a synthetic cluster (``--gpus`` GPUs on
8-GPU nodes, ``--days`` days, jobs of 1–8 GPUs on one node or 16 on two, lognormal
durations, about ``--load`` of the GPUs held, requeues), once whole and once cut into
daily exports the way ``sacct --starttime/--endtime`` prints them (a job running or
pending at a day's end in that day's export as RUNNING/PENDING, End ``Unknown``, and in
the next as it ended). Then imports them with ``gpuledger import slurm-sacct`` (the
nodes from an ``scontrol`` file, ``--nodes``) in a child process (wall, CPU with its
children, peak RSS from ``os.wait4``): the one export (``whole``), the daily ones
together (``daily``), and the daily ones one by one into one warehouse, each going on
from the history the one before left and closed to its day's end (``each``: the daily
cron, ``--until`` midnight; each import's figures), and checks that every warehouse
holds the same facts (row counts and sums of the views in ``CHECKS``). With ``--tree
LABEL=PATH`` each import runs with that checkout's code, the trees one after the other
for each export, side by side.
Usage:

    python bench/sacct_import.py [--gpus 1024] [--days 7]
        [--exports both|whole|daily|each|all] [--tree old=/tmp/old --tree new=.]
        [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import shutil
import sys
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
from cli_child import run_cli

HEADER = ("JobID|JobIDRaw|JobName|Account|User|Partition|QOS|Priority|Submit|Start|End|"
          "State|ExitCode|AllocTRES|ReqTRES|NodeList")
T0 = datetime(2026, 1, 1, tzinfo=UTC)
CHECKS = {
    "gpu_hourly": "sum(allocated_gpu_hours)",
    "gpu_daily": "sum(allocated_gpu_hours)",
    "attempts": "sum(allocated_gpu_hours)",
    "attempts WHERE status = 'ended'": "sum(queue_wait_s)",
    "job_gpu": "sum(allocated_gpu_hours)",
    "frag_minute": "sum(free_gpus)",
    "pending_minute": "count(*)",
}
"""Views compared (rows, and a sum) between the two imports."""


def _t(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S")


def history(gpus: int, days: int, load: float, seed: int) -> list[dict[str, object]]:
    """Attempts of a cluster of 8-GPU nodes, in submit order: each job goes to the node(s)
    whose GPUs free up first (first come, first served), so about ``load`` of the GPUs
    are held once the cluster has filled."""
    rng = random.Random(seed)
    nodes = max(gpus // 8, 2)
    free = np.zeros((nodes, 8))        # per node, when each GPU frees up (s), ascending
    end_s = days * 86400.0
    sizes = [1, 1, 1, 2, 2, 4, 8, 16]
    mean_run_s = math.exp(8.6 + 1.2 ** 2 / 2)          # the lognormal's mean, about 3 h
    gap_s = mean_run_s * (sum(sizes) / len(sizes)) / (nodes * 8 * load)
    out: list[dict[str, object]] = []
    t, job = 0.0, 1000
    while True:
        t += rng.expovariate(1 / gap_s)
        if t >= end_s:
            return out
        job += 1
        size = rng.choice(sizes)
        per = min(size, 8)
        ready = free[:, per - 1]        # when `per` GPUs of each node are free
        hosts = sorted(np.argsort(ready, kind="stable")[:2 if size == 16 else 1].tolist())
        start = max(t, *(float(ready[h]) for h in hosts))
        run = min(rng.lognormvariate(8.6, 1.2), 4 * 86400.0)
        requeue = rng.random() < 0.03
        attempts = [(t, start, start + (run / 3 if requeue else run),
                     "REQUEUED" if requeue else
                     rng.choice(["COMPLETED"] * 8 + ["FAILED", "CANCELLED"]))]
        if requeue:
            again = attempts[0][2] + 30
            attempts.append((again, again + 60, again + 60 + run, "COMPLETED"))
        stop = attempts[-1][2]
        for h in hosts:
            free[h, :per] = stop
            free[h].sort()
        names = ",".join(f"gpu-{h:04d}" for h in hosts)
        for sub, st, en, state in attempts:
            out.append({"job": str(job), "submit": T0 + timedelta(seconds=round(sub)),
                        "start": T0 + timedelta(seconds=round(st)),
                        "end": T0 + timedelta(seconds=round(en)), "state": state,
                        "gpus": size, "nodes": names, "account": f"team{job % 7}",
                        "user": f"u{job % 31}"})


def line(a: dict[str, object], cut: datetime | None) -> str:
    """The attempt's line as an export ending at ``cut`` prints it (None: as it ended)."""
    submit, start, end = a["submit"], a["start"], a["end"]
    assert isinstance(submit, datetime) and isinstance(start, datetime)
    assert isinstance(end, datetime)
    state, s_text, e_text = str(a["state"]), _t(start), _t(end)
    tres, nodes = f"cpu=8,gres/gpu={a['gpus']},node=1", str(a["nodes"])
    if cut is not None and end > cut:
        e_text = "Unknown"
        if start < cut:
            state = "RUNNING"
        else:
            state, s_text, tres, nodes = "PENDING", "Unknown", "", "None assigned"
    return (f"{a['job']}|{a['job']}|j|{a['account']}|{a['user']}|gpu|normal|50|"
            f"{_t(submit)}|{s_text}|{e_text}|{state}|0:0|{tres}|gres/gpu={a['gpus']}|{nodes}")


def write_exports(attempts: list[dict[str, object]], days: int, folder: Path
                  ) -> tuple[Path, list[Path]]:
    """One export of the whole history and one per day, all as of the history's end."""
    whole = folder / "whole.txt"
    last = T0 + timedelta(days=days)
    with whole.open("w") as f:
        f.write(HEADER + "\n")
        f.writelines(line(a, last if a["end"] > last else None) + "\n"  # type: ignore[operator]
                     for a in attempts if a["submit"] < last)  # type: ignore[operator]
    daily: list[Path] = []
    for d in range(days):
        lo, hi = T0 + timedelta(days=d), T0 + timedelta(days=d + 1)
        path = folder / f"sacct-{lo:%Y-%m-%d}.txt"
        with path.open("w") as f:
            f.write(HEADER + "\n")
            # sacct prints a record whose [submit, end) meets the window
            f.writelines(line(a, hi if a["end"] > hi else None) + "\n"  # type: ignore[operator]
                         for a in attempts
                         if a["submit"] < hi and a["end"] > lo)  # type: ignore[operator]
        daily.append(path)
    return whole, daily


def write_nodes(gpus: int, folder: Path) -> Path:
    """The cluster's nodes as ``scontrol -o show node -d`` prints them."""
    path = folder / "nodes.txt"
    path.write_text("".join(f"NodeName=gpu-{h:04d} Gres=gpu:8 State=IDLE Partitions=gpu\n"
                            for h in range(max(gpus // 8, 2))))
    return path


def run_import(files: list[Path], wh: Path, nodes: Path, tree: Path | None = None,
               until: datetime | None = None) -> dict[str, Any]:
    """``gpuledger import slurm-sacct FILES`` in a child (the code of ``tree`` when given;
    ``--until`` when given): wall, CPU (with its children), peak RSS, and its summary
    line."""
    run = run_cli(["import", "slurm-sacct", *map(str, files), "--warehouse", str(wh),
                   "--nodes", str(nodes), "--quiet",
                   *(["--until", until.isoformat()] if until else [])], tree)
    if run.exit:
        sys.exit(f"sacct_import: the import failed: {run.stderr[-2000:]}")
    return {"wall_s": round(run.wall_s, 2), "cpu_s": round(run.cpu_s, 2),
            "peak_rss_mib": round(run.peak_rss_mib), "summary": run.stdout.strip()[:400]}


def facts(wh: Path) -> dict[str, object]:
    from gpuledger.pipeline import query

    got: dict[str, object] = {}
    for view, measure in CHECKS.items():
        _cols, rows = query.run(wh, f"SELECT count(*), round({measure}, 3) FROM {view}")
        got[view] = list(rows[0])
    return got


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus", type=int, default=1024)
    parser.add_argument("--days", type=int, default=7)
    parser.add_argument("--load", type=float, default=0.7)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--exports", choices=["both", "whole", "daily", "each", "all"],
                        default="both",
                        help="import the one export, the daily ones together, the daily ones "
                        "one by one, both of the first two, or all three (and compare)")
    parser.add_argument("--tree", action="append", default=[], metavar="LABEL=PATH",
                        help="run each import with this checkout's code (repeatable: the "
                        "trees alternate, side by side); default: this one")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    trees: list[tuple[str, Path | None]] = [
        (t.split("=", 1)[0], Path(t.split("=", 1)[1]).resolve()) for t in args.tree
    ] or [("this", None)]
    folder = Path(tempfile.mkdtemp(prefix="sacct-bench-"))
    try:
        attempts = history(args.gpus, args.days, args.load, args.seed)
        whole, daily = write_exports(attempts, args.days, folder)
        lines = sum(1 for _ in whole.open()) - 1
        daily_lines = sum(sum(1 for _ in p.open()) - 1 for p in daily)
        result: dict[str, object] = {
            "gpus": args.gpus, "days": args.days, "attempt_lines": lines,
            "daily_export_lines": daily_lines,
            "gpu_minutes": args.gpus * args.days * 1440}
        nodes = write_nodes(args.gpus, folder)
        seen: list[object] = []
        for name, files in (("whole", [whole]), ("daily", daily), ("each", daily)):
            if args.exports not in (name, "all") and not (
                    args.exports == "both" and name != "each"):
                continue
            for label, tree in trees:
                key = name if tree is None else f"{name} ({label})"
                if name == "each":   # one import a day, each going on from the last
                    # as a cron would: each day's facts closed to its midnight
                    runs = [run_import([f], folder / key, nodes, tree,
                                       T0 + timedelta(days=d + 1))
                            for d, f in enumerate(files)]
                    run = {"imports": len(runs),
                           "wall_s": round(sum(r["wall_s"] for r in runs), 2),
                           "cpu_s": round(sum(r["cpu_s"] for r in runs), 2),
                           "peak_rss_mib": max(r["peak_rss_mib"] for r in runs),
                           "first": runs[0], "last": runs[-1],
                           "cpu_s_each": [r["cpu_s"] for r in runs],
                           "peak_rss_mib_each": [r["peak_rss_mib"] for r in runs]}
                else:
                    run = run_import(files, folder / key, nodes, tree)
                run["facts"] = facts(folder / key)
                seen.append(run["facts"])
                result[key] = run
                shutil.rmtree(folder / key, ignore_errors=True)
        result["same_facts"] = all(f == seen[0] for f in seen)
        print(json.dumps(result, indent=2))
        if args.json:
            args.json.write_text(json.dumps(result, indent=2))
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
