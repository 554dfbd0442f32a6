"""``gpuledger whatif`` on a long history, checkouts side by side: each run in a child
process (``cli_child.py``), the checkouts alternating, one run at a time. Prints per run
the wall time, CPU (with children) and peak RSS, whether every checkout printed the
same JSON document byte for byte, and whether the documents are the same with each
number equal to 10⁻⁹ of itself (parallel float sums differ in their last bits between
two runs of one checkout).

The history is a warehouse made beforehand, for example the openb trace (149 days, 6,212
GPUs, no telemetry: 1.3 billion GPU-minutes stored as spans):

    gpuledger import openb --nodes ../shared/data/openb/openb_node_list_gpu_node.csv \\
        --pods ../shared/data/openb/openb_pod_list_default.csv --warehouse /tmp/openb
    python bench/whatif_history.py --warehouse /tmp/openb --tree old=/tmp/old --tree new=.

``--policy`` (repeatable; default ``as-run``, the baseline alone) keeps the replays short,
so that what is measured is mostly reading the history.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cli_child import run_cli


def _tree(text: str) -> tuple[str, Path]:
    label, _, path = text.partition("=")
    if not path:
        raise argparse.ArgumentTypeError(f"--tree {text!r}: give LABEL=PATH")
    return label, Path(path).resolve()


def _differences(a: object, b: object, path: str = "") -> list[str]:
    """Where the JSON values ``a`` and ``b`` differ, numbers compared to 10⁻⁹."""
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return [f"{path}: keys"]
        return [d for k in a for d in _differences(a[k], b[k], f"{path}/{k}")]
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{path}: {len(a)} against {len(b)} items"]
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True))
                for d in _differences(x, y, f"{path}[{i}]")]
    if isinstance(a, float | int) and isinstance(b, float | int) and not (
            isinstance(a, bool) or isinstance(b, bool)):
        return [] if abs(a - b) <= 1e-9 * max(1.0, abs(a)) else [f"{path}: {a} against {b}"]
    return [] if a == b else [f"{path}: {a!r} against {b!r}"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--warehouse", required=True, help="the warehouse to read")
    parser.add_argument("--tree", type=_tree, action="append", required=True,
                        metavar="LABEL=PATH", help="a checkout (repeatable)")
    parser.add_argument("--policy", action="append", default=None, metavar="NAME")
    parser.add_argument("--since", default=None)
    parser.add_argument("--until", default=None)
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    command = ["whatif", "--json", "--quiet", "--warehouse", args.warehouse]
    for name in args.policy or ["as-run"]:
        command += ["--policy", name]
    for flag in ("since", "until"):
        if getattr(args, flag):
            command += [f"--{flag}", getattr(args, flag)]
    runs, digests, documents = [], {}, {}
    for _ in range(args.rounds):
        for label, tree in args.tree:
            run = run_cli(command, tree)
            if run.exit != 0:
                sys.exit(f"{label}: exit {run.exit}: {run.stderr.strip()[-2000:]}")
            digest = hashlib.sha256(run.stdout.encode()).hexdigest()
            digests.setdefault(label, set()).add(digest)
            documents.setdefault(label, json.loads(run.stdout))
            runs.append({"tree": label, "wall_s": round(run.wall_s, 2),
                         "cpu_s": round(run.cpu_s, 2),
                         "peak_rss_mib": round(run.peak_rss_mib), "sha256": digest[:16]})
            print(json.dumps(runs[-1]), flush=True)
    same = len({d for ds in digests.values() for d in ds}) == 1
    first = next(iter(documents.values()))
    differ = [d for doc in documents.values() for d in _differences(first, doc)]
    print(json.dumps({"command": command, "same_output": same,
                      "same_to_1e-9": not differ, "differences": differ[:20],
                      "runs": runs}, indent=2))


if __name__ == "__main__":
    main()
