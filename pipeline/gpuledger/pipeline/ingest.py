"""Process recorded events (contract JSON lines) into a warehouse.

Files may hold any mix of record types, in any order. All files are decoded first
(bad lines are collected with file, line and reason), then the events are fed to the
processor in event-time order, exactly as a live stream would arrive: ten minutes to an
hour at a time while there is telemetry (about SLICE_SAMPLES samples a batch; its
samples wait in memory until their minutes close),
a day at a time for a history of scheduler and inventory events alone (the processor
then closes a day per pass and keeps GPUs without telemetry as spans, so a year of
history costs per event, not per GPU-minute). The decoded input is held in memory while
it is fed (about 150 bytes per telemetry sample): split very long histories by day.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import logging
import uuid
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import IO, Any, cast

import orjson
import polars as pl

from gpuledger.cli.errors import CliError
from gpuledger.contract.schema import RECORD_TYPES, RecordType
from gpuledger.pipeline.checkpoint import CheckpointStore, PickledCheckpoint, merge_section
from gpuledger.pipeline.columns import TIME_DTYPE, empty_frame
from gpuledger.pipeline.compaction import part_span
from gpuledger.pipeline.config import ProcessorConfig
from gpuledger.pipeline.counters import Counters
from gpuledger.pipeline.decode import decode_jsonl_files, encode_jsonl
from gpuledger.pipeline.generations import read_manifests
from gpuledger.pipeline.processor import Processor
from gpuledger.pipeline.state.inventory import INVENTORY_STATE_SCHEMA, InventoryBook
from gpuledger.pipeline.store import Store
from gpuledger.pipeline.validate import REJECT_SCHEMA, validate
from gpuledger.pipeline.warehouse import Warehouse

log = logging.getLogger(__name__)

SLICE = timedelta(minutes=10)
"""The least event time fed per batch while there is telemetry."""
LONGEST_SLICE = timedelta(hours=1)
"""The most event time fed per batch while there is telemetry."""
SLICE_SAMPLES = 100_000
"""Telemetry samples per batch the slice aims at, between the two. Every batch pays a
close pass (about 0.3 CPU-seconds of fixed cost), so a small cluster's history goes an
hour at a time; the samples of a batch are held while it is processed, so the built-in
cluster (576 GPUs, 10 s) goes about half an hour at a time and a large one ten minutes
at a time, as before (the demo: about 35 user CPU-s and 460 MiB at the peak, against 51
and 390 MiB ten minutes at a time, and 30 and 592 MiB an hour at a time; bench/README.md)."""
HISTORY_SLICE = timedelta(days=1)
"""Event time fed per batch of a history without telemetry."""


def telemetry_slice(samples: int, span: timedelta) -> timedelta:
    """Whole minutes of event time per batch for ``samples`` telemetry samples over
    ``span``: about SLICE_SAMPLES a batch, within SLICE … LONGEST_SLICE."""
    minutes = max(span.total_seconds() / 60, 1.0)
    per_batch = SLICE_SAMPLES / max(samples / minutes, 1.0)
    return timedelta(minutes=int(min(max(per_batch, SLICE.total_seconds() / 60),
                                     LONGEST_SLICE.total_seconds() / 60)))


INGEST_STATE = "state/ingest"
"""Where ``ingest`` keeps its engine's state between runs, in the warehouse: one folder
per closed point, ``until-<time>/`` (``state_folder``), the state a run left when it had
closed every minute before that time."""
KEEP_STATES = 8
"""Runs' saved states kept (the most recently written, and always the one closed
furthest): a re-run of a piece continues from the state its predecessor left, not only
from the last run's. A run ending inside a minute saves a second state inside its last
minute (:func:`save_inside_last_minute`), kept for the INSIDE_KEPT runs closed furthest:
disk use stays that of KEEP_STATES + INSIDE_KEPT states."""
INSIDE_KEPT = 2
"""The runs, closed furthest, whose state inside their last minute is kept."""
_STATE_PREFIX = "until-"
_STATE_FORMATS = ("%Y-%m-%dT%H-%M-%SZ", "%Y-%m-%dT%H-%M-%S.%fZ")
_LEGACY = ("global-ingest.checkpoint", "partition-p000.checkpoint")
"""The files of the single state that earlier releases kept, directly under INGEST_STATE
(partition 0 alone: ingest holds no other)."""


@dataclass
class IngestResult:
    """What an ingest did."""

    records: dict[str, int]
    rejects: pl.DataFrame
    counters: Counters
    continued_from: datetime | None = None
    """Where the saved ingest state this one went on from had closed (its input starting
    there or later), or None (processed afresh)."""
    nothing: bool = False
    """The input held no valid record: nothing was written."""
    closed_to: datetime | None = None
    """Every minute before this is closed (the next piece goes on from here); the minute
    of the newest event stays open when that event falls on its start."""
    open_from: datetime | None = None
    """The start of the last minute, when the newest event fell inside it: a state closed
    there was saved too, for a next piece that starts inside that minute
    (:func:`save_inside_last_minute`)."""
    facts_begin: datetime | None = None
    """Where the facts begin when early records (far before the bulk of the input,
    :func:`set_aside_outliers`) would have had them start far earlier, else None."""
    early: dict[str, int] = field(default_factory=dict)
    """The ``job`` and ``inventory`` records dated before ``facts_begin``: they only
    updated the books. The processor counts them as late (they come after the minute it
    starts at); ``counters`` does not: its late counts are the records that came after
    their minutes had closed."""
    held: int = 0
    """Inventory records dated before the point the input went on from that the history
    already holds (the same node states, :func:`drop_held_inventory`): left out, as they
    change nothing."""
    held_before: datetime | None = None
    """The point ``held`` counts the records before (the saved state's closed point)."""
    replaced_from: datetime | None = None
    """Where the input was processed on its own over the history already ingested here
    (``--afresh``, or the history's first piece again): the facts of the hours from here
    to its end are this input's alone."""


@dataclass(frozen=True)
class Run:
    """An ingest run, as each state it saves records it (``RUN_FILE``)."""

    id: str
    start: datetime
    """Its input's first event."""


@dataclass(frozen=True)
class SavedState:
    """One saved ingest state: its folder under INGEST_STATE, its closed point (from the
    folder's name), when it was last written and the run that saved it (None: not
    recorded, a state of an earlier release)."""

    folder: str
    closed: datetime
    written: float
    run: Run | None = None


RUN_FILE = "run.json"
"""In each state's folder: the run that saved it, ``{"run": id, "from": first event}``."""


def state_folder(closed: datetime) -> str:
    """The folder of the state closed up to ``closed`` (UTC): ``until-2026-01-05T00-00-00Z``."""
    utc = closed.astimezone(UTC)
    return _STATE_PREFIX + utc.strftime(_STATE_FORMATS[1] if utc.microsecond
                                        else _STATE_FORMATS[0])


def _closed_of(folder: str) -> datetime | None:
    if not folder.startswith(_STATE_PREFIX):
        return None
    for fmt in _STATE_FORMATS:
        try:
            return datetime.strptime(folder[len(_STATE_PREFIX):], fmt).replace(
                tzinfo=UTC)
        except ValueError:
            continue
    return None


def ingest_states(processor: Processor) -> Store:
    """The folder of the saved ``ingest`` states of ``processor``'s warehouse."""
    return processor.warehouse.store.child(INGEST_STATE)


def saved_states(root: Store) -> list[SavedState]:
    """The saved states under ``root``, the one closed furthest first (a file where a
    state's folder should be counts: reading it fails, as for any damaged state)."""
    written: dict[str, float] = {}
    for entry in root.list(""):
        folder, _sep, _ = entry.path.partition("/")
        if _closed_of(folder) is not None:
            written[folder] = max(written.get(folder, 0.0), entry.mtime)
    states = [SavedState(f, c, w, _run_of(root, f)) for f, w in written.items()
              if (c := _closed_of(f)) is not None]
    return sorted(states, key=lambda s: s.closed, reverse=True)


def _run_of(root: Store, folder: str) -> Run | None:
    """The run recorded in a state's folder (None: none, or not readable)."""
    try:
        data = root.read(f"{folder}/{RUN_FILE}")
        if data is None:
            return None
        doc = json.loads(data)
        return Run(str(doc["run"]), datetime.fromisoformat(doc["from"]).astimezone(UTC))
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError):
        return None


class IngestRefused(CliError):
    """An input that processing on its own would make wrong facts of (one line)."""


ORIGIN = "origin.json"
"""Where the history ingested into a warehouse starts (its first event, over all runs)."""
GAP_WARNING = timedelta(hours=1)
"""An input starting this long after the state it continues from is said in a warning."""
ON_ITS_OWN = ("processing it on its own would replace the facts of its hours with this "
              "input's alone (jobs running into it would be lost)")


def _why(exc: BaseException) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def _origin_doc(root: Store) -> dict[str, Any] | None:
    """``origin.json`` as read (None: none, or not readable)."""
    try:
        data = root.read(ORIGIN)
        doc = None if data is None else json.loads(data)
    except (OSError, ValueError, RecursionError):
        return None
    return doc if isinstance(doc, dict) else None


def read_origin(root: Store, key: str = "first") -> datetime | None:
    """Where the history ingested into the warehouse so far starts (``first``: its first
    event), from where its states are stale (``stale_from``) or where the earliest state
    that was pruned closed (``pruned``), or None (not known, none)."""
    return _doc_time(_origin_doc(root), key)


def _doc_time(doc: dict[str, Any] | None, key: str) -> datetime | None:
    """The time ``doc[key]`` of an ``origin.json`` read, or None (none, not a time)."""
    try:
        return None if doc is None or doc.get(key) is None else datetime.fromisoformat(
            doc[key]).astimezone(UTC)
    except (ValueError, TypeError, AttributeError):
        return None


def _keep_origin(root: Store, first: datetime, stale_from: datetime | None,
                 pruned: datetime | None = None) -> None:
    """Where the history starts (the earliest first event); when a run processed on
    its own deleted later states, from where (``stale_from``; a run continuing from that
    point clears it); and where the earliest state pruned (``pruned``, :func:`save_state`)
    closed, null while none was (the key is left out where an earlier release, which did
    not record it, wrote the file: not known)."""
    doc = _origin_doc(root)
    old_first = _doc_time(doc, "first")
    first = first if old_first is None else min(first, old_first)
    out: dict[str, Any] = {
        "first": first.astimezone(UTC).isoformat(),
        "stale_from": None if stale_from is None else stale_from.astimezone(UTC).isoformat(),
    }
    if doc is None or "pruned" in doc:
        old_pruned = _doc_time(doc, "pruned")
        least = min((t for t in (pruned, old_pruned) if t is not None), default=None)
        out["pruned"] = None if least is None else least.astimezone(UTC).isoformat()
    root.write(ORIGIN, json.dumps(out).encode())


def _pruned_at_or_before(root: Store, states: list[SavedState], first: datetime) -> bool:
    """Whether a saved state closed at or before ``first`` was pruned (``KEEP_STATES``);
    where that was not recorded (an earlier release's warehouse), whether there are as
    many runs' states as pruning leaves."""
    doc = _origin_doc(root)
    if doc is not None and "pruned" in doc:
        pruned = _doc_time(doc, "pruned")
        return pruned is not None and pruned <= first
    return len(_pairs(states)) >= KEEP_STATES


def _adopt_legacy(root: Store) -> None:
    """Move the one state an earlier release kept (files directly under INGEST_STATE)
    into its ``until-`` folder. Raises when it cannot be read (the files then stay until
    the next save)."""
    present = [name for name in _LEGACY if root.exists(name)]
    if not present:
        return
    sec = CheckpointStore(root, "ingest").read_partition(0)
    data = {name: root.read(name) for name in _LEGACY}
    if sec is not None and sec.closed is not None and all(data.values()):
        folder = state_folder(sec.closed)
        if not any(s.folder == folder for s in saved_states(root)):
            for name, blob in data.items():
                assert blob is not None
                root.write(f"{folder}/{name}", blob)
    for name in present:
        root.delete(name)


def continue_previous(processor: Processor, root: Store, first: datetime,
                      afresh: bool = False, folder: str = INGEST_STATE,
                      remedy: str = "Ingest the whole history again, or pass --afresh",
                      last: datetime | None = None,
                      locate: Callable[[datetime], str | None] | None = None
                      ) -> datetime | None:
    """Take a saved ingest state (its job and inventory books, open hours, usage so far)
    into ``processor``: the one closed furthest among those closed at or before the new
    input's first event, so that its jobs go on (a job started then, finished now) — also
    when the input is a re-run of a piece that a later ingest already went past. Returns
    the point continued from, or None: the input is processed on its own.

    On its own is right for input that starts where the ingested history starts (the
    whole history again, or its first piece: the same files write the same facts). For
    input that starts inside the ingested history with no state to continue from (the one
    before it was pruned), or whose state cannot be read (damaged, another release's), it
    would replace the facts of its hours with its own alone: :class:`IngestRefused`,
    unless ``afresh``; so is input that starts before the ingested history, whose newest
    event ``last`` is before that history's end, in an hour the history has (an earlier
    piece ingested after a later one, cut inside an hour: on its own, it replaced the
    later piece's minutes in the hour they share, in silence). Where no state closed at
    or before the input's first event was ever pruned, the input holds records older than
    every point the history can go on from (a piece with events that came late, before
    the first piece's end): the refusal names the first of them (``locate``: given the
    earliest state's closed point, where the first record before it is, or None), and
    offers only the whole history again, all files in one run (``--afresh`` would lose
    the facts of its hours: the jobs running into it, the inventory). An older state is never
    taken instead: it would close the minutes between without their events; so an input
    that starts inside a piece ingested after the state that fits it (a run recorded as
    starting at or after that state's point, before this input) is refused too.
    ``folder`` (``root``'s name) and ``remedy`` are for the message of a state that
    cannot be read."""
    if afresh:
        return None
    where = folder
    try:
        _adopt_legacy(root)
    except PickledCheckpoint as exc:  # readable when asked: kept
        raise IngestRefused(f"{_why(exc)}; or pass --afresh to process the input on its "
                            "own") from None
    except Exception as exc:  # unreadable: as if there were none (it is deleted)
        log.warning("%s: the state an earlier release left cannot be read (%s); it is "
                    "left out", INGEST_STATE, _why(exc))
        for name in _LEGACY:
            with contextlib.suppress(OSError):
                root.delete(name)
    try:
        states = saved_states(root)
        fitting = [s for s in states if s.closed <= first]
        if not fitting:
            origin = read_origin(root)
            if states and origin is not None and first > origin:
                inside = [x.closed for x in states
                          if x.closed - timedelta(minutes=1) <= first < x.closed]
                if not inside and not _pruned_at_or_before(root, states, first):
                    earliest = states[-1].closed
                    which = None if locate is None else locate(earliest)
                    raise _older_than_history(
                        origin, states[0].closed, "every saved state a piece can go on "
                        f"from (the earliest closes at {earliest:%Y-%m-%d %H:%M} UTC)",
                        which or f"the first at {first:%Y-%m-%d %H:%M:%S} UTC")
                why = (f"it starts inside the last minute of the piece that closed at "
                       f"{inside[0]:%Y-%m-%d %H:%M} UTC, and a state inside a piece's last "
                       f"minute is kept for the {INSIDE_KEPT} pieces closed furthest only"
                       if inside else f"the one before it was pruned: those of "
                       f"{KEEP_STATES} runs are kept")
                raise IngestRefused(
                    f"the input starts at {first:%Y-%m-%d %H:%M:%S} UTC, inside the history "
                    f"already ingested ({origin:%Y-%m-%d %H:%M} to "
                    f"{states[0].closed:%Y-%m-%d %H:%M} UTC), and no saved state closes at "
                    f"or before that ({why}): {ON_ITS_OWN}. Ingest from an earlier piece "
                    "on, or the whole history; --afresh does it anyway")
            end = states[0].closed if states else None
            if origin is not None and end is not None and last is not None \
                    and first < origin and last < end - timedelta(minutes=1) \
                    and floor_hour(last) >= floor_hour(origin):
                # (``end`` closes the minute of the history's newest event; an earlier
                # piece in hours of its own goes on its own, as the history's start)
                raise IngestRefused(
                    f"the input ({first:%Y-%m-%d %H:%M:%S} to {last:%Y-%m-%d %H:%M:%S} "
                    "UTC) starts before the history already ingested "
                    f"({origin:%Y-%m-%d %H:%M} to {end:%Y-%m-%d %H:%M} UTC), ends inside it "
                    f"and shares its hour from {floor_hour(origin):%H:%M}: {ON_ITS_OWN}, "
                    "the later pieces' minutes in that hour lost. Ingest it together with "
                    "the later pieces (one run, every file named), or the whole history; "
                    "--afresh does it anyway")
            return None
        skipped = sorted(s.run.start for s in states if s.run is not None
                         and fitting[0].closed <= s.run.start < first)
        if skipped:
            raise IngestRefused(
                f"the input starts at {first:%Y-%m-%d %H:%M:%S} UTC, inside a piece "
                f"ingested from {skipped[0]:%Y-%m-%d %H:%M:%S} UTC, and the state it would "
                f"go on from closes at {fitting[0].closed:%Y-%m-%d %H:%M} UTC, before that "
                "piece: going on from it would drop that piece's events up to this input's "
                "start. Ingest that piece again first (its run then saves a state inside "
                "its last minute, for a piece starting there), or the history from an "
                "earlier piece on; --afresh processes the input on its own anyway")
        where = f"{folder}/{fitting[0].folder}"
        state = CheckpointStore(root.child(fitting[0].folder), "ingest")
        sections = {p: state.read_partition(p) for p in sorted(processor.held)}
        closed = [s.closed for s in sections.values()
                  if s is not None and s.closed is not None]
        if not closed or len(closed) < len(sections):
            raise ValueError("a section is missing (the run that saved it was stopped)")
        if max(closed) > first:
            raise ValueError("it closes after the input's first event")
        if state.load_global(processor) is None:
            raise ValueError("its global part is missing (the run that saved it was "
                             "stopped)")
    except IngestRefused:
        raise
    except Exception as exc:  # another release's state, or a damaged file
        raise IngestRefused(
            f"{where}: the saved state this input continues from cannot be read "
            f"({_why(exc)}); {ON_ITS_OWN}. {remedy}") from None
    for sec in sections.values():
        assert sec is not None
        merge_section(processor, sec)
    processor.counters = Counters()  # this run's own counts
    stale = read_origin(root, "stale_from")
    if stale is not None and max(closed) == stale and first >= stale + STALE_SLACK:
        # (a piece that follows directly starts in the minute after: the one before it
        # left its last minute open, as it closes to its newest event's minute)
        log.warning("the states after %s UTC were deleted when a piece before them was "
                    "processed on its own: if history from then to this input's start "
                    "(%s UTC) was ingested, ingest it again first (this run takes that "
                    "time as empty; the ended attempts already published from it are "
                    "kept)", f"{stale:%Y-%m-%d %H:%M}", f"{first:%Y-%m-%d %H:%M}")
        processor.keep_earlier_rows = True
    elif first - max(closed) > GAP_WARNING:
        log.warning("the input starts %s after the state it continues from closed "
                    "(%s UTC): the time between is taken to hold no event, so jobs running "
                    "then are charged through it; ingest the missing history first if "
                    "there is some", first - max(closed), f"{max(closed):%Y-%m-%d %H:%M}")
    return max(closed)


STALE_SLACK = timedelta(minutes=2)
"""An input starting less than this after a stale point follows the piece before it
directly (which left its last minute open): no warning."""


def _forget_later(root: Store, after: datetime) -> bool:
    """Delete the saved states closed after ``after``: an input processed on its own
    there makes them stale (they went on from a history without it). True if any was."""
    later = [s for s in saved_states(root) if s.closed > after]
    for s in later:
        delete_state(root, s.folder, "a stale")
    return bool(later)


def delete_state(root: Store, folder: str, which: str) -> None:
    """Delete a saved state's files, then its folder (a warning if they stay)."""
    try:
        for entry in root.list(folder):
            root.delete(entry.path)
    except OSError as exc:
        log.warning("%s/%s: %s ingest state could not be removed (%s)", INGEST_STATE,
                    folder, which, exc)
        return
    with contextlib.suppress(OSError):  # the empty folder, if any (a marker)
        root.fs.delete_dir(root.full(folder))


def save_state(processor: Processor, root: Store, keep: int | None, run: Run
               ) -> datetime | None:
    """Save ``processor``'s state in the folder of its closed point (replacing a state
    saved there before: the same point, reached again), with the ``run`` that saved it,
    then (``keep`` given) let all but the states of ``keep`` runs go: the most recently
    written stay, and always the one closed furthest (the next piece of the history
    continues from it). Returns where the earliest of the runs' states let go closed
    (None: none was)."""
    closed = [processor.part_closed[p] for p in processor.held if p in processor.part_closed]
    if not closed:  # nothing was closed: nothing to continue from
        processor.warehouse.sync()
        return None
    folder = state_folder(max(closed))
    CheckpointStore(root.child(folder), "ingest").save(
        processor, {}, {p: {} for p in processor.held})
    root.write(f"{folder}/{RUN_FILE}", json.dumps(
        {"run": run.id, "from": run.start.astimezone(UTC).isoformat()}).encode())
    for name in _LEGACY:  # an earlier release's state that could not be read
        root.delete(name)
    if keep is None:
        return None
    pairs = _pairs(saved_states(root))
    # a state inside a run's last minute serves the piece that starts there: kept for the
    # two runs closed furthest (the next piece, or the last one again), not for older
    # ones (it holds the open hour's facts: 13 MB against 0.4 MB at an hour's end for
    # 576 GPUs); re-running an older piece that starts inside the last minute of the one
    # before it is refused, naming that piece
    for pair in pairs[INSIDE_KEPT:]:
        for inside in pair[1:]:
            delete_state(root, inside.folder, "an old")
    pairs = [*pairs[:INSIDE_KEPT], *[pair[:1] for pair in pairs[INSIDE_KEPT:]]]
    if len(pairs) <= keep:
        return None
    recent = sorted(pairs, key=lambda p: (max(s.written for s in p), p[0].closed),
                    reverse=True)
    kept = {pairs[0][0].folder} | {p[0].folder for p in pairs
                                   if folder in {s.folder for s in p}}
    for pair in recent:
        if len(kept) >= keep:
            break
        kept.add(pair[0].folder)
    pruned: datetime | None = None
    for pair in pairs:
        if pair[0].folder not in kept:
            for state in pair:
                delete_state(root, state.folder, "an old")
                pruned = state.closed if pruned is None else min(pruned, state.closed)
    return pruned


def _pairs(states: list[SavedState]) -> list[tuple[SavedState, ...]]:
    """``states`` (closed furthest first) grouped by the run that saved them (a run
    ending inside a minute saves two, :func:`save_inside_last_minute`); a state with no
    run recorded is a group of its own. Furthest first."""
    groups: dict[str, list[SavedState]] = {}
    for s in states:
        groups.setdefault(s.folder if s.run is None else s.run.id, []).append(s)
    return [tuple(g) for g in groups.values()]


def save_inside_last_minute(processor: Processor, root: Store, run: Run,
                            continued: datetime | None = None, keep: int | None = None
                            ) -> datetime | None:
    """An input whose newest event falls inside a minute: its flush closes that minute
    too (the facts reach the input's end). Before it does, save a state closed at the
    minute's start, holding what the minute has so far: a next piece that starts inside
    that minute (a file cut mid-minute: by size, by ``split -l``) goes on from it with
    the facts of one ingest; before, it was refused. A piece starting at the next minute
    or later goes on from the state the run saves at its end, as before. Returns the
    point the state closes at (None: none saved, the newest event starts its minute and
    the flush leaves that minute open, or the run went on from a state closed there,
    ``continued``, which it must not overwrite)."""
    newest, closed = processor.newest_time(), processor.closed_until
    if newest is None or closed is None:
        return None
    start = newest.replace(second=0, microsecond=0)
    if start == newest or closed > start or (continued is not None and start <= continued):
        return None
    if start > processor.now_minute():  # not begun: the run leaves it open anyway
        return None
    if closed < start:
        processor.close_until(start)
    # the run's states are counted once both are saved (a re-run's first one, beside the
    # state of its earlier run at its end, would count as a run of its own); ``keep``: a
    # caller that saves no second state counts them here
    save_state(processor, root, keep, run)
    return start


IMPORTS = "state/imports.json"
"""The imports whose facts a warehouse holds: ``{"imports": [{"digest", "from", "to",
"sources"}]}`` (the digest of their validated events and window; the span of hours they
wrote; the digests of their input files, where the importer names them). A run that
writes over an import's hours (another import, an ingest) takes its entry out."""
IMPORTS_KEPT = 1000
"""The imports recorded (the newest)."""


class ImportRefused(CliError):
    """A run on its own that would replace facts it did not write (one line)."""


def import_history(
    processor: Processor,
    frames: dict[str, pl.DataFrame],
    on_progress: Callable[[float], None] | None = None,
    until: datetime | None = None,
    replace: bool = False,
    sources: Sequence[str] = (),
    before_flush: Callable[[], None] | None = None,
    let_go: bool = False,
) -> int:
    """An importer's frames (openb, sacct, pods): validate them, keep the rejects, feed
    the rest in event-time order and flush up to ``until`` (a window's end; default the
    newest event; ``before_flush`` as in :func:`feed_in_time_order`; ``let_go``: empty
    ``frames`` once validated, so that a long history is not held twice). The number of
    rejected records. Without a valid job event and without a window (``until``, or a
    start the processor was given), nothing is fed and nothing written.

    An import is processed on its own: the facts of the hours it covers become its own.
    Where the warehouse already holds facts in those hours that an import of the same
    events did not write (an ingest, the Kafka service, another file), that would replace
    them: :class:`ImportRefused`, unless ``replace``. ``sources`` (digests of the input
    files, :func:`file_digest`): hours written by an import of some of these files alone
    (yesterday's exports, imported again with today's) are not refused."""
    good: dict[RecordType, pl.DataFrame] = {}
    rejected = 0
    for kind, frame in frames.items():
        ok, bad = validate(frame, kind, limits=processor.config.limits)  # type: ignore[arg-type]
        processor.add_rejects(bad)
        rejected += bad.height
        good[kind] = ok  # type: ignore[index]
    if let_go:
        frames.clear()
    begin = None
    if processor.started is None:
        begin = facts_begin(good, "import")
        if begin is not None:
            processor.begin_at(begin)
    span = _import_span(processor, good, until)
    if span is None or (until is None and processor.started is None
                        and not has_jobs(good)):
        # no job and no window: nothing is written (its nodes' inventory alone spans no
        # time). A run's end writes the latest state (running and pending attempts) as of
        # its input: a pod list of a header alone emptied it, and a pending pod an earlier
        # import had left vanished from ``attempts``
        return rejected
    digest = events_digest(good, processor.started, until)
    if not replace:
        refuse_replacing(processor.warehouse.store, span, digest, sources=sources)
    # recorded before it writes: a run killed part way is run again without --replace
    record_import(processor.warehouse.store, span, digest, sources)
    feed_in_time_order(processor, good, on_progress, until, before_flush, begin=begin)
    return rejected


def facts_begin(frames: Mapping[RecordType, pl.DataFrame], what: str) -> datetime | None:
    """Where the facts of an import or an ingest (``what``: "import", "input") begin
    when a few of its records come far before the rest, else None. A pod list of sixteen
    pods, one created two years before the others, had an import walk those two years
    minute by minute (more than five minutes, hundreds of files); a submission dated six
    years early made an ingest write gigabytes of empty facts. Far is more than
    :data:`EARLY_FACTS`, and twice the spread of the middle half of the event times,
    before their first quartile: a history spread over months begins where it does. The
    records before it only update the books (the pod's attempt, the node's capacity; the
    processor counts them early); a warning says so. One rule for every input, however
    few its records (quartiles, not percentiles: the 1st percentile of sixteen times is
    the first)."""
    return _begin(frames, _event_times(frames), what)


def _begin(frames: Mapping[RecordType, pl.DataFrame], times: pl.DataFrame | None,
           what: str) -> datetime | None:
    """:func:`facts_begin` of ``frames``, whose event times are ``times``. Only job and
    inventory records count as early: telemetry that far is set aside
    (:func:`set_aside_outliers`; a stray sample from 2000 had the run walk 31 days)."""
    books = _event_times({k: f for k, f in frames.items() if k != "telemetry"})
    if times is None or books is None:
        return None
    first = cast(datetime, books["time"].min())
    q1, q3 = times.select(pl.col("time").quantile(0.25, "lower").alias("q1"),
                          pl.col("time").quantile(0.75, "higher").alias("q3")).row(0)
    start: datetime = (q1 - max(EARLY_FACTS, 2 * (q3 - q1))).replace(second=0, microsecond=0)
    if first >= start:
        return None
    early = books.filter(pl.col("time") < start).height
    log.warning("%d record(s) come up to %.1f days before the bulk of the %s (first "
                "quartile %s): the facts begin at %s, %.0f days before it, and the records "
                "before that only update the books", early,
                (q1 - first).total_seconds() / 86400, what, f"{q1:%Y-%m-%d %H:%M} UTC",
                f"{start:%Y-%m-%d %H:%M} UTC", (q1 - start).total_seconds() / 86400)
    return start


def _event_times(frames: Mapping[RecordType, pl.DataFrame]) -> pl.DataFrame | None:
    """The ``time`` column of every record of ``frames``, in one frame; None without any."""
    times = [f.select("time") for f in frames.values() if not f.is_empty()]
    return pl.concat(times) if times else None


def has_jobs(frames: Mapping[Any, pl.DataFrame]) -> bool:
    """Whether an importer's frames hold a job event (without one, and without a window,
    an import changes nothing: :func:`import_history`)."""
    jobs = frames.get("job")
    return jobs is not None and not jobs.is_empty()


def _event_span(frames: Mapping[RecordType, pl.DataFrame]) -> tuple[datetime, datetime] | None:
    """The first and the newest event time of ``frames``; None without events."""
    times: list[datetime] = [t for f in frames.values() if not f.is_empty()
                             for t in f.select(pl.col("time").min(), pl.col("time").max()
                                               .alias("newest")).row(0)]
    return (min(times), max(times)) if times else None


def _import_span(processor: Processor, frames: dict[RecordType, pl.DataFrame],
                 until: datetime | None) -> tuple[datetime, datetime] | None:
    """The hours an import's run writes: from the hour of its first minute (its window's
    start, else its first event) to its end (``until``, else its newest event); None
    without events."""
    events = _event_span(frames)
    if events is None:
        return None
    start = processor.started if processor.started is not None else events[0]
    return floor_hour(start), until if until is not None else events[1]


def floor_hour(t: datetime) -> datetime:
    return t.replace(minute=0, second=0, microsecond=0)


class _Sha256Sink:
    """A write-only file that only hashes what is written to it."""

    def __init__(self, digest: Any) -> None:
        self.digest = digest

    def write(self, data: bytes) -> int:
        self.digest.update(data)
        return len(data)

    def flush(self) -> None:
        pass


def events_digest(frames: dict[RecordType, pl.DataFrame], start: datetime | None,
                  until: datetime | None) -> str:
    """What names an import's input: its validated events (Arrow IPC bytes, hashed as
    they are written, not held) and window."""
    digest = hashlib.sha256(f"{start} {until}".encode())
    for kind in sorted(frames):
        digest.update(kind.encode())
        # (a BytesIO held the whole IPC image: 323 MiB more peak for 25 M rows; 8 here)
        frames[kind].write_ipc(cast(IO[bytes], _Sha256Sink(digest)),
                               compression="uncompressed")
    return digest.hexdigest()


def file_digest(path: Path) -> str:
    """The SHA-256 of a file's bytes (``hashlib.file_digest``: read in pieces)."""
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _imports(store: Store) -> list[dict[str, Any]]:
    try:
        data = store.read(IMPORTS)
        doc = json.loads(data) if data else {}
        entries = doc.get("imports", []) if isinstance(doc, dict) else []
        return [e for e in entries if isinstance(e, dict)]
    except (OSError, ValueError, RecursionError):
        return []


def fact_hours(store: Store, span: tuple[datetime, datetime]) -> list[datetime]:
    """The hours (days, once compacted) in ``span`` that published ``gpu_hourly`` or
    ``job_attempts`` parts cover (``compaction.part_span`` of their logical names)."""
    found: set[datetime] = set()
    for manifest in read_manifests(store).values():
        for logical in manifest.files:
            covered = (part_span(logical)
                       if logical.split("/")[1:2] in (["gpu_hourly"], ["job_attempts"])
                       else None)
            if covered is not None and covered[0] < span[1] and covered[1] > span[0]:
                found.add(max(covered[0], span[0]))
    return sorted(found)


def _span_of(entry: dict[str, Any]) -> tuple[datetime, datetime] | None:
    try:
        return (datetime.fromisoformat(entry["from"]), datetime.fromisoformat(entry["to"]))
    except (KeyError, TypeError, ValueError):
        return None


def _written_by_part_of(entries: list[dict[str, Any]], hours: list[datetime],
                        sources: Sequence[str]) -> bool:
    """Whether each of ``hours`` lies in the span of an import whose input files are all
    among ``sources``."""
    ours = set(sources)
    spans = [span for e in entries
             if isinstance(e.get("sources"), list) and e["sources"]
             and set(e["sources"]) <= ours and (span := _span_of(e)) is not None]
    return bool(ours) and all(any(a <= h <= b for a, b in spans) for h in hours)


def refuse_replacing(store: Store, span: tuple[datetime, datetime], digest: str | None,
                     writer: str = "an import of these events did not write (an ingest, "
                     "the Kafka service, another file)", doing: str = "importing",
                     option: str = "--replace", sources: Sequence[str] = ()) -> None:
    """Refuse a run on its own over ``span`` where the warehouse holds facts that
    ``writer`` describes (none, an import of the events of ``digest``, or imports of some
    of the files of ``sources`` alone, wrote)."""
    hours = fact_hours(store, span)
    entries = _imports(store)
    if not hours or (digest is not None and any(e.get("digest") == digest for e in entries)
                     ) or _written_by_part_of(entries, hours, sources):
        return
    raise ImportRefused(
        f"the warehouse already holds facts in the hours this input covers "
        f"({span[0]:%Y-%m-%d %H:%M} to {span[1]:%Y-%m-%d %H:%M} UTC; from "
        f"{hours[0]:%Y-%m-%d %H:%M} UTC on) that {writer}: {doing} would replace them "
        "with this input's alone. Use a warehouse of its own (--warehouse), one input "
        f"covering the whole history, or pass {option} to replace them")


def record_import(store: Store, span: tuple[datetime, datetime], digest: str,
                  sources: Sequence[str] = ()) -> None:
    """Record an import over ``span``, in place of those it writes over."""
    entries = _outside(_imports(store), span)
    entries.append({"digest": digest, "from": span[0].astimezone(UTC).isoformat(),
                    "to": span[1].astimezone(UTC).isoformat(), "sources": list(sources)})
    store.write(IMPORTS, json.dumps({"imports": entries[-IMPORTS_KEPT:]}).encode())


def _forget_imports(store: Store, span: tuple[datetime, datetime]) -> None:
    """Take out the imports whose hours ``span`` overlaps (a run writing them makes
    their facts its own): a re-run of such an import is refused again."""
    entries = _imports(store)
    kept = _outside(entries, span)
    if len(kept) < len(entries):
        store.write(IMPORTS, json.dumps({"imports": kept}).encode())


def _outside(entries: list[dict[str, Any]], span: tuple[datetime, datetime]
             ) -> list[dict[str, Any]]:
    """The recorded imports whose hours ``span`` does not overlap."""
    return [e for e in entries if (s := _span_of(e)) is not None
            and not (s[0] <= span[1] and span[0] <= s[1])]


def feed_in_time_order(
    processor: Processor,
    frames: dict[RecordType, pl.DataFrame],
    on_progress: Callable[[float], None] | None = None,
    until: datetime | None = None,
    before_flush: Callable[[], None] | None = None,
    begin: datetime | None = None,
) -> None:
    """Feed validated frames to ``processor`` in event-time slices, then flush (every
    minute before ``until`` when given, else up to the newest event); ``before_flush``
    runs once every slice is in, before the flush. ``begin``: the slices start there,
    the events before it all in the first (the processor began there: they only update
    its books, and it counts them early)."""
    # (an importer's frames come in time order: not sorted again, but in one chunk, as
    # the sort left them: sliced by day from several chunks, 14 days of a 10,240-GPU
    # cluster took 30 % more CPU)
    ordered = {k: f.rechunk() if f["time"].is_sorted() else f.sort("time", maintain_order=True)
               for k, f in frames.items() if not f.is_empty()}
    if not ordered:
        if before_flush is not None:
            before_flush()
        processor.flush(until)
        return
    first: datetime = min(f["time"][0] for f in ordered.values())
    if begin is not None and begin > first:
        first = begin
    last: datetime = max(f["time"][-1] for f in ordered.values())
    step = (telemetry_slice(ordered["telemetry"].height, last - first)
            if "telemetry" in ordered else HISTORY_SLICE)
    start = first.replace(second=0, microsecond=0)
    offsets = dict.fromkeys(ordered, 0)
    total = max((last - start).total_seconds(), 1.0)
    while start <= last:
        end = start + step
        batch: dict[str, pl.DataFrame] = {}
        for kind, frame in ordered.items():
            stop = int(frame["time"].search_sorted(end, side="left"))
            if stop > offsets[kind]:
                batch[kind] = frame.slice(offsets[kind], stop - offsets[kind])
                offsets[kind] = stop
        # the last slice's minutes are closed by the flush below, in the same pass
        processor.process(batch, validated=True, close=end <= last)
        start = end
        if on_progress is not None:
            on_progress(min((start - first).total_seconds() / total, 1.0))
    if before_flush is not None:
        before_flush()
    processor.flush(until)


OUTLIER_MARGIN = timedelta(days=7)
"""The least distance from the bulk of an ingest's event times at which an event is set
aside as an outlier (``set_aside_outliers``)."""
EARLY_FACTS = timedelta(days=31)
"""How far before the bulk of an ingest's event times its facts may start, at least: an
earlier job or inventory record only updates the books (``set_aside_outliers``)."""


@dataclass(frozen=True)
class Outliers:
    """What :func:`set_aside_outliers` found: the rejects, and where the facts begin
    when early records would have them start far before the bulk (else None)."""

    rejects: pl.DataFrame
    begin: datetime | None = None


def set_aside_outliers(frames: dict[RecordType, pl.DataFrame], config: ProcessorConfig
                       ) -> tuple[dict[RecordType, pl.DataFrame], Outliers]:
    """Events far outside the input's own time range are set aside as rejects, with their
    reason: telemetry further before its 1st percentile of event times than
    ``windows.max_behind_s``, and any event after its 99th than ``windows.max_ahead_s``,
    than the input's own span between the two, and than :data:`OUTLIER_MARGIN` (a line
    from a wrong year, a clock months ahead; not a job that ends hours after a burst of
    submissions). They would otherwise make the processor walk the empty years between,
    or close minutes no other event reached. Inventory and job events are not set aside
    for being early: a node's record written when it joined, or a long job's submission
    and start, precede the bulk of a history by days (setting them aside left the nodes
    without capacity and the jobs without attempts); the run then covers that time, and
    a warning says so. Further before (:func:`facts_begin`, the rule of imports too), the
    facts begin later, and such records only update the books (the node's capacity, the
    job's attempt), as a window of a history does."""
    times = _event_times(frames)
    begin = _begin(frames, times, "input")
    if times is None or times.height < 20:
        return frames, Outliers(pl.DataFrame(schema=REJECT_SCHEMA), begin)
    lo, hi = times.select(pl.col("time").quantile(0.01, "lower"),
                          pl.col("time").quantile(0.99, "higher").alias("h")).row(0)
    w = config.windows
    margin = max(hi - lo, OUTLIER_MARGIN)
    behind = lo - max(timedelta(seconds=w.max_behind_s), margin)
    late = hi + max(timedelta(seconds=w.max_ahead_s), margin)
    fmt = "%Y-%m-%dT%H:%M:%S%.3fZ"
    kept: dict[RecordType, pl.DataFrame] = {}
    out: list[pl.DataFrame] = []
    before = pl.col("time") < pl.lit(behind).cast(TIME_DTYPE)
    # no sample before the facts begin; other records there only update the books
    facts = (pl.lit(True) if begin is None
             else pl.col("time") >= pl.lit(begin).cast(TIME_DTYPE))
    for kind, frame in frames.items():
        outside = pl.col("time") > pl.lit(late).cast(TIME_DTYPE)
        if kind == "telemetry":
            outside = outside | before | ~facts
        elif not frame.is_empty():
            between = frame.filter(before & facts)
            if between.height:
                log.warning("%s %s record(s) come %.1f days before the bulk of the input "
                            "(1st percentile %s): the facts cover the time between",
                            between.height, kind,
                            (lo - between["time"].min()).total_seconds() / 86400,
                            f"{lo:%Y-%m-%d %H:%M} UTC")
        bad = frame.filter(outside)
        kept[kind] = frame.filter(~outside) if not bad.is_empty() else frame
        if bad.is_empty():
            continue
        reason = (pl.lit("field 'time': ") + pl.col("time").dt.strftime(fmt)
                  + pl.lit(f" is far outside the input's time range ({lo:%Y-%m-%dT%H:%MZ}"
                           f" … {hi:%Y-%m-%dT%H:%MZ}, 1st to 99th percentile; "
                           f"windows.max_behind_s {w.max_behind_s}, "
                           f"windows.max_ahead_s {w.max_ahead_s})"))
        out.append(bad.select(
            pl.lit(kind).alias("record_type"), pl.lit("ingest").alias("source"),
            pl.lit(None, pl.Int64).alias("line"), reason.alias("reason"),
            pl.Series("raw", encode_jsonl(bad, kind).decode().splitlines(), pl.String)))
    return kept, Outliers(pl.concat(out) if out else pl.DataFrame(schema=REJECT_SCHEMA), begin)


def first_record_before(paths: Sequence[Path], before: datetime,
                        frames: Mapping[RecordType, pl.DataFrame], rejects: pl.DataFrame,
                        held: set[tuple[str, datetime]] | None = None) -> str | None:
    """Where the first record of ``paths`` (in file order) dated before ``before`` is,
    among those ingest kept (``frames``; a rejected line, ``rejects``, or one set aside
    outside its type's kept times is not), and how many there are:
    ``1 in all, the first f.jsonl:721 (a job record at 2026-01-06 00:45:00 UTC)``. None:
    none found (a file changed since, or cannot be read). ``held``: the (node, time) of
    inventory records left out as held already (:func:`drop_held_inventory`), not
    counted. Reads the files again: for a refusal's message only."""
    bad = {(src, line) for src, line in rejects.select("source", "line").iter_rows()
           if line is not None}
    kept = {kind: (cast(datetime, f["time"].min()), cast(datetime, f["time"].max()))
            for kind, f in frames.items() if not f.is_empty()}
    found: tuple[str, int, str, datetime] | None = None
    count = 0
    for path in paths:
        source = str(path)
        try:
            with gzip.open(path, "rb") if path.suffix == ".gz" else path.open("rb") as fh:
                for number, line in enumerate(fh, 1):
                    if b'"time"' not in line or (source, number) in bad:
                        continue
                    try:
                        doc = orjson.loads(line)
                        kind, when = doc["type"], datetime.fromisoformat(doc["time"])
                    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
                        continue
                    when = when if when.tzinfo else when.replace(tzinfo=UTC)
                    if held and kind == "inventory" and (doc.get("node"), when.replace(
                            microsecond=when.microsecond // 1000 * 1000)) in held:
                        continue
                    if kind in kept and when < before \
                            and kept[kind][0] <= when.replace(microsecond=when.microsecond
                                                             // 1000 * 1000) <= kept[kind][1]:
                        count += 1
                        if found is None:
                            found = (source, number, kind, when.astimezone(UTC))
        except (OSError, EOFError, zlib.error):
            return None
    if found is None:
        return None
    source, number, kind, when = found
    return (f"{count:,} in all, the first {source}:{number} (a {kind} record at "
            f"{when:%Y-%m-%d %H:%M:%S} UTC)")


_NODE_STATE = [c for c in INVENTORY_STATE_SCHEMA.names() if c != "time"]


def _state_book(root: Store, folder: str) -> pl.DataFrame | None:
    """The inventory book of a saved state (None: it cannot be read)."""
    try:
        doc = CheckpointStore(root.child(folder), "ingest").read_global()
        book = None if doc is None else doc.get("inventory")
    except Exception:  # damaged, another release's: continue_previous says so
        return None
    return book.records if isinstance(book, InventoryBook) else None


def _held(inventory: pl.DataFrame, book: pl.DataFrame) -> pl.Series:
    """Whether each record of ``inventory`` is a node state ``book`` already holds: the
    book's record of its node in effect at its time (the newest at or before it) has
    the same attributes (inventory records are states: a repeat changes nothing)."""
    names = INVENTORY_STATE_SCHEMA.names()
    attrs = [c for c in _NODE_STATE if c != "node"]
    left = inventory.select(names).with_row_index("_row").sort("node", "time")
    right = (book.select(names).sort("node", "time")
             .rename({c: f"_book_{c}" for c in attrs})
             .with_columns(pl.lit(True).alias("_book_hit")))
    joined = left.join_asof(right, on="time", by="node", strategy="backward",
                            check_sortedness=False).sort("_row")
    same = pl.all_horizontal([pl.col("_book_hit").fill_null(False)]
                             + [pl.col(c).eq_missing(pl.col(f"_book_{c}")) for c in attrs])
    return joined.select(same.alias("held")).to_series()


def drop_held_inventory(frames: dict[RecordType, pl.DataFrame], root: Store
                        ) -> tuple[dict[RecordType, pl.DataFrame], int, datetime | None,
                                   set[tuple[str, datetime]]]:
    """A piece given with the inventory file of the whole history again (its records
    dated at the history's start, or any time before the state it goes on from): the
    records before that state that the history already holds, the same node states as
    its book's, are left out (they change nothing). Without this, those records made
    the piece start where the history starts: it was processed on its own, as the whole
    history, and replaced every hour before it with nothing, in silence; an inventory
    file alone did that too, and deleted every later state.

    The state is the one the piece's other records go on from (the one closed furthest
    at or before its first telemetry or job record; for an inventory file alone, the
    history's end), else the earliest saved (the piece is then refused by
    :func:`continue_previous`, naming its first other record). Only for a piece that
    does not itself start where the history starts (its other records come after the
    history's first event: else it is the history's first piece again, processed on its
    own as before). An inventory record before that state that the history does not
    hold (a node state it never had there) is left in: :class:`IngestRefused` (by the
    caller, naming it), as for any other older record.

    Returns the frames (without the held records), how many were left out, the closed
    point of the state they were compared with, and the held records' (node, time)."""
    inventory = frames.get("inventory")
    if inventory is None or inventory.is_empty():
        return frames, 0, None, set()
    states = saved_states(root)
    if not states:
        return frames, 0, None, set()
    rest = [cast(datetime, f["time"].min()) for k, f in frames.items()
            if k != "inventory" and not f.is_empty()]
    if rest:
        rest_first = min(rest)
        origin = read_origin(root)
        if origin is None or rest_first <= origin:
            return frames, 0, None, set()
        fitting = [s for s in states if s.closed <= rest_first]
        state = fitting[0] if fitting else states[-1]
    else:
        state = states[0]
    older = inventory.filter(pl.col("time") < state.closed)
    if older.is_empty():
        return frames, 0, None, set()
    book = _state_book(root, state.folder)
    if book is None:  # not readable: continue_previous says so where it matters
        return frames, 0, None, set()
    held = _held(inventory, book) & (inventory["time"] < state.closed)
    if not held.any():
        return frames, 0, state.closed, set()
    keys = {(n, t) for n, t in inventory.filter(held).select("node", "time").iter_rows()}
    return ({**frames, "inventory": inventory.filter(~held)}, int(held.sum()),
            state.closed, keys)


def _refuse_older_inventory(paths: Sequence[Path], frames: Mapping[RecordType, pl.DataFrame],
                            rejects: pl.DataFrame, root: Store, before: datetime | None,
                            held: set[tuple[str, datetime]]) -> None:
    """:class:`IngestRefused` where inventory records dated before the state the input
    goes on from (``before``, :func:`drop_held_inventory`) are node states the history
    does not hold there: processed on its own, the input would replace the history's
    hours; going on, they would come after their minutes closed."""
    inventory = frames.get("inventory")
    if before is None or inventory is None \
            or inventory.filter(pl.col("time") < before).is_empty():
        return
    states = saved_states(root)
    which = first_record_before(paths, before, frames, rejects, held)
    older = cast(datetime, inventory.filter(pl.col("time") < before)["time"].min())
    raise _older_than_history(
        read_origin(root), states[0].closed if states else None,
        f"the saved state it can go on from (closed at {before:%Y-%m-%d %H:%M} UTC), "
        "inventory records that the history does not hold (other node states)",
        which or f"the first at {older:%Y-%m-%d %H:%M:%S} UTC")


def _older_than_history(origin: datetime | None, end: datetime | None, than: str,
                        which: str) -> IngestRefused:
    """The refusal of an input holding records older than the end of the history
    ingested (from ``origin`` to ``end``, when known) and than ``than`` (the saved
    states it could go on from), the first of them ``which``: a later piece cannot add
    them, only the whole history again can."""
    span = ("" if origin is None or end is None else
            f" ({origin:%Y-%m-%d %H:%M} to {end:%Y-%m-%d %H:%M} UTC)")
    return IngestRefused(
        f"the input holds records older than the end of the history already ingested"
        f"{span} and than {than}, {which}: a later piece cannot add them. Ingest the "
        "whole history again with this input, every file in one run (into this warehouse "
        "or a new one)")


def ingest(
    paths: Sequence[Path],
    warehouse: str | Path,
    config: ProcessorConfig,
    on_progress: Callable[[float], None] | None = None,
    afresh: bool = False,
) -> IngestResult:
    """Decode ``paths`` and process them into ``warehouse`` (``afresh``: on their own,
    whatever the saved states, :func:`continue_previous`). Input with no valid record
    changes nothing (``nothing``)."""
    parts: dict[RecordType, list[pl.DataFrame]] = {k: [] for k in RECORD_TYPES}
    rejects: list[pl.DataFrame] = []
    for decoded in decode_jsonl_files(list(paths), max_future_s=config.windows.max_future_s,
                                      limits=config.limits):
        for kind in RECORD_TYPES:
            frame = decoded.frames[kind]
            if not frame.is_empty():
                parts[kind].append(frame)
        if not decoded.rejects.is_empty():
            rejects.append(decoded.rejects)
    frames: dict[RecordType, pl.DataFrame] = {
        k: pl.concat(v) if v else empty_frame(k) for k, v in parts.items()
    }
    all_rejects = pl.concat(rejects) if rejects else pl.DataFrame(schema=REJECT_SCHEMA)
    if _event_span(frames) is None:  # nothing to process: the warehouse is left as it was
        return IngestResult({k: 0 for k in frames}, all_rejects, Counters(), None,
                            nothing=True)
    processor = Processor(config, Warehouse(warehouse, options=config.warehouse))
    states = ingest_states(processor)
    held, held_before, held_keys = 0, None, set[tuple[str, datetime]]()
    if not afresh:
        frames, held, held_before, held_keys = drop_held_inventory(frames, states)
        _refuse_older_inventory(paths, frames, all_rejects, states, held_before,
                                held_keys)
    if _event_span(frames) is None:  # the history holds every record: nothing is new
        return IngestResult({k: 0 for k in frames}, all_rejects, Counters(), None,
                            nothing=True, held=held, held_before=held_before)
    frames, outliers = set_aside_outliers(frames, config)
    if not outliers.rejects.is_empty():
        all_rejects = pl.concat([all_rejects, outliers.rejects])
    events = _event_span(frames)
    assert events is not None
    first, newest = events
    if outliers.begin is not None:
        first = outliers.begin
    continued = continue_previous(
        processor, states, first, afresh, last=newest,
        locate=lambda before: first_record_before(paths, before, frames, all_rejects,
                                                  held_keys))
    began = continued is None and outliers.begin is not None
    if began:
        processor.begin_at(cast(datetime, outliers.begin))
    never_ingested = read_origin(states) is None
    replaced_from = None if continued is not None or never_ingested else floor_hour(first)
    if continued is None and not afresh and never_ingested:
        # nothing was ingested here before: facts in these hours came from elsewhere
        refuse_replacing(processor.warehouse.store, (floor_hour(first), newest), None,
                         "no ingest wrote (an import, the Kafka service, the demo)",
                         "ingesting", "--afresh")
    if never_ingested:
        # said before anything is written: a run killed part way is run again as it was
        _keep_origin(states, first, None)
    # the facts of imports in these hours become this ingest's
    _forget_imports(processor.warehouse.store, (floor_hour(first), newest))
    processor.add_rejects(all_rejects)
    run = Run(uuid.uuid4().hex, first)
    open_from: datetime | None = None

    def before_flush() -> None:
        nonlocal open_from
        open_from = save_inside_last_minute(processor, states, run, continued)

    feed_in_time_order(processor, frames, on_progress, before_flush=before_flush,
                       begin=outliers.begin)
    closed = [processor.part_closed[p] for p in processor.held if p in processor.part_closed]
    stale = read_origin(states, "stale_from")
    if continued is None and closed and _forget_later(states, max(closed)):
        stale = max(closed)
    elif continued is not None and continued == stale:
        stale = None   # the history after it is being ingested again
    pruned = save_state(processor, states, KEEP_STATES, run)
    _keep_origin(states, first, stale, pruned)
    return IngestResult({k: f.height for k, f in frames.items()}, all_rejects,
                        processor.counters, continued,
                        closed_to=max(closed) if closed else None, open_from=open_from,
                        facts_begin=outliers.begin if began else None,
                        early={"job": processor.counters.early_job_events,
                               "inventory": processor.counters.early_inventory},
                        held=held, held_before=held_before,
                        replaced_from=replaced_from)
