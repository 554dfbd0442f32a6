"""Placement policies for the simulator's scheduler (``Rules.placement``).

Every policy keeps the scheduler's gang rules (a job of at most one node's GPUs on one
node; a bigger one on whole free nodes of one card type; a shared job on one GPU) and
only changes *which* node and GPUs:

============  ==========================================================================
``best-fit``  the node with the fewest free whole GPUs that fits (the scheduler's own)
``worst-fit`` the node with the most free whole GPUs (spreads jobs); a shared job goes to
              the GPU with the most room, completely free GPUs first
``fgd``       fragmentation gradient descent (:mod:`.fragment`) against the pool's task
              mix; multi-node jobs as best fit
``topology``  NVLink-aware: jobs of two or more GPUs prefer NVLink nodes, single-GPU and
              shared jobs prefer PCIe nodes (keeping NVLink nodes whole for the jobs that
              use the links); best fit within the preferred nodes, then anywhere
============  ==========================================================================
"""

from __future__ import annotations

import numpy as np

from gpuledger.pipeline.advisor.fragment import TaskMix, fgd_choice
from gpuledger.pipeline.simulate.scheduler import WHOLE, Placement, Scheduler
from gpuledger.pipeline.simulate.workload import Job


class BestFit:
    """The scheduler's best fit."""

    def place(self, sched: Scheduler, job: Job, free: np.ndarray,
              blocked: np.ndarray) -> list[int] | None:
        return sched.best_fit(job, free, blocked)


def _single_node(sched: Scheduler, job: Job) -> bool:
    return any(job.gpus <= n for _, n in sched._cards[(job.pool, job.card_type)])


class WorstFit:
    """Spread: the node (or GPU) with the most room."""

    def place(self, sched: Scheduler, job: Job, free: np.ndarray,
              blocked: np.ndarray) -> list[int] | None:
        if job.units >= WHOLE and not _single_node(sched, job):
            return sched.best_fit(job, free, blocked)
        lay = sched.layout
        key = (job.pool, job.card_type)
        usable = sched._usable(key, blocked)
        node_whole = sched._node_whole(usable, free)
        if job.units < WHOLE:
            cand = np.flatnonzero(usable & (free >= job.units))
            if cand.size == 0:
                return None
            pick = np.lexsort((cand, -node_whole[lay.gpu_node[cand]], -free[cand]))[0]
            return [int(cand[pick])]
        fits = sched._compat_node[key] & (node_whole >= job.gpus)
        if not fits.any():
            return None
        node = int(np.argmax(np.where(fits, node_whole, -1)))
        first = int(lay.node_first_gpu[node])
        span = slice(first, first + int(lay.node_gpus[node]))
        local = np.flatnonzero(usable[span] & (free[span] == WHOLE))[: job.gpus]
        return [first + int(i) for i in local]


class FGD:
    """Fragmentation gradient descent against each pool's task mix."""

    def __init__(self, mixes: dict[str, TaskMix]) -> None:
        self.mixes = mixes

    def place(self, sched: Scheduler, job: Job, free: np.ndarray,
              blocked: np.ndarray) -> list[int] | None:
        if job.units >= WHOLE and not _single_node(sched, job):
            return sched.best_fit(job, free, blocked)
        lay = sched.layout
        key = (job.pool, job.card_type)
        usable = sched._usable(key, blocked)
        width = int(lay.node_gpus.max())
        slot = np.arange(width)
        gidx = lay.node_first_gpu[:, None] + slot[None, :]
        valid = slot[None, :] < lay.node_gpus[:, None]
        gidx = np.where(valid, gidx, 0)
        mat = np.where(valid & usable[gidx], free[gidx], 0)
        if job.units < WHOLE:
            cand = np.flatnonzero((mat >= job.units).any(axis=1))
        else:
            cand = np.flatnonzero(sched._compat_node[key] & ((mat == WHOLE).sum(axis=1)
                                                            >= job.gpus))
        if cand.size == 0:
            return None
        mix = self.mixes.get(job.pool) or TaskMix.of([], WHOLE)
        node, slots = fgd_choice(mat, lay.node_gpus, cand, job.gpus, job.units, WHOLE, mix)
        return [int(lay.node_first_gpu[node]) + s for s in slots]


class TopologyAware:
    """NVLink nodes for multi-GPU jobs, PCIe nodes for the rest; best fit within."""

    def place(self, sched: Scheduler, job: Job, free: np.ndarray,
              blocked: np.ndarray) -> list[int] | None:
        nvlink = np.array([t == "nvlink" for t in sched.layout.node_topology], dtype=bool)
        wants_links = job.units >= WHOLE and job.gpus >= 2
        preferred = nvlink if wants_links else ~nvlink
        first = sched.best_fit(job, free, blocked | ~preferred)
        return first if first is not None else sched.best_fit(job, free, blocked)


def placement(name: str, mixes: dict[str, TaskMix]) -> Placement:
    """The placement policy called ``name`` (see the module docstring)."""
    if name == "best-fit":
        return BestFit()
    if name == "worst-fit":
        return WorstFit()
    if name == "fgd":
        return FGD(mixes)
    if name == "topology":
        return TopologyAware()
    raise ValueError(f"unknown placement {name!r}")
