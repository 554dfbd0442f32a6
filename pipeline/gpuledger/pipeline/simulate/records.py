"""Columnar job-event and inventory frames built from a :class:`~.scheduler.Schedule`.

Every job event carries the job's attributes (team, user, queue, pool, priority,
job_type, gpus, card_type, gpu_mem_mib, preemptible, checkpointable), not only
``submitted``. ``borrowed`` is set on ``started`` (whether this attempt runs over the
team's quota) and on ``preempted`` (whether the attempt that ended was borrowed);
``allocation`` is set on ``started`` only. Times are converted from seconds since the
origin to UTC milliseconds.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from gpuledger.pipeline.columns import conform, schema_of
from gpuledger.pipeline.simulate.layout import Layout
from gpuledger.pipeline.simulate.scheduler import WHOLE, JobEvent, NodeState
from gpuledger.pipeline.simulate.workload import Job


def _time(ms: list[int]) -> pl.Series:
    return pl.Series("time", ms, dtype=pl.Int64).cast(pl.Datetime("ms")).dt.replace_time_zone("UTC")


def job_frame(
    events: list[JobEvent], jobs: list[Job], layout: Layout, origin_ms: int
) -> pl.DataFrame:
    """The ``job`` frame of ``events`` (already in emission order)."""
    schema = schema_of("job")
    cols: dict[str, list[Any]] = {name: [] for name in schema if name not in ("time",)}
    times: list[int] = []
    for e in events:
        job = jobs[e.job]
        times.append(origin_ms + e.time_s * 1000)
        cols["v"].append(1)
        cols["type"].append("job")
        cols["event"].append(e.event)
        cols["job_id"].append(job.job_id)
        cols["team"].append(job.team)
        cols["user"].append(job.user)
        cols["queue"].append(job.queue)
        cols["pool"].append(job.pool)
        cols["priority"].append(job.priority)
        cols["job_type"].append(job.job_type)
        cols["gpus"].append(job.gpus)
        cols["card_type"].append(job.card_type)
        cols["gpu_mem_mib"].append(job.gpu_mem_mib)
        cols["preemptible"].append(job.preemptible)
        cols["checkpointable"].append(job.checkpointable)
        cols["borrowed"].append(e.borrowed)
        cols["reason"].append(e.reason)
        if e.gpus is None:
            cols["allocation"].append(None)
        else:
            cols["allocation"].append(
                [
                    {
                        "node": layout.node_names[int(layout.gpu_node[g])],
                        "gpu_index": int(layout.gpu_local[g]),
                        "gpu_uuid": layout.gpu_uuid[g],
                        "fraction": e.units / WHOLE,
                    }
                    for g in e.gpus
                ]
            )
    frame = pl.DataFrame(
        [pl.Series(name, cols[name], dtype=schema[name]) for name in cols]
    ).with_columns(_time(times))
    return conform(frame, "job")


def inventory_frame(states: list[NodeState], layout: Layout, origin_ms: int) -> pl.DataFrame:
    """The ``inventory`` frame of node ``states`` (already in time order)."""
    schema = schema_of("inventory")
    rows: dict[str, list[Any]] = {name: [] for name in schema if name != "time"}
    times: list[int] = []
    for s in states:
        n = s.node
        times.append(origin_ms + s.time_s * 1000)
        rows["v"].append(1)
        rows["type"].append("inventory")
        rows["node"].append(layout.node_names[n])
        rows["pool"].append(layout.node_pool[n])
        rows["card_type"].append(layout.node_card[n])
        rows["gpu_count"].append(int(layout.node_gpus[n]))
        rows["gpu_mem_mib"].append(float(layout.gpu_mem_mib[layout.node_first_gpu[n]]))
        rows["nvlink_domain"].append(layout.node_nvlink_domain[n])
        rows["topology"].append(layout.node_topology[n])
        rows["labels"].append(layout.node_labels[n])
        rows["schedulable"].append(s.schedulable)
        rows["health"].append(s.health)
        rows["unhealthy_gpus"].append(list(s.unhealthy_gpus))
    frame = pl.DataFrame(
        [pl.Series(name, rows[name], dtype=schema[name]) for name in rows]
    ).with_columns(_time(times))
    return conform(frame, "inventory")
