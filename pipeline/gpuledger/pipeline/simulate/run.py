"""Run the simulator: plan the schedule, then stream batches of the three record types.

``simulate(config)`` first generates the jobs (:mod:`.workload`) and runs the scheduler
model (:mod:`.scheduler`) over the warm-up and the span — both cheap — and then yields
one batch per ``chunk_minutes`` of event time, synthesising the telemetry of each chunk
on demand (:mod:`.telemetry`). Each batch is a dict with the keys ``"telemetry"``,
``"inventory"`` and ``"job"``; every frame has exactly the contract's columnar schema
(:func:`gpuledger.pipeline.columns.conform`), possibly with no rows, and is sorted by
time. Batches cover ``[start + i·chunk, start + (i+1)·chunk)``; telemetry samples are
at ``start + k·sample_interval_s``.

Everything depends only on the config: the same config gives byte-identical frames.

The span starts with the cluster already loaded (a warm-up of ``warmup_hours`` is
simulated before ``start`` but not emitted). The first batch therefore holds one
inventory row per node, a ``submitted`` event for each job pending at ``start`` and a
``submitted`` plus ``started`` event for each job running at ``start``, all stamped
``start`` (see :mod:`.scheduler`).
"""

from __future__ import annotations

import contextlib
import os
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import BinaryIO

import numpy as np
import polars as pl

from gpuledger.contract.schema import RECORD_TYPES
from gpuledger.pipeline.columns import empty_frame
from gpuledger.pipeline.simulate.cluster import ClusterSpec, load_cluster
from gpuledger.pipeline.simulate.layout import Layout, build_layout
from gpuledger.pipeline.simulate.records import inventory_frame, job_frame
from gpuledger.pipeline.simulate.scheduler import Schedule, Scheduler
from gpuledger.pipeline.simulate.telemetry import TelemetrySynth
from gpuledger.pipeline.simulate.workload import Job, generate_jobs

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
TIME_FORMAT = "%Y-%m-%dT%H:%M:%S%.3fZ"


@dataclass(frozen=True)
class SimConfig:
    """What to simulate. ``cluster=None`` uses the packaged default cluster."""

    start: datetime = datetime(2026, 1, 5, tzinfo=UTC)
    hours: float = 24.0
    seed: int = 7
    sample_interval_s: int = 10
    chunk_minutes: int = 10
    cluster: ClusterSpec | None = None


@dataclass(frozen=True)
class SimSummary:
    """What a config produces, without synthesising telemetry."""

    total_gpus: int
    gpus_by_pool_card: dict[tuple[str, str], int]
    jobs_generated: int
    job_events: dict[str, int]
    inventory_rows: int
    telemetry_rows: int
    batches: int


@dataclass(frozen=True)
class Plan:
    """The planned simulation: jobs, schedule and the time frame."""

    config: SimConfig
    spec: ClusterSpec
    layout: Layout
    jobs: list[Job]
    schedule: Schedule
    origin_ms: int
    origin_day_s: int
    chunk_s: int

    @property
    def batches(self) -> int:
        """Number of batches ``simulate`` yields."""
        span = self.schedule.end_s - self.schedule.start_s
        return -(-span // self.chunk_s)


def plan(config: SimConfig) -> Plan:
    """Generate the jobs and run the scheduler model for ``config``."""
    if config.hours <= 0:
        raise ValueError("config.hours: must be > 0")
    if config.sample_interval_s < 1:
        raise ValueError("config.sample_interval_s: must be >= 1")
    if config.chunk_minutes < 1:
        raise ValueError("config.chunk_minutes: must be >= 1")
    spec = config.cluster if config.cluster is not None else load_cluster(None)
    start = config.start if config.start.tzinfo is not None else config.start.replace(tzinfo=UTC)
    warmup_s = round(spec.warmup_hours * 3600)
    span_s = max(1, round(config.hours * 3600))
    start_ms = (start - EPOCH) // timedelta(milliseconds=1)
    origin_ms = start_ms - warmup_s * 1000
    origin_day_s = (origin_ms // 1000) % 86_400
    layout = build_layout(spec)
    jobs = generate_jobs(
        spec, seed=config.seed, span_s=warmup_s + span_s, origin_day_s=origin_day_s
    )
    schedule = Scheduler(
        spec, layout, jobs, seed=config.seed, start_s=warmup_s, end_s=warmup_s + span_s
    ).run()
    return Plan(
        config, spec, layout, jobs, schedule, origin_ms, origin_day_s, config.chunk_minutes * 60
    )


def simulate(config: SimConfig, telemetry_from: int = 0) -> Iterator[dict[str, pl.DataFrame]]:
    """Yield batches ``{"telemetry", "inventory", "job"}`` in time order (module doc).

    ``telemetry_from``: the batches before that one carry no telemetry (it is not
    synthesised, which is most of the cost; the nodes' sequence numbers go on as if it
    were, so every later batch is the same as without it)."""
    p = plan(config)
    sched = p.schedule
    jobs_all = job_frame(sched.events, p.jobs, p.layout, p.origin_ms)
    inv_all = inventory_frame(sched.inventory, p.layout, p.origin_ms)
    job_t = np.array([e.time_s for e in sched.events], dtype=np.int64)
    inv_t = np.array([s.time_s for s in sched.inventory], dtype=np.int64)
    synth = TelemetrySynth(
        sched,
        p.jobs,
        p.layout,
        seed=config.seed,
        origin_ms=p.origin_ms,
        origin_day_s=p.origin_day_s,
        interval_s=config.sample_interval_s,
    )
    for i in range(p.batches):
        lo = sched.start_s + i * p.chunk_s
        hi = min(lo + p.chunk_s, sched.end_s)
        if i < telemetry_from:
            synth.skip(lo, hi)
        yield {
            "telemetry": synth.chunk(i, lo, hi) if i >= telemetry_from
            else empty_frame("telemetry"),
            "inventory": _slice(inv_all, inv_t, lo, hi),
            "job": _slice(jobs_all, job_t, lo, hi),
        }


def _slice(frame: pl.DataFrame, times: np.ndarray, lo: int, hi: int) -> pl.DataFrame:
    a, b = np.searchsorted(times, [lo, hi], side="left")
    return frame.slice(int(a), int(b - a))


def describe(config: SimConfig) -> SimSummary:
    """Summarise what ``simulate(config)`` would produce (no telemetry is synthesised)."""
    p = plan(config)
    sched = p.schedule
    samples = -(-(sched.end_s - sched.start_s) // config.sample_interval_s)
    times = sched.start_s + np.arange(samples) * config.sample_interval_s
    rows = samples * p.layout.gpu_count
    for node, t0, t1 in sched.down:
        rows -= int(((times >= t0) & (times < t1)).sum()) * int(p.layout.node_gpus[node])
    return SimSummary(
        total_gpus=p.spec.total_gpus,
        gpus_by_pool_card=p.spec.gpus_by_pool_card(),
        jobs_generated=len(p.jobs),
        job_events=dict(sorted(Counter(e.event for e in sched.events).items())),
        inventory_rows=len(sched.inventory),
        telemetry_rows=rows,
        batches=p.batches,
    )


def write_jsonl(batches: Iterable[dict[str, pl.DataFrame]], out_dir: Path) -> dict[str, int]:
    """Write ``telemetry.jsonl``, ``inventory.jsonl`` and ``job.jsonl``; return line counts.

    One JSON object per line; ``time`` as RFC 3339 UTC with milliseconds
    (``2026-01-05T00:00:10.000Z``), nulls written as ``null``, inventory ``labels`` as a
    JSON object.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    counts: dict[str, int] = dict.fromkeys(RECORD_TYPES, 0)
    # written beside the files, renamed over them once all are whole: a run that fails
    # or is interrupted leaves the files of the run before as they were (they were
    # opened for writing first: emptied, whatever happened next)
    final = {t: out_dir / f"{t}.jsonl" for t in RECORD_TYPES}
    partial = {t: out_dir / f".{t}.jsonl.{os.getpid()}.tmp" for t in RECORD_TYPES}
    handles = {t: partial[t].open("wb") for t in RECORD_TYPES}
    done = False
    try:
        for batch in batches:
            for record_type in RECORD_TYPES:
                frame = batch[record_type]
                if frame.height == 0:
                    continue
                frame = frame.with_columns(pl.col("time").dt.strftime(TIME_FORMAT))
                if record_type == "inventory":
                    _write_inventory(frame, handles[record_type])
                else:
                    frame.write_ndjson(handles[record_type])
                counts[record_type] += frame.height
        done = True
    finally:
        for fh in handles.values():
            fh.close()
        for t in RECORD_TYPES:
            if done:
                os.replace(partial[t], final[t])
            else:
                with contextlib.suppress(OSError):
                    partial[t].unlink()
    return counts


def _write_inventory(frame: pl.DataFrame, fh: BinaryIO) -> None:
    """NDJSON with ``labels`` spliced in as an object rather than a JSON string."""
    others = [c for c in frame.columns if c != "labels"]
    lines = frame.select(
        pl.concat_str(
            pl.struct(others).struct.json_encode().str.strip_suffix("}"),
            pl.lit(',"labels":'),
            pl.col("labels").fill_null("null"),
            pl.lit("}\n"),
        ).alias("line")
    )["line"]
    text = "".join(lines.to_list())
    fh.write(text.encode())
