"""Generations: readers see whole commits, on a local folder and in an S3 bucket.

A reader loop runs while `gpuledger ingest` writes the same warehouse again and again
with a longer history each time, compacting the days it closes: every query must see
one generation — no attempt both ended and running, no count going backwards, and (in
the first ingest) the daily roll-up equal to the hourly one. (A later ingest rewrites a
day's roll-up from the hours it has processed so far, so there the daily roll-up may
trail the hourly files of the earlier run until that run's hours are processed again.)
A writer killed with SIGKILL in the middle of its uploads leaves nothing a reader
reads, and a restart gives the facts of a run that was never interrupted. Compaction
keeps one object per table, day and partition, with the same facts, and replaced
objects go after the grace period.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import polars as pl
import pytest
from fact_views import assert_same_facts
from s3_server import S3Server
from test_simulate import SMALL

from gpuledger.pipeline import query, warehouse
from gpuledger.pipeline.compaction import PART_TIME
from gpuledger.pipeline.config import ProcessorConfig, WarehouseOptions
from gpuledger.pipeline.generations import Snapshot, read_manifests, retired_objects
from gpuledger.pipeline.ingest import ingest
from gpuledger.pipeline.processor import Processor
from gpuledger.pipeline.simulate import SimConfig, parse_cluster, simulate, write_jsonl
from gpuledger.pipeline.store import Store, open_store
from gpuledger.pipeline.warehouse import Warehouse, published_files, read_table

SPARSE = ("blocked_minute", "preemptions", "candidates")
START = datetime(2026, 1, 5, 20, tzinfo=UTC)
HOURS = 10.0
CUTS = (3.0, 7.0, 10.0)
"""Hours of history of the successive ingests, from 20:00 (the first day closes, and is
compacted, during the second)."""

CHECK = """
SELECT
  (SELECT count(*) FROM job_attempts) AS ended,
  (SELECT count(*) FROM attempts) AS attempts,
  (SELECT count(*) FROM (SELECT job_id, attempt FROM attempts GROUP BY ALL
                         HAVING count(*) > 1)) AS both_ended_and_running,
  (SELECT count(*) FROM gpu_minute) AS gpu_minutes,
  (SELECT coalesce(round(sum(gpu_hours), 6), 0) FROM gpu_hourly) AS hourly,
  (SELECT coalesce(round(sum(gpu_hours), 6), 0) FROM gpu_daily) AS daily
"""


@pytest.fixture(scope="module")
def histories(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """One simulated history cut at each of CUTS hours (prefixes of each other)."""
    batches = list(simulate(SimConfig(hours=HOURS, seed=3, sample_interval_s=60, start=START,
                                      cluster=parse_cluster(SMALL))))
    start = min(b["telemetry"]["time"].min() for b in batches if b["telemetry"].height)
    out = []
    for hours in CUTS:
        folder = tmp_path_factory.mktemp(f"h{hours:g}")
        end = start + timedelta(hours=hours)
        write_jsonl(({k: f.filter(pl.col("time") < end) for k, f in b.items()}
                     for b in batches), folder)
        out.append(folder)
    return out


@pytest.fixture(scope="module")
def reference(histories: list[Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("reference") / "wh"
    ingest(sorted(histories[-1].glob("*.jsonl")), root, ProcessorConfig())
    return root


def _env(extra: dict[str, str]) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    return {**base, "GPULEDGER_WAREHOUSE__COMPACT_AFTER_S": "0", **extra}


def _ingest_cmd(folder: Path, url: str) -> list[str]:
    return [sys.executable, "-m", "gpuledger.cli.main", "ingest", "--quiet",
            "--warehouse", url, *map(str, sorted(folder.glob("*.jsonl")))]


def _location(kind: str, tmp_path: Path, s3: S3Server | None) -> tuple[str, dict[str, str]]:
    if kind == "local":
        return str(tmp_path / "wh"), {}
    assert s3 is not None
    return s3.bucket() + "/wh", s3.env()


@pytest.fixture(params=["local", "s3"])
def where(request: pytest.FixtureRequest, tmp_path: Path,
          monkeypatch: pytest.MonkeyPatch) -> tuple[str, dict[str, str]]:
    server = request.getfixturevalue("s3") if request.param == "s3" else None
    url, env = _location(request.param, tmp_path, server)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return url, env


def test_a_reader_sees_whole_generations_while_ingests_and_compaction_write(
    where: tuple[str, dict[str, str]], histories: list[Path], reference: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url, env = where
    seen: list[tuple[int, ...]] = []
    generations: set[int] = set()
    read: list[dict[str, int]] = [{}]  # the generations the last connection was opened on
    snapshot_of = warehouse.read_snapshot

    def recorded(store: Store) -> Snapshot:
        snapshot = snapshot_of(store)
        read.append(dict(snapshot.generations))
        return snapshot

    monkeypatch.setattr(warehouse, "read_snapshot", recorded)
    opened: list[dict[str, int]] = []
    for folder in histories:
        writer = subprocess.Popen(_ingest_cmd(folder, url), env=_env(env),
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            while True:
                done = writer.poll() is not None
                try:
                    con = query.connect(url)
                except query.QueryError:
                    assert not seen, "the warehouse went away"
                    continue  # nothing published yet
                try:
                    row = con.execute(CHECK).fetchone()
                finally:
                    con.close()
                assert row is not None
                ended, attempts, both, minutes, hourly, daily = row
                assert both == 0, row
                if folder == histories[0]:  # one generation: the day's roll-up = its hours'
                    assert hourly == pytest.approx(daily, abs=1e-6), row
                if seen:
                    last = seen[-1]
                    assert ended >= last[0] and attempts >= last[1] and minutes >= last[3], \
                        (last, row, "generations read:", opened[-1], read[-1])
                seen.append(tuple(row))
                opened.append(read[-1])
                generations.add(sum(m.generation for m in
                                    read_manifests(open_store(url)).values()))
                if done:
                    break
                time.sleep(0.1)  # leave the writer the CPU between two looks
        finally:
            if writer.poll() is None:
                writer.kill()
        assert writer.wait() == 0, writer.stderr.read().decode() if writer.stderr else ""
    assert len(generations) >= 4, generations  # the reader did run between commits
    assert_same_facts(url, reference, SPARSE)
    _assert_compacted(url)


def _assert_compacted(url: str) -> None:
    """Day 1 of every hourly table is one object; gpu_minute's sorted by job."""
    files = published_files(url)
    days: dict[tuple[str, str], int] = {}
    for logical in files:
        parts = logical.split("/")
        if len(parts) == 4 and parts[1] in PART_TIME and parts[2].startswith("date="):
            days[(parts[1], parts[2])] = days.get((parts[1], parts[2]), 0) + 1
    first = min(d for _t, d in days)
    closed = {t: n for (t, d), n in days.items() if d == first}
    assert closed and all(n == 1 for n in closed.values()), closed
    assert max(days.values()) <= 24
    day = next(o for k, o in files.items()
               if k.startswith(f"facts/gpu_minute/{first}/") and "T" not in k.rsplit("/", 1)[1])
    store = open_store(url)
    frame = pl.read_parquet(store.read(day) or b"")
    assert frame.height > 0
    assert frame["job_id"].is_sorted(nulls_last=True)


def test_a_writer_killed_mid_upload_leaves_nothing_read_and_a_restart_gives_the_facts(
    s3: S3Server, histories: list[Path], reference: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    url = s3.bucket() + "/wh"
    for k, v in s3.env().items():
        monkeypatch.setenv(k, v)
    store = open_store(url)
    writer = subprocess.Popen(_ingest_cmd(histories[-1], url), env=_env(s3.env()),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    unnamed: set[str] = set()
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and writer.poll() is None:
            manifests = read_manifests(store)
            if manifests and max(m.generation for m in manifests.values()) >= 3:
                named = {o for m in manifests.values() for o in m.files.values()}
                unnamed = {e.path for e in store.list("facts") if e.path.endswith(".parquet")
                           if e.path not in named and not e.path.endswith("_schema.parquet")}
                if unnamed:  # uploaded, not yet published: kill now
                    break
            time.sleep(0.02)
    finally:
        writer.send_signal(signal.SIGKILL)
        writer.wait()
    assert writer.returncode == -signal.SIGKILL, "the writer finished before it was killed"
    # the reader reads the last published generation, and only objects it names
    snapshot_files = published_files(url)
    for logical, obj in snapshot_files.items():
        assert store.exists(obj), logical
    objects = {e.path for e in store.list("facts")
               if e.path.endswith(".parquet") and not e.path.endswith("_schema.parquet")}
    retired = retired_objects(store)
    orphans = objects - set(snapshot_files.values()) - retired
    assert unnamed <= orphans | set(snapshot_files.values()) | retired
    con = query.connect(url)
    try:
        views = " ".join(r[0] for r in con.execute(
            "SELECT sql FROM duckdb_views() WHERE NOT internal").fetchall())
        assert con.execute("SELECT count(*) FROM gpu_minute").fetchone()[0] > 0
    finally:
        con.close()
    read = set(re.findall(re.escape(url) + r"/(facts/[^']+\.parquet)", views))
    assert read and not read & orphans
    assert read - {p for p in read if p.endswith("_schema.parquet")} <= \
        set(snapshot_files.values())
    # a restart from nothing (ingest has no checkpoint) gives the facts of one clean run
    again = subprocess.run(_ingest_cmd(histories[-1], url), env=_env(s3.env()),
                           capture_output=True, text=True, timeout=600, check=False)
    assert again.returncode == 0, again.stderr
    assert_same_facts(url, reference, SPARSE)
    # compact removes what no generation names, and what was replaced more than
    # retain_s ago (0 here) with its retired logs
    assert retired_objects(store)   # the runs above replaced files, kept for readers
    done = subprocess.run([sys.executable, "-m", "gpuledger.cli.main", "compact", "--force",
                           "--warehouse", url], capture_output=True, text=True, timeout=600,
                          env=_env({**s3.env(), "GPULEDGER_WAREHOUSE__RETAIN_S": "0"}),
                          check=False)
    assert done.returncode == 0, done.stderr
    left = {e.path for e in store.list("facts")
            if e.path.endswith(".parquet") and not e.path.endswith("_schema.parquet")}
    named = {o for m in read_manifests(store).values() for o in m.files.values()}
    assert left == named and not retired_objects(store)
    assert "object(s) replaced more than 0 s ago" in done.stdout
    assert_same_facts(url, reference, SPARSE)


def test_replaced_objects_go_after_the_grace_period(histories: list[Path],
                                                    tmp_path: Path) -> None:
    root = tmp_path / "wh"
    config = ProcessorConfig(warehouse=WarehouseOptions(retain_s=0))
    ingest(sorted(histories[0].glob("*.jsonl")), root, config)
    ingest(sorted(histories[1].glob("*.jsonl")), root, config)
    named = set(published_files(root).values())
    on_disk = {p.relative_to(root).as_posix() for p in (root / "facts").rglob("*.parquet")
               if p.name != "_schema.parquet"}
    # retain_s 0: what a commit replaces goes at once, and no retired log is left
    assert on_disk == named and not retired_objects(open_store(root))
    kept = ProcessorConfig(warehouse=WarehouseOptions(retain_s=3600))
    ingest(sorted(histories[0].glob("*.jsonl")), tmp_path / "kept", kept)
    ingest(sorted(histories[0].glob("*.jsonl")), tmp_path / "kept", kept)
    kept_store = open_store(tmp_path / "kept")
    retired = retired_objects(kept_store)
    assert retired  # partial hours, snapshots, roll-ups replaced: still there
    assert all((tmp_path / "kept" / o).exists() for o in retired)
    # listed in retired logs, not in the manifests, which name what is current only
    assert not read_manifests(kept_store)["warehouse"].retired
    assert b'"retired": {}' in max((tmp_path / "kept" / "manifests" / "warehouse").glob(
        "*.json")).read_bytes()


def test_compaction_keeps_the_facts_and_one_object_per_day(
    histories: list[Path], reference: Path, tmp_path: Path,
) -> None:
    root = tmp_path / "wh"
    ingest(sorted(histories[-1].glob("*.jsonl")), root,
           ProcessorConfig(warehouse=WarehouseOptions(compact=False)))
    before = len(published_files(root))
    done = subprocess.run([sys.executable, "-m", "gpuledger.cli.main", "compact", "--force",
                           "--warehouse", str(root)], capture_output=True, text=True,
                          env=_env({}), timeout=600, check=False)
    assert done.returncode == 0, done.stderr
    assert "compacted" in done.stdout
    assert len(published_files(root)) < before
    assert_same_facts(root, reference, SPARSE)
    _assert_compacted(str(root))


def test_an_hour_written_into_a_compacted_day_replaces_its_rows_there(tmp_path: Path) -> None:
    wh = Warehouse(tmp_path / "wh", options=WarehouseOptions(compact_after_s=0))
    day = datetime(2026, 1, 5, tzinfo=UTC)

    def rows(hour: int, n: int, tag: str) -> pl.DataFrame:
        return pl.DataFrame({"time": [day + timedelta(hours=hour, minutes=i) for i in range(n)],
                             "job_id": [f"{tag}{i}" for i in range(n)],
                             "attempt": [0] * n})

    keys = ["time", "job_id", "attempt"]
    for hour in range(3):
        wh.write_part("preemptions", day + timedelta(hours=hour), rows(hour, 2, "a"), keys,
                      merge=True)
    wh.commit(day + timedelta(days=1))  # the day is closed: compacted in this commit
    wh.sync()
    logical = {k for k in published_files(tmp_path / "wh") if "/preemptions/" in k}
    assert logical == {"facts/preemptions/date=2026-01-05/preemptions-2026-01-05.parquet"}
    # late rows of hour 1 merge into the day; hour 2 written again replaces its rows
    wh.write_part("preemptions", day + timedelta(hours=1), rows(1, 3, "a"), keys, merge=True)
    wh.write_part("preemptions", day + timedelta(hours=2), rows(2, 1, "b"), keys)
    wh.commit(wait=True)
    got = read_table(tmp_path / "wh", "preemptions").drop_nulls("job_id")
    assert sorted(got["job_id"].to_list()) == ["a0", "a0", "a1", "a1", "a2", "b0"]
    assert {k for k in published_files(tmp_path / "wh") if "/preemptions/" in k} == logical


@pytest.mark.parametrize("merge", [False, True])
def test_an_hour_written_into_a_large_compacted_day_is_sorted_in_buckets(
        tmp_path: Path, merge: bool) -> None:
    """A day larger than a bucket (``compact_bucket_rows`` 1000, the day 5,760 rows): an
    hour written into it again is sorted in buckets, never the whole day in memory, and
    the day holds what a sort of the whole in memory gives."""
    import random

    rng = random.Random(3)
    wh = Warehouse(tmp_path / "wh", options=WarehouseOptions(compact_after_s=0,
                                                             compact_bucket_rows=1000))
    day = datetime(2026, 1, 5, tzinfo=UTC)
    keys = ["minute", "node", "gpu_index"]

    def rows(hour: int, gpus: range, tag: str) -> pl.DataFrame:
        minutes = [day + timedelta(hours=hour, minutes=m) for m in range(60)]
        return pl.DataFrame({
            "minute": [m for m in minutes for _ in gpus], "node": "n1",
            "gpu_index": [g for _ in minutes for g in gpus],
            "job_id": [rng.choice(["j1", "j2", "j3", None]) for _ in minutes for _ in gpus],
            "value": [rng.randrange(1000) / 8 for _ in minutes for _ in gpus],
            "tag": tag})

    hours = [rows(h, range(4), "old") for h in range(24)]
    for h, frame in enumerate(hours):
        wh.write_part("gpu_minute", day + timedelta(hours=h), frame, keys)
    wh.commit(day + timedelta(days=1), wait=True)  # compacted: one object for the day
    late = rows(7, range(2, 6), "new")  # GPUs 2, 3 written again; 4, 5 new
    wh.write_part("gpu_minute", day + timedelta(hours=7), late, keys, merge=merge)
    wh.commit(wait=True)
    # with merge, the hour's old rows that no new row replaces stay
    hour7 = pl.concat([hours[7].join(late, on=keys, how="anti"), late]) if merge else late
    want = pl.concat([*hours[:7], hour7, *hours[8:]]).sort(
        ["job_id", "minute", "node", "gpu_index"], nulls_last=True, maintain_order=True)
    got = read_table(tmp_path / "wh", "gpu_minute").select(want.columns)
    assert got.equals(want)
    assert got.filter(pl.col("tag") == "old").height == 23 * 240 + (120 if merge else 0)
    assert {k for k in published_files(tmp_path / "wh") if "/gpu_minute/" in k} == \
        {"facts/gpu_minute/date=2026-01-05/gpu_minute-2026-01-05.parquet"}


def test_a_failing_spill_folder_puts_compaction_off_and_loses_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Compaction spills to $TMPDIR; when that fails, the day stays in hours (readable,
    nothing lost) and the next commit compacts it."""
    import tempfile

    wh = Warehouse(tmp_path / "wh", options=WarehouseOptions(compact_after_s=0))
    day = datetime(2026, 1, 5, tzinfo=UTC)
    keys = ["time", "job_id", "attempt"]
    for hour in range(3):
        frame = pl.DataFrame({"time": [day + timedelta(hours=hour)], "job_id": [f"j{hour}"],
                              "attempt": [0]})
        wh.write_part("preemptions", day + timedelta(hours=hour), frame, keys)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "missing"))
    with caplog.at_level(logging.WARNING, logger="gpuledger.warehouse"):
        wh.commit(day + timedelta(days=1), wait=True)
    assert "compaction of facts/preemptions/date=2026-01-05" in caplog.text
    hourly = {k for k in published_files(tmp_path / "wh") if "/preemptions/" in k}
    assert len(hourly) == 3
    assert sorted(read_table(tmp_path / "wh", "preemptions")["job_id"].to_list()) == \
        ["j0", "j1", "j2"]
    monkeypatch.setattr(tempfile, "tempdir", None)
    wh.commit(day + timedelta(days=1), wait=True)
    assert {k for k in published_files(tmp_path / "wh") if "/preemptions/" in k} == \
        {"facts/preemptions/date=2026-01-05/preemptions-2026-01-05.parquet"}
    assert sorted(read_table(tmp_path / "wh", "preemptions")["job_id"].to_list()) == \
        ["j0", "j1", "j2"]


def test_every_job_a_reader_sees_on_a_gpu_mid_run_is_an_attempt(tmp_path: Path) -> None:
    """While the service's engine runs (no flush yet), every job that held a GPU in the
    published minutes is in `attempts`, ended or running: the running snapshot and the
    ended attempts are written in the step's generation (before, the snapshot only at a
    stop and ended attempts when their hour was complete: jobs in neither)."""
    config = ProcessorConfig(warehouse=WarehouseOptions(snapshot_interval_s=0))
    root = tmp_path / "wh"
    proc = Processor(config, Warehouse(root, options=config.warehouse), telemetry_clock=True)
    batches = list(simulate(SimConfig(hours=4, seed=3, sample_interval_s=60, start=START,
                                      cluster=parse_cluster(SMALL))))
    checked = 0
    for i, batch in enumerate(batches):
        proc.process(batch)
        if i < 11 or i % 6 != 5:   # after each simulated hour from the second
            continue
        _cols, rows = query.run(root, """
            SELECT (SELECT count(DISTINCT job_id) FROM gpu_minute),
                   (SELECT count(DISTINCT job_id) FROM gpu_minute
                    WHERE job_id NOT IN (SELECT job_id FROM attempts)),
                   (SELECT count(*) FROM attempts WHERE status = 'running')""")
        jobs, missing, running = rows[0]
        assert jobs > 0 and running > 0
        assert missing == 0, (i, missing)
        checked += 1
    assert checked >= 2
