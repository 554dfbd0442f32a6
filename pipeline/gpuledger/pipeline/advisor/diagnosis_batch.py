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
from gpuledger.pipeline.advisor.patterns import PATTERNS, UNKNOWN
from gpuledger.pipeline.columns import TIME_DTYPE
from gpuledger.pipeline.warehouse import FACTS, Warehouse

TABLE = "job_diagnosis"
SORT = ["job_id", "attempt", "pattern"]
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


def _hours(root: Path) -> list[tuple[str, list[Path]]]:
    """gpu_minute files grouped by the hour they cover, in time order."""
    files = sorted((root / FACTS / "gpu_minute").glob("date=*/gpu_minute-*.parquet"))
    groups: dict[str, list[Path]] = {}
    for f in files:
        stamp = f.name.removeprefix("gpu_minute-")[:13]  # YYYY-MM-DDTHH
        groups.setdefault(stamp, []).append(f)
    return sorted(groups.items())


def _ended(root: Path) -> pl.DataFrame:
    files = sorted((root / FACTS / "job_attempts").glob("**/*.parquet"))
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
            state, rows = finish(state, done.select(ATTEMPT), cfg)
            parts.append(rows)
        progress((i + 1) / len(hours))
    state, rows = finish(state, state.meta.select(ATTEMPT), cfg)
    parts.append(rows)
    out = pl.concat(parts, how="vertical_relaxed") if parts else pl.DataFrame(
        schema=JOB_DIAGNOSIS)
    written = _write(root, out) if write else 0
    return Diagnosed(out.sort(SORT), written)


def _write(root: Path, rows: pl.DataFrame) -> int:
    wh = Warehouse(root)
    folder = wh.table_dir(TABLE)
    for old in folder.glob("date=*/*.parquet"):
        old.unlink()
    wh.ensure_schema(TABLE, JOB_DIAGNOSIS)
    for (hour,), part in rows.with_columns(
            (pl.col("ended_at") - pl.duration(milliseconds=1)).dt.truncate("1h").alias("_h")
    ).group_by("_h", maintain_order=True):
        wh.write_part(TABLE, hour, part.drop("_h"), SORT)
    wh.publish_catalog()
    return wh.files_written


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
