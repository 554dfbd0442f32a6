"""The warehouse stays read-only under hostile SQL: a corpus of statements through
``gpuledger query`` (every way to write, attach, install, reach the network or change a
setting), each refused in one line or, when it only reads, answered; afterwards every
file of the warehouse is byte-identical, no extension was installed, no connection
was made."""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from events import alloc, at, frames, inventory, job, series

from gpuledger.cli.main import main
from gpuledger.pipeline import query
from gpuledger.pipeline.config import ProcessorConfig
from gpuledger.pipeline.processor import Processor
from gpuledger.pipeline.warehouse import Warehouse

READ, REFUSED = "read", "refused"
PIVOT = "PIVOT gpu_minute ON state USING count(*)"
EMPTY = "SELECT * FROM gpu_minute WHERE false"

# (statement, outcome). {F}: the facts folder, {G}: an existing fact file, {C}: the
# catalog, {W}: the warehouse, {OUT}: a folder outside it, {NET}: a listening local port.
CORPUS: list[tuple[str, str]] = [
    # -- COPY and EXPORT, plain and wrapped -------------------------------------------
    (f"COPY ({EMPTY}) TO '{{G}}' (FORMAT parquet)", REFUSED),
    (f"EXPLAIN ANALYZE COPY ({EMPTY}) TO '{{G}}' (FORMAT parquet)", REFUSED),
    (f"EXPLAIN COPY ({EMPTY}) TO '{{G}}' (FORMAT parquet)", REFUSED),
    (f"EXPLAIN (ANALYZE) COPY ({EMPTY}) TO '{{G}}' (FORMAT parquet)", REFUSED),
    (f"EXPLAIN (ANALYZE, FORMAT json) COPY ({EMPTY}) TO '{{G}}'", REFUSED),
    (f"explain analyse copy ({EMPTY}) to '{{G}}' (format parquet)", REFUSED),
    (f"EXPLAIN /* x */ ANALYZE -- y\n COPY ({EMPTY}) TO '{{G}}' (FORMAT parquet)", REFUSED),
    ("COPY gpu_minute TO '{F}/gpu_minute/evil.csv'", REFUSED),
    ("COPY gpu_minute TO '{F}/gpu_minute' (FORMAT parquet, PARTITION_BY (node))", REFUSED),
    (f"COPY ({PIVOT}) TO '{{F}}/pivot.csv'", REFUSED),
    (f"EXPLAIN ANALYZE COPY ({PIVOT}) TO '{{F}}/pivot.csv'", REFUSED),
    (f"EXPLAIN ANALYZE COPY (FROM ({PIVOT})) TO '{{F}}/pivot.csv'", REFUSED),
    ("COPY (SELECT 1) TO '{C}'", REFUSED),
    ("COPY (SELECT 1) TO '{OUT}/out.csv'", REFUSED),
    ("COPY gpu_minute FROM '{G}'", REFUSED),
    ("COPY FROM DATABASE catalog TO memory", REFUSED),
    ("EXPORT DATABASE '{F}/export'", REFUSED),
    ("EXPORT DATABASE '{OUT}/export' (FORMAT parquet)", REFUSED),
    ("IMPORT DATABASE '{F}'", REFUSED),
    # -- DML and DDL ------------------------------------------------------------------
    ("INSERT INTO gpu_minute SELECT * FROM gpu_minute", REFUSED),
    (f"INSERT INTO gpu_minute {PIVOT}", REFUSED),
    (f"WITH p AS ({PIVOT}) INSERT INTO gpu_minute SELECT * FROM p", REFUSED),
    ("WITH a AS (SELECT 1) INSERT INTO gpu_minute SELECT * FROM gpu_minute", REFUSED),
    ("UPDATE gpu_minute SET node = 'x'", REFUSED),
    ("DELETE FROM gpu_minute", REFUSED),
    ("TRUNCATE gpu_minute", REFUSED),
    ("MERGE INTO gpu_minute USING gpu_minute s ON true WHEN MATCHED THEN DELETE", REFUSED),
    ("CREATE TABLE x AS SELECT 1", REFUSED),
    ("CREATE TEMP TABLE x AS SELECT 1", REFUSED),
    (f"CREATE TEMP TABLE x AS {PIVOT}", REFUSED),
    ("CREATE VIEW v AS SELECT 1", REFUSED),
    ("CREATE OR REPLACE VIEW gpu_minute AS SELECT 1 AS x", REFUSED),
    ("CREATE MACRO m(x) AS x + 1", REFUSED),
    ("CREATE TEMP MACRO t() AS TABLE SELECT 1", REFUSED),
    ("CREATE SEQUENCE s", REFUSED),
    ("CREATE SCHEMA s", REFUSED),
    ("CREATE TYPE t AS ENUM ('a', 'b')", REFUSED),
    ("CREATE SECRET (TYPE s3, KEY_ID 'k', SECRET 's')", REFUSED),
    ("CREATE PERSISTENT SECRET p (TYPE s3, KEY_ID 'k', SECRET 's')", REFUSED),
    ("CREATE INDEX i ON gpu_minute (node)", REFUSED),
    ("DROP VIEW gpu_minute", REFUSED),
    ("DROP TABLE IF EXISTS x", REFUSED),
    ("DROP MACRO waste_sources_between", REFUSED),
    ("DROP SECRET IF EXISTS p", REFUSED),
    ("ALTER VIEW gpu_minute RENAME TO g", REFUSED),
    ("COMMENT ON VIEW gpu_minute IS 'x'", REFUSED),
    # -- other databases, extensions --------------------------------------------------
    ("ATTACH '{W}/other.duckdb' AS o", REFUSED),
    ("ATTACH '{F}/new.duckdb' AS o", REFUSED),
    ("ATTACH '{C}' AS again (READ_WRITE)", REFUSED),
    ("ATTACH ':memory:' AS m", REFUSED),
    ("ATTACH 'http://{NET}/x.duckdb' AS r", REFUSED),
    ("ATTACH 'sqlite:{OUT}/x.db' AS s", REFUSED),
    ("DETACH catalog", REFUSED),
    ("USE memory", REFUSED),
    ("INSTALL httpfs", REFUSED),
    ("FORCE INSTALL httpfs", REFUSED),
    ("INSTALL httpfs FROM 'http://{NET}'", REFUSED),
    ("LOAD httpfs", REFUSED),
    ("LOAD '{OUT}/evil.duckdb_extension'", REFUSED),
    ("UPDATE EXTENSIONS", REFUSED),
    ("UPDATE EXTENSIONS (httpfs)", REFUSED),
    ("EXPLAIN ANALYZE INSTALL httpfs", REFUSED),
    ("EXPLAIN ANALYZE LOAD httpfs", REFUSED),
    # -- settings, pragmas, calls, transactions ---------------------------------------
    ("SET threads = 1", REFUSED),
    ("SET enable_external_access = true", REFUSED),
    ("SET lock_configuration = false", REFUSED),
    ("RESET lock_configuration", REFUSED),
    ("SET allowed_directories = ['/']", REFUSED),
    ("SET GLOBAL autoinstall_known_extensions = true", REFUSED),
    ("SET profiling_output = '{F}/profile.json'", REFUSED),
    ("SET VARIABLE x = 1", REFUSED),
    ("PRAGMA enable_profiling", REFUSED),
    ("PRAGMA threads = 1", REFUSED),
    ("PRAGMA version", REFUSED),
    ("CALL pragma_version()", REFUSED),
    ("CALL enable_logging()", REFUSED),
    ("CHECKPOINT", REFUSED),
    ("FORCE CHECKPOINT", REFUSED),
    ("VACUUM", REFUSED),
    ("ANALYZE", REFUSED),
    ("BEGIN TRANSACTION", REFUSED),
    ("PREPARE p AS SELECT 1", REFUSED),
    ("EXECUTE p", REFUSED),
    # -- several statements, comments, odd text ---------------------------------------
    ("SELECT 1; DROP VIEW gpu_minute", REFUSED),
    ("SELECT 1; COPY (SELECT 1) TO '{F}/x.csv'", REFUSED),
    ("/* harmless */ COPY (SELECT 1) TO '{F}/x.csv'", REFUSED),
    ("-- a comment\nCOPY (SELECT 1) TO '{F}/x.csv'", REFUSED),
    ("SeLeCt 1; CoPy (SeLeCt 1) To '{F}/x.csv'", REFUSED),
    ("EXPLAIN ANALYZE SELECT 1; COPY (SELECT 1) TO '{F}/x.csv'", REFUSED),
    ("EXPLAIN EXPLAIN ANALYZE SELECT 1", REFUSED),
    ("", REFUSED),
    (";", REFUSED),
    ("-- only a comment", REFUSED),
    ("SELEC 1", REFUSED),
    ("SELECT 1 /* ; COPY (SELECT 1) TO 'x.csv' */", READ),
    ("SELECT '; COPY (SELECT 1) TO ''x.csv'''", READ),
    ("SELECT 1; SELECT 2", REFUSED),   # one statement at a time (the last alone was shown)
    # -- reaching outside the facts: files, the network, extensions -------------------
    ("SELECT * FROM read_parquet('http://{NET}/x.parquet')", REFUSED),
    ("SELECT * FROM read_csv('https://{NET}/x.csv')", REFUSED),
    ("SELECT * FROM read_json('http://{NET}/x.json')", REFUSED),
    ("SELECT * FROM read_parquet('s3://bucket/x.parquet')", REFUSED),
    ("SELECT * FROM 'http://{NET}/x.parquet'", REFUSED),
    ("SELECT * FROM read_csv('/etc/passwd')", REFUSED),
    ("SELECT * FROM read_text('/proc/self/environ')", REFUSED),
    ("SELECT * FROM read_text('{F}/../../outside.txt')", REFUSED),
    ("SELECT * FROM read_text('{F}_sibling/x.txt')", REFUSED),
    ("SELECT * FROM read_blob('{OUT}/*')", REFUSED),
    ("SELECT * FROM glob('/*')", REFUSED),
    ("SELECT * FROM sqlite_scan('{OUT}/x.db', 't')", REFUSED),
    ("SELECT * FROM postgres_scan('host=127.0.0.1', 'public', 't')", REFUSED),
    ("SELECT * FROM iceberg_scan('{F}')", REFUSED),
    ("SELECT * FROM query('COPY (SELECT 1) TO ''{F}/x.csv''')", REFUSED),
    ("SELECT getenv('HOME')", REFUSED),
    ("SELECT nextval('s')", REFUSED),
    # -- reads that must be answered --------------------------------------------------
    ("SELECT count(*) FROM gpu_minute", READ),
    ("FROM gpu_minute LIMIT 1", READ),
    ("WITH x AS (SELECT 1 AS a) SELECT * FROM x", READ),
    ("VALUES (1), (2)", READ),
    ("TABLE job_attempts", READ),
    ("SELECT 1 UNION ALL SELECT 2", READ),
    ("(SELECT 1)", READ),
    (PIVOT, READ),
    (f"SELECT * FROM ({PIVOT}) p", READ),
    (f"EXPLAIN ANALYZE {PIVOT}", READ),
    ("FROM gpu_minute PIVOT (count(*) FOR state IN ('free', 'allocated_busy'))", READ),
    ("UNPIVOT (SELECT node, gpu_index, alloc_fraction FROM gpu_minute) "
     "ON alloc_fraction INTO NAME k VALUE v", READ),
    ("EXPLAIN SELECT count(*) FROM gpu_minute", READ),
    ("EXPLAIN ANALYZE SELECT count(*) FROM gpu_minute", READ),
    ("EXPLAIN (FORMAT json) SELECT 1", READ),
    ("EXPLAIN (SELECT 1)", READ),
    ("SUMMARIZE job_attempts", READ),
    ("DESCRIBE gpu_minute", READ),
    ("SHOW TABLES", READ),
    ("SELECT * FROM read_parquet('{F}/gpu_minute/**/*.parquet') LIMIT 1", READ),
    ("SELECT count(*) FROM '{G}'", READ),
    ("SELECT current_setting('enable_external_access')", READ),
    ("SELECT * FROM duckdb_settings() WHERE name = 'lock_configuration'", READ),
    ("SELECT * FROM query_table('job_attempts')", READ),
    ("FROM top_waste_jobs(n := 1)", READ),
]


def _digest(root: Path) -> dict[str, str]:
    """Every path under ``root``: a file's SHA-256, or 'dir'."""
    return {str(p.relative_to(root)): (hashlib.sha256(p.read_bytes()).hexdigest()
                                       if p.is_file() else "dir")
            for p in sorted(root.rglob("*"))}


@pytest.fixture(scope="module")
def warehouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("readonly") / "wh"
    recs = [inventory("n1", at(0), gpus=2), job("submitted", "j", at(0), team="nlp"),
            job("started", "j", at(0), allocation=alloc("n1", 0)), job("finished", "j", at(5))]
    recs += series("n1", 0, at(0), 5, sm=0.5)
    proc = Processor(ProcessorConfig(), Warehouse(root))
    proc.process(frames(recs), validated=True)
    proc.flush()
    return root


class Listener:
    """A real TCP listener on 127.0.0.1 that counts the connections it accepts."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.address = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self.connections = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            self.connections += 1
            conn.close()

    def close(self) -> None:
        self.stop.set()
        self.thread.join()
        self.sock.close()


def test_corpus_is_refused_in_one_line_and_the_warehouse_is_unchanged(
        warehouse: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert len(CORPUS) >= 80
    monkeypatch.setenv("HOME", str(tmp_path / "home"))     # where DuckDB keeps extensions
    outside = tmp_path / "outside"
    outside.mkdir()
    fact = next((warehouse / "facts" / "gpu_minute").glob("date=*/*.parquet"))
    listener = Listener()
    before = _digest(warehouse)
    wrong: list[str] = []
    try:
        for template, outcome in CORPUS:
            sql = template.format(F=warehouse / "facts", G=fact, C=warehouse / "catalog.duckdb",
                                  W=warehouse, OUT=outside, NET=listener.address)
            try:
                columns, _rows = query.run(warehouse, sql, timeout_s=60)
                got, message = READ, ""
                if not columns:
                    wrong.append(f"{sql!r}: answered without columns")
            except query.QueryError as exc:
                got, message = REFUSED, str(exc)
                if "\n" in message or not message.strip():
                    wrong.append(f"{sql!r}: not one line: {message!r}")
            if got != outcome:
                wrong.append(f"{sql!r}: expected {outcome}, got {got} {message}")
    finally:
        listener.close()
    assert not wrong, "\n".join(wrong)
    assert _digest(warehouse) == before
    assert list(outside.iterdir()) == []
    assert listener.connections == 0                     # nothing reached the network
    assert not (tmp_path / "home").exists()              # nothing installed


def test_read_only_by_construction_without_the_statement_check(warehouse: Path) -> None:
    """The connection itself refuses what the statement check would have caught."""
    con = query.connect(warehouse)
    before = _digest(warehouse)
    try:
        for sql in ("SET enable_external_access = true", "SET lock_configuration = false",
                    "CREATE TABLE x AS SELECT 1", "INSTALL httpfs", "LOAD httpfs",
                    f"ATTACH '{warehouse}/other.duckdb' AS o",
                    "COPY (SELECT 1) TO '/tmp/gpuledger-readonly-test.csv'",
                    "SELECT * FROM read_csv('/etc/passwd')"):
            with pytest.raises(Exception, match=r"Permission|locked|read-only|disabled"):
                con.execute(sql)
        assert con.execute("SELECT current_setting('autoinstall_known_extensions'), "
                           "current_setting('autoload_known_extensions'), "
                           "current_setting('lock_configuration')").fetchone() == (
            False, False, True)
    finally:
        con.close()
    assert _digest(warehouse) == before
    assert not Path("/tmp/gpuledger-readonly-test.csv").exists()


def test_without_a_catalog_the_in_memory_views_are_locked_down_too(
        warehouse: Path, tmp_path: Path) -> None:
    bare = tmp_path / "bare"
    (bare / "facts").mkdir(parents=True)
    for path in [*(warehouse / "facts").rglob("*.parquet"),
                 *(warehouse / "manifests").rglob("*.json")]:  # the published generation
        target = bare / path.relative_to(warehouse)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(path.read_bytes())
    assert query.run(bare, "SELECT count(*) FROM job_attempts")[1] == [(1,)]
    for sql in ("SELECT * FROM read_csv('/etc/passwd')", "SET threads = 1",
                "COPY (SELECT 1) TO '" + str(bare / "facts" / "x.csv") + "'"):
        with pytest.raises(query.QueryError):
            query.run(bare, sql)
    assert not (bare / "facts" / "x.csv").exists()


def test_cli_refuses_in_one_line_and_answers_reads(
        warehouse: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fact = next((warehouse / "facts" / "gpu_minute").glob("date=*/*.parquet"))
    for sql in (f"EXPLAIN ANALYZE COPY ({EMPTY}) TO '{fact}' (FORMAT parquet)",
                "UPDATE EXTENSIONS", "SELECT * FROM read_parquet('http://127.0.0.1:9/x')",
                "SET threads = 1", "SELEC 1"):
        assert main(["query", "--warehouse", str(warehouse), sql]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("gpuledger: error: "), err
    assert main(["query", "--warehouse", str(warehouse), "--format", "csv",
                 "PIVOT (SELECT state FROM gpu_minute) ON state USING count(*)"]) == 0
    assert capsys.readouterr().out.splitlines()[0].startswith("allocated_busy")
    # two reads: each ran, and the last one's rows alone were shown, nothing said
    assert main(["query", "--warehouse", str(warehouse),
                 "SELECT count(*) AS a FROM gpu_minute; SELECT count(*) AS b FROM attempts"]
                ) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == ("gpuledger: error: one statement at a time (got 2): each "
                                 "would run, and only the last one's rows be shown; run "
                                 "them one by one\n"), err
    assert main(["query", "--warehouse", str(warehouse), "--format", "csv",
                 "SELECT 1 AS one;  -- a trailing semicolon is one statement"]) == 0
    assert capsys.readouterr().out == "one\n1\n"


SLOW = "SELECT sum(hash(a.range || b.range)) FROM range(100000) a, range(100000) b"


def test_timeout_stops_the_query_with_one_line(warehouse: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    started = time.monotonic()
    assert main(["query", "--warehouse", str(warehouse), "--timeout", "0.5", SLOW]) == 2
    assert time.monotonic() - started < 10
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "longer than 0.5 s" in err, err
    with pytest.raises(SystemExit) as stopped:                 # argparse: a usage error
        main(["query", "--warehouse", str(warehouse), "--timeout", "nan", "SELECT 1"])
    assert stopped.value.code == 2
    assert "--timeout must be a number of seconds" in capsys.readouterr().err


def test_ctrl_c_exits_130_with_one_line(warehouse: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuledger.cli.main", "query", "--warehouse", str(warehouse),
         SLOW], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        time.sleep(3.0)                                   # importing, then the query runs
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert err == "gpuledger: interrupted\n" and out == ""


def test_a_query_that_is_not_utf8_is_one_line(warehouse: Path,
                                              capsys: pytest.CaptureFixture[str],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    latin = b"SELECT 1 -- caf\xe9\n"
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(latin)))
    assert main(["query", "--warehouse", str(warehouse), "-"]) == 2
    assert capsys.readouterr().err == "gpuledger: error: the query is not UTF-8 text\n"
    argument = latin.decode("utf-8", "surrogateescape")      # as Python hands over argv
    assert main(["query", "--warehouse", str(warehouse), argument]) == 2
    assert capsys.readouterr().err == "gpuledger: error: the query is not UTF-8 text\n"


@pytest.mark.parametrize(("sql", "named"), [
    ("INSTALL httpfs", "got INSTALL (DuckDB's kind: LOAD)"),
    ("use memory", "got USE (DuckDB's kind: SET)"),
    ("CHECKPOINT", "got CHECKPOINT (DuckDB's kind: CALL)"),
    ("EXPLAIN ANALYZE CHECKPOINT", "got EXPLAIN of CHECKPOINT (DuckDB's kind: CALL)"),
    ("WITH a AS (SELECT 1) INSERT INTO gpu_minute SELECT * FROM a", "got INSERT"),
    ("COPY (SELECT 1) TO 'x.csv'", "got COPY"),
    # these read as another kind before (got LOAD, VACUUM, TRANSACTION, DROP, ALTER)
    ("force install httpfs", "got FORCE INSTALL (DuckDB's kind: LOAD)"),
    ("ANALYZE", "got ANALYZE (DuckDB's kind: VACUUM)"),
    ("ROLLBACK", "got ROLLBACK (DuckDB's kind: TRANSACTION)"),
    ("DEALLOCATE p", "got DEALLOCATE (DuckDB's kind: DROP)"),
    ("COMMENT ON TABLE gpu_minute IS 'x'", "got COMMENT (DuckDB's kind: ALTER)"),
])
def test_a_refusal_names_the_statement_as_it_was_written(warehouse: Path, sql: str,
                                                         named: str) -> None:
    """DuckDB files INSTALL under LOAD, USE under SET and CHECKPOINT under CALL: the
    refusal says what the user wrote ("got LOAD" for an INSTALL puzzled)."""
    with pytest.raises(query.QueryError) as refused:
        query.run(warehouse, sql)
    assert str(refused.value).endswith(named), str(refused.value)


def test_duckdbs_answer_to_an_interrupt_is_told_as_an_interrupt(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by sending Ctrl-C at random moments: when DuckDB runs a statement on the
    main thread (the views' mark, the history of ``report --whatif``, the catalog of
    ``compact``), DuckDB 2.0.1's binding answers SIGINT with a plain
    ``RuntimeError("Query interrupted")`` (seen in those tracebacks), neither
    ``duckdb.Error`` nor ``KeyboardInterrupt``: a traceback, exit 1. ``main`` tells it as
    an interrupt, exit 130; any other RuntimeError still goes up. (Sending SIGINT to a
    child in the middle of a DuckDB query, to get it from DuckDB itself, interrupted it
    in some runs under pytest and hung in others: not a test that can be trusted.)"""
    from gpuledger.cli import main as cli_main
    from gpuledger.cli.main import _duckdb_interrupted

    assert _duckdb_interrupted(RuntimeError("Query interrupted"))
    assert not _duckdb_interrupted(RuntimeError("something else"))

    def interrupted(_args: object) -> int:
        raise RuntimeError("Query interrupted")

    parser = cli_main.build_parser()
    monkeypatch.setattr(cli_main, "build_parser", lambda: parser)
    query = next(a for a in parser._subparsers._group_actions[0].choices.items()  # type: ignore[union-attr]
                 if a[0] == "query")[1]
    query.set_defaults(func=interrupted)
    assert main(["query", "SELECT 1"]) == 130
    assert capsys.readouterr().err == "gpuledger: interrupted\n"


def test_folders_of_readers_that_were_killed_are_removed(warehouse: Path,
                                                         tmp_path: Path) -> None:
    """A reader killed by SIGTERM or SIGKILL never removed its folder (its views
    database, 0.5 MB): 100 interrupted runs left 10. The next reader removes those of
    processes that are gone, untouched for an hour, and no other."""
    import tempfile

    from gpuledger.pipeline.query import SPILL_PREFIX

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    base = Path(tempfile.gettempdir())
    dead = base / f"{SPILL_PREFIX}{gone.pid}-x{tmp_path.name}"
    alive = base / f"{SPILL_PREFIX}{os.getppid()}-x{tmp_path.name}"
    old = time.time() - 7200   # untouched for two hours
    for folder in (dead, alive):
        folder.mkdir()
        (folder / "views.duckdb").write_bytes(b"x")
        os.utime(folder, (old, old))
    young = base / f"{SPILL_PREFIX}{gone.pid}-y{tmp_path.name}"  # another namespace's?
    young.mkdir()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "gpuledger.cli.main", "query", "--warehouse",
             str(warehouse), "SELECT count(*) AS n FROM attempts"],
            capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        assert not dead.exists() and alive.exists() and young.exists()
        # killed in the middle of a query: its own folder goes with the next reader
        slow = subprocess.Popen(
            [sys.executable, "-m", "gpuledger.cli.main", "query", "--warehouse",
             str(warehouse), SLOW], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while not list(base.glob(f"{SPILL_PREFIX}{slow.pid}-*")):
            assert time.monotonic() < deadline and slow.poll() is None
            time.sleep(0.1)
        slow.send_signal(signal.SIGTERM)
        slow.wait(timeout=30)
        left = list(base.glob(f"{SPILL_PREFIX}{slow.pid}-*"))
        assert left
        for folder in left:
            os.utime(folder, (old, old))
        assert main(["query", "--warehouse", str(warehouse), "SELECT 1 AS one"]) == 0
        assert not list(base.glob(f"{SPILL_PREFIX}{slow.pid}-*"))
    finally:
        for folder in (dead, alive, young):
            shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
@pytest.mark.parametrize("command", [["query", "--format", "json", "SELECT 1 AS one"],
                                     ["whatif", "--quiet", "--policy", "fgd"]])
def test_an_output_on_a_full_disk_is_one_line(warehouse: Path, command: list[str]) -> None:
    """Found by writing results to a full disk: ``> /dev/full`` gave a traceback (OSError,
    No space left on device)."""
    with open("/dev/full", "w") as full:
        proc = subprocess.run([sys.executable, "-m", "gpuledger.cli.main", *command,
                               "--warehouse", str(warehouse)], stdout=full,
                              stderr=subprocess.PIPE, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == ("gpuledger: error: cannot write the output: No space left on "
                           "device\n"), proc.stderr


@pytest.mark.parametrize("fmt", ["csv", "json", "table"])
def test_an_output_cut_short_by_a_filling_disk_is_an_error(warehouse: Path, fmt: str,
                                                           tmp_path: Path) -> None:
    """A probe wrote ``query --format csv`` to a disk that filled part way: 8 KiB of
    2.3 MB written, exit 0, nothing said (CPython's buffered stdout took the short
    write as the whole). A file size limit cuts the output the same way."""
    import resource

    limit = 4 << 20

    def capped() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    out = tmp_path / f"out.{fmt}"
    sql = "SELECT 1 AS n, repeat('x', 5000000) AS pad"  # one write past the limit
    with open(out, "w") as f:
        proc = subprocess.run([sys.executable, "-m", "gpuledger.cli.main", "query",
                               "--format", fmt, "--warehouse", str(warehouse), sql],
                              stdout=f, stderr=subprocess.PIPE, text=True, timeout=120,
                              preexec_fn=capped)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == "gpuledger: error: cannot write the output: File too large\n"
    assert out.stat().st_size == limit


def test_a_closed_standard_output_is_one_line(warehouse: Path) -> None:
    """``gpuledger query … >&-`` (a probe): Python starts with ``sys.stdout`` None, and
    the first write was an AttributeError traceback, exit 1."""
    proc = subprocess.run([sys.executable, "-m", "gpuledger.cli.main", "query",
                           "--warehouse", str(warehouse), "SELECT 1 AS one"],
                          stderr=subprocess.PIPE, text=True, timeout=120,
                          preexec_fn=lambda: os.close(1))
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == "gpuledger: error: cannot write the output: standard output is " \
        "closed\n"


def test_times_are_utc_whatever_the_machines_zone(warehouse: Path) -> None:
    """A probe ran ``query`` under ``TZ=America/Los_Angeles``: ``minute::date`` counted a
    day's minutes from 08:00 UTC, literals without an offset were read as Pacific time,
    and times came out as -08:00; the guide says times are UTC, and ``SET`` is refused."""
    sql = ("SELECT epoch(TIMESTAMPTZ '2026-01-05 00:00') AS e, "
           "(TIMESTAMPTZ '2026-01-05 23:30Z')::date AS d, "
           "TIMESTAMPTZ '2026-01-05 12:00Z' AS t, "
           "(TIMESTAMPTZ '2026-01-05 12:00Z' AT TIME ZONE 'Europe/Berlin') AS berlin")
    proc = subprocess.run([sys.executable, "-m", "gpuledger.cli.main", "query", "--format",
                           "csv", "--warehouse", str(warehouse), sql],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "TZ": "America/Los_Angeles"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "e,d,t,berlin", "1767571200.0,2026-01-05,2026-01-05T12:00:00+00:00,2026-01-05T13:00:00"]


def test_duckdbs_advice_to_change_a_setting_is_left_out(
        warehouse: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A query nested 5,000 deep was refused with DuckDB's advice 'Use "SET
    max_expression_depth TO x" …', which the reader then refuses (SET)."""
    sql = "SELECT " + "(" * 5000 + "1" + ")" * 5000
    assert main(["query", "--warehouse", str(warehouse), sql]) == 2
    err = capsys.readouterr().err
    assert err == ("gpuledger: error: cannot parse the query: Parser Error: Max expression "
                   "depth limit of 1000 exceeded.\n"), err
