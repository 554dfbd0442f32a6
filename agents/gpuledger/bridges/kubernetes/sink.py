"""Where the bridge's records go: a JSON-lines file and/or Kafka (spool + sender).

Both are durable before they return: the file is flushed and fsynced, a Kafka record is
appended to the agent's on-disk spool (``gpuledger.agent.spool``) and then drained by
the agent's sender, which acknowledges only what the broker confirmed. Only after
``write`` returns does the bridge persist its state, so a crash can at most repeat
identical records (the processor drops repeated job events; inventory is a state).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from gpuledger.agent.sender import Sender
from gpuledger.agent.spool import Spool

log = logging.getLogger("gpuledger.bridges.kubernetes")

Record = dict[str, Any]


class Sink(Protocol):
    def write(self, records: list[Record]) -> None: ...

    def close(self) -> None: ...


class JsonlSink:
    """Appends contract JSON lines to a file."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._file = path.open("a", encoding="utf-8")

    def write(self, records: list[Record]) -> None:
        if not records:
            return
        self._file.write("".join(json.dumps(r, separators=(",", ":")) + "\n"
                                 for r in records))
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        self._file.close()


class KafkaSink:
    """Spools records by topic (job events keyed by job, inventory by node) and sends."""

    def __init__(self, spool_dir: Path, topics: dict[str, str],
                 producer_factory: Callable[[], Any]) -> None:
        self.topics = topics
        self.spool = Spool(spool_dir)
        self.sender = Sender(self.spool, producer_factory)

    def write(self, records: list[Record]) -> None:
        for r in records:
            key = r["job_id"] if r["type"] == "job" else r["node"]
            self.spool.append(self.topics[r["type"]], str(key).encode(),
                              json.dumps(r, separators=(",", ":")).encode())
        self.drain()

    def drain(self) -> None:
        while self.spool.backlog and self.sender.drain():
            pass

    def close(self) -> None:
        self.drain()
        if self.spool.backlog:
            log.warning("%d records stay in the spool %s for the next run",
                        self.spool.backlog, self.spool.folder)
        self.sender.close()


class FanOut:
    """Several sinks at once."""

    def __init__(self, sinks: list[Sink]) -> None:
        self.sinks = sinks

    def write(self, records: list[Record]) -> None:
        for s in self.sinks:
            s.write(records)

    def close(self) -> None:
        for s in self.sinks:
            s.close()
