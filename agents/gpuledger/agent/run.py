"""The agent loop: collect, attribute, number, encode, spool; a sender drains to Kafka.

Every ``interval_s`` the agent collects one sample per GPU (and MIG instance) from the
configured source, attributes processes and GPUs to jobs, stamps every sample with the
agent's own sequence number (``seq``, +1 per sample, continued across restarts from
the newest sample in the spool, so that gaps downstream mean lost samples) and appends
one JSON-lines message per collection to the spool, keyed by node. The inventory is re-read every
``inventory.check_s`` and spooled at start and whenever it changes. A sender thread
drains the spool into Kafka in order (``gpuledger.agent.sender``). SIGTERM (or
SIGINT) finishes the current collection, gives the sender ``kafka.send_timeout_s`` to
deliver what is spooled, and exits; what it could not deliver stays in the spool for
the next start.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections import deque
from datetime import UTC, datetime
from itertools import islice
from pathlib import Path
from typing import Any, Protocol

from gpuledger.agent.attribution import Chain
from gpuledger.agent.config import AgentConfig
from gpuledger.agent.encode import encode_lines, stamp
from gpuledger.agent.inventory import (
    DEFAULT_POOL,
    InventoryPublisher,
    explicit_pool,
    inventory_from_samples,
    node_labels,
    with_labels,
)
from gpuledger.agent.memory_check import drop_inconsistent_memory
from gpuledger.agent.sender import Sender
from gpuledger.agent.spool import Message, Spool, _read_frames

log = logging.getLogger("gpuledger.agent")

SEQ_FILE = "agent.seq"
MAX_SEQ = 2**63 - 1
"""The contract's seq is an int64 >= 0."""
STOP_MARGIN_S = 2.0
"""After the grace period, how long the agent still waits for a blocked Kafka call."""
SEQ_SAVE_S = 60.0
"""How often the seq file is rewritten (the spool's newest sample is the main record)."""


def _valid_seq(value: object) -> int:
    """``value`` as a sequence number (an int64 >= 0), else ValueError saying why."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(f"not a whole number: {str(value)[:40]!r}")
    try:
        seq = int(value)
    except ValueError:
        raise ValueError(f"not a whole number: {str(value)[:40]!r}") from None
    if not 0 <= seq <= MAX_SEQ:
        raise ValueError(f"out of range (0 to 2**63 - 1): {str(value)[:40]!r}")
    return seq


class Source(Protocol):
    def collect(self, now: datetime | None = None) -> list[dict[str, Any]]: ...


class SharedSpool(Spool):
    """The spool, safe to share between the collecting and the sending thread.

    It also keeps the newest unsent messages in memory (up to ``cache_bytes``), so that
    the sender does not re-read and re-parse the current segment file from disk for
    every batch; after a restart, or when an outage outgrows the cache, messages are
    read from disk as before until the backlog is sent.
    """

    state_files = (*Spool.state_files, SEQ_FILE, Path(SEQ_FILE).with_suffix(".tmp").name)

    def __init__(self, folder: Path, max_bytes: int = 256 << 20,
                 segment_bytes: int = 8 << 20, cache_bytes: int = 4 << 20) -> None:
        self._lock = threading.RLock()
        self._cache: deque[Message] = deque()
        self._cache_bytes = 0
        self._cache_limit = cache_bytes
        super().__init__(folder, max_bytes, segment_bytes)
        self._dropped_seen = self.dropped_messages
        self._cache_valid = self.backlog == 0

    def append(self, topic: str, key: bytes, value: bytes) -> int:
        with self._lock:
            number = super().append(topic, key, value)
            if self._cache_valid:
                self._cache.append(Message(number, topic, key, value))
                self._cache_bytes += len(value)
                dropped = self.dropped_messages != self._dropped_seen
                self._dropped_seen = self.dropped_messages
                if self._cache_bytes > self._cache_limit or dropped:
                    self._cache_valid = False       # read from disk until caught up
                    self._cache.clear()
                    self._cache_bytes = 0
            return number

    def pending(self, limit: int = 10_000) -> list[Message]:
        with self._lock:
            if self._cache_valid:
                return list(islice(self._cache, limit))
            return super().pending(limit)

    def ack(self, through: int) -> None:
        with self._lock:
            super().ack(through)
            while self._cache and self._cache[0].number <= through:
                self._cache_bytes -= len(self._cache.popleft().value)
            if not self._cache_valid and self.next_number == self.cursor:
                self._cache_valid = True            # caught up: serve from memory again

    @property
    def bytes_used(self) -> int:
        with self._lock:
            return sum(size for _, _, size in self._segments)

    @property
    def backlog(self) -> int:
        with self._lock:
            return max(0, self.next_number - self.cursor)

    def last_message(self, topic: str) -> Message | None:
        """The newest message of ``topic`` in the newest segment (kept after sending)."""
        with self._lock:
            if not self._segments:
                return None
            first = self._segments[-1][0]
            frames, _ = _read_frames(self._path(first))
            for i in range(len(frames) - 1, -1, -1):
                if frames[i][0] == topic:
                    t, k, v = frames[i]
                    return Message(first + i, t, k, v)
            return None


class Agent:
    """One node's agent: a source, an attribution chain, a spool and a sender."""

    def __init__(self, config: AgentConfig, source: Source, chain: Chain,
                 spool: Spool | None = None, sender: Sender | None = None,
                 telemetry_topic: str = "gpu.telemetry.v1",
                 inventory_topic: str = "gpu.inventory.v1") -> None:
        self.config = config
        self.source = source
        self.chain = chain
        self.spool = spool
        self.sender = sender
        self.telemetry_topic = telemetry_topic
        self.inventory_topic = inventory_topic
        self.node = config.node_name
        self.agent_id = config.agent_name
        self.source_name = config.source
        self.publisher = InventoryPublisher(config.inventory.republish_s)
        self.seq = self._read_seq()
        self._seq_saved = float("-inf")
        self.samples = 0
        self.collect_errors = 0
        self.inconsistent_memory = 0
        """Memory readings left out as more than the GPU has (``memory_check.py``)."""
        self._memory_warned: set[str] = set()
        self.last_success = False
        self.last_duration_s = 0.0
        self.last_cycle_end: float | None = None
        self.last_error = ""
        self._inventory_checked = float("-inf")
        self._drops_seen = spool.dropped_messages if spool is not None else 0
        self._wake = threading.Event()
        self._stop_deadline: float | None = None
        self._hurried = False

    # -- sequence numbers ----------------------------------------------------------

    def _seq_path(self) -> Path | None:
        return self.spool.folder / SEQ_FILE if self.spool is not None else None

    def _read_seq(self) -> int:
        """The next sequence number: after the newest sample still in the spool (the
        spool keeps its newest segment after sending), or from the seq file.

        A seq file or spooled seq that is unreadable or not an int64 >= 0 is said in one
        warning and not used (the sequence restarts from what else is known, else 0)."""
        path = self._seq_path()
        saved = 0
        if path is not None and path.exists():
            try:
                saved = _valid_seq(path.read_text(encoding="ascii").strip())
            except (OSError, ValueError) as exc:
                log.warning("ignoring the seq file %s: %s", path,
                            getattr(exc, "strerror", None) or exc)
        last = None
        if isinstance(self.spool, SharedSpool):
            last = self.spool.last_message(self.telemetry_topic)
        if last is not None:
            lines = last.value.rstrip(b"\n").rsplit(b"\n", 1)
            try:
                saved = max(saved, _valid_seq(json.loads(lines[-1])["seq"]) + 1)
            except (ValueError, KeyError, TypeError, RecursionError):
                log.warning("the newest spooled sample has no readable seq")
        return saved

    def _write_seq(self) -> None:
        path = self._seq_path()
        if path is None:
            return
        tmp = path.with_suffix(".tmp")
        try:
            tmp.write_text(str(self.seq))
            os.replace(tmp, path)
        except OSError as exc:
            if tmp.is_file():
                tmp.unlink()
            log.warning("cannot write the seq file %s: %s", path, exc.strerror or exc)

    # -- one collection ------------------------------------------------------------

    def collect(self, now: datetime | None = None) -> list[dict[str, Any]]:
        """Collect, attribute and number one sample per GPU (not spooled)."""
        when = now or datetime.now(UTC)
        started = time.perf_counter()
        try:
            records = self.source.collect(when)
            self.last_success = True
        except Exception as exc:
            records = []
            self.collect_errors += 1
            self.last_success = False
            self.last_error = f"{type(exc).__name__}: {exc}"
            log.warning("collection from %s failed: %s", self.source_name, self.last_error)
        self.inconsistent_memory += drop_inconsistent_memory(records, self._memory_warned)
        try:
            self.chain.apply(records)
        except Exception:
            log.exception("attribution failed; samples are sent unattributed")
        for rec in records:
            rec["node"] = self.node
            rec["agent"] = self.agent_id
            rec["seq"] = self.seq
            self.seq += 1
        self.last_duration_s = time.perf_counter() - started
        return records

    def inventory(self, samples: list[dict[str, Any]], now: datetime | None = None
                  ) -> dict[str, Any] | None:
        """The node's inventory record now (None when the source cannot tell)."""
        inv = self.config.inventory
        try:
            labels = node_labels(inv.labels, inv.labels_file)
        except Exception as exc:         # never stop the agent for a labels file
            log.warning("reading the labels failed: %s", exc)
            labels = dict(inv.labels)
        when = now or datetime.now(UTC)
        explicit = explicit_pool(inv.pool, inv.pool_label, labels)
        build = getattr(self.source, "inventory", None)
        try:
            if build is not None:
                # the simulator knows its nodes' pools; other sources get the default
                wanted = explicit if self.source_name == "simulator" else (
                    explicit or DEFAULT_POOL)
                record: dict[str, Any] = build(wanted, when)
            elif samples:
                record = inventory_from_samples(self.node, explicit or DEFAULT_POOL,
                                                samples, stamp(when))
            else:
                return None
        except Exception as exc:
            log.warning("reading the inventory from %s failed: %s", self.source_name, exc)
            return None
        pool = str(record.get("pool") or explicit or DEFAULT_POOL)
        record = with_labels(record, labels, pool, inv.schedulable)
        record["node"] = self.node
        if isinstance(record.get("time"), datetime):
            record["time"] = stamp(record["time"])
        record.setdefault("time", stamp(when))
        return record

    def cycle(self, now: datetime | None = None) -> list[dict[str, Any]]:
        """One collection: spool the samples, and the inventory when it is due."""
        when = now or datetime.now(UTC)
        records = self.collect(when)
        key = self.node.encode()
        if records and self.spool is not None:
            self.spool.append(self.telemetry_topic, key, encode_lines(records))
            self.samples += len(records)
            if time.monotonic() - self._seq_saved >= SEQ_SAVE_S:
                self._write_seq()
                self._seq_saved = time.monotonic()
        if self.spool is not None and self.spool.dropped_messages != self._drops_seen:
            # a full spool dropped its oldest messages: the inventory may be among them,
            # and without it the processor rejects every sample of this node's GPUs
            # until the next republish (an hour by default)
            self._drops_seen = self.spool.dropped_messages
            self.publisher.forget()
            self._inventory_checked = float("-inf")
        checked = time.monotonic()
        if checked - self._inventory_checked >= self.config.inventory.check_s:
            self._inventory_checked = checked
            record = self.inventory(records, when)
            if record is not None and self.publisher.due(record, checked):
                if self.spool is not None:
                    self.spool.append(self.inventory_topic, key, encode_lines([record]))
                self.publisher.mark(record, checked)
        self.last_cycle_end = time.monotonic()
        self._wake.set()
        return records

    # -- running -------------------------------------------------------------------

    def health(self) -> tuple[bool, str]:
        limit = max(3 * self.config.interval_s, 30.0)
        if self.last_cycle_end is None:
            return False, "no collection has completed yet"
        age = time.monotonic() - self.last_cycle_end
        if age > limit:
            return False, f"the last collection ended {age:.0f} s ago (limit {limit:.0f} s)"
        if not self.last_success:
            return False, f"the last collection from {self.source_name} failed: " \
                          f"{self.last_error}"
        backlog = self.spool.backlog if self.spool is not None else 0
        return True, f"ok: collecting from {self.source_name}; {backlog} messages spooled"

    def run(self, stop: threading.Event) -> None:
        """Collect every ``interval_s`` until ``stop``; the sender runs beside it.

        After ``stop`` the sender has ``kafka.send_timeout_s`` (the grace period) to
        deliver what is spooled, counted from the stop, and this returns at most
        :data:`STOP_MARGIN_S` later even if Kafka is unreachable and a client call is
        still blocked (the sender is a daemon thread; what it did not deliver stays in
        the spool)."""
        sending = threading.Thread(target=self._send_loop, args=(stop,),
                                   name="gpuledger-agent-sender", daemon=True)
        if self.sender is not None:
            sending.start()
        interval = self.config.interval_s
        tick = time.monotonic()
        try:
            while not stop.is_set():
                try:
                    self.cycle()
                except Exception as exc:    # a bad runtime file must not stop the agent
                    log.warning("collection cycle failed: %s: %s", type(exc).__name__, exc)
                tick += interval
                delay = tick - time.monotonic()
                if delay < 0:       # fell behind (a slow source): skip, do not burst
                    tick = time.monotonic()
                    delay = 0
                stop.wait(delay)
        finally:
            grace = 0.0 if self._hurried else self.config.kafka.send_timeout_s
            self._stop_deadline = time.monotonic() + grace
            self._wake.set()                # let the sender see the stop at once
            if self.sender is not None:
                # joined a bit at a time: a second signal (hurry) shortens the wait
                while sending.is_alive() and \
                        time.monotonic() < self._stop_deadline + STOP_MARGIN_S:
                    sending.join(0.2)
                if sending.is_alive():
                    log.warning("Kafka did not answer within the grace period; %d messages "
                                "stay in the spool for the next start",
                                self.spool.backlog if self.spool is not None else 0)

    def hurry(self) -> None:
        """A second stop signal: the grace period for delivery ends now (what is not
        delivered stays in the spool; three Ctrl-C still waited the whole 30 s)."""
        self._hurried = True
        if self._stop_deadline is not None:
            self._stop_deadline = time.monotonic() - STOP_MARGIN_S

    def _send_loop(self, stop: threading.Event) -> None:
        assert self.sender is not None and self.spool is not None
        sender, spool = self.sender, self.spool
        while not stop.is_set():
            delivered = self._drain(sender)
            if delivered == 0:
                # woken by the next collection; retry sooner while a backlog waits
                self._wake.wait(1.0 if spool.backlog else 30.0)
                self._wake.clear()
        deadline = self._stop_deadline or time.monotonic() + self.config.kafka.send_timeout_s
        while spool.backlog and time.monotonic() < deadline:
            if self._drain(sender) == 0:
                time.sleep(0.2)
        if spool.backlog:
            log.warning("stopping with %d messages in the spool; they are sent at the "
                        "next start", spool.backlog)
        try:
            sender.close(max(deadline - time.monotonic(), 0.0))
        except Exception as exc:
            log.warning("closing the Kafka producer failed: %s", exc)

    @staticmethod
    def _drain(sender: Sender) -> int:
        """One delivery attempt; a failure (e.g. the spool's disk) is a warning, and the
        sender thread keeps going."""
        try:
            return sender.drain()
        except Exception as exc:
            log.warning("sending from the spool failed: %s: %s", type(exc).__name__, exc)
            return 0

    def close(self) -> None:
        if self.spool is not None and self.seq:
            self._write_seq()
        self.chain.close()
        close = getattr(self.source, "close", None)
        if close is not None:
            close()
