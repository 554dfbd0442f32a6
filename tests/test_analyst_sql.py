"""sql/20_analyst.sql: every view and macro checked against a direct Polars computation
from the fact tables of a simulated warehouse."""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import duckdb
import polars as pl
import pytest
from polars.testing import assert_frame_equal
from sim_warehouse import build, table

from gpuledger.pipeline.query import connect, render, run

DIMS = ["team", "pool", "card_type", "job_type", "queue"]


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(tmp_path_factory.mktemp("analyst") / "wh")


@pytest.fixture(scope="module")
def con(root: Path) -> Iterator[duckdb.DuckDBPyConnection]:
    c = connect(root)
    yield c
    c.close()


@pytest.fixture(scope="module")
def attempts(root: Path) -> pl.DataFrame:
    """finished ∪ running attempts, as the `attempts` view defines them."""
    done = table(root, "job_attempts").with_columns(status=pl.lit("ended"))
    live = table(root, "running_attempts").with_columns(
        status=pl.when(pl.col("started_at").is_null()).then(pl.lit("pending"))
        .otherwise(pl.lit("running")))
    every = pl.concat([done, live], how="diagonal_relaxed")
    # the facts count usage over the hours telemetry observed (docs/metrics.md, no
    # telemetry is not waste): waste = observed − used, no_telemetry = allocated − observed
    assert (every["waste_gpu_hours"] - (every["observed_gpu_hours"] - every["used_gpu_hours"])
            ).abs().max() < 1e-8
    return every.with_columns(pl.col("no_telemetry_gpu_hours").fill_null(0.0))


def sql(con: duckdb.DuckDBPyConnection, text: str) -> pl.DataFrame:
    return _normal(con.sql(text).pl())


def _normal(frame: pl.DataFrame) -> pl.DataFrame:
    """Same types on both sides: µs UTC times, Int64 integers, Float64 floats."""
    casts: dict[str, pl.DataType] = {}
    for name, dtype in frame.schema.items():
        if isinstance(dtype, pl.Datetime):
            casts[name] = pl.Datetime("us", "UTC")
        elif dtype.is_integer():
            casts[name] = pl.Int64()
        elif dtype.is_float():
            casts[name] = pl.Float64()
    return frame.cast(casts)  # type: ignore[arg-type]


def same(got: pl.DataFrame, want: pl.DataFrame, keys: list[str]) -> None:
    assert want.height > 0, "the simulated warehouse must exercise this view"
    got, want = _normal(got), _normal(want.select(got.columns))
    assert_frame_equal(got.sort(keys, nulls_last=True), want.sort(keys, nulls_last=True),
                       check_dtypes=False, rel_tol=1e-9, abs_tol=1e-6)


# --- 1. idle and inefficient GPU-hours ------------------------------------------------

def _waste(hourly: pl.DataFrame) -> pl.DataFrame:
    parts = []
    for dim in DIMS:
        g = hourly.group_by(pl.col(dim).fill_null("(none)").alias("value")).agg(
            pl.col("gpu_hours").sum(), pl.col("free_gpu_hours").sum(),
            pl.col("allocated_gpu_hours").sum(), pl.col("used_gpu_hours").sum(),
            pl.col("no_telemetry_gpu_hours").sum(),
            (pl.col("allocated_idle_gpu_hours") - pl.col("no_telemetry_gpu_hours")).sum()
            .alias("idle_gpu_hours"),
            pl.col("allocated_inefficient_gpu_hours").sum().alias("inefficient_gpu_hours"),
            pl.col("unaccounted_use_gpu_hours").sum(),
        ).with_columns(
            dimension=pl.lit(dim),
            # hours without telemetry are their own column, never waste (docs/metrics.md)
            waste_gpu_hours=pl.col("allocated_gpu_hours") - pl.col("used_gpu_hours")
            - pl.col("no_telemetry_gpu_hours"),
            utilisation_of_allocation=pl.when(
                pl.col("allocated_gpu_hours") - pl.col("no_telemetry_gpu_hours") > 0)
            .then(pl.col("used_gpu_hours")
                  / (pl.col("allocated_gpu_hours") - pl.col("no_telemetry_gpu_hours"))),
            share_of_idle=pl.col("idle_gpu_hours") / pl.col("idle_gpu_hours").sum(),
            share_of_inefficient=pl.col("inefficient_gpu_hours")
            / pl.col("inefficient_gpu_hours").sum(),
        )
        parts.append(g)
    return pl.concat(parts, how="diagonal_relaxed")


def test_waste_sources_by_every_dimension(con: duckdb.DuckDBPyConnection, root: Path) -> None:
    hourly = table(root, "gpu_hourly")
    got = sql(con, "SELECT * FROM waste_sources")
    same(got, _waste(hourly), ["dimension", "value"])
    # the same GPU-hours, whichever dimension splits them
    per_dim = got.group_by("dimension").agg(pl.col("idle_gpu_hours").sum())
    assert per_dim["idle_gpu_hours"].n_unique() == 1 or \
        per_dim["idle_gpu_hours"].max() - per_dim["idle_gpu_hours"].min() < 1e-6


def test_waste_sources_between_a_window(con: duckdb.DuckDBPyConnection, root: Path) -> None:
    hourly = table(root, "gpu_hourly")
    t0 = hourly["hour"].min() + timedelta(hours=1)  # type: ignore[operator]
    t1 = t0 + timedelta(hours=1)
    want = _waste(hourly.filter((pl.col("hour") >= t0) & (pl.col("hour") < t1)))
    got = sql(con, f"SELECT * FROM waste_sources_between(since := '{t0.isoformat()}', "
                   f"until := '{t1.isoformat()}')")
    same(got, want, ["dimension", "value"])
    assert got["gpu_hours"].sum() < sql(con, "SELECT * FROM waste_sources")["gpu_hours"].sum()


def test_top_waste_jobs(con: duckdb.DuckDBPyConnection, attempts: pl.DataFrame) -> None:
    ranked = attempts.filter(pl.col("allocated_gpu_hours") > 0).sort(
        ["waste_gpu_hours", "job_id", "attempt"], descending=[True, False, False])
    got = sql(con, "SELECT job_id, attempt, waste_gpu_hours FROM top_waste_jobs(n := 5)")
    assert got.rows() == ranked.head(5).select("job_id", "attempt", "waste_gpu_hours").rows()
    team = ranked["team"][0]
    got = sql(con, f"SELECT job_id, attempt FROM top_waste_jobs(n := 3, team_name := '{team}')")
    assert got.rows() == ranked.filter(pl.col("team") == team).head(3).select(
        "job_id", "attempt").rows()


# --- 2. memory over-requests ------------------------------------------------------------

def _memory(attempts: pl.DataFrame) -> pl.DataFrame:
    return attempts.filter(
        (pl.col("allocated_gpu_hours") > 0) & pl.col("mem_peak_mib").is_not_null()
    ).with_columns(
        peak_of_held=pl.col("mem_peak_mib") / pl.col("mem_held_mib"),
        unused_mib=pl.coalesce("gpu_mem_mib", "mem_held_mib") - pl.col("mem_peak_mib"),
    )


def test_memory_requests(con: duckdb.DuckDBPyConnection, attempts: pl.DataFrame) -> None:
    want = _memory(attempts).select(
        "job_id", "attempt", "team",
        pl.col("gpu_mem_mib").alias("requested_mib"), pl.col("mem_held_mib").alias("held_mib"),
        pl.col("mem_peak_mib").alias("peak_mib"), "peak_of_held", "unused_mib",
        "memory_oversized", pl.col("card_type").alias("requested_card_type"))
    got = sql(con, "SELECT job_id, attempt, team, requested_mib, held_mib, peak_mib, "
                   "peak_of_held, unused_mib, memory_oversized, requested_card_type "
                   "FROM memory_requests")
    # the card asked for, never the advisor's suggestion ("any card" jobs: null)
    assert got["requested_card_type"].null_count() > 0
    same(got, want, ["job_id", "attempt"])


@pytest.mark.parametrize("ratio", [0.25, 0.6])
def test_memory_overrequesters(con: duckdb.DuckDBPyConnection, attempts: pl.DataFrame,
                               ratio: float) -> None:
    m = _memory(attempts).with_columns(over=pl.col("peak_of_held") < ratio)
    want = m.group_by("team", "user").agg(
        pl.len().alias("jobs"), pl.col("over").sum().alias("oversized_jobs"),
        pl.col("allocated_gpu_hours").filter(pl.col("over")).sum()
        .alias("oversized_gpu_hours"),
        pl.col("peak_of_held").median().alias("median_peak_of_held"),
    ).with_columns(oversized_share=pl.col("oversized_jobs") / pl.col("jobs"))
    got = sql(con, f"SELECT team, \"user\", jobs, oversized_jobs, oversized_gpu_hours, "
                   f"median_peak_of_held, oversized_share "
                   f"FROM memory_overrequesters(max_peak_ratio := {ratio})")
    same(got, want, ["team", "user"])
    assert got["oversized_jobs"].sum() > 0


def test_memory_overrequest_by_team(con: duckdb.DuckDBPyConnection,
                                    attempts: pl.DataFrame) -> None:
    m = _memory(attempts).with_columns(over=pl.col("peak_of_held") < 0.25)
    want = m.group_by("team").agg(
        pl.len().alias("jobs"), pl.col("over").sum().alias("oversized_jobs"),
        pl.col("allocated_gpu_hours").filter(pl.col("over")).sum()
        .alias("oversized_gpu_hours"))
    same(sql(con, "SELECT team, jobs, oversized_jobs, oversized_gpu_hours "
                  "FROM memory_overrequest_by_team"), want, ["team"])


def test_card_mismatch(con: duckdb.DuckDBPyConnection, root: Path,
                       attempts: pl.DataFrame) -> None:
    held = pl.concat([table(root, "job_attempts"), table(root, "running_attempts")],
                     how="diagonal_relaxed").select("job_id", "attempt", "held_card_type")
    want = attempts.drop("held_card_type").join(held, on=["job_id", "attempt"], how="left") \
        .filter(pl.col("mismatch_gpu_hours") > 0) \
        .group_by("team", "pool", "held_card_type", "suggested_card_type").agg(
            pl.len().alias("jobs"), pl.col("mismatch_gpu_hours").sum())
    same(sql(con, "SELECT * FROM card_mismatch"), want,
         ["team", "pool", "held_card_type", "suggested_card_type"])


# --- 3. blocked by fragmentation ----------------------------------------------------------

def _blocked(root: Path, attempts: pl.DataFrame) -> pl.DataFrame:
    return table(root, "blocked_minute").group_by("job_id", "attempt").agg(
        pl.col("team").first(), pl.col("gpus").first(),
        pl.col("minute").min().alias("first_blocked"),
        pl.col("minute").max().alias("last_blocked"),
        pl.len().alias("blocked_minutes"),
        pl.col("free_gpus").max().alias("max_free_gpus"),
    ).join(attempts.select("job_id", "attempt", "started_at", "queue_wait_s"),
           on=["job_id", "attempt"], how="left")


def test_blocked_jobs(con: duckdb.DuckDBPyConnection, root: Path,
                      attempts: pl.DataFrame) -> None:
    want = _blocked(root, attempts)
    got = sql(con, "SELECT job_id, attempt, team, gpus, first_blocked, last_blocked, "
                   "blocked_minutes, max_free_gpus, started_at, queue_wait_s FROM blocked_jobs")
    same(got, want, ["job_id", "attempt"])
    # blocked means: it fitted in the free GPUs of its pool, not on one node
    assert (got["max_free_gpus"] >= got["gpus"]).all()


def test_blocked_longer_than(con: duckdb.DuckDBPyConnection, root: Path,
                             attempts: pl.DataFrame) -> None:
    b = _blocked(root, attempts)
    cut = int(b["blocked_minutes"].median())  # type: ignore[arg-type]
    want = b.filter(pl.col("blocked_minutes") > cut)
    got = sql(con, f"SELECT job_id, attempt, blocked_minutes "
                   f"FROM blocked_longer_than(minutes := {cut})")
    same(got, want, ["job_id", "attempt"])
    assert 0 < got.height < b.height


def test_blocked_demand_over_time(con: duckdb.DuckDBPyConnection, root: Path) -> None:
    want = table(root, "frag_minute").with_columns(
        bucket_start=pl.col("minute").dt.truncate("1h")).group_by(
        "bucket_start", "pool", "card_type").agg(
        pl.col("blocked_jobs").mean().alias("mean_blocked_jobs"),
        pl.col("blocked_jobs").max().alias("max_blocked_jobs"),
        pl.col("blocked_gpus").mean().alias("mean_blocked_gpus"),
        pl.col("free_gpus").mean().alias("mean_free_gpus"))
    got = sql(con, "SELECT bucket_start, pool, card_type, mean_blocked_jobs, "
                   "max_blocked_jobs, mean_blocked_gpus, mean_free_gpus "
                   "FROM blocked_demand_over_time()")
    same(got, want, ["bucket_start", "pool", "card_type"])
    assert got["max_blocked_jobs"].max() > 0  # type: ignore[operator]


# --- 4. queue wait over time ---------------------------------------------------------------

@pytest.mark.parametrize("bucket", ["1h", "30m"])
def test_queue_wait_over_time(con: duckdb.DuckDBPyConnection, attempts: pl.DataFrame,
                              bucket: str) -> None:
    started = attempts.filter(pl.col("queue_wait_s").is_not_null()
                              & pl.col("started_at").is_not_null())
    want = started.with_columns(bucket_start=pl.col("started_at").dt.truncate(bucket)) \
        .group_by("bucket_start", "queue").agg(
            pl.len().alias("attempts"), pl.col("queue_wait_s").mean().alias("mean_s"),
            pl.col("queue_wait_s").quantile(0.5, "linear").alias("p50_s"),
            pl.col("queue_wait_s").quantile(0.9, "linear").alias("p90_s"),
            pl.col("queue_wait_s").max().alias("max_s"))
    interval = {"1h": "1 HOUR", "30m": "30 MINUTE"}[bucket]
    got = sql(con, f"SELECT bucket_start, queue, attempts, mean_s, p50_s, p90_s, max_s "
                   f"FROM queue_wait_over_time(bucket := INTERVAL {interval})")
    same(got, want, ["bucket_start", "queue"])


def test_pending_over_time(con: duckdb.DuckDBPyConnection, root: Path) -> None:
    per_minute = table(root, "pending_minute").group_by("minute", "queue").agg(
        pl.col("pending_jobs").sum(), pl.col("pending_gpus").sum())
    # a minute with nothing pending has no row but counts as 0: the mean is per minute of
    # the bucket the facts cover
    minutes = pl.concat([table(root, "frag_minute").select("minute"),
                         table(root, "pending_minute").select("minute")]).unique() \
        .group_by(pl.col("minute").dt.truncate("1h").alias("bucket_start")).agg(
            pl.len().alias("minutes"))
    want = per_minute.with_columns(bucket_start=pl.col("minute").dt.truncate("1h")) \
        .group_by("bucket_start", "queue").agg(
            pl.col("pending_jobs").sum().alias("mean_pending_jobs"),
            pl.col("pending_jobs").max().alias("max_pending_jobs"),
            pl.col("pending_gpus").sum().alias("mean_pending_gpus")) \
        .join(minutes, on="bucket_start").with_columns(
            pl.col("mean_pending_jobs") / pl.col("minutes"),
            pl.col("mean_pending_gpus") / pl.col("minutes")).drop("minutes")
    assert minutes["minutes"].max() == 60
    got = sql(con, "SELECT bucket_start, queue, mean_pending_jobs, max_pending_jobs, "
                   "mean_pending_gpus FROM pending_over_time()")
    same(got, want, ["bucket_start", "queue"])


def test_queue_wait_by_size(con: duckdb.DuckDBPyConnection, attempts: pl.DataFrame) -> None:
    want = attempts.filter(pl.col("queue_wait_s").is_not_null()).group_by("queue", "gpus").agg(
        pl.len().alias("attempts"),
        pl.col("queue_wait_s").quantile(0.9, "linear").alias("p90_s"),
        pl.col("queue_wait_s").max().alias("max_s"))
    same(sql(con, "SELECT queue, gpus, attempts, p90_s, max_s FROM queue_wait_by_size"),
         want, ["queue", "gpus"])


# --- 5. preemption lost work ----------------------------------------------------------------

def _audit(root: Path, attempts: pl.DataFrame) -> pl.DataFrame:
    nxt = attempts.select("job_id", pl.col("attempt") - 1,
                          pl.col("queue_wait_s").alias("requeue_wait_s"))
    return table(root, "preemptions").join(nxt, on=["job_id", "attempt"], how="left")


def test_preemption_audit(con: duckdb.DuckDBPyConnection, root: Path,
                          attempts: pl.DataFrame) -> None:
    want = _audit(root, attempts)
    got = sql(con, "SELECT job_id, attempt, time, lost_gpu_hours, borrowed, requeued, "
                   "requeue_wait_s FROM preemption_audit")
    same(got, want, ["job_id", "attempt"])
    assert got["requeue_wait_s"].null_count() < got.height


def test_preemption_lost_work(con: duckdb.DuckDBPyConnection, root: Path,
                              attempts: pl.DataFrame) -> None:
    audit = _audit(root, attempts)
    keys = ["team", "queue", "pool", "borrowed", "checkpointable"]
    want = audit.group_by(keys).agg(
        pl.len().alias("preemptions"), pl.col("allocated_gpus").sum().alias("gpus_reclaimed"),
        pl.col("lost_gpu_hours").sum(), pl.col("requeued").sum(),
        pl.col("requeue_wait_s").mean().alias("mean_requeue_wait_s"))
    same(sql(con, f"SELECT {', '.join(keys)}, preemptions, gpus_reclaimed, lost_gpu_hours, "
                  "requeued, mean_requeue_wait_s FROM preemption_lost_work()"), want, keys)
    # a window: only the preemptions in it
    cut = audit["time"].sort()[audit.height // 2]
    got = sql(con, f"SELECT sum(preemptions) AS n FROM preemption_lost_work(since := "
                   f"'{cut.isoformat()}')")
    assert got["n"][0] == audit.filter(pl.col("time") >= cut).height


# --- 6. borrowing and reclaim --------------------------------------------------------------

def test_borrowing_reclaim(con: duckdb.DuckDBPyConnection, root: Path,
                           attempts: pl.DataFrame) -> None:
    a = attempts.filter(pl.col("team").is_not_null())
    borrowed = pl.col("borrowed").fill_null(False)
    want = a.group_by("team", "pool").agg(
        pl.col("allocated_gpu_hours").sum(),
        pl.col("allocated_gpu_hours").filter(borrowed).sum().alias("borrowed_gpu_hours"),
        (borrowed & pl.col("started_at").is_not_null()).sum().alias("borrowed_attempts"),
        (borrowed & (pl.col("end_event") == "preempted")).sum().alias("reclaimed_attempts"),
    ).join(table(root, "preemptions").filter(pl.col("borrowed")).group_by("team", "pool").agg(
        pl.col("lost_gpu_hours").sum().alias("reclaimed_lost_gpu_hours")),
        on=["team", "pool"], how="left").with_columns(
        pl.col("reclaimed_lost_gpu_hours").fill_null(0.0))
    got = sql(con, "SELECT team, pool, allocated_gpu_hours, borrowed_gpu_hours, "
                   "borrowed_attempts, reclaimed_attempts, reclaimed_lost_gpu_hours "
                   "FROM borrowing_reclaim")
    same(got, want, ["team", "pool"])
    assert got["reclaimed_attempts"].sum() > 0


def _nearest_rank(values: list[float], q: float) -> float:
    """The ⌈q·n⌉-th smallest value (1-based)."""
    ordered = sorted(values)
    return ordered[max(math.ceil(q * len(ordered)), 1) - 1]


@pytest.mark.parametrize(("view", "keys"), [("queue_wait_by_gpus", ["gpus"]),
                                            ("queue_wait_by_size", ["queue", "gpus"]),
                                            ("queue_wait_by_team", ["team"]),
                                            ("queue_wait_by_card", ["card_type"]),
                                            ("queue_wait_overall", [])])
def test_queue_wait_views_with_mean_and_both_percentiles(
        con: duckdb.DuckDBPyConnection, attempts: pl.DataFrame, view: str,
        keys: list[str]) -> None:
    started = attempts.filter(pl.col("queue_wait_s").is_not_null()).with_columns(
        # by the card the attempt got (a job of any card type got one)
        pl.coalesce("held_card_type", "card_type").alias("card_type"))
    assert view != "queue_wait_by_card" or started["card_type"].null_count() == 0
    groups = started.group_by(keys) if keys else [((), started)]
    rows = []
    for key, g in groups:
        waits = g["queue_wait_s"].to_list()
        row: dict[str, object] = dict(zip(keys, key, strict=True))
        row.update(attempts=len(waits), mean_s=sum(waits) / len(waits),
                   max_s=max(waits))
        for q, name in ((0.5, "p50"), (0.9, "p90"), (0.99, "p99")):
            row[f"{name}_s"] = g["queue_wait_s"].quantile(q, "linear")
            row[f"{name}_nearest_s"] = _nearest_rank(waits, q)
        rows.append(row)
    want = pl.DataFrame(rows)
    got = sql(con, f"SELECT * FROM {view}")
    assert got.height == want.height
    same(got, want, keys or ["attempts"])


GUIDE = Path(__file__).resolve().parents[1] / "docs" / "analyst-guide.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```\n", re.S | re.M)


def guide_examples(text: str) -> list[tuple[str, str | None]]:
    """The SQL blocks of a Markdown text, each with the plain block right after it (what
    the guide shows it prints), or None."""
    blocks = [(m.start(), m.end(), m.group(1), m.group(2)) for m in FENCE.finditer(text)]
    out: list[tuple[str, str | None]] = []
    for i, (_start, end, lang, body) in enumerate(blocks):
        if lang != "sql":
            continue
        after = blocks[i + 1] if i + 1 < len(blocks) else None
        shown = after[3] if after and after[2] == "" and not text[end:after[0]].strip() \
            else None
        out.append((body, shown))
    return out


def _lines(text: str) -> list[str]:
    return [line.rstrip() for line in text.strip().splitlines()]


def test_the_analyst_guides_examples_run_and_print_what_it_shows(root: Path) -> None:
    """The guide's warehouse is this one (``gpuledger demo --hours 3 --interval 30``): each
    SQL example runs on the read-only connection, and where the guide shows the output,
    ``gpuledger query`` prints exactly that."""
    examples = guide_examples(GUIDE.read_text())
    assert len(examples) >= 8 and sum(shown is not None for _, shown in examples) >= 3
    for text, shown in examples:
        columns, rows = run(root, text)
        if shown is not None:
            assert _lines(render(columns, rows, "table")) == _lines(shown), text


@pytest.mark.parametrize(("since_h", "until_h"), [(1, 2), (0.5, 2.25), (2.9, None), (None, 0.5)])
def test_attempts_between(con: duckdb.DuckDBPyConnection, root: Path, attempts: pl.DataFrame,
                          since_h: float | None, until_h: float | None) -> None:
    """Held or waited in [since, until): running and pending attempts are known up to the
    end of the facts, not beyond."""
    start = table(root, "gpu_hourly")["hour"].min()
    end = table(root, "gpu_hourly")["hour"].max() + timedelta(hours=1)
    since = None if since_h is None else start + timedelta(hours=since_h)
    until = None if until_h is None else start + timedelta(hours=until_h)
    last = pl.coalesce(pl.col("ended_at"), pl.lit(end))
    first = pl.coalesce(pl.col("started_at"), pl.col("queued_at"))
    want = attempts.filter((last > since) if since else pl.lit(True)).filter(
        (first < until) if until else pl.lit(True))
    arg = ", ".join(f"{k} := TIMESTAMPTZ '{v.isoformat()}'" for k, v in
                    (("since", since), ("until", until)) if v is not None)
    got = sql(con, f"SELECT job_id, attempt FROM attempts_between({arg})")
    assert got.height == want.height > 0
    assert sorted(got.rows()) == sorted(want.select("job_id", "attempt").rows())


def test_attempts_between_an_empty_or_later_window_holds_none(
        con: duckdb.DuckDBPyConnection) -> None:
    for window in ("since := TIMESTAMPTZ '2026-01-05 03:00Z', "
                   "until := TIMESTAMPTZ '2026-01-05 02:00Z'",
                   "since := TIMESTAMPTZ '2030-01-01 00:00Z'"):
        assert sql(con, f"SELECT count(*) AS n FROM attempts_between({window})")["n"][0] == 0


@pytest.mark.parametrize(("call", "says"), [
    ("top_waste_jobs(n := NULL)", "top_waste_jobs: n must be a whole number >= 1, got NULL"),
    ("top_waste_jobs(n := 2.7)", "top_waste_jobs: n must be a whole number >= 1, got 2.7"),
    ("queue_wait_over_time(bucket := NULL)", "bucket must be a positive interval"),
    ("pending_over_time(bucket := INTERVAL 0 MINUTE)", "bucket must be a positive interval"),
    ("blocked_demand_over_time(bucket := NULL)", "bucket must be a positive interval"),
    ("memory_overrequesters(max_peak_ratio := NULL)", "max_peak_ratio must be in (0, 1]"),
    ("blocked_longer_than(minutes := -1)", "blocked_longer_than: minutes must be >= 0"),
])
def test_a_parameter_out_of_range_is_an_error_naming_it(con: duckdb.DuckDBPyConnection,
                                                        call: str, says: str) -> None:
    """Never an unbounded or empty answer for a parameter that makes no sense (a NULL
    count returned every row, a NULL bucket NULL buckets)."""
    with pytest.raises(duckdb.Error, match=re.escape(says)):
        con.sql(f"SELECT count(*) FROM {call}").fetchall()
    assert sql(con, "SELECT count(*) AS n FROM top_waste_jobs(n := 3)")["n"][0] == 3
