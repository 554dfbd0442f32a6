"""What a replay needs, read from a warehouse through DuckDB, read-only.

- ``attempts``: every attempt overlapping the window (the ``attempts`` view: request,
  queue, team, priority, times, preemptibility, checkpoints, usage);
- ``allocations``: which GPUs each attempt held, with the fraction (``job_gpu`` for ended
  attempts, ``gpu_minute`` for the ones still running);
- ``nodes``: the inventory, derived from the GPU-minutes (the warehouse keeps no node
  inventory fact): a node's pool (the one it held most minutes), card type, GPU count
  (distinct GPU indices seen) and whether it has NVLink (NVLink counters reported);
- ``grid``: per minute and GPU the state replay cannot change (``node_ok``: schedulable
  and not down; ``gpu_ok``: not unhealthy), from the GPU-minutes, every ``step`` minutes
  counted from the window start (the replays' frag(k) and blocked demand are sampled on
  it, each sample standing for the ``step`` minutes it starts, the last one for the
  minutes left);
- ``outages``: the runs of unavailable minutes (drain, down, GPU) as intervals, for the
  scheduler, and ``excluded``: the runs of minutes a GPU's allocation does not count
  (node down, GPU unhealthy), both from every minute, whatever the step;
- ``available``: available GPU-hours per pool, from every minute;
- ``blocked_facts``, ``frag_facts``: blocked demand (``blocked_minute``) by pool and team,
  and frag(k) sums (``frag_minute``) by hour, pool and card type: what was observed;
- ``known``: the teams, pools, card types and job types of the warehouse (a policy file
  naming another is refused).

The GPU-minutes are read as runs (``gpu_runs``: a span of identical minutes of a GPU
without telemetry is one row) wherever minutes are counted or sampled, and expanded only
for the unavailable ones: a scheduler-only history of months is millions of spans but
billions of minutes.

The window's bounds are whole minutes (the GPU-minute facts are per minute): a bound with
seconds is refused, as is a ``step`` longer than the window.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import duckdb
import polars as pl

from gpuledger.cli.errors import CliError
from gpuledger.pipeline import query
from gpuledger.pipeline.columns import TIME_DTYPE
from gpuledger.pipeline.facts.fragmentation import FRAG_KS
from gpuledger.pipeline.location import check_location

MAX_GRID_ROWS = 6_000_000  # GPU-minutes on the grid: beyond, sample every few minutes
RUN_SCHEMA = pl.Schema({"node": pl.String(), "gpu_index": pl.Int64(), "start": TIME_DTYPE,
                        "end": TIME_DTYPE})
BLOCKED_FACTS = pl.Schema({"pool": pl.String(), "team": pl.String(),
                           "blocked_gpu_hours": pl.Float64()})
FRAG_FACTS = pl.Schema({"hour": TIME_DTYPE, "pool": pl.String(), "card_type": pl.String(),
                        **{f"frag_{k}_sum": pl.Float64() for k in FRAG_KS},
                        **{f"frag_{k}_n": pl.Int64() for k in FRAG_KS}})
STATE_COLUMNS = """node, gpu_index, pool, card_type,
           coalesce(schedulable, true) AND coalesce(health, 'ok') <> 'down' AS node_ok,
           coalesce(schedulable, true) AS schedulable,
           coalesce(health, 'ok') = 'down' AS down,
           NOT (state = 'unavailable' AND coalesce(schedulable, true)
                AND coalesce(health, 'ok') <> 'down') AS gpu_ok"""
STATE_SQL = f"""
    SELECT minute, {STATE_COLUMNS}
    FROM gpu_minute WHERE minute >= ? AND minute < ?"""
"""Per GPU-minute of the window, the state a replay cannot change."""
_RUN_END = "minute + minutes * INTERVAL 1 MINUTE"
RUNS_SQL = f"""
    SELECT *, datediff('minute', greatest(minute, ?::TIMESTAMPTZ),
                       least({_RUN_END}, ?::TIMESTAMPTZ)) AS in_window
    FROM gpu_runs WHERE minute < ? AND {_RUN_END} > ?"""
"""The runs of GPU-minutes (``gpu_runs``) that overlap the window, with ``in_window``, how
many of their minutes it holds. Parameters: start, end, end, start. A history without
telemetry is mostly spans of thousands of minutes: counting them as runs reads the
openb trace's 1.3 billion GPU-minutes in seconds instead of minutes."""


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


def local_folder(warehouse: str | Path) -> Path | None:
    """The warehouse's folder when it is a local one (None: a bucket, or not a location)."""
    try:
        where = check_location(warehouse)
    except CliError:
        return None
    return where if isinstance(where, Path) else None


def unreadable_folder(root: Path, tables: Iterable[str] | None = None) -> Path | None:
    """The first folder under ``root``'s ``facts/`` that cannot be listed or entered: the
    folder itself, a table's (of ``tables``, or every one) or a day's in one; None when
    all can (or there is no ``facts/``)."""
    facts = root / "facts"
    if not facts.is_dir():
        return None
    if not os.access(facts, os.R_OK | os.X_OK):
        return facts
    names = (sorted(t.name for t in facts.iterdir() if t.is_dir()) if tables is None
             else tables)
    for name in names:
        table = facts / name
        if not table.is_dir():
            continue
        if not os.access(table, os.R_OK | os.X_OK):
            return table
        for day in sorted(table.iterdir()):
            if day.is_dir() and not os.access(day, os.R_OK | os.X_OK):
                return day
    return None


def check_folder(warehouse: str | Path) -> None:
    """A local warehouse that is a file, or whose ``facts/`` folders cannot be read, in
    one line (DuckDB says "no files found" for a folder it may not read)."""
    folder = local_folder(warehouse)
    if folder is None:
        return
    if folder.is_file():
        raise HistoryError(f"{warehouse}: a file, not a warehouse folder")
    denied = unreadable_folder(folder)
    if denied is not None:
        raise HistoryError(f"{denied}: permission denied (the warehouse cannot be read)")


def open_read_only(warehouse: str | Path) -> duckdb.DuckDBPyConnection:
    """A read-only connection to the warehouse (the shared opener can replace this)."""
    check_folder(warehouse)
    try:
        return query.connect(warehouse)
    except query.QueryError as exc:
        raise HistoryError(str(exc)) from None


def whole_minute(t: datetime | None, name: str) -> datetime | None:
    """``t`` in UTC, refused (HistoryError naming ``name``) unless on a whole minute."""
    if t is None:
        return None
    t = _utc(t).astimezone(UTC)
    if t.second or t.microsecond:
        floor = t.replace(second=0, microsecond=0)
        raise HistoryError(
            f"{name} {t:%Y-%m-%dT%H:%M:%S}Z: not on a whole minute (the GPU-minute facts "
            f"are per minute); give {floor:%Y-%m-%dT%H:%MZ} or "
            f"{floor + timedelta(minutes=1):%Y-%m-%dT%H:%MZ}")
    return t


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
    excluded: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=RUN_SCHEMA))
    available: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(
        schema={"pool": pl.String(), "available_gpu_hours": pl.Float64()}))
    blocked_facts: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(
        schema=BLOCKED_FACTS))
    frag_facts: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=FRAG_FACTS))
    known: dict[str, set[str]] = field(default_factory=dict)
    """``team``, ``pool``, ``job_type`` → the names the warehouse has; ``card_type`` →
    ``pool/card`` pairs and bare card types."""

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
    since, until = whole_minute(since, "--since"), whole_minute(until, "--until")
    con = open_read_only(warehouse)
    try:
        lo, hi = con.sql("SELECT min(minute), max(minute + (minutes - 1) * INTERVAL 1 MINUTE) "
                         "FROM gpu_runs").fetchall()[0]
        if lo is None or hi is None:
            raise HistoryError(f"{warehouse}: no GPU-minutes: nothing to replay")
        start = max(since, lo) if since is not None else lo
        end = min(until, hi + timedelta(minutes=1)) if until is not None else (
            hi + timedelta(minutes=1))
        start, end = start.astimezone(UTC), end.astimezone(UTC)
        if end <= start:
            first, last = lo.astimezone(UTC), (hi + timedelta(minutes=1)).astimezone(UTC)
            span = f"the data spans {first:%Y-%m-%d %H:%M} – {last:%Y-%m-%d %H:%M} UTC"
            if since is not None and since >= last:
                raise HistoryError(f"{warehouse}: --since {since:%Y-%m-%d %H:%M} UTC "
                                   f"is after the data ends ({span})")
            raise HistoryError(f"{warehouse}: --until {until or last:%Y-%m-%d %H:%M} "
                               f"UTC is before the data starts ({span})")
        span_min = int((end - start).total_seconds() // 60)
        if step_minutes is not None and step_minutes > span_min:
            raise HistoryError(f"--step {step_minutes}: longer than the window ({span_min:,} "
                               f"minutes, {start:%Y-%m-%d %H:%M} – {end:%Y-%m-%d %H:%M} UTC)")
        n_gpus = int(con.sql("SELECT count(DISTINCT (node, gpu_index)) FROM gpu_runs")
                     .fetchall()[0][0])
        step = step_minutes or max(1, -(-span_min * n_gpus // MAX_GRID_ROWS))
        window = [start, end]
        runs_window = [start, end, end, start]  # RUNS_SQL's
        attempts = _frame(con, """
            SELECT * FROM attempts
            WHERE coalesce(submitted_at, queued_at) < ? AND coalesce(ended_at, 'infinity') > ?
            ORDER BY job_id, attempt""", [end, start])
        allocations = _frame(con, ALLOCATIONS_SQL, [*window, end, *window])
        nodes = _frame(con, f"""
            SELECT node, arg_max(pool, n) AS pool, arg_max(card_type, n) AS card_type,
                   max(gpus) AS gpus, bool_or(nvlink) AS nvlink
            FROM (SELECT node, pool, card_type, sum(in_window) AS n,
                         count(DISTINCT gpu_index) AS gpus,
                         bool_or(nvlink_rx_bytes_s IS NOT NULL) AS nvlink
                  FROM ({RUNS_SQL}) GROUP BY node, pool, card_type)
            GROUP BY node ORDER BY node""", runs_window)
        # the sampled grid: every step minutes counted from the window start; a span gives
        # only the grid's minutes it holds
        origin, every = int(start.timestamp()), int(step) * 60
        first = (f"to_timestamp({origin} + (epoch(greatest(minute, ?::TIMESTAMPTZ))::BIGINT"
                 f" - {origin} + {every - 1}) // {every} * {every})")
        grid = _frame(con, f"""
            SELECT minute, {STATE_COLUMNS} FROM ({RUNS_SQL})
            WHERE minutes = 1 AND (epoch(minute)::BIGINT - {origin}) % {every} = 0
            UNION ALL
            SELECT minute, {STATE_COLUMNS} FROM (
                SELECT * EXCLUDE (minute), unnest(generate_series(
                    {first}, least({_RUN_END}, ?::TIMESTAMPTZ) - INTERVAL 1 MINUTE,
                    INTERVAL {int(step)} MINUTE)) AS minute
                FROM ({RUNS_SQL}) WHERE minutes > 1)""",
                      [*runs_window, start, end, *runs_window])
        # every minute's unavailable GPUs (few rows): outages and excluded allocation
        unavailable = _frame(con, f"""
            SELECT * FROM ({STATE_SQL}) WHERE down OR NOT schedulable OR NOT gpu_ok""",
                             window)
        available = _frame(con, f"""
            SELECT pool, coalesce(sum(in_window) FILTER (WHERE node_ok AND gpu_ok), 0) / 60.0
                   AS available_gpu_hours
            FROM (SELECT in_window, {STATE_COLUMNS} FROM ({RUNS_SQL}))
            GROUP BY pool ORDER BY pool""", runs_window)
        blocked_facts = _frame(con, """
            SELECT pool, coalesce(team, '(none)') AS team,
                   sum(coalesce(gpus, 1)) / 60.0 AS blocked_gpu_hours
            FROM blocked_minute WHERE minute >= ? AND minute < ?
            GROUP BY ALL ORDER BY ALL""", window)
        sums = ", ".join(f"sum(frag_{k}) AS frag_{k}_sum" for k in FRAG_KS)
        counts = ", ".join(f"count(frag_{k}) AS frag_{k}_n" for k in FRAG_KS)
        frag_facts = _frame(con, f"""
            SELECT to_timestamp((epoch(minute)::BIGINT // 3600) * 3600) AS hour, pool,
                   card_type, {sums}, {counts}
            FROM frag_minute WHERE minute >= ? AND minute < ?
            GROUP BY ALL ORDER BY ALL""", window)
        names = con.sql("SELECT DISTINCT team, pool, card_type, job_type FROM attempts"
                        ).fetchall()
    except duckdb.Error as exc:
        # a published object missing or damaged: said, with what to do, as query and
        # report say it (DuckDB's "too small to be a Parquet file" named no repair)
        raise HistoryError(query.unreadable(con, exc) or f"{warehouse}: {exc}") from None
    finally:
        con.close()
    grid = grid.with_columns(pl.col("minute").cast(TIME_DTYPE))
    history = History(start, end, int(step), attempts, allocations, nodes, grid,
                      outages(unavailable, 1))
    history.excluded = runs(unavailable.filter(pl.col("down") | ~pl.col("gpu_ok")))
    history.available = available
    history.blocked_facts = blocked_facts.cast(dict(BLOCKED_FACTS))  # type: ignore[arg-type]
    history.frag_facts = frag_facts.cast(dict(FRAG_FACTS))  # type: ignore[arg-type]
    history.known = _known(names, nodes)
    history.gaps = gaps(history)
    return history


def _known(names: list[tuple[object, ...]], nodes: pl.DataFrame) -> dict[str, set[str]]:
    """The names a policy file may use: teams and job types of the attempts, pools and
    card types of the attempts and of the window's nodes."""
    known: dict[str, set[str]] = {"team": set(), "pool": set(), "card_type": set(),
                                  "job_type": set()}
    pairs = [(p, c) for _t, p, c, _j in names] + list(nodes.select("pool", "card_type")
                                                       .iter_rows())
    for team, _p, _c, job_type in names:
        if team is not None:
            known["team"].add(str(team))
        if job_type is not None:
            known["job_type"].add(str(job_type))
    for pool, card in pairs:
        if pool is not None:
            known["pool"].add(str(pool))
            if card is not None:
                known["card_type"].add(f"{pool}/{card}")
        if card is not None:
            known["card_type"].add(str(card))
    return known


def runs(minutes: pl.DataFrame) -> pl.DataFrame:
    """GPU-minutes (``minute``, ``node``, ``gpu_index``) as runs of consecutive minutes
    per GPU, ``[start, end)``."""
    if minutes.is_empty():
        return pl.DataFrame(schema=RUN_SCHEMA)
    keys = ["node", "gpu_index"]
    gap = pl.col("minute").diff().over(keys) != pl.duration(minutes=1)
    return minutes.select(*keys, pl.col("minute").cast(TIME_DTYPE)).unique().sort(
        [*keys, "minute"]).with_columns(gap.fill_null(True).cum_sum().over(keys).alias("run")
    ).group_by([*keys, "run"]).agg(
        pl.col("minute").min().alias("start"),
        (pl.col("minute").max() + pl.duration(minutes=1)).alias("end"),
    ).select(list(RUN_SCHEMA)).sort([*keys, "start"])


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
