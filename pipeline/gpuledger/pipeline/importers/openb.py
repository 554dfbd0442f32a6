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

A window (``window_from_s``, ``window_to_s``, whole minutes of the trace) keeps long
traces tractable: pods created in the window keep their own times; pods alive at the
window start enter it as submitted (and started, if they were) at the start, since the
processor begins its minutes at its first event (with ``real_times``, at their own
times, for a processor told to begin at the window start). A warning names them: their
``job_attempts`` GPU-hours (and queue wait, without ``real_times``) count from the
window start only, and a later window imported into the same warehouse does not add an
earlier window's part of an attempt across their boundary; the per-minute and hourly
facts are whole. Events after the window end are dropped, so such pods are still
running at its end.

Refused with one line (:class:`OpenbImportError`): a damaged file or row, a pod name
listed twice, a window outside the trace or not on whole minutes, and a ``start`` that
puts the imported events before 2000 or more than an hour after now (the processor would
reject every one of them).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import polars as pl

from gpuledger.bridges.placement import MAX_GPUS_PER_NODE, Placer
from gpuledger.pipeline.columns import conform
from gpuledger.pipeline.config import Windows
from gpuledger.pipeline.importers.csv_text import csv_rows
from gpuledger.pipeline.validate import MIN_TIME

log = logging.getLogger(__name__)

GPU_MEMORY_MIB = {"P100": 16_384.0, "V100M16": 16_384.0, "V100M32": 32_768.0,
                  "T4": 15_360.0, "A10": 23_028.0, "G2": 16_384.0, "G3": 16_384.0}
DEFAULT_GPU_MEMORY_MIB = 16_384.0
PRIORITY = {"Guaranteed": 100, "LS": 90, "Burstable": 50, "BE": 10}
DEFAULT_START = datetime(2026, 1, 1, tzinfo=UTC)
POOL = "openb"
MAX_FUTURE_S = float(Windows().max_future_s)
"""How far past now an imported event may be (the default ``windows.max_future_s``, which
history imports use): later ones are rejected."""
MINUTE_SLACK_S = 0.01
"""A window bound this close to a whole minute is that minute (decimal hours cannot
spell most minutes exactly: 1 min = 0.0166... h)."""


@dataclass
class OpenbImport:
    """The events of an import and what could not be imported."""

    frames: dict[str, pl.DataFrame]
    window_start: datetime | None = None
    """The window's start, when a window from after the trace's start was asked for: the
    processor's first minute (with ``real_times``, it must be told: see
    :func:`load_openb`)."""
    window_end: datetime | None = None
    """The window's end, when a window was asked for: every minute before it is closed
    (pods still running then stay running)."""
    pods_total: int = 0
    pods_cpu_only: int = 0
    pods_imported: int = 0
    unplaced: list[str] = field(default_factory=list)
    began_before: list[str] = field(default_factory=list)
    """Pods created before the window's start and alive at it: they enter the window
    submitted (and started) at its start (at their own times with ``real_times``)."""


class OpenbImportError(ValueError):
    """A trace file is unusable: ``file[:line]: reason`` (the import is refused whole)."""


MAX_TRACE_S = 1e10
"""Trace times are seconds from its start: beyond this (three centuries) is not a time."""

# column → (dtype, required, lowest, highest) of what the importer reads
NODE_COLUMNS: dict[str, tuple[type[pl.DataType], bool, float | None, float | None]] = {
    "sn": (pl.String, True, None, None),
    "gpu": (pl.Int64, True, 0, MAX_GPUS_PER_NODE),
    "model": (pl.String, False, None, None),
}
POD_COLUMNS: dict[str, tuple[type[pl.DataType], bool, float | None, float | None]] = {
    "name": (pl.String, True, None, None),
    "num_gpu": (pl.Int64, True, 0, MAX_GPUS_PER_NODE),
    "gpu_milli": (pl.Int64, True, 0, 1000),
    "qos": (pl.String, False, None, None),
    "pod_phase": (pl.String, False, None, None),
    "creation_time": (pl.Float64, True, 0, MAX_TRACE_S),
    "deletion_time": (pl.Float64, True, 0, MAX_TRACE_S),
    "scheduled_time": (pl.Float64, False, 0, MAX_TRACE_S),
}


def read_table(path: Path, columns: dict[str, tuple[type[pl.DataType], bool, float | None,
                                                       float | None]]) -> pl.DataFrame:
    """The columns the importer reads, in their types; the first bad row (not a number,
    missing where required, out of range) refuses the file with its line number."""
    try:
        raw = pl.read_csv(path, infer_schema=False)
    except pl.exceptions.NoDataError:
        raise OpenbImportError(f"{path}: empty file") from None
    except pl.exceptions.PolarsError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        where = _first_long_line(path)  # Polars names no line
        raise OpenbImportError(
            f"{path}:{where[0]}: {where[1]} fields, the header has {where[2]}"
            if where is not None else f"{path}: not a readable CSV file ({first})") from None
    missing = [c for c in columns if c not in raw.columns]
    if missing:
        raise OpenbImportError(f"{path}: missing column(s) {', '.join(missing)} (got "
                               f"{', '.join(raw.columns) or 'none'})")
    # a blank line (an editor's, a trailing one) is no row: it refused the trace ("column
    # name: None is missing"); the lines of the others are kept for messages
    lines = pl.Series("_line", range(2, raw.height + 2), dtype=pl.Int64)
    blank = raw.select(pl.all_horizontal(pl.all().is_null() | (pl.all().str.strip_chars()
                                                                == ""))).to_series()
    if blank.any():
        raw, lines = raw.filter(~blank), lines.filter(~blank)
    out = []
    for name, (dtype, required, lowest, highest) in columns.items():
        stripped = pl.col(name).str.strip_chars()
        text = pl.when(stripped == "").then(None).otherwise(stripped)
        both = raw.select(text.is_not_null().alias("given"),
                          text.cast(dtype, strict=False).alias(name))
        given, value = both.get_column("given"), both.get_column(name)
        problems = [
            (given & value.is_null(), "is not " + ("a whole number" if dtype == pl.Int64
                                                   else "a number")),
            (~given if required else None, "is missing"),
        ]
        if lowest is not None and highest is not None:
            out_of = (value < lowest) | (value > highest) | (
                value.is_nan() if dtype == pl.Float64 else False)
            problems.append((out_of.fill_null(False), f"is not in {lowest:g}-{highest:g}"))
        for mask, what in problems:
            if mask is None or not mask.any():
                continue
            row = int(mask.arg_true()[0])
            shown = raw.get_column(name)[row]
            raise OpenbImportError(f"{path}:{lines[row]}: column {name}"
                                   + (f" {what}" if shown is None else f": {shown!r} {what}"))
        out.append(value)
    return pl.DataFrame([*out, lines])


def _first_long_line(path: Path) -> tuple[int, int, int] | None:
    """(line, fields, the header's) of the first row with more fields than the header."""
    try:
        rows = csv_rows(path, OpenbImportError)
        _, header = next(rows, (0, []))
        return next(((line, len(fields), len(header)) for line, fields in rows
                     if len(fields) > len(header)), None)
    except (OSError, OpenbImportError):
        return None


POD_RULES: list[tuple[pl.Expr, str]] = [
    (pl.col("deletion_time") < pl.col("creation_time"),
     "deletion_time {deletion_time} is before creation_time {creation_time}"),
    (pl.col("scheduled_time") < pl.col("creation_time"),
     "scheduled_time {scheduled_time} is before creation_time {creation_time}"),
    (pl.col("scheduled_time") > pl.col("deletion_time"),
     "scheduled_time {scheduled_time} is after deletion_time {deletion_time}"),
    ((pl.col("num_gpu") > 0) & (pl.col("gpu_milli") < 1),
     "gpu_milli {gpu_milli} with num_gpu {num_gpu}: a GPU pod uses 1-1000 thousandths"),
    ((pl.col("num_gpu") > 1) & (pl.col("gpu_milli") < 1000),
     "gpu_milli {gpu_milli} with num_gpu {num_gpu}: only one-GPU pods share a GPU "
     "(gpu_milli < 1000)"),
]
"""What a pod row must not say (the published trace never does): the first row that does
refuses the file, with its line."""


def check_pods(path: Path, pods: pl.DataFrame) -> None:
    """Refuse ``pods`` (read by :func:`read_table`) at its first row that breaks one of
    :data:`POD_RULES`, naming the line and the values."""
    for rule, what in POD_RULES:
        mask = pods.select(rule.fill_null(False)).to_series()
        if mask.any():
            row = int(mask.arg_true()[0])
            values = {k: _plain(v) for k, v in pods.row(row, named=True).items()}
            raise OpenbImportError(f"{path}:{pods['_line'][row]}: " + what.format(**values))


def _plain(value: object) -> object:
    """A time as it was written: 2758084.5, 2758084 (``:g`` showed 2.75808e+06 for both
    sides of "is before")."""
    if isinstance(value, float) and math.isfinite(value):
        return int(value) if value.is_integer() else value
    return value


def check_names(path: Path, pods: pl.DataFrame) -> None:
    """Refuse ``pods`` at the first row that repeats an earlier pod's name."""
    again = pods.select(pl.col("name").is_first_distinct().not_()).to_series()
    if again.any():
        row = int(again.arg_true()[0])
        name = pods["name"][row]
        first = int((pods["name"] == name).arg_true()[0])
        raise OpenbImportError(f"{path}:{pods['_line'][row]}: pod {name!r} appears twice "
                               f"(first on line {pods['_line'][first]}); names must be "
                               "unique")


def whole_minute(seconds: float, what: str) -> float:
    """``seconds`` (a window bound) as a whole minute, or :class:`OpenbImportError`."""
    minute = round(seconds / 60.0) * 60.0
    if abs(seconds - minute) > MINUTE_SLACK_S:
        raise OpenbImportError(
            f"the window {what} {seconds / 3600:,.8g} h ({seconds:,.6g} s) after the "
            "trace's start, inside a minute: --from-hours and --hours must give whole "
            "minutes (multiples of 1/60 h)")
    return minute


def check_start(start: datetime, first_s: float, last_s: float, now: datetime) -> None:
    """Refuse a ``start`` that puts the events from ``first_s`` to ``last_s`` (seconds of
    the trace) where the processor rejects them: before 2000, or more than
    :data:`MAX_FUTURE_S` after ``now``."""
    first, last = start + timedelta(seconds=first_s), start + timedelta(seconds=last_s)
    limit = now + timedelta(seconds=MAX_FUTURE_S)
    if first < MIN_TIME or last > limit:
        raise OpenbImportError(
            f"the start {start:%Y-%m-%dT%H:%MZ} (--start) puts the imported events from "
            f"{first:%Y-%m-%d %H:%M} to {last:%Y-%m-%d %H:%M} UTC: event times must lie "
            f"from {MIN_TIME:%Y-%m-%d} to an hour after now ({limit:%Y-%m-%d %H:%M} UTC), "
            "else they are rejected")


def load_openb(
    nodes_csv: Path, pods_csv: Path, *, start: datetime = DEFAULT_START,
    window_from_s: float | None = None, window_to_s: float | None = None,
    now: datetime | None = None, real_times: bool = False,
) -> OpenbImport:
    """Read the trace and turn it into inventory and job event frames
    (:class:`OpenbImportError` when a file cannot be read as the trace's, or the window
    or ``start`` cannot be imported; ``now``: the wall clock, for the latter).

    ``real_times``: the pods alive at the window's start are submitted (and started) at
    their own times, before the window, so that their attempts keep their real queue
    wait and start. The processor must then begin its minutes at ``window_start``
    (``processor.begin_at(window_start)`` before the events, as ``import openb`` does):
    it would otherwise close the minutes before the window from the earliest event on.
    Off, they enter the window at its start."""
    nodes = read_table(nodes_csv, NODE_COLUMNS).filter(pl.col("gpu") > 0).sort("sn")
    pods = read_table(pods_csv, POD_COLUMNS)
    check_pods(pods_csv, pods)
    check_names(pods_csv, pods)
    twice = nodes.filter(pl.col("sn").is_duplicated())
    if twice.height:
        raise OpenbImportError(f"{nodes_csv}: node {twice['sn'][0]!r} appears twice")
    lo = float(window_from_s) if window_from_s is not None else 0.0
    gpu_pods = pods.filter(pl.col("num_gpu") > 0)
    last = gpu_pods["deletion_time"].max()
    if lo > 0 and isinstance(last, (int, float)) and lo >= last:
        raise OpenbImportError(
            f"the window starts {lo / 3600:,.6g} h after the trace's start, at or after "
            f"its end: its last GPU pod ends {last / 3600:,.1f} h after the start")
    if window_to_s is not None and isinstance(last, (int, float)) and window_to_s >= last:
        window_to_s = None  # a window past the trace's end ends where the trace does
    lo = whole_minute(lo, "starts")
    if window_to_s is not None:
        window_to_s = whole_minute(float(window_to_s), "ends")
    hi = float(window_to_s) if window_to_s is not None else float("inf")
    ends = float(last) if isinstance(last, (int, float)) else lo
    alive = gpu_pods.filter((pl.col("deletion_time") > lo) & (pl.col("creation_time") < hi))
    earliest = alive["creation_time"].min() if real_times and alive.height else None
    first = min(lo, float(earliest)) if isinstance(earliest, (int, float)) else lo
    check_start(start, first, min(ends, hi), now or datetime.now(UTC))
    result = OpenbImport({}, pods_total=pods.height,
                         pods_cpu_only=pods.height - gpu_pods.height,
                         window_start=start + timedelta(seconds=lo) if lo > 0 else None,
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
    floor = 0.0 if real_times else lo  # what began earlier enters the window at this time
    for pod in gpu_pods.iter_rows(named=True):
        created, deleted = float(pod["creation_time"]), float(pod["deletion_time"])
        scheduled = pod["scheduled_time"]
        if deleted <= lo or created >= hi:
            continue
        result.pods_imported += 1
        if created < lo:
            result.began_before.append(pod["name"])
        qos = pod["qos"]
        attrs = {"team": "default", "user": None, "queue": qos, "pool": POOL,
                 "priority": PRIORITY.get(qos, 50),
                 "job_type": "training" if qos == "BE" else "inference",
                 "gpus": pod["num_gpu"], "card_type": None, "gpu_mem_mib": None,
                 "preemptible": qos == "BE", "checkpointable": False}
        job_id = pod["name"]
        rows.append({"time": at(max(created, floor)), "event": "submitted",
                     "job_id": job_id, **attrs})
        placed = placements.get(job_id)
        if scheduled is not None and float(scheduled) >= hi:
            continue   # scheduled after the window: pending at its end (submitted only)
        if scheduled is not None and placed:
            rows.append({"time": at(max(float(scheduled), floor)), "event": "started",
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
    if result.began_before:
        cut = result.began_before
        log.warning(
            "openb: %s pod(s) began before the window's start at %s h (e.g. %s): %s "
            "job_attempts counts their GPU-hours from there only and does not add an "
            "earlier window's part of them imported into the same warehouse (gpu_hourly "
            "has it; import one window over both for whole attempts)",
            f"{len(cut):,}", f"{lo / 3600:,.8g}", ", ".join(cut[:5]),
            "they keep their own queue wait and start, but" if real_times else
            "they enter it submitted (and started) at its start, so their queue wait "
            "counts from there, and")
    return result
