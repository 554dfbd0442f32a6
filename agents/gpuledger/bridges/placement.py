"""GPU placement where the scheduler does not say which GPU a job got.

One documented best-fit policy, shared by the history importers (openb, pod lists) and
the Kubernetes bridge (pods do not record their GPU indices):

- a whole-GPU request goes to the node with the fewest free whole GPUs that still fits
  it (best fit; ties by node name), on that node's lowest free indices;
- a fractional request (a shared GPU, a MIG slice) goes to the partly used GPU with the
  least room that still fits it (ties by node name, then index), else to a free whole
  GPU chosen like a one-GPU request;
- :meth:`Placer.place_on` applies the same rules inside one given node (the scheduler
  chose the node, gpuledger chooses the indices).

Pure Python, no dependencies: the bridges are as lean as the node agent.
"""

from __future__ import annotations

import logging

EPS = 1e-9
MAX_GPUS_PER_NODE = 1024
"""The contract's GPU indices are 0…1023: no node has more GPUs (a guard against
absurd input, which would otherwise make the capacity lists huge)."""

Slot = tuple[str, int, float]
"""(node, gpu_index, fraction) of one placed GPU share."""


class GpuCountCheck:
    """A bridge's guard on the GPU counts a scheduler reports: a node said to hold more
    than :data:`MAX_GPUS_PER_NODE` (a mistyped label, a bad gres line) is left out of the
    inventory with one warning per node and count, instead of a record the processor
    rejects (the Slurm bridge sent it, exit 0) or a crash (the Kubernetes bridge)."""

    def __init__(self, log: logging.Logger) -> None:
        self._log = log
        self._warned: set[tuple[str, int]] = set()

    def fits(self, node: str, count: int) -> bool:
        if 0 <= count <= MAX_GPUS_PER_NODE:
            return True
        if (node, count) not in self._warned:
            self._warned.add((node, count))
            self._log.warning("node %s left out of the inventory: it is said to hold %d "
                              "GPUs, more than a node can (0-%d)", node, count,
                              MAX_GPUS_PER_NODE)
        return False


class Placer:
    """Free capacity (1.0 per free GPU) of each node's GPUs."""

    def __init__(self, gpus_per_node: dict[str, int] | None = None) -> None:
        for node, count in (gpus_per_node or {}).items():
            _check_count(node, count)
        self.free: dict[str, list[float]] = {
            node: [1.0] * count for node, count in (gpus_per_node or {}).items()}

    def add_node(self, node: str, gpus: int) -> None:
        """Declare (or resize) a node; GPUs already in use stay in use."""
        _check_count(node, gpus)
        cap = self.free.setdefault(node, [])
        if gpus > len(cap):
            cap.extend([1.0] * (gpus - len(cap)))

    def place(self, gpus: int, fraction: float = 1.0) -> list[Slot] | None:
        """Best-fit anywhere: ``gpus`` whole GPUs, or one share of ``fraction`` < 1."""
        if fraction < 1.0 - EPS:
            return self._fraction(fraction, list(self.free))
        best: tuple[int, str] | None = None
        for node, cap in self.free.items():
            whole = sum(1 for c in cap if c >= 1.0 - EPS)
            if whole >= gpus and (best is None or (whole, node) < best):
                best = (whole, node)
        if best is None:
            return None
        return self._take_whole(best[1], gpus)

    def place_on(self, node: str, gpus: int, fraction: float = 1.0,
                 grow: bool = False) -> list[Slot] | None:
        """Indices on ``node`` for a request the scheduler put there.

        With ``grow`` a node whose GPU count is unknown (or too small) gets more GPUs
        instead of failing: the scheduler's placement is the truth, gpuledger only picks
        indices.
        """
        cap = self.free.setdefault(node, [])
        if fraction < 1.0 - EPS:
            got = self._fraction(fraction, [node])
            if got is None and grow and len(cap) < MAX_GPUS_PER_NODE:
                cap.append(1.0)
                got = self._fraction(fraction, [node])
            return got
        whole = sum(1 for c in cap if c >= 1.0 - EPS)
        if whole < gpus:
            if not grow or len(cap) + gpus - whole > MAX_GPUS_PER_NODE:
                return None
            cap.extend([1.0] * (gpus - whole))
        return self._take_whole(node, gpus)

    def take(self, slots: list[Slot]) -> None:
        """Mark given shares as used (placements the scheduler reported)."""
        for node, index, frac in slots:
            if not 0 <= index < MAX_GPUS_PER_NODE:
                raise ValueError(f"node {node}: GPU index {index} is not in "
                                 f"0-{MAX_GPUS_PER_NODE - 1}")
            cap = self.free.setdefault(node, [])
            if index >= len(cap):
                cap.extend([1.0] * (index + 1 - len(cap)))
            cap[index] = max(0.0, cap[index] - frac)

    def release(self, slots: list[Slot]) -> None:
        for node, index, frac in slots:
            cap = self.free.get(node)
            if cap is not None and index < len(cap):
                cap[index] = min(1.0, cap[index] + frac)

    def _take_whole(self, node: str, gpus: int) -> list[Slot]:
        cap = self.free[node]
        chosen = [i for i, c in enumerate(cap) if c >= 1.0 - EPS][:gpus]
        for i in chosen:
            cap[i] = 0.0
        return [(node, i, 1.0) for i in chosen]

    def _fraction(self, need: float, nodes: list[str]) -> list[Slot] | None:
        best: tuple[float, str, int] | None = None
        for node in nodes:
            for i, c in enumerate(self.free[node]):
                if need - EPS <= c < 1.0 - EPS and (best is None or (c, node, i) < best):
                    best = (c, node, i)
        if best is None:
            whole = self.place_on(nodes[0], 1) if len(nodes) == 1 else self.place(1)
            if whole is None:
                return None
            node, i, _ = whole[0]
            self.free[node][i] = 1.0 - need
            return [(node, i, need)]
        _, node, i = best
        self.free[node][i] -= need
        return [(node, i, need)]


def _check_count(node: str, count: int) -> None:
    if not 0 <= count <= MAX_GPUS_PER_NODE:
        raise ValueError(f"node {node}: {count} GPUs is not in 0-{MAX_GPUS_PER_NODE}")
