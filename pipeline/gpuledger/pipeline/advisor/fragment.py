"""The fragmentation measure of Weng et al., "Beware of Fragmentation" (USENIX ATC '23),
and the choice of Fragmentation Gradient Descent (FGD).

A node's state is the free capacity of each of its GPUs, in integer *units* (``whole``
units make a GPU: 4 quarters in the simulator, 1000 milli-GPUs in the openb trace), and
optionally its free CPU. A *task* asks for ``gpus`` GPUs of ``units`` each (a shared task
asks for one GPU and ``units < whole``; other tasks take whole GPUs) and ``cpu``.

*Fragment of node n for task m* ``F_n(m)``: the free GPU capacity of ``n`` that ``m``
cannot use:

- if ``m`` cannot run on ``n`` at all (too little CPU, no GPU with ``units`` free for a
  shared task, fewer than ``gpus`` completely free GPUs for a whole-GPU task, the node
  not completely free for a task bigger than the node), every free unit of ``n``;
- otherwise the free units of the GPUs that have less than ``min(units, whole)`` free
  (for a whole-GPU task: the partly used GPUs).

*Expected fragment* ``F_n(M) = Σ_m p_m F_n(m)`` over a target workload ``M`` of task
types with popularity ``p_m`` (the history's mix). FGD places a task where ``F_n(M)``
grows least (the steepest descent of the cluster's fragmentation ``Σ_n F_n(M)``); ties go
to the node with the least free capacity left (best fit), then the lowest index.

Worked example (quarters, ``whole`` = 4; one 4-GPU node with free ``[4, 4, 2, 0]``; a
workload of half-GPU tasks (p = 0.5) and 2-GPU tasks (p = 0.5)): a half-GPU task can use
every free GPU, fragment 0; a 2-GPU task can run (two free GPUs) but cannot use the 2
free quarters of GPU 2: fragment 2. ``F_n(M) = 0.5·0 + 0.5·2 = 1``. Placing a half-GPU
task on GPU 2 gives ``[4, 4, 0, 0]`` and ``F_n(M) = 0``: Δ = −1; on GPU 0 it gives
``[2, 4, 2, 0]``: a 2-GPU task no longer fits (one completely free GPU), all 8 free
units are its fragment: ``F_n(M) = 0.5·0 + 0.5·8 = 4``, Δ = +3. FGD takes GPU 2 (best fit
would too); the tests pin this example (``tests/test_advisor_placement.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class TaskMix:
    """Task types of a target workload: aligned arrays, ``weight`` sums to 1."""

    gpus: np.ndarray  # GPUs per task
    units: np.ndarray  # units per GPU (``whole`` for whole-GPU tasks)
    weight: np.ndarray  # popularity
    cpu: np.ndarray | None = None  # CPU per task (None: CPU is not modelled)

    @staticmethod
    def of(tasks: list[tuple[int, int]], whole: int, cpu: list[float] | None = None) -> TaskMix:
        """The mix of a list of ``(gpus, units)`` tasks (one per task; repeats count)."""
        if not tasks:
            return TaskMix(np.array([1]), np.array([whole]), np.array([1.0]))
        keys = [(g, u, c) for (g, u), c in zip(tasks, cpu or [0.0] * len(tasks), strict=True)]
        kinds: dict[tuple[int, int, float], int] = {}
        for k in keys:
            kinds[k] = kinds.get(k, 0) + 1
        ordered = sorted(kinds.items())
        arr = np.array([k for k, _ in ordered], dtype=np.float64)
        weight = np.array([n for _, n in ordered], dtype=np.float64)
        return TaskMix(arr[:, 0].astype(np.int64), arr[:, 1].astype(np.int64),
                       weight / weight.sum(), arr[:, 2] if cpu is not None else None)


def node_fragment(free: np.ndarray, node_gpus: np.ndarray, whole: int, mix: TaskMix,
                  cpu_free: np.ndarray | None = None) -> np.ndarray:
    """``F_n(M)`` for each row of ``free`` (nodes × GPU slots, 0 beyond ``node_gpus``),
    for all task types at once (types × nodes arrays)."""
    total = free.sum(axis=1).astype(np.float64)
    full = (free == whole).sum(axis=1)
    most = free.max(axis=1, initial=0)
    g, u = mix.gpus[:, None], mix.units[:, None]
    runs = np.where(u < whole, most[None, :] >= u,
                    np.where(g <= node_gpus[None, :], full[None, :] >= g,
                             full[None, :] == node_gpus[None, :]))
    if cpu_free is not None and mix.cpu is not None:
        runs &= cpu_free[None, :] >= mix.cpu[:, None]
    # free units on GPUs with less than a task's need, one row per distinct need
    needs, which = np.unique(np.minimum(mix.units, whole), return_inverse=True)
    partial = (free > 0)[None, :, :] & (free[None, :, :] < needs[:, None, None])
    stuck = np.where(partial, free[None, :, :], 0).sum(axis=2).astype(np.float64)
    per_type = np.where(runs, stuck[which], total[None, :])
    out: np.ndarray = (mix.weight[:, None] * per_type).sum(axis=0)
    return out


def fgd_choice(free: np.ndarray, node_gpus: np.ndarray, candidates: np.ndarray,
               gpus: int, units: int, whole: int, mix: TaskMix,
               cpu_free: np.ndarray | None = None, cpu: float = 0.0) -> tuple[int, list[int]]:
    """FGD's pick among ``candidates`` (node rows that can run the task, ascending): the
    row and the GPU slots it takes. ``free`` is nodes × slots; whole-GPU tasks take the
    lowest free slots, a shared task is tried on every slot with room. Every candidate
    placement is laid out at once (one row each, candidates then slots in order)."""
    near = free[candidates]
    on_node = np.arange(free.shape[1])[None, :] < node_gpus[candidates][:, None]
    if units < whole:
        row, slot = np.nonzero(on_node & (near >= units))
        idx = candidates[row]
        after = near[row]
        after[np.arange(row.size), slot] -= units
        taken = slot[:, None]
    else:
        full = on_node & (near == whole)
        taken_mask = full & (np.cumsum(full, axis=1) <= gpus)
        idx = candidates
        after = near.copy()
        after[taken_mask] -= units
        taken = taken_mask
    before = free[idx]
    ngpu = node_gpus[idx]
    cpu_before = cpu_free[idx] if cpu_free is not None else np.zeros(idx.size)
    # identical (state, CPU, size) candidates score alike: score each distinct one once
    key = np.column_stack([before, after, cpu_before, ngpu]).astype(np.float64)
    first, back = distinct_rows(key)
    with_cpu = cpu_free is not None
    u_gpus, u_cpu = ngpu[first], cpu_before[first]
    delta = (node_fragment(after[first], u_gpus, whole, mix, u_cpu - cpu if with_cpu else None)
             - node_fragment(before[first], u_gpus, whole, mix,
                             u_cpu if with_cpu else None))[back]
    left = after.sum(axis=1)
    pick = int(np.lexsort((np.arange(idx.size), left, np.round(delta, 9)))[0])
    slots = ([int(taken[pick, 0])] if units < whole
             else np.flatnonzero(taken[pick]).tolist())
    return int(idx[pick]), slots


_MIX = np.uint64(0x9E3779B97F4A7C15)
_SHIFT = np.uint64(31)


def distinct_rows(key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct rows of ``key`` (2-D): the index of each one's first row, and for each
    row the position of its distinct row in that list. Rows are told apart by a 64-bit
    hash of their bits, then checked against the row they were taken for; a collision
    (never seen) falls back to sorting the rows whole (``np.unique(axis=0)``, ~100× the
    time on a thousand rows of 18 columns)."""
    bits = np.ascontiguousarray(key, dtype=np.float64).view(np.uint64)
    hashed = np.zeros(bits.shape[0], dtype=np.uint64)
    for column in bits.T:
        hashed = (hashed ^ column) * _MIX
        hashed ^= hashed >> _SHIFT
    _, first, back = np.unique(hashed, return_index=True, return_inverse=True)
    back = back.reshape(-1)
    if not np.array_equal(key[first][back], key):
        _, first, back = np.unique(key, axis=0, return_index=True, return_inverse=True)
        back = back.reshape(-1)
    return first, back
