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
    """The saved state, or ``{}`` when there is none yet; :class:`StateError` for a file
    that is not a bridge state file (checked: an object whose ``outbox`` is null or
    ``{position: int >= 0, records: [objects]}`` and whose ``memory`` is an object)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except IsADirectoryError:
        raise StateError(f"{path}: is a directory, not a file") from None
    except OSError as exc:
        raise StateError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise StateError(f"{path}: not a bridge state file (not UTF-8 text, byte "
                         f"{exc.start})") from None
    try:
        doc = json.loads(text, parse_constant=_no_constant)
    except (json.JSONDecodeError, ValueError) as exc:
        raise StateError(f"{path}: not a bridge state file ({exc})") from None
    except RecursionError:
        raise StateError(f"{path}: not a bridge state file (nested too deeply)") from None
    problem = _shape_problem(doc)
    if problem:
        raise StateError(f"{path}: not a bridge state file ({problem})")
    return dict(doc)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _shape_problem(doc: Any) -> str | None:
    if not isinstance(doc, dict):
        return f"expected a JSON object, got {type(doc).__name__}"
    if not isinstance(doc.get("memory", {}), dict):
        return "memory: expected an object"
    outbox = doc.get("outbox")
    if outbox is None:
        return None
    if not isinstance(outbox, dict):
        return "outbox: expected an object or null"
    position = outbox.get("position")
    if isinstance(position, bool) or not isinstance(position, int) or position < 0:
        return "outbox.position: expected a whole number >= 0"
    records = outbox.get("records")
    if not isinstance(records, list) or not all(
            isinstance(r, dict) and r.get("type") in ("job", "inventory") for r in records):
        return "outbox.records: expected a list of job and inventory records"
    return None


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
