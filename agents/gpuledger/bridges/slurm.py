"""The Slurm bridge: polls the controller, diffs, hands records over exactly once.

Each poll runs ``squeue --json --states=all --all`` and ``sinfo --json`` (Slurm with the
``serializer/json`` plugin, 21.08 and later) or, where JSON is not available,
``scontrol -o show job -d`` and ``scontrol -o show node -d``; the tracker
(:mod:`gpuledger.bridges.slurm_events`) turns the change since the last poll into
contract v1 job events and inventory records; the sink takes them; the state file keeps
the tracker's memory and the batch in flight (:mod:`gpuledger.bridges.state`) so that a
restart neither loses nor repeats a record. A poll whose commands fail changes nothing
(a controller outage does not look like every job vanishing).
"""

from __future__ import annotations

import logging
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuledger.bridges.output import Sink
from gpuledger.bridges.slurm_events import SlurmTracker, StepStats
from gpuledger.bridges.slurm_parse import (
    SlurmJob,
    SlurmNode,
    SlurmParseError,
    parse_scontrol_jobs,
    parse_scontrol_nodes,
    parse_sinfo_json,
    parse_squeue_json,
)
from gpuledger.bridges.state import StateError, load_state, save_state
from gpuledger.outage_log import OutageLog

log = logging.getLogger("gpuledger.bridges.slurm")

FORMATS = ("auto", "json", "text")


class SlurmCommandError(RuntimeError):
    """A Slurm command failed or printed something the bridge cannot read."""


Runner = Callable[[list[str]], str]


def run_command(argv: list[str], env: dict[str, str] | None = None,
                timeout_s: float = 60.0) -> str:
    """Run a Slurm client command; its standard output, or :class:`SlurmCommandError`."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, env=env,
                              check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SlurmCommandError(f"{' '.join(argv)}: {exc}") from None
    if done.returncode != 0:
        raise SlurmCommandError(f"{' '.join(argv)}: exit {done.returncode}: "
                                f"{done.stderr.strip()[:300]}")
    return done.stdout


@dataclass
class SlurmSource:
    """Reads jobs and nodes from the controller, as JSON where the version has it."""

    fmt: str = "auto"
    runner: Runner = field(default=run_command)
    resolved: str | None = None
    """The format in use once known (``json`` or ``text``)."""
    refused: dict[str, str] = field(default_factory=dict)
    """Jobs of the last :meth:`jobs` whose scontrol line could not be read safely (job id
    → reason): left out of the view, yet still in Slurm (the tracker keeps their memory)."""

    def jobs(self) -> list[SlurmJob]:
        self.refused = {}
        if self.fmt in ("auto", "json") and self.resolved != "text":
            try:
                jobs = parse_squeue_json(self.runner(["squeue", "--json", "--states=all",
                                                      "--all"]))
                self.resolved = "json"
                return jobs
            except (SlurmCommandError, SlurmParseError) as exc:
                if self.fmt == "json" or self.resolved == "json":
                    raise SlurmCommandError(str(exc)) from None
                log.info("squeue --json is not available (%s); using scontrol text", exc)
                self.resolved = "text"
        try:
            refused: dict[str, str] = {}
            jobs = parse_scontrol_jobs(self.runner(["scontrol", "-o", "show", "job", "-d"]),
                                       refused)
            self.refused = refused
            return jobs
        except SlurmParseError as exc:  # a failed poll, as in JSON: nothing changes
            raise SlurmCommandError(str(exc)) from None

    def nodes(self) -> list[SlurmNode]:
        try:
            if self.resolved == "json":
                return parse_sinfo_json(self.runner(["sinfo", "--json"]))
            return parse_scontrol_nodes(self.runner(["scontrol", "-o", "show", "node", "-d"]))
        except SlurmParseError as exc:
            raise SlurmCommandError(str(exc)) from None


def load_memory(tracker: SlurmTracker, doc: dict[str, Any], state_path: Path) -> None:
    """Give ``tracker`` the saved memory of a state file; :class:`StateError` when it is
    not a Slurm bridge's."""
    try:
        tracker.load_json(doc.get("memory", {}))
    except (TypeError, ValueError, AttributeError, KeyError, IndexError) as exc:
        raise StateError(f"{state_path}: not a Slurm bridge state file (memory: "
                         f"{type(exc).__name__}: {exc})") from None


@dataclass
class BridgeTotals:
    polls: int = 0
    failed_polls: int = 0
    events: int = 0
    inventory: int = 0
    start_unseen: int = 0
    before_bridge: int = 0
    requeue_unseen: int = 0
    vanished: int = 0
    recovered: int = 0
    """Records of an interrupted batch completed at start."""


class SlurmBridge:
    """One poll at a time: read, diff, save the outbox, hand over, save the memory."""

    def __init__(self, source: SlurmSource, tracker: SlurmTracker, sink: Sink,
                 state_path: Path, inventory_every: int = 1) -> None:
        self.source = source
        self.tracker = tracker
        self.sink = sink
        self.state_path = state_path
        self.inventory_every = max(1, inventory_every)
        self.totals = BridgeTotals()
        self.outage = OutageLog(log, "poll of Slurm")
        self._refused_said: set[str] = set()
        """Jobs left out whose warning was logged (once while they stay unreadable)."""
        doc = load_state(state_path)
        load_memory(tracker, doc, state_path)
        outbox = doc.get("outbox")
        if outbox:
            records = outbox["records"]
            sink.complete(outbox["position"], records)
            self.totals.recovered = len(records)
            log.info("completed an interrupted batch of %d records", len(records))
            save_state(state_path, {"memory": tracker.to_json(), "outbox": None})

    def poll(self, now: float | None = None) -> StepStats | None:
        """One poll; ``None`` when Slurm could not be read (nothing changes then)."""
        self.totals.polls += 1
        try:
            jobs = self.source.jobs()
            nodes = (self.source.nodes()
                     if (self.totals.polls - 1) % self.inventory_every == 0 else None)
        except SlurmCommandError as exc:
            self.totals.failed_polls += 1
            self.outage.failed(str(exc), "nothing changed")
            return None
        self.outage.worked("jobs and nodes read again")
        for job_id, reason in sorted(self.source.refused.items()):
            if job_id in self._refused_said:
                continue
            log.warning("job %s left out of this poll, its scontrol line cannot be read "
                        "safely: %s", job_id, reason)
        records, stats = self.tracker.step(jobs, nodes, time.time() if now is None else now,
                                           unreadable=set(self.source.refused))
        self._refused_said = set(self.source.refused)
        memory = self.tracker.to_json()
        if records:
            position = self.sink.position()
            save_state(self.state_path, {"memory": memory,
                                         "outbox": {"position": position, "records": records}})
            self.sink.complete(position, records)
        save_state(self.state_path, {"memory": memory, "outbox": None})
        self.sink.flush()
        t = self.totals
        t.events += stats.events
        t.inventory += stats.inventory
        t.start_unseen += stats.start_unseen
        t.before_bridge += stats.before_bridge
        t.requeue_unseen += stats.requeue_unseen
        t.vanished += stats.vanished
        return stats

    def run(self, interval_s: float, stop: threading.Event, once: bool = False) -> None:
        """Poll every ``interval_s`` seconds until ``stop`` is set (or once)."""
        while not stop.is_set():
            started = time.monotonic()
            stats = self.poll()
            if stats is not None and (stats.events or stats.inventory):
                log.info("poll: %d job events, %d inventory records", stats.events,
                         stats.inventory)
            if once:
                break
            stop.wait(max(0.0, interval_s - (time.monotonic() - started)))
        self.sink.close()
