"""Latency of the Grafana boards' SQL panels, the analyst views and the report's queries
over 30 days of a 2,000-GPU fleet's facts, on a local folder or an ``s3://`` warehouse.

    .venv/bin/python bench/board_queries.py [--work DIR] [--runs 10] [--days 30] [--s3]

How the facts are made: the built-in cluster scaled ×3.47 (nodes, arrivals, quotas:
2,000 GPUs) is simulated for one day (60-second samples) through the real processor;
that day's facts are then written for 30 consecutive days, times and dates shifted and
job ids suffixed per copy (a job of day d is ``<id>-d<d>``), through the warehouse
writer as compaction leaves a closed day: one object per table and day, ``gpu_minute``
sorted by job, then minute (``compaction.py``). With ``--s3`` the copies go to a bucket
of S3Proxy on loopback (``tests/s3_server.py``) or of ``GPULEDGER_TEST_S3_ENDPOINT``.
Every query is timed ``--runs`` times after one warm-up run on one reader connection
(``query.connect``: the views over the newest generation), with DuckDB limited to 2
threads. Board panels run with Grafana's default range (the last 24 hours of the data)
and over all 30 days.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import duckdb
import polars as pl
from cluster_scale import write_scaled

from gpuledger.pipeline import query
from gpuledger.pipeline.analyst_report.sections import SECTIONS, render_sql
from gpuledger.pipeline.compaction import ROW_GROUP_ROWS, sort_order
from gpuledger.pipeline.config import ProcessorConfig
from gpuledger.pipeline.dashboards.boards import all_boards
from gpuledger.pipeline.dashboards.interpolate import interpolate
from gpuledger.pipeline.demo import run_demo
from gpuledger.pipeline.simulate import SimConfig, load_cluster
from gpuledger.pipeline.tables import SORT_KEYS, TABLE_SCHEMAS
from gpuledger.pipeline.warehouse import Warehouse, published_files, read_table, sql_dir

FACTOR = 2000 / 576
SNAPSHOTS = {"running_attempts", "candidates", "rejects"}
SKIP_MARK = "#already-written"


def base_day(work: Path) -> Path:
    root = work / "day"
    if published_files(root) if (root / "manifests").exists() else False:
        return root
    cluster = load_cluster(write_scaled(work / "cluster-2000.yaml", FACTOR))
    t0 = time.monotonic()
    run_demo(SimConfig(hours=24, seed=7, sample_interval_s=60, cluster=cluster),
             ProcessorConfig(), root)
    print(f"simulated and processed one day in {time.monotonic() - t0:.0f} s", file=sys.stderr)
    return root


def _shift(frame: pl.DataFrame, days: int) -> pl.DataFrame:
    if days == 0:
        return frame
    delta = timedelta(days=days)
    out = frame.with_columns(
        [pl.col(c) + delta for c, t in frame.schema.items()
         if isinstance(t, pl.Datetime | pl.Date)])
    if "job_id" in out.columns:
        out = out.with_columns(pl.col("job_id") + f"-d{days}")
    return out


def replicate(day: Path, target: str, days: int) -> int:
    """Write ``days`` shifted copies of ``day``'s facts into ``target``, one compacted
    object per table and day; the snapshot tables once. Returns the rows written."""
    if SKIP_MARK in target:
        return -1
    wh = Warehouse(target)
    rows = 0
    for table, schema in TABLE_SCHEMAS.items():
        wh.ensure_schema(table, schema)
    for table in sorted(published_tables(day)):
        frame = read_table(day, table)
        if frame.height == 0:
            continue
        if table in SNAPSHOTS:
            wh.write_snapshot(table, _shift(frame, days - 1), SORT_KEYS.get(table, []))
            continue
        order = sort_order(table, SORT_KEYS.get(table))
        first = frame["date"].min() if "date" in frame.columns else None
        for d in range(days):
            shifted = _shift(frame, d)
            when = datetime.combine(first, datetime.min.time(), UTC) + timedelta(days=d) \
                if first is not None else datetime(2026, 1, 5, tzinfo=UTC)
            wh.write(wh.part_path(table, when, hourly=False), shifted, order,
                     row_group_size=ROW_GROUP_ROWS)
            rows += shifted.height
        wh.commit()
    wh.publish_catalog()
    wh.close()
    return rows


def published_tables(root: Path) -> set[str]:
    return {name.split("/")[1] for name in published_files(root)}


def analyst_queries() -> dict[str, str]:
    text = (sql_dir() / "20_analyst.sql").read_text()
    out = {}
    for name in re.findall(r"CREATE OR REPLACE VIEW (\w+)", text):
        out[f"view {name}"] = f"SELECT * FROM {name}"
    for name in re.findall(r"CREATE OR REPLACE MACRO (\w+)", text):
        out[f"macro {name}()"] = f"SELECT * FROM {name}()"
    for s in SECTIONS:
        out[f"report {s.key}"] = render_sql(s, None, None, 10)
    return out


def board_queries(con: duckdb.DuckDBPyConnection, window_days: float) -> dict[str, str]:
    minutes = int(window_days * 1440)
    t0, t1 = con.execute(f"SELECT max(minute) - INTERVAL ({minutes}) MINUTE, max(minute) "
                         "FROM frag_minute").fetchall()[0]
    values: dict[str, list[str]] = {}
    for c in ("pool", "card_type", "team", "queue"):
        values[c] = [r[0] for r in con.execute(
            f"SELECT DISTINCT {c} FROM gpu_hourly WHERE {c} IS NOT NULL").fetchall()]
    # the job board opens the job with the most GPU-hours at stake that ended in range
    values["job"] = [con.execute(
        "SELECT job_id FROM recommendations WHERE ended_at >= ? AND ended_at <= ? "
        "ORDER BY gpu_hours DESC LIMIT 1", [t0, t1]).fetchall()[0][0]]
    out = {}
    interval = max(60_000, int(window_days * 86_400_000 / 1000) // 60_000 * 60_000)
    for uid, board in all_boards().items():
        for v in board["templating"]["list"]:
            if v["datasource"]["type"] != "prometheus":
                sql = v.get("definition") or v["query"]
                out[f"{uid} var {v['name']}"] = interpolate(sql, values, t0, t1, interval)
        for p in board["panels"]:
            for t in p.get("targets", []):
                if "rawSql" in t:
                    out[f"{uid} / {p['title']}"] = interpolate(t["rawSql"], values, t0, t1,
                                                               interval)
    return out


def timed(con: duckdb.DuckDBPyConnection, sql: str, runs: int) -> tuple[float, float, int]:
    n = len(con.execute(sql).fetchall())
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        con.execute(sql).fetchall()
        times.append((time.perf_counter() - t) * 1000)
    times.sort()
    p95 = times[min(len(times) - 1, round(0.95 * (len(times) - 1)))]
    return statistics.median(times), p95, n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, default=Path("/tmp/gpuledger-board-bench"))
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--days", type=int, default=30)
    ap.add_argument("--s3", action="store_true",
                    help="write the 30 days to an S3 bucket (S3Proxy) and read them there")
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    day = base_day(args.work)
    server = None
    if args.s3:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
        from s3_server import s3_from_env, start_s3

        server = s3_from_env() or start_s3(args.work / f"s3-{time.time_ns()}")
        os.environ.update(server.env())
        target = server.bucket() + f"/fleet-{args.days}d"
    else:
        target = str(args.work / f"fleet-{args.days}d")
        if (Path(target) / "manifests").exists():
            target += SKIP_MARK
    t = time.monotonic()
    rows = replicate(day, target, args.days)
    target = target.removesuffix(SKIP_MARK)
    if rows >= 0:
        print(f"replicated to {args.days} days: {rows:,} fact rows in "
              f"{time.monotonic() - t:.0f} s", file=sys.stderr)
    t = time.monotonic()
    con = query.connect(target, threads=2)  # read-only, locked down, as gpuledger query opens it
    print(f"reader connection (newest generation, views) in {time.monotonic() - t:.2f} s",
          file=sys.stderr)
    facts: Any = con.execute("SELECT count(*), count(DISTINCT node || gpu_index) FROM "
                             "gpu_minute").fetchall()[0]
    print(f"gpu_minute: {facts[0]:,} rows, {facts[1]:,} GPUs", file=sys.stderr)
    results: list[tuple[str, str, float, float, int]] = []
    for name, sql in analyst_queries().items():
        results.append(("analyst", name, *timed(con, sql, args.runs)))
    for label, days in (("board 24 h", 1.0), (f"board {args.days} d", float(args.days))):
        for name, sql in board_queries(con, days).items():
            results.append((label, name, *timed(con, sql, args.runs)))
    print("| set | query | p50 ms | p95 ms | rows |")
    print("|---|---|---:|---:|---:|")
    for kind, name, p50, p95, n in results:
        print(f"| {kind} | {name} | {p50:.0f} | {p95:.0f} | {n:,} |")
    for kind in dict.fromkeys(r[0] for r in results):
        p95s = [r[3] for r in results if r[0] == kind]
        print(f"{kind}: {len(p95s)} queries, worst p95 {max(p95s):.0f} ms, "
              f"{sum(p <= 300 for p in p95s)} within 300 ms, "
              f"{sum(p <= 1000 for p in p95s)} within 1 s", file=sys.stderr)
    if server is not None:
        server.stop()


if __name__ == "__main__":
    main()
