"""Placement policies and the fragmentation measure, on hand-computed cases."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from gpuledger.pipeline.advisor.fragment import TaskMix, fgd_choice, node_fragment
from gpuledger.pipeline.advisor.placement import FGD, TopologyAware, WorstFit, placement
from gpuledger.pipeline.advisor.replay import layout_of
from gpuledger.pipeline.simulate.cluster import ClusterSpec, NodeGroup, Team
from gpuledger.pipeline.simulate.scheduler import WHOLE, Scheduler
from gpuledger.pipeline.simulate.workload import Job

HALF_AND_PAIRS = TaskMix.of([(1, 2), (2, WHOLE)], WHOLE)  # p = 0.5 each


def test_fragment_worked_example() -> None:
    """docs/whatif.md and advisor/fragment.py: free [4, 4, 2, 0] against half-GPU and
    2-GPU tasks: F = 0.5·0 + 0.5·2 = 1; a half task on GPU 2 gives 0, on GPU 0 gives 4."""
    gpus = np.array([4])
    assert node_fragment(np.array([[4, 4, 2, 0]]), gpus, WHOLE, HALF_AND_PAIRS)[0] == 1.0
    assert node_fragment(np.array([[4, 4, 0, 0]]), gpus, WHOLE, HALF_AND_PAIRS)[0] == 0.0
    assert node_fragment(np.array([[2, 4, 2, 0]]), gpus, WHOLE, HALF_AND_PAIRS)[0] == 4.0
    node, slots = fgd_choice(np.array([[4, 4, 2, 0]]), gpus, np.array([0]), 1, 2, WHOLE,
                             HALF_AND_PAIRS)
    assert (node, slots) == (0, [2])


def test_fragment_counts_cpu_and_nodes_too_small() -> None:
    """A task a node cannot run makes all of its free GPUs fragments: too little CPU, or
    a task bigger than the node that needs the node whole."""
    mix = TaskMix(np.array([1]), np.array([WHOLE]), np.array([1.0]), np.array([8.0]))
    free = np.array([[4, 4], [4, 4]])
    out = node_fragment(free, np.array([2, 2]), WHOLE, mix, cpu_free=np.array([16.0, 4.0]))
    assert out.tolist() == [0.0, 8.0]
    big = TaskMix.of([(16, WHOLE)], WHOLE)
    assert node_fragment(np.array([[4, 4], [4, 0]]), np.array([2, 2]), WHOLE,
                         big).tolist() == [0.0, 4.0]


def test_fgd_prefers_the_node_whose_fragmentation_grows_least() -> None:
    """Bin-packing case greedy best fit gets wrong: free 6 and 5 (8-GPU nodes), tasks of 3
    and 5 GPUs (p3 = 2/3, p5 = 1/3). A 3-GPU task on the 6 leaves 3: 5-GPU tasks no longer
    fit there (Δ = 3·p5 = 1); on the 5 (best fit's choice) it leaves 2, where nothing fits
    (Δ = 2). FGD takes the 6, keeping room for a 5-GPU task."""
    mix = TaskMix.of([(3, WHOLE)] * 2 + [(5, WHOLE)], WHOLE)  # p3 = 2/3, p5 = 1/3
    free = np.array([[4] * 6 + [0, 0], [4] * 5 + [0] * 3])
    node, slots = fgd_choice(free, np.array([8, 8]), np.array([0, 1]), 3, WHOLE, WHOLE, mix)
    assert node == 0 and slots == [0, 1, 2]


def _sched(nodes: pl.DataFrame, jobs: list[Job]) -> Scheduler:
    layout = layout_of(nodes)
    groups = tuple(NodeGroup(f"g{i}", p, c, 1, int(n), 1.0) for i, (p, c, n) in enumerate(
        zip(layout.node_pool, layout.node_card, layout.node_gpus.tolist(), strict=True)))
    spec = ClusterSpec("t", groups, (Team("t", 1, {"p": 64}),), (), ())
    return Scheduler(spec, layout, jobs, seed=0, start_s=0, end_s=3600)


def _job(gpus: int, units: int = WHOLE) -> Job:
    return Job(0, "j", "w", "p", "t", "u", "q", "p", 0, "training", gpus, units, None, 0.0,
               False, 0, 0, 60, 60, "finished", None, 0.0, 0.0, 0.0, 0.0, 0)


def _nodes(*rows: tuple[str, int, bool]) -> pl.DataFrame:
    return pl.DataFrame({"node": [r[0] for r in rows], "pool": ["p"] * len(rows),
                         "card_type": ["C"] * len(rows), "gpus": [r[1] for r in rows],
                         "nvlink": [r[2] for r in rows]})


def test_worst_fit_spreads_and_best_fit_packs() -> None:
    sched = _sched(_nodes(("a", 4, False), ("b", 4, False)), [_job(1)])
    free = np.array([4, 0, 0, 0, 4, 4, 4, 4])  # a: 1 free, b: 4 free
    blocked = np.zeros(2, dtype=bool)
    assert placement("best-fit", {}).place(sched, _job(1), free, blocked) == [0]
    assert WorstFit().place(sched, _job(1), free, blocked) == [4]
    # a shared job goes to the GPU with the most room (best fit: the least)
    free = np.array([1, 3, 0, 0, 4, 4, 4, 4])
    assert placement("best-fit", {}).place(sched, _job(1, 1), free, blocked) == [0]
    assert WorstFit().place(sched, _job(1, 1), free, blocked) == [4]


def test_topology_aware_keeps_nvlink_nodes_for_multi_gpu_jobs() -> None:
    """a: PCIe, 4 GPUs; b: NVLink, 4 GPUs, both empty. Best fit takes a (name order) for
    both; topology-aware puts the 1-GPU job on PCIe and the 2-GPU job on NVLink."""
    sched = _sched(_nodes(("a", 4, False), ("b", 4, True)), [_job(1)])
    free = np.full(8, WHOLE)
    blocked = np.zeros(2, dtype=bool)
    topo = TopologyAware()
    assert placement("best-fit", {}).place(sched, _job(2), free, blocked) == [0, 1]
    assert topo.place(sched, _job(2), free, blocked) == [4, 5]
    assert topo.place(sched, _job(1), free, blocked) == [0]
    # with no NVLink room left, it falls back to any node
    free[4:] = 0
    assert topo.place(sched, _job(2), free, blocked) == [0, 1]


def test_fgd_placement_in_the_scheduler() -> None:
    """The scheduler-facing FGD: a half-GPU job joins the half-used GPU of the node."""
    sched = _sched(_nodes(("a", 4, False), ("b", 4, False)), [_job(1)])
    fgd = FGD({"p": HALF_AND_PAIRS})
    free = np.array([4, 4, 4, 4, 4, 2, 4, 0])
    assert fgd.place(sched, _job(1, 2), free, np.zeros(2, dtype=bool)) == [5]
    with pytest.raises(ValueError, match="unknown placement"):
        placement("random", {})
