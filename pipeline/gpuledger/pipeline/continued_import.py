"""Scheduler history imported export by export: today's ``sacct`` export alone goes on
from where the warehouse's history ends.

Sites export ``sacct`` by day (a cron). Importing every export again each day costs the
whole history each day; importing today's alone was refused, since its jobs running at
the cut reach back into hours the earlier imports wrote. So each ``import slurm-sacct``
saves the engine's state where its input's knowledge ends (:class:`_StateSaver`;
``SACCT_STATES``, one folder per closed point, as ``gpuledger ingest`` keeps its
states), with the digests of every file the history up to there was read from
(``SOURCES_FILE``). An import of files none of which
that history holds goes on from the state: the job book, the GPUs each running attempt
holds and the inventory come from it, the export's events before its point are the
history's (``importers/slurm_sacct.py``, ``_after_history``), and the facts from there on
are written as one import of the whole history would write them (``--nodes`` given; an
inferred inventory grows where a later export first shows a node).

Which state an import goes on from (:func:`plan`): the one closed furthest whose history
holds none of the files given. That is the newest for a new export, and the one before
it for the same export imported again (a re-run; the states of ``STATES_KEPT`` imports
are kept). Files of the history given again with new ones (every export, yesterday's and
today's) are imported on their own, as before, and replace the history's facts.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import polars as pl

from gpuledger.pipeline.importers.slurm_sacct import History, SacctImport
from gpuledger.pipeline.ingest import (
    ImportRefused,
    Run,
    SavedState,
    continue_previous,
    delete_state,
    events_digest,
    feed_in_time_order,
    floor_hour,
    import_history,
    record_import,
    refuse_replacing,
    save_inside_last_minute,
    save_state,
    saved_states,
)
from gpuledger.pipeline.processor import Processor
from gpuledger.pipeline.state.inventory import INVENTORY_STATE_SCHEMA
from gpuledger.pipeline.store import Store
from gpuledger.pipeline.validate import MIN_TIME, validate

SACCT_STATES = "state/import-slurm-sacct"
"""Where ``import slurm-sacct`` keeps the engine's state after each import."""
STATES_KEPT = 3
"""The states of this many imports are kept: the newest (today's export goes on from
it), and those before it, for an export imported again (the cron run twice) and one
given again with the next. A state holds the job book and the open hour: about 12 MB
for a 10,240-GPU cluster."""
SOURCES_FILE = "sources.json"
"""In each state's folder: ``{"sources": [...], "from": ...}``, the SHA-256 of every file
the history up to the state was read from, and the hour its facts start."""


@dataclass(frozen=True)
class Plan:
    """Where an import goes on from: a saved state and the history it holds (None: the
    import is processed on its own)."""

    state: SavedState | None = None
    sources: frozenset[str] = frozenset()
    """The files the history up to the state was read from."""
    start: datetime | None = None
    """The hour the history's facts start."""


def _sources_of(root: Store, state: SavedState) -> tuple[frozenset[str], datetime] | None:
    try:
        doc = json.loads(root.read(f"{state.folder}/{SOURCES_FILE}") or b"null")
        return frozenset(str(s) for s in doc["sources"]), datetime.fromisoformat(doc["from"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def plan(root: Store, sources: Sequence[str]) -> Plan:
    """The state an import of the files ``sources`` goes on from: the one closed
    furthest whose history holds none of them. Refused (:class:`ImportRefused`) when the
    history goes on past that state with files not given: going on would replace their
    facts with these files' alone."""
    given = set(sources)
    later: set[str] = set()
    for state in saved_states(root):
        known = _sources_of(root, state)
        if known is None:
            continue
        held, start = known
        if held & given:
            later |= held
            continue
        if not held:
            break
        missing = later - held - given
        if missing:
            raise ImportRefused(
                f"these files would go on from the warehouse's Slurm history at "
                f"{state.closed:%Y-%m-%d %H:%M} UTC, but it goes on past there with "
                f"{len(missing)} export(s) not given here: their facts would be replaced "
                "by these files' alone. Give those exports too, or import every export "
                "together")
        return Plan(state, held, start)
    return Plan()


def history_of(processor: Processor, closed: datetime) -> History:
    """What ``processor`` (a saved state taken in) holds for an import going on."""
    jobs, w = processor.jobs.jobs, processor.config.windows
    newest = processor.inventory.records.sort("time").group_by("node", maintain_order=True) \
        .agg(pl.all().last()).select([c for c in INVENTORY_STATE_SCHEMA.names() if c != "time"])
    return History(
        closed=closed,
        seen={job_id: job.seen for job_id, job in jobs.items()},  # read before any apply
        running={job_id: (job.started_at, [(a["node"], a["gpu_index"], a["fraction"])
                                           for a in job.allocation])
                 for job_id, job in jobs.items()
                 if job.status == "running" and job.started_at is not None},
        forgets_before=closed - timedelta(seconds=w.handover_retention_s
                                          + w.ended_job_memory_s),
        inventory=newest)


def _forget_states(root: Store) -> None:
    for state in saved_states(root):
        delete_state(root, state.folder, "a replaced")


class _StateSaver:
    """Saves the state the next export goes on from, where this input's knowledge ends,
    with the files its history holds. That is the start of the minute its newest event
    falls inside, before the flush closes that minute (``save_inside_last_minute``, as
    ingest saves it for a file cut mid-minute): an export cut at 10:27:06 whose newest
    event is 10:27:00 says nothing of 10:27:38, when a job of the next export ended
    (going on from 10:28 refused it). Unlike ingest, that is the only state saved. With
    ``until`` (the exports' end), where the newest event starts its minute, or when the
    run went on from a state closed in that minute (``continued``: not overwritten), the
    state is saved where the flush closes. ``replaces``: the input is processed on its
    own; the states of the history it replaces go first."""

    def __init__(self, processor: Processor, root: Store, run: Run,
                 sources: set[str] | frozenset[str], start: datetime,
                 until: datetime | None, continued: datetime | None) -> None:
        self.processor, self.root, self.run = processor, root, run
        self.sources, self.start, self.until, self.continued = sources, start, until, continued
        self.saved = False

    def before_flush(self) -> None:
        if self.until is None:
            self._forget_replaced()
            self.saved = save_inside_last_minute(self.processor, self.root, self.run,
                                                 self.continued, keep=STATES_KEPT) is not None

    def after_flush(self) -> None:
        if not self.saved:
            self._forget_replaced()
            save_state(self.processor, self.root, STATES_KEPT, self.run)
        for state in saved_states(self.root):  # the one this run saved (if it closed any)
            if state.run is not None and state.run.id == self.run.id:
                self.root.write(f"{state.folder}/{SOURCES_FILE}", json.dumps(
                    {"sources": sorted(self.sources),
                     "from": self.start.astimezone(UTC).isoformat()}).encode())

    def _forget_replaced(self) -> None:
        if self.continued is None:  # processed on its own: the history it replaces goes
            _forget_states(self.root)


def _refused(jobs: list[str], what: str, why: str) -> ImportRefused:
    """The refusal of an import for ``jobs``: how many, ``what`` of them, a few named,
    ``why`` and the remedy."""
    return ImportRefused(f"{len(jobs):,} job(s) {what} (e.g. {', '.join(jobs[:5])}): {why}")


def _count_after(imported: SacctImport, until: datetime | None) -> None:
    if until is not None:
        imported.events_after_until = sum(
            f.filter(f["time"] >= until).height for f in imported.frames.values()
            if not f.is_empty())


def import_exports(
    processor: Processor,
    sources: Sequence[str],
    load: Callable[[History | None], SacctImport],
    on_progress: Callable[[float], None] | None = None,
    replace: bool = False,
    until: datetime | None = None,
) -> tuple[SacctImport, int]:
    """Import the exports whose digests are ``sources`` (``load`` reads them, given the
    history they go on from) into ``processor``'s warehouse: going on from the history
    there (:func:`plan`), or on their own (``replace``, no history, or files of the
    history given again); the facts closed up to ``until`` (the exports' end) when
    given, else to the newest event. Returns what was imported and the number of events
    rejected."""
    root = processor.warehouse.store.child(SACCT_STATES)
    chosen = Plan() if replace else plan(root, sources)
    if chosen.state is None:
        imported = load(None)
        times = [t for f in imported.frames.values()
                 if isinstance(t := f["time"].filter(f["time"] >= MIN_TIME).min(), datetime)]
        first = min(times, default=None)
        saver = None if first is None else _StateSaver(
            processor, root, Run(uuid.uuid4().hex, first), set(sources), floor_hour(first),
            until, continued=None)
        _count_after(imported, until)
        rejected = import_history(processor, imported.frames, on_progress, until=until,
                                  replace=replace, sources=sources,
                                  before_flush=saver.before_flush if saver else None,
                                  let_go=True)
        if saver is not None:
            saver.after_flush()
        return imported, rejected
    closed = continue_previous(
        processor, root, chosen.state.closed, folder=SACCT_STATES,
        remedy="Import every export together, or pass --replace")
    assert closed is not None and chosen.start is not None
    if until is not None and until < closed:
        raise ImportRefused(
            f"--until {until:%Y-%m-%d %H:%M} UTC is before {closed:%Y-%m-%d %H:%M} UTC, "
            "where the warehouse's Slurm history these exports go on from ends")
    imported = load(history_of(processor, closed))
    _count_after(imported, until)
    good = {}
    rejected = 0
    for kind, frame in imported.frames.items():
        ok, bad = validate(frame, kind, limits=processor.config.limits)  # type: ignore[arg-type]
        processor.add_rejects(bad)
        rejected += bad.height
        good[kind] = ok
    imported.frames = {}  # validated: not held twice
    end = f"{closed:%Y-%m-%d %H:%M} UTC, where the warehouse's Slurm history ends"
    if imported.unknown_before:
        raise _refused(
            imported.unknown_before, f"in these exports have events before {end}, that it "
            "does not hold", "these exports do not go on from it (another cluster's, a gap "
            "between exports, a record changed since). Import every export together, or "
            "pass --replace to replace the history with these files' alone")
    if imported.running_missing:
        raise _refused(
            imported.running_missing, f"running at {end}, are in none of these exports",
            "sacct prints every job that ran in its window, so these exports start after "
            "the history's end (an export between them missing? another cluster's?). Going "
            "on, those jobs would hold their GPUs for ever. Import the missing export first "
            "(or with these), or every export together")
    newest = max((t for f in good.values() if isinstance(t := f["time"].max(), datetime)),
                 default=None)
    if until is not None and until > closed:
        newest = until if newest is None else max(newest, until)
    if newest is None:  # all of it is the history's already (a quiet day, a re-run)
        imported.unchanged = True
        return imported, rejected
    both = chosen.sources | set(sources)
    after = floor_hour(closed) + timedelta(hours=1)  # the hour of ``closed`` is its own
    if newest > after:
        refuse_replacing(processor.warehouse.store, (after, newest), None,
                         sources=sorted(both))
    record_import(processor.warehouse.store, (chosen.start, newest),
                  events_digest(good, closed, None), sorted(both))  # type: ignore[arg-type]
    saver = _StateSaver(processor, root, Run(uuid.uuid4().hex, closed), both, chosen.start,
                        until, continued=closed)
    feed_in_time_order(processor, good, on_progress, until,  # type: ignore[arg-type]
                       saver.before_flush)
    saver.after_flush()
    return imported, rejected
