"""A reader opens the published ``catalog.duckdb`` when it was built for the very
generation and SQL the reader sees (its mark) and its bytes are the ones stamped, and
builds its own views otherwise: a catalog of an older generation, one without a mark,
one read torn, or bytes that are no catalog."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb
import polars as pl
import pytest
from events import alloc, at, frames, inventory, job, series

from gpuledger.pipeline import query, warehouse
from gpuledger.pipeline.config import ProcessorConfig
from gpuledger.pipeline.processor import Processor
from gpuledger.pipeline.tables import TABLE_SCHEMAS, UNSCHEMATISED_TABLES
from gpuledger.pipeline.warehouse import (
    CATALOG,
    CATALOG_STAMP,
    CATALOG_STORAGE_VERSION,
    Warehouse,
    catalog_statements,
    open_snapshot,
    statements_digest,
)

JOBS = "SELECT job_id, allocated_gpu_hours FROM job_attempts ORDER BY job_id"


def _job(name: str, start: int) -> list[Any]:
    return [job("submitted", name, at(start), team="nlp"),
            job("started", name, at(start), allocation=alloc("n1", 0)),
            job("finished", name, at(start + 5))]


def _builds(monkeypatch: pytest.MonkeyPatch, where: Any = query) -> list[Path]:
    """The views databases that ``query.connect`` (``where``: or the warehouse's
    catalog) builds, from now on."""
    built: list[Path] = []
    real: Callable[..., None] = where.build_views

    def counted(path: Path, *args: Any) -> None:
        built.append(path)
        real(path, *args)

    monkeypatch.setattr(where, "build_views", counted)
    return built


def _put_catalog(root: Path, data: bytes) -> None:
    """Replace the published catalog with ``data``, stamped with its SHA-256 (as anyone
    who can write the bucket can: the stamp proves whole bytes, not who wrote them)."""
    (root / CATALOG).write_bytes(data)
    (root / CATALOG_STAMP).write_text(f"any {CATALOG_STORAGE_VERSION} "
                                      f"{hashlib.sha256(data).hexdigest()}")


@pytest.fixture
def processor(tmp_path: Path) -> tuple[Processor, Path]:
    root = tmp_path / "wh"
    proc = Processor(ProcessorConfig(), Warehouse(root))
    proc.process(frames([inventory("n1", at(0), gpus=2), *_job("a", 0),
                         *series("n1", 0, at(0), 5, sm=0.5)]), validated=True)
    proc.flush()
    return proc, root


def test_a_catalog_of_this_generation_is_opened_not_built_again(
        processor: tuple[Processor, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    _proc, root = processor
    store, snapshot = open_snapshot(root)
    mark = duckdb.connect(str(root / CATALOG), read_only=True).execute(
        "SELECT statements_sha256 FROM gpuledger.catalog").fetchall()
    assert mark == [(statements_digest(catalog_statements(store, snapshot)),)]
    built = _builds(monkeypatch)
    published = query.run(root, JOBS)
    assert built == []
    (root / CATALOG).unlink()                       # the same answer from views built here
    assert query.run(root, JOBS) == published
    assert len(built) == 1
    assert published[1] == [("a", pytest.approx(5 / 60))]    # one GPU for 5 minutes


VIEW_ADDS = {"recommendations": ["diagnosis", "diagnosis_remedy"]}
"""Columns a view adds to its table's (the advisor's diagnosis, joined in)."""
EXPANDED = {"gpu_span"}
"""Tables read through another view (spans through ``gpu_minute``), not a view of
their own."""


def test_every_fact_view_has_its_tables_columns_each_once(
        processor: tuple[Processor, Path]) -> None:
    _proc, root = processor
    for table, schema in TABLE_SCHEMAS.items():
        if table in EXPANDED:
            continue
        columns = query.run(root, f"SELECT * FROM {table} LIMIT 0")[0]
        assert columns == [*schema.names(), *VIEW_ADDS.get(table, [])], table
    for table, schema in UNSCHEMATISED_TABLES.items():   # no files of theirs here
        assert query.run(root, f"SELECT * FROM {table} LIMIT 0")[0] == schema.names()


def test_a_stale_unmarked_or_broken_catalog_is_not_used(
        processor: tuple[Processor, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    proc, root = processor
    old = (root / CATALOG).read_bytes()
    proc.process(frames([*_job("b", 30), *series("n1", 0, at(30), 5, sm=0.5)]),
                 validated=True)
    proc.flush()                                    # a second generation, its own catalog
    assert [r[0] for r in query.run(root, JOBS)[1]] == ["a", "b"]
    built = _builds(monkeypatch)

    _put_catalog(root, old)                         # the first generation's catalog
    assert [r[0] for r in query.run(root, JOBS)[1]] == ["a", "b"]
    assert len(built) == 1

    unmarked = root.parent / "unmarked.duckdb"      # as catalogs were before the mark
    store, snapshot = open_snapshot(root)
    con = duckdb.connect(str(unmarked))
    for statement in catalog_statements(store, snapshot):
        con.execute(statement)
    con.close()
    _put_catalog(root, unmarked.read_bytes())
    assert [r[0] for r in query.run(root, JOBS)[1]] == ["a", "b"]
    assert len(built) == 2

    hostile = root.parent / "hostile.duckdb"          # its mark a view that reads a file
    con = duckdb.connect(str(hostile))
    for statement in catalog_statements(store, snapshot):
        con.execute(statement)
    con.execute("CREATE SCHEMA gpuledger")
    digest = statements_digest(catalog_statements(store, snapshot))
    con.execute(f"CREATE VIEW gpuledger.catalog AS SELECT '{digest}' AS statements_sha256 "
                "FROM read_text('/etc/hostname')")
    con.close()
    _put_catalog(root, hostile.read_bytes())
    assert [r[0] for r in query.run(root, JOBS)[1]] == ["a", "b"]
    assert len(built) == 3

    _put_catalog(root, b"not a database" * 100)
    assert [r[0] for r in query.run(root, JOBS)[1]] == ["a", "b"]
    assert len(built) == 4
    assert not built[-1].exists()                   # the reader's own copy went with it


def test_a_run_shorter_than_the_catalog_interval_builds_the_catalog_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The catalog is rebuilt at most every ``warehouse.catalog_interval_s`` while a run
    commits, counted from when the warehouse opened, and at the end: a run of a few
    seconds builds it once (its first commit built it, then its end again)."""
    built = _builds(monkeypatch, warehouse)
    proc = Processor(ProcessorConfig(), Warehouse(tmp_path / "wh"))
    proc.process(frames([inventory("n1", at(0), gpus=2), *_job("a", 0),
                         *series("n1", 0, at(0), 5, sm=0.5)]), validated=True)
    proc.process(frames([*series("n1", 0, at(30), 5, sm=0.5)]), validated=True)
    assert proc.warehouse.publisher.manifests            # a step was committed
    assert built == []
    proc.flush()
    assert len(built) == 1
    assert query.run(tmp_path / "wh", JOBS)[1] == [("a", pytest.approx(5 / 60))]


def test_a_view_typed_from_the_code_has_the_types_duckdb_reads_from_its_files(
        tmp_path: Path) -> None:
    """``{rows:TABLE}`` types the columns of a table without a schema file from the
    code: the types DuckDB gives the Parquet file Polars writes with that schema, so the
    typed empty SELECT and the files' rows are one relation."""
    for table, schema in UNSCHEMATISED_TABLES.items():
        path = tmp_path / f"{table}.parquet"
        pl.DataFrame(schema=schema).write_parquet(path)
        con = duckdb.connect()
        try:
            read = con.execute(f"DESCRIBE SELECT * FROM read_parquet('{path}')").fetchall()
            typed = con.execute(
                f"DESCRIBE {warehouse._typed_empty_select(table)}").fetchall()
        finally:
            con.close()
        assert [(r[0], r[1]) for r in typed] == [(r[0], r[1]) for r in read], table


def test_a_catalog_whose_bytes_are_not_the_stamped_ones_is_not_used(
        processor: tuple[Processor, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """A store that replaces an object in place (S3Proxy's filesystem backend) served a
    reader a catalog torn between two versions: the newer one's mark, the older one's
    views. The reader took it (its mark was this generation's) and answered from the
    older generation: a test reading while ingests wrote saw facts go back. A catalog
    whose bytes are not the ones its stamp names is not used."""
    proc, root = processor
    store, first = open_snapshot(root)
    proc.process(frames([*_job("b", 30), *series("n1", 0, at(30), 5, sm=0.5)]),
                 validated=True)
    proc.flush()
    store, snapshot = open_snapshot(root)
    torn = root.parent / "torn.duckdb"          # the first generation's views, this mark
    warehouse.build_views(torn, store, first, catalog_statements(store, first))
    con = duckdb.connect(str(torn))
    con.execute("UPDATE gpuledger.catalog SET statements_sha256 = ?",
                [statements_digest(catalog_statements(store, snapshot))])
    con.close()
    (root / CATALOG).write_bytes(torn.read_bytes())     # the stamp is the real catalog's
    built = _builds(monkeypatch)
    assert [r[0] for r in query.run(root, JOBS)[1]] == ["a", "b"]
    assert len(built) == 1
