"""What-if replay on hand-made histories: each policy's outcome computed by hand.

Each history is written as contract events, processed by the real processor into a
warehouse (no telemetry: the replay needs scheduler events and the inventory only),
read back by ``load_history`` and replayed through the simulator's scheduler. The
scheduler passes every 15 s after a change, so a job that could start at once starts at
the next multiple of 15 s.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import polars as pl
import pytest
from conftest import Facts
from events import alloc, at, inventory, job

from gpuledger.pipeline.advisor.answers import answers
from gpuledger.pipeline.advisor.history import load_history
from gpuledger.pipeline.advisor.policy import Policy, PolicySet
from gpuledger.pipeline.advisor.replay import Run, as_run, prepare, replay

CARD = "H100-SXM5-80GB"


def _submit(job_id: str, t_min: float, gpus: int, **kw: Any) -> dict[str, Any]:
    fields = {"gpus": gpus, "queue": "research", "team": "vision", "card_type": None,
              "checkpointable": False, **kw}
    return job("submitted", job_id, at(t_min), **fields)


def _attempt(job_id: str, start: float, end: float, node: str, *gpus: int,
             event: str = "finished") -> list[dict[str, Any]]:
    return [job("started", job_id, at(start), allocation=alloc(node, *gpus)),
            job(event, job_id, at(end))]


def _replay(facts: Facts, *policies: Policy, quotas: dict[str, dict[str, int]] | None = None
            ) -> dict[str, Run]:
    h = load_history(facts.root)
    ps = PolicySet(policies=policies, baseline=policies[0].name, quotas=quotas or {})
    inp = prepare(h, ps)
    return {p.name: replay(inp, p, ps) for p in policies}


def _attempt_row(run: Run, job_id: str, attempt: int = 0) -> dict[str, Any]:
    rows = run.attempts.filter((pl.col("job_id") == job_id) & (pl.col("attempt") == attempt))
    assert rows.height == 1, (job_id, attempt, run.attempts)
    return rows.row(0, named=True)


def _wait_s(row: dict[str, Any]) -> float:
    return float((row["started_at"] - row["queued_at"]).total_seconds())


def _nodes(run: Run, job_id: str) -> set[str]:
    return set(run.allocations.filter(pl.col("job_id") == job_id)["node"].to_list())


@pytest.fixture
def scatter(process: Callable[..., Facts]) -> Facts:
    """Two 8-GPU nodes; X (2 GPUs on A) and Y (3 GPUs on B) run from the start for 10
    minutes; J1 and J2 (3 GPUs each, 2 hours) arrive at minutes 1 and 2 and ran on B and
    A (best fit); the 8-GPU job J8 arrives at minute 20 and waited for them."""
    ev = [inventory("a", at(0), card=CARD), inventory("b", at(0), card=CARD),
          _submit("X", 0, 2), _submit("Y", 0, 3),
          *_attempt("X", 0, 10, "a", 0, 1), *_attempt("Y", 0, 10, "b", 0, 1, 2),
          _submit("J1", 1, 3), *_attempt("J1", 1, 120, "b", 3, 4, 5),
          _submit("J2", 2, 3), *_attempt("J2", 2, 120, "a", 2, 3, 4),
          _submit("J8", 20, 8), *_attempt("J8", 120, 180, "b", *range(8)),
          inventory("a", at(200), card=CARD), inventory("b", at(200), card=CARD)]
    return process(ev)


def test_an_8_gpu_job_blocked_by_best_fit_scatter_but_not_by_fgd(scatter: Facts) -> None:
    runs = _replay(scatter, Policy("best-fit"), Policy("fgd", placement="fgd"))
    best, fgd = runs["best-fit"], runs["fgd"]
    # best fit: J1 (tick 75 s) takes B (5 free < 6), J2 (tick 135 s) takes A; when X and
    # Y end, A and B have 5 free each: J8 (8 GPUs) fits in the 10 free GPUs but on no
    # node, until J1 and J2 end at 75 + 7140 = 135 + 7080 = 7215 s; it starts at 7230 s
    assert _nodes(best, "J1") == {"b"} and _nodes(best, "J2") == {"a"}
    j8 = _attempt_row(best, "J8")
    assert _wait_s(j8) == 7230 - 1200
    # FGD (task mix: 2 GPUs 0.2, 3 GPUs 0.6, 8 GPUs 0.2): J1 on A changes F_A from
    # 0.2·6 to 0.2·3 (−0.6), on B from 0.2·5 to 0.8·2 (+0.6): A; J2 likewise fills A;
    # B is whole again when Y ends, J8 starts at the tick after its arrival
    assert _nodes(fgd, "J1") == {"a"} and _nodes(fgd, "J2") == {"a"}
    assert _wait_s(_attempt_row(fgd, "J8")) == 15
    assert _nodes(fgd, "J8") == {"b"}
    # blocked demand: minutes 20..119 (middles inside [1200 s, 7230 s)) × 8 GPUs
    h = load_history(scatter.root)
    blocked = {r.policy: r.blocked["blocked_gpu_hours"].sum() for r in
               (answers(best, h), answers(fgd, h))}
    assert blocked["best-fit"] == pytest.approx(100 * 8 / 60)
    assert blocked["fgd"] == 0
    # and the schedule as run (best fit) waited from minute 20 to 120
    observed = answers(as_run(h), h)
    assert observed.blocked["blocked_gpu_hours"].sum() == pytest.approx(100 * 8 / 60)


@pytest.fixture
def gap(process: Callable[..., Facts]) -> Facts:
    """One 8-GPU node. R (4 GPUs) runs from the start until minute 60; B8 (8 GPUs,
    priority 50, 60 minutes) arrives at minute 1; S (2 GPUs, priority 10, 30 minutes)
    arrives at minute 2. As run: S back-filled the idle GPUs from minute 2 to 32."""
    ev = [inventory("a", at(0), card=CARD),
          _submit("R", 0, 4), *_attempt("R", 0, 60, "a", 0, 1, 2, 3),
          _submit("B8", 1, 8), *_attempt("B8", 60, 120, "a", *range(8)),
          _submit("S", 2, 2, priority=10, queue="sweep"),
          *_attempt("S", 2, 32, "a", 4, 5),
          inventory("a", at(180), card=CARD)]
    return process(ev)


def test_backfill_fills_the_gap_and_strict_order_does_not(gap: Facts) -> None:
    quotas = {"vision": {"train": 8}}
    runs = _replay(gap, Policy("backfill"), Policy("strict", backfill=False), quotas=quotas)
    fill, strict = runs["backfill"], runs["strict"]
    # back-fill: S starts at the tick after it arrives (120 s → 135 s) and ends at
    # 135 + 1800 = 1935 s, long before R ends (3600 s, the tick at 3615 s starts B8)
    assert _wait_s(_attempt_row(fill, "S")) == 15
    assert _attempt_row(fill, "B8")["started_at"] == at(0, 3615)
    # strict order: B8 heads the queue and cannot start: S waits behind it until B8 has
    # run (3615 + 3600 = 7215 s): S starts at 7230 s
    assert _attempt_row(strict, "B8")["started_at"] == at(0, 3615)
    assert _wait_s(_attempt_row(strict, "S")) == 7230 - 120


@pytest.fixture
def borrow(process: Callable[..., Facts]) -> Facts:
    """One 8-GPU node. Team lab (quota 0) runs W (8 GPUs, checkpoint every 10 minutes)
    from the start for 60 minutes on borrowed capacity; team prod (quota 8) submits G
    (4 GPUs, 30 minutes) at minute 25. As run, nothing was reclaimed: G waited for W."""
    ev = [inventory("a", at(0), card=CARD),
          _submit("W", 0, 8, team="lab", checkpointable=True, preemptible=True),
          job("started", "W", at(0), allocation=alloc("a", *range(8)), borrowed=True),
          *[job("checkpointed", "W", at(m)) for m in (10, 20, 30, 40, 50)],
          job("finished", "W", at(60)),
          _submit("G", 25, 4, team="prod", priority=90),
          *_attempt("G", 60, 90, "a", 0, 1, 2, 3),
          inventory("a", at(120), card=CARD)]
    return process(ev)


def test_a_borrow_reclaimed_with_lost_work(borrow: Facts) -> None:
    quotas = {"lab": {"train": 0}, "prod": {"train": 8}}
    runs = _replay(borrow, Policy("reclaim"), Policy("no-reclaim", reclaim=False,
                                                     preempt_priority=False),
                   Policy("fixed", quota="fixed"), quotas=quotas)
    # reclaim: G (within quota) arrives at 1500 s; at the 1515 s pass W (borrowed, other
    # team) is preempted; its last checkpoint was at 1200 s (every 600 s from 0): 315 s
    # of 8 GPUs lost = 0.7 GPU-hours. G starts at once.
    rec = runs["reclaim"]
    w0 = _attempt_row(rec, "W", 0)
    assert w0["end_event"] == "preempted" and w0["ended_at"] == at(0, 1515)
    assert w0["lost_gpu_hours"] == pytest.approx(8 * 315 / 3600)
    assert _wait_s(_attempt_row(rec, "G")) == 15
    # W resumes from its checkpoint when G ends (1515 + 1800 = 3315 s → pass at 3330 s)
    # and runs the remaining 3600 − 1200 = 2400 s
    w1 = _attempt_row(rec, "W", 1)
    assert w1["started_at"] == at(0, 3330) and w1["ended_at"] == at(0, 3330 + 2400)
    # no reclaim: G waits for W to finish (3600 s, pass at 3615 s); nothing is lost
    keep = runs["no-reclaim"]
    assert _wait_s(_attempt_row(keep, "G")) == 3615 - 1500
    assert keep.attempts["lost_gpu_hours"].sum() == 0
    # fixed quota (reclaim on): W, running at the start, is reclaimed as above, and a
    # quota-0 team may not start it again: its second attempt is still pending at the end
    fixed = runs["fixed"]
    assert _wait_s(_attempt_row(fixed, "G")) == 15
    assert _attempt_row(fixed, "W", 0)["lost_gpu_hours"] == pytest.approx(8 * 315 / 3600)
    w1 = _attempt_row(fixed, "W", 1)
    assert w1["started_at"] is None and w1["queued_at"] == at(0, 1515)


def test_identity_of_a_hand_made_history(scatter: Facts) -> None:
    """The schedule as run reproduces the events: waits, GPUs and blocked minutes."""
    h = load_history(scatter.root)
    run = as_run(h)
    assert _wait_s(_attempt_row(run, "J8")) == 100 * 60
    assert _nodes(run, "J1") == {"b"}
    a = answers(run, h)
    assert a.usage.filter(pl.col("pool") == "all")["allocated_gpu_hours"].item() == (
        pytest.approx((2 * 10 + 3 * 10 + 3 * 119 + 3 * 118 + 8 * 60) / 60))
