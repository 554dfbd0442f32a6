"""frag(k), blocked demand and demand-weighted fragmentation on hand-drawn layouts."""

from __future__ import annotations

from collections.abc import Callable

import polars as pl
import pytest
from conftest import Facts
from events import alloc, at, inventory, job


def _layout(pending: list[tuple[str, int]]) -> list[dict[str, object]]:
    """Four 8-GPU nodes with free GPUs (3, 1, 4, 0) from 10:00 to 10:10."""
    recs: list[dict[str, object]] = [inventory(f"n{i}", at(0), gpus=8) for i in range(4)]
    held = {"n0": 5, "n1": 7, "n2": 4, "n3": 8}
    for node, n in held.items():
        recs += [job("submitted", f"hold-{node}", at(0), gpus=n),
                 job("started", f"hold-{node}", at(0), allocation=alloc(node, *range(n)))]
    for job_id, gpus in pending:
        recs.append(job("submitted", job_id, at(0), gpus=gpus))
    recs.append(job("checkpointed", "hold-n0", at(10)))  # moves event time to 10:10
    return recs


def test_frag_k_on_a_hand_drawn_layout(process: Callable[..., Facts]) -> None:
    frag = process(_layout([])).table("frag_minute")
    assert frag.height == 10
    row = frag.row(0, named=True)
    assert row["free_gpus"] == 8
    assert row["largest_free_block"] == 4
    assert row["frag_1"] == 0.0
    assert row["frag_2"] == pytest.approx(1 - 6 / 8)     # 2 + 0 + 4 usable
    assert row["frag_4"] == pytest.approx(1 - 4 / 8)
    assert row["frag_8"] == pytest.approx(1.0)
    assert row["frag_node"] == pytest.approx(1.0)
    assert row["node_size"] == 8


def test_blocked_demand_and_demand_weighted_rate(process: Callable[..., Facts]) -> None:
    facts = process(_layout([("fits4", 4), ("blocked6", 6), ("toobig16", 16)]))
    blocked = facts.table("blocked_minute")
    assert set(blocked["job_id"]) == {"blocked6"}       # 6 ≤ F = 8 but no node has 6
    assert blocked.height == 10
    frag = facts.table("frag_minute").row(0, named=True)
    assert frag["pending_jobs"] == 3
    assert frag["pending_gpus"] == 26
    assert frag["blocked_jobs"] == 1
    assert frag["blocked_gpus"] == 6
    # weights g: 4 → frag(4) = 0.5; 6 → 1 − 6·0/8 = 1; 16 (k = 8) → frag(8) = 1
    expected = (4 * 0.5 + 6 * 1.0 + 16 * 1.0) / 26
    assert frag["frag_demand"] == pytest.approx(expected)
    assert frag["demand_source"] == "pending"


def test_fallback_weights_from_started_sizes(process: Callable[..., Facts]) -> None:
    # nothing pending: the weights are the sizes started in the last day (5, 7, 4, 8)
    row = process(_layout([])).table("frag_minute").row(0, named=True)
    assert row["demand_source"] == "started_1d"
    # frag(5) = frag(7) = frag(8) = 1 (no node has 5 free), frag(4) = 0.5
    assert row["frag_demand"] == pytest.approx((5 + 7 + 4 * 0.5 + 8) / 24)


def test_shared_gpu_is_not_free(process: Callable[..., Facts]) -> None:
    recs = [inventory("n0", at(0), gpus=2),
            job("submitted", "s", at(0), gpus=1),
            job("started", "s", at(0), allocation=alloc("n0", 0, fraction=0.25)),
            job("checkpointed", "s", at(5))]
    row = process(recs).table("frag_minute").row(0, named=True)
    assert row["free_gpus"] == 1


def test_unhealthy_and_drained_nodes_are_not_free(process: Callable[..., Facts]) -> None:
    recs = [inventory("a", at(0), gpus=4, unhealthy=[0]),
            inventory("b", at(0), gpus=4, schedulable=False),
            inventory("c", at(0), gpus=4, health="down"),
            job("submitted", "x", at(0)), job("checkpointed", "x", at(5))]
    row = process(recs).table("frag_minute").row(0, named=True)
    assert row["free_gpus"] == 3
    assert row["healthy_nodes"] == 1


def test_any_card_job_counts_on_each_card_type(process: Callable[..., Facts]) -> None:
    recs: list[dict[str, object]] = [
        inventory("h", at(0), gpus=4), inventory("a", at(0), gpus=4, card="A100-SXM4-80GB")]
    # 2 free on each node: F = 4 over both card types, no node has 3
    for node in ("h", "a"):
        recs += [job("submitted", f"hold-{node}", at(0), gpus=2),
                 job("started", f"hold-{node}", at(0), allocation=alloc(node, 0, 1))]
    recs += [job("submitted", "any3", at(0), gpus=3, card_type=None),
             job("checkpointed", "hold-h", at(5))]
    facts = process(recs)
    blocked = facts.table("blocked_minute")
    assert set(blocked["job_id"]) == {"any3"} and blocked.height == 5
    frag = facts.table("frag_minute").filter(pl.col("minute") == at(0))
    by_card = {r["card_type"]: r for r in frag.iter_rows(named=True)}
    for card in ("H100-SXM5-80GB", "A100-SXM4-80GB"):
        assert by_card[card]["pending_jobs"] == 1
        assert by_card[card]["blocked_jobs"] == 1
    pend = facts.table("pending_minute")
    assert pend.filter(pl.col("minute") == at(0))["pending_jobs"].sum() == 1


def test_frag_node_uses_each_nodes_own_size(process: Callable[..., Facts]) -> None:
    """A pool mixing 1-, 4- and 8-GPU nodes (docs/metrics.md, worked example): free
    GPUs a 1/1, b 4/4, c 2/4, d 8/8, e 5/8 → F = 20. Whole free nodes hold 1 + 4 + 8 =
    13 of them: frag(node) = 1 − 13/20 = 0.35. With the largest size (8) for every node
    it would be 1 − 8/20 = 0.6, which is frag(8)."""
    sizes = {"a": 1, "b": 4, "c": 4, "d": 8, "e": 8}
    held = {"c": 2, "e": 3}
    recs: list[dict[str, object]] = [inventory(n, at(0), gpus=g) for n, g in sizes.items()]
    for node, n in held.items():
        recs += [job("submitted", f"hold-{node}", at(0), gpus=n),
                 job("started", f"hold-{node}", at(0), allocation=alloc(node, *range(n)))]
    recs.append(job("checkpointed", "hold-c", at(5)))
    row = process(recs).table("frag_minute").row(0, named=True)
    assert row["free_gpus"] == 20
    assert row["node_size"] == 8                                  # the largest node
    assert row["whole_node_free_gpus"] == 13
    assert row["frag_node"] == pytest.approx(1 - 13 / 20)
    assert row["frag_8"] == pytest.approx(1 - 8 / 20)
    assert row["frag_4"] == pytest.approx(1 - (4 + 8 + 4) / 20)   # b, d, e: 4 + 8 + 4


@pytest.mark.parametrize("outage", ["down", "drained"])
def test_a_pool_with_no_healthy_node_keeps_its_minutes(
        process: Callable[..., Facts], outage: str) -> None:
    """The pool's one node is down (or drained) from 10:20 to 10:40 while a 2-GPU job
    waits. Those minutes kept no `frag_minute` row: the pool's fragmentation had a hole,
    and the pending job was not counted there (25 pending job-minutes against
    `pending_minute`'s 45, a probe). Now each minute has its row, with no free GPU."""
    off = {"health": "down"} if outage == "down" else {"schedulable": False}
    recs: list[dict[str, object]] = [
        inventory("n0", at(0), gpus=1), inventory("n0", at(20), gpus=1, **off),
        inventory("n0", at(40), gpus=1),
        job("submitted", "hold", at(0), gpus=1),
        job("started", "hold", at(0), allocation=alloc("n0", 0)),
        job("submitted", "wait", at(0), gpus=2),
        job("checkpointed", "hold", at(45))]
    facts = process(recs)
    frag = facts.table("frag_minute").sort("minute")
    assert frag.height == 45
    gone = frag.filter((pl.col("minute") >= at(20)) & (pl.col("minute") < at(40)))
    assert gone.height == 20
    assert gone["free_gpus"].to_list() == [0] * 20
    assert gone["healthy_nodes"].to_list() == [0] * 20
    assert gone["pending_jobs"].to_list() == [1] * 20
    assert frag["pending_jobs"].sum() == facts.table("pending_minute")["pending_jobs"].sum()


def test_only_jobs_of_no_gpu_pending_weigh_nothing(process: Callable[..., Facts]) -> None:
    """Only a 0-GPU job pending: the demand-weighted rate was 0 / 0 (NaN, written so);
    now such jobs weigh nothing, and the rate falls back to the sizes started."""
    recs = [*_layout([]), job("submitted", "cpu-only", at(0), gpus=0)]
    row = process(recs).table("frag_minute").row(0, named=True)
    assert row["pending_jobs"] == 1
    assert row["demand_source"] == "started_1d"
    assert row["frag_demand"] == pytest.approx((5 + 7 + 4 * 0.5 + 8) / 24)
