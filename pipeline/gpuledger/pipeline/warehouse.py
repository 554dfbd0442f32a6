"""The warehouse: Parquet facts with deterministic names, and a DuckDB catalog.

Layout under the warehouse root::

    facts/<table>/date=YYYY-MM-DD/<table>-YYYY-MM-DDTHH.parquet   hourly parts
    facts/<table>/date=YYYY-MM-DD/<table>-YYYY-MM-DD.parquet      daily parts
    facts/<table>/snapshot.parquet                                  latest snapshot
    facts/<table>/_schema.parquet                                   empty, fixes the schema
    catalog.duckdb                                                  views from sql/*.sql

A file's name depends only on the event time it covers, rows are sorted and floats
rounded to 9 decimals before writing, so processing the same input twice writes the
same bytes. Files are written
to a temporary name and renamed, so readers never see half a file. The processor
never opens the DuckDB catalog for writing while analysts read it: it builds a new
catalog file aside and renames it over the old one.
"""

from __future__ import annotations

import hashlib
import os
from datetime import datetime
from importlib import resources
from pathlib import Path

import duckdb
import polars as pl

FACTS = "facts"
CATALOG = "catalog.duckdb"
FLOAT_DECIMALS = 9


def sql_dir() -> Path:
    """Where the catalog's ``*.sql`` files are (repository or installed package)."""
    here = Path(__file__).resolve()
    for candidate in (here.parents[3] / "sql", here.parent / "sql"):
        if candidate.is_dir():
            return candidate
    return Path(str(resources.files("gpuledger.pipeline") / "sql"))


class Warehouse:
    """Writes fact files under ``root``."""

    def __init__(self, root: Path, suffix: str = "") -> None:
        """``suffix``: a shard's mark on the names of the files it writes (``shard.py``),
        so that several processors write side by side into one warehouse."""
        self.root = root
        self.suffix = f"-{suffix}" if suffix else ""
        self.files_written = 0
        self.rows_written = 0
        (root / FACTS).mkdir(parents=True, exist_ok=True)

    def table_dir(self, table: str) -> Path:
        return self.root / FACTS / table

    def _suffix(self, suffix: str | None) -> str:
        return self.suffix if suffix is None else (f"-{suffix}" if suffix else "")

    def part_path(self, table: str, when: datetime, hourly: bool = True,
                  suffix: str | None = None) -> Path:
        """``suffix``: a partition's mark (``partitions.py``); None: the warehouse's own."""
        date = when.strftime("%Y-%m-%d")
        stamp = when.strftime("%Y-%m-%dT%H") if hourly else date
        return (self.table_dir(table) / f"date={date}"
                / f"{table}-{stamp}{self._suffix(suffix)}.parquet")

    def write(self, path: Path, frame: pl.DataFrame, sort_by: list[str] | None = None) -> None:
        """Write ``frame`` atomically to ``path`` (sorted for determinism)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        # Parallel float sums may differ in the last bit between runs; 9 decimals keep
        # every fact exact to far below its meaning and make the bytes reproducible.
        frame = frame.with_columns(pl.col(pl.Float64).round(FLOAT_DECIMALS))
        if sort_by:
            frame = frame.sort(sort_by, nulls_last=True, maintain_order=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # several writers may share it
        frame.write_parquet(tmp, compression="zstd", statistics=True)
        os.replace(tmp, path)
        self.files_written += 1
        self.rows_written += frame.height

    def write_part(
        self, table: str, when: datetime, frame: pl.DataFrame, sort_by: list[str],
        hourly: bool = True, merge: bool = False, suffix: str | None = None,
    ) -> Path:
        """Write one time part.

        With ``merge``, rows already written there are kept unless the new frame has a
        row with the same ``sort_by`` key (which then replaces it): rewriting the same
        input is idempotent and late rows are added.
        """
        path = self.part_path(table, when, hourly, suffix)
        if merge and path.exists():
            old = pl.read_parquet(path)
            frame = pl.concat([old, frame.cast(old.schema, strict=False)],
                              how="vertical_relaxed").unique(
                subset=sort_by, keep="last", maintain_order=True)
        self.write(path, frame, sort_by)
        return path

    def write_snapshot(self, table: str, frame: pl.DataFrame, sort_by: list[str],
                       suffix: str | None = None) -> None:
        self.write(self.table_dir(table) / f"snapshot{self._suffix(suffix)}.parquet", frame,
                   sort_by)

    def ensure_schema(self, table: str, schema: pl.Schema) -> None:
        """Write the table's empty schema file so its view exists before any rows do."""
        path = self.table_dir(table) / "_schema.parquet"
        if not path.exists():
            self.write(path, pl.DataFrame(schema=schema))

    def publish_catalog(self) -> Path:
        """(Re)build ``catalog.duckdb`` with the views of ``sql/*.sql``; atomic. The views
        read the files by pattern, so a catalog built from the same SQL for the same
        folder is kept as it is (its digest is kept beside it)."""
        target = self.root / CATALOG
        statements = catalog_statements(self.root)
        digest = hashlib.sha256("\n".join(statements).encode()).hexdigest()
        stamp = self.root / f".{CATALOG}.sha256"
        if target.exists() and stamp.exists() and stamp.read_text() == digest:
            return target
        tmp = self.root / f".{CATALOG}.{os.getpid()}.tmp"  # several processors may publish
        if tmp.exists():
            tmp.unlink()
        con = duckdb.connect(str(tmp))
        try:
            for statement in statements:
                con.execute(statement)
        finally:
            con.close()
        os.replace(tmp, target)
        stamp_tmp = stamp.with_name(f"{stamp.name}.{os.getpid()}.tmp")
        stamp_tmp.write_text(digest)
        os.replace(stamp_tmp, stamp)
        wal = tmp.with_name(f"{tmp.name}.wal")
        if wal.exists():
            wal.unlink()
        return target


def catalog_statements(root: Path) -> list[str]:
    """The catalog's SQL, with ``{facts}`` replaced by the facts folder's path."""
    facts = str((root / FACTS).resolve()).replace("'", "''")
    out: list[str] = []
    for path in sorted(sql_dir().glob("*.sql")):
        out.append(path.read_text().replace("{facts}", facts))
    return out
