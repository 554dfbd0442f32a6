"""Import the Alibaba ``openb`` GPU cluster trace (Weng et al., USENIX ATC '23).

Input: the node list (``sn, cpu_milli, memory_mib, gpu, model``) and the pod list
(``name, cpu_milli, memory_mib, num_gpu, gpu_milli, gpu_spec, qos, pod_phase,
creation_time, deletion_time, scheduled_time``; times in seconds from the trace start).
Output: contract inventory and job events, fed to the same processor as everything else.

Mapping (documented in ``docs/import.md``):

- every node with GPUs is one inventory record in pool ``openb``; its card type is the
  trace's model; memory per GPU from :data:`GPU_MEMORY_MIB` (G2/G3 are anonymised in the
  trace: 16 GiB assumed);
- every pod with ``num_gpu > 0`` is a job (CPU-only pods are counted and skipped):
  ``submitted`` at creation; ``started`` at ``scheduled_time`` with a placement (below);
  at deletion ``failed`` for ``pod_phase = Failed``, ``cancelled`` for pods never
  scheduled, else ``finished``. A pod with ``gpu_milli < 1000`` shares one GPU: its
  allocation fraction is ``gpu_milli / 1000``;
- queue = QoS class; priority Guaranteed 100, LS 90, Burstable 50, BE 10; BE pods are
  preemptible; job type ``training`` for BE, ``inference`` otherwise; team ``default``.

Placement policy (the trace has none; ``gpuledger.bridges.placement``), applied in
event-time order with releases first: a whole-GPU pod goes to the node with the fewest
free whole GPUs that still fits it (best fit; ties by node name); a fractional pod goes
to the partly used GPU with the least room that fits, else to a free GPU chosen like a
one-GPU pod. A pod that fits
nowhere is reported as unplaced and ends ``failed`` (reason ``unplaced by importer``)
at its deletion time, so that its queue time is still counted.

A window (``window_from_s``, ``window_to_s``) keeps long traces tractable: pods created
in the window keep their own times; pods alive at the window start enter it as
submitted (and started, if they were) at the start; events after the window end are
dropped, so such pods are still running at its end.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import polars as pl

from gpuledger.bridges.placement import Placer
from gpuledger.pipeline.columns import conform

GPU_MEMORY_MIB = {"P100": 16_384.0, "V100M16": 16_384.0, "V100M32": 32_768.0,
                  "T4": 15_360.0, "A10": 23_028.0, "G2": 16_384.0, "G3": 16_384.0}
DEFAULT_GPU_MEMORY_MIB = 16_384.0
PRIORITY = {"Guaranteed": 100, "LS": 90, "Burstable": 50, "BE": 10}
DEFAULT_START = datetime(2026, 1, 1, tzinfo=UTC)
POOL = "openb"


@dataclass
class OpenbImport:
    """The events of an import and what could not be imported."""

    frames: dict[str, pl.DataFrame]
    window_end: datetime | None = None
    """The window's end, when a window was asked for: every minute before it is closed
    (pods still running then stay running)."""
    pods_total: int = 0
    pods_cpu_only: int = 0
    pods_imported: int = 0
    unplaced: list[str] = field(default_factory=list)


def load_openb(
    nodes_csv: Path, pods_csv: Path, *, start: datetime = DEFAULT_START,
    window_from_s: float | None = None, window_to_s: float | None = None,
) -> OpenbImport:
    """Read the trace and turn it into inventory and job event frames."""
    nodes = pl.read_csv(nodes_csv).filter(pl.col("gpu") > 0).sort("sn")
    pods = pl.read_csv(pods_csv)
    lo = float(window_from_s) if window_from_s is not None else 0.0
    hi = float(window_to_s) if window_to_s is not None else float("inf")
    gpu_pods = pods.filter(pl.col("num_gpu") > 0)
    result = OpenbImport({}, pods_total=pods.height,
                         pods_cpu_only=pods.height - gpu_pods.height,
                         window_end=None if window_to_s is None else start + timedelta(
                             seconds=float(window_to_s)))

    def at(seconds: float) -> datetime:
        return start + timedelta(seconds=seconds)

    inventory = nodes.select(
        pl.lit(1).alias("v"), pl.lit("inventory").alias("type"),
        pl.lit(at(lo)).alias("time"), pl.col("sn").alias("node"), pl.lit(POOL).alias("pool"),
        pl.col("model").alias("card_type"), pl.col("gpu").alias("gpu_count"),
        pl.col("model").replace_strict(GPU_MEMORY_MIB, default=DEFAULT_GPU_MEMORY_MIB,
                                       return_dtype=pl.Float64).alias("gpu_mem_mib"),
        pl.lit(True).alias("schedulable"), pl.lit("ok").alias("health"),
    )
    placer = Placer(dict(nodes.select("sn", "gpu").iter_rows()))
    # (time, order, pod) where order puts releases before placements at the same time
    timeline: list[tuple[float, int, dict[str, Any]]] = []
    for pod in gpu_pods.iter_rows(named=True):
        if pod["deletion_time"] <= lo or pod["creation_time"] >= hi:
            continue
        if pod["scheduled_time"] is not None:
            timeline.append((float(pod["scheduled_time"]), 1, pod))
            timeline.append((float(pod["deletion_time"]), 0, pod))
    timeline.sort(key=lambda e: (e[0], e[1], e[2]["name"]))
    placements: dict[str, list[tuple[str, int, float]] | None] = {}
    for _t, kind, pod in timeline:
        name = pod["name"]
        if kind == 1:
            share = min(pod["gpu_milli"], 1000) / 1000.0
            placements[name] = placer.place(pod["num_gpu"], share)
        elif placements.get(name):
            placer.release(placements[name] or [])

    rows: list[dict[str, Any]] = []
    for pod in gpu_pods.iter_rows(named=True):
        created, deleted = float(pod["creation_time"]), float(pod["deletion_time"])
        scheduled = pod["scheduled_time"]
        if deleted <= lo or created >= hi:
            continue
        result.pods_imported += 1
        qos = pod["qos"]
        attrs = {"team": "default", "user": None, "queue": qos, "pool": POOL,
                 "priority": PRIORITY.get(qos, 50),
                 "job_type": "training" if qos == "BE" else "inference",
                 "gpus": pod["num_gpu"], "card_type": None, "gpu_mem_mib": None,
                 "preemptible": qos == "BE", "checkpointable": False}
        job_id = pod["name"]
        rows.append({"time": at(max(created, lo)), "event": "submitted", "job_id": job_id,
                     **attrs})
        placed = placements.get(job_id)
        if scheduled is not None and placed and float(scheduled) < hi:
            rows.append({"time": at(max(float(scheduled), lo)), "event": "started",
                         "job_id": job_id, **attrs,
                         "allocation": [{"node": sn, "gpu_index": i, "gpu_uuid": None,
                                         "fraction": frac} for sn, i, frac in placed]})
            end = "failed" if pod["pod_phase"] == "Failed" else "finished"
            reason = None
        elif scheduled is not None:
            result.unplaced.append(job_id)
            end, reason = "failed", "unplaced by importer"
        else:
            end, reason = "cancelled", "never scheduled"
        if deleted < hi:
            rows.append({"time": at(deleted), "event": end, "job_id": job_id, **attrs,
                         "reason": reason})
    jobs = pl.DataFrame(rows, infer_schema_length=None).with_columns(
        pl.lit(1).alias("v"), pl.lit("job").alias("type"))
    result.frames = {"inventory": conform(inventory, "inventory"),
                     "job": conform(jobs, "job")}
    return result
