"""The transport seam: where batches of events come from and go to.

The processor never talks to a transport directly: a :class:`Source` hands it
micro-batches (one Polars frame per record type) and is told to :meth:`Source.commit`
once the output covering them is durable. :class:`EmbeddedBus` is the in-process
implementation used by the demo, the tests and single-box deployments; the Kafka
transport implements the same interface.

The embedded bus keeps what is published as Arrow IPC bytes, one message per
published frame, exactly as a broker would hold opaque bytes, so the decode cost the
processor pays on it is real.
"""

from __future__ import annotations

import io
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from typing import Protocol

import polars as pl
import pyarrow as pa

from gpuledger.contract.schema import RECORD_TYPES, RecordType

Batch = Mapping[str, pl.DataFrame]


class Source(Protocol):
    """Something that yields micro-batches of contract frames."""

    def batches(self) -> Iterator[Batch]:
        """Micro-batches in arrival order; ends when the input ends."""
        ...

    def commit(self) -> None:
        """Everything yielded so far is durable downstream; never replay it."""
        ...


def marking_last(batches: Iterable[Batch]) -> Iterator[tuple[Batch, bool]]:
    """Each batch with whether it is the last one (the next is read ahead): the last
    batch before the end of an input is handed over with ``close=False``, so that the
    flush after it closes its minutes in the same pass (``Processor.process``)."""
    held: Batch | None = None
    for batch in batches:
        if held is not None:
            yield held, False
        held = batch
    if held is not None:
        yield held, True


def decode_message(data: bytes) -> pl.DataFrame:
    """One published message back to its frame. Arrow reads the IPC file in place and
    Polars takes over its buffers (no copy: the message holds string views already)."""
    frame = pl.from_arrow(pa.ipc.open_file(pa.py_buffer(data)).read_all())
    assert isinstance(frame, pl.DataFrame)
    return frame


class EmbeddedBus:
    """An in-process bus: topics of Arrow IPC messages, consumed in publish order."""

    def __init__(self) -> None:
        self._messages: deque[tuple[RecordType, bytes]] = deque()
        self._batch_marks: deque[int] = deque()
        self.published_bytes = 0
        self.committed_batches = 0
        self._count = 0

    def publish(self, record_type: RecordType, frame: pl.DataFrame) -> None:
        """Append one frame as one message."""
        if frame.is_empty():
            return
        sink = io.BytesIO()
        frame.write_ipc(sink, compression="uncompressed")
        data = sink.getvalue()
        self.published_bytes += len(data)
        self._messages.append((record_type, data))
        self._count += 1

    def end_batch(self) -> None:
        """Mark a micro-batch boundary (the producer's flush)."""
        self._batch_marks.append(self._count)

    def publish_batch(self, batch: Batch, end: bool = True) -> None:
        """Publish a frame per record type and (``end``) mark the batch boundary."""
        for record_type in RECORD_TYPES:
            frame = batch.get(record_type)
            if frame is not None:
                self.publish(record_type, frame)
        if end:
            self.end_batch()

    def batches(self) -> Iterator[Batch]:
        """Decode and yield one micro-batch per producer flush."""
        taken = 0
        while self._messages:
            mark = self._batch_marks.popleft() if self._batch_marks else self._count
            parts: dict[str, list[pl.DataFrame]] = {}
            while taken < mark and self._messages:
                record_type, data = self._messages.popleft()
                parts.setdefault(record_type, []).append(decode_message(data))
                taken += 1
            yield {k: pl.concat(v) if len(v) > 1 else v[0] for k, v in parts.items()}

    def commit(self) -> None:
        self.committed_batches += 1

    def __len__(self) -> int:
        return len(self._messages)
