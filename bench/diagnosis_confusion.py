"""Confusion matrix of the diagnosis against the simulator's ground truth (issue 15).

Simulates the built-in cluster plus three workloads that exercise the patterns the
default mix lacks (memory-bound and communication-bound training on the DCGM pools, and
communication-bound jobs on the L40S pool, which reports ``util.gpu`` only, so they must
not be claimed), processes it into a warehouse, labels every idle or inefficient
GPU-minute with the diagnosis (``advisor.diagnosis.label_minutes``) and with the truth
(``simulate.truth``), and prints precision and recall per pattern as Markdown.

    python bench/diagnosis_confusion.py --hours 24
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import polars as pl
import yaml

from gpuledger.pipeline.advisor.diagnosis import label_minutes
from gpuledger.pipeline.advisor.diagnosis_batch import COLUMNS
from gpuledger.pipeline.advisor.patterns import PATTERNS
from gpuledger.pipeline.config import ProcessorConfig
from gpuledger.pipeline.demo import run_demo
from gpuledger.pipeline.simulate import SimConfig, parse_cluster, plan
from gpuledger.pipeline.simulate.truth import truth

EXTRA: list[dict[str, Any]] = [
    {"name": "memory-bound", "profile": "memory_bound", "job_type": "training",
     "queue": "research", "teams": ["vision", "recsys"], "arrivals_per_hour": 1.5,
     "gpus": {1: 2, 2: 1, 4: 1}, "duration_minutes": {"median": 120, "sigma": 0.5}},
    {"name": "comm-bound", "profile": "comm_bound", "job_type": "training",
     "queue": "research", "teams": ["llm-core", "speech"], "arrivals_per_hour": 1.5,
     "gpus": {2: 1, 4: 2, 8: 2}, "duration_minutes": {"median": 120, "sigma": 0.5}},
    {"name": "comm-bound-pcie", "profile": "comm_bound", "job_type": "training",
     "queue": "infer-batch", "teams": ["recsys", "platform"], "arrivals_per_hour": 0.5,
     "gpus": {2: 1, 4: 1}, "duration_minutes": {"median": 90, "sigma": 0.5}},
]


def cluster() -> Any:
    import importlib.resources

    text = (importlib.resources.files("gpuledger.pipeline.simulate")
            .joinpath("default_cluster.yaml").read_text(encoding="utf-8"))
    doc = yaml.safe_load(text)
    doc["workloads"] += EXTRA
    doc["name"] = "default+diagnosis"
    return parse_cluster(doc)


def table(root: Path, name: str, columns: list[str]) -> pl.DataFrame:
    files = sorted((root / "facts" / name).glob("date=*/*.parquet"))
    return pl.concat([pl.read_parquet(f, columns=columns) for f in files],
                     how="vertical_relaxed")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hours", type=float, default=24.0)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--interval", type=int, default=10, help="sample interval (s)")
    ap.add_argument("--warehouse", type=Path, default=None,
                    help="reuse or keep this warehouse (default: a temporary one)")
    args = ap.parse_args()
    sim = SimConfig(hours=args.hours, seed=args.seed, sample_interval_s=args.interval,
                    cluster=cluster())
    tmp = tempfile.TemporaryDirectory()
    root = args.warehouse or Path(tmp.name) / "wh"
    t0 = time.monotonic()
    if not (root / "facts" / "gpu_minute").is_dir():
        print(f"simulating {args.hours:g} h into {root} …", file=sys.stderr)
        run_demo(sim, ProcessorConfig(), root)
    t1 = time.monotonic()
    rows = table(root, "gpu_minute", COLUMNS)
    labels = label_minutes(rows)
    t2 = time.monotonic()
    scored = labels.filter(~pl.col("shared"))
    shared = labels.height - scored.height
    cards = rows.select("job_id", "attempt", "node", "gpu_index", "minute", "card_type")
    both = truth(plan(sim), scored.select("job_id", "node", "gpu_index", "minute")).join(
        scored, on=["job_id", "node", "gpu_index", "minute"]).join(
        cards, on=["job_id", "attempt", "node", "gpu_index", "minute"], how="left")
    conf = both.group_by("truth", "pattern").len()
    print(f"# diagnosis vs simulator truth: {args.hours:g} h, seed {args.seed}, "
          f"{args.interval} s samples; {both.height:,} idle/inefficient GPU-minutes scored "
          f"({shared:,} on shared GPUs left out); simulate+process {t1 - t0:.0f} s, "
          f"label {t2 - t1:.1f} s\n")
    print("| pattern | truth minutes | predicted | precision | recall |")
    print("|---|---:|---:|---:|---:|")
    for p in PATTERNS:
        tp = conf.filter((pl.col("truth") == p) & (pl.col("pattern") == p))["len"].sum()
        real = conf.filter(pl.col("truth") == p)["len"].sum()
        pred = conf.filter(pl.col("pattern") == p)["len"].sum()
        prec = f"{tp / pred:.3f}" if pred else "–"
        rec = f"{tp / real:.3f}" if real else "–"
        print(f"| {p} | {real:,} | {pred:,} | {prec} | {rec} |")
    print("\nconfusion (rows: truth, columns: diagnosis):\n")
    print("| truth \\ diagnosis | " + " | ".join(PATTERNS) + " |")
    print("|---|" + "---:|" * len(PATTERNS))
    for t in PATTERNS:
        cells = [conf.filter((pl.col("truth") == t) & (pl.col("pattern") == p))["len"].sum()
                 for p in PATTERNS]
        print(f"| {t} | " + " | ".join(f"{c:,}" for c in cells) + " |")
    claims = both.filter(pl.col("card_type").is_in(["L40S-48GB", "A10-24GB"])
                         & pl.col("pattern").is_in(["communication_bound", "memory_bound"]))
    print(f"\ncommunication/memory-bound claimed on util-only cards (L40S, A10): "
          f"{claims.height}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
