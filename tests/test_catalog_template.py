"""Views databases built from this release's template (``catalog_template.py``): the same
views, columns and answers as a build in full; a full build where the template does not
fit (another release's schema files) or cannot be read; no template from a cache folder
that others may write."""

from __future__ import annotations

import shutil
import stat
from collections.abc import Iterator
from pathlib import Path

import duckdb
import polars as pl
import pytest
from sim_warehouse import build

from gpuledger.pipeline import catalog_template
from gpuledger.pipeline import warehouse as W
from gpuledger.pipeline.query import connect
from gpuledger.pipeline.tables import TABLE_SCHEMAS


@pytest.fixture(scope="module")
def warehouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(tmp_path_factory.mktemp("template") / "wh", diagnose=False)


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A cache folder of the test's own, and nothing in memory."""
    folder = tmp_path / "cache"
    monkeypatch.setenv(catalog_template.CACHE_ENV, str(folder))
    catalog_template._memory.clear()
    yield folder
    catalog_template._memory.clear()


def _inputs(root: Path) -> tuple[W.Store, W.Snapshot, list[str]]:
    store = W.open_store(root, create=False)
    snapshot = W.read_snapshot(store)
    return store, snapshot, W.catalog_statements(store, snapshot)


def _objects(path: Path) -> dict[str, object]:
    """What a views database holds: its views' columns, its macros, its mark."""
    con = duckdb.connect(str(path), read_only=True)
    try:
        return {
            "columns": W._view_columns(con),
            "macros": con.execute(
                "SELECT function_name, macro_definition FROM duckdb_functions() "
                "WHERE function_type LIKE '%macro%' AND NOT internal ORDER BY ALL").fetchall(),
            "mark": W.views_mark(con),
        }
    finally:
        con.close()


def _counts(path: Path) -> dict[str, int]:
    con = duckdb.connect(str(path), read_only=True)
    try:
        views = [v for (v,) in con.execute(
            "SELECT view_name FROM duckdb_views() WHERE NOT internal ORDER BY 1").fetchall()]
        return {v: con.execute(f"SELECT count(*) FROM {v}").fetchone()[0]  # type: ignore[index]
                for v in views}
    finally:
        con.close()


def _rows(path: Path, view: str) -> list[tuple[object, ...]]:
    """A view's rows, sorted, floats to 6 decimals (parallel sums differ in the last
    bits from one query to the next)."""
    con = duckdb.connect(str(path), read_only=True)
    try:
        rows = con.execute(f"SELECT * FROM {view}").fetchall()
    finally:
        con.close()
    return sorted((tuple(round(v, 6) if isinstance(v, float) else v for v in r)
                   for r in rows), key=repr)


def test_a_catalog_from_the_template_holds_and_answers_what_a_full_build_does(
        warehouse: Path, cache: Path, tmp_path: Path) -> None:
    store, snapshot, statements = _inputs(warehouse)
    full = tmp_path / "full.duckdb"
    W.views_in_full(full, store, snapshot, statements)
    assert not W.views_from_template(tmp_path / "none.duckdb", store, snapshot, statements,
                                     build_template=False)
    first = tmp_path / "first.duckdb"
    assert W.views_from_template(first, store, snapshot, statements)  # builds the template
    assert [p.name for p in cache.iterdir()] == [f"catalog-template-{W.template_key()}.duckdb"]
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700
    catalog_template._memory.clear()
    again = tmp_path / "again.duckdb"
    assert W.views_from_template(again, store, snapshot, statements, build_template=False)
    assert _objects(first) == _objects(again) == _objects(full)
    assert _objects(full)["mark"] == W.statements_digest(statements)
    counts = _counts(full)
    assert counts["gpu_minute"] > 0 and counts["job_attempts"] > 0
    assert _counts(first) == _counts(again) == counts
    # the rows themselves: a base view and the views over it
    for view in ("job_attempts", "gpu_daily", "utilisation_by_team", "queue_wait_by_team"):
        assert _rows(full, view) == _rows(again, view), view


def test_the_template_holds_no_path_of_the_warehouse_it_served(
        warehouse: Path, cache: Path, tmp_path: Path) -> None:
    """Templates are built over a temporary folder of schema files: what one warehouse's
    build leaves in the template's file cannot reach another warehouse's catalog."""
    store, snapshot, statements = _inputs(warehouse)
    assert W.views_from_template(tmp_path / "c.duckdb", store, snapshot, statements)
    data = next(cache.iterdir()).read_bytes()
    assert str(warehouse).encode() not in data
    assert b"gpuledger-catalog-template-" in data


def test_a_warehouse_of_other_schema_files_gets_its_views_built_in_full(
        warehouse: Path, cache: Path, tmp_path: Path) -> None:
    """A schema file of an earlier release (a column fewer): the base view's columns
    are not the template's, so the catalog is built in full, with the file's columns."""
    other = tmp_path / "old"
    store, snapshot, _ = _inputs(warehouse)
    for table in TABLE_SCHEMAS:  # the schema files alone: no rows published
        obj = f"{W.FACTS}/{table}/{W.SCHEMA_FILE}"
        target = other / obj
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(store.read(obj) or b"")
    schema = other / W.FACTS / "rejects" / W.SCHEMA_FILE
    old = pl.read_parquet(schema).drop("raw")
    schema.write_bytes(W.parquet_bytes(old))
    old_store = W.open_store(other, create=False)
    empty = W.Snapshot({}, {})
    statements = W.catalog_statements(old_store, empty)
    assert W.views_from_template(tmp_path / "warm.duckdb", store, snapshot,
                                 W.catalog_statements(store, snapshot))  # template made
    path = tmp_path / "old.duckdb"
    assert not W.views_from_template(path, old_store, empty, statements,
                                     build_template=False)
    assert not path.exists() and old_store.url in W._MISFITS
    W.build_views(path, old_store, empty, statements)
    con = duckdb.connect(str(path), read_only=True)
    columns = [c for (c,) in con.execute(
        "SELECT column_name FROM duckdb_columns() WHERE table_name = 'rejects'").fetchall()]
    assert "raw" not in columns and "reason" in columns
    assert W.views_mark(con) == W.statements_digest(statements)


def test_a_file_unreadable_for_a_moment_does_not_keep_the_template_from_a_warehouse(
        warehouse: Path, cache: Path, tmp_path: Path) -> None:
    """A schema file that cannot be read (damaged, or a store's error): that build fails
    as a full one does, and the next takes the template again (only other columns keep
    a warehouse from it)."""
    copy = tmp_path / "wh"
    shutil.copytree(warehouse, copy)
    store, snapshot, statements = _inputs(copy)
    schema = copy / W.FACTS / "rejects" / W.SCHEMA_FILE
    good = schema.read_bytes()
    schema.write_bytes(b"PAR1 damaged")
    assert not W.views_from_template(tmp_path / "a.duckdb", store, snapshot, statements)
    assert store.url not in W._MISFITS and not (tmp_path / "a.duckdb").exists()
    with pytest.raises(duckdb.Error):
        W.build_views(tmp_path / "b.duckdb", store, snapshot, statements)
    schema.write_bytes(good)
    assert W.views_from_template(tmp_path / "c.duckdb", store, snapshot, statements)


def test_a_damaged_template_is_built_again(warehouse: Path, cache: Path,
                                           tmp_path: Path) -> None:
    store, snapshot, statements = _inputs(warehouse)
    W.build_views(tmp_path / "a.duckdb", store, snapshot, statements)
    template = next(cache.iterdir())
    good = template.read_bytes()
    template.write_bytes(b"not a database" * 100)
    catalog_template._memory.clear()
    path = tmp_path / "b.duckdb"
    W.build_views(path, store, snapshot, statements)  # from the damaged one: in full
    assert _objects(path) == _objects(tmp_path / "a.duckdb")
    assert not template.exists() or template.read_bytes() != b"not a database" * 100
    W.build_views(tmp_path / "c.duckdb", store, snapshot, statements)  # built again
    assert template.exists() and len(template.read_bytes()) == len(good)


def test_a_cache_folder_others_may_write_is_not_read(warehouse: Path, cache: Path,
                                                     tmp_path: Path) -> None:
    store, snapshot, statements = _inputs(warehouse)
    W.build_views(tmp_path / "a.duckdb", store, snapshot, statements)
    key = W.template_key()
    catalog_template._memory.clear()
    assert catalog_template.cached(key) is not None
    catalog_template._memory.clear()
    cache.chmod(0o777)
    assert catalog_template.cached(key) is None
    cache.chmod(0o700)
    next(cache.iterdir()).chmod(0o666)
    assert catalog_template.cached(key) is None
    W.build_views(tmp_path / "b.duckdb", store, snapshot, statements)  # still built
    assert _objects(tmp_path / "b.duckdb") == _objects(tmp_path / "a.duckdb")


def test_no_cache_folder_keeps_templates_in_memory_only(
        warehouse: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(catalog_template.CACHE_ENV, "")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    catalog_template._memory.clear()
    store, snapshot, statements = _inputs(warehouse)
    assert W.views_from_template(tmp_path / "a.duckdb", store, snapshot, statements)
    assert catalog_template.cache_dir() is None
    assert not (tmp_path / "home").exists()
    assert W.template_key() in catalog_template._memory
    catalog_template._memory.clear()


def test_readers_query_views_built_from_the_template(warehouse: Path, cache: Path,
                                                    tmp_path: Path) -> None:
    """A reader without a usable published catalog builds its own views: from the
    template too, with the same answers as through the published catalog."""
    want = connect(warehouse).execute(
        "SELECT team, pool, round(allocated_gpu_hours, 6) FROM utilisation_by_team "
        "ORDER BY ALL").fetchall()
    copy = tmp_path / "wh"
    shutil.copytree(warehouse, copy)
    (copy / W.CATALOG_STAMP).unlink()
    assert not any(cache.iterdir()) if cache.exists() else True
    got = connect(copy).execute(
        "SELECT team, pool, round(allocated_gpu_hours, 6) FROM utilisation_by_team "
        "ORDER BY ALL").fetchall()
    assert got == want and got
    assert any(cache.iterdir())
