"""The shared best-fit placement (importers and the Kubernetes bridge)."""

from __future__ import annotations

import random

import pytest

from gpuledger.bridges.placement import Placer


def test_whole_gpus_go_to_the_fullest_node_that_fits() -> None:
    placer = Placer({"b": 8, "a": 8, "c": 4})
    assert placer.place(2) == [("c", 0, 1.0), ("c", 1, 1.0)]      # fewest free: c (4)
    assert placer.place(4) == [("a", 0, 1.0), ("a", 1, 1.0), ("a", 2, 1.0), ("a", 3, 1.0)]
    assert placer.place(3) == [("a", 4, 1.0), ("a", 5, 1.0), ("a", 6, 1.0)]  # a has 4 < b 8
    assert placer.place(9) is None


def test_shares_pack_onto_partly_used_gpus() -> None:
    placer = Placer({"n": 2})
    assert placer.place(1, 0.5) == [("n", 0, 0.5)]
    assert placer.place(1, 0.25) == [("n", 0, 0.25)]                 # least room that fits
    assert placer.place(1, 0.5) == [("n", 1, 0.5)]                   # 0.25 left on GPU 0
    placer.release([("n", 0, 0.5)])
    assert placer.free["n"] == [pytest.approx(0.75), 0.5]


def test_place_on_a_given_node_and_growing_unknown_nodes() -> None:
    placer = Placer({"n": 4})
    placer.take([("n", 0, 1.0), ("n", 2, 1.0)])
    assert placer.place_on("n", 2) == [("n", 1, 1.0), ("n", 3, 1.0)]
    assert placer.place_on("n", 1) is None
    assert placer.place_on("n", 1, grow=True) == [("n", 4, 1.0)]
    assert placer.place_on("new", 2, grow=True) == [("new", 0, 1.0), ("new", 1, 1.0)]
    assert placer.place_on("new", 1, 3 / 7, grow=True) == [("new", 2, 3 / 7)]


def test_never_overcommits_a_gpu() -> None:
    rng = random.Random(3)
    placer = Placer({f"n{i}": 8 for i in range(4)})
    held: list[list[tuple[str, int, float]]] = []
    for _ in range(2000):
        if held and rng.random() < 0.45:
            placer.release(held.pop(rng.randrange(len(held))))
            continue
        got = placer.place(rng.choice([1, 2, 4, 8]), 1.0) if rng.random() < 0.7 \
            else placer.place(1, rng.choice([0.25, 0.5, 1 / 7]))
        if got:
            held.append(got)
        use: dict[tuple[str, int], float] = {}
        for slots in held:
            for node, index, frac in slots:
                use[(node, index)] = use.get((node, index), 0.0) + frac
        assert max(use.values(), default=0.0) <= 1.0 + 1e-9
        for (node, index), used in use.items():
            assert placer.free[node][index] == pytest.approx(1.0 - used)
