"""Hand-written events for tests, in the contract's JSON form."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

import polars as pl

from gpuledger.pipeline.columns import conform, schema_of

T0 = datetime(2026, 1, 5, 10, 0, tzinfo=UTC)


def at(minutes: float = 0, seconds: float = 0) -> datetime:
    """T0 plus an offset."""
    return T0 + timedelta(minutes=minutes, seconds=seconds)


def iso(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z"


def inventory(node: str, t: datetime, *, pool: str = "train", card: str = "H100-SXM5-80GB",
              gpus: int = 8, mem: float = 81_559.0, schedulable: bool = True,
              health: str = "ok", unhealthy: list[int] | None = None) -> dict[str, Any]:
    return {"v": 1, "type": "inventory", "time": t, "node": node, "pool": pool,
            "card_type": card, "gpu_count": gpus, "gpu_mem_mib": mem,
            "schedulable": schedulable, "health": health,
            "unhealthy_gpus": unhealthy or []}


def job(event: str, job_id: str, t: datetime, **fields: Any) -> dict[str, Any]:
    rec: dict[str, Any] = {"v": 1, "type": "job", "time": t, "event": event, "job_id": job_id}
    if event == "submitted":
        rec.update({"team": "vision", "user": "ana", "queue": "research", "pool": "train",
                    "priority": 50, "job_type": "training", "gpus": 1,
                    "card_type": "H100-SXM5-80GB", "gpu_mem_mib": 81_559.0,
                    "preemptible": False, "checkpointable": True})
    rec.update(fields)
    return rec


def alloc(node: str, *indices: int, fraction: float = 1.0) -> list[dict[str, Any]]:
    return [{"node": node, "gpu_index": i, "gpu_uuid": f"GPU-{node}-{i}",
             "fraction": fraction} for i in indices]


def telemetry(node: str, index: int, t: datetime, *, util: float | None = None,
              sm: float | None = None, mem: float = 1000.0, card: str = "H100-SXM5-80GB",
              total: float = 81_559.0, jobs: Iterable[str | None] = (), seq: int = 0,
              **extra: Any) -> dict[str, Any]:
    rec: dict[str, Any] = {
        "v": 1, "type": "telemetry", "time": t, "node": node, "seq": seq,
        "gpu_index": index, "gpu_uuid": f"GPU-{node}-{index}", "card_type": card,
        "util_gpu": util, "sm_active": sm, "mem_used_mib": mem, "mem_total_mib": total,
        "processes": [{"pid": 100 + i, "used_mib": mem, "job_id": j}
                      for i, j in enumerate(jobs)],
    }
    rec.update(extra)
    return rec


def series(node: str, index: int, start: datetime, minutes: int, *, every_s: int = 10,
           seq0: int = 0, **kw: Any) -> list[dict[str, Any]]:
    """Samples every ``every_s`` seconds for ``minutes`` minutes."""
    n = minutes * 60 // every_s
    return [telemetry(node, index, start + timedelta(seconds=i * every_s), seq=seq0 + i, **kw)
            for i in range(n)]


def frames(records: Iterable[dict[str, Any]]) -> dict[str, pl.DataFrame]:
    """Group records by type into contract frames."""
    by: dict[str, list[dict[str, Any]]] = {"telemetry": [], "inventory": [], "job": []}
    for r in records:
        by[r["type"]].append(r)
    out: dict[str, pl.DataFrame] = {}
    for kind, rows in by.items():
        schema = schema_of(kind)  # type: ignore[arg-type]
        if not rows:
            out[kind] = pl.DataFrame(schema=schema)
            continue
        norm = [{k: r.get(k) for k in schema.names()} for r in rows]
        out[kind] = conform(pl.DataFrame(norm, schema=schema), kind)  # type: ignore[arg-type]
    return out


def jsonl(records: Iterable[dict[str, Any]]) -> bytes:
    """Records as contract JSON lines."""
    import json

    def enc(v: Any) -> Any:
        return iso(v) if isinstance(v, datetime) else v

    return b"".join(
        json.dumps({k: enc(v) for k, v in r.items() if v is not None}).encode() + b"\n"
        for r in records
    )


def held_per_minute(intervals: Iterable[tuple[datetime, datetime, float]]
                    ) -> dict[datetime, float]:
    """GPU-minutes held per minute by ``(start, end, gpus)`` intervals, exact to the
    second (docs/metrics.md): each minute gets ``gpus × seconds overlapped / 60``."""
    out: dict[datetime, float] = {}
    for start, end, gpus in intervals:
        minute = start.replace(second=0, microsecond=0)
        while minute < end:
            nxt = minute + timedelta(minutes=1)
            held = (min(end, nxt) - max(start, minute)).total_seconds()
            if held > 0:
                out[minute] = out.get(minute, 0.0) + gpus * held / 60
            minute = nxt
    return out
