"""Read-only SQL over the warehouse.

Queries run on an in-memory database holding the views of ``sql/*.sql`` over the
files of the newest published generation (``generations.py``): one query sees every
table as of one commit, on a local folder or an ``s3://`` warehouse alike (the bucket is
read through the same PyArrow filesystem as the processor writes it, ``store.py``).
External access is limited to the warehouse's ``facts/``. Only ``SELECT`` (incl.
``WITH``, ``DESCRIBE``, ``SHOW``, ``SUMMARIZE``) and ``EXPLAIN`` statements are
accepted: ``COPY``, ``ATTACH``, ``INSTALL``, ``SET`` and every DDL/DML are refused
before anything runs, so a query cannot modify the warehouse or write files.
"""

from __future__ import annotations

import csv
import io
import json
from datetime import date, datetime
from pathlib import Path
from typing import Any

import duckdb

from gpuledger.pipeline.store import StoreError
from gpuledger.pipeline.tables import TABLE_SCHEMAS
from gpuledger.pipeline.warehouse import (
    FACTS,
    SCHEMA_FILE,
    attach_store,
    catalog_statements,
    open_snapshot,
)

ALLOWED = {"SELECT", "EXPLAIN"}


class QueryError(ValueError):
    """The query was refused or failed."""


def connect(warehouse: str | Path) -> duckdb.DuckDBPyConnection:
    """A connection to the warehouse's views over its newest published generation; it
    reads nothing outside the warehouse's ``facts/``."""
    try:
        store, snapshot = open_snapshot(warehouse)
    except StoreError as exc:
        raise QueryError(str(exc)) from None
    if not snapshot.generations and not all(
            store.exists(f"{FACTS}/{t}/{SCHEMA_FILE}") for t in TABLE_SCHEMAS):
        raise QueryError(f"{store.url}: not a gpuledger warehouse (nothing published yet)")
    con = duckdb.connect(":memory:", config={"autoinstall_known_extensions": False,
                                             "autoload_known_extensions": False})
    # files never change once written (generations.py): their Parquet footers may be
    # kept for the connection's life
    con.execute("SET parquet_metadata_cache = true")
    attach_store(con, store, snapshot.sizes)
    for statement in catalog_statements(store, snapshot):
        con.execute(statement)
    facts = store.url_of(FACTS).replace("'", "''")
    con.execute(f"SET allowed_directories = ['{facts}/']")
    con.execute("SET enable_external_access = false")
    return con


def check_read_only(con: duckdb.DuckDBPyConnection, sql: str) -> None:
    """Refuse anything but SELECT / EXPLAIN statements."""
    try:
        statements = con.extract_statements(sql)
    except duckdb.Error as exc:
        raise QueryError(f"cannot parse the query: {exc}") from None
    if not statements:
        raise QueryError("empty query")
    for statement in statements:
        kind = str(statement.type).rsplit(".", 1)[-1]
        if kind not in ALLOWED:
            raise QueryError(
                f"only read-only queries are allowed (SELECT, EXPLAIN); got {kind}"
            )


def run(warehouse: str | Path, sql: str) -> tuple[list[str], list[tuple[Any, ...]]]:
    """Run a read-only query; return column names and rows."""
    con = connect(warehouse)
    try:
        check_read_only(con, sql)
        try:
            rel = con.execute(sql)
            columns = [d[0] for d in rel.description or []]
            rows = rel.fetchall()
        except duckdb.Error as exc:
            raise QueryError(str(exc)) from None
        return columns, rows
    finally:
        con.close()


def _plain(value: Any) -> Any:
    if isinstance(value, datetime | date):
        return value.isoformat()
    return value


def render(columns: list[str], rows: list[tuple[Any, ...]], fmt: str) -> str:
    """Render rows as ``table``, ``csv`` or ``json`` (one object per line)."""
    if fmt == "csv":
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(columns)
        writer.writerows([[_plain(v) for v in r] for r in rows])
        return out.getvalue()
    if fmt == "json":
        return "".join(
            json.dumps({c: _plain(v) for c, v in zip(columns, r, strict=True)}) + "\n"
            for r in rows
        )
    return table_text(columns, rows)


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:,.3f}" if abs(value) < 1000 else f"{value:,.1f}"
    return str(_plain(value))


def table_text(columns: list[str], rows: list[tuple[Any, ...]]) -> str:
    """A plain aligned text table."""
    cells = [[_cell(v) for v in r] for r in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)),
             "  ".join("-" * w for w in widths)]
    for r in cells:
        lines.append("  ".join(
            v.rjust(w) if v[:1].isdigit() or v[:1] == "-" else v.ljust(w)
            for v, w in zip(r, widths, strict=True)))
    lines.append(f"({len(rows)} row{'s' if len(rows) != 1 else ''})")
    return "\n".join(lines) + "\n"
