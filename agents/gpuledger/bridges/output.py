"""Where a bridge's records go: a JSON-lines file or Kafka (through the agent's spool).

A sink hands over a batch *exactly once* across crashes, together with the bridge's
state file (:mod:`gpuledger.bridges.state`): before a batch is handed over, the state
file records the batch and the sink's position; after a restart,
:meth:`Sink.complete` finishes a batch that may have been handed over in part, using
that position to tell what is already there.

* :class:`FileSink` appends contract JSON lines to one file (``gpuledger ingest`` reads
  it); the position is the file size; a torn batch is completed, and a file shorter than the
  saved position (rotated, replaced) gets the batch at its end: never cut or padded.
* :class:`KafkaSpoolSink` appends one message per record to the agent's on-disk spool
  (job events to the scheduler-events topic keyed by job id, inventory to the inventory
  topic keyed by node) and drains the spool to Kafka with the agent's sender; the
  position is the spool's next message number. A broker outage only grows the spool.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

Record = dict[str, Any]
log = logging.getLogger("gpuledger.bridges.output")


def encode(record: Record) -> bytes:
    return json.dumps(record, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"


class Sink(Protocol):
    def position(self) -> int:
        """Where the next batch will start."""

    def complete(self, start: int, records: list[Record]) -> None:
        """Make sure ``records``, meant to start at ``start``, are all handed over once."""

    def flush(self) -> None:
        """Push what is buffered (best effort; nothing is lost when it cannot)."""

    def close(self) -> None:
        """Release resources."""


class FileSink:
    """Contract JSON lines appended to one file, fsynced per batch."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch(exist_ok=True)

    def position(self) -> int:
        try:
            return self.path.stat().st_size
        except FileNotFoundError:  # moved away (rotated): a new file starts
            return 0

    def complete(self, start: int, records: list[Record]) -> None:
        """Append what of the batch is missing; never cut or pad the file.

        The bytes from ``start`` are compared with the batch: all there, done; a prefix
        (a torn write), the rest is appended. Anything else (the file is shorter than
        ``start`` or holds other bytes there: it was rotated, replaced or is another
        file) gets the whole batch appended at its end, on a line of its own.
        """
        data = b"".join(encode(r) for r in records)
        self.path.touch(exist_ok=True)
        with open(self.path, "r+b") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(min(start, size))
            there = f.read(len(data)) if start <= size else b""
            if start <= size and data.startswith(there):
                data = data[len(there):]
            else:
                log.warning("%s is not the file the interrupted batch was written to "
                            "(%d bytes, the batch started at byte %d): appending the "
                            "batch's %d records at its end", self.path, size, start,
                            len(records))
                f.seek(max(0, size - 1))
                if size and f.read(1) != b"\n":
                    data = b"\n" + data
            if data:
                f.seek(0, os.SEEK_END)
                f.write(data)
                f.flush()
                os.fsync(f.fileno())

    def flush(self) -> None:
        return None

    def close(self) -> None:
        return None


class KafkaSpoolSink:
    """Records into the agent's spool; the agent's sender drains it to Kafka."""

    def __init__(self, spool_dir: Path, producer_factory: Callable[[], Any],
                 jobs_topic: str, inventory_topic: str, send_timeout_s: float = 10.0) -> None:
        from gpuledger.agent.sender import Sender
        from gpuledger.agent.spool import Spool

        self.spool = Spool(spool_dir)
        self.sender = Sender(self.spool, producer_factory, send_timeout_s=send_timeout_s)
        self.topics = {"job": jobs_topic, "inventory": inventory_topic}
        self.stalled = False
        """The last drain left records in the spool."""

    def position(self) -> int:
        return self.spool.next_number

    def complete(self, start: int, records: list[Record]) -> None:
        done = max(0, self.spool.next_number - start)
        for record in records[done:]:
            key = record["job_id"] if record["type"] == "job" else record["node"]
            self.spool.append(self.topics[record["type"]], str(key).encode(), encode(record))

    def flush(self) -> None:
        """Drain the spool; stop at the first round that delivers nothing (Kafka
        unreachable: one ``send_timeout_s`` wait, the records stay spooled)."""
        while self.spool.backlog and self.sender.drain():
            pass
        self.stalled = bool(self.spool.backlog)

    def close(self) -> None:
        """A last drain unless the previous one delivered nothing, then close without
        waiting longer for an unreachable broker."""
        if not self.stalled:
            self.flush()
        self.sender.close(timeout_s=0 if self.stalled else None)


def kafka_producer_factory(settings: Any) -> Callable[[], Any]:
    """A kafka-python producer with no loss and no duplicates (acks=all, idempotent)."""

    def make() -> Any:
        from kafka import KafkaProducer

        cfg = settings.client_config()
        cfg.update(acks="all", enable_idempotence=True, linger_ms=20,
                   retries=2_147_483_647, max_block_ms=5_000)
        if "bootstrap_timeout_ms" in KafkaProducer.DEFAULT_CONFIG:
            # an unreachable broker fails in 10 s, not kafka-python's 30 s default
            cfg.setdefault("bootstrap_timeout_ms", 10_000)
        return KafkaProducer(**cfg)

    return make
