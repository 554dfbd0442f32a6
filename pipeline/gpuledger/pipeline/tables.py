"""The warehouse's fact tables: their columns, types and sort order.

One place for every table's schema, so that the writer, the empty schema files (which
let the DuckDB views exist before any rows do) and the docs agree.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from gpuledger.pipeline.advisor.diagnosis import JOB_DIAGNOSIS
from gpuledger.pipeline.columns import TIME_DTYPE, schema_of
from gpuledger.pipeline.facts.recommendations import REC_SCHEMA
from gpuledger.pipeline.facts.rollup import DIMENSIONS, MEASURES
from gpuledger.pipeline.facts.telemetry_minutes import READING_DTYPE
from gpuledger.pipeline.state.jobs import ATTEMPT_SCHEMA, PREEMPTION_SCHEMA

S, N, F, B, T, D = pl.String, pl.Int64, pl.Float64, pl.Boolean, TIME_DTYPE, pl.Date
R = READING_DTYPE  # a telemetry reading (32-bit)


def _cols(columns: dict[str, Any]) -> dict[str, pl.DataType]:
    """Column types as instances (mixing classes and instances reads better above)."""
    return {k: v() if isinstance(v, type) else v for k, v in columns.items()}


GPU_MINUTE = pl.Schema(_cols({
    "minute": T, "date": D, "pool": S, "card_type": S, "node": S, "gpu_index": N,
    "state": S, "allocated": B, "alloc_fraction": F, "occupied_share": F, "jobs_on_gpu": N,
    "job_id": S,
    "attempt": N, "team": S, "queue": S, "job_type": S, "user": S, "priority": N,
    "activity": R, "telemetry_samples": N, "util_gpu": R, "sm_active": R,
    "sm_occupancy": R, "tensor_active": R, "dram_active": R, "mem_used_mib": R,
    "mem_total_mib": R, "power_w": R, "temp_c": R, "sm_clock_mhz": R,
    "pcie_rx_bytes_s": R, "pcie_tx_bytes_s": R, "nvlink_rx_bytes_s": R,
    "nvlink_tx_bytes_s": R, "xid_errors": N, "ecc_sbe": N, "ecc_dbe": N, "processes": N,
    "unattributed_processes": N, "schedulable": B, "health": S, "idle_threshold": F,
    "efficient_threshold": F,
}))

GPU_SPAN = pl.Schema({**dict(GPU_MINUTE), "minutes": pl.Int64()})
"""``minutes`` identical GPU-minutes from ``minute`` on, of a GPU without telemetry
(``facts/spans.py``); the ``gpu_minute`` view expands them."""

FRAG_MINUTE = pl.Schema(_cols({
    "minute": T, "date": D, "pool": S, "card_type": S, "node_size": N, "healthy_nodes": N,
    "free_gpus": N, "largest_free_block": N, "whole_node_free_gpus": N, "frag_1": F,
    "frag_2": F, "frag_4": F, "frag_8": F, "frag_node": F, "frag_demand": F,
    "demand_source": S, "pending_jobs": N, "pending_gpus": N, "blocked_jobs": N,
    "blocked_gpus": N,
}))

PENDING_MINUTE = pl.Schema(_cols({
    "minute": T, "date": D, "queue": S, "pool": S, "card_type": S, "team": S,
    "pending_jobs": N, "pending_gpus": N, "blocked_jobs": N, "blocked_gpus": N,
}))

BLOCKED_MINUTE = pl.Schema(_cols({
    "minute": T, "date": D, "job_id": S, "attempt": N, "team": S, "queue": S, "pool": S,
    "card_type": S, "gpus": N, "priority": N, "free_gpus": N, "largest_free_block": N,
}))

USAGE = {
    "allocated_gpu_hours": F, "job_gpu_hours": F, "used_gpu_hours": F, "idle_gpu_hours": F,
    "inefficient_gpu_hours": F, "observed_gpu_hours": F, "no_telemetry_gpu_hours": F,
    "waste_gpu_hours": F,
    "utilisation_of_allocation": F, "mem_peak_mib": F, "mem_held_mib": F,
    "mem_peak_ratio": F, "mem_peak_of_requested": F, "memory_oversized": B,
    "held_card_type": S, "gpus_observed": N, "idle_gpus": N, "suggested_card_type": S,
    "mismatch_gpu_hours": F,
}

JOB_ATTEMPTS = pl.Schema(_cols({
    **dict(ATTEMPT_SCHEMA), "date": D, **USAGE, "idle_threshold": F,
    "efficient_threshold": F,
}))

JOB_GPU = pl.Schema(_cols({
    "job_id": S, "attempt": N, "node": S, "gpu_index": N, "card_type": S,
    "gpu_mem_total_mib": F, "fraction": F, "observed_min": F, "mem_peak_mib": F,
    "allocated_gpu_hours": F, "job_gpu_hours": F, "used_gpu_hours": F, "idle_gpu_hours": F,
    "inefficient_gpu_hours": F, "mean_activity": F, "mem_held_mib": F, "ended_at": T,
    "date": D,
}))

PREEMPTIONS = pl.Schema(_cols({**dict(PREEMPTION_SCHEMA), "date": D}))

RECOMMENDATIONS = pl.Schema(_cols({**dict(REC_SCHEMA), "ended_at": T, "date": D}))

GPU_HOURLY = pl.Schema(_cols({"hour": T, **{d: S for d in DIMENSIONS}, **{m: F for m in MEASURES},
                        "date": D}))
GPU_DAILY = pl.Schema(_cols({"date": D, **{d: S for d in DIMENSIONS}, **{m: F for m in MEASURES}}))

RUNNING_ATTEMPTS = pl.Schema(_cols({**dict(ATTEMPT_SCHEMA),
                              **USAGE}))

REJECTS = pl.Schema(_cols({"record_type": S, "source": S, "line": N, "reason": S, "raw": S}))

TABLE_SCHEMAS: dict[str, pl.Schema] = {
    "gpu_minute": GPU_MINUTE,
    "gpu_span": GPU_SPAN,
    "frag_minute": FRAG_MINUTE,
    "pending_minute": PENDING_MINUTE,
    "blocked_minute": BLOCKED_MINUTE,
    "job_attempts": JOB_ATTEMPTS,
    "job_gpu": JOB_GPU,
    "preemptions": PREEMPTIONS,
    "recommendations": RECOMMENDATIONS,
    "job_diagnosis": JOB_DIAGNOSIS,
    "gpu_hourly": GPU_HOURLY,
    "gpu_daily": GPU_DAILY,
    "running_attempts": RUNNING_ATTEMPTS,
    "candidates": REC_SCHEMA,
    "rejects": REJECTS,
}

LATE_TELEMETRY = pl.Schema(_cols({
    "time": T, "node": S, "agent": S, "seq": N,
    **{k: v for k, v in schema_of("telemetry").items()
       if k not in ("v", "type", "time", "node", "agent", "seq")},
    "minute": T, "unhealthy_sample": B, "date": D}))
"""Telemetry that came after its minute closed: the samples as they came, with their
minute and day."""

UNSCHEMATISED_TABLES: dict[str, pl.Schema] = {"late_telemetry": LATE_TELEMETRY}
"""Tables whose view takes its columns from the code, not from a schema file: a table
added after warehouses had been written without its schema file (the catalog's
``{rows:TABLE}``), so that readers of those warehouses have the view too."""

SORT_KEYS: dict[str, list[str]] = {
    "gpu_minute": ["node", "gpu_index", "minute"],  # a GPU's minutes together: 9 % smaller
    "gpu_span": ["minute", "node", "gpu_index"],
    "frag_minute": ["minute", "pool", "card_type"],
    "pending_minute": ["minute", "queue", "pool", "card_type", "team"],
    "blocked_minute": ["minute", "job_id", "attempt"],
    "job_attempts": ["ended_at", "job_id", "attempt"],
    "job_gpu": ["job_id", "attempt", "node", "gpu_index"],
    "preemptions": ["time", "job_id", "attempt"],
    "recommendations": ["job_id", "attempt", "kind"],
    "job_diagnosis": ["job_id", "attempt", "pattern"],
    "gpu_hourly": ["hour", *DIMENSIONS],
    "gpu_daily": ["date", *DIMENSIONS],
    "late_telemetry": ["time", "node", "gpu_index", "mig_instance"],
}

