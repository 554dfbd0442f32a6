"""Processor checkpoints: the engine's state plus the input offsets it covers.

A checkpoint makes a restart exact, and lets a telemetry partition move between
instances (a rebalance) with its state. The engine's state has two kinds of parts:

- the **global** part: the scheduler and inventory books (built from the global topics,
  which every instance reads in full) with the offsets of those topics;
- one **section per telemetry partition** held: the partition's rows of every buffer
  (samples of open minutes, usage accumulators, buffered facts of open hours, late
  samples, rejects), its closed point, which ended attempts it has reported, the
  *history* it still needs from the books (allocations, attempts and inventory of its
  nodes since its closed point: an instance behind the one it moves to can still be
  closed from where it stopped), and its telemetry offset. Partition 0's section also
  holds the owner's state (attempts waiting for parts, parts received).

Each part is written with its offsets to one file, atomically (an object replaced in
one request, or a local file written aside and renamed), through the warehouse's
filesystem layer (``store.py``), so the files may live in the bucket: the unit of
atomicity is the partition, as a Kafka Streams task's. On start an
instance loads its global part and the newest section of each partition it is assigned,
wherever it was written; the transport resumes from their offsets, so every input
record is applied exactly once to the state that the facts come from. Fact files
written after a checkpoint and before a crash are written again, byte for byte, when
their minutes close again.

Files are data (``state_file.py``: a JSON document of the state's tree and its frames as
Arrow IPC streams, under a SHA-256): reading one builds numbers, strings, times, frames
and the engine's own classes (:data:`CLASSES`) from their attributes, and calls nothing
the file names. A file that cannot be read, whatever the reason, is one
:class:`CheckpointError` naming the file.

Releases before it wrote Python pickles. Those are refused unless
``GPULEDGER_READ_PICKLE_CHECKPOINTS=1`` is set, and then read by
:class:`_CheckpointUnpickler`, which builds only the types a checkpoint holds
(:data:`CHECKPOINT_TYPES`): a pickle naming any other callable (``os.system``) is
refused before anything in it runs. The next checkpoint is written as data.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import pickle
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any, cast
from zoneinfo import ZoneInfo

import polars as pl
from polars.exceptions import PanicException

from gpuledger.pipeline import state_file
from gpuledger.pipeline.counters import Counters
from gpuledger.pipeline.facts import job_usage, rollup
from gpuledger.pipeline.facts.telemetry_minutes import SampleKeys
from gpuledger.pipeline.generations import unit_of
from gpuledger.pipeline.processor import ACC_SCHEMA, Processor
from gpuledger.pipeline.state.inventory import InventoryBook
from gpuledger.pipeline.state.jobs import ATTEMPT_SCHEMA, OWNER, BookCounters, Job, JobBook
from gpuledger.pipeline.store import Entry, Store

log = logging.getLogger(__name__)

VERSION = 3

Offsets = dict[tuple[str, int], int]

GLOBAL_FIELDS = ("inventory", "jobs", "max_telemetry_time", "max_other_time", "started",
                 "counters", "close_pending", "pruned_to")
OWNER_FIELDS = ("waiting", "received", "completed", "running_parts", "last_free_blocks")


@dataclass
class Section:
    """One telemetry partition's part of the engine's state, and its offsets."""

    partition: int
    closed: datetime | None
    offsets: Offsets
    state: dict[str, Any] = field(default_factory=dict)

    @property
    def position(self) -> int:
        """How far its telemetry was read (the newest section of a partition wins)."""
        return max((off for (_topic, p), off in self.offsets.items() if p == self.partition),
                   default=-1)


class CheckpointError(ValueError):
    """A checkpoint that cannot be read: damaged, another release's, or not written by
    gpuledger (it names a callable no checkpoint holds). The message names the file."""


class PickledCheckpoint(CheckpointError):
    """An earlier release's (pickled) checkpoint, not read unless :data:`PICKLES_ENV` is
    set: readable when asked, so it is kept, not replaced."""


CLASSES: dict[str, type] = {t.__name__: t for t in (
    Counters, SampleKeys, JobBook, Job, BookCounters, InventoryBook, Section)}
"""The engine's classes a checkpoint holds, by name (made from their attributes)."""

PICKLES_ENV = "GPULEDGER_READ_PICKLE_CHECKPOINTS"
"""Set to 1 to read an earlier release's (pickled) checkpoints through the allow-list."""

CHECKPOINT_TYPES: dict[tuple[str, str], type] = {
    (t.__module__, t.__qualname__): t
    for t in (pl.DataFrame, datetime, timedelta, timezone, ZoneInfo, Counters, SampleKeys,
              JobBook, Job, BookCounters, InventoryBook, Section)
}
"""The only types a checkpoint builds (its frames, times, and the engine's books). Each is
made as pickle makes an object of its class (``__new__``, then its state), or by calling
the type itself; none of them reads, writes or runs anything when made."""


def _zone_getattr(owner: object, name: str) -> object:
    """What ``getattr`` may reach in a checkpoint: ``ZoneInfo._unpickle`` (how a zone
    pickles), nothing else."""
    if owner is ZoneInfo and name == "_unpickle":
        return ZoneInfo._unpickle  # type: ignore[attr-defined]
    raise pickle.UnpicklingError(f"refers to {getattr(owner, '__name__', owner)}.{name}, "
                                 "which no gpuledger checkpoint holds")


class _CheckpointUnpickler(pickle.Unpickler):
    """An unpickler that finds only :data:`CHECKPOINT_TYPES` (and ``getattr`` as far as
    :func:`_zone_getattr` allows): a pickle naming anything else stops before it runs."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("builtins", "getattr"):
            return _zone_getattr
        found = CHECKPOINT_TYPES.get((module, name))
        if found is None:
            raise pickle.UnpicklingError(f"refers to {module}.{name}, which no gpuledger "
                                         "checkpoint holds")
        return found


MAGIC = b"gpuledger checkpoint sha256 "
"""A pickled checkpoint of an earlier release: this, the SHA-256 of the pickle (64 hex
digits), a newline, the pickle (earlier still: the bare pickle)."""


def _dump(blob: dict[str, Any]) -> bytes:
    return state_file.dump(blob, CLASSES)


def _load(data: bytes | None, where: str) -> dict[str, Any] | None:
    if data is None:
        return None
    if state_file.is_state_file(data):
        try:
            blob = state_file.load(data, CLASSES)
        except state_file.StateFileError as exc:
            reason = str(exc)
            raise CheckpointError(f"{where}: {reason}" if reason.startswith("damaged") else
                                  f"{where}: not a readable gpuledger checkpoint ({reason})"
                                  ) from None
        return _versioned(blob, where)
    if not (data.startswith(MAGIC) or data.startswith(b"\x80")):
        raise CheckpointError(f"{where}: not a readable gpuledger checkpoint (not a "
                              "gpuledger state file)")
    if os.environ.get(PICKLES_ENV) != "1":
        raise PickledCheckpoint(
            f"{where}: a checkpoint of an earlier release (a Python pickle), not read by "
            f"default; set {PICKLES_ENV}=1 to read it through a reader that builds only a "
            "checkpoint's own types (the next checkpoint is written as data), or remove it "
            "to start that part afresh")
    return _versioned(_unpickled(data, where), where)


def _versioned(blob: Any, where: str) -> dict[str, Any]:
    if not isinstance(blob, dict) or blob.get("version") != VERSION:
        version = blob.get("version") if isinstance(blob, dict) else None
        raise CheckpointError(f"{where}: checkpoint version {version} is not {VERSION}")
    return blob


def _unpickled(data: bytes, where: str) -> Any:
    """An earlier release's checkpoint, through :class:`_CheckpointUnpickler`."""
    if data.startswith(MAGIC):
        head = len(MAGIC) + 65
        digest, data = data[len(MAGIC):head - 1], data[head:]
        if hashlib.sha256(data).hexdigest().encode() != digest:
            raise CheckpointError(f"{where}: damaged (its SHA-256 does not match its "
                                  "content: cut short or changed since it was written)")
    try:
        return _CheckpointUnpickler(io.BytesIO(data)).load()
    except (Exception, PanicException) as exc:  # not a checkpoint of ours, or damaged
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(f"{where}: not a readable gpuledger checkpoint ({reason})"
                              ) from None


def _write(path: Path, blob: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        f.write(_dump(blob))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _read(path: Path) -> dict[str, Any] | None:
    return _load(path.read_bytes(), str(path)) if path.exists() else None


# -- the global part ---------------------------------------------------------------------

def global_state(processor: Processor) -> dict[str, Any]:
    return {name: getattr(processor, name) for name in GLOBAL_FIELDS}


def load_global(processor: Processor, state: dict[str, Any]) -> None:
    """The books of the global part. Which ended attempts and preemptions each partition
    and the owner have taken is the sections' to say (``merge_section``): the global
    part is written first, so after a kill between the two it can be newer than a
    section, and its marks would hide attempts that section never reported."""
    for name, value in state.items():
        setattr(processor, name, value)
    if "pruned_to" not in state:  # an earlier release's: its books may have been pruned
        processor.pruned_to = processor.max_other_time
    processor.jobs.taken = {}
    processor.jobs.preemptions_taken = set()


# -- partition sections ------------------------------------------------------------------

def _nodes_of(processor: Processor, partition: int, nodes: list[str]) -> list[str]:
    if processor.partitioning is None:
        return list(nodes)
    return [n for n in nodes if processor.partitioning.of(n) == partition]


@dataclass
class _Split:
    """The rows of the engine's buffers and books of each partition in ``wanted``, split
    in one pass over each (a save of 12 sections filtered every buffer 12 times)."""

    tel_parts: dict[int, list[pl.DataFrame]]
    mem_parts: dict[int, list[pl.DataFrame]]
    acc: dict[int, pl.DataFrame]
    rejects: dict[int, list[pl.DataFrame]]
    node_time: dict[int, list[str]]
    inventory: dict[int, list[str]]
    allocs: dict[int, list[dict[str, Any]]]
    attempts: dict[int, list[dict[str, Any]]]


def _split(processor: Processor, wanted: set[int]) -> _Split:
    def frames(buffer: list[pl.DataFrame]) -> dict[int, list[pl.DataFrame]]:
        out: dict[int, list[pl.DataFrame]] = {p: [] for p in wanted}
        for frame in buffer:
            for (q,), rows in frame.partition_by("partition", as_dict=True).items():
                if q in out:
                    out[cast(int, q)].append(rows)
        return out

    def nodes(names: list[str]) -> dict[int, list[str]]:
        if processor.partitioning is None:
            return {p: list(names) for p in wanted}
        out: dict[int, list[str]] = {p: [] for p in wanted}
        of = processor.partitioning.of
        for name in names:
            q = of(name)
            if q in out:
                out[q].append(name)
        return out

    acc = {cast(int, q): rows for (q,), rows in
           processor.acc.partition_by("partition", as_dict=True).items()}
    rejects: dict[int, list[pl.DataFrame]] = {p: [] for p in wanted}
    for r in processor.rejects:
        split = {q: rows for (q,), rows in r.partition_by("partition", as_dict=True).items()}
        for p in wanted:
            rejects[p].append(split.get(p, r.clear()))
    inventory = nodes(processor.inventory.records["node"].unique().to_list())
    jobs = processor.jobs
    allocs: dict[int, list[dict[str, Any]]] = {p: [] for p in wanted}
    if processor.partitioning is None:
        allocs = {p: list(jobs.closed_allocs) for p in wanted}
    else:   # of the nodes the inventory knows
        part_of = {name: p for p, names in inventory.items() for name in names}
        for a in jobs.closed_allocs:
            q = part_of.get(a["node"])
            if q is not None:
                allocs[q].append(a)
    attempts: dict[int, list[dict[str, Any]]] = {p: [] for p in wanted}
    for a in jobs.ended_attempts:
        for q in processor.partitions_of(a["nodes"]):
            if q in attempts:
                attempts[q].append(a)
    return _Split(frames(processor.tel_parts), frames(processor.mem_parts),
                  {p: acc.get(p, processor.acc.clear()) for p in wanted}, rejects,
                  nodes(list(processor.node_time)), inventory, allocs, attempts)


def section(processor: Processor, partition: int, offsets: Offsets,
            keys: SampleKeys | None = None, split: _Split | None = None) -> Section:
    """Partition ``partition``'s part of ``processor``'s state (``keys``: its sample
    keys, ``split``: its rows, when the caller split them already for all partitions)."""
    p = partition
    split = split or _split(processor, {p})
    jobs = processor.jobs
    closed = processor.part_closed.get(p)
    state: dict[str, Any] = {
        "tel_parts": split.tel_parts[p],
        "mem_parts": split.mem_parts[p],
        "sample_keys": (keys if keys is not None
                        else processor.sample_keys.of_partition(p, keep=True)),
        "acc": split.acc[p],
        "hour_parts": {(t, h): v for (t, h, q), v in processor.hour_parts.items() if q == p},
        "rollup_parts": {h: v for (h, q), v in processor.rollup_parts.items() if q == p},
        "day_hourly": {d: v for (d, q), v in processor.day_hourly.items() if q == p},
        "late_parts": {h: v for (h, q), v in processor.late_parts.items() if q == p},
        "rejects": split.rejects[p],
        "node_time": {n: processor.node_time[n] for n in split.node_time[p]},
        "seq_last": {k: v for k, v in processor._seq_last.items() if k[0] == p},
        "taken": jobs.taken_by(p),
        "history": _history(processor, p, closed, split),
        "started": processor.started,
    }
    if p == 0 and processor.owner:
        state["owner"] = {name: getattr(processor, name) for name in OWNER_FIELDS}
        state["owner_taken"] = jobs.taken_by(OWNER)
        state["preemptions_taken"] = set(jobs.preemptions_taken)
    return Section(p, closed, dict(offsets), state)


def _rows_of(frames: list[pl.DataFrame], which: pl.Expr) -> list[pl.DataFrame]:
    return [x for x in (f.filter(which) for f in frames) if not x.is_empty()]


def _history(processor: Processor, p: int, closed: datetime | None, split: _Split
             ) -> dict[str, Any]:
    """What partition ``p`` still needs from the books to close from ``closed`` on."""
    jobs = processor.jobs
    allocs = [a for a in split.allocs[p] if closed is None or a["end"] > closed]
    taken = jobs.taken_by(p)
    attempts = [a for a in split.attempts[p] if (a["job_id"], a["attempt"]) not in taken]
    history: dict[str, Any] = {
        "closed_allocs": allocs,
        "ended_attempts": attempts,
        "inventory": processor.inventory.records.filter(
            pl.col("node").is_in(split.inventory[p])) if processor.partitioning is not None
        else processor.inventory.records,
    }
    if p == 0:
        history["closed_pending"] = [x for x in jobs.closed_pending
                                     if closed is None or x["end"] > closed]
        history["preemptions"] = list(jobs.preemptions)
        history["started_sizes"] = list(jobs.started_sizes)
        owner_taken = jobs.taken_by(OWNER)
        history["owner_attempts"] = [a for a in jobs.ended_attempts
                                     if (a["job_id"], a["attempt"]) not in owner_taken]
    ids = {a["job_id"] for a in allocs} | {a["job_id"] for a in attempts}
    history["attrs"] = {j: (job.attrs, job.attempt) for j, job in jobs.jobs.items() if j in ids}
    return history


def merge_section(processor: Processor, sec: Section) -> None:
    """Take a partition's section (from this instance's files or another's) into
    ``processor``, which holds the partition from now on."""
    p, s = sec.partition, sec.state
    if processor.partitioning is not None:
        processor.start_partition(p, sec.closed)
    elif sec.closed is not None:
        processor.part_closed[p] = sec.closed
    processor.tel_parts.extend(s["tel_parts"])
    processor.mem_parts.extend(s["mem_parts"])
    processor.sample_keys.add(s["sample_keys"])
    acc = job_usage.conform(s["acc"]).select(ACC_SCHEMA.names())
    if not acc.is_empty():
        processor.acc = pl.concat([processor.acc, acc])
    for (table, hour), frames in s["hour_parts"].items():
        processor.hour_parts.setdefault((table, hour, p), []).extend(frames)
    for hour, frames in s["rollup_parts"].items():
        processor.rollup_parts.setdefault((hour, p), []).extend(
            rollup.conform(f) for f in frames)
    for day, hours in s["day_hourly"].items():
        processor.day_hourly.setdefault((day, p), {}).update(hours)
    for hour, frames in s["late_parts"].items():
        processor.late_parts.setdefault((hour, p), []).extend(frames)
    processor.rejects.extend(r for r in s["rejects"] if not r.is_empty())
    for node, when in s["node_time"].items():
        if node not in processor.node_time or when > processor.node_time[node]:
            processor.node_time[node] = when
        # the newest sample read is at least the section's: a batch run's end of input
        # closes up to it (an instance that read none of a handed-over partition left
        # its last minute open)
        if processor.max_telemetry_time is None or when > processor.max_telemetry_time:
            processor.max_telemetry_time = when
    processor._seq_last.update(s["seq_last"])
    processor.jobs.merge_history(s["history"])
    processor.inventory.merge(s["history"]["inventory"])
    processor.jobs.mark_taken(s["taken"], p)
    if "owner" in s:
        for name, value in s["owner"].items():
            setattr(processor, name, value)
        processor.received = job_usage.conform(processor.received)
        processor.running_parts = {shard: job_usage.conform(rows)
                                   for shard, rows in processor.running_parts.items()}
        processor.jobs.mark_taken(s["owner_taken"], OWNER)
        processor.jobs.preemptions_taken |= s["preemptions_taken"]
    # where the fleet started: the engine's start a section was taken with (a partition
    # closed up to 01:00 may have been started at 00:00), else its closed point (a
    # section of an earlier release)
    known = [t for t in (s.get("started"), sec.closed) if t is not None]
    if known and (processor.started is None or min(known) < processor.started):
        processor.started = min(known)
    if processor.started is not None and processor.partitioning is not None:
        # a partition nobody has read (nothing closed) starts where the fleet started,
        # also when it was taken before the engine knew that: it is closed from there
        for q in processor.held:
            processor.part_closed.setdefault(q, processor.started)


def drop_partition(processor: Processor, partition: int) -> None:
    """Remove a partition's rows from ``processor`` (handed over elsewhere); its files are
    published first, and its manifest is let go (the next holder loads the newest)."""
    p = partition
    processor.warehouse.publisher.forget(unit_of(processor.suffix(p)))
    other = pl.col("partition") != p
    processor.tel_parts = _rows_of(processor.tel_parts, other)
    processor.mem_parts = _rows_of(processor.mem_parts, other)
    processor.sample_keys = processor.sample_keys.of_partition(p, keep=False)
    processor.acc = processor.acc.filter(other)
    for key in [k for k in processor.hour_parts if k[2] == p]:
        del processor.hour_parts[key]
    for key2 in [k for k in processor.rollup_parts if k[1] == p]:
        del processor.rollup_parts[key2]
    for key3 in [k for k in processor.day_hourly if k[1] == p]:
        del processor.day_hourly[key3]
    for key4 in [k for k in processor.late_parts if k[1] == p]:
        del processor.late_parts[key4]
    processor.rejects = [r.filter(other) for r in processor.rejects]
    nodes = set(_nodes_of(processor, p, list(processor.node_time)))
    processor.node_time = {n: t for n, t in processor.node_time.items() if n not in nodes}
    processor._seq_last = {k: v for k, v in processor._seq_last.items() if k[0] != p}
    if p == 0:
        processor.waiting = pl.DataFrame(schema=ATTEMPT_SCHEMA)
        processor.received = processor.received.clear()
        processor.running_parts = {}
    if processor.partitioning is not None:
        processor.stop_partition(p)


# -- files -------------------------------------------------------------------------------

def _is_global(name: str) -> bool:
    """Whether ``name`` (a path in the checkpoint folder) is an instance's global part,
    ``global-<instance>.checkpoint``."""
    return name.startswith("global-") and name.endswith(".checkpoint") and "/" not in name


def _partition_of(name: str) -> int | None:
    """The partition whose section ``name`` is (``partition-pNNN.checkpoint``), or None."""
    number = name[11:-11]
    if name.startswith("partition-p") and name.endswith(".checkpoint") \
            and "/" not in name and number.isascii() and number.isdigit():
        return int(number)
    return None


def _frames_hour(path: str) -> datetime | None:
    """The newest hour of the frames in ``path`` (``…/hours-YYYYMMDDTHH-<digest>.frames``),
    or None when ``path`` is not a frames file."""
    name = path.rsplit("/", 1)[-1]
    if not (name.startswith("hours-") and name.endswith(".frames")):
        return None
    try:
        return datetime.strptime(name[6:17], "%Y%m%dT%H").replace(tzinfo=UTC)
    except ValueError:
        return None


ASIDE: dict[str, Callable[[Any], datetime]] = {
    "hour_parts": lambda key: cast(datetime, key[1]),    # (table, hour)
    "rollup_parts": lambda key: cast(datetime, key),     # hour
}
"""The parts of a section an incremental store writes aside, frame by frame, and the hour
of each of their keys: the facts and roll-up partials of open hours (90 % of a section's
bytes, 12 partitions of 9,216 GPUs 45 minutes into an hour)."""

SWEEP_AFTER = timedelta(hours=2)
"""A partition's frames file no section names is deleted once its newest hour started
this long before the partition's closed point: its hour was closed an hour before (an
instance behind by less than that, handing the partition over, still finds its
files)."""


@dataclass
class _Saved:
    """A frame of an open hour already in a frames file (``path``, at ``index``)."""

    frame: pl.DataFrame   # held, so that the frame's ``id`` is not reused meanwhile
    path: str
    index: int


class CheckpointStore:
    """Where an instance keeps its checkpoints: ``global-<instance>.checkpoint`` and
    ``partition-pNNN.checkpoint`` (the newest section of each partition, written by
    whichever instance holds it) under one folder or bucket prefix (``store.py``), which
    every instance of the group reaches: a shared folder, or the bucket itself. Each
    file is replaced whole (an object store replaces an object in one request; a local
    file is written aside and renamed).

    ``incremental``: the facts and roll-up partials buffered for the open hours
    (:data:`ASIDE`) are not written into each section again. Each frame of them is
    written once, with the other frames new since the partition's last save, into a
    frames file ``partition-pNNN/hours-<newest hour>-<digest>.frames``, never changed
    after; the section names its frames by file and index. A partition's frames files no
    section names any more are deleted once their hours closed (:data:`SWEEP_AFTER`),
    once an hour. Sections of either kind are read."""

    def __init__(self, store: Store, instance: str, incremental: bool = False) -> None:
        self.store = store
        self.instance = instance
        self.incremental = incremental
        self._saved: dict[int, dict[int, _Saved]] = {}
        """Per partition, by ``id``: its frames of open hours in frames files, written
        here or read."""
        self._swept: dict[int, datetime] = {}
        """Per partition, the hour of its closed point at its last sweep."""

    def global_path(self) -> str:
        return f"global-{self.instance}.checkpoint"

    def partition_path(self, partition: int) -> str:
        return f"{self.frames_dir(partition)}.checkpoint"

    def prune_globals(self, idle_s: float, now: float) -> list[str]:
        """Delete the global parts of other instances not written for ``idle_s`` (gone:
        without ``--instance-id`` each process writes one of its own, and they piled up),
        keeping the newest (a new instance starts from it); the names deleted."""
        mine = self.global_path()
        found = self._globals_newest_first()
        gone = [e.path for e in found[1:] if e.path != mine and now - e.mtime > idle_s]
        for path in gone:
            self.store.delete(path)
        return gone

    def partitions(self) -> set[int]:
        """The partitions with a section file."""
        return {p for p in (_partition_of(e.path) for e in self.store.list(""))
                if p is not None}

    def holds(self, *marks: str) -> bool:
        """Whether the folder holds one of the files ``marks``, a global part or a
        partition's section (one listing)."""
        return any(self.store.exists(mark) for mark in marks) or any(
            _is_global(e.path) or _partition_of(e.path) is not None
            for e in self.store.list(""))

    def _globals_newest_first(self) -> list[Entry]:
        """The global parts of every instance, the newest first."""
        return sorted((e for e in self.store.list("") if _is_global(e.path)),
                      key=lambda e: e.mtime, reverse=True)

    def _write(self, path: str, blob: dict[str, Any]) -> None:
        self.store.write(path, _dump(blob))

    def _read(self, path: str) -> dict[str, Any] | None:
        return _load(self.store.read(path), self.store.url_of(path))

    def save(self, processor: Processor, global_offsets: Offsets,
             partition_offsets: dict[int, Offsets]) -> None:
        """The global part, then each held partition's section. The facts the state no
        longer holds are published first: a checkpoint never covers facts that are not
        durable."""
        processor.warehouse.sync()
        self._write(self.global_path(), {"version": VERSION, "state": global_state(processor),
                                         "offsets": dict(global_offsets)})
        keys = processor.sample_keys.split()
        split = _split(processor, set(partition_offsets))
        for p, offsets in sorted(partition_offsets.items()):
            self.save_partition(processor, p, {**offsets, **global_offsets},
                                keys.get(p, SampleKeys()), split)

    def save_partition(self, processor: Processor, partition: int, offsets: Offsets,
                       keys: SampleKeys | None = None, split: _Split | None = None) -> None:
        processor.warehouse.sync()
        sec = section(processor, partition, offsets, keys, split)
        if self.incremental:
            self._frames_aside(sec, processor.held)
        self._write(self.partition_path(partition), {"version": VERSION, "section": sec})
        if self.incremental:
            self._sweep(sec)

    def frames_dir(self, partition: int) -> str:
        """The folder of a partition's frames files (its section is this, ``.checkpoint``)."""
        return f"partition-p{partition:03d}"

    def _frames_aside(self, sec: Section, held: set[int]) -> None:
        """Replace the section's frames of open hours (:data:`ASIDE`) by where each frame
        is (``frames_at``): the frames no frames file holds yet are written into a new
        one first."""
        p = sec.partition
        saved = self._saved.setdefault(p, {})
        aside: dict[str, dict[Any, list[pl.DataFrame]]] = {
            name: sec.state.pop(name) for name in ASIDE}
        fresh = [(hour_of(key), f) for name, hour_of in ASIDE.items()
                 for key, frames in aside[name].items() for f in frames
                 if id(f) not in saved]
        if fresh:
            data = _dump({"version": VERSION, "frames": [f for _, f in fresh]})
            newest = max(hour for hour, _ in fresh)
            path = (f"{self.frames_dir(p)}/hours-{newest:%Y%m%dT%H}-"
                    f"{hashlib.sha256(data).hexdigest()[:20]}.frames")
            self.store.write(path, data)
            for i, (_, f) in enumerate(fresh):
                saved[id(f)] = _Saved(f, path, i)
        sec.state["frames_at"] = {
            name: {key: [(saved[id(f)].path, saved[id(f)].index) for f in frames]
                   for key, frames in parts.items()}
            for name, parts in aside.items()}
        live = {id(f) for parts in aside.values() for frames in parts.values() for f in frames}
        self._saved = {q: frames for q, frames in self._saved.items() if q in held}
        self._saved[p] = {k: v for k, v in saved.items() if k in live}

    def _frames_back(self, sec: Section) -> None:
        """Put the frames a section names by file and index (``frames_at``) back in its
        state (a :class:`CheckpointError` naming the file if one is missing or is not a
        frames file)."""
        refs = sec.state.pop("frames_at", None)
        if refs is None:
            return
        files: dict[str, list[pl.DataFrame]] = {}
        for name, places_of in refs.items():
            parts: dict[Any, list[pl.DataFrame]] = {}
            for key, places in places_of.items():
                frames = parts.setdefault(key, [])
                for path, index in places:
                    if path not in files:
                        files[path] = self._frames_file(path, sec.partition)
                    if not 0 <= index < len(files[path]):
                        raise CheckpointError(
                            f"{self.store.url_of(self.partition_path(sec.partition))}: "
                            f"names frame {index} of {self.store.url_of(path)}, which "
                            f"holds {len(files[path])}")
                    frame = files[path][index]
                    frames.append(frame)
                    if self.incremental:
                        self._saved.setdefault(sec.partition, {})[id(frame)] = _Saved(
                            frame, path, index)
            sec.state[name] = parts

    def _frames_file(self, path: str, partition: int) -> list[pl.DataFrame]:
        where = self.store.url_of(path)
        blob = self._read(path)
        if blob is None:
            raise CheckpointError(
                f"{self.store.url_of(self.partition_path(partition))}: names the frames "
                f"file {where}, which is missing (deleted by hand, or by an instance that "
                "closed the partition over an hour further on)")
        frames = blob.get("frames")
        if not isinstance(frames, list) or not all(
                isinstance(f, pl.DataFrame) for f in frames):
            raise CheckpointError(f"{where}: not a frames file of a checkpoint")
        return frames

    def _sweep(self, sec: Section) -> None:
        """Delete the partition's frames files its section does not name and whose hours
        closed :data:`SWEEP_AFTER` ago, when its closed point reached a new hour (and at
        its first save here: files of a writer killed between a frames file and its
        section)."""
        if sec.closed is None:
            return
        p, hour = sec.partition, sec.closed.replace(minute=0, second=0, microsecond=0)
        if self._swept.get(p) == hour:
            return
        self._swept[p] = hour
        named = {path for places_of in sec.state["frames_at"].values()
                 for places in places_of.values() for path, _ in places}
        try:
            for entry in self.store.list(self.frames_dir(p)):
                newest = _frames_hour(entry.path)
                if (newest is not None and entry.path not in named
                        and newest + SWEEP_AFTER <= sec.closed):
                    self.store.delete(entry.path)
        except OSError as exc:   # tried again at the next hour
            log.warning("partition %d: frames files of closed hours not deleted (%s)", p, exc)

    def load_global(self, processor: Processor) -> Offsets | None:
        """This instance's global part, or the newest of any instance (a new instance
        starts from the books of one that ran): the global offsets to resume from."""
        blob = self._read(self.global_path())
        if blob is None:
            others = self._globals_newest_first()
            blob = self._read(others[0].path) if others else None
        if blob is None:
            return None
        load_global(processor, blob["state"])
        offsets: Offsets = blob["offsets"]
        return offsets

    def read_global(self) -> dict[str, Any] | None:
        """This instance's global part as saved (its books), without loading it."""
        blob = self._read(self.global_path())
        return None if blob is None else cast(dict[str, Any], blob["state"])

    def read_partition(self, partition: int) -> Section | None:
        blob = self._read(self.partition_path(partition))
        if blob is None:
            return None
        sec: Section = blob["section"]
        self._frames_back(sec)
        return sec


# -- one file for a whole engine (tests, tools) -----------------------------------------

def save(processor: Processor, offsets: Offsets, path: Path) -> None:
    """Write all of ``processor``'s state and ``offsets`` to ``path`` atomically."""
    split = _split(processor, set(processor.held))
    sections = [section(processor, p, {}, split=split) for p in sorted(processor.held)]
    _write(path, {"version": VERSION, "state": global_state(processor),
                  "sections": sections, "offsets": dict(offsets)})


def load(processor: Processor, path: Path) -> Offsets | None:
    """Restore ``processor`` from ``path``; the offsets to resume from, or None."""
    blob = _read(path)
    if blob is None:
        return None
    load_global(processor, blob["state"])
    for sec in blob["sections"]:
        merge_section(processor, sec)
    offsets: Offsets = blob["offsets"]
    return offsets
