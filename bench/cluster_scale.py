"""The packaged default cluster (576 GPUs) scaled by a factor, for benchmarks at size.

Node counts, job arrivals, initial jobs, team quotas and users grow by the factor, so
the cluster stays as busy as the default one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

import gpuledger.pipeline.simulate as simulate_pkg
from gpuledger.pipeline.simulate import ClusterSpec, parse_cluster


def scaled_document(factor: float, arrivals: float = 1.0) -> dict[str, Any]:
    """The default cluster's YAML document, scaled; ``arrivals`` scales the job arrivals
    once more (the default cluster is oversubscribed: its queue grows from about 70
    pending jobs on the first day to over 3,000 after four weeks; with 0.9 it stays
    between 0 and about 400, bench/README.md)."""
    spec: dict[str, Any] = yaml.safe_load(
        (Path(simulate_pkg.__file__).parent / "default_cluster.yaml").read_text())
    for g in spec["node_groups"]:
        g["nodes"] = max(1, round(g["nodes"] * factor))
    for w in spec["workloads"]:
        w["arrivals_per_hour"] = w["arrivals_per_hour"] * factor * arrivals
        if "initial_jobs" in w:
            w["initial_jobs"] = round(w["initial_jobs"] * factor)
    for t in spec["teams"]:
        t["quota"] = {k: round(v * factor) for k, v in t["quota"].items()}
        t["users"] = max(1, round(t["users"] * factor))
    return spec


def scaled_cluster(factor: float, arrivals: float = 1.0) -> ClusterSpec:
    """The default cluster scaled by ``factor`` (1: the default, 576 GPUs), its job
    arrivals by ``arrivals`` once more."""
    return parse_cluster(scaled_document(factor, arrivals))


def write_scaled(path: Path, factor: float) -> Path:
    """Write the scaled cluster's YAML to ``path`` (for ``gpuledger demo --cluster``)."""
    path.write_text(yaml.safe_dump(scaled_document(factor)))
    return path
