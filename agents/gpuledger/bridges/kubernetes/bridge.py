"""The bridge's loop: list, then watch with resource versions; resume, relist, persist.

- On start, a resource with a saved ``resourceVersion`` is watched from there (a
  restart resumes where it stopped); one without is listed first. Nodes, Workloads and
  Pods are listed in that order, so that pods find their Workload.
- One thread per resource reads its watch stream; a single thread translates, so the
  translator needs no locks. A stream that ends (server timeout, dropped connection,
  read timeout) is resumed from the last resourceVersion seen.
- ``410 Gone`` (an HTTP status or an ``ERROR`` event): the resource is listed again and
  the list is diffed against what was already emitted (:meth:`Translator.relist`):
  changes missed during the gap are emitted once, nothing is repeated, objects missing
  from the list count as deleted.
- Hand-over is exactly once, with the shared protocol of the bridges
  (:mod:`gpuledger.bridges.state`, :mod:`gpuledger.bridges.output`): the state file
  first records the batch and the sink's position together with the new translator
  state and resourceVersions, then the sink takes the batch, then the outbox is
  cleared; after a crash the bridge completes an interrupted batch before anything else.
- A malformed answer (a watch line that is not an event, a list cut short or not of a
  list's shape) is a warning and a count (``Stats.malformed``); the watch resumes from
  the last good version. An unexpected error in a watch thread ends :meth:`run` with
  :class:`WatcherDied` instead of watching blind. A stop cuts lists and watches in flight.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from functools import partial
from typing import Any

from gpuledger.bridges.kubernetes.api import (
    ApiClient,
    ApiError,
    Gone,
    MalformedResponse,
    Stopped,
)
from gpuledger.bridges.kubernetes.config import BridgeConfig
from gpuledger.bridges.kubernetes.translate import Record, Translator
from gpuledger.bridges.output import Sink
from gpuledger.bridges.state import load_state, save_state
from gpuledger.outage_log import OutageLog, error_text

log = logging.getLogger("gpuledger.bridges.kubernetes")

PATHS = {
    "nodes": "/api/v1/nodes",
    "workloads": "/apis/kueue.x-k8s.io/v1beta1/workloads",
    "pods": "/api/v1/pods",
}
STATE_VERSION = 1
BATCH = 1000  # watch events translated per hand-over (one state write per batch)
RETRY_FIRST_S = 0.5
"""The wait before a failed list or watch is tried again; it doubles at each failure in a
row, up to :data:`RETRY_MAX_S`."""
RETRY_MAX_S = 30.0


class WatcherDied(OSError):
    """A watch thread ended on an unexpected error: the bridge stops rather than run
    without that resource's changes."""


@dataclass
class Stats:
    """What the bridge did (also logged)."""

    lists: dict[str, int] = field(default_factory=dict)
    relists: dict[str, int] = field(default_factory=dict)
    resumes: dict[str, int] = field(default_factory=dict)
    events: dict[str, int] = field(default_factory=dict)
    malformed: dict[str, int] = field(default_factory=dict)
    records: int = 0

    def bump(self, counter: dict[str, int], resource: str) -> None:
        counter[resource] = counter.get(resource, 0) + 1


class Bridge:
    """Kubernetes/Kueue → contract records, into a sink."""

    def __init__(self, config: BridgeConfig, client: ApiClient, sink: Sink,
                 clock: Callable[[], datetime] | None = None) -> None:
        self.config = config
        self.client = client
        self.sink = sink
        saved = load_state(config.state_file)
        if saved and saved.get("version") != STATE_VERSION:
            raise ValueError(f"{config.state_file}: not a Kubernetes bridge state file "
                             f"(version {saved.get('version')!r})")
        self.versions: dict[str, str] = dict(saved.get("resource_versions") or {})
        self.translator = Translator(config.mapping, config.options,
                                     clock or (lambda: datetime.now(UTC)),
                                     saved.get("translator") or {})
        self.stats = Stats()
        self.resources = [r for r in PATHS if r != "workloads" or config.options.kueue]
        self._stop = threading.Event()
        self.outage_clock: Callable[[], float] = time.monotonic
        """The clock of the watches' outage lines (``outage_log``)."""
        self._last_save = 0.0
        self._last_tick = 0.0
        outbox = saved.get("outbox")
        if outbox:
            sink.complete(int(outbox["position"]), outbox["records"])
            log.info("completed an interrupted batch of %d records", len(outbox["records"]))
            self._save()

    # -- one pass ----------------------------------------------------------------------

    def _list(self, resource: str) -> list[Record]:
        try:
            items, version = self.client.list(PATHS[resource], self._selector(resource))
        except ApiError as exc:
            if resource == "workloads" and exc.status == 404:
                log.warning("Kueue's Workload API is not served (404); not watching "
                            "workloads, every GPU pod is a job of its own")
                self.resources.remove("workloads")
                self.translator.options = replace(self.translator.options, kueue=False)
                return []
            raise
        self.stats.bump(self.stats.lists, resource)
        self.versions[resource] = version
        return self.translator.relist(resource, items)

    def _selector(self, resource: str) -> str | None:
        return self.config.label_selector if resource == "pods" else None

    def sync(self) -> int:
        """List everything once (diffing against the saved state), emit, save."""
        total = 0
        for resource in list(self.resources):
            records = self._list(resource)
            self._emit(records, force_save=True)
            total += len(records)
        records = self.translator.tick()
        self._emit(records, force_save=False)
        return total + len(records)

    def _tick(self) -> list[Record]:
        """Grace-time starts, at most once a second."""
        now = time.monotonic()
        if now - self._last_tick < 1.0:
            return []
        self._last_tick = now
        return self.translator.tick()

    # -- watching ------------------------------------------------------------------------

    def stop(self) -> None:
        self._stop.set()

    def _cut_on_stop(self) -> None:
        self._stop.wait()
        self.client.abort()

    def run(self, stop: threading.Event | None = None) -> None:
        """Watch until :meth:`stop` (or until ``stop`` is set); a stop cuts the lists
        and watches in flight."""
        if stop is not None:
            self._stop = stop
        self.client.stop = self._stop
        threading.Thread(target=self._cut_on_stop, daemon=True, name="cut-on-stop").start()
        try:
            self._start()
        except Stopped:
            log.warning("stopped while listing; the next start lists again")
            self._stop.set()
            self._save()
            return
        inbox: queue.Queue[tuple[Any, ...]] = queue.Queue()
        threads = [threading.Thread(target=self._watch, args=(r, inbox), daemon=True,
                                    name=f"watch-{r}") for r in self.resources]
        for t in threads:
            t.start()
        try:
            while not self._stop.is_set():
                try:
                    item = inbox.get(timeout=0.2)
                except queue.Empty:
                    self._emit(self._tick(), force_save=False)
                    continue
                records = self._handle(item)
                for _ in range(BATCH - 1):  # hand over what is queued as one batch
                    try:
                        records += self._handle(inbox.get_nowait())
                    except queue.Empty:
                        break
                self._emit(records, force_save=False)
        finally:
            self._stop.set()
            for t in threads:
                t.join(timeout=self.config.read_timeout_s + 5)
            self._save()

    def _start(self) -> None:
        """List each resource that has no saved version (and emit what it implies)."""
        for resource in list(self.resources):
            if resource not in self.versions:
                self._emit(self._list(resource), force_save=True)

    def _handle(self, item: tuple[Any, ...]) -> list[Record]:
        if item[0] == "died":
            _, resource, exc = item
            raise WatcherDied(f"{resource}: the watch stopped on an unexpected error "
                              f"({type(exc).__name__}: {exc})")
        if item[0] == "list":
            _, resource, items, version = item
            self.stats.bump(self.stats.relists, resource)
            self.versions[resource] = version
            return self.translator.relist(resource, items)
        _, resource, kind, obj = item
        self.stats.bump(self.stats.events, resource)
        version = (obj.get("metadata") or {}).get("resourceVersion")
        records = [] if kind == "BOOKMARK" else self.translator.apply(resource, kind, obj)
        if version:
            self.versions[resource] = str(version)
        return records

    def _watch(self, resource: str, inbox: queue.Queue[tuple[Any, ...]]) -> None:
        version: str | None = self.versions.get(resource)
        backoff = RETRY_FIRST_S
        # an API server away is said at its start, once a minute and at its end (a
        # warning per retry was two a minute per resource at the 30 s backoff)
        outage = OutageLog(log, f"{resource}: watch", self.outage_clock)
        while not self._stop.is_set():
            try:
                if version is None:
                    items, version = self.client.list(PATHS[resource],
                                                      self._selector(resource))
                    outage.worked(f"listed {len(items):,} at resourceVersion {version}")
                    inbox.put(("list", resource, items, version))
                for kind, obj in self.client.watch(
                        PATHS[resource], version, self.config.watch_timeout_s,
                        self.config.read_timeout_s, self._selector(resource),
                        opened=partial(outage.worked,
                                       f"watching from resourceVersion {version}")):
                    seen = (obj.get("metadata") or {}).get("resourceVersion")
                    inbox.put(("event", resource, kind, obj))
                    if seen:
                        version = str(seen)
                    if self._stop.is_set():
                        return
                self.stats.bump(self.stats.resumes, resource)
                backoff = RETRY_FIRST_S
            except Stopped:
                return
            except Gone:
                log.info("%s: resourceVersion %s expired (410); listing again",
                         resource, version)
                version = None
            except (OSError, ApiError) as exc:
                if self._stop.is_set():
                    return
                if isinstance(exc, MalformedResponse):
                    # what the API sent, not an outage: each one said and counted
                    self.stats.bump(self.stats.malformed, resource)
                    log.warning("%s: watch failed (%s); retrying from resourceVersion %s "
                                "in %.1f s", resource, exc, version, backoff)
                else:
                    outage.failed(error_text(exc), f"resuming from resourceVersion {version}")
                self._stop.wait(backoff)
                backoff = min(backoff * 2, RETRY_MAX_S)
            except Exception as exc:  # handed to run(), which stops
                inbox.put(("died", resource, exc))
                return

    # -- output --------------------------------------------------------------------------

    def _emit(self, records: list[Record], force_save: bool) -> None:
        if records:
            position = self.sink.position()
            self._save({"position": position, "records": records})
            self.sink.complete(position, records)
            self.stats.records += len(records)
            self._save()
            self.sink.flush()
        elif force_save or time.monotonic() - self._last_save > 5.0:
            self._save()
            self.sink.flush()

    def _save(self, outbox: dict[str, Any] | None = None) -> None:
        save_state(self.config.state_file, {
            "version": STATE_VERSION, "resource_versions": self.versions,
            "translator": self.translator.state, "outbox": outbox})
        self._last_save = time.monotonic()


