"""The warehouse in an S3 bucket (a real S3 server: S3Proxy, tests/s3_server.py).

Through the command line, as a user runs it: `ingest`, `query`, `report` and `compact`
on ``s3://bucket/prefix`` with only the standard AWS variables set, giving the facts a
local folder gets; Polars reading the published files; bad locations, refused
credentials and an unreachable endpoint refused at start in one line; the secret key in
no output.
"""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import polars as pl
import pytest
from fact_views import assert_same_facts, view
from polars.testing import assert_frame_equal
from s3_server import S3Server
from test_simulate import SMALL

from gpuledger.pipeline.advisor.diagnosis_batch import SORT, diagnose_warehouse
from gpuledger.pipeline.config import ProcessorConfig
from gpuledger.pipeline.generations import read_manifests
from gpuledger.pipeline.ingest import ingest
from gpuledger.pipeline.partitions import Partitioning
from gpuledger.pipeline.processor import Processor
from gpuledger.pipeline.simulate import SimConfig, parse_cluster, simulate, write_jsonl
from gpuledger.pipeline.store import Store, open_store
from gpuledger.pipeline.warehouse import Warehouse, published_files, published_urls

SPARSE = ("blocked_minute", "preemptions", "candidates")


def _cli(*args: str, env: dict[str, str], cwd: Path | None = None,
         timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpuledger.cli.main", *args],
                          capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout,
                          check=False)


def _env(server: S3Server, **extra: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    return {**base, **server.env(), **extra}


@pytest.fixture(scope="module")
def events(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    out = tmp_path_factory.mktemp("events")
    write_jsonl(simulate(SimConfig(hours=3.0, seed=5, cluster=parse_cluster(SMALL))), out)
    return sorted(out.glob("*.jsonl"))


@pytest.fixture(scope="module")
def local(events: list[Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("local") / "wh"
    ingest(events, root, ProcessorConfig())
    return root


def test_ingest_query_report_on_a_bucket(s3: S3Server, events: list[Path], local: Path,
                                         tmp_path: Path) -> None:
    url = s3.bucket() + "/team/wh"
    env = _env(s3)
    done = _cli("ingest", *map(str, events), "--warehouse", url, "--quiet", env=env)
    assert done.returncode == 0, done.stderr
    assert f"into {url}/" in done.stdout
    q = _cli("query", "--warehouse", url, "--format", "csv",
             "SELECT count(*) AS n, round(sum(activity), 6) AS a FROM gpu_minute", env=env)
    assert q.returncode == 0, q.stderr
    want = _cli("query", "--warehouse", str(local), "--format", "csv",
                "SELECT count(*) AS n, round(sum(activity), 6) AS a FROM gpu_minute", env=env)
    assert q.stdout == want.stdout and int(q.stdout.splitlines()[1].split(",")[0]) > 0
    report = _cli("report", "--warehouse", url, env=env)
    assert report.returncode == 0, report.stderr
    assert "Where the GPUs go" in report.stdout or "GPU" in report.stdout
    html = tmp_path / "report.html"
    assert _cli("report", "--warehouse", url, "--html", str(html), env=env).returncode == 0
    assert html.stat().st_size > 10_000
    # every view holds what the local folder's does
    for key, value in s3.env().items():
        os.environ[key] = value
    try:
        assert_same_facts(url, local, SPARSE)
        # nothing of the warehouse landed in a local folder named after the URL
        assert not (Path.cwd() / "s3:").exists()
        # the catalog for other tools lives in the bucket, views over s3:// URLs
        store = open_store(url)
        assert store.exists("catalog.duckdb")
        assert any(e.path.startswith("manifests/warehouse/") for e in store.list("manifests"))
    finally:
        for key in s3.env():
            os.environ.pop(key, None)
    texts = [done.stdout, done.stderr, q.stdout, q.stderr, report.stdout, report.stderr]
    assert not any(s3.secret_key in t for t in texts)


def test_polars_reads_the_published_files(s3_env: str, local: Path, events: list[Path]) -> None:
    """The documented example (docs/warehouse.md, "Polars and other readers")."""
    url = s3_env + "/wh"
    ingest(events, url, ProcessorConfig())
    # -- the example ---------------------------------------------------------------
    files = published_urls(url, "gpu_hourly")
    hourly = (pl.scan_parquet(files, storage_options={"aws_allow_http": "true"})
              .group_by("team").agg(pl.col("allocated_gpu_hours").sum()))
    # ------------------------------------------------------------------------------
    got = hourly.collect().sort("team")
    want = view(local, "gpu_hourly").group_by("team").agg(
        pl.col("allocated_gpu_hours").sum()).sort("team")
    assert got.height > 0
    assert got["team"].to_list() == want["team"].to_list()
    assert got["allocated_gpu_hours"].to_list() == pytest.approx(
        want["allocated_gpu_hours"].to_list(), rel=1e-9)
    assert all(f.startswith(url + "/facts/gpu_hourly/") for f in files)


@pytest.mark.parametrize("location", ["gs://bucket/wh", "foo://x/y", "S3X://b/p",
                                      "s3://key:secret@bucket/wh", "s3:///wh", "", " "])
def test_a_location_not_served_is_refused_in_one_line(location: str, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    done = _cli("query", "--warehouse", location, "SELECT 1", env=env, cwd=tmp_path)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpuledger: error:"), done.stderr
    assert "secret" not in done.stderr
    assert list(tmp_path.iterdir()) == []  # never taken for a local folder
    ingest_run = _cli("ingest", "--warehouse", location, str(tmp_path / "none.jsonl"),
                      env=env, cwd=tmp_path)
    assert ingest_run.returncode == 2 and list(tmp_path.iterdir()) == []


def test_refused_credentials_stop_at_start_in_one_line(s3: S3Server, events: list[Path],
                                                       tmp_path: Path) -> None:
    url = s3.bucket() + "/wh"
    wrong = "wrong-" + s3.secret_key[::-1]
    env = _env(s3, AWS_SECRET_ACCESS_KEY=wrong)
    for args in (["ingest", *map(str, events), "--quiet"], ["query", "SELECT 1"],
                 ["report"], ["compact"]):
        started = time.monotonic()
        done = _cli(*args, "--warehouse", url, env=env, timeout=120)
        assert done.returncode == 2, (args, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1, (args, done.stderr)
        assert "access denied" in lines[0] and url in lines[0]
        assert wrong not in done.stdout + done.stderr
        assert s3.secret_key not in done.stdout + done.stderr
        assert time.monotonic() - started < 60
    bucket = url.removeprefix("s3://").split("/")[0]
    missing = _cli("query", "--warehouse", f"s3://no-such-{bucket}/wh", "SELECT 1",
                   env=_env(s3))
    assert missing.returncode == 2 and len(missing.stderr.strip().splitlines()) == 1
    assert "does not exist" in missing.stderr


def test_an_unreachable_endpoint_stops_at_start_in_one_line(s3: S3Server,
                                                            events: list[Path]) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # nothing listens there once closed
    env = _env(s3, AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}")
    for args in (["ingest", *map(str, events), "--quiet"], ["query", "SELECT 1"]):
        started = time.monotonic()
        done = _cli(*args, "--warehouse", "s3://bucket-x/wh", env=env, timeout=120)
        assert done.returncode == 2, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and "cannot reach the S3 endpoint" in lines[0], done.stderr
        assert time.monotonic() - started < 60


def test_ingest_again_uploads_nothing_new(s3_env: str, events: list[Path]) -> None:
    url = s3_env + "/wh"
    ingest(events, url, ProcessorConfig())
    first = published_files(url)
    objects = {e.path for e in open_store(url).list("facts")}
    ingest(events, url, ProcessorConfig())
    assert published_files(url) == first
    assert {e.path for e in open_store(url).list("facts")} == objects


def test_duckdb_threads_read_large_objects_in_ranges(s3_env: str, tmp_path: Path) -> None:
    """Objects past the whole-object size are read in ranges, by several DuckDB threads
    on one handle at once: every row comes back right."""
    from gpuledger.pipeline import query
    from gpuledger.pipeline.tables import TABLE_SCHEMAS
    from gpuledger.pipeline.warehouse import WHOLE_OBJECT_BYTES, Warehouse

    url = s3_env + "/wh"
    wh = Warehouse(url)
    for table, schema in TABLE_SCHEMAS.items():
        wh.ensure_schema(table, schema)
    n = 1_000_000
    blobs = [os.urandom(16).hex() for _ in range(n)]  # incompressible: a large object
    frame = pl.DataFrame({"job_id": [f"j{i % 997:04d}" for i in range(n)], "blob": blobs})
    wh.write("facts/rejects/snapshot.parquet", frame.select(
        pl.lit("telemetry").alias("record_type"), pl.col("job_id").alias("source"),
        pl.lit(1, pl.Int64).alias("line"), pl.col("blob").alias("reason"),
        pl.col("blob").alias("raw")), ["source", "raw"], row_group_size=100_000)
    wh.publish_catalog()
    wh.close()
    sizes = read_manifests(open_store(url))["warehouse"].sizes
    assert max(sizes.values()) > WHOLE_OBJECT_BYTES
    con = query.connect(url, threads=4)
    try:
        got = con.execute("SELECT count(*), count(DISTINCT raw), min(raw), max(raw) "
                          "FROM rejects").fetchone()
    finally:
        con.close()
    assert got == (n, len(set(blobs)), min(blobs), max(blobs))


def test_whatif_reads_a_bucket(s3: S3Server, events: list[Path], local: Path) -> None:
    url = s3.bucket() + "/wi/wh"
    env = _env(s3)
    assert _cli("ingest", *map(str, events), "--warehouse", url, "--quiet",
                env=env).returncode == 0
    args = ["whatif", "--policy", "fgd", "--json", "--quiet"]
    on_bucket = _cli(*args, "--warehouse", url, env=env)
    assert on_bucket.returncode == 0, on_bucket.stderr
    in_folder = _cli(*args, "--warehouse", str(local), env=env)
    assert in_folder.returncode == 0, in_folder.stderr
    got, want = json.loads(on_bucket.stdout), json.loads(in_folder.stdout)
    assert got["answers"] == want["answers"] and got["answers"]
    assert got["warehouse"] == url  # printed without credentials
    assert s3.secret_key not in on_bucket.stdout + on_bucket.stderr


def _same_rows(got: list[dict[str, object]], want: list[dict[str, object]]) -> bool:
    """The same rows, floats to 1e-8 or 1e-12 of their size (the written ones are rounded
    to 9 decimals)."""
    def same(a: object, b: object) -> bool:
        if isinstance(a, float) and isinstance(b, float):
            return math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-8)
        return a == b
    return len(got) == len(want) and all(
        g.keys() == w.keys() and all(same(g[k], w[k]) for k in g)
        for g, w in zip(got, want, strict=True))


def _diagnosis(out: str) -> list[dict[str, object]]:
    return sorted((json.loads(line) for line in out.splitlines()),
                  key=lambda r: (r["job_id"], r["attempt"], r["pattern"]))


def test_diagnose_writes_into_a_bucket_what_a_folder_gets(
        s3: S3Server, s3_env: str, events: list[Path], local: Path) -> None:
    """Diagnose was refused on a bucket ("reads and writes a warehouse folder"): now its
    rows, read through the bucket's views, are the folder's; and a compacted day in the
    bucket gives the same rows as its hourly objects did."""
    url = s3_env + "/dx/wh"
    env = _env(s3)
    assert _cli("ingest", *map(str, events), "--warehouse", url, "--quiet",
                env=env).returncode == 0
    folder = _cli("diagnose", "--warehouse", str(local), "--json", "--dry-run", "--quiet",
                  env=env)
    assert folder.returncode == 0, folder.stderr
    want = _diagnosis(folder.stdout)
    assert len(want) > 10 and {r["pattern"] for r in want} - {"unknown"}
    bucket = _cli("diagnose", "--warehouse", url, "--json", "--dry-run", "--quiet", env=env)
    assert bucket.returncode == 0, bucket.stderr
    assert _diagnosis(bucket.stdout) == want
    done = _cli("diagnose", "--warehouse", url, env=env)
    assert done.returncode == 0, done.stderr
    assert "wrote " in done.stdout and "Traceback" not in done.stderr
    assert s3.secret_key not in done.stdout + done.stderr
    written = _cli("query", "--warehouse", url, "--format", "json",
                   "SELECT * FROM job_diagnosis", env=env)
    assert written.returncode == 0, written.stderr
    # as written: floats to 9 decimals (warehouse.FLOAT_DECIMALS)
    assert _same_rows(_diagnosis(written.stdout), want)
    # the bucket's only day compacted into one object: read an hour at a time, as before
    assert _cli("compact", "--warehouse", url, "--before", "2026-02-01T00:00Z", "--force",
                env=env).returncode == 0
    assert not [k for k in published_files(url) if k.startswith("facts/gpu_minute/")
                and "T" in k.rsplit("/", 1)[-1].removeprefix("gpu_minute-")]
    again = _cli("diagnose", "--warehouse", url, "--json", "--dry-run", "--quiet", env=env)
    assert again.returncode == 0, again.stderr
    assert _diagnosis(again.stdout) == want


def test_the_demo_in_a_bucket_diagnoses_it(s3: S3Server) -> None:
    """The demo into a bucket warned "s3:/…: not a gpuledger warehouse (no facts/ folder)"
    and left job_diagnosis empty."""
    url = s3.bucket() + "/demo"
    env = _env(s3)
    demo = _cli("demo", "--hours", "1", "--quiet", "--warehouse", url, env=env)
    assert demo.returncode == 0, demo.stderr
    assert "warning" not in demo.stderr and "Traceback" not in demo.stderr, demo.stderr
    q = _cli("query", "--warehouse", url, "--format", "csv",
             "SELECT (SELECT count(*) FROM job_diagnosis WHERE pattern <> 'unknown'), "
             "(SELECT count(*) FROM recommendations WHERE diagnosis IS NOT NULL)", env=env)
    assert q.returncode == 0, q.stderr
    diagnosed, advised = map(int, q.stdout.splitlines()[1].split(","))
    assert diagnosed > 0 and advised > 0


def test_diagnose_fetches_each_object_of_a_bucket_once(
        s3: S3Server, s3_env: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A processor holding 4 partitions writes a bucket; compacted, each partition's day
    is one object, read an hour at a time: each is fetched once, not once an hour, and
    the diagnosis is the one of the hourly objects."""
    url = s3_env + "/parts/wh"
    proc = Processor(ProcessorConfig(), Warehouse(url), telemetry_clock=True,
                     partitioning=Partitioning(4, {0, 1, 2, 3}))
    for batch in simulate(SimConfig(hours=3.0, seed=5, cluster=parse_cluster(SMALL))):
        proc.process(batch)
    proc.flush()
    proc.warehouse.close()
    fetched: Counter[str] = Counter()
    read = Store.read

    def counted(store: Store, path: str) -> bytes | None:
        if path.startswith("facts/gpu_minute/"):
            fetched[path] += 1
        return read(store, path)

    monkeypatch.setattr(Store, "read", counted)
    hourly = diagnose_warehouse(url, write=False).rows
    assert len(fetched) == 4 * 3 and set(fetched.values()) == {1}, fetched
    assert _cli("compact", "--warehouse", url, "--before", "2026-02-01T00:00Z", "--force",
                env=_env(s3)).returncode == 0
    fetched.clear()
    daily = diagnose_warehouse(url, write=False).rows
    # one object a partition, each read once for its hours
    assert sorted(k.rsplit("/", 1)[1].split(".")[0] for k in fetched) == [
        f"gpu_minute-2026-01-05-p00{p}" for p in range(4)], fetched
    assert set(fetched.values()) == {1}, fetched
    assert_frame_equal(daily.sort(SORT), hourly.sort(SORT))


@pytest.mark.parametrize("where", ["empty/wh", "missing-bucket"])
def test_diagnose_of_a_bucket_that_is_no_warehouse_says_so_in_one_line(
        s3: S3Server, where: str) -> None:
    url = (s3.bucket() + "/" + where) if where == "empty/wh" else f"s3://nb-{os.getpid()}/wh"
    env = _env(s3)
    refused = _cli("diagnose", "--warehouse", url, env=env)
    assert refused.returncode == 2
    assert refused.stderr.count("\n") == 1, refused.stderr
    assert refused.stderr.startswith(f"gpuledger: error: {url}: "), refused.stderr
    assert ("nothing published yet" in refused.stderr if where == "empty/wh"
            else "does not exist" in refused.stderr), refused.stderr
    # the progress bar is not drawn before the refusal
    assert "diagnosing" not in refused.stderr


def test_a_damaged_object_is_named_by_query_and_report(s3: S3Server,
                                                       events: list[Path]) -> None:
    """An object cut short after it was published: the reader's error names it (DuckDB
    alone said "Failed to read … from Python file", naming no object)."""
    url = s3.bucket() + "/damaged"
    env = _env(s3)
    for key, value in s3.env().items():
        os.environ[key] = value
    try:
        ingest(events, url, ProcessorConfig())
        store = open_store(url)
        victim = sorted(o for o in published_files(url).values()
                        if o.startswith("facts/gpu_hourly/date="))[0]
        whole = store.read(victim)
        assert whole is not None and len(whole) > 300
        store.write(victim, whole[:300])
    finally:
        for key in s3.env():
            os.environ.pop(key, None)
    for args in (("query", "SELECT sum(allocated_gpu_hours) FROM gpu_hourly"), ("report",)):
        done = _cli(*args, "--warehouse", url, env=env)
        assert done.returncode == 2, done.stdout
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
        assert f"{url}/{victim}: damaged" in lines[0]
        assert f"holds 300 bytes where the generation's manifest says {len(whole)}" in lines[0]
