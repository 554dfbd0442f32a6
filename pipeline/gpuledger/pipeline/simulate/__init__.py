"""Cluster simulator: deterministic telemetry, inventory and scheduler events.

Modules: :mod:`.cluster` (spec, YAML), :mod:`.layout` (nodes and GPUs as arrays),
:mod:`.workload` (jobs), :mod:`.scheduler` (event-driven scheduler model),
:mod:`.telemetry` (vectorised samples), :mod:`.records` (job/inventory frames) and
:mod:`.run` (``simulate``, ``write_jsonl``).
"""

from gpuledger.pipeline.simulate.cluster import (
    ClusterSpec,
    ClusterSpecError,
    load_cluster,
    parse_cluster,
)
from gpuledger.pipeline.simulate.run import (
    Plan,
    SimConfig,
    SimSummary,
    describe,
    plan,
    simulate,
    write_jsonl,
)

__all__ = [
    "ClusterSpec",
    "ClusterSpecError",
    "Plan",
    "SimConfig",
    "SimSummary",
    "describe",
    "load_cluster",
    "parse_cluster",
    "plan",
    "simulate",
    "write_jsonl",
]
