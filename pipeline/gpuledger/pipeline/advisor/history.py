"""What a replay needs, read from a warehouse through DuckDB, read-only.

- ``attempts``: every attempt overlapping the window (the ``attempts`` view: request,
  queue, team, priority, times, preemptibility, checkpoints, usage);
- ``allocations``: which GPUs each attempt held, with the fraction (``job_gpu`` for ended
  attempts, ``gpu_minute`` for the ones still running);
- ``nodes``: the inventory, derived from ``gpu_minute`` (the warehouse keeps no node
  inventory fact): a node's pool, card type, GPU count (distinct GPU indices seen) and
  whether it has NVLink (NVLink counters reported);
- ``grid``: per minute and GPU the state replay cannot change (``node_ok``: schedulable
  and not down; ``gpu_ok``: not unhealthy), from ``gpu_minute``, every ``step`` minutes;
- ``outages``: the same as intervals, for the scheduler (drain, down, GPU).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import duckdb
import polars as pl

from gpuledger.pipeline import query
from gpuledger.pipeline.columns import TIME_DTYPE

MAX_GRID_ROWS = 6_000_000  # GPU-minutes on the grid: beyond, sample every few minutes


# GPUs per attempt: ended attempts from job_gpu; running ones from gpu_minute, where a GPU
# shared by two jobs names one of them: the other (a running shared attempt with no GPU
# of its own in gpu_minute) takes the shared GPU of its node it overlaps most, with the
# rest of the GPU's allocation as its fraction.
ALLOCATIONS_SQL = """
WITH ended AS (SELECT job_id, attempt, node, gpu_index, fraction FROM job_gpu),
live AS (
    SELECT job_id, attempt, node, gpu_index,
           coalesce(max(alloc_fraction) FILTER (WHERE jobs_on_gpu = 1),
                    max(alloc_fraction / jobs_on_gpu)) AS fraction
    FROM gpu_minute WHERE job_id IS NOT NULL AND minute >= ? AND minute < ?
    GROUP BY ALL),
known AS (
    SELECT * FROM ended
    UNION ALL
    SELECT * FROM live WHERE (job_id, attempt) NOT IN (SELECT (job_id, attempt) FROM ended)),
missing AS (
    SELECT job_id, attempt, string_split(nodes, ',') AS nodes, started_at,
           coalesce(ended_at, ?) AS ended_at
    FROM attempts
    WHERE started_at IS NOT NULL AND nodes IS NOT NULL
      AND (job_id, attempt) NOT IN (SELECT (job_id, attempt) FROM known)),
shared AS (
    SELECT minute, node, gpu_index, alloc_fraction, job_id AS main FROM gpu_minute
    WHERE jobs_on_gpu = 2 AND minute >= ? AND minute < ?),
found AS (
    SELECT m.job_id, m.attempt, s.node, s.gpu_index,
           max(s.alloc_fraction - k.fraction) AS fraction, count(*) AS n
    FROM missing m
    JOIN shared s ON list_contains(m.nodes, s.node) AND s.minute >= m.started_at
                 AND s.minute < m.ended_at
    JOIN known k ON k.job_id = s.main AND k.node = s.node AND k.gpu_index = s.gpu_index
    GROUP BY m.job_id, m.attempt, s.node, s.gpu_index
    QUALIFY row_number() OVER (PARTITION BY m.job_id, m.attempt ORDER BY n DESC,
                                             s.node, s.gpu_index) = 1)
SELECT * FROM known
UNION ALL
SELECT job_id, attempt, node, gpu_index, fraction FROM found WHERE fraction > 0
"""


class HistoryError(ValueError):
    """The warehouse cannot be replayed (no facts, an empty window)."""


def open_read_only(warehouse: str | Path) -> duckdb.DuckDBPyConnection:
    """A read-only connection to the warehouse (the shared opener can replace this)."""
    try:
        return query.connect(warehouse)
    except query.QueryError as exc:
        raise HistoryError(str(exc)) from None


@dataclass
class History:
    """One window of a warehouse's history."""

    start: datetime
    end: datetime
    step_minutes: int
    attempts: pl.DataFrame
    allocations: pl.DataFrame
    nodes: pl.DataFrame
    grid: pl.DataFrame
    outages: pl.DataFrame
    gaps: list[str] = field(default_factory=list)

    @property
    def span_s(self) -> int:
        """Seconds in the window."""
        return int((self.end - self.start).total_seconds())


def _frame(con: duckdb.DuckDBPyConnection, sql: str, params: list[object]) -> pl.DataFrame:
    frame: pl.DataFrame = con.sql(sql, params=params).pl()
    return frame.with_columns(pl.col(pl.Datetime).cast(TIME_DTYPE))


def _utc(t: datetime) -> datetime:
    return t if t.tzinfo is not None else t.replace(tzinfo=UTC)


def load_history(warehouse: str | Path, since: datetime | None = None,
                 until: datetime | None = None, step_minutes: int | None = None) -> History:
    """Read the window ``[since, until)`` (default: everything) of ``warehouse``."""
    con = open_read_only(warehouse)
    try:
        lo, hi = con.sql("SELECT min(minute), max(minute) FROM gpu_minute").fetchall()[0]
        if lo is None or hi is None:
            raise HistoryError(f"{warehouse}: no GPU-minutes: nothing to replay")
        start = max(_utc(since), lo) if since is not None else lo
        end = min(_utc(until), hi + timedelta(minutes=1)) if until is not None else (
            hi + timedelta(minutes=1))
        start, end = start.astimezone(UTC), end.astimezone(UTC)
        if end <= start:
            first, last = lo.astimezone(UTC), (hi + timedelta(minutes=1)).astimezone(UTC)
            span = f"the data spans {first:%Y-%m-%d %H:%M} – {last:%Y-%m-%d %H:%M} UTC"
            if since is not None and _utc(since) >= last:
                raise HistoryError(f"{warehouse}: --since {_utc(since):%Y-%m-%d %H:%M} UTC "
                                   f"is after the data ends ({span})")
            raise HistoryError(f"{warehouse}: --until {_utc(until or last):%Y-%m-%d %H:%M} "
                               f"UTC is before the data starts ({span})")
        span_min = int((end - start).total_seconds() // 60)
        n_gpus = int(con.sql("SELECT count(DISTINCT (node, gpu_index)) FROM gpu_minute")
                     .fetchall()[0][0])
        step = step_minutes or max(1, -(-span_min * n_gpus // MAX_GRID_ROWS))
        window = [start, end]
        attempts = _frame(con, """
            SELECT * FROM attempts
            WHERE coalesce(submitted_at, queued_at) < ? AND coalesce(ended_at, 'infinity') > ?
            ORDER BY job_id, attempt""", [end, start])
        allocations = _frame(con, ALLOCATIONS_SQL, [*window, end, *window])
        nodes = _frame(con, """
            SELECT node, arg_max(pool, n) AS pool, arg_max(card_type, n) AS card_type,
                   max(gpus) AS gpus, bool_or(nvlink) AS nvlink
            FROM (SELECT node, pool, card_type, count(*) AS n,
                         count(DISTINCT gpu_index) AS gpus,
                         bool_or(nvlink_rx_bytes_s IS NOT NULL) AS nvlink
                  FROM gpu_minute WHERE minute >= ? AND minute < ? GROUP BY ALL)
            GROUP BY node ORDER BY node""", window)
        grid = _frame(con, f"""
            SELECT minute, node, gpu_index, pool, card_type,
                   coalesce(schedulable, true) AND coalesce(health, 'ok') <> 'down' AS node_ok,
                   coalesce(schedulable, true) AS schedulable,
                   coalesce(health, 'ok') = 'down' AS down,
                   NOT (state = 'unavailable' AND coalesce(schedulable, true)
                        AND coalesce(health, 'ok') <> 'down') AS gpu_ok
            FROM gpu_minute
            WHERE minute >= ? AND minute < ?
              AND (epoch(minute)::BIGINT // 60) % {int(step)} = 0""", window)
    except duckdb.Error as exc:
        raise HistoryError(f"{warehouse}: {exc}") from None
    finally:
        con.close()
    grid = grid.with_columns(pl.col("minute").cast(TIME_DTYPE))
    history = History(start, end, int(step), attempts, allocations, nodes, grid,
                      outages(grid, int(step)))
    history.gaps = gaps(history)
    return history


def outages(grid: pl.DataFrame, step: int) -> pl.DataFrame:
    """Runs of unavailable minutes: ``kind`` ``down`` / ``drain`` per node (``gpu_index``
    null) and ``gpu`` per GPU, as ``[start, end)``."""
    schema = {"node": pl.String(), "gpu_index": pl.Int64(), "kind": pl.String(),
              "start": TIME_DTYPE, "end": TIME_DTYPE}
    if grid.is_empty():
        return pl.DataFrame(schema=schema)
    per_node = grid.group_by("minute", "node").agg(
        pl.col("down").any(), (~pl.col("schedulable")).all().alias("drained"))
    node_rows = per_node.with_columns(
        pl.when(pl.col("down")).then(pl.lit("down"))
        .when(pl.col("drained")).then(pl.lit("drain")).alias("kind"),
        pl.lit(None, pl.Int64).alias("gpu_index")).filter(pl.col("kind").is_not_null())
    gpu_rows = grid.filter(pl.col("node_ok") & ~pl.col("gpu_ok")).select(
        "minute", "node", "gpu_index", pl.lit("gpu").alias("kind"))
    rows = pl.concat([node_rows.select("minute", "node", "gpu_index", "kind"), gpu_rows])
    if rows.is_empty():
        return pl.DataFrame(schema=schema)
    keys = ["node", "gpu_index", "kind"]
    gap = pl.col("minute").diff().over(keys) != pl.duration(minutes=step)
    return rows.sort([*keys, "minute"], nulls_last=True).with_columns(
        gap.fill_null(True).cum_sum().over(keys).alias("run")
    ).group_by([*keys, "run"]).agg(
        pl.col("minute").min().alias("start"),
        (pl.col("minute").max() + pl.duration(minutes=step)).alias("end"),
    ).select(list(schema)).sort("start", "node", "gpu_index", nulls_last=True)


def gaps(h: History) -> list[str]:
    """What the history lacks that a policy needs, and which answers that weakens."""
    a = h.attempts
    out: list[str] = []
    if a.is_empty():
        return ["no attempts in the window: every answer is empty"]
    if a["priority"].null_count() == a.height or a["priority"].n_unique() <= 1:
        out.append("no priorities: queues are served in submission order; queue wait by "
                   "queue, preemption lost work and who gains or loses are weakened")
    if a["preemptible"].null_count() == a.height:
        out.append("no preemptible flags: no attempt can be preempted for priority; "
                   "preemption lost work is weakened")
    if a["checkpointable"].null_count() == a.height:
        out.append("no checkpoint flags: preempted work is lost from the attempt start; "
                   "preemption lost work is weakened")
    elif (a.filter(pl.col("checkpointable").fill_null(False)).select(
            pl.col("checkpoints").fill_null(0).sum()).item() or 0) == 0 and a.filter(
            pl.col("checkpointable").fill_null(False)).height:
        out.append("checkpointable jobs but no checkpoint events: the checkpoint interval is "
                   "assumed (scheduler.checkpoint_minutes); preemption lost work is weakened")
    if a["borrowed"].null_count() == a.height:
        out.append("no borrowed flags: team quotas cannot be inferred; borrowing, reclaim and "
                   "fixed-quota answers are weakened (give quotas in the policy file)")
    if "used_gpu_hours" in a.columns and (a["used_gpu_hours"].fill_null(0.0) == 0).all():
        out.append("no GPU activity: used GPU-hours are weakened")
    if h.nodes.is_empty():
        out.append("no node inventory: nothing can be placed")
    return out
