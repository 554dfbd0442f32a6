"""The batch path: ``job_diagnosis`` for a whole warehouse from its ``gpu_minute`` files.

The files are read hour by hour in time order and fed to the same incremental functions
the streaming engine calls (:mod:`.diagnosis`); an attempt is finished as soon as the
hour of its end (``job_attempts``) has been read, so memory stays bounded by the attempts
running at once. Attempts still running at the end are finished with what there is.
A compacted day (``gpu_minute-YYYY-MM-DD[-pNNN].parquet``, docs/warehouse.md) is read an
hour at a time too (its rows of that hour), so a day gives the same diagnosis compacted
or in hourly files.

Output: ``facts/job_diagnosis/date=…/job_diagnosis-…THH-diagnosis.parquet`` by the hour of
each attempt's last diagnosed minute (the table's previous files are replaced, so a
re-run writes the same files), and the catalog is rebuilt so ``job_diagnosis`` is a view.

**A folder or a bucket.** The warehouse is read and written through its store
(``store.py``): a folder's files by their paths, a bucket's objects through the same
filesystem layer as every other command (``s3://bucket/prefix`` with the AWS variables).
A compacted day in a bucket (one a partition) is fetched once for its 24 hours, not once
an hour.

**A unit of its own.** The files are published in the generations of unit ``diagnosis``
(:data:`UNIT`), never in the unit of the writer of the facts (``warehouse`` for ingest,
import and the demo, ``pNNN`` for a processor's partitions): a unit has one writer at a
time, and a diagnosis published into the writer's unit made the writer's next commit
collide and stop (``generations.Publisher``). Readers combine the newest manifest of every
unit, so they see one set of ``job_diagnosis`` rows: this unit's. A warehouse diagnosed
by an earlier version holds ``job_diagnosis`` in unit ``warehouse``: those files are taken
out of that unit first, which is refused while that unit was published in the last
:data:`BUSY_S` seconds (its writer may be at work) unless ``force``.
"""

from __future__ import annotations

import io
import logging
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import NamedTuple

import duckdb
import polars as pl

from gpuledger.pipeline import query
from gpuledger.pipeline.advisor.diagnosis import (
    ATTEMPT,
    DEFAULT_CONFIG,
    JOB_DIAGNOSIS,
    DiagnosisConfig,
    DiagnosisState,
    finish,
    update,
)
from gpuledger.pipeline.advisor.history import HistoryError, unreadable_folder
from gpuledger.pipeline.advisor.patterns import CATALOGUE, PATTERNS, UNKNOWN
from gpuledger.pipeline.columns import TIME_DTYPE
from gpuledger.pipeline.generations import WHOLE, Manifest, read_manifests
from gpuledger.pipeline.location import check_location
from gpuledger.pipeline.store import Store, StoreError, open_store
from gpuledger.pipeline.warehouse import (
    FACTS,
    Warehouse,
    check_unnamed_facts,
    published_in,
    unreadable_object,
)

TABLE = "job_diagnosis"
UNIT = "diagnosis"
"""The unit ``job_diagnosis`` is published in (module docstring)."""
BUSY_S = 60.0
"""A unit published less than this long ago is taken to have a writer at work (as
``gpuledger compact`` takes it)."""
SORT = ["job_id", "attempt", "pattern"]
UNSEEN_MIN_GPU_MINUTES = 0.01  # below: rounding, not minutes left out
COLUMNS = ["minute", "node", "gpu_index", "state", "alloc_fraction", "occupied_share",
           "jobs_on_gpu", "job_id",
           "attempt", "team", "queue", "job_type", "card_type", "activity", "telemetry_samples",
           "sm_active", "dram_active", "pcie_rx_bytes_s", "pcie_tx_bytes_s",
           "nvlink_rx_bytes_s", "nvlink_tx_bytes_s", "processes", "idle_threshold",
           "efficient_threshold"]
HOUR_ORDER = ["node", "gpu_index", "minute", "job_id", "attempt"]
"""An hour's rows are fed in this order, whether they come from hourly files (sorted by
GPU, then minute) or a compacted day (sorted by job, then minute)."""


@dataclass
class Diagnosed:
    """The rows written (or that would be) and how many files."""

    rows: pl.DataFrame
    files: int


def _published(files: dict[str, str], table: str) -> list[tuple[str, str]]:
    """(logical name, object) of ``table``'s files among ``files`` (``published_in``:
    the newest generation, read once)."""
    return [(logical, obj) for logical, obj in sorted(files.items())
            if logical.startswith(f"{FACTS}/{table}/")]


class _Reader:
    """Opens the warehouse's objects for Polars: a folder's file by its path, a bucket's
    object fetched whole. Compacted days (read an hour at a time; one a partition) are
    kept while their hours are read, so each is fetched once, not 24 times."""

    def __init__(self, store: Store, sizes: dict[str, int] | None = None) -> None:
        self.store = store
        self.sizes = sizes or {}
        """Object → its size, as the manifests record it."""
        self._days: dict[str, bytes] = {}

    def name(self, obj: str) -> str:
        """The object as a message names it."""
        return self.store.url_of(obj)

    def keep_only(self, objects: set[str]) -> None:
        """Forget the compacted days not among ``objects`` (their hours are read)."""
        for obj in set(self._days) - objects:
            del self._days[obj]

    def source(self, obj: str, whole: bool = True) -> str | io.BytesIO:
        """What Polars reads ``obj`` from (``whole``: read once, not kept)."""
        if not self.store.remote:
            return self.store.full(obj)
        data = self._days.get(obj)
        if data is None:
            data = self.store.read(obj)
            if data is None:
                raise HistoryError(unreadable_object(self.store, obj, self.sizes)
                                   or f"{self.name(obj)}: published, but not in the store "
                                   "(deleted by hand?)")
            if not whole:
                self._days[obj] = data
        return io.BytesIO(data)


class _Once(logging.Filter):
    """Lets each distinct message through once (the manifests are read by every reader
    of one run: a manifest passed over is said once, not once per reader)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if message in self.seen:
            return False
        self.seen.add(message)
        return True


@contextmanager
def warn_once() -> Iterator[None]:
    """Within the block, each warning of the warehouse's readers is said once (a caller
    that opens the warehouse before :func:`diagnose_warehouse` wraps both)."""
    logger = logging.getLogger("gpuledger.warehouse")
    once = _Once()
    logger.addFilter(once)
    try:
        yield
    finally:
        logger.removeFilter(once)


def _read_failed(reader: _Reader, obj: str, exc: BaseException) -> HistoryError:
    """A fact object that cannot be read, in one line naming it: missing or damaged, what
    to do about it (as query and report say it, ``warehouse.unreadable_object``)."""
    path = reader.name(obj)
    if isinstance(exc, PermissionError):
        return HistoryError(f"{path}: permission denied")
    damaged = unreadable_object(reader.store, f"{obj}: {exc}", reader.sizes)
    if damaged is not None:
        return HistoryError(damaged)
    if isinstance(exc, OSError):
        return HistoryError(f"{path}: cannot be read ({exc.strerror or exc})")
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return HistoryError(f"{path}: not a readable Parquet file ({first})")


_STAMP = re.compile(r"^(\d{4}-\d{2}-\d{2})(?:T(\d{2}))?(?:-[^.]+)?(?:\.[0-9a-f]{16})?\.parquet$")
"""What follows ``gpu_minute-`` in a part's name: its day, its hour when it is an hourly
part (none: a compacted day), a partition's suffix (``-p003``), an object's digest."""


def _span(name: str) -> tuple[datetime, int]:
    """(first hour, hours) a ``gpu_minute`` part covers, from its file name: an hourly
    part its hour, a compacted day its 24 hours."""
    match = _STAMP.match(name.rsplit("/", 1)[-1].removeprefix("gpu_minute-"))
    if match is None:
        raise HistoryError(f"{name}: not a gpu_minute part's name (gpu_minute-YYYY-MM-DDTHH"
                           "… or gpu_minute-YYYY-MM-DD…)")
    day = datetime.strptime(match.group(1), "%Y-%m-%d").replace(tzinfo=UTC)
    if match.group(2) is None:
        return day, 24
    return day + timedelta(hours=int(match.group(2))), 1


@dataclass(frozen=True)
class _Part:
    """A file to read for an hour: whole (an hourly part) or only that hour's rows (a
    compacted day)."""

    obj: str
    whole: bool


def _hours(files: dict[str, str]) -> list[tuple[datetime, list[_Part]]]:
    """gpu_minute files by the hour they cover (a compacted day: each of its 24 hours),
    in time order."""
    groups: dict[datetime, list[_Part]] = {}
    for logical, f in _published(files, "gpu_minute"):
        first, hours = _span(logical)
        for h in range(hours):
            groups.setdefault(first + timedelta(hours=h), []).append(_Part(f, hours == 1))
    return sorted(groups.items())


def _read_hour(reader: _Reader, hour: datetime, parts: list[_Part]) -> pl.DataFrame:
    """The GPU-minute rows of ``hour`` in ``parts``, in one order whatever the layout."""
    lo, hi = (pl.lit(t).cast(TIME_DTYPE) for t in (hour, hour + timedelta(hours=1)))
    reader.keep_only({p.obj for p in parts if not p.whole})
    frames = []
    for p in parts:
        try:
            source = reader.source(p.obj, p.whole)
            frames.append(pl.read_parquet(source, columns=COLUMNS) if p.whole else
                          pl.scan_parquet(source).select(COLUMNS)
                          .filter((pl.col("minute") >= lo) & (pl.col("minute") < hi)).collect())
        except (OSError, pl.exceptions.PolarsError) as exc:
            raise _read_failed(reader, p.obj, exc) from None
    return pl.concat(frames, how="vertical_relaxed").sort(HOUR_ORDER, maintain_order=True)


def _ended(reader: _Reader, files: dict[str, str]) -> pl.DataFrame:
    frames = []
    for _logical, f in _published(files, "job_attempts"):
        try:
            frames.append(pl.read_parquet(reader.source(f),
                                          columns=["job_id", "attempt", "ended_at"]))
        except (OSError, pl.exceptions.PolarsError) as exc:
            raise _read_failed(reader, f, exc) from None
    if not frames:
        return pl.DataFrame(schema={"job_id": pl.String(), "attempt": pl.Int64(),
                                    "ended_at": TIME_DTYPE})
    return pl.concat(frames, how="vertical_relaxed").drop_nulls("ended_at")


def _legacy(manifest: Manifest | None, label: str, force: bool) -> bool:
    """Whether unit ``warehouse`` (its newest ``manifest``) still names ``job_diagnosis``
    files (written there by an earlier version): they must go when this run writes its
    own. Refused (HistoryError) while that unit was published in the last ``BUSY_S``
    seconds, unless ``force``."""
    if manifest is None or not any(k.startswith(f"{FACTS}/{TABLE}/") for k in manifest.files):
        return False
    age = time.time() - manifest.written_at
    if age < BUSY_S and not force:
        raise HistoryError(
            f"{label}: unit 'warehouse' holds job_diagnosis files of an earlier gpuledger and "
            f"was published {max(age, 0):.0f} s ago: its writer (ingest, import, demo) seems "
            f"to be at work, and taking the files out of its unit would stop it; run diagnose "
            f"again once it is done, or --force")
    return True


class OpenedWarehouse(NamedTuple):
    """A warehouse to diagnose, as :func:`open_warehouse` found it."""

    where: str | Path
    """The folder, or the ``s3://`` URL."""
    store: Store
    label: str
    """How a message names it."""
    manifests: dict[str, Manifest]
    """The newest manifest of every unit, read once for the run."""


def open_warehouse(location: str | Path) -> OpenedWarehouse:
    """The warehouse at ``location`` (a folder or ``s3://bucket/prefix``) and what it
    publishes now; a :class:`HistoryError` in one line when it is no warehouse (a file, a
    folder without facts, a bucket with nothing published, one that cannot be
    reached)."""
    try:
        where = check_location(location)
        if isinstance(where, Path):
            if where.is_file():
                raise HistoryError(f"{where}: a file, not a warehouse folder")
            if not where.exists():   # as query, report and whatif say it
                raise HistoryError(f"{where}: no such folder")
            if not (where / FACTS).is_dir():
                raise HistoryError(f"{where}: not a gpuledger warehouse (no facts/ folder)")
        store = open_store(where, create=False)
        store.check()
        manifests = read_manifests(store)
        if not manifests:
            check_unnamed_facts(store)
        if store.remote and not manifests:
            raise HistoryError(f"{store.url}: not a gpuledger warehouse (nothing published "
                               "yet)")
    except StoreError as exc:
        raise HistoryError(str(exc)) from None
    return OpenedWarehouse(where, store, str(where) if isinstance(where, Path) else store.url,
                           manifests)


def diagnose_warehouse(location: str | Path | OpenedWarehouse, *, write: bool = True,
                       cfg: DiagnosisConfig = DEFAULT_CONFIG,
                       progress: Callable[[float], None] = lambda _f: None,
                       force: bool = False) -> Diagnosed:
    """Diagnose every attempt of the warehouse at ``location``, a folder or an ``s3://``
    warehouse, or one :func:`open_warehouse` has just opened (module docstring). Bad input
    (not a warehouse, a fact file that cannot be read, a bucket that cannot be reached)
    is a :class:`HistoryError` naming it, raised before anything is written."""
    with warn_once():
        opened = (location if isinstance(location, OpenedWarehouse)
                  else open_warehouse(location))
        try:
            return _diagnose(opened, write, cfg, progress, force)
        except PermissionError as exc:
            raise HistoryError(f"{exc.filename or opened.label}: permission denied") from None
        except StoreError as exc:
            raise HistoryError(str(exc)) from None


def _diagnose(opened: OpenedWarehouse, write: bool, cfg: DiagnosisConfig,
              progress: Callable[[float], None], force: bool) -> Diagnosed:
    where, store, label, manifests = opened
    if isinstance(where, Path):
        denied = unreadable_folder(where, ("gpu_minute", "job_attempts"))
        if denied is not None:
            raise HistoryError(f"{denied}: permission denied")
    legacy = write and _legacy(manifests.get(WHOLE), label, force)
    published = published_in(manifests)
    hours = _hours(published)
    if not hours:
        if _published(published, "gpu_span"):
            raise HistoryError(f"{label}: no GPU-minute with telemetry to diagnose: its "
                               "GPU-minutes come from scheduler history alone (an import), "
                               "whose use is unknown (docs/metrics.md, 'No telemetry is not "
                               "waste')")
        raise HistoryError(f"{label}: no GPU-minutes to diagnose")
    reader = _Reader(store, {o: n for m in manifests.values() for o, n in m.sizes.items()})
    ended = _ended(reader, published)
    state = DiagnosisState()
    parts: list[pl.DataFrame] = []
    for i, (hour, files) in enumerate(hours):
        frame = _read_hour(reader, hour, files)
        if not frame.is_empty():  # a compacted day's hours without rows: as no hourly file
            state = update(state, frame, cfg)
            limit = pl.lit(hour + timedelta(hours=1)).cast(TIME_DTYPE)
            done = ended.filter(pl.col("ended_at") <= limit).join(state.meta, on=ATTEMPT,
                                                                  how="semi")
            if not done.is_empty():
                state, rows = finish(state, done.select(*ATTEMPT, "ended_at"), cfg)
                parts.append(rows)
        progress((i + 1) / len(hours))
    # still running (ended_at null), or ended after the last GPU-minute read
    rest = state.meta.select(ATTEMPT).join(ended, on=ATTEMPT, how="left")
    state, rows = finish(state, rest, cfg)
    parts.append(rows)
    out = pl.concat(parts, how="vertical_relaxed") if parts else pl.DataFrame(
        schema=JOB_DIAGNOSIS)
    out = with_unseen(out, _attempts(where, label))
    written = _write(where, label, out, legacy) if write else 0
    return Diagnosed(out.sort(SORT), written)


def _write(where: str | Path, label: str, rows: pl.DataFrame, legacy: bool) -> int:
    """Publish ``rows`` as the whole ``job_diagnosis`` in unit :data:`UNIT` (the previous
    run's files replaced in the same generation); ``legacy``: first take the files an
    earlier version wrote into unit ``warehouse`` out of it (readers never see both
    sets: for one generation they see none). Then rebuild the catalog."""
    wh = Warehouse(where, suffix=UNIT)
    try:
        if legacy:
            for old in [k for k in wh.publisher.unit(WHOLE).files
                        if k.startswith(f"{FACTS}/{TABLE}/")]:
                wh.publisher.drop(WHOLE, old)
            wh.publisher.commit(wait=True)
            wh.publisher.forget(WHOLE)
        for old in [k for k in wh.publisher.unit(UNIT).files
                    if k.startswith(f"{FACTS}/{TABLE}/")]:
            wh.publisher.drop(UNIT, old)  # replaced in the same generation
        wh.ensure_schema(TABLE, JOB_DIAGNOSIS)
        for (hour,), part in rows.with_columns(
                (pl.coalesce("ended_at", pl.col("last_minute") + pl.duration(minutes=1))
                 - pl.duration(milliseconds=1)).dt.truncate("1h").alias("_h")
        ).group_by("_h", maintain_order=True):
            wh.write_part(TABLE, hour, part.drop("_h"), SORT)
        wh.publisher.commit(wait=True)
        # the catalog is rebuilt here (publish_catalog rebuilds it for the writer of the
        # facts' units only, and this writer must not take those units up); one that
        # cannot be built now is a warning: the rows are published, and readers build
        # their views from the manifests
        wh.rebuild_catalog()
    except StoreError as exc:
        raise HistoryError(f"{label}: job_diagnosis not written: {exc}") from None
    finally:
        wh.close()
    return wh.files_written


def _attempts(where: str | Path, label: str) -> pl.DataFrame:
    """Per attempt that ran: its attributes and idle + inefficient GPU-hours (``attempts``)."""
    try:
        con = query.connect(where)
    except query.QueryError as exc:
        raise HistoryError(str(exc)) from None
    try:
        frame: pl.DataFrame = con.sql("""
            SELECT job_id, attempt, team, queue, job_type, card_type, gpus, started_at,
                   ended_at, coalesce(idle_gpu_hours, 0) + coalesce(inefficient_gpu_hours, 0)
                   AS waste_gpu_hours
            FROM attempts WHERE started_at IS NOT NULL""").pl()
    except duckdb.Error as exc:
        damaged = query.unreadable(con, exc)
        if damaged is not None:
            raise HistoryError(damaged) from None
        first = str(exc).strip().splitlines()[0]
        raise HistoryError(f"{label}: the attempts cannot be read ({first})") from None
    finally:
        con.close()
    return frame.with_columns(pl.col(pl.Datetime).cast(TIME_DTYPE))


def _unseen_words(gpu_hours: pl.Expr) -> pl.Expr:
    return (gpu_hours * 60).round(0).cast(pl.Int64).cast(pl.String) + pl.lit(
        " GPU-minutes on a GPU shared with another job (no GPU-minute row names this attempt)")


def with_unseen(rows: pl.DataFrame, attempts: pl.DataFrame) -> pl.DataFrame:
    """Classify as ``unknown`` the idle and inefficient GPU-hours ``attempts`` counts but no
    GPU-minute row names the attempt on (``gpu_minute`` names one job per GPU, so the other
    job of a shared GPU is not named): added to the attempt's ``unknown`` row, or a new one
    spanning the attempt; shares recomputed."""
    seen = rows.group_by(ATTEMPT).agg(pl.col("gpu_hours").sum().alias("_seen"))
    gap = attempts.join(seen, on=ATTEMPT, how="left").with_columns(
        (pl.col("waste_gpu_hours") - pl.col("_seen").fill_null(0.0)).alias("_gap")
    ).filter(pl.col("_gap") * 60 >= UNSEEN_MIN_GPU_MINUTES)
    if gap.is_empty():
        return rows
    unknown = rows.filter(pl.col("pattern") == UNKNOWN)
    add = rows.join(gap.join(unknown, on=ATTEMPT, how="semi").select(*ATTEMPT, "_gap"),
                    on=ATTEMPT, how="left").with_columns(
        pl.when(pl.col("pattern") == UNKNOWN).then(pl.col("_gap")).alias("_gap"))
    topped = add.with_columns(
        (pl.col("gpu_hours") + pl.col("_gap").fill_null(0.0)).alias("gpu_hours"),
        pl.when(pl.col("_gap").is_not_null())
        .then(pl.col("evidence") + pl.lit("; ") + _unseen_words(pl.col("_gap")))
        .otherwise(pl.col("evidence")).alias("evidence")).drop("_gap")
    last = rows["last_minute"].max()
    end = pl.lit(last, TIME_DTYPE) if last is not None else pl.col("started_at")
    first = pl.col("started_at").dt.truncate("1m")
    new = gap.join(unknown, on=ATTEMPT, how="anti").with_columns(
        pl.lit(UNKNOWN).alias("pattern"), pl.col("_gap").alias("gpu_hours"),
        first.alias("first_minute"),
        pl.max_horizontal(first, pl.coalesce(
            (pl.col("ended_at") - pl.duration(milliseconds=1)).dt.truncate("1m"), end))
        .alias("last_minute"),
        _unseen_words(pl.col("_gap")).alias("evidence"),
        pl.lit(CATALOGUE[UNKNOWN].remedy).alias("remedy"),
    ).with_columns(pl.coalesce("ended_at", pl.col("last_minute") + pl.duration(minutes=1))
                   .dt.date().alias("date"))
    new = new.select([pl.col(c) if c in new.columns else pl.lit(None).alias(c)
                      for c in JOB_DIAGNOSIS]).cast(dict(JOB_DIAGNOSIS))  # type: ignore[arg-type]
    return pl.concat([topped, new]).with_columns(
        (pl.col("gpu_hours") / pl.col("gpu_hours").sum().over(ATTEMPT)).alias("share")
    ).sort(*ATTEMPT, "gpu_hours", descending=[False, False, True])


def summary_text(result: Diagnosed, top: int = 10) -> str:
    """GPU-hours per pattern, then the attempts with the most diagnosed GPU-hours."""
    rows = result.rows
    if rows.is_empty():
        return "no idle or inefficient GPU-minutes to diagnose"
    total = float(rows["gpu_hours"].sum())
    by = rows.group_by("pattern").agg(pl.col("gpu_hours").sum(),
                                      pl.struct(ATTEMPT).n_unique().alias("attempts"))
    order = {p: i for i, p in enumerate(PATTERNS)}
    lines = [f"Idle and inefficient GPU-hours by pattern ({total:,.1f} GPU-hours, "
             f"{rows.select(pl.struct(ATTEMPT).n_unique()).item():,} attempts):"]
    for pattern, hours, attempts in sorted(by.iter_rows(), key=lambda r: order[r[0]]):
        lines.append(f"  {pattern:<22} {hours:>10,.1f}  {100 * hours / total:5.1f} %  "
                     f"{attempts:>6,} attempts")
    known = rows.filter(pl.col("pattern") != UNKNOWN).sort("gpu_hours", descending=True)
    if not known.is_empty():
        lines.append(f"Top {min(top, known.height)} (attempt, pattern: evidence → remedy):")
        for r in known.head(top).iter_rows(named=True):
            lines.append(f"  {r['job_id']}/{r['attempt']} {r['pattern']} "
                         f"{r['gpu_hours']:.1f} GPU-h: {r['evidence']} → {r['remedy']}")
    if result.files:
        lines.append(f"wrote {result.files} file(s); query: SELECT * FROM job_diagnosis")
    return "\n".join(lines)
