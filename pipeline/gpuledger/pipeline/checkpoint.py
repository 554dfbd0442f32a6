"""Processor checkpoints: its whole state plus the input offsets it covers.

A checkpoint makes a restart exact. The processor's state (open windows, job and
inventory books, usage accumulators, buffered parts of the open hour) and the next
offset of every input partition are written together to one file, atomically (write
aside, then rename). On start the processor loads the newest checkpoint and the
transport resumes from its offsets, so every input record is applied exactly once to
the state that the facts come from. Fact files written after the checkpoint and before
a crash are written again, byte for byte, when their minutes close again.

The file is Python pickle: an internal file the processor writes and reads itself;
never load one from an untrusted source.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any

from gpuledger.pipeline.processor import Processor

STATE_FIELDS = (
    "counters", "inventory", "jobs", "samples", "acc", "closed_until", "max_telemetry_time",
    "max_other_time", "hour_parts", "day_hourly", "late_parts", "rejects",
    "last_free_blocks", "_seq_last", "outbox", "waiting", "received", "completed",
    "running_parts", "node_time", "close_pending",
)
VERSION = 2

Offsets = dict[tuple[str, int], int]


def save(processor: Processor, offsets: Offsets, path: Path,
         extra: dict[str, Any] | None = None) -> None:
    """Write the processor's state and ``offsets`` to ``path`` atomically."""
    state = {name: getattr(processor, name) for name in STATE_FIELDS}
    blob = {"version": VERSION, "state": state, "offsets": dict(offsets),
            "extra": extra or {}}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        pickle.dump(blob, f, protocol=pickle.HIGHEST_PROTOCOL)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def load(processor: Processor, path: Path) -> Offsets | None:
    """Restore ``processor`` from ``path``; the offsets to resume from, or None."""
    if not path.exists():
        return None
    with open(path, "rb") as f:
        blob = pickle.load(f)
    if blob.get("version") != VERSION:
        raise ValueError(f"{path}: checkpoint version {blob.get('version')} is not {VERSION}")
    for name, value in blob["state"].items():
        setattr(processor, name, value)
    offsets: Offsets = blob["offsets"]
    return offsets
