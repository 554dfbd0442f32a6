"""The warehouse: Parquet facts with deterministic names, published in generations.

Layout under the warehouse location (a folder or ``s3://bucket/prefix``, ``store.py``)::

    facts/<table>/date=YYYY-MM-DD/<table>-YYYY-MM-DDTHH[-pNNN].<digest>.parquet  hourly parts
    facts/<table>/date=YYYY-MM-DD/<table>-YYYY-MM-DD[-pNNN].<digest>.parquet     daily parts
                                                                   (and compacted days)
    facts/<table>/snapshot[-pNNN].<digest>.parquet                  latest snapshot
    facts/<table>/_schema.parquet                                   empty, fixes the schema
    manifests/<unit>.json                                           what readers read
    catalog.duckdb                                                  views over the manifests

A part's *logical* name depends only on the event time it covers (and the partition
that owns it); rows are sorted and floats rounded to 9 decimals before writing, so
processing the same input twice writes the same bytes, hence the same object
(``generations.py``). Nothing written is visible until :meth:`Warehouse.commit`
publishes the manifests that name it: readers see whole generations, never a file of a
step without the others, on a local disk and on an object store alike.
"""

from __future__ import annotations

import functools
import hashlib
import io
import logging
import os
import re
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime, timedelta
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import duckdb
import polars as pl
from polars.datatypes import DataTypeClass

from gpuledger.pipeline import catalog_template, compaction, external_sort, temp_folders
from gpuledger.pipeline.config import WarehouseOptions
from gpuledger.pipeline.generations import (
    MANIFESTS,
    STARTED,
    Manifest,
    Publisher,
    Snapshot,
    read_manifests,
    read_snapshot,
    unit_of,
)
from gpuledger.pipeline.location import check_location
from gpuledger.pipeline.memory import PeriodicRelease
from gpuledger.pipeline.sort_worker import SortWorker, SortWorkerDied
from gpuledger.pipeline.store import Store, StoreError, open_store

log = logging.getLogger("gpuledger.warehouse")

FACTS = "facts"
CATALOG = "catalog.duckdb"
CATALOG_STAMP = f".{CATALOG}.sha256"
"""What the published catalog was built from (its statements' digest and storage
version) and the SHA-256 of its bytes. A reader takes the catalog only when its bytes
are the ones stamped (:func:`published_catalog`): a store that replaces an object in
place (S3Proxy's filesystem backend) served a reader a catalog torn between two
versions, whose mark was the newer generation's and whose views the older's."""
SCHEMA_FILE = "_schema.parquet"
FLOAT_DECIMALS = 9
CATALOG_UNITS = ("warehouse", "p000")
"""The catalog is rebuilt by the writer of these units (one writer, so that it never
goes back to an older generation of another writer's files)."""
COMPACT_PREFIX = "gpuledger-compact-"
"""A compaction's spill folder in the temporary directory (``temp_folders``): a day of
one table's objects, its buckets and the day's file."""
CATALOG_PREFIX = "gpuledger-catalog-"
"""The folder a catalog is built in before its upload (``temp_folders``)."""
SORT_CHILD_IDLE_S = 30.0
"""Compaction's child process is kept this long after its round for the next one
(``Warehouse.compaction_round``): an import of the openb trace compacts 149 days, and a
child started for each cost 17-23 % of its CPU (bench/README.md, *Seventeenth
session*)."""


def sql_dir() -> Path:
    """Where the catalog's ``*.sql`` files are (repository or installed package)."""
    here = Path(__file__).resolve()
    for candidate in (here.parents[3] / "sql", here.parent / "sql"):
        if candidate.is_dir():
            return candidate
    return Path(str(resources.files("gpuledger.pipeline") / "sql"))


def sorted_rows(frame: pl.DataFrame, sort_by: list[str]) -> pl.DataFrame:
    """``frame`` in ``sort_by`` order (nulls last, ties as they came): the key columns
    alone are sorted and the rows gathered once (sorting the whole frame takes several
    copies of every column: a compacted day's transient memory tripled)."""
    order = frame.select(sort_by).with_row_index("__row").sort(
        sort_by, nulls_last=True, maintain_order=True)["__row"]
    return frame[order]


def parquet_bytes(frame: pl.DataFrame, row_group_size: int | None = None) -> bytes:
    sink = io.BytesIO()
    frame.write_parquet(sink, compression="zstd", statistics=True,
                        row_group_size=row_group_size)
    return sink.getvalue()


class _SpillFailed(Exception):
    """The spill folder (``$TMPDIR``) failed; the cause is the ``OSError``."""


def _spill_failure(exc: BaseException | None) -> str:
    """Why the spill folder failed, naming it (the system's temporary folder)."""
    try:
        folder = tempfile.gettempdir()
    except OSError:  # none usable: the one the user meant
        folder = os.environ.get("TMPDIR", "?")
    why = getattr(exc, "strerror", None) or exc
    return f"the spill folder {folder} ($TMPDIR) failed: {why}"


class Warehouse:
    """Writes fact files into a warehouse location and publishes them."""

    def __init__(self, root: str | Path, suffix: str = "",
                 options: WarehouseOptions | None = None) -> None:
        """``suffix``: a shard's mark on the names of the files it writes, so that several
        processors write side by side into one warehouse. ``root``: a folder or an
        ``s3://`` URL; the store is reached once here (a bad location, refused
        credentials or an unreachable endpoint stop the start with one line)."""
        self.options = options or WarehouseOptions()
        self.store: Store = open_store(root)
        self.store.check()
        self.root = root
        self.suffix = f"-{suffix}" if suffix else ""
        self.files_written = 0
        self.rows_written = 0
        self.publisher = Publisher(self.store, self.options.retain_s)
        self.publisher.after_commit.append(self._after_commit)
        self._schemas: set[str] = set()
        self._catalog_at = time.monotonic()
        """When the catalog was last built, or the warehouse opened: the first commits'
        rebuild waits ``catalog_interval_s`` too (a run shorter than that builds it once,
        at its end; it was built twice)."""
        self._catalog_wanted = False
        self._catalog_lock = threading.Lock()
        self.release_memory = PeriodicRelease()
        """Free heap back to the system after commits: without it, RSS crept up by
        ~25 MiB a simulated day (bench/memory_flat.py)."""
        self._sorter: SortWorker | None = None
        """Compaction's child process (``compaction_round``): kept between rounds that
        follow within :data:`SORT_CHILD_IDLE_S`."""
        self._sorter_idle_at = 0.0
        """When the last round ended (``time.monotonic``)."""
        self._in_round = False
        self.compaction_peak_rss_kib = 0
        """The largest peak resident memory of compaction's child processes so far."""

    @property
    def location(self) -> str:
        """The warehouse as it may be printed."""
        return self.store.url

    def _suffix(self, suffix: str | None) -> str:
        return self.suffix if suffix is None else (f"-{suffix}" if suffix else "")

    def _unit(self, suffix: str | None) -> str:
        return unit_of(self._suffix(suffix).lstrip("-"))

    def part_path(self, table: str, when: datetime, hourly: bool = True,
                  suffix: str | None = None) -> str:
        """A part's logical name. ``suffix``: a partition's mark (``partitions.py``);
        None: the warehouse's own."""
        date = when.strftime("%Y-%m-%d")
        stamp = when.strftime("%Y-%m-%dT%H") if hourly else date
        return f"{FACTS}/{table}/date={date}/{table}-{stamp}{self._suffix(suffix)}.parquet"

    def _shape(self, frame: pl.DataFrame, sort_by: list[str] | None) -> pl.DataFrame:
        # Parallel float sums may differ in the last bit between runs; 9 decimals keep
        # every fact exact to far below its meaning and make the bytes reproducible.
        frame = frame.with_columns(pl.col(pl.Float64).round(FLOAT_DECIMALS))
        return sorted_rows(frame, sort_by) if sort_by else frame

    def write(self, path: str, frame: pl.DataFrame, sort_by: list[str] | None = None,
              suffix: str | None = None, row_group_size: int | None = None) -> str:
        """Make ``frame`` (sorted) the next content of the logical file ``path``; it is
        published at the next :meth:`commit`. Returns the object's name."""
        frame = self._shape(frame, sort_by)
        return self._put(path, parquet_bytes(frame, row_group_size), frame.height, suffix)

    def _put(self, path: str, data: bytes, rows: int, suffix: str | None) -> str:
        """Make the Parquet object ``data`` (``rows`` rows) the next content of ``path``."""
        return self._counted(self.publisher.put(self._unit(suffix), path, data), rows)

    def _counted(self, obj: str, rows: int) -> str:
        """``obj``, a fact object of ``rows`` rows just put, counted as written."""
        self.files_written += 1
        self.rows_written += rows
        return obj

    def read_bytes(self, path: str, suffix: str | None = None) -> bytes | None:
        """The published (or about to be) Parquet object of the logical file ``path``."""
        obj = self.publisher.current(self._unit(suffix), path)
        return None if obj is None else self.publisher.read(obj)

    def _object_url(self, path: str, suffix: str | None) -> str:
        """Where the published object of the logical file ``path`` lies (for messages)."""
        obj = self.publisher.current(self._unit(suffix), path)
        return self.store.url_of(obj if isinstance(obj, str) else path)

    def read(self, path: str, suffix: str | None = None) -> pl.DataFrame | None:
        """The published (or about to be) content of the logical file ``path``; a
        :class:`StoreError` naming it when it is not Parquet (an ingest merging rows
        into a damaged object stopped with Polars' traceback)."""
        data = self.read_bytes(path, suffix)
        if data is None:
            return None
        try:
            return pl.read_parquet(io.BytesIO(data))
        except Exception as exc:  # Polars' ComputeError, an OSError of the reader
            raise StoreError(f"{self.store.url_of(path)}: {_unreadable(exc, path)}") from None

    def write_part(
        self, table: str, when: datetime, frame: pl.DataFrame, sort_by: list[str],
        hourly: bool = True, merge: bool = False, suffix: str | None = None,
    ) -> str:
        """Write one time part.

        With ``merge``, rows already written there are kept unless the new frame has a
        row with the same ``sort_by`` key (which then replaces it): rewriting the same
        input is idempotent and late rows are added. An hour of a day already compacted
        goes into the day's object (the hour's rows there are replaced or merged).
        """
        path = self.part_path(table, when, hourly, suffix)
        day = self.part_path(table, when, False, suffix)
        if hourly and table in compaction.PART_TIME \
                and self.publisher.current(self._unit(suffix), day) is not None:
            return self._into_compacted_day(table, when, frame, sort_by, merge, suffix)
        if merge:
            old = self.read(path, suffix)
            if old is not None:
                frame = _merged(old, frame, sort_by)
        return self.write(path, frame, sort_by, suffix)

    def _into_compacted_day(self, table: str, hour: datetime, frame: pl.DataFrame,
                            sort_by: list[str], merge: bool, suffix: str | None) -> str:
        """The day's rows of other hours, and the hour's new rows (with ``merge``, also its
        old rows that no new row replaces), sorted into the day's object again: in
        bounded memory, as compaction sorts (``external_sort.py``). A replay of history
        rewrites every hour of a compacted day this way."""
        day = self.part_path(table, hour, False, suffix)
        in_hour = pl.col(compaction.PART_TIME[table]).dt.truncate("1h") == hour
        frame = self._shape(frame, None)
        if merge:
            frame = frame.unique(subset=sort_by, keep="last", maintain_order=True)
            replaced = frame.select(sort_by).with_columns(pl.lit(True).alias("_replaced"))

            def others(rows: pl.LazyFrame) -> pl.LazyFrame:
                return rows.join(replaced.lazy(), on=sort_by, how="left", nulls_equal=True,
                                 maintain_order="left").filter(
                    ~in_hour | pl.col("_replaced").is_null()).drop("_replaced")
        else:
            def others(rows: pl.LazyFrame) -> pl.LazyFrame:
                return rows.filter(~in_hour)

        try:
            obj = self._sorted_day(table, day, [day], suffix, sort_by, [parquet_bytes(frame)],
                                   [others, None], empty=True)
        except _SpillFailed as failure:
            assert failure.__cause__ is not None
            raise failure.__cause__ from None
        assert obj is not None
        log.info("%s: an hour of compacted %s rewritten", table, day)
        return obj

    def drop_rows(self, table: str, hour: datetime, span: tuple[datetime, datetime],
                  sort_by: list[str], suffix: str | None = None) -> bool:
        """Take the rows of ``table`` whose time is in ``span`` (``[start, end)``) out of
        ``hour``'s part: its file (no longer published once empty), or its rows in the
        compacted day's object. True when there were some."""
        unit = self._unit(suffix)
        path = self.part_path(table, hour, True, suffix)
        day = self.part_path(table, hour, False, suffix)
        if self.publisher.current(unit, day) is not None:
            within = _within(table, span) & (
                pl.col(compaction.PART_TIME[table]).dt.truncate("1h") == hour)
            old = self.read(day, suffix)
            if old is None or old.filter(within).is_empty():
                return False
            self._into_compacted_day(table, hour, old.clear(), sort_by, False, suffix)
            return True
        if self.publisher.current(unit, path) is None:
            return False
        old = self.read(path, suffix)
        if old is None:
            return False
        return self._keep(path, old, old.filter(~_within(table, span)), sort_by, suffix)

    def part_days(self, tables: list[str], suffix: str | None = None) -> dict[str, set[str]]:
        """Per table, the days (``date=`` folders) with published parts."""
        out: dict[str, set[str]] = {}
        for logical in self.publisher.unit(self._unit(suffix)).files:
            parts = logical.split("/")
            if len(parts) == 4 and parts[1] in tables and parts[2].startswith("date="):
                out.setdefault(parts[1], set()).add(parts[2])
        return out

    def drop_part(self, table: str, day: datetime, suffix: str | None = None) -> None:
        """``table``'s part of ``day`` (a day-partitioned table's file) is no longer
        published (nothing happens when there is none)."""
        path = self.part_path(table, day, False, suffix)
        if self.publisher.current(self._unit(suffix), path) is not None:
            self.publisher.drop(self._unit(suffix), path)

    def day_rows(self, table: str, day: datetime, suffix: str | None = None
                 ) -> pl.DataFrame | None:
        """The published rows of ``table`` in ``day``'s folder (its hours' files and a
        compacted day's object), or None when there are none."""
        folder = f"date={day:%Y-%m-%d}"
        frames = []
        for logical in sorted(self.publisher.unit(self._unit(suffix)).files):
            parts = logical.split("/")
            if len(parts) == 4 and parts[1] == table and parts[2] == folder:
                frame = self.read(logical, suffix)
                if frame is not None and frame.height:
                    frames.append(frame)
        return pl.concat(frames, how="vertical_relaxed") if frames else None

    def drop_rows_not_in(self, table: str, days: set[str], span: tuple[datetime, datetime],
                         keep: pl.DataFrame, suffix: str | None = None) -> int:
        """Of ``table``'s parts (hours and compacted days) in ``days``, the rows whose time
        is in ``(start, end]`` of ``span`` and whose key (``keep``'s columns) is not in
        ``keep`` go (what is left keeps the order of ``keep``'s columns). Returns how
        many."""
        keys = keep.columns
        dropped = 0
        for logical in sorted(self.publisher.unit(self._unit(suffix)).files):
            parts = logical.split("/")
            if len(parts) != 4 or parts[1] != table or parts[2] not in days:
                continue
            old = self.read(logical, suffix)
            if old is None:
                continue
            rows = old.with_row_index("_i")
            stale = rows.filter(_within(table, span, "right")).join(
                keep.cast({k: old.schema[k] for k in keys}), on=keys, how="anti",
                nulls_equal=True)["_i"]
            if stale.len():
                dropped += stale.len()
                kept = rows.filter(~pl.col("_i").is_in(stale.implode())).drop("_i")
                self._keep(logical, old, kept, keys, suffix)
        return dropped

    def _keep(self, logical: str, old: pl.DataFrame, kept: pl.DataFrame,
              sort_by: list[str], suffix: str | None) -> bool:
        """``kept`` (rows of ``old``) the content of ``logical`` from now on; a file left
        empty is no longer published. True when some row went."""
        if kept.height == old.height:
            return False
        if kept.is_empty():
            self.publisher.drop(self._unit(suffix), logical)
        else:
            self.write(logical, kept, sort_by, suffix)
        return True

    def write_snapshot(self, table: str, frame: pl.DataFrame, sort_by: list[str],
                       suffix: str | None = None) -> None:
        self.write(f"{FACTS}/{table}/snapshot{self._suffix(suffix)}.parquet", frame,
                   sort_by, suffix)

    def ensure_schema(self, table: str, schema: pl.Schema) -> None:
        """Write the table's empty schema file so its view exists before any rows do."""
        path = f"{FACTS}/{table}/{SCHEMA_FILE}"
        if path not in self._schemas:
            self.publisher.put_schema(path, parquet_bytes(pl.DataFrame(schema=schema)))
            self._schemas.add(path)

    # -- publishing ------------------------------------------------------------------

    def commit(self, closed: datetime | None = None, wait: bool = False) -> None:
        """The end of a step's writes: publish them as one generation per unit (the
        uploads go on in the background; ``wait`` or :meth:`sync` waits for them).
        ``closed``: every minute before it is closed; days closed
        ``options.compact_after_s`` before it are compacted first."""
        compacted = 0
        self._retire_sorter(SORT_CHILD_IDLE_S)
        if closed is not None and self.options.compact:
            horizon = closed - timedelta(seconds=self.options.compact_after_s)
            with self.compaction_round():
                for unit in list(self.publisher.manifests):
                    compacted += self.compact_unit(unit, horizon)
        self.publisher.commit(wait=wait)
        self.release_memory(force=compacted > 0)

    @property
    def compaction_child(self) -> int | None:
        """The process id of compaction's child while one runs (in a round, or kept for
        the next); else None."""
        return None if self._sorter is None else self._sorter.pid

    @contextmanager
    def compaction_round(self) -> Iterator[None]:
        """The days compacted inside are sorted in one child process (``sort_worker.py``,
        started at the first sort), unless ``options.compact_worker`` is off. The child
        is kept for the next round: a catch-up or an import compacts a day every second
        or so, and a child's start (its imports) costs about 0.3 s of CPU. It ends at the
        first commit :data:`SORT_CHILD_IDLE_S` after its round (a live processor's rounds
        are a day apart: its memory is back within a commit of that), at the end of the
        input (:meth:`end_compaction`) and at once when a round is cut off (a stop,
        Ctrl-C)."""
        if not self.options.compact_worker or self._in_round:
            yield
            return
        if self._sorter is not None and self._sorter.ended:  # died while it was kept
            self._sorter.close()
            self._sorter = None
        sorter = self._sorter = self._sorter or SortWorker()
        self._in_round = True
        try:
            yield
        except BaseException:
            self._sorter = None
            sorter.stop()
            raise
        finally:
            self._in_round = False
            self._sorter_idle_at = time.monotonic()
            self.compaction_peak_rss_kib = max(self.compaction_peak_rss_kib,
                                               sorter.peak_rss_kib)
            if sorter.peak_rss_kib:
                log.info("compaction round done; its child process peaked at %.0f MiB",
                         sorter.peak_rss_kib / 1024)

    def _retire_sorter(self, idle_s: float) -> None:
        """End compaction's child when it has waited ``idle_s`` since its round."""
        sorter = self._sorter
        if sorter is None or self._in_round:
            return
        if time.monotonic() - self._sorter_idle_at >= idle_s:
            self._sorter = None
            sorter.close()  # waits: its memory is back when this returns

    def end_compaction(self) -> None:
        """The input has ended: compaction's kept child ends now."""
        self._retire_sorter(0.0)

    def compact_unit(self, unit: str, before: datetime,
                     on_day: Callable[[], None] | None = None,
                     put_off: list[tuple[str, str]] | None = None) -> int:
        """Rewrite each closed day (ending at or before ``before``) of ``unit`` held in
        hourly parts into one object per table; returns the number of days rewritten.
        ``on_day`` is called after each table-day (done or put off). A day put off (its
        hours stay) is a warning that the next commit tries again, or, given ``put_off``,
        appended there as (the day's object, why) for the caller to say."""
        manifest = self.publisher.unit(unit)
        done = 0
        for (table, day), hours in sorted(compaction.days_to_compact(manifest, before).items()):
            failed = self._compact_day(unit, manifest, table, day, hours)
            if failed is None:
                done += 1
            elif put_off is not None:
                put_off.append(failed)
            else:
                log.warning("compaction of %s put off, its hourly files stay (%s); tried "
                            "again at the next commit", *failed)
            if on_day is not None:
                on_day()
        return done

    def _compact_day(self, unit: str, manifest: Manifest, table: str, day: datetime,
                     hours: list[str]) -> tuple[str, str] | None:
        """One table-day of :meth:`compact_unit` (``manifest``: the unit's, as it was
        when the round began); put off (the hours stay): the day's object and why."""
        suffix = "" if unit == "warehouse" else unit
        day_path = self.part_path(table, day, False, suffix)
        paths = ([day_path] if day_path in manifest.files else []) + hours
        # what the step before (or the table before) freed goes back first: each
        # table's sort then starts from the state's memory, not from a past peak
        self.release_memory(force=True)
        try:
            self._sorted_day(table, day_path, paths, suffix)
        except _SpillFailed as failure:  # $TMPDIR full or unwritable: the hours stay
            return day_path, _spill_failure(failure.__cause__)
        except SortWorkerDied as exc:
            return day_path, str(exc)
        for h in hours:
            self.publisher.drop(unit, h)
        return None

    def _sorted_day(self, table: str, day: str, paths: list[str], suffix: str | None,
                    sort_by: list[str] | None = None, more: list[bytes] | None = None,
                    keep: list[external_sort.Keep | None] | None = None, empty: bool = False,
                    ) -> str | None:
        """Make the rows of the objects ``paths`` (a day's hourly parts, and the day's
        object if there is one), and of the Parquet files ``more``, the next content of
        the day's object ``day``; its object's name (None: no rows, and not ``empty``,
        so nothing written).

        Sorted in bounded memory (never the day's rows all at once) and on disk: the
        objects are fetched one by one into a temporary folder, and the day is written
        there and uploaded from the file. ``keep``: per object, then per file of ``more``,
        which rows to take. Only a failure of that folder raises ``_SpillFailed``; the
        store's errors are its own."""
        temp_folders.sweep(COMPACT_PREFIX)  # those of compactions killed mid-way
        try:
            folder = temp_folders.owned(COMPACT_PREFIX)
        except OSError as exc:
            raise _SpillFailed from exc
        with folder as tmp:
            parts: list[external_sort.Part] = []
            for i, path in enumerate(paths):
                data = self.read_bytes(path, suffix)
                if data is None:
                    continue
                file = Path(tmp) / f"{i:05d}.parquet"
                try:
                    file.write_bytes(data)
                except OSError as exc:
                    raise _SpillFailed from exc
                del data
                _check_footer(file, self._object_url(path, suffix))
                parts.append(file)
            parts += more or []
            if not parts:
                return None
            out = Path(tmp) / "day.parquet"
            order = compaction.sort_order(table, sort_by)
            files = [p for p in parts if isinstance(p, Path)]
            try:
                if (self._in_round and self._sorter is not None and keep is None
                        and len(files) == len(parts)):
                    rows = self._sorter.sort_into(out, files, order, compaction.ROW_GROUP_ROWS,
                                                  self.options.compact_bucket_rows)
                else:
                    rows = external_sort.sort_into(out, parts, order, compaction.ROW_GROUP_ROWS,
                                                   self.options.compact_bucket_rows, keep=keep)
            except OSError as exc:
                raise _SpillFailed from exc
            if not rows and not empty:
                return None
            return self._counted(self.publisher.put_file(self._unit(suffix), day, out), rows)

    def sync(self) -> None:
        """Wait until everything committed is published (before a checkpoint: the
        checkpoint must not cover facts that are not durable)."""
        self.publisher.sync()
        self._maybe_catalog(force=False)

    def close(self) -> None:
        self.end_compaction()
        self.publisher.close()

    def _after_commit(self, units: set[str]) -> None:
        if units & set(CATALOG_UNITS):
            self._catalog_wanted = True
            self._maybe_catalog(force=False)

    def _maybe_catalog(self, force: bool) -> None:
        """Rebuild the catalog if due; one that cannot be built now (another writer of
        the bucket mid-way) is a warning and is tried again at the next commit: it is a
        convenience, the facts are published without it."""
        interval = self.options.catalog_interval_s
        if force or (self._catalog_wanted and time.monotonic() - self._catalog_at >= interval):
            self._catalog_wanted = False
            self.rebuild_catalog()

    def rebuild_catalog(self) -> None:
        """Build the catalog over what is published now (any writer's units); if it cannot
        be built now, say why and build it again after the next commit."""
        try:
            self._write_catalog()
        except (duckdb.Error, OSError) as exc:
            self._catalog_wanted = True
            log.warning("catalog.duckdb not rebuilt: %s (again after the next commit)",
                        str(exc).splitlines()[0])

    def publish_catalog(self, required: bool = True) -> str:
        """Publish everything written so far, then (re)build ``catalog.duckdb`` with the
        views of ``sql/*.sql`` over the published files; the catalog is replaced
        whole. Returns its location. Not ``required`` (a service starting beside
        others that write the same bucket): a catalog that cannot be built now is a
        warning, and it is built again after the next commit."""
        self.publisher.commit(wait=True)
        if set(self.publisher.manifests) & set(CATALOG_UNITS) or not self.store.exists(CATALOG):
            if required:
                self._write_catalog()
            else:
                self.rebuild_catalog()
        return self.store.url_of(CATALOG)

    def _write_catalog(self) -> None:
        with self._catalog_lock:
            # the interval counts from any build (a service's build at its start too:
            # its first commit then does not build the catalog again at once)
            self._catalog_at = time.monotonic()
            self._build_catalog()

    def _build_catalog(self) -> None:
        temp_folders.sweep(CATALOG_PREFIX)  # those of builds killed mid-way
        snapshot = read_snapshot(self.store)
        statements = catalog_statements(self.store, snapshot)
        # the storage format is part of what was built: a catalog of an earlier release,
        # in DuckDB's newest format, is built again even for the same statements
        digest = f"{statements_digest(statements)} {CATALOG_STORAGE_VERSION}"
        stamp = _catalog_stamp(self.store)
        if stamp is not None and stamp[0] == digest and self.store.exists(CATALOG):
            return
        with temp_folders.owned(CATALOG_PREFIX) as tmp:
            path = Path(tmp) / CATALOG
            build_views(path, self.store, snapshot, statements)
            data = path.read_bytes()
            self.store.write(CATALOG, data)
        self.store.write(CATALOG_STAMP,
                         f"{digest} {hashlib.sha256(data).hexdigest()}".encode())


def _within(table: str, span: tuple[datetime, datetime],
            ends: Literal["left", "right"] = "left") -> pl.Expr:
    """Rows of ``table`` whose time (``compaction.PART_TIME``) is in ``span`` (``ends``:
    which of its ends it holds)."""
    return pl.col(compaction.PART_TIME[table]).is_between(span[0], span[1], closed=ends)


def _merged(old: pl.DataFrame, new: pl.DataFrame, keys: list[str]) -> pl.DataFrame:
    return pl.concat([old, new.cast(old.schema, strict=False)], how="vertical_relaxed").unique(
        subset=keys, keep="last", maintain_order=True)


# -- readers ---------------------------------------------------------------------------

def attach_store(con: duckdb.DuckDBPyConnection, store: Store,
                 sizes: dict[str, int] | None = None) -> None:
    """Let DuckDB read ``store``'s files by their URLs: a remote store's PyArrow
    filesystem is registered with DuckDB (through fsspec's adapter), so DuckDB reads the
    bucket through the same layer as the processor (no ``httpfs`` needed). ``sizes``
    (object → bytes, from the manifests) spare a request per file: objects never
    change, so what a manifest says of one stays true."""
    if not store.remote:
        return
    con.register_filesystem(_objects(store, {store.full(o): n for o, n in (sizes or {}).items()}))


WHOLE_OBJECT_BYTES = 8 << 20
"""Objects up to this size are fetched whole, once per connection (one request, then
memory); larger ones are read in ranges."""


class ObjectFile(io.RawIOBase):
    """A read-only file over an object's bytes, or over a PyArrow random-access file,
    whose position is kept per thread: DuckDB's threads read one file handle at once (a
    seek, then a read, each a call of their own), so a shared position would let one
    thread read where another sought. Reads are positional underneath (``read_at``)."""

    def __init__(self, source: Any, size: int) -> None:
        super().__init__()
        self._source = source
        self._size = size
        self._here = threading.local()

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return int(getattr(self._here, "pos", 0))

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.tell(), io.SEEK_END: self._size}[whence]
        self._here.pos = max(0, base + offset)
        return int(self._here.pos)

    def read(self, size: int | None = -1) -> bytes:
        pos = self.tell()
        n = self._size - pos if size is None or size < 0 else min(size, self._size - pos)
        if n <= 0:
            return b""
        if isinstance(self._source, bytes):
            data = self._source[pos:pos + n]
        else:
            data = self._source.read_at(n, pos)
        self._here.pos = pos + len(data)
        return data

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[:len(data)] = data
        return len(data)

    def close(self) -> None:
        if not isinstance(self._source, bytes):
            self._source.close()
        super().close()


def _objects(store: Store, sizes: dict[str, int]) -> Any:
    from datetime import UTC
    from datetime import datetime as dt

    from fsspec.implementations.arrow import ArrowFSWrapper

    kept: dict[str, bytes] = {}
    lock = threading.Lock()
    epoch = dt(1970, 1, 1, tzinfo=UTC)

    def small(bare: str) -> bool:
        return bare.endswith(f"/{SCHEMA_FILE}") or sizes.get(bare, 1 << 62) <= WHOLE_OBJECT_BYTES

    class Objects(ArrowFSWrapper):  # type: ignore[misc]
        """fsspec's view of the store for DuckDB. Objects never change once written
        (``generations.py``), so what is known of one stays true: paths without
        wildcards are taken as they are (a manifest names existing objects), sizes come
        from the manifests, small objects are fetched whole once."""

        protocol = "s3"

        def glob(self, path: str, **kwargs: Any) -> Any:
            bare = self._strip_protocol(path)
            if not any(c in bare for c in "*?["):
                return [bare]
            return super().glob(path, **kwargs)

        def _whole(self, bare: str) -> bytes | None:
            with lock:
                data = kept.get(bare)
            if data is None and small(bare):
                with self.fs.open_input_stream(bare) as f:
                    data = f.read()
                with lock:
                    kept[bare] = data
            return data

        def info(self, path: str, **kwargs: Any) -> Any:
            bare = self._strip_protocol(path)
            if bare in sizes:
                return {"name": bare, "size": sizes[bare], "type": "file"}
            data = self._whole(bare) if small(bare) else None
            if data is not None:
                return {"name": bare, "size": len(data), "type": "file"}
            return super().info(path, **kwargs)

        def modified(self, path: str) -> Any:
            return epoch  # never changes

        def _open(self, path: str, mode: str = "rb", block_size: Any = None,
                  autocommit: bool = True, cache_options: Any = None, **kwargs: Any) -> Any:
            bare = self._strip_protocol(path)
            if mode != "rb":
                return super()._open(path, mode, block_size, **kwargs)
            data = self._whole(bare)
            if data is not None:
                _check_size(bare, len(data))
                return ObjectFile(data, len(data))
            source = self.fs.open_input_file(bare)
            try:
                _check_size(bare, source.size())
            except OSError:
                source.close()
                raise
            return ObjectFile(source, source.size())

    def _check_size(bare: str, size: int) -> None:
        """An object whose size is not its manifest's is damaged (cut short, replaced):
        say which, rather than DuckDB's short read of a nameless "Python file"."""
        expected = sizes.get(bare)
        if expected is not None and expected != size:
            raise OSError(f"s3://{bare}: {size_damage(size, expected)}")

    return Objects(store.fs)


def file_list(store: Store, snapshot: Snapshot, table: str) -> str:
    """The SQL list of ``table``'s published files, its schema file first."""
    return _sql_list(store, [f"{FACTS}/{table}/{SCHEMA_FILE}", *snapshot.table(table)])


def _sql_list(store: Store, paths: list[str]) -> str:
    """The SQL list of the URLs of ``paths``, each a quoted string."""
    return "[" + ", ".join("'" + store.url_of(p).replace("'", "''") + "'" for p in paths) + "]"


def rows_relation(store: Store, snapshot: Snapshot, table: str) -> str:
    """The SQL relation of ``table``'s rows, a table of ``UNSCHEMATISED_TABLES``: its
    columns typed from the code (no schema file), then its published files, if any."""
    empty = _typed_empty_select(table)
    objects = snapshot.table(table)
    if not objects:
        return f"({empty})"
    return (f"({empty} UNION ALL BY NAME SELECT * FROM read_parquet("
            f"{_sql_list(store, objects)}, hive_partitioning = false))")


@functools.cache
def _typed_empty_select(table: str) -> str:
    """``SELECT`` of no rows with the columns of ``table`` (of ``UNSCHEMATISED_TABLES``),
    typed as DuckDB reads them from the Parquet files Polars writes."""
    from gpuledger.pipeline.tables import UNSCHEMATISED_TABLES

    columns = ", ".join(f'CAST(NULL AS {duckdb_type(dtype)}) AS "{name}"'
                        for name, dtype in UNSCHEMATISED_TABLES[table].items())
    return f"SELECT {columns} WHERE false"


_DUCKDB_TYPES: tuple[tuple[DataTypeClass, str], ...] = (
    (pl.String, "VARCHAR"), (pl.Int64, "BIGINT"), (pl.Int32, "INTEGER"),
    (pl.Float64, "DOUBLE"), (pl.Float32, "FLOAT"), (pl.Boolean, "BOOLEAN"), (pl.Date, "DATE"))


def duckdb_type(dtype: pl.DataType | DataTypeClass) -> str:
    """The DuckDB type of a column Polars writes to Parquet as ``dtype`` (the types the
    fact tables use; tests/test_query_catalog.py checks them against DuckDB's reading)."""
    if isinstance(dtype, pl.Datetime):
        return "TIMESTAMP WITH TIME ZONE" if dtype.time_zone else "TIMESTAMP"
    if isinstance(dtype, pl.List):
        return f"{duckdb_type(dtype.inner)}[]"
    if isinstance(dtype, pl.Struct):
        return "STRUCT(" + ", ".join(f'"{f.name}" {duckdb_type(f.dtype)}'
                                     for f in dtype.fields) + ")"
    for polars_type, name in _DUCKDB_TYPES:
        if dtype == polars_type:
            return name
    raise TypeError(f"no DuckDB type for {dtype}")


def catalog_statements(store: Store, snapshot: Snapshot) -> list[str]:
    """The catalog's SQL: ``{files:<table>}`` becomes the list of the table's files in
    ``snapshot``, ``{rows:<table>}`` the relation of a table without a schema file
    (:func:`rows_relation`), ``{facts}`` the facts folder's URL."""
    out: list[str] = []
    facts = store.url_of(FACTS).replace("'", "''")
    tables: dict[str, str] = {}

    def files(name: str) -> str:
        if name not in tables:
            tables[name] = file_list(store, snapshot, name)
        return tables[name]

    for _name, raw in sql_files():
        text = raw.replace("{facts}", facts)
        out.append(_fill(_fill(text, files), functools.partial(rows_relation, store, snapshot),
                         "{rows:"))
    return out


@functools.cache
def sql_files() -> tuple[tuple[str, str], ...]:
    """The catalog's SQL files (name, text), in the order they are run."""
    return tuple((path.name, path.read_text()) for path in sorted(sql_dir().glob("*.sql")))


_PLACEHOLDERS = ("{files:", "{rows:", "{facts}")


@functools.cache
def _varying() -> int | None:
    """How many of the catalog's statements differ between warehouses (the SQL files
    with placeholders, which come first); None when one without comes before one with
    (no template then: the views over them would be bound before them)."""
    marks = [any(p in raw for p in _PLACEHOLDERS) for _name, raw in sql_files()]
    n = marks.index(False) if False in marks else len(marks)
    return None if any(marks[n:]) else n


CATALOG_SCHEMA = "gpuledger"
CATALOG_MARK = f"{CATALOG_SCHEMA}.catalog"
"""A one-row table in every views database (``catalog.duckdb`` and a reader's own):
``statements_sha256``, the digest of the statements that built it, which names the
generation and the SQL it holds."""


def statements_digest(statements: list[str]) -> str:
    """What ``CATALOG_MARK`` holds for these statements."""
    return hashlib.sha256("\n".join(statements).encode()).hexdigest()


CATALOG_STORAGE_VERSION = "v1.1.0"
"""The DuckDB storage format of the views databases (``catalog.duckdb``): the oldest that
every view and macro runs on (DuckDB 1.1; 1.0 lacks ``arg_max`` over a struct). By default
DuckDB writes its own newest format, and every DuckDB CLI before 2.0 refused the file
("a database file with version number 69"). The catalog holds only views and one
one-row table, so the older format costs nothing."""


def _check_footer(file: Path, named: str) -> None:
    """A part to be compacted is a readable Parquet file, or :class:`StoreError` naming
    its object (a file cut short stopped ``compact`` with two tracebacks, the child's and
    its own, naming no file). Reads the footer only."""
    try:
        pl.read_parquet_schema(file)
    except Exception as exc:  # Polars' ComputeError, an OSError of the reader
        raise StoreError(f"{named}: {_unreadable(exc, named, 'the day is not compacted')}"
                         ) from None


def _unreadable(exc: BaseException, named: str, what: str = "") -> str:
    """Why the object ``named`` could not be read, and what repairs it (:func:`_repair`)."""
    reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return (f"not a readable Parquet file ({reason})" + (f": {what}" if what else "")
            + f"; {_repair(named)}")


def _repair(named: str) -> str:
    """What repairs the damaged object ``named`` (a path or URL holding
    ``facts/<table>/``): :data:`REPAIR_MERGED` for a merged table's, else :data:`REPAIR`."""
    from gpuledger.pipeline.processor import MERGED_TABLES  # (it imports this module)

    table = re.search(r"(?:^|/)facts/([^/]+)/", named)
    return REPAIR_MERGED if table is not None and table.group(1) in MERGED_TABLES \
        else REPAIR


def size_damage(size: int, expected: int) -> str:
    """What an object of ``size`` bytes is, whose manifest records ``expected``."""
    return (f"damaged: it holds {size} bytes where the generation's manifest says "
            f"{expected} (cut short or replaced since it was written)")


_VIEWS_CONFIG: dict[str, str | bool | int | float | list[str]] = {
    "autoinstall_known_extensions": False, "autoload_known_extensions": False,
    "storage_compatibility_version": CATALOG_STORAGE_VERSION}


def build_views(path: Path, store: Store, snapshot: Snapshot, statements: list[str]) -> None:
    """Create the database ``path`` with the views of ``statements`` (from
    ``catalog_statements(store, snapshot)``) and their mark, in the storage format of
    :data:`CATALOG_STORAGE_VERSION`: from this release's template when the base views
    come out with its columns (``catalog_template``), else in full."""
    if not views_from_template(path, store, snapshot, statements):
        views_in_full(path, store, snapshot, statements)


def views_in_full(path: Path, store: Store, snapshot: Snapshot, statements: list[str]
                  ) -> None:
    """:func:`build_views` without a template: every statement run."""
    con = duckdb.connect(str(path), config=_VIEWS_CONFIG)
    try:
        attach_store(con, store, snapshot.sizes)
        for statement in statements:
            con.execute(statement)
        _add_mark(con, statements)
    finally:
        con.close()


def _add_mark(con: duckdb.DuckDBPyConnection, statements: list[str]) -> None:
    """The mark of ``statements``, in place of the template's own."""
    con.execute(f"CREATE SCHEMA IF NOT EXISTS {CATALOG_SCHEMA}")
    con.execute(f"CREATE OR REPLACE TABLE {CATALOG_MARK} AS SELECT ? AS statements_sha256",
                [statements_digest(statements)])


def views_from_template(path: Path, store: Store, snapshot: Snapshot, statements: list[str],
                        build_template: bool = True) -> bool:
    """Build ``path`` from the template: its copy, with the statements that differ
    between warehouses run again over ``store``'s files. False (``path`` removed) when
    there is no template (and ``build_template`` is off, or it cannot be built), or the
    base views' columns are not the template's."""
    varying, key = _varying(), template_key()
    if varying is None or len(statements) != len(sql_files()) or store.url in _MISFITS:
        return False
    data = catalog_template.cached(key)
    if data is None and build_template and key not in _UNBUILDABLE:
        data = _build_template()
        if data is None:
            _UNBUILDABLE.add(key)
        else:
            catalog_template.keep(key, data)
    if data is None:
        return False
    path.write_bytes(data)
    try:
        con = duckdb.connect(str(path), config=_VIEWS_CONFIG)
    except duckdb.Error as exc:  # a damaged file: built again next time
        log.debug("catalog template not usable (%s): built in full", exc)
        catalog_template.forget(key)
        path.unlink(missing_ok=True)
        return False
    same = False
    try:
        before = _TEMPLATE_COLUMNS.get(key)
        if before is None:
            before = _TEMPLATE_COLUMNS[key] = _view_columns(con)
        attach_store(con, store, snapshot.sizes)
        for statement in statements[:varying]:
            con.execute(statement)
        same = _view_columns(con) == before
        if same:
            _add_mark(con, statements)
        else:
            _MISFITS.add(store.url)
    except duckdb.Error as exc:  # a file not readable now: the full build says which
        log.debug("catalog from its template failed (%s): built in full", exc)
        same = False
    finally:
        con.close()
    if not same:
        path.unlink(missing_ok=True)
    return same


_MISFITS: set[str] = set()
"""Warehouses whose base views came out with other columns than the template's (schema
files of an earlier release, which are never replaced): built in full from then on in
this process, without trying the template each time."""
_TEMPLATE_COLUMNS: dict[str, list[tuple[Any, ...]]] = {}
"""Each template's views' columns (:func:`_view_columns`), read once per process."""
_UNBUILDABLE: set[str] = set()
"""Templates that could not be built in this process (no usable temporary folder): not
tried again at every build."""


def _view_columns(con: duckdb.DuckDBPyConnection) -> list[tuple[Any, ...]]:
    """The columns (view or table, position, name, type) of everything in a views
    database that is not DuckDB's own: its views, and its mark's one column."""
    return sorted(con.execute(
        "SELECT table_name, column_index, column_name, data_type FROM duckdb_columns() "
        "WHERE NOT internal").fetchall())


@functools.cache
def template_key() -> str:
    """The name of this release's template of the views (``catalog_template``)."""
    from gpuledger.pipeline.tables import TABLE_SCHEMAS, UNSCHEMATISED_TABLES

    return catalog_template.template_key(
        list(sql_files()), repr(sorted(TABLE_SCHEMAS.items()))
        + repr(sorted(UNSCHEMATISED_TABLES.items())), CATALOG_STORAGE_VERSION)


def _build_template() -> bytes | None:
    """This release's template: the views database of an empty warehouse (the tables'
    schema files alone) in a temporary folder, built in full (its mark is replaced by
    each build from it); None when it cannot be built (it is then built in full, which
    says why)."""
    from gpuledger.pipeline.tables import TABLE_SCHEMAS

    try:
        with tempfile.TemporaryDirectory(prefix="gpuledger-catalog-template-") as tmp:
            root = Path(tmp)
            for table, schema in TABLE_SCHEMAS.items():
                folder = root / FACTS / table
                folder.mkdir(parents=True)
                (folder / SCHEMA_FILE).write_bytes(parquet_bytes(pl.DataFrame(schema=schema)))
            store, empty = open_store(root), Snapshot({}, {})
            views_in_full(root / "template.duckdb", store, empty,
                          catalog_statements(store, empty))
            return (root / "template.duckdb").read_bytes()
    except (duckdb.Error, OSError) as exc:
        log.debug("catalog template not built (%s)", exc)
        return None


def _catalog_stamp(store: Store) -> tuple[str, str] | None:
    """The published catalog's stamp (:data:`CATALOG_STAMP`): what it was built from and
    the SHA-256 of its bytes; None when there is none, or one of an earlier release
    (without the SHA-256)."""
    stamp = store.read(CATALOG_STAMP)
    if stamp is None or len(stamp.split()) != 3:
        return None
    built, _, sha = stamp.decode(errors="replace").rpartition(" ")
    return built, sha


def published_catalog(store: Store) -> bytes | None:
    """The published ``catalog.duckdb``, when its bytes are the ones its stamp names;
    None otherwise (none, one being replaced, one read torn, a stamp of an earlier
    release)."""
    stamp = _catalog_stamp(store)
    data = store.read(CATALOG) if stamp is not None else None
    if stamp is None or data is None or stamp[1] != hashlib.sha256(data).hexdigest():
        return None
    return data


def views_mark(con: duckdb.DuckDBPyConnection) -> str | None:
    """The digest a views database was built from; None when it has no mark (a catalog
    from before the mark, or not a catalog). The mark must be a stored table: a reader
    looks at it before its connection is locked down, so nothing it reads may run a
    query of the file's choosing (a view in its place)."""
    try:
        tables = con.execute(
            "SELECT count(*) FROM duckdb_tables() WHERE schema_name = ? AND table_name = ?",
            CATALOG_MARK.split(".")).fetchone()
        if not tables or tables[0] != 1:
            return None
        row = con.execute(f"SELECT statements_sha256 FROM {CATALOG_MARK}").fetchone()
    except duckdb.Error:
        return None
    return str(row[0]) if row else None


def _fill(text: str, files: Any, mark: str = "{files:") -> str:
    parts = text.split(mark)
    out = [parts[0]]
    for part in parts[1:]:
        name, _, rest = part.partition("}")
        out.append(files(name) + rest)
    return "".join(out)


def open_snapshot(location: str | Path) -> tuple[Store, Snapshot]:
    """A reader's view of a warehouse: its store and the newest published generation. A
    local path that is a file is a :class:`StoreError` (as ``compact`` and ``diagnose``
    say it; the readers said "nothing published yet")."""
    where = check_location(location)
    if isinstance(where, Path) and where.expanduser().is_file():
        raise StoreError(f"{where}: a file, not a warehouse folder")
    store = open_store(where, create=False)
    store.check()
    snapshot = read_snapshot(store)
    if not snapshot.generations:
        check_unnamed_facts(store)
    return store, snapshot


def check_unnamed_facts(store: Store) -> None:
    """For a warehouse with no generation published: a :class:`StoreError` when
    ``facts/`` still holds data objects (anything but the tables' schema files), which
    no manifest names: its manifests were deleted (readers answered 0 rows and "no data
    in this window", exit 0). A listing of ``manifests/`` and one of ``facts/``, in that
    rare case only. None when a unit's ``started`` object is there: a writer's first
    commit is under way (or was cut off), and nothing is published yet."""
    if any(e.path.endswith(f"/{STARTED}") for e in store.list(MANIFESTS)):
        return
    for entry in store.list(FACTS):
        if entry.path.rsplit("/", 1)[-1] != SCHEMA_FILE:
            raise StoreError(
                f"{store.url}: the facts are there but no manifest names them "
                f"({store.url_of(MANIFESTS)}/ deleted?): restore {MANIFESTS}/ from a "
                "backup, or ingest the whole history again into a new warehouse")


_FACT_OBJECT = re.compile(
    r"facts/[A-Za-z0-9_]+/(?:date=[0-9-]+/)?[^/'\"\s]+?\.[0-9a-f]{16}\.parquet")
"""A published fact object's name (relative to the warehouse), in a reader's error."""
_NOT_PARQUET = ("magic bytes", "par1", "out of specification", "not a parquet",
                "corrupt", "footer", "invalid parquet", "damaged: it holds")
"""Words of DuckDB's, Polars' and PyArrow's errors (lower case) for bytes that are not
a Parquet file (and :func:`attach_store`'s own for an object of another size)."""
REPAIR = ("restore it, or ingest (or import) the whole history again in one run, which "
          "writes it anew")
"""What repairs a missing object, or a damaged one of a table each hour replaces whole:
ingesting its hour alone is refused as older than the history's end (it said "ingest
(or import) its hour again"); a run of the whole history puts every object again, and
writes anew one missing or of another size (``generations._named_next``)."""
REPAIR_MERGED = ("restore it, or ingest (or import) the whole history again into a new "
                 "warehouse (a run into this one reads the object to merge rows into it, "
                 "and stops on it)")
"""What repairs a damaged object of a merged table (``processor.MERGED_TABLES``): a run
of the history into the same warehouse reads the rows there first, and stops on them."""


def unreadable_object(store: Store, text: str, sizes: Mapping[str, int]) -> str | None:
    """A reader's error ``text`` (DuckDB's, Polars', PyArrow's) as one line saying what to
    do, when it names a fact object of this warehouse that is missing or is not a Parquet
    file: that the published generation names it, what is wrong, and how to repair it
    (:data:`REPAIR`, or :data:`REPAIR_MERGED` for a damaged object of a merged table).
    ``sizes``: the sizes the manifests record. None when ``text``
    names no fact object, or one that is there whole (a schema mismatch is no damage).
    One stat (a HEAD on S3) of that object; query, report and diagnose say it alike."""
    match = _FACT_OBJECT.search(text)
    if match is None:
        return None
    obj = match.group(0)
    url = store.url_of(obj)
    try:
        size = store.size(obj)
    except StoreError:
        return None
    expected = sizes.get(obj)
    if size is None:
        return (f"{url}: missing: the published generation names this object, but the "
                f"store has none; {REPAIR}")
    if expected is not None and size != expected:
        return f"{url}: {size_damage(size, expected)}; {_repair(obj)}"
    if any(word in text.lower() for word in _NOT_PARQUET):
        return (f"{url}: damaged: the published generation names this object, but it is "
                f"not a readable Parquet file; {_repair(obj)}")
    return None


def published_urls(location: str | Path, table: str) -> list[str]:
    """The URLs of ``table``'s files in the newest published generation: what Polars,
    Spark or Trino should read (a glob may also match objects a commit has just
    replaced, kept ``warehouse.retain_s`` for readers that are still on them)."""
    store, snapshot = open_snapshot(location)
    return [store.url_of(p) for p in snapshot.table(table)]


def published_files(location: str | Path) -> dict[str, str]:
    """Every published logical name → its object (relative to the warehouse)."""
    return published_in(read_manifests(open_store(location, create=False)))


def published_in(manifests: Mapping[str, Manifest]) -> dict[str, str]:
    """Every logical name the newest manifests (``read_manifests``) publish → its object."""
    out: dict[str, str] = {}
    for manifest in manifests.values():
        out.update(manifest.files)
    return out


def read_table(location: str | Path, table: str) -> pl.DataFrame:
    """All rows of ``table`` as published, read through the warehouse's filesystem layer
    (with the table's columns when it has no rows yet)."""
    store, snapshot = open_snapshot(location)
    paths = [f"{FACTS}/{table}/{SCHEMA_FILE}", *snapshot.table(table)]
    frames = [pl.read_parquet(io.BytesIO(data)) for data in map(store.read, paths)
              if data is not None]
    return pl.concat(frames, how="diagonal_relaxed") if frames else pl.DataFrame()
