"""Import a CSV pod list (exported from Kubernetes or any scheduler) as job history.

One row per pod. Columns are mapped to gpuledger's fields by name (``--columns
name=pod_name,created=creation_time`` and/or a ``columns:`` section in the mapping
file); a field's default column is its own name. Fields (``docs/import.md``):

| field | required | meaning |
|---|---|---|
| ``name`` | yes | pod (job) id |
| ``created`` | yes | creation time: ISO 8601 (no offset = UTC) or epoch seconds |
| ``gpus`` | yes | GPUs requested; below 1 = a share of one GPU (0.25) |
| ``scheduled`` | no | when it started; empty = never scheduled |
| ``deleted`` | no | when it ended; empty = still running at the end of the list |
| ``gpu_milli`` | no | thousandths of each GPU used (openb style; < 1000 = shared GPU) |
| ``node`` | no | node it ran on |
| ``gpu_indices`` | no | GPU indices on that node: ``0,1`` / ``0;1`` / ``[0, 1]`` |
| ``namespace`` | no | namespace (→ team through the mapping) |
| ``team``, ``user``, ``queue``, ``pool`` | no | as in the contract (mapped) |
| ``priority``, ``job_type``, ``card_type`` | no | as in the contract (mapped) |
| ``status`` | no | final phase; ``Failed``/``failed``/``error`` → ``failed`` |

Events: ``submitted`` at ``created``; ``started`` at ``scheduled`` with the placement;
at ``deleted``: ``failed`` (status failed, or unplaced), ``cancelled`` (never
scheduled), else ``finished``. Rows without a name, a creation time or a GPU count,
or with unreadable values, times before 2000 (``validate.MIN_TIME``) or more than
``max_future_s`` after now (validation would reject their events), a share of several
GPUs (``gpu_milli < 1000`` with ``gpus > 1``: as in openb, only one-GPU pods share a
GPU), repeated GPU indices or, with ``--nodes``, indices the node does not have, are
reported by row number and skipped; ``gpus = 0`` rows are CPU-only and skipped.

Placement: a pod with a node and indices is placed there; with a node only, on that
node's lowest free indices (best fit for a share); with neither, by the best-fit policy
of :mod:`gpuledger.bridges.placement` (the openb importer's) over the nodes of
``--nodes`` (CSV ``node,gpus[,card_type,pool,gpu_mem_mib]``), in event-time order with
releases first. A pod that fits nowhere is reported and ends ``failed`` (reason
``unplaced by importer``) at its deletion, so that its queue time still counts. A
``--nodes`` row is checked as its inventory record will be (``validate.check``, with the
physical :class:`~gpuledger.pipeline.config.Limits` given to :func:`load_pods`); a row it
would reject, or a node listed twice, refuses the file with one line naming the row.
Without ``--nodes``, inventory is made for the nodes the list names (GPU count = the
highest index used + 1, or the most GPUs held at once).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import polars as pl

from gpuledger.bridges.mapping import Mapping
from gpuledger.bridges.placement import MAX_GPUS_PER_NODE, Placer, Slot
from gpuledger.contract.schema import JOB_TYPES
from gpuledger.local_time import not_a_date
from gpuledger.pipeline.columns import conform
from gpuledger.pipeline.config import Limits, Windows
from gpuledger.pipeline.importers.csv_text import header_and_rows
from gpuledger.pipeline.validate import MIN_TIME, check

FIELDS = ("name", "created", "gpus", "scheduled", "deleted", "gpu_milli", "node",
          "gpu_indices", "namespace", "team", "user", "queue", "pool", "priority",
          "job_type", "card_type", "status")
REQUIRED = ("name", "created", "gpus")
FAILED = ("failed", "error", "oomkilled", "evicted")
DEFAULT_POOL = "default"
DEFAULT_CARD = "unknown"
MAX_FUTURE = timedelta(seconds=Windows().max_future_s)
"""How far past the wall clock a time may lie: validation rejects later events."""


class PodsImportError(ValueError):
    """The file or the column mapping is unusable (not a bad row: those are reported)."""


@dataclass
class PodsImport:
    """The events of an import and what could not be imported."""

    frames: dict[str, pl.DataFrame]
    rows: int = 0
    imported: int = 0
    cpu_only: int = 0
    unplaced: list[str] = field(default_factory=list)
    bad_rows: list[tuple[int, str]] = field(default_factory=list)


def parse_columns(text: str | None, base: dict[str, str] | None = None) -> dict[str, str]:
    """``field=column,...`` on top of ``base``; an unknown field is an error naming it."""
    columns = dict(base or {})
    for part in (text or "").split(","):
        if not part.strip():
            continue
        name, sep, column = part.partition("=")
        name, column = name.strip(), column.strip()
        if not sep or not column:
            raise PodsImportError(f"--columns: {part.strip()!r} is not FIELD=COLUMN")
        if name not in FIELDS:
            raise PodsImportError(f"--columns: unknown field {name!r} "
                                  f"(fields: {', '.join(FIELDS)})")
        columns[name] = column
    return columns


def parse_time(text: str) -> datetime:
    """ISO 8601 (no offset: UTC) or epoch seconds."""
    value = text.strip()
    try:
        seconds = float(value)
    except ValueError:
        t = datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
        return t if t.tzinfo else t.replace(tzinfo=UTC)
    if not math.isfinite(seconds):
        raise ValueError(f"{value!r} is not a time")
    try:
        return datetime.fromtimestamp(seconds, UTC)
    except (OverflowError, OSError):
        raise ValueError(f"{value!r} is out of the range of times") from None


def _indices(text: str) -> list[int]:
    return [int(x) for x in re.split(r"[,;\s]+", text.strip().strip("[]")) if x]


@dataclass
class _Pod:
    row: int
    name: str
    created: datetime
    gpus: int
    share: float
    scheduled: datetime | None
    deleted: datetime | None
    node: str | None
    indices: list[int] | None
    failed: bool
    attrs: dict[str, Any]


def _inventory(nodes: list[dict[str, Any]], time: datetime) -> pl.DataFrame:
    """The inventory records of ``nodes`` at ``time`` (not yet conformed)."""
    if not nodes:
        return pl.DataFrame({"time": []})
    return pl.DataFrame([{**n, "time": time} for n in nodes]).with_columns(
        pl.lit(1).alias("v"), pl.lit("inventory").alias("type"),
        pl.lit(True).alias("schedulable"), pl.lit("ok").alias("health"))


def _too_many(header: list[str], extra: int) -> str:
    return (f"{len(header) + extra} fields, the header has {len(header)}: a ',' in a "
            "field not quoted? (its fields after it moved along)")


def _read_nodes(path: Path, mapping: Mapping, limits: Limits) -> list[dict[str, Any]]:
    """The node list; a row validation would reject as an inventory record (with
    ``limits``), or a node listed twice, refuses the file naming the row."""
    header, rows = header_and_rows(path, PodsImportError)
    if not header:
        raise PodsImportError(f"{path}: empty file (expected node,gpus and one row per "
                              "node)")
    if not {"node", "gpus"} <= set(header):
        raise PodsImportError(f"{path}: needs the columns node and gpus")
    nodes: list[dict[str, Any]] = []
    lines: dict[str, int] = {}
    for n, raw, extra in rows:
        row = {k: v.strip() for k, v in raw.items()}
        if not any(row.values()) and not extra:
            continue  # a blank line
        if extra:
            raise PodsImportError(f"{path}:{n}: {_too_many(header, extra)}")
        column = "gpus"
        try:
            gpus = int(row["gpus"])
            column = "gpu_mem_mib"
            mem = float(row["gpu_mem_mib"]) if row.get("gpu_mem_mib") else None
        except ValueError:
            raise PodsImportError(f"{path}:{n}: {column}: {row[column]!r} is not a "
                                  + ("whole number" if column == "gpus" else "number")
                                  ) from None
        if not row["node"] or not 0 <= gpus <= MAX_GPUS_PER_NODE:
            raise PodsImportError(f"{path}:{n}: needs a node and 0-{MAX_GPUS_PER_NODE} gpus")
        if row["node"] in lines:
            raise PodsImportError(f"{path}:{n}: node {row['node']!r} appears twice (first "
                                  f"on line {lines[row['node']]}); nodes must be unique")
        lines[row["node"]] = n
        card = mapping.card_type(row.get("card_type") or None) or DEFAULT_CARD
        nodes.append({"node": row["node"], "gpu_count": gpus, "card_type": card,
                      "pool": row.get("pool") or mapping.pool_default or DEFAULT_POOL,
                      "gpu_mem_mib": mem if mem is not None
                      else mapping.card_memory(card) or 0.0})
    checked = check(_inventory(nodes, MIN_TIME), "inventory", limits=limits)
    if checked.rejected_index.len():
        node = nodes[checked.rejected_index[0]]["node"]
        raise PodsImportError(f"{path}:{lines[node]}: node {node!r}: {checked.reasons[0]}")
    return nodes


def _read_pods(path: Path, columns: dict[str, str], mapping: Mapping,
               result: PodsImport, now: datetime) -> list[_Pod]:
    names, rows = header_and_rows(path, PodsImportError)
    if not names:
        raise PodsImportError(f"{path}: empty file (expected a header line and one row "
                              "per pod)")
    header = set(names)
    wanted = {name: columns.get(name, name) for name in FIELDS}
    for name, column in columns.items():
        if column not in header:
            raise PodsImportError(f"column {column!r} (for {name}) is not in {path} "
                                  f"(columns: {', '.join(sorted(header))})")
    for name in REQUIRED:
        if wanted[name] not in header:
            raise PodsImportError(f"{path} has no column {wanted[name]!r} for the "
                                  f"required field {name} (map it with --columns "
                                  f"{name}=COLUMN)")
    pods: list[_Pod] = []
    for n, raw, extra in rows:
        if not any(v.strip() for v in raw.values()) and not extra:
            continue  # a blank line
        result.rows += 1
        if extra:
            result.bad_rows.append((n, _too_many(names, extra)))
            continue
        row = {k: (raw.get(c) or "").strip() for k, c in wanted.items() if c in header}
        try:
            pod = _pod(n, row, mapping, now)
        except ValueError as exc:
            result.bad_rows.append((n, str(exc)))
            continue
        if pod is None:
            result.cpu_only += 1
            continue
        pods.append(pod)
    return pods


def _pod(n: int, row: dict[str, str], mapping: Mapping, now: datetime) -> _Pod | None:
    for name in REQUIRED:
        if not row.get(name):
            raise ValueError(f"{name}: empty")

    def when(name: str) -> datetime | None:
        if not row.get(name):
            return None
        try:
            t = parse_time(row[name])
        except ValueError:
            # written as a time is, of a day that does not exist: say so
            raise ValueError(f"{name}: {row[name]!r} "
                             + (not_a_date(row[name])
                                or "is neither ISO 8601 nor epoch seconds")) from None
        if t < MIN_TIME:
            raise ValueError(f"{name}: {row[name]!r} is before {MIN_TIME:%Y-%m-%d} (no "
                             "event is older)")
        if t > now + MAX_FUTURE:
            raise ValueError(f"{name}: {row[name]!r} is more than "
                             f"{MAX_FUTURE.total_seconds():.0f} s after the time of the "
                             f"import ({now:%Y-%m-%dT%H:%M:%SZ})")
        return t

    column = "gpus"
    try:
        gpus_f = float(row["gpus"])
        column = "gpu_milli"
        milli = float(row["gpu_milli"]) if row.get("gpu_milli") else 1000.0
        column = "priority"
        priority = int(row["priority"]) if row.get("priority") else None
        column = "gpu_indices"
        indices = _indices(row["gpu_indices"]) if row.get("gpu_indices") else None
    except ValueError:
        raise ValueError(f"{column}: {row[column]!r} is not "
                         + ("a number" if column in ("gpus", "gpu_milli") else
                            "a whole number" if column == "priority" else
                            "a list of whole numbers (0,1 or [0, 1])")) from None
    if priority is not None and not -2**63 <= priority < 2**63:
        raise ValueError(f"priority: {row['priority'][:40]!r} is out of range (a 64-bit "
                         "whole number)")
    if not 0 <= gpus_f <= MAX_GPUS_PER_NODE or not 0 < milli <= 1000:
        raise ValueError(f"gpus must be in 0-{MAX_GPUS_PER_NODE} and gpu_milli in (0, 1000]")
    if gpus_f == 0:
        return None
    if gpus_f < 1:
        if milli < 1000 and not math.isclose(milli, gpus_f * 1000):
            raise ValueError(f"gpu_milli: {row['gpu_milli']!r} with gpus {row['gpus']!r}: "
                             "two different shares of one GPU")
        gpus, share = 1, gpus_f
    else:
        if gpus_f != int(gpus_f):
            raise ValueError(f"gpus: {row['gpus']!r} is above 1 and not whole")
        if gpus_f > 1 and milli < 1000:
            raise ValueError(f"gpu_milli: {row['gpu_milli']!r} with gpus {row['gpus']!r}: "
                             "only one-GPU pods share a GPU (gpu_milli < 1000)")
        gpus, share = int(gpus_f), milli / 1000.0
    created, scheduled, deleted = when("created"), when("scheduled"), when("deleted")
    assert created is not None
    if scheduled is not None and scheduled < created:
        raise ValueError("scheduled is before created")
    if deleted is not None and deleted < (scheduled or created):
        raise ValueError("deleted is before scheduled/created")
    if indices is not None and (not row.get("node") or len(indices) != gpus):
        raise ValueError("gpu_indices need a node and one index per GPU")
    bad = next((i for i in indices or [] if not 0 <= i < MAX_GPUS_PER_NODE), None)
    if bad is not None:
        raise ValueError(f"gpu_indices: {bad} is not in 0-{MAX_GPUS_PER_NODE - 1}")
    twice = next((i for i in indices or [] if (indices or []).count(i) > 1), None)
    if twice is not None:
        raise ValueError(f"gpu_indices: GPU {twice} is listed twice")
    ns = row.get("namespace") or None
    queue = row.get("queue") or None
    job_type = row.get("job_type") or mapping.job_type(name=row["name"], namespace=ns,
                                                       queue=queue)
    if job_type is not None and job_type not in JOB_TYPES:
        raise ValueError(f"job_type: {job_type!r} is not one of {', '.join(JOB_TYPES)}")
    attrs = {
        "team": row.get("team") or mapping.team(namespace=ns),
        "user": row.get("user") or None,
        "queue": mapping.queue(local_queue=queue),
        "pool": row.get("pool") or mapping.pool_default,
        "priority": mapping.priority(native=priority),
        "job_type": job_type,
        "gpus": gpus,
        "card_type": mapping.card_type(row.get("card_type") or None),
    }
    return _Pod(n, row["name"], created, gpus, share, scheduled, deleted,
                row.get("node") or None, indices,
                row.get("status", "").lower() in FAILED, attrs)


def _indices_fit(pod: _Pod, width: dict[str, int], result: PodsImport) -> bool:
    """Whether the pod's node and its given GPU indices are in ``--nodes`` (when there
    is a node list); a bad row is reported otherwise (a node the list does not name was
    a bad row with indices, and a pod that "could not be placed", ended failed, without
    them)."""
    if not width or pod.node is None:
        return True
    count = width.get(pod.node)
    if count is None:
        result.bad_rows.append((pod.row, f"node: {pod.node!r} is not in --nodes"))
        return False
    if pod.indices is None:
        return True
    bad = [i for i in pod.indices if i >= count]
    if bad:
        result.bad_rows.append((pod.row, f"gpu_indices: GPU {bad[0]} is not on node "
                                         f"{pod.node} ({count} GPUs in --nodes)"))
        return False
    return True


def _place(pods: list[_Pod], placer: Placer, strict_nodes: bool) -> dict[str, list[Slot]]:
    """Placements in event-time order, releases first at equal times."""
    timeline: list[tuple[datetime, int, str, _Pod]] = []
    for pod in pods:
        if pod.scheduled is not None:
            timeline.append((pod.scheduled, 1, pod.name, pod))
            if pod.deleted is not None:
                timeline.append((pod.deleted, 0, pod.name, pod))
    timeline.sort(key=lambda e: (e[0], e[1], e[2]))
    placed: dict[str, list[Slot]] = {}
    for _t, kind, name, pod in timeline:
        if kind == 0:
            placer.release(placed.get(name, []))
            continue
        slots: list[Slot] | None
        if pod.node is not None and pod.indices is not None:
            slots = [(pod.node, i, pod.share) for i in pod.indices]
            placer.take(slots)
        elif pod.node is not None:
            slots = placer.place_on(pod.node, pod.gpus, pod.share, grow=not strict_nodes)
        else:
            slots = placer.place(pod.gpus, pod.share)
        if slots:
            placed[name] = slots
    return placed


def load_pods(pods_csv: Path, *, columns: dict[str, str] | None = None,
              mapping: Mapping | None = None, nodes_csv: Path | None = None,
              limits: Limits | None = None, now: datetime | None = None) -> PodsImport:
    """Read a pod list and turn it into inventory and job event frames. ``limits``: the
    physical bounds validation will apply (default: the configuration's defaults);
    ``now``: the time of the import (default: the wall clock)."""
    mapping = mapping or Mapping()
    result = PodsImport({})
    pods = _read_pods(pods_csv, columns or {}, mapping, result, now or datetime.now(UTC))
    first_row: dict[str, int] = {}
    for pod in pods:
        if pod.name in first_row:
            raise PodsImportError(f"{pods_csv}:{pod.row}: pod {pod.name!r} appears twice "
                                  f"(first on line {first_row[pod.name]}); names must be "
                                  "unique")
        first_row[pod.name] = pod.row
    nodes = _read_nodes(nodes_csv, mapping, limits or Limits()) if nodes_csv else []
    listed = {n["node"]: n["gpu_count"] for n in nodes}
    pods = [p for p in pods if _indices_fit(p, listed, result)]
    result.bad_rows.sort()
    placer = Placer(listed)
    if not nodes and any(p.node is None and p.scheduled is not None for p in pods):
        raise PodsImportError("pods without a node need --nodes (node,gpus CSV) to be "
                              "placed")
    placed = _place(pods, placer, strict_nodes=bool(nodes))
    if not nodes:
        width: dict[str, int] = {}
        for slots in placed.values():
            for node, index, _ in slots:
                width[node] = max(width.get(node, 0), index + 1)
        nodes = [{"node": node, "gpu_count": count, "card_type": DEFAULT_CARD,
                  "pool": mapping.pool_default or DEFAULT_POOL, "gpu_mem_mib": 0.0}
                 for node, count in sorted(width.items())]
    first = min((p.created for p in pods), default=datetime(2026, 1, 1, tzinfo=UTC))
    inventory = _inventory(nodes, first)
    rows: list[dict[str, Any]] = []
    for pod in pods:
        result.imported += 1
        rows.append({"time": pod.created, "event": "submitted", "job_id": pod.name,
                     **pod.attrs})
        got = placed.get(pod.name)
        if pod.scheduled is not None and got:
            rows.append({"time": pod.scheduled, "event": "started", "job_id": pod.name,
                         "allocation": [{"node": n, "gpu_index": i, "gpu_uuid": None,
                                         "fraction": f} for n, i, f in got]})
            end, reason = ("failed" if pod.failed else "finished"), None
        elif pod.scheduled is not None:
            result.unplaced.append(pod.name)
            end, reason = "failed", "unplaced by importer"
        else:
            end, reason = "cancelled", "never scheduled"
        if pod.deleted is not None:
            rows.append({"time": pod.deleted, "event": end, "job_id": pod.name,
                         "reason": reason})
    jobs = pl.DataFrame(rows, infer_schema_length=None) if rows else pl.DataFrame(
        {"time": [], "event": [], "job_id": []})
    jobs = jobs.with_columns(pl.lit(1).alias("v"), pl.lit("job").alias("type"))
    result.frames = {"inventory": conform(inventory, "inventory"), "job": conform(jobs, "job")}
    return result
