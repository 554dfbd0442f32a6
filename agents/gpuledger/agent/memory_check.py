"""Memory readings that contradict each other, left out before a sample is sent.

Each reading is checked on its own by its source (``nvml.reading_problem``, the DCGM
exporter's bounds). Two can still disagree: a driver glitch reports more memory used than
the GPU has, or processes whose memory adds up to more. The processor rejects such a
sample whole (``validate.py``, ``limits.memory_margin``), losing its activity, power and
every other good reading. So the agent leaves out the reading that cannot be right —
``mem_used_mib``, or the processes' ``used_mib`` — keeps the rest of the sample, and
counts it (``reason="inconsistent_memory"`` of
``gpuledger_agent_source_series_skipped_total``).
"""

from __future__ import annotations

import logging
import math
from typing import Any

from gpuledger.pipeline.config import Limits

log = logging.getLogger("gpuledger.agent")

MEMORY_MARGIN = Limits().memory_margin
"""The processor's default ``limits.memory_margin``: used may exceed total by this much."""


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def drop_inconsistent_memory(records: list[dict[str, Any]],
                             warned: set[str] | None = None) -> int:
    """Leave out memory readings above their sample's ``mem_total_mib`` (+5 %); the
    number left out. A warning once per field, kept in ``warned``."""
    dropped = 0
    for rec in records:
        total = _number(rec.get("mem_total_mib"))
        if total is None:
            continue
        ceiling = total * (1 + MEMORY_MARGIN)
        used = _number(rec.get("mem_used_mib"))
        if used is not None and used > ceiling:
            del rec["mem_used_mib"]
            dropped += 1
            _warn(warned, "mem_used_mib", rec, f"{used:g} MiB used of {total:g}")
        procs = rec.get("processes")
        if isinstance(procs, list):
            amounts = [_number(p.get("used_mib")) for p in procs if isinstance(p, dict)]
            summed = sum(a for a in amounts if a is not None)
            if summed > ceiling:
                for p in procs:
                    if isinstance(p, dict):
                        p.pop("used_mib", None)
                dropped += 1
                _warn(warned, "the processes' used_mib", rec,
                      f"processes' memory adds up to {summed:g} MiB of {total:g}")
    return dropped


def _warn(warned: set[str] | None, field: str, rec: dict[str, Any], what: str) -> None:
    if warned is None or field in warned:
        return
    warned.add(field)
    log.warning("GPU %s: %s omitted from the sample (%s, more than the GPU's memory); "
                "the rest of the sample is kept (warned once per field)",
                rec.get("gpu_index", rec.get("gpu_uuid", "?")), field, what)
