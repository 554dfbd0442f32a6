"""A bridge's state file: its diff memory and the batch being handed over.

Written aside and renamed (fsynced), so the file is always either the old or the new
state. The protocol that makes a restart neither lose nor duplicate records:

1. compute the records of a poll and the new memory;
2. save ``{memory: new, outbox: {position, records}}`` — the sink's position before the
   batch and the batch itself;
3. hand the batch to the sink;
4. save ``{memory: new, outbox: null}``.

A crash before 2 leaves the old memory: the next poll computes the same changes again.
A crash after 2 leaves an outbox: at start the bridge first completes it
(:meth:`gpuledger.bridges.output.Sink.complete` uses the position to skip what is
already there), then goes on from the new memory.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


class StateError(ValueError):
    """The state file exists but cannot be read."""


def load_state(path: Path) -> dict[str, Any]:
    """The saved state, or ``{}`` when there is none yet."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise StateError(f"{path}: cannot read: {exc.strerror or exc}") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise StateError(f"{path}: not a bridge state file ({exc})") from None
    if not isinstance(doc, dict):
        raise StateError(f"{path}: not a bridge state file")
    return doc


def save_state(path: Path, doc: dict[str, Any]) -> None:
    """Replace the state file atomically and durably."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(doc, f, separators=(",", ":"))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    try:
        fd = os.open(path.parent, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
