"""The batch path: ``job_diagnosis`` for a whole warehouse from its ``gpu_minute`` files.

The files are read hour by hour in time order and fed to the same incremental functions
the streaming engine calls (:mod:`.diagnosis`); an attempt is finished as soon as the
hour of its end (``job_attempts``) has been read, so memory stays bounded by the attempts
running at once. Attempts still running at the end are finished with what there is.

Output: ``facts/job_diagnosis/date=…/job_diagnosis-…THH.parquet`` by the hour of each
attempt's last diagnosed minute (the table's previous files are replaced, so a re-run
writes the same files), and the catalog is republished so ``job_diagnosis`` is a view.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import polars as pl

from gpuledger.pipeline import query
from gpuledger.pipeline.advisor.diagnosis import (
    ATTEMPT,
    DEFAULT_CONFIG,
    JOB_DIAGNOSIS,
    DiagnosisConfig,
    DiagnosisState,
    finish,
    update,
)
from gpuledger.pipeline.advisor.history import HistoryError
from gpuledger.pipeline.advisor.patterns import CATALOGUE, PATTERNS, UNKNOWN
from gpuledger.pipeline.columns import TIME_DTYPE
from gpuledger.pipeline.generations import WHOLE
from gpuledger.pipeline.warehouse import FACTS, Warehouse, published_files

TABLE = "job_diagnosis"
SORT = ["job_id", "attempt", "pattern"]
UNSEEN_MIN_GPU_MINUTES = 0.01  # below: rounding, not minutes left out
COLUMNS = ["minute", "node", "gpu_index", "state", "alloc_fraction", "occupied_share",
           "jobs_on_gpu", "job_id",
           "attempt", "team", "queue", "job_type", "card_type", "activity", "telemetry_samples",
           "sm_active", "dram_active", "pcie_rx_bytes_s", "pcie_tx_bytes_s",
           "nvlink_rx_bytes_s", "nvlink_tx_bytes_s", "processes", "idle_threshold",
           "efficient_threshold"]


@dataclass
class Diagnosed:
    """The rows written (or that would be) and how many files."""

    rows: pl.DataFrame
    files: int


def _published(root: Path, table: str) -> list[tuple[str, Path]]:
    """(logical name, file) of ``table``'s files in the newest generation."""
    return [(logical, root / obj) for logical, obj in sorted(published_files(root).items())
            if logical.startswith(f"{FACTS}/{table}/")]


def _hours(root: Path) -> list[tuple[str, list[Path]]]:
    """gpu_minute files grouped by the hour they cover (a compacted day: by day), in time
    order."""
    groups: dict[str, list[Path]] = {}
    for logical, f in _published(root, "gpu_minute"):
        stamp = logical.rsplit("/", 1)[1].removeprefix("gpu_minute-")[:13]  # YYYY-MM-DDTHH
        groups.setdefault(stamp, []).append(f)
    return sorted(groups.items())


def _ended(root: Path) -> pl.DataFrame:
    files = [f for _logical, f in _published(root, "job_attempts")]
    if not files:
        return pl.DataFrame(schema={"job_id": pl.String(), "attempt": pl.Int64(),
                                    "ended_at": TIME_DTYPE})
    return pl.concat([pl.read_parquet(f, columns=["job_id", "attempt", "ended_at"])
                      for f in files], how="vertical_relaxed").drop_nulls("ended_at")


def diagnose_warehouse(root: Path, *, write: bool = True,
                       cfg: DiagnosisConfig = DEFAULT_CONFIG,
                       progress: Callable[[float], None] = lambda _f: None) -> Diagnosed:
    """Diagnose every attempt of the warehouse at ``root`` (module docstring)."""
    hours = _hours(root)
    if not (root / FACTS).is_dir():
        raise HistoryError(f"{root}: not a gpuledger warehouse (no facts/ folder)")
    if not hours:
        raise HistoryError(f"{root}: no GPU-minutes to diagnose")
    ended = _ended(root)
    state = DiagnosisState()
    parts: list[pl.DataFrame] = []
    for i, (stamp, files) in enumerate(hours):
        frame = pl.concat([pl.read_parquet(f, columns=COLUMNS) for f in files],
                          how="vertical_relaxed")
        state = update(state, frame, cfg)
        until = datetime.strptime(stamp, "%Y-%m-%dT%H").replace(tzinfo=UTC) + timedelta(hours=1)
        limit = pl.lit(until).cast(TIME_DTYPE)
        done = ended.filter(pl.col("ended_at") <= limit).join(state.meta, on=ATTEMPT,
                                                              how="semi")
        if not done.is_empty():
            state, rows = finish(state, done.select(*ATTEMPT, "ended_at"), cfg)
            parts.append(rows)
        progress((i + 1) / len(hours))
    # still running (ended_at null), or ended after the last GPU-minute read
    rest = state.meta.select(ATTEMPT).join(ended, on=ATTEMPT, how="left")
    state, rows = finish(state, rest, cfg)
    parts.append(rows)
    out = pl.concat(parts, how="vertical_relaxed") if parts else pl.DataFrame(
        schema=JOB_DIAGNOSIS)
    out = with_unseen(out, _attempts(root))
    written = _write(root, out) if write else 0
    return Diagnosed(out.sort(SORT), written)


def _write(root: Path, rows: pl.DataFrame) -> int:
    wh = Warehouse(root)
    for old in [k for k in wh.publisher.unit(WHOLE).files if k.startswith(f"{FACTS}/{TABLE}/")]:
        wh.publisher.drop(WHOLE, old)  # replaced in the same generation
    wh.ensure_schema(TABLE, JOB_DIAGNOSIS)
    for (hour,), part in rows.with_columns(
            (pl.coalesce("ended_at", pl.col("last_minute") + pl.duration(minutes=1))
             - pl.duration(milliseconds=1)).dt.truncate("1h").alias("_h")
    ).group_by("_h", maintain_order=True):
        wh.write_part(TABLE, hour, part.drop("_h"), SORT)
    wh.publish_catalog()
    return wh.files_written


def _attempts(root: Path) -> pl.DataFrame:
    """Per attempt that ran: its attributes and idle + inefficient GPU-hours (``attempts``)."""
    try:
        con = query.connect(root)
    except query.QueryError as exc:
        raise HistoryError(str(exc)) from None
    try:
        frame: pl.DataFrame = con.sql("""
            SELECT job_id, attempt, team, queue, job_type, card_type, gpus, started_at,
                   ended_at, coalesce(idle_gpu_hours, 0) + coalesce(inefficient_gpu_hours, 0)
                   AS waste_gpu_hours
            FROM attempts WHERE started_at IS NOT NULL""").pl()
    finally:
        con.close()
    return frame.with_columns(pl.col(pl.Datetime).cast(TIME_DTYPE))


def _unseen_words(gpu_hours: pl.Expr) -> pl.Expr:
    return (gpu_hours * 60).round(0).cast(pl.Int64).cast(pl.String) + pl.lit(
        " GPU-minutes on a GPU shared with another job (no GPU-minute row names this attempt)")


def with_unseen(rows: pl.DataFrame, attempts: pl.DataFrame) -> pl.DataFrame:
    """Classify as ``unknown`` the idle and inefficient GPU-hours ``attempts`` counts but no
    GPU-minute row names the attempt on (``gpu_minute`` names one job per GPU, so the other
    job of a shared GPU is not named): added to the attempt's ``unknown`` row, or a new one
    spanning the attempt; shares recomputed."""
    seen = rows.group_by(ATTEMPT).agg(pl.col("gpu_hours").sum().alias("_seen"))
    gap = attempts.join(seen, on=ATTEMPT, how="left").with_columns(
        (pl.col("waste_gpu_hours") - pl.col("_seen").fill_null(0.0)).alias("_gap")
    ).filter(pl.col("_gap") * 60 >= UNSEEN_MIN_GPU_MINUTES)
    if gap.is_empty():
        return rows
    unknown = rows.filter(pl.col("pattern") == UNKNOWN)
    add = rows.join(gap.join(unknown, on=ATTEMPT, how="semi").select(*ATTEMPT, "_gap"),
                    on=ATTEMPT, how="left").with_columns(
        pl.when(pl.col("pattern") == UNKNOWN).then(pl.col("_gap")).alias("_gap"))
    topped = add.with_columns(
        (pl.col("gpu_hours") + pl.col("_gap").fill_null(0.0)).alias("gpu_hours"),
        pl.when(pl.col("_gap").is_not_null())
        .then(pl.col("evidence") + pl.lit("; ") + _unseen_words(pl.col("_gap")))
        .otherwise(pl.col("evidence")).alias("evidence")).drop("_gap")
    last = rows["last_minute"].max()
    end = pl.lit(last, TIME_DTYPE) if last is not None else pl.col("started_at")
    first = pl.col("started_at").dt.truncate("1m")
    new = gap.join(unknown, on=ATTEMPT, how="anti").with_columns(
        pl.lit(UNKNOWN).alias("pattern"), pl.col("_gap").alias("gpu_hours"),
        first.alias("first_minute"),
        pl.max_horizontal(first, pl.coalesce(
            (pl.col("ended_at") - pl.duration(milliseconds=1)).dt.truncate("1m"), end))
        .alias("last_minute"),
        _unseen_words(pl.col("_gap")).alias("evidence"),
        pl.lit(CATALOGUE[UNKNOWN].remedy).alias("remedy"),
    ).with_columns(pl.coalesce("ended_at", pl.col("last_minute") + pl.duration(minutes=1))
                   .dt.date().alias("date"))
    new = new.select([pl.col(c) if c in new.columns else pl.lit(None).alias(c)
                      for c in JOB_DIAGNOSIS]).cast(dict(JOB_DIAGNOSIS))  # type: ignore[arg-type]
    return pl.concat([topped, new]).with_columns(
        (pl.col("gpu_hours") / pl.col("gpu_hours").sum().over(ATTEMPT)).alias("share")
    ).sort(*ATTEMPT, "gpu_hours", descending=[False, False, True])


def summary_text(result: Diagnosed, top: int = 10) -> str:
    """GPU-hours per pattern, then the attempts with the most diagnosed GPU-hours."""
    rows = result.rows
    if rows.is_empty():
        return "no idle or inefficient GPU-minutes to diagnose"
    total = float(rows["gpu_hours"].sum())
    by = rows.group_by("pattern").agg(pl.col("gpu_hours").sum(),
                                      pl.struct(ATTEMPT).n_unique().alias("attempts"))
    order = {p: i for i, p in enumerate(PATTERNS)}
    lines = [f"Idle and inefficient GPU-hours by pattern ({total:,.1f} GPU-hours, "
             f"{rows.select(pl.struct(ATTEMPT).n_unique()).item():,} attempts):"]
    for pattern, hours, attempts in sorted(by.iter_rows(), key=lambda r: order[r[0]]):
        lines.append(f"  {pattern:<22} {hours:>10,.1f}  {100 * hours / total:5.1f} %  "
                     f"{attempts:>6,} attempts")
    known = rows.filter(pl.col("pattern") != UNKNOWN).sort("gpu_hours", descending=True)
    if not known.is_empty():
        lines.append(f"Top {min(top, known.height)} (attempt, pattern: evidence → remedy):")
        for r in known.head(top).iter_rows(named=True):
            lines.append(f"  {r['job_id']}/{r['attempt']} {r['pattern']} "
                         f"{r['gpu_hours']:.1f} GPU-h: {r['evidence']} → {r['remedy']}")
    if result.files:
        lines.append(f"wrote {result.files} file(s); query: SELECT * FROM job_diagnosis")
    return "\n".join(lines)
