"""Generations: what a reader sees of the warehouse is what a manifest names.

Fact files are **immutable objects** named after their content: the *logical* name of a
part (``facts/gpu_minute/date=D/gpu_minute-DTHH-p003.parquet``, deterministic, as
before) plus a digest of its bytes (``….<digest>.parquet``). Writing the same facts
again gives the same object (re-runs are idempotent and upload nothing, unless the
object is missing or not of its recorded size: then it is written again); new content
for a part (a partial hour completed, late rows merged, a snapshot refreshed, a day
compacted) is a new object beside the old one.

A **manifest** maps each logical name of a *unit* to its current object. A unit is the
set of files one writer owns: a telemetry partition's files (suffix ``pNNN``; the
partition's holder writes them, whichever instance that is) or, without partitioning,
the whole warehouse (``warehouse``). A writer's *commit* uploads the step's objects,
then writes the unit's next manifest, a new object named after its generation
(``manifests/<unit>/<generation>.json``), in one request: that write is the moment the
step's facts become visible. An object whose upload was cut off is named by no
manifest, so no reader ever opens it; a manifest cut off mid-write (a store that keeps
part of a dropped upload) does not parse and readers take the one before. Old
manifests go once no reader can still be on them.

A **reader** takes the newest manifest of every unit and reads exactly the files they
name (:func:`read_snapshot`): every table of a unit is from the same commit (the
attempts that ended and the snapshot of those still running come from one flush).
Objects a commit replaces are *retired* and deleted ``retain_s`` later, so that a
reader that took the previous generation can finish its query. A commit lists the
objects it retires, with the time, in a *retired log* of its own
(``manifests/<unit>/retired/<generation>.json``, written just before the manifest), not
in the manifest: a manifest holds what is current only, so its size does not grow with
the run (a long import replaces thousands of hourly files by compacted days; listing
them in every manifest until ``retain_s`` had passed made the bytes written grow with
the square of the run). A log goes once the objects it lists are deleted. A writer that
starts reads its units' logs and goes on deleting; an object named again is kept.
(Manifests of earlier versions listed retired objects under ``retired``; they are read
and moved into the next log.)
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from gpuledger.pipeline.store import Entry, Store, StoreConflict, StoreError, safe_path

T = TypeVar("T")
log = logging.getLogger("gpuledger.warehouse")
UNIT_NAME = re.compile(r"(warehouse|diagnosis|p[0-9]{3,5})")
"""What a unit is called: ``warehouse``, a telemetry partition's ``pNNN``, or
``diagnosis`` (``gpuledger diagnose``'s ``job_diagnosis``, advisor/diagnosis_batch.py)."""
_DIGITS = re.compile(r"[0-9]+")
"""A generation in a file name (ASCII digits: ``str.isdigit`` takes ``²³`` too)."""
OBJECT_NAME = re.compile(r"\.[0-9a-f]{16}\.parquet$")
"""The end of a fact object's name: its content's digest (:func:`object_name`)."""

MANIFESTS = "manifests"
VERSION = 1
WHOLE = "warehouse"
"""The unit of a writer without partitions (``gpuledger ingest``, the demo)."""
DIGEST_CHARS = 16
IN_FLIGHT_BYTES = 256 << 20
"""Uploads waiting beyond this many bytes make the writer wait (memory stays bounded)."""


def unit_of(suffix: str) -> str:
    """The unit that owns files with this suffix ("" or ``pNNN``)."""
    return suffix or WHOLE


def object_name(logical: str, data: bytes) -> str:
    """The immutable object for ``logical`` holding ``data``."""
    return _named(logical, hashlib.blake2b(data, digest_size=DIGEST_CHARS // 2))


def object_name_of_file(logical: str, local: Path) -> str:
    """``object_name`` of the bytes of the local file ``local``, read in chunks."""
    digest = hashlib.blake2b(digest_size=DIGEST_CHARS // 2)
    with open(local, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return _named(logical, digest)


def _named(logical: str, hashed: Any) -> str:
    digest = hashed.hexdigest()
    stem, dot, ext = logical.rpartition(".")
    return f"{stem}.{digest}.{ext}" if dot else f"{logical}.{digest}"


def table_of(path: str) -> str:
    """``facts/<table>/…`` → ``<table>``."""
    parts = path.split("/")
    return parts[1] if len(parts) > 2 and parts[0] == "facts" else ""


def _fact(name: Any) -> str:
    """``name`` when it is a fact object's (or logical) name: a string under ``facts/``
    that stays inside the warehouse. A manifest or retired log naming anything else is
    not one of ours, and nothing it names is read or deleted."""
    if not isinstance(name, str) or not name.startswith("facts/"):
        raise ValueError(f"{name!r} is not a fact file's name")
    try:
        return safe_path(name)
    except StoreError:
        raise ValueError(f"{name!r} is not a fact file's name") from None


def _retired_object(name: Any) -> str:
    """``name`` when it can be a retired object: a fact object of ours (its name ends in
    its digest), never a table's ``_schema.parquet`` or someone else's file."""
    if not isinstance(name, str) or not OBJECT_NAME.search(name):
        raise ValueError(f"{name!r} is not a fact object's name")
    return _fact(name)


def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{value!r} is not a number")
    return float(value)


def _whole(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{value!r} is not a whole number")
    return value


def _parsed(data: bytes, where: str, what: str, build: Callable[[dict[str, Any]], T]) -> T:
    """``build`` of the JSON object ``data`` of this ``VERSION``; a ValueError naming
    ``where`` and ``what`` it is not, otherwise."""
    try:
        blob = json.loads(data)
        if blob.get("version") != VERSION:
            raise ValueError(f"version {blob.get('version')} is not {VERSION}")
        return build(blob)
    except RecursionError:
        raise ValueError(f"{where}: not a gpuledger {what} (nested too deeply)") from None
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"{where}: not a gpuledger {what} ({exc})") from None


@dataclass
class Manifest:
    """One unit's published files."""

    unit: str
    generation: int = 0
    files: dict[str, str] = field(default_factory=dict)
    """Logical name → object."""
    retired: dict[str, float] = field(default_factory=dict)
    """Object → when a commit stopped naming it (Unix seconds): read from manifests of
    earlier versions only; retired objects are listed in retired logs now."""
    written_at: float = 0.0
    sizes: dict[str, int] = field(default_factory=dict)
    """Object → its size in bytes (readers open it without asking the store)."""

    def to_bytes(self) -> bytes:
        return json.dumps({"version": VERSION, "unit": self.unit,
                           "generation": self.generation, "written_at": self.written_at,
                           "files": dict(sorted(self.files.items())),
                           "retired": dict(sorted(self.retired.items())),
                           "sizes": {o: self.sizes[o] for o in sorted(self.files.values())
                                     if o in self.sizes}},
                          indent=0).encode()

    @classmethod
    def from_bytes(cls, data: bytes, where: str) -> Manifest:
        return _parsed(data, where, "manifest", lambda blob: cls(
            str(blob["unit"]), _whole(blob["generation"]),
            {_fact(k): _fact(v) for k, v in blob["files"].items()},
            {_retired_object(k): _number(v) for k, v in blob["retired"].items()},
            _number(blob.get("written_at", 0.0)),
            {_fact(k): _whole(v) for k, v in blob.get("sizes", {}).items()}))

    def tables(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for obj in self.files.values():
            out.setdefault(table_of(obj), []).append(obj)
        return out


def manifest_path(unit: str, generation: int) -> str:
    return f"{MANIFESTS}/{unit}/{generation:012d}.json"


RETIRED = "retired"
STARTED = "started"
"""``manifests/<unit>/started``: an empty object a writer puts before its first upload
to a unit that has no manifest yet, and deletes once the unit's first manifest is
written. Between that upload and that manifest the facts are there and nothing names
them, as when the manifests were deleted; this object tells the two apart
(``warehouse.check_unnamed_facts``): readers took a first ingest's first seconds for
deleted manifests and stopped ("restore manifests/ from a backup"). A writer cut off
before its first commit leaves it: nothing is published, and readers say so."""


def started_path(unit: str) -> str:
    return f"{MANIFESTS}/{unit}/{STARTED}"


def retired_path(unit: str, generation: int) -> str:
    """The retired log a unit's commit of ``generation`` writes."""
    return f"{MANIFESTS}/{unit}/{RETIRED}/{generation:012d}.json"


@dataclass
class RetiredLog:
    """The objects one commit of a unit retired: object → when (Unix seconds)."""

    unit: str
    generation: int
    objects: dict[str, float]

    @property
    def path(self) -> str:
        return retired_path(self.unit, self.generation)

    def to_bytes(self) -> bytes:
        return json.dumps({"version": VERSION, "unit": self.unit,
                           "generation": self.generation,
                           "retired": dict(sorted(self.objects.items()))}, indent=0).encode()

    @classmethod
    def from_bytes(cls, data: bytes, where: str) -> RetiredLog:
        return _parsed(data, where, "retired log", lambda blob: cls(
            str(blob["unit"]), _whole(blob["generation"]),
            {_retired_object(k): _number(v) for k, v in blob["retired"].items()}))


def read_retired(store: Store, unit: str | None = None,
                 listed: list[Entry] | None = None) -> list[RetiredLog]:
    """The retired logs in the store (of ``unit``, or of every unit), oldest first; one
    that does not parse (cut off mid-write) is passed over. ``listed``: the listing of
    the unit's retired folder, when the caller has it."""
    logs: list[RetiredLog] = []
    if listed is None:
        listed = store.list(MANIFESTS if unit is None else f"{MANIFESTS}/{unit}/{RETIRED}")
    for e in listed:
        parts = e.path.split("/")
        if len(parts) != 4 or parts[2] != RETIRED or not parts[3].endswith(".json") \
                or not _DIGITS.fullmatch(parts[3][:-5]) or not UNIT_NAME.fullmatch(parts[1]):
            continue
        data = store.read(e.path)
        if data is None:
            continue
        try:
            found = RetiredLog.from_bytes(data, store.url_of(e.path))
            if found.unit != parts[1]:
                raise ValueError(f"{store.url_of(e.path)}: a log of unit {found.unit!r} in "
                                 f"the folder of unit {parts[1]!r}")
        except ValueError as exc:
            log.warning("%s; passed over (what it lists is not deleted)", exc)
            continue
        logs.append(found)
    return sorted(logs, key=lambda r: (r.unit, r.generation))


def retired_objects(store: Store, manifests: Iterable[Manifest] | None = None) -> set[str]:
    """Every object a retired log (or an older manifest's ``retired``; ``manifests``:
    the newest of each unit, when the caller has them) still lists: a reader may be on a
    generation that names it until it is deleted."""
    out = {o for entry in read_retired(store) for o in entry.objects}
    for manifest in read_manifests(store).values() if manifests is None else manifests:
        out.update(manifest.retired)
    return out


def _listed(store: Store) -> dict[str, list[tuple[int, float]]]:
    """unit → its manifests' (generation, written at), newest first (one listing)."""
    out: dict[str, list[tuple[int, float]]] = {}
    for e in store.list(MANIFESTS):
        parts = e.path.split("/")
        if len(parts) == 3 and parts[2].endswith(".json") and _DIGITS.fullmatch(parts[2][:-5]) \
                and UNIT_NAME.fullmatch(parts[1]):
            out.setdefault(parts[1], []).append((int(parts[2][:-5]), e.mtime))
    return {u: sorted(g, reverse=True) for u, g in out.items()}


def published_units(store: Store) -> set[str]:
    """The units with a manifest in ``store``."""
    return set(_listed(store))


def _newest(store: Store, unit: str, generations: list[tuple[int, float]],
            again: bool = True) -> Manifest | None:
    """The newest whole manifest of ``unit``: one cut off mid-write (a store that lets
    a dropped upload leave part of an object) is passed over for the one before, with a
    warning. None when the unit has no manifest; a :class:`StoreError` when it has some
    and none can be read: the unit is damaged, never taken for one with nothing
    published (readers answered 0 rows, and a writer started again at generation 0)."""
    passed: list[str] = []
    gone = False
    for generation, _t in generations:
        where = store.url_of(manifest_path(unit, generation))
        data = store.read(manifest_path(unit, generation))
        if data is None:
            gone = True
            continue
        if gone and again:
            # a newer one listed and not there: a writer prunes a manifest only once two
            # newer ones are written, so this one is old; the newest are in a new listing
            # (an S3 reader once went back three generations, cause not found)
            return _newest(store, unit, _listed(store).get(unit, []), again=False)
        try:
            found = Manifest.from_bytes(data, where)
            if found.unit != unit:
                raise ValueError(f"{where}: a manifest of unit {found.unit!r} in the folder "
                                 f"of unit {unit!r}")
        except ValueError as exc:
            passed.append(str(exc))
            continue
        for why in passed:
            log.warning("%s; passed over for the generation before it", why)
        return found
    if not generations:
        return None
    if not passed and again:  # every one deleted since the listing (a writer pruned)
        return _newest(store, unit, _listed(store).get(unit, []), again=False)
    folder = store.url_of(f"{MANIFESTS}/{unit}")
    newest = passed[0] if passed else \
        f"{store.url_of(manifest_path(unit, generations[0][0]))}: gone while being read"
    raise StoreError(
        f"unit {unit!r}: none of its {len(generations)} manifest(s) can be read (the "
        f"newest: {newest}); restore {folder}/ from a backup: without them nothing of the "
        "unit can be read or written (the facts they name are under facts/)")


def read_manifests(store: Store) -> dict[str, Manifest]:
    """The newest manifest of every unit (one listing, then the manifests in parallel)."""
    listed = _listed(store)
    units = sorted(listed)
    if len(units) <= 1 or not store.remote:
        found = [_newest(store, u, listed[u]) for u in units]
    else:
        with ThreadPoolExecutor(min(16, len(units))) as pool:
            found = list(pool.map(lambda u: _newest(store, u, listed[u]), units))
    return {m.unit: m for m in found if m is not None}


@dataclass(frozen=True)
class Snapshot:
    """What a reader reads: the files of every table, from each unit's newest manifest."""

    files: dict[str, list[str]]
    generations: dict[str, int]
    sizes: dict[str, int] = field(default_factory=dict)

    def table(self, table: str) -> list[str]:
        return self.files.get(table, [])


def read_snapshot(store: Store) -> Snapshot:
    files: dict[str, set[str]] = {}
    generations: dict[str, int] = {}
    sizes: dict[str, int] = {}
    for unit, manifest in read_manifests(store).items():
        generations[unit] = manifest.generation
        sizes.update(manifest.sizes)
        for table, objs in manifest.tables().items():
            files.setdefault(table, set()).update(objs)
    return Snapshot({t: sorted(v) for t, v in files.items()}, generations, sizes)


class WriterConflict(StoreError):
    """Another writer published a unit's next generation first: this commit published
    nothing of that unit (nor of the units after it)."""

    def __init__(self, url: str, unit: str, generation: int) -> None:
        super().__init__(
            f"{url}: generation {generation} of unit {unit!r} was published by another "
            "writer meanwhile: two processes write this unit (two ingest or import runs "
            "into one warehouse, or compact --force beside one); this one stops, its last "
            "step unpublished")
        self.unit = unit
        self.generation = generation


class Publisher:
    """A writer's side: uploads objects, then commits its units' manifests in order.

    Uploads run on a pool of threads while the caller goes on; :meth:`commit` hands the
    step's manifests to one committer thread, which writes each after the uploads it
    names are done. :meth:`sync` waits for everything (before a checkpoint, at the end
    of a run) and raises the first failure."""

    def __init__(self, store: Store, retain_s: float, clock: Callable[[], float] = time.time,
                 uploaders: int = 8) -> None:
        self.store = store
        self.retain_s = retain_s
        self.clock = clock
        self.manifests: dict[str, Manifest] = {}
        """Each unit as its next commit will publish it (ahead of the store until then)."""
        self.changed: set[str] = set()
        self._uploads: dict[str, tuple[bytes, Future[None]]] = {}
        self._intact_objects: set[str] = set()
        """Objects this writer wrote, or found in the store with their manifest's size."""
        self._in_flight = 0
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(uploaders, thread_name_prefix="gpuledger-upload")
        self._committer = ThreadPoolExecutor(1, thread_name_prefix="gpuledger-commit")
        self._commits: list[Future[None]] = []
        self._written: dict[str, list[tuple[int, float]]] = {}
        """unit → its manifests in the store (generation, written at), newest first."""
        self._retiring: dict[str, dict[str, float]] = {}
        """unit → objects retired since its last commit (object → when)."""
        self._logs: dict[str, list[RetiredLog]] = {}
        """unit → its retired logs whose objects are not all deleted yet."""
        self.after_commit: list[Callable[[set[str]], None]] = []
        """Called on the committer thread with the units just published."""
        self.objects_written = 0
        self.bytes_written = 0

    # -- units -----------------------------------------------------------------------

    def unit(self, name: str) -> Manifest:
        """The unit's manifest as this writer holds it (loaded from the store first)."""
        manifest = self.manifests.get(name)
        if manifest is None:
            listed = _listed(self.store).get(name, [])
            if not listed:  # before anything of the unit is uploaded (``STARTED``)
                self.store.write(started_path(name), b"")
            manifest = _newest(self.store, name, listed) or Manifest(name)
            if listed:  # a generation cut off after the newest whole one is skipped
                manifest.generation = max(manifest.generation, listed[0][0])
            logs = self.store.list(f"{MANIFESTS}/{name}/{RETIRED}")
            self._logs[name] = read_retired(self.store, name, logs)
            # a retired log written by a commit cut off before its manifest (whole or
            # not): its generation is taken, so the next commit does not collide with it
            for e in logs:
                stem = e.path.rsplit("/", 1)[-1].removesuffix(".json")
                if _DIGITS.fullmatch(stem):
                    manifest.generation = max(manifest.generation, int(stem))
            # an earlier version's manifest lists its retired objects: into the next log
            self._retiring[name] = dict(manifest.retired)
            manifest.retired = {}
            self.manifests[name] = manifest
            self._written[name] = listed
        return manifest

    def forget(self, name: str) -> None:
        """Stop holding a unit (its partition moved to another instance): the next
        holder loads its newest manifest."""
        self.sync()
        self.manifests.pop(name, None)
        self._retiring.pop(name, None)
        self._logs.pop(name, None)

    def current(self, unit: str, logical: str) -> str | None:
        return self.unit(unit).files.get(logical)

    def read(self, obj: str) -> bytes | None:
        """An object's bytes (from memory while its upload is under way)."""
        with self._lock:
            pending = self._uploads.get(obj)
        return pending[0] if pending is not None else self.store.read(obj)

    # -- writing ---------------------------------------------------------------------

    def put(self, unit: str, logical: str, data: bytes) -> str:
        """Make ``data`` the next content of ``logical``; returns its object's name."""
        return self._named_next(unit, logical, object_name(logical, data), len(data),
                                 lambda obj: self._upload(obj, data))

    def put_file(self, unit: str, logical: str, local: Path) -> str:
        """``put`` of the bytes of the local file ``local`` (a compacted day), never held
        in memory whole: uploaded before this returns, so ``local`` may go after it."""
        size = local.stat().st_size

        def write(obj: str) -> None:
            self.store.write_file(obj, local)
            self.objects_written += 1
            self.bytes_written += size

        return self._named_next(unit, logical, object_name_of_file(logical, local), size, write)

    def _named_next(self, unit: str, logical: str, obj: str, size: int,
                    write: Callable[[str], None]) -> str:
        """``obj`` (``size`` bytes) made the next content of ``logical``, ``write``-ten
        first; nothing when it already is (the same facts again) and the object is
        there whole: one named but missing, or of another size than the manifest
        records (cut short, deleted by hand), is written again, so that processing its
        hour again repairs it."""
        manifest = self.unit(unit)
        if manifest.files.get(logical) == obj \
                and self._intact(obj, manifest.sizes.get(obj, size)):
            return obj
        write(obj)
        with self._lock:
            self._intact_objects.add(obj)
        self._replace(manifest, logical, obj)
        manifest.sizes[obj] = size
        return obj

    def _intact(self, obj: str, size: int) -> bool:
        """Whether the published object ``obj`` is in the store with ``size`` bytes: one
        stat (or HEAD) of that object, once per writer (an object this writer wrote or
        found whole is not asked about again; one being uploaded is taken as whole)."""
        with self._lock:
            if obj in self._intact_objects or obj in self._uploads:
                return True
        found = self.store.size(obj)
        if found != size:
            log.warning("%s: %s; written again", self.store.url_of(obj),
                        "missing" if found is None else
                        f"damaged ({found} bytes where the manifest says {size})")
            return False
        with self._lock:
            self._intact_objects.add(obj)
        return True

    def put_schema(self, path: str, data: bytes) -> None:
        """A fixed-name object every unit's readers need (a table's empty schema file):
        written when missing, never replaced (in the background; commits wait for it)."""
        def ensure() -> None:
            if not self.store.exists(path):
                self.store.write(path, data)

        future = self._pool.submit(ensure)
        with self._lock:
            self._uploads[path] = (b"", future)

    def drop(self, unit: str, logical: str) -> None:
        """Stop publishing ``logical`` (its rows moved into a compacted object)."""
        manifest = self.unit(unit)
        with self._lock:
            old = manifest.files.pop(logical, None)
            if old is not None:
                self._retiring[unit][old] = self.clock()
                self.changed.add(unit)

    def _replace(self, manifest: Manifest, logical: str, obj: str) -> None:
        with self._lock:
            old = manifest.files.get(logical)
            manifest.files[logical] = obj
            retiring = self._retiring[manifest.unit]
            retiring.pop(obj, None)  # named again: not to be deleted
            if old is not None and old != obj:
                retiring[old] = self.clock()
            self.changed.add(manifest.unit)

    def _upload(self, obj: str, data: bytes) -> None:
        with self._lock:
            if obj in self._uploads:
                return
        self._wait_for_room(len(data))

        def upload() -> None:
            self.store.write(obj, data)

        future = self._pool.submit(upload)
        with self._lock:
            self._uploads[obj] = (data, future)
            self._in_flight += len(data)
        self.objects_written += 1
        self.bytes_written += len(data)

    def _wait_for_room(self, size: int) -> None:
        while True:
            with self._lock:
                if self._in_flight + size <= IN_FLIGHT_BYTES or not self._uploads:
                    return
                oldest = next(iter(self._uploads.values()))[1]
            oldest.result()
            self._release_done()

    def _release_done(self) -> None:
        with self._lock:
            for obj, (data, future) in list(self._uploads.items()):
                if future.done() and future.exception() is None:
                    del self._uploads[obj]
                    self._in_flight -= len(data)

    # -- publishing ------------------------------------------------------------------

    def commit(self, wait: bool = False) -> set[str]:
        """Publish every unit changed since the last commit (a new generation each, with
        the retired log of what it replaced), once the objects they name are uploaded;
        ``wait``: until it is done."""
        self._raise_failed()
        units = sorted(self.changed)
        self.changed.clear()
        if units:
            now = self.clock()
            blobs: list[tuple[str, int, bytes, RetiredLog | None]] = []
            for name in units:
                m = self.manifests[name]
                m.generation += 1
                m.written_at = now
                named = set(m.files.values())
                m.sizes = {o: n for o, n in m.sizes.items() if o in named}
                retiring = self._retiring[name]
                entry = RetiredLog(name, m.generation, dict(retiring)) if retiring else None
                retiring.clear()
                if entry is not None:
                    self._logs[name].append(entry)
                blobs.append((name, m.generation, m.to_bytes(), entry))
            done = self._expired(now)
            with self._lock:
                futures = [f for _d, f in self._uploads.values()]
            self._commits.append(self._committer.submit(self._publish, blobs, futures, done))
        if wait:
            self.sync()
        return set(units)

    def _expired(self, now: float) -> list[tuple[RetiredLog, list[str]]]:
        """The retired logs every object of which was last retired ``retain_s`` ago or
        more (taken off the pending ones), each with its objects to delete: an object
        retired again since, by a later log, waits for that retirement."""
        done: list[tuple[RetiredLog, list[str]]] = []
        for name, logs in self._logs.items():
            latest: dict[str, float] = dict(self._retiring.get(name, {}))
            for entry in logs:
                for o, t in entry.objects.items():
                    latest[o] = max(t, latest.get(o, t))
            keep: list[RetiredLog] = []
            claimed: set[str] = set()
            for entry in logs:
                if all(now - latest[o] >= self.retain_s for o in entry.objects):
                    objects = [o for o in entry.objects if o not in claimed]
                    claimed.update(objects)
                    done.append((entry, objects))
                else:
                    keep.append(entry)
            self._logs[name] = keep
        return done

    def _publish(self, blobs: list[tuple[str, int, bytes, RetiredLog | None]],
                 uploads: list[Future[None]], done: list[tuple[RetiredLog, list[str]]]
                 ) -> None:
        for f in uploads:
            f.result()  # an upload that failed fails the commit: nothing is published
        at_once = {log.path for log, _objects in done}  # retain_s 0: no log needed
        for name, generation, data, retired in blobs:
            try:  # only if absent: two writers of one unit must not overwrite each other
                if retired is not None and retired.path not in at_once:
                    # before the manifest: no retirement goes unlisted
                    self.store.create(retired.path, retired.to_bytes())
                self.store.create(manifest_path(name, generation), data)
            except StoreConflict:
                raise WriterConflict(self.store.url, name, generation) from None
            if not self._written.get(name):  # its first manifest: ``STARTED`` goes
                self.store.delete(started_path(name))
        self._release_done()
        now = self.clock()
        self._delete_retired(done, {r.path for _n, _g, _d, r in blobs if r is not None})
        for name, generation, _data, _log in blobs:
            self._prune(name, generation, now)
        for call in self.after_commit:
            call({name for name, _g, _d, _e in blobs})

    def _delete_retired(self, done: list[tuple[RetiredLog, list[str]]],
                        not_written: set[str]) -> int:
        """Delete the objects of ``done`` (retired logs past their grace period) that no
        unit held names again, then the logs (but those in ``not_written``); how many
        objects were deleted."""
        deleted = 0
        for entry, objects in done:
            for obj in objects:
                with self._lock:  # named again since, or being uploaded again: keep it
                    keep = obj in self._uploads or any(
                        obj in m.files.values() for m in self.manifests.values())
                if not keep:
                    self.store.delete(obj)
                    self._intact_objects.discard(obj)
                    deleted += 1
            if entry.path not in not_written:
                self.store.delete(entry.path)
        return deleted

    def pending_retired(self) -> set[str]:
        """The objects retired by the units held and not deleted yet."""
        return {o for logs in self._logs.values() for entry in logs for o in entry.objects} \
            | {o for retiring in self._retiring.values() for o in retiring}

    def expire_retired(self, units: list[str]) -> int:
        """Delete now what ``units`` retired ``retain_s`` ago or more, and the logs that
        listed it (``gpuledger compact``: a warehouse no writer commits to any more keeps
        its retired objects otherwise); how many objects were deleted."""
        for name in units:
            self.unit(name)
        self.sync()
        return self._delete_retired(self._expired(self.clock()), set())

    def _prune(self, unit: str, generation: int, now: float) -> None:
        """Delete the unit's manifests a reader can no longer be on: older than the one
        before the newest, and replaced more than ``retain_s`` ago."""
        written = [(generation, now), *self._written.get(unit, [])]
        keep, old = written[:2], written[2:]
        for i, (gen, _t) in enumerate(old):
            replaced_at = written[i + 1][1]  # when the next one was written
            if now - replaced_at >= self.retain_s:
                self.store.delete(manifest_path(unit, gen))
            else:
                keep.append((gen, _t))
        self._written[unit] = keep

    def sync(self) -> None:
        """Wait until every commit so far is published; raise the first failure."""
        commits, self._commits = self._commits, []
        for f in commits:
            f.result()
        self._release_done()

    def _raise_failed(self) -> None:
        done = [f for f in self._commits if f.done()]
        self._commits = [f for f in self._commits if not f.done()]
        for f in done:
            f.result()

    def close(self) -> None:
        try:
            self.sync()
        finally:
            self._pool.shutdown(wait=True)
            self._committer.shutdown(wait=True)
