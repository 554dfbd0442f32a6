"""`gpuledger query --format csv|json` writes its rows as they come, a chunk at a time:
memory stays bounded whatever the size of the result (before, a 1.3-billion-row export
held every row twice and was killed, having printed nothing); a closed pipe (``| head``)
ends quietly with status 0; the time limit stops a stream midway with one line, and what
was written stays."""

from __future__ import annotations

import io
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from test_query_readonly import warehouse  # noqa: F401  (the same small warehouse)

from gpuledger.cli.main import main
from gpuledger.pipeline import query

CLI = [sys.executable, "-m", "gpuledger.cli.main", "query"]
ENDLESS = "SELECT range AS n FROM range(1000000000000)"
"""A trillion rows: more than any run of these tests can write."""

# Runs the CLI as its only child and prints its exit status and peak RSS (KiB): a fresh
# process, so that no earlier child of the test's process counts.
PEAK_RSS = """
import resource, subprocess, sys
with open(sys.argv[1], "wb") as out:
    rc = subprocess.call([sys.executable, "-m", "gpuledger.cli.main", *sys.argv[2:]],
                         stdout=out)
print(rc, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
"""


def _query_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "gpuledger-query" and t.is_alive()]


def _export(root: Path, rows: int, out: Path) -> tuple[int, int]:
    """``SELECT … FROM range(rows)`` exported as csv into ``out`` by the CLI in a
    subprocess: its exit status and peak RSS in MiB."""
    done = subprocess.run(
        [sys.executable, "-c", PEAK_RSS, str(out), "query", "--warehouse", str(root),
         "--format", "csv", f"SELECT range AS n FROM range({rows})"],
        capture_output=True, text=True, timeout=120, check=True)
    rc, peak_kib = done.stdout.split()
    return int(rc), int(peak_kib) // 1024


def test_a_big_csv_export_is_complete_in_bounded_memory(warehouse: Path,  # noqa: F811
                                                        tmp_path: Path) -> None:
    """750,000 and 3,000,000 rows (75 and 300 chunks): the same peak memory. Before, the
    peak grew with the result (213 MiB, then 439 MiB: every row held as a tuple, then
    again as text)."""
    small, big = 750_000, 3_000_000
    rc, small_peak = _export(warehouse, small, tmp_path / "small.csv")
    assert rc == 0
    rc, big_peak = _export(warehouse, big, tmp_path / "big.csv")
    assert rc == 0
    with (tmp_path / "big.csv").open() as out:
        lines = out.read().splitlines()
    assert len(lines) == big + 1
    assert lines[:3] == ["n", "0", "1"] and lines[-1] == str(big - 1)
    assert lines == ["n", *map(str, range(big))]
    # 2,250,000 more rows as tuples alone would take well over 100 MiB
    assert big_peak - small_peak < 48, (small_peak, big_peak)


def test_a_closed_pipe_ends_quietly_and_stops_the_query(warehouse: Path,  # noqa: F811
                                                        tmp_path: Path) -> None:
    """``gpuledger query … | head``: status 0, nothing on standard error, and the query
    stops at once although it had rows without end to give (a sparse filter, so that
    rows come steadily without piling up)."""
    err = tmp_path / "err.txt"
    with err.open("w") as err_file:
        proc = subprocess.Popen(
            [*CLI, "--warehouse", str(warehouse), "--format", "csv",
             "SELECT range AS n FROM range(1000000000000) WHERE hash(range) % 100 = 0"],
            stdout=subprocess.PIPE, stderr=err_file)
        try:
            stdout = proc.stdout
            assert stdout is not None
            lines: list[bytes] = []
            reader = threading.Thread(
                target=lambda: lines.extend(stdout.readline() for _ in range(3)), daemon=True)
            reader.start()
            reader.join(20)
            assert not reader.is_alive(), "no rows came within 20 s"
            assert lines[0] == b"n\n" and all(line.strip().isdigit() for line in lines[1:])
            stdout.close()                                       # head has had enough
            closed = time.monotonic()
            rc = proc.wait(timeout=30)
            assert time.monotonic() - closed < 5
        finally:
            proc.kill()
            proc.wait()
    assert rc == 0
    assert err.read_text() == ""


def test_the_time_limit_stops_a_stream_midway(
        warehouse: Path, tmp_path: Path) -> None:  # noqa: F811
    """A result without end under ``--timeout 2``: the rows written so far stay (whole
    lines, in order), then one line on standard error and status 2, at the limit."""
    out, err = tmp_path / "out.csv", tmp_path / "err.txt"
    started = time.monotonic()
    with out.open("wb") as out_file, err.open("w") as err_file:
        rc = subprocess.call([*CLI, "--warehouse", str(warehouse), "--format", "csv",
                              "--timeout", "2", ENDLESS], stdout=out_file, stderr=err_file,
                             timeout=60)
    took = time.monotonic() - started
    assert rc == 2
    message = err.read_text()
    assert message.count("\n") == 1 and message.startswith("gpuledger: error: "), message
    assert "longer than 2 s" in message and "Traceback" not in message
    lines = out.read_text().splitlines()
    assert len(lines) > 1                                 # rows were written before the limit
    assert lines == ["n", *map(str, range(len(lines) - 1))]
    assert took < 2 + 8                                   # start-up, then the limit


class _Writes(io.StringIO):
    """Standard output that counts its writes and notes whether the query still ran at
    the first."""

    def __init__(self) -> None:
        super().__init__()
        self.writes = 0
        self.query_ran_at_first_write: bool | None = None

    def write(self, s: str) -> int:
        if self.query_ran_at_first_write is None:
            self.query_ran_at_first_write = bool(_query_threads())
        self.writes += 1
        return super().write(s)


SAMPLE = """SELECT range AS i, 'r"' || range || chr(10) || ',x' AS s,
                   TIMESTAMPTZ '2026-01-05 00:00:00+00' + to_minutes(range) AS t,
                   (range / 7)::DECIMAL(12, 3) AS d,
                   CASE WHEN range % 3 = 0 THEN 'nan'::DOUBLE WHEN range % 3 = 1 THEN NULL
                        ELSE range / 3 END AS f
            FROM range(25000) ORDER BY range"""


def test_json_is_streamed_and_equals_the_rendered_rows(
        warehouse: Path, monkeypatch: pytest.MonkeyPatch,  # noqa: F811
        capsys: pytest.CaptureFixture[str]) -> None:
    """25 chunks of 1,000 rows (quotes, newlines, times, decimals, NaN, nulls): written a
    chunk at a time while the query still runs, and byte for byte what ``render`` makes
    of the same rows (csv too); a name twice is refused before anything is written, and
    so is a query stopped before its first row."""
    monkeypatch.setattr(query, "RENDER_CHUNK", 1000)
    columns, rows = query.run(warehouse, SAMPLE)
    assert len(rows) == 25_000
    for fmt in ("json", "csv"):
        stdout = _Writes()
        monkeypatch.setattr(sys, "stdout", stdout)
        assert main(["query", "--warehouse", str(warehouse), "--format", fmt, SAMPLE]) == 0
        assert stdout.getvalue() == query.render(columns, rows, fmt)
        assert stdout.writes >= 25 and stdout.query_ran_at_first_write, fmt
    monkeypatch.undo()
    capsys.readouterr()
    assert main(["query", "--warehouse", str(warehouse), "--format", "json",
                 "SELECT range AS a, range AS a FROM range(100000)"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1 and "appear more than once" in captured.err
    # a query stopped before its first row: not even the csv header
    slow = "SELECT sum(hash(a.range || b.range)) AS h FROM range(100000) a, range(100000) b"
    assert main(["query", "--warehouse", str(warehouse), "--format", "csv", "--timeout",
                 "0.5", slow]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "ran longer than 0.5 s" in captured.err


def test_a_reader_that_gives_up_stops_the_query(warehouse: Path) -> None:  # noqa: F811
    """A stream left after one chunk of an endless result: its worker, waiting on the
    full queue, ends at once, and the connection answers the next query."""
    con = query.connect(warehouse)
    try:
        with query.stream(con, ENDLESS, 60) as chunks:
            assert chunks.columns == ["n"]
            first = next(iter(chunks))
            assert first == [(i,) for i in range(query.RENDER_CHUNK)]
            time.sleep(0.5)                        # the worker fills the queue, then waits
            assert _query_threads()
            left = time.monotonic()
        assert time.monotonic() - left < 3
        assert not _query_threads()
        assert con.execute("SELECT 42").fetchall() == [(42,)]
        # fetch collects the same stream: every row of a result of many chunks
        columns, rows = query.fetch(con, "SELECT range AS n FROM range(25000)")
        assert columns == ["n"] and rows == [(i,) for i in range(25000)]
    finally:
        con.close()


# Ctrl-C just as the query's worker thread has been started (the moment a probe hit
# about one time in forty), then the connection closed by run_stream's ``finally``.
CTRL_C_AT_START = """
import sys, threading
from gpuledger.pipeline import query
start = threading.Thread.start
def interrupted_start(self):
    start(self)
    if self.name == "gpuledger-query":
        raise KeyboardInterrupt
threading.Thread.start = interrupted_start
connect = query.connect
class Watched:  # the connection, telling whether a query still ran when it was closed
    def __init__(self, con):
        self.con = con
    def __getattr__(self, name):
        return getattr(self.con, name)
    def close(self):
        workers = [t for t in threading.enumerate() if t.name == "gpuledger-query"]
        for t in workers:
            t.join(2.0)
        print("closed with a query running" if any(t.is_alive() for t in workers)
              else "closed")
        self.con.close()
query.connect = lambda *a, **k: Watched(connect(*a, **k))
try:
    with query.run_stream(sys.argv[1], "SELECT count(*) FROM range(20000000000)", None):
        pass
except KeyboardInterrupt:
    print("interrupted")
"""


def test_ctrl_c_as_the_query_starts_stops_it_before_the_connection_closes(
        warehouse: Path) -> None:  # noqa: F811
    """DuckDB aborts the process (SIGABRT, exit -6) when a connection is closed while
    another thread runs a statement on it. Ctrl-C as the worker started left the query
    running and closed the connection under it; now it is stopped first, and the run
    ends with the interrupt (a query of minutes: were it not stopped, the test would
    time out)."""
    done = subprocess.run([sys.executable, "-c", CTRL_C_AT_START, str(warehouse)],
                          capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout) == (0, "closed\ninterrupted\n"), done.stderr[-2000:]


def test_a_table_of_too_many_rows_is_refused_in_bounded_memory(
        warehouse: Path, capsys: pytest.CaptureFixture[str],  # noqa: F811
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The table format holds every row to size its columns: 475,200 rows took 3 GB and
    1.4 M rows died in MemoryError tracebacks. Past TABLE_MAX_ROWS it stops the query and
    says to use csv or json, which stream (here the limit is lowered to 25,000 rows, and
    the query is endless: were it not stopped, the test would not end)."""
    monkeypatch.setattr(query, "TABLE_MAX_ROWS", 25_000)
    assert main(["query", "--warehouse", str(warehouse), ENDLESS]) == 2
    said = capsys.readouterr()
    assert said.out == ""
    assert said.err == ("gpuledger: error: more than 25,000 rows: too many for a table, "
                        "which holds every row to size its columns; use --format csv or "
                        "--format json (written as the rows come), or LIMIT\n")
    assert main(["query", "--warehouse", str(warehouse),
                 "SELECT * FROM range(25000)"]) == 0
    assert capsys.readouterr().out.endswith("(25000 rows)\n")
    assert not _query_threads()
