"""The openb trace imported whole (or a window of it), side by side for code trees.

Runs ``gpuledger import openb`` as a child process per run and reads its resource usage
(``os.wait4``): wall time, CPU (user + system, with the processes it waited for, such as
compaction's sort child) and the peak RSS of its largest process. With ``--tree
LABEL=PATH`` (repeatable) each run alternates between checkouts (``PATH/pipeline`` and
``PATH/agents`` first on ``PYTHONPATH``), so that trees are compared on the same machine
in the same minutes. The trace: ``GPULEDGER_OPENB_DIR``, else ``../shared/data/openb``
beside the checkout. Usage:

    python bench/openb_import.py [--hours 240 --from-hours 2400] [--rounds 2]
        [--tree old=/tmp/old --tree new=.] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from cli_child import run_cli

HERE = Path(__file__).resolve().parents[1]


def _trace() -> Path:
    env = os.environ.get("GPULEDGER_OPENB_DIR")
    folder = Path(env) if env else HERE.parent / "shared" / "data" / "openb"
    if not (folder / "openb_pod_list_default.csv").is_file():
        sys.exit(f"openb_import: no openb trace in {folder} (set GPULEDGER_OPENB_DIR)")
    return folder


def _run(tree: Path, trace: Path, window: list[str]) -> dict[str, float]:
    out = Path(tempfile.mkdtemp(prefix="openb-bench-"))
    try:
        run = run_cli(["import", "openb",
                       "--nodes", str(trace / "openb_node_list_gpu_node.csv"),
                       "--pods", str(trace / "openb_pod_list_default.csv"),
                       "--warehouse", str(out / "wh"), "--quiet", *window], tree)
        if run.exit:
            sys.exit(f"openb_import: the import failed ({run.exit}): {run.stderr[-2000:]}")
        size = sum(f.stat().st_size for f in (out / "wh").rglob("*") if f.is_file())
        return {"wall_s": round(run.wall_s, 2), "cpu_s": round(run.cpu_s, 2),
                "user_s": round(run.user_s, 2), "sys_s": round(run.sys_s, 2),
                "peak_rss_mib": round(run.peak_rss_mib, 1),
                "written_mib": round(run.written_mib, 1),
                "warehouse_mib": round(size / 2**20, 1)}
    finally:
        shutil.rmtree(out, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hours", type=float, default=None, help="window length (default: all)")
    parser.add_argument("--from-hours", type=float, default=None, help="window start")
    parser.add_argument("--rounds", type=int, default=1, help="runs per tree, alternating")
    parser.add_argument("--tree", action="append", default=[], metavar="LABEL=PATH",
                        help="a checkout to run (default: this one, as 'this')")
    parser.add_argument("--json", type=Path, default=None, help="write results here")
    args = parser.parse_args()
    trees = [(t.split("=", 1)[0], Path(t.split("=", 1)[1]).resolve()) for t in args.tree] \
        or [("this", HERE)]
    window = [*(["--hours", str(args.hours)] if args.hours is not None else []),
              *(["--from-hours", str(args.from_hours)] if args.from_hours is not None else [])]
    trace = _trace()
    runs: list[dict[str, object]] = []
    for r in range(args.rounds):
        for label, tree in trees:
            result = {"tree": label, "round": r + 1, **_run(tree, trace, window)}
            print(json.dumps(result), flush=True)
            runs.append(result)
    doc = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "window": window or "whole trace", "cpus": os.cpu_count(), "runs": runs}
    if args.json:
        args.json.write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
