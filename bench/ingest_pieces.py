"""``gpuledger ingest`` of a simulated history, whole and in pieces cut inside a minute.

Simulates HOURS of the built-in cluster as JSON lines (once), cuts every file by event
time at CUTS (default: one cut 25 s into the middle hour's first minute, as a file
rotated by size is cut), then runs, as child processes (``os.wait4``: wall, CPU with
children, peak RSS):

- ``whole``: one ingest of the whole history into a fresh warehouse;
- ``pieces``: the pieces one after another into another warehouse, each piece's exit
  status (an ingest that refuses a piece exits 2) and CPU; then the saved states' sizes
  and the telemetry samples the GPU-minutes of each warehouse hold (equal when the
  pieces wrote the facts of the whole).

With ``--tree LABEL=PATH`` (repeatable) each round alternates between checkouts
(``PATH/pipeline`` and ``PATH/agents`` first on ``PYTHONPATH``). Usage:

    python bench/ingest_pieces.py [--hours 2] [--cut 2026-01-05T01:00:25] [--rounds 2]
        [--tree old=/tmp/old --tree new=.] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from cli_child import run_cli

HERE = Path(__file__).resolve().parents[1]


def _child(tree: Path, args: list[str]) -> dict[str, float]:
    run = run_cli(args, tree)
    return {"exit": run.exit, "wall_s": round(run.wall_s, 2), "cpu_s": round(run.cpu_s, 2),
            "peak_rss_mib": round(run.peak_rss_mib)}


def _split(events: Path, cuts: list[str], out: Path) -> list[Path]:
    bounds = ["", *cuts, "9999"]
    folders = [out / f"piece{k}" for k in range(len(bounds) - 1)]
    for folder in folders:
        folder.mkdir(parents=True)
    for path in sorted(events.glob("*.jsonl")):
        files = [(folder / path.name).open("w") for folder in folders]
        with path.open() as f:
            for line in f:
                at = line.index('"time":"') + 8
                t = line[at:at + 19]
                k = next(i for i in range(len(folders)) if bounds[i] <= t < bounds[i + 1])
                files[k].write(line)
        for handle in files:
            handle.close()
    return folders


def _samples(tree: Path, warehouse: Path) -> int:
    """The telemetry samples the warehouse's GPU-minutes hold (what a piece that went on
    from the wrong state loses)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tree / "pipeline"), str(tree / "agents")])
    out = subprocess.run(
        [sys.executable, "-m", "gpuledger.cli.main", "query", "--warehouse", str(warehouse),
         "--format", "csv", "SELECT sum(telemetry_samples) FROM gpu_minute"],
        env=env, capture_output=True, text=True, check=True).stdout
    return int(out.splitlines()[1])


def _ingest(tree: Path, folder: Path, warehouse: Path) -> dict[str, float]:
    return _child(tree, ["ingest", *map(str, sorted(folder.glob("*.jsonl"))),
                         "--warehouse", str(warehouse), "--quiet"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hours", type=float, default=2.0)
    parser.add_argument("--cut", action="append", default=None,
                        help="ISO time starting a piece (repeatable; default: 25 s into "
                        "the middle hour's first minute)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--tree", action="append", default=None, metavar="LABEL=PATH")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    trees = dict(t.split("=", 1) for t in (args.tree or [f"this={HERE}"]))
    cuts = args.cut or [f"2026-01-05T{int(args.hours // 2):02d}:00:25"]
    work = Path(tempfile.mkdtemp(prefix="ingest-bench-"))
    try:
        first = Path(next(iter(trees.values())))
        sim = _child(first, ["simulate", "--hours", str(args.hours), "--out",
                             str(work / "events"), "--quiet"])
        if sim["exit"]:
            sys.exit("ingest_pieces: the simulation failed")
        pieces = _split(work / "events", cuts, work)
        results: list[dict[str, object]] = []
        for round_ in range(args.rounds):
            for label, path in trees.items():
                tree = Path(path).resolve()
                whole = _ingest(tree, work / "events", work / f"w-{label}-{round_}")
                runs = [_ingest(tree, piece, work / f"p-{label}-{round_}") for piece in pieces]
                states = work / f"p-{label}-{round_}" / "state" / "ingest"
                sizes = {p.name: sum(f.stat().st_size for f in p.rglob("*") if f.is_file())
                         for p in sorted(states.iterdir()) if p.is_dir()}
                row = {"tree": label, "round": round_, "whole": whole, "pieces": runs,
                       "samples_whole": _samples(tree, work / f"w-{label}-{round_}"),
                       "samples_pieces": _samples(tree, work / f"p-{label}-{round_}"),
                       "state_bytes": sizes}
                print(json.dumps(row), flush=True)
                results.append(row)
        if args.json:
            args.json.write_text(json.dumps({"hours": args.hours, "cuts": cuts,
                                             "runs": results}, indent=2) + "\n")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
