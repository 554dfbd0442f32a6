"""Source: one node of the core's cluster simulator, sample by sample, in real time.

So a laptop can run real agents against a fake fleet: each agent plays one simulated
node (``node`` must be one of the cluster's nodes, e.g. ``h100-001``) and reports, at
each collection, the simulated samples of its GPUs for the current sample time. The
simulation starts at the agent's start (rounded down to the interval), so sample times
follow the wall clock, and runs ``simulator.hours`` at a time (then a new span starts).
Jobs' process attributions come from the simulator itself.

This module imports the pipeline (Polars, NumPy) when the source is built: it needs the
``pipeline`` extra and is never loaded by an agent with another source.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from gpuledger.agent.encode import stamp


class SimulatorNodeError(ValueError):
    """The configured node is not a node of the simulated cluster."""


class SimulatorSource:
    """Telemetry and inventory of one simulated node."""

    def __init__(self, node: str, interval_s: float = 10.0, cluster: Path | None = None,
                 seed: int = 7, hours: float = 24.0, start: datetime | None = None) -> None:
        from gpuledger.pipeline.simulate import load_cluster
        from gpuledger.pipeline.simulate.layout import build_layout

        self.node = node
        self.interval_s = max(1, round(interval_s))
        self.seed = seed
        self.hours = hours
        self._spec = load_cluster(cluster)
        names = build_layout(self._spec).node_names
        if node not in names:
            raise SimulatorNodeError(
                f"node: {node!r} is not a node of the simulated cluster (its nodes are "
                f"{names[0]} ... {names[-1]}, {len(names)} in all)")
        now = datetime.now(UTC) if start is None else start.astimezone(UTC)
        epoch = int(now.timestamp()) // self.interval_s * self.interval_s
        self.errors = 0
        self._begin(datetime.fromtimestamp(epoch, UTC))

    def _begin(self, start: datetime) -> None:
        from gpuledger.pipeline.simulate import SimConfig, simulate

        self.start = start
        self.end = start + timedelta(hours=self.hours)
        self._batches = simulate(SimConfig(start=start, hours=self.hours, seed=self.seed,
                                           sample_interval_s=self.interval_s,
                                           chunk_minutes=10, cluster=self._spec))
        self._loaded_until = start
        self._samples: dict[datetime, list[dict[str, Any]]] = {}
        self._inventory: list[dict[str, Any]] = []

    def _load_through(self, when: datetime) -> None:
        import polars as pl

        while self._loaded_until <= when:
            batch = next(self._batches, None)
            if batch is None:
                self._begin(self.end)
                continue
            tel = batch["telemetry"].filter(pl.col("node") == self.node)
            samples: dict[datetime, list[dict[str, Any]]] = {}
            for row in tel.to_dicts():
                samples.setdefault(row["time"], []).append(row)
            self._samples = samples
            inv = batch["inventory"].filter(pl.col("node") == self.node)
            self._inventory.extend(inv.to_dicts())
            self._loaded_until += timedelta(minutes=10)

    def _sample_time(self, now: datetime | None) -> datetime:
        when = (now or datetime.now(UTC)).astimezone(UTC)
        if when < self.start:
            return self.start
        k = int((when - self.start).total_seconds()) // self.interval_s
        return self.start + timedelta(seconds=k * self.interval_s)

    def collect(self, now: datetime | None = None) -> list[dict[str, Any]]:
        """The node's samples at the latest sample time (none while the node is down)."""
        at = self._sample_time(now)
        if at >= self.end:
            self._begin(self.end)
        self._load_through(at)
        out = []
        for row in self._samples.get(at, []):
            rec = {k: v for k, v in row.items() if v is not None}
            rec["time"] = stamp(row["time"])
            rec["processes"] = [dict(p) for p in row.get("processes") or []]
            out.append(rec)
        return sorted(out, key=lambda r: (r["gpu_index"], r.get("mig_instance") or ""))

    def inventory(self, pool: str | None = None, now: datetime | None = None
                  ) -> dict[str, Any]:
        """The node's latest simulated inventory record (the simulator knows its pool)."""
        at = self._sample_time(now)
        self._load_through(at)
        rows = [r for r in self._inventory if r["time"] <= at] or self._inventory[:1]
        if not rows:
            raise RuntimeError(f"the simulator has no inventory for {self.node}")
        row = rows[-1]
        self._inventory = [row] + [r for r in self._inventory if r["time"] > at]
        rec = {k: v for k, v in row.items() if v is not None}
        rec["time"] = stamp(at)
        rec["labels"] = json.loads(row["labels"]) if row.get("labels") else {}
        if pool:
            rec["pool"] = pool
        return rec

    def close(self) -> None:
        self._samples = {}
