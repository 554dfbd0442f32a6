"""Ground truth for the diagnosis: why a simulated job's GPU-minute is idle or inefficient.

The workload profiles (:mod:`.telemetry`) say what each job does, so each GPU-minute a job
holds has a true pattern (the names of ``advisor.patterns``):

================== ===================================================================
profile            true pattern of its minutes
================== ===================================================================
dataloader_bound   ``input_bound``
evaluation         ``input_bound`` (bursts separated by loading gaps)
inference          ``underfilled_inference``
memory_bound       ``memory_bound``
comm_bound         ``communication_bound`` (attempts of two or more GPUs)
training, finetune,
oversized          ``checkpoint_stall`` in a minute that overlaps a checkpoint dip,
                   else ``unknown``
notebook           ``unknown``
================== ===================================================================

overridden by ``held_no_process`` while a job's process has not started yet
(``no_process_s``) and by ``unknown`` in a minute that overlaps a job's start-up
(``STARTUP_S``) or that holds no sample of the job (it started or ended inside it).
"""

from __future__ import annotations

import numpy as np
import polars as pl

from gpuledger.pipeline.columns import TIME_DTYPE
from gpuledger.pipeline.simulate.run import Plan
from gpuledger.pipeline.simulate.telemetry import DIP_S, KIND, STARTUP_KINDS, STARTUP_S

BY_PROFILE = {
    "dataloader_bound": "input_bound", "evaluation": "input_bound",
    "inference": "underfilled_inference", "memory_bound": "memory_bound",
    "comm_bound": "communication_bound", "training": "unknown", "finetune": "unknown",
    "oversized": "unknown", "notebook": "unknown",
}
CHECKPOINT_PROFILES = ("training", "finetune", "oversized")


def segments(p: Plan) -> pl.DataFrame:
    """The schedule's GPU segments of jobs: job, node, GPU, start and end (origin seconds)."""
    seg = p.schedule.segments
    keep = seg.job >= 0
    lay = p.layout
    gpu = seg.gpu[keep]
    return pl.DataFrame({
        "job": seg.job[keep], "node": [lay.node_names[int(n)] for n in lay.gpu_node[gpu]],
        "gpu_index": lay.gpu_local[gpu], "seg_start": seg.start_s[keep],
        "seg_end": seg.end_s[keep]})


def truth(p: Plan, minutes: pl.DataFrame) -> pl.DataFrame:
    """``minutes`` (``job_id``, ``node``, ``gpu_index``, ``minute``) with its ``truth``."""
    jobs = p.jobs
    info = pl.DataFrame({
        "job": np.arange(len(jobs)), "job_id": [j.job_id for j in jobs],
        "profile": [j.profile for j in jobs], "gpus": [j.gpus for j in jobs],
        "checkpoint_s": [j.checkpoint_s for j in jobs],
        "no_process_s": [j.no_process_s for j in jobs],
        "startup": [bool(STARTUP_KINDS[KIND[j.profile]]) for j in jobs],
    })
    seg = segments(p).join(info.select("job", "job_id"), on="job").sort("seg_start")
    t = ((pl.col("minute").cast(TIME_DTYPE).cast(pl.Int64) - p.origin_ms) // 1000)
    left = minutes.with_columns(t.alias("t0"), (t + 30).alias("t_mid")).sort("t_mid")
    hit = left.join_asof(seg, left_on="t_mid", right_on="seg_start",
                         by=["job_id", "node", "gpu_index"], strategy="backward",
                         check_sortedness=False)
    hit = hit.join(info.drop("job"), on="job_id", how="left")
    tau = pl.col("t0") - pl.col("seg_start")  # seconds since the attempt started
    ckpt = pl.col("checkpoint_s")
    r = tau % pl.when(ckpt > 0).then(ckpt).otherwise(1)
    dip = ((ckpt > 0) & (tau + 60 > ckpt) & ((r < DIP_S) | (r > ckpt - 60)))
    outside = pl.col("seg_start").is_null() | (pl.col("t0") + 60 > pl.col("seg_end")) | (
        tau < 0)
    label = (
        pl.when(outside).then(pl.lit("unknown"))
        .when(tau < pl.col("no_process_s")).then(pl.lit("held_no_process"))
        .when(pl.col("startup") & (tau < STARTUP_S)).then(pl.lit("unknown"))
        .when((pl.col("profile") == "comm_bound") & (pl.col("gpus") < 2))
        .then(pl.lit("unknown"))
        .when(pl.col("profile").is_in(list(CHECKPOINT_PROFILES)) & dip)
        .then(pl.lit("checkpoint_stall"))
        .otherwise(pl.col("profile").replace_strict(BY_PROFILE, default="unknown"))
    )
    return hit.with_columns(label.alias("truth")).select(*minutes.columns, "truth")
