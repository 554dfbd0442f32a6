"""Placement policies and the fragmentation measure, on hand-computed cases."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuledger.pipeline.advisor.fragment import (
    TaskMix,
    distinct_rows,
    fgd_choice,
    node_fragment,
)
from gpuledger.pipeline.advisor.placement import FGD, TopologyAware, WorstFit, placement
from gpuledger.pipeline.advisor.replay import layout_of
from gpuledger.pipeline.simulate.cluster import ClusterSpec, NodeGroup, Team
from gpuledger.pipeline.simulate.scheduler import (
    WHOLE,
    Rules,
    Scheduler,
    _checkpoints_before,
    _checkpoints_before_each,
)
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


def _choice_by_definition(free: np.ndarray, node_gpus: np.ndarray, candidates: np.ndarray,
                          gpus: int, units: int, whole: int, mix: TaskMix,
                          cpu_free: np.ndarray | None, cpu: float) -> tuple[int, list[int]]:
    """FGD's pick, one placement at a time: each candidate node in turn, each slot with
    room for a shared task (the lowest completely free slots for a whole-GPU task); the
    least growth of F_n(M), then the least free capacity left, then the first."""
    best: tuple[float, int, int] | None = None
    pick: tuple[int, list[int]] = (-1, [])
    order = 0
    for n in candidates.tolist():
        k = int(node_gpus[n])
        options = ([[s] for s in range(k) if free[n, s] >= units] if units < whole
                   else [[s for s in range(k) if free[n, s] == whole][:gpus]])
        for slots in options:
            after = free[n].copy()
            after[slots] -= units
            cpus = None if cpu_free is None else cpu_free[[n]]
            grown = (node_fragment(after[None], node_gpus[[n]], whole, mix,
                                   None if cpus is None else cpus - cpu)[0]
                     - node_fragment(free[n][None], node_gpus[[n]], whole, mix, cpus)[0])
            score = (float(np.round(grown, 9)), int(after.sum()), order)
            if best is None or score < best:
                best, pick = score, (n, slots)
            order += 1
    return pick


@st.composite
def _fgd_case(draw: st.DrawFn) -> tuple:  # type: ignore[type-arg]
    whole = draw(st.sampled_from([4, 1000]))
    width = draw(st.integers(1, 8))
    nodes = draw(st.integers(1, 12))
    node_gpus = np.array([draw(st.integers(1, width)) for _ in range(nodes)])
    # few distinct levels, so that identical nodes (scored once) are common
    levels = [0, whole // 4, whole // 2, whole]
    free = np.array([[draw(st.sampled_from(levels)) if s < node_gpus[n] else 0
                      for s in range(width)] for n in range(nodes)], dtype=np.int64)
    with_cpu = draw(st.booleans())
    cpu_free = (np.array([draw(st.sampled_from([0.0, 4.0, 8.0, 16.0])) for _ in range(nodes)])
                if with_cpu else None)
    kinds = draw(st.lists(st.tuples(st.integers(1, 8), st.sampled_from(levels[1:])),
                          min_size=1, max_size=6))
    tasks = [(1, u) if u < whole else (g, u) for g, u in kinds]
    mix = TaskMix.of(tasks, whole, [draw(st.sampled_from([1.0, 6.0])) for _ in tasks]
                     if with_cpu else None)
    shared = draw(st.booleans())
    gpus, units = (1, draw(st.sampled_from(levels[1:3]))) if shared else (
        draw(st.integers(1, width)), whole)
    fits = ((free >= units).any(axis=1) if units < whole
            else (free == whole).sum(axis=1) >= gpus)
    candidates = np.flatnonzero(fits)
    cpu = draw(st.sampled_from([0.0, 2.0]))
    return free, node_gpus, candidates, gpus, units, whole, mix, cpu_free, cpu


@settings(max_examples=300, deadline=None)
@given(_fgd_case())
def test_fgd_choice_equals_the_one_placement_at_a_time_definition(case: tuple) -> None:  # type: ignore[type-arg]
    """All candidate placements laid out at once, identical ones scored once, pick what
    scoring each placement on its own picks: the node and the slots."""
    free, node_gpus, candidates, gpus, units, whole, mix, cpu_free, cpu = case
    if candidates.size == 0:
        return
    expected = _choice_by_definition(free, node_gpus, candidates, gpus, units, whole, mix,
                                     cpu_free, cpu)
    assert fgd_choice(free, node_gpus, candidates, gpus, units, whole, mix,
                      cpu_free, cpu) == expected


def test_fgd_scores_nodes_alike_only_when_their_cpu_is_alike_too() -> None:
    """Two nodes with the same free GPUs, 8 and 16 CPUs free; the mix is 1-GPU tasks of
    8 CPUs; a 1-GPU task of 4 CPUs leaves 4 CPUs on the first (nothing of the mix fits
    there any more: its 4 free units become fragment, Δ +4) and 12 on the second (Δ 0)."""
    mix = TaskMix.of([(1, WHOLE)], WHOLE, [8.0])
    free = np.array([[4, 4], [4, 4]])
    node, slots = fgd_choice(free, np.array([2, 2]), np.array([0, 1]), 1, WHOLE, WHOLE, mix,
                             cpu_free=np.array([8.0, 16.0]), cpu=4.0)
    assert (node, slots) == (1, [0])


def test_distinct_rows_tells_rows_apart_exactly() -> None:
    """The first row of each distinct row, and where each row's distinct row is; rows that
    differ in one bit only, or by sign of zero, are not merged into a wrong row."""
    key = np.array([[1.0, 2.0], [1.0, 2.0], [2.0, 1.0], [1.0, 2.0000000000000004],
                    [0.0, 0.0], [-0.0, 0.0], [2.0, 1.0]])
    first, back = distinct_rows(key)
    assert np.array_equal(key[first][back], key)
    assert back[0] == back[1] and back[2] == back[6]
    assert len({back[0], back[2], back[3], back[4]}) == 4
    assert sorted(first.tolist())[:3] == [0, 2, 3]


def test_distinct_rows_stays_exact_when_every_hash_collides(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """With a hash that gives every row the same value, the check finds the collision
    and the rows are sorted whole: still the exact distinct rows."""
    from gpuledger.pipeline.advisor import fragment
    key = np.array([[1.0, 2.0], [3.0, 4.0], [1.0, 2.0], [5.0, 6.0]])
    monkeypatch.setattr(fragment, "_MIX", np.uint64(0))
    first, back = distinct_rows(key)
    assert np.array_equal(key[first][back], key)
    assert back[0] == back[2] and len({back[0], back[1], back[3]}) == 3


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


def test_preemption_takes_the_cheapest_victims_that_make_room() -> None:
    """One 8-GPU node, full at 1,515 s: A (priority 0, 2 GPUs from 0 s, a checkpoint every
    500 s: work lost since 1,500 s, 15 s × 2 GPUs), B (priority 9, 2 GPUs from 1,400 s:
    not below the newcomer's priority, never a victim) and C (priority 0, 4 GPUs from
    1,400 s: 115 s × 4 GPUs lost; it started last, but loses more than A). A 6-GPU job of
    priority 5 takes A first, then C; the pruning pass keeps both (C alone leaves 4
    GPUs). A 4-GPU job takes A, then C, and the pruning pass lets A go on. An 8-GPU job
    would need B too: nothing is preempted."""
    def job(i: int, gpus: int, priority: int, checkpoint_s: int = 0) -> Job:
        return Job(i, f"j{i}", "w", "p", "t", "u", "q", "p", priority, "training", gpus,
                   WHOLE, None, 0.0, True, checkpoint_s, 0, 3600, 3600, "finished", None,
                   0.0, 0.0, 0.0, 0.0, 0)
    jobs = [job(0, 2, 0, checkpoint_s=500), job(1, 2, 9), job(2, 4, 0), job(3, 6, 5)]
    sched = _sched(_nodes(("n", 8, False)), jobs)
    sched._start(0, [0, 1], 0)
    sched._start(1, [2, 3], 1400)
    sched._start(2, [4, 5, 6, 7], 1400)
    blocked = np.zeros(1, dtype=bool)
    gpus = sched._search_victims(jobs[3], blocked, 1515)
    assert gpus is not None and sorted(gpus) == [0, 1, 4, 5, 6, 7]
    assert sorted(sched.running) == [1]
    preempted = [e for e in sched.log if e.event == "preempted"]
    assert [e.job for e in preempted] == [0, 2]
    # a 4-GPU job of priority 5 on the node as it was: C alone is enough
    four, eight = job(4, 4, 5), job(5, 8, 5)
    again = _sched(_nodes(("n", 8, False)), [*jobs, four, eight])
    for j, gpus_of, at in ((0, [0, 1], 0), (1, [2, 3], 1400), (2, [4, 5, 6, 7], 1400)):
        again._start(j, gpus_of, at)
    assert again._search_victims(eight, blocked, 1515) is None
    assert sorted(again.running) == [0, 1, 2]
    assert sorted(again._search_victims(four, blocked, 1515) or []) == [4, 5, 6, 7]
    assert sorted(again.running) == [0, 1]


def test_reclaim_takes_only_other_teams_borrowed_attempts() -> None:
    """Team t's quota is 1 GPU of the 8-GPU node, team u's 8: t's 4-GPU attempt borrows.
    With priority preemption off, a 4-GPU job of u reclaims it; a job of t reclaims
    nothing from its own team."""
    def job(i: int, team: str) -> Job:
        return Job(i, f"j{i}", "w", "p", team, "u", "q", "p", 0, "training", 4, WHOLE,
                   None, 0.0, False, 0, 0, 3600, 3600, "finished", None, 0.0, 0.0, 0.0,
                   0.0, 0)
    jobs = [job(0, "t"), job(1, "u"), job(2, "t"), job(3, "u")]
    layout = layout_of(_nodes(("n", 8, False)))
    spec = ClusterSpec("t", (NodeGroup("g", "p", "C", 1, 8, 1.0),),
                       (Team("t", 1, {"p": 1}), Team("u", 1, {"p": 8})), (), ())
    sched = Scheduler(spec, layout, jobs, seed=0, start_s=0, end_s=3600,
                      rules=Rules(preempt_priority=False))
    sched._start(0, [0, 1, 2, 3], 0)       # t: borrowed
    sched._start(1, [4, 5, 6, 7], 0)       # u: within its quota
    assert sched.running[0].borrowed and not sched.running[1].borrowed
    blocked = np.zeros(1, dtype=bool)
    assert sched._search_victims(jobs[2], blocked, 60) is None     # t's own attempt
    assert sorted(sched.running) == [0, 1]
    assert sorted(sched._search_victims(jobs[3], blocked, 60) or []) == [0, 1, 2, 3]
    assert sorted(sched.running) == [1]


def test_checkpoints_before_counts_alike_one_at_a_time_and_as_arrays() -> None:
    """Checkpoints strictly before t: every 600 s from a start at 0, none at 600 s itself
    (written at 600, not before), one at 601; never for an interval of 0 or before the
    start. The array form gives what the one-at-a-time form gives, case by case."""
    assert [_checkpoints_before(0, t, 600) for t in (0, 599, 600, 601, 1201)] == [0, 0, 0, 1, 2]
    assert _checkpoints_before(100, 50, 600) == 0 and _checkpoints_before(0, 5000, 0) == 0
    starts, ts, everys = np.meshgrid(np.arange(0, 1300, 97), np.arange(0, 2600, 131),
                                     np.array([0, 1, 7, 300, 600]))
    for t in np.unique(ts).tolist():
        pick = ts == t
        each = _checkpoints_before_each(starts[pick], t, everys[pick])
        assert each.tolist() == [_checkpoints_before(int(s), t, int(e)) for s, e in zip(
            starts[pick].tolist(), everys[pick].tolist(), strict=True)]


def test_an_attempt_on_two_kinds_of_card_is_a_victim_for_either_kind() -> None:
    """Node a has A cards, node b B cards (one pool). An attempt that holds a GPU of each
    (no placement makes one; the search still reads it GPU by GPU) may be preempted for
    a job that asks for B cards; an attempt on A cards alone may not."""
    def job(i: int, gpus: int, priority: int, card: str | None) -> Job:
        return Job(i, f"j{i}", "w", "p", "t", "u", "q", "p", priority, "training", gpus,
                   WHOLE, card, 0.0, True, 0, 0, 3600, 3600, "finished", None, 0.0, 0.0,
                   0.0, 0.0, 0)
    nodes = pl.DataFrame({"node": ["a", "b"], "pool": ["p", "p"], "card_type": ["A", "B"],
                          "gpus": [2, 2], "nvlink": [False, False]})
    jobs = [job(0, 2, 0, None), job(1, 1, 0, "A"), job(2, 1, 0, "B"), job(3, 2, 5, "B")]
    sched = _sched(nodes, jobs)
    sched._start(0, [1, 2], 0)          # one A card, one B card
    sched._start(1, [0], 0)             # the other A card
    sched._start(2, [3], 0)             # the other B card
    run = sched._running_in("p")
    assert run is not None
    usable = dict(zip(run.job.tolist(), sched._on_usable_gpus(run, ("p", "B")).tolist(),
                      strict=True))
    assert usable == {0: True, 1: False, 2: True}
