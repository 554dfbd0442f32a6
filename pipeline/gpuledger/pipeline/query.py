"""Read-only SQL over the warehouse.

Every reader of the warehouse (``gpuledger query``, ``gpuledger report``, the boards'
tests, the benchmarks) opens it through :func:`connect`, which makes the connection
read-only **by construction**:

1. the views of ``sql/*.sql`` over the files of the newest published generation
   (``generations.py``) are in a private temporary database, which is opened with
   ``read_only=True``: one connection sees every table as of one commit, for its whole
   life, on a folder or an ``s3://`` warehouse alike (a bucket is read through the same
   PyArrow filesystem as the processor writes it, ``store.py``). That database is a copy
   of the published ``catalog.duckdb`` when the catalog's mark says it was built from the
   same statements, and is built here otherwise;
2. external access is off except for the warehouse's ``facts/`` (folder or bucket
   prefix), which the views read (``enable_external_access = false``,
   ``allowed_directories``): no other file, no URL, no ``ATTACH``, no
   ``INSTALL``/``LOAD``;
3. extensions are neither installed nor loaded automatically;
4. spilling goes to a private temporary folder, not next to the catalog;
5. the configuration is locked (``lock_configuration``): no statement can undo 2-4.

DuckDB may still write inside ``facts/`` through ``COPY … TO`` (its allowed folders are
allowed for writing too), so :func:`check_read_only` is a second wall, checked before
anything runs: only reads are accepted (``SELECT``, ``WITH``, ``FROM``, ``VALUES``,
``TABLE``, ``DESCRIBE``, ``SHOW``, ``SUMMARIZE``, ``PIVOT``/``UNPIVOT``), and
``EXPLAIN [ANALYZE]`` of a read. Everything else is refused with one line.

:func:`stream` runs a statement under a time limit and hands its rows over a chunk at a
time, a few chunks ahead at most, so that a result of any size is written out in bounded
memory (``gpuledger query --format csv|json``); :func:`fetch` collects them all. At the
limit, or on Ctrl-C, the query is interrupted (DuckDB's ``interrupt``) and the caller
gets a :class:`QueryError` or the ``KeyboardInterrupt``.
"""

from __future__ import annotations

import base64
import contextlib
import csv
import io
import json
import math
import queue
import re
import shutil
import threading
import time
import weakref
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import duckdb
from rich.cells import cell_len

from gpuledger.pipeline import temp_folders
from gpuledger.pipeline.location import is_url
from gpuledger.pipeline.store import Store, StoreError
from gpuledger.pipeline.tables import TABLE_SCHEMAS
from gpuledger.pipeline.terminal_fit import printable
from gpuledger.pipeline.warehouse import (
    FACTS,
    SCHEMA_FILE,
    attach_store,
    build_views,
    catalog_statements,
    open_snapshot,
    published_catalog,
    statements_digest,
    unreadable_object,
    views_mark,
)

DEFAULT_TIMEOUT_S = 300.0
"""``gpuledger query --timeout`` and ``gpuledger report --timeout`` default."""

READ_HEADS = frozenset({"SELECT", "WITH", "FROM", "VALUES", "TABLE", "PIVOT", "UNPIVOT",
                        "PIVOT_WIDER", "PIVOT_LONGER", "DESCRIBE", "SHOW", "SUMMARIZE"})
"""Words a read may start with (or an opening parenthesis)."""

WRITE_WORDS = frozenset({"INSERT", "UPDATE", "DELETE", "MERGE", "COPY", "CREATE", "DROP",
                         "ALTER", "ATTACH", "DETACH", "INSTALL", "LOAD", "EXPORT", "IMPORT",
                         "SET", "RESET", "PRAGMA", "CALL", "TRUNCATE", "VACUUM", "CHECKPOINT",
                         "USE", "EXPLAIN", "PREPARE", "EXECUTE", "BEGIN", "COMMIT"})
"""Words that must not appear outside parentheses in a statement DuckDB expands into
several (a ``PIVOT`` without an ``IN`` list is one): the read must be the whole of it."""

_EXPLAIN_OPTIONS = frozenset({"ANALYZE", "ANALYSE", "VERBOSE"})


class QueryError(ValueError):
    """The query was refused or failed (a one-line message)."""


def _one_line(exc: BaseException) -> str:
    """An exception's message on one line (DuckDB adds a ``LINE 1: …`` caret block)."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    if lines[0].startswith("Traceback"):
        # an error raised in Python under DuckDB (a remote store's filesystem): its
        # message is the last line of the traceback DuckDB quotes
        named = [line for line in lines if re.match(r"[A-Za-z_.]*(Error|Exception)\b", line)]
        return named[-1] if named else lines[-1]
    # DuckDB's advice to change a setting ('Use "SET max_expression_depth TO x" to
    # increase …'): a reader may not, so it is left out rather than given
    return re.sub(r'\s*Use "?(SET|PRAGMA) [^.]*\.?', "", lines[0]).strip()


SPILL_PREFIX = "gpuledger-query-"
"""A reader's folder in the temporary directory (its views database, DuckDB's spill):
``gpuledger-query-<pid>-<random>``, removed when its connection goes, or, left by a
reader that was killed, by a later one (``temp_folders.sweep``)."""


def connect(warehouse: str | Path, threads: int | None = None,
            timezone: str = "UTC") -> duckdb.DuckDBPyConnection:
    """A read-only, locked-down connection to the warehouse's newest published generation
    (see the module's doc); a folder or an ``s3://`` warehouse.

    ``threads`` (DuckDB's worker threads; default one per core) and ``timezone`` (how
    ``TIMESTAMPTZ`` values are shown, cast to dates and bucketed; default UTC, whatever
    the machine's ``TZ``: under ``TZ=America/Los_Angeles`` a day's minutes were counted
    from 08:00 UTC) are set here because the configuration cannot be changed afterwards.
    """
    try:
        store, snapshot = open_snapshot(warehouse)
    except StoreError as exc:
        raise QueryError(str(exc)) from None
    if not snapshot.generations and not all(
            store.exists(f"{FACTS}/{t}/{SCHEMA_FILE}") for t in TABLE_SCHEMAS):
        if not is_url(warehouse) and not Path(warehouse).expanduser().exists():
            # a mistyped path read like an empty warehouse ("nothing published yet")
            raise QueryError(f"{warehouse}: no such folder")
        raise QueryError(f"{store.url}: not a gpuledger warehouse (nothing published yet)")
    temp_folders.sweep(SPILL_PREFIX)
    spill = temp_folders.make(SPILL_PREFIX)
    config: dict[str, Any] = {"autoinstall_known_extensions": False,
                              "autoload_known_extensions": False,
                              "temp_directory": spill}
    if threads is not None:
        config["threads"] = threads
    views = Path(spill) / "views.duckdb"  # the generation's views, opened read-only
    statements = catalog_statements(store, snapshot)
    try:
        con = _published_views(store, views, statements_digest(statements), config)
        if con is None:
            build_views(views, store, snapshot, statements)
            con = duckdb.connect(str(views), read_only=True, config=config)
    except duckdb.Error as exc:
        shutil.rmtree(spill, ignore_errors=True)
        raise QueryError(f"{store.url}: cannot open the views: {_one_line(exc)}") from None
    weakref.finalize(con, shutil.rmtree, spill, True)
    # files never change once written (generations.py): their footers may be kept
    con.execute("SET parquet_metadata_cache = true")
    attach_store(con, store, snapshot.sizes)
    facts = store.url_of(FACTS).replace("'", "''")
    con.execute(f"SET allowed_directories = ['{facts}/']")
    con.execute("SET enable_external_access = false")
    con.execute("SET TimeZone = ?", [timezone])
    con.execute("SET lock_configuration = true")
    _OPENED[con] = (store, snapshot.sizes)
    return con


_OPENED: weakref.WeakKeyDictionary[duckdb.DuckDBPyConnection, tuple[Store, dict[str, int]]] \
    = weakref.WeakKeyDictionary()
"""The store of each connection :func:`connect` opened, and the sizes its generation's
manifests record (:func:`unreadable`)."""


def unreadable(con: duckdb.DuckDBPyConnection, exc: BaseException) -> str | None:
    """The error ``exc`` of a query on ``con`` as one line saying what to do, when it
    names a fact object the generation publishes that is missing or damaged
    (``warehouse.unreadable_object``); None otherwise."""
    opened = _OPENED.get(con)
    if opened is None:
        return None
    store, sizes = opened
    return unreadable_object(store, str(exc), sizes)


def _published_views(store: Store, views: Path, digest: str,
                     config: dict[str, Any]) -> duckdb.DuckDBPyConnection | None:
    """The published ``catalog.duckdb`` copied to ``views`` and opened, when it was built
    for this very generation and SQL (its mark is ``digest``) and its bytes are the ones
    stamped (``published_catalog``): binding the views costs a quarter of a CPU-second,
    fetching the catalog two reads. None otherwise (no catalog yet, one of an older
    generation, one read torn while it was replaced, a newer DuckDB's, not readable), and
    ``views`` is gone."""
    try:
        data = published_catalog(store)
        if data is None:
            return None
        views.write_bytes(data)
        con = duckdb.connect(str(views), read_only=True, config=config)
    except (duckdb.Error, OSError, StoreError):
        views.unlink(missing_ok=True)
        return None
    if views_mark(con) == digest:
        return con
    con.close()
    views.unlink(missing_ok=True)
    return None


# --------------------------------------------------------------------------- the wall


@dataclass(frozen=True)
class _Token:
    start: int
    text: str
    kind: str  # keyword, identifier, operator, numeric_const, string_const


def _tokens(sql: str) -> list[_Token]:
    """DuckDB's tokens of ``sql`` without comments (text upper-cased for keywords)."""
    raw = duckdb.tokenize(sql)
    out: list[_Token] = []
    for i, (start, kind) in enumerate(raw):
        name = str(kind).rsplit(".", 1)[-1]
        if name == "comment":
            continue
        end = raw[i + 1][0] if i + 1 < len(raw) else len(sql)
        text = sql[start:end].strip()
        out.append(_Token(start, text.upper() if name == "keyword" else text, name))
    return out


def _explained(con: duckdb.DuckDBPyConnection, sql: str) -> str | None:
    """The statement an ``EXPLAIN [ANALYZE] [(options)]`` explains; None if ``sql`` is not
    an EXPLAIN."""
    tokens = _tokens(sql)
    if not tokens or tokens[0].text != "EXPLAIN":
        return None
    i = 1
    while i < len(tokens) and tokens[i].kind == "keyword" and tokens[i].text in _EXPLAIN_OPTIONS:
        i += 1
    if i < len(tokens) and tokens[i].kind == "operator" and tokens[i].text.startswith("("):
        rest = sql[tokens[i].start:]
        try:  # EXPLAIN (SELECT …): the parenthesis opens the statement
            if len(con.extract_statements(rest)) == 1:
                return rest
        except (duckdb.Error, ValueError):
            pass
        depth = 0
        while i < len(tokens):  # EXPLAIN (FORMAT json) …: skip the options
            if tokens[i].kind == "operator":
                depth += tokens[i].text.count("(") - tokens[i].text.count(")")
            i += 1
            if depth <= 0:
                break
    return sql[tokens[i].start:] if i < len(tokens) else ""


def _whole_read(sql: str) -> bool:
    """Whether a statement DuckDB expands into several is one read as a whole."""
    tokens = _tokens(sql)
    if not tokens:
        return False
    head = tokens[0]
    if not (head.text in READ_HEADS or (head.kind == "operator" and head.text[0] == "(")):
        return False
    depth = 0
    for token in tokens:
        if token.kind == "operator":
            depth += token.text.count("(") - token.text.count(")")
        elif depth == 0 and token.kind == "keyword" and token.text in WRITE_WORDS:
            return False
    return True


def _statements(con: duckdb.DuckDBPyConnection, sql: str) -> list[tuple[str, str]]:
    """(kind, text) of each statement of ``sql``; the kind is DuckDB's statement type."""
    try:
        statements = list(con.extract_statements(sql))
    except duckdb.Error as exc:
        raise QueryError(f"cannot parse the query: {_one_line(exc)}") from None
    out = []
    for statement in statements:
        try:
            kind = str(statement.type).rsplit(".", 1)[-1]
        except ValueError:  # a type the Python binding has no name for (UPDATE EXTENSIONS)
            head = next((t.text for t in _tokens(statement.query)), "?")
            kind = f"{head} (a statement of another kind)"
        out.append((kind, statement.query))
    return out


def _refuse(kind: str) -> QueryError:
    return QueryError(f"only read-only queries are allowed (SELECT, EXPLAIN of a SELECT); "
                      f"got {kind}")


def _named(kind: str, text: str) -> str:
    """A statement's kind as its author wrote it: DuckDB files INSTALL under LOAD, USE
    under SET, CHECKPOINT under CALL, ANALYZE under VACUUM, ROLLBACK under TRANSACTION;
    the first word (two for FORCE INSTALL) names what was asked. A statement that opens
    with WITH (WITH … INSERT) or a parenthesis keeps DuckDB's kind."""
    tokens = _tokens(text)
    if not tokens or tokens[0].kind != "keyword" or tokens[0].text == "WITH" or "(" in kind:
        return kind
    head = tokens[0].text
    if head == "FORCE" and len(tokens) > 1:
        head = f"FORCE {tokens[1].text.upper()}"
    return kind if head == kind else f"{head} (DuckDB's kind: {kind})"


def _check(con: duckdb.DuckDBPyConnection, sql: str, depth: int = 0) -> int:
    """Refuse what is not a read (:func:`check_read_only`); the number of statements."""
    statements = _statements(con, sql)
    if not statements:
        raise QueryError("empty query")
    for kind, text in statements:
        if kind == "SELECT":
            continue
        if kind not in ("EXPLAIN", "MULTI"):
            named = _named(kind, text)
            raise _refuse(named if depth == 0 else f"EXPLAIN of {named}")
        inner = _explained(con, text)
        if inner is not None:
            if not inner.strip():
                raise QueryError("EXPLAIN of nothing")
            if len(_statements(con, inner)) != 1:
                raise QueryError("EXPLAIN of more than one statement")
            _check(con, inner, depth + 1)
        elif not _whole_read(text):
            head = next((t.text for t in _tokens(text)), "?")
            raise _refuse(f"{'EXPLAIN of ' if depth else ''}{head} (a statement with "
                          "more than a read in it)")
    return len(statements)


def check_read_only(con: duckdb.DuckDBPyConnection, sql: str) -> None:
    """Refuse anything but reads and EXPLAIN of reads (:class:`QueryError`, one line),
    and more than one statement: each was run, and the last one's rows alone shown, with
    nothing said of the others."""
    count = _check(con, sql)
    if count > 1:
        raise QueryError(f"one statement at a time (got {count}): each would run, and only "
                         "the last one's rows be shown; run them one by one")


# --------------------------------------------------------------------------- running


RENDER_CHUNK = 10_000
"""Rows fetched (:class:`Stream`) and rendered at a time, between two looks at the time
limit."""

STREAM_QUEUE = 2
"""Chunks of :data:`RENDER_CHUNK` rows a running query may have ready ahead of its reader
(with the one it is fetching and the one being read, at most four are held at once)."""

_COLUMNS, _ROWS, _END, _ERROR = "columns", "rows", "end", "error"


class Stream:
    """A statement running on a worker thread, its rows a chunk at a time: iterate it for
    lists of up to :data:`RENDER_CHUNK` rows, ``columns`` has the column names. Open one
    with :func:`stream`; :meth:`close` (or leaving the ``with`` block) stops the query if it
    is still running.

    At most :data:`STREAM_QUEUE` chunks wait for the reader, so memory is bounded by a few
    chunks whatever the size of the result. The time limit covers the query and the reading
    of its rows: past the deadline, or on Ctrl-C, the query is interrupted (DuckDB's
    ``interrupt``) and the reader gets a :class:`QueryError` or the ``KeyboardInterrupt``
    once it has stopped. Errors become a one-line :class:`QueryError`.
    """

    def __init__(self, con: duckdb.DuckDBPyConnection, sql: str,
                 timeout_s: float | None = DEFAULT_TIMEOUT_S,
                 deadline: float | None = None) -> None:
        if timeout_s is not None and (math.isnan(timeout_s) or timeout_s <= 0):
            raise QueryError(f"the time limit must be > 0 s, got {timeout_s}")
        self.columns: list[str] = []
        self._con = con
        self._timeout_s = timeout_s
        if deadline is None and timeout_s is not None and not math.isinf(timeout_s):
            deadline = time.monotonic() + timeout_s
        self._deadline = deadline
        self._queue: queue.Queue[tuple[str, Any]] = queue.Queue(maxsize=STREAM_QUEUE)
        self._halt = threading.Event()   # the reader has given up: the worker ends
        self._done = threading.Event()   # the worker has ended
        self._ended = False              # the worker's last word was read
        self._worker = threading.Thread(target=self._work, args=(sql,),
                                        name="gpuledger-query", daemon=True)
        _RUNNING[id(con)] = self
        try:  # Ctrl-C from here on stops the worker before the connection can be closed
            self._worker.start()
            _kind, self.columns = self._take(output=False)  # the worker's first word
        except BaseException:
            self.close()
            raise

    def _put(self, item: tuple[str, Any]) -> bool:
        """Hand ``item`` to the reader; False (not handed) once the reader has given up."""
        while not self._halt.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _work(self, sql: str) -> None:
        try:
            rel = self._con.execute(sql)
            if not self._put((_COLUMNS, [d[0] for d in rel.description or []])):
                return
            while not self._halt.is_set():
                rows = rel.fetchmany(RENDER_CHUNK)
                if not rows:
                    self._put((_END, None))
                    return
                if not self._put((_ROWS, rows)):
                    return
        except Exception as exc:
            self._put((_ERROR, exc))
        finally:
            self._done.set()

    def _take(self, output: bool) -> tuple[str, Any]:
        """The worker's next word (columns, rows or the end); :class:`QueryError` for its
        error or past the deadline; ``KeyboardInterrupt`` once the query has stopped."""
        deadline = self._deadline
        try:
            while True:
                wait = 0.1 if deadline is None else max(min(deadline - time.monotonic(), 0.1),
                                                        0.0)
                try:
                    kind, value = self._queue.get(timeout=wait)
                except queue.Empty:
                    if deadline is not None and time.monotonic() >= deadline:
                        raise self._late(output=False) from None
                    continue
                if kind in (_END, _ERROR):
                    self._ended = True
                    self._worker.join()
                if kind == _ERROR:
                    damaged = unreadable(self._con, value)
                    if damaged is not None:
                        raise QueryError(damaged)
                    if isinstance(value, duckdb.Error):
                        raise QueryError(_one_line(value))
                    raise QueryError(f"{type(value).__name__}: {_one_line(value)}")
                if kind == _ROWS and deadline is not None and time.monotonic() >= deadline:
                    raise self._late(output)
                return kind, value
        except BaseException:
            self.close()
            raise

    def _late(self, output: bool) -> QueryError:
        if output:
            return QueryError(f"the query and its output took longer than "
                              f"{self._timeout_s:g} s and were stopped (raise the limit with "
                              "--timeout SECONDS, or select fewer rows)")
        return QueryError(f"the query ran longer than {self._timeout_s:g} s and was "
                          "stopped (raise the limit with --timeout SECONDS)")

    def chunks(self, output: bool = True) -> Iterator[list[tuple[Any, ...]]]:
        """The rows a chunk at a time; past the deadline the error says the output took
        too long when ``output`` (the reader writes them out), else that the query did."""
        while not self._ended:
            kind, value = self._take(output)
            if kind == _ROWS:
                yield value

    def __iter__(self) -> Iterator[list[tuple[Any, ...]]]:
        return self.chunks()

    def close(self) -> None:
        """Stop the query if it still runs, and wait until its worker has ended (Ctrl-C
        meanwhile only interrupts again)."""
        self._halt.set()
        if not self._ended:
            _stop(self._con, self._done, self._worker)
            self._ended = True
        if _RUNNING.get(id(self._con)) is self:
            del _RUNNING[id(self._con)]

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def stream(con: duckdb.DuckDBPyConnection, sql: str,
           timeout_s: float | None = DEFAULT_TIMEOUT_S, deadline: float | None = None,
           ) -> Stream:
    """Start ``sql`` on ``con``; its rows a chunk at a time (:class:`Stream`). The time
    limit (``None`` or ``inf``: none) runs from now, or until ``deadline``
    (``time.monotonic()``) when one is given."""
    return Stream(con, sql, timeout_s, deadline)


def fetch(con: duckdb.DuckDBPyConnection, sql: str, timeout_s: float | None = DEFAULT_TIMEOUT_S,
          ) -> tuple[list[str], list[tuple[Any, ...]]]:
    """Run ``sql`` on ``con``; column names and all the rows (:func:`stream`, collected).

    The statement runs on a worker thread while this one waits, so that the time limit
    and Ctrl-C (``KeyboardInterrupt``, re-raised once the query has stopped) can interrupt
    it. Errors become a one-line :class:`QueryError`.
    """
    with stream(con, sql, timeout_s) as rows:
        return rows.columns, [r for chunk in rows.chunks(output=False) for r in chunk]


def _stop(con: duckdb.DuckDBPyConnection, done: threading.Event,
          worker: threading.Thread) -> None:
    """Interrupt the running query and wait until it has stopped (Ctrl-C again only
    interrupts again); at once when the worker never began (Ctrl-C came before its
    thread was started)."""
    while True:
        con.interrupt()
        try:
            if done.wait(1.0) or (worker.ident is None and not worker.is_alive()):
                return
        except KeyboardInterrupt:
            continue


_RUNNING: dict[int, Stream] = {}
"""The :class:`Stream` running on each connection (by ``id``): :func:`close_connection`
stops it first. DuckDB aborts the whole process (SIGABRT) when a connection is closed
while another thread runs a statement on it, which Ctrl-C at the wrong moment did."""


def close_connection(con: duckdb.DuckDBPyConnection) -> None:
    """Close ``con`` once the query a :class:`Stream` runs on it, if any, has stopped."""
    running = _RUNNING.get(id(con))
    if running is not None:
        running.close()
    con.close()


def run(warehouse: str | Path, sql: str, timeout_s: float | None = DEFAULT_TIMEOUT_S,
        timezone: str = "UTC") -> tuple[list[str], list[tuple[Any, ...]]]:
    """Run a read-only query on ``warehouse``; column names and rows."""
    con = connect(warehouse, timezone=timezone)
    try:
        check_read_only(con, sql)
        return fetch(con, sql, timeout_s)
    finally:
        close_connection(con)


@contextlib.contextmanager
def run_stream(warehouse: str | Path, sql: str,
               timeout_s: float | None = DEFAULT_TIMEOUT_S, deadline: float | None = None,
               timezone: str = "UTC") -> Iterator[Stream]:
    """Run a read-only query on ``warehouse``; its rows a chunk at a time (:func:`stream`),
    for the ``with`` block, which stops the query if it still runs when the block ends."""
    con = connect(warehouse, timezone=timezone)
    try:
        check_read_only(con, sql)
        with stream(con, sql, timeout_s, deadline) as rows:
            yield rows
    finally:
        close_connection(con)


# --------------------------------------------------------------------------- output


_ENDLESS = {datetime.max: "infinity", datetime.min: "-infinity"}
"""What DuckDB's ``'infinity'`` and ``'-infinity'`` timestamps come back as in Python: the
last and first instants Python can hold (shown as themselves they read as a real instant
in year 9999 or year 1). A DATE's infinities come back as 9999-12-31 and 0001-01-01, which
are real dates too, so they stay as written."""


def _plain(value: Any) -> Any:
    """``value`` as csv and table cells write it: dates and timestamps ISO 8601, a BLOB
    as DuckDB writes it, a LIST, STRUCT or MAP with its values so written."""
    if isinstance(value, datetime):
        return _ENDLESS.get(value.replace(tzinfo=None)) or value.isoformat()
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, bytes | bytearray | memoryview):
        return blob_text(bytes(value))
    if isinstance(value, dict | list | tuple):
        return str(_nested(value))
    return value


def _nested(value: Any) -> Any:
    if isinstance(value, dict):
        return {_nested(k): _nested(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_nested(v) for v in value]
    if isinstance(value, datetime | date | bytes | bytearray | memoryview | timedelta):
        return str(_plain(value))
    return value


def blob_text(value: bytes) -> str:
    """A BLOB as DuckDB writes it: printable ASCII as itself, every other byte (and the
    backslash) as ``\\xHH`` (``b'a\\x00'`` is ``a\\x00``)."""
    return "".join(chr(b) if 32 <= b < 127 and b != 92 else f"\\x{b:02X}" for b in value)


def _chunks(rows: list[tuple[Any, ...]], deadline: float | None,
            timeout_s: float | None) -> Iterator[list[tuple[Any, ...]]]:
    """``rows`` a chunk at a time; :class:`QueryError` once ``deadline`` has passed."""
    for i in range(0, len(rows), RENDER_CHUNK):
        if deadline is not None and time.monotonic() >= deadline:
            raise QueryError(f"the query and its output took longer than {timeout_s:g} s "
                             "and were stopped (raise the limit with --timeout SECONDS, or "
                             "select fewer rows)")
        yield rows[i:i + RENDER_CHUNK]


def render(columns: list[str], rows: list[tuple[Any, ...]], fmt: str,
           deadline: float | None = None, timeout_s: float | None = None) -> str:
    """Render rows as ``table``, ``csv`` or ``json`` (one object per line); stopped with a
    :class:`QueryError` once ``deadline`` (``time.monotonic()``) has passed."""
    if fmt in ("csv", "json"):
        return "".join(render_chunks(columns, _chunks(rows, deadline, timeout_s), fmt))
    return table_text(columns, rows, deadline, timeout_s)


def render_chunks(columns: list[str], chunks: Iterable[list[tuple[Any, ...]]],
                  fmt: str) -> Iterator[str]:
    """Rows a chunk at a time (a :class:`Stream`) as ``csv`` or ``json`` text, a piece per
    chunk (the csv header with the first): the pieces joined are :func:`render`'s text. A ``json``
    refusal (a column name twice) comes before the first piece. A ``table`` sizes its
    columns from every row: collect them and :func:`render` it."""
    if fmt == "csv":
        header = _csv_text([columns])    # with the first rows: a query that fails before
        for chunk in chunks:             # it has any writes nothing
            yield header + _csv_text([[_plain(v) for v in r] for r in chunk])
            header = ""
        if header:
            yield header
    elif fmt == "json":
        twice = sorted({c for c in columns if columns.count(c) > 1})
        if twice:
            raise QueryError(f"column name(s) {', '.join(twice)} appear more than once; JSON "
                             "objects need one name per column (use AS)")
        for chunk in chunks:
            yield "".join(
                json.dumps({c: _json_value(v) for c, v in zip(columns, r, strict=True)},
                           default=str, allow_nan=False) + "\n" for r in chunk)
    else:
        raise ValueError(f"render_chunks: {fmt!r} is not csv or json")


def _csv_text(rows: list[Any]) -> str:
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(rows)
    return out.getvalue()


def _json_value(value: Any) -> Any:
    """A value as JSON holds it: a number as a number (DECIMAL too), NaN and infinities
    (which JSON has not) as null, an INTERVAL as an ISO 8601 duration (``"PT2H59M"``), a
    BLOB as base64, a LIST or STRUCT (or MAP) value by value."""
    if isinstance(value, Decimal):
        value = float(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, timedelta):
        return iso_duration(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, dict):
        return {str(_plain(k)): _json_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_value(v) for v in value]
    return _plain(value)


def iso_duration(value: timedelta) -> str:
    """``value`` as an ISO 8601 duration: ``P1DT2H30M``, ``PT0.5S``, ``-PT1M``, ``PT0S``."""
    if value < timedelta(0):
        return "-" + iso_duration(-value)
    hours, rest = divmod(value.seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    second = f"{seconds}.{value.microseconds:06d}".rstrip("0").rstrip(".")
    time_part = "".join(f"{n}{unit}" for n, unit in ((hours, "H"), (minutes, "M")) if n)
    if second != "0":
        time_part += f"{second}S"
    days = f"{value.days}D" if value.days else ""
    if not days and not time_part:
        return "PT0S"
    return "P" + days + (f"T{time_part}" if time_part else "")


TABLE_FLOAT_MAX = 1e15
"""Floats from here up print in 15 significant digits with an exponent in a table: past
2**53 a double's own digits run out, and its exact binary value printed whole showed
digits no one measured (1.2345678901234567e20 as ``123,456,789,012,345,667,584.0``)."""


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        size = abs(value)
        if not math.isfinite(value) or size >= TABLE_FLOAT_MAX:
            return f"{value:.15g}"
        if 0 < size < 0.0005:  # would print as 0.000: a small value is not nothing
            return f"{value:.3g}"
        return f"{value:,.3f}" if size < 1000 else f"{value:,.1f}"
    return printable(str(_plain(value)))


TABLE_MAX_ROWS = 100_000
"""The most rows the ``table`` format shows. It sizes its columns from every row, so it
holds them all: 475,200 rows took 3 GB and 41 s, and 1.4 M rows died in MemoryError
tracebacks, where csv and json stream in bounded memory."""


def table_rows(rows: Stream) -> list[tuple[Any, ...]]:
    """Every row of ``rows`` for a table (:class:`QueryError` past
    :data:`TABLE_MAX_ROWS`, the query stopped)."""
    out: list[tuple[Any, ...]] = []
    for chunk in rows.chunks(output=False):
        out.extend(chunk)
        if len(out) > TABLE_MAX_ROWS:
            rows.close()
            raise QueryError(f"more than {TABLE_MAX_ROWS:,} rows: too many for a table, "
                             "which holds every row to size its columns; use --format csv "
                             "or --format json (written as the rows come), or LIMIT")
    return out


def _padded(text: str, width: int, right: bool) -> str:
    """``text`` padded to ``width`` terminal cells (a CJK character takes two: padded by
    its length in characters, a column of team names in Chinese went out of line)."""
    pad = " " * max(width - cell_len(text), 0)
    return pad + text if right else text + pad


def table_text(columns: list[str], rows: list[tuple[Any, ...]],
               deadline: float | None = None, timeout_s: float | None = None) -> str:
    """A plain aligned text table."""
    cells = [[_cell(v) for v in r] for chunk in _chunks(rows, deadline, timeout_s)
             for r in chunk]
    columns = [printable(c) for c in columns]
    widths = [max([cell_len(c)] + [cell_len(r[i]) for r in cells])
              for i, c in enumerate(columns)]
    lines = ["  ".join(_padded(c, w, False) for c, w in zip(columns, widths, strict=True)),
             "  ".join("-" * w for w in widths)]
    for r in cells:
        lines.append("  ".join(_padded(v, w, v[:1].isdigit() or v[:1] == "-")
                               for v, w in zip(r, widths, strict=True)))
    lines.append(f"({len(rows)} row{'s' if len(rows) != 1 else ''})")
    return "\n".join(lines) + "\n"
