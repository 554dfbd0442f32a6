"""Contract records → JSON-lines message values (wire format ``jsonl-v1``).

The agent's own encoder: standard-library ``json`` only, no Polars or Arrow. Fields are
written in contract order (``gpuledger.contract.schema``), unknown fields after them;
fields that are missing or ``None`` are left out (an unsupported reading is omitted,
never faked), and so are non-finite numbers, which no driver reading can be and the
processor would reject. Times that are ``datetime`` objects are written as RFC 3339 UTC
with milliseconds, ``2026-01-05T10:00:10.000Z``.
"""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from typing import Any

from gpuledger.contract.schema import FIELDS

_ORDER: dict[str, list[str]] = {rtype: [f.name for f in fields]
                               for rtype, fields in FIELDS.items()}


def stamp(when: datetime) -> str:
    """RFC 3339 UTC with milliseconds."""
    when = when.astimezone(UTC)
    return when.strftime("%Y-%m-%dT%H:%M:%S.") + f"{when.microsecond // 1000:03d}Z"


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, datetime):
        return stamp(value)
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


def ordered(record: dict[str, Any]) -> dict[str, Any]:
    """The record with contract order, ``None`` and non-finite values left out."""
    order = _ORDER.get(str(record.get("type")), [])
    out: dict[str, Any] = {}
    for name in order:
        value = _clean(record.get(name))
        if value is not None:
            out[name] = value
    for name, value in record.items():
        if name not in out and name not in order:
            clean = _clean(value)
            if clean is not None:
                out[name] = clean
    return out


def encode_lines(records: list[dict[str, Any]]) -> bytes:
    """One message value: a JSON line per record."""
    return b"".join(json.dumps(ordered(r), separators=(",", ":"), ensure_ascii=False)
                    .encode() + b"\n" for r in records)
