"""Job facts: allocation vs use, idle vs inefficient, memory, queue wait, preemption."""

from __future__ import annotations

from collections.abc import Callable

import polars as pl
import pytest
from conftest import Facts
from events import alloc, at, inventory, job, series


def _two_jobs() -> list[dict[str, object]]:
    recs: list[dict[str, object]] = [inventory("n1", at(0), gpus=4)]
    # j1: 3 GPUs for 30 minutes: GPU0 busy 0.9, GPU1 inefficient 0.2, GPU2 idle 0.0
    recs += [job("submitted", "j1", at(0), gpus=3, team="nlp"),
             job("started", "j1", at(0), allocation=alloc("n1", 0, 1, 2)),
             job("finished", "j1", at(30))]
    recs += series("n1", 0, at(0), 30, sm=0.9, mem=30_000.0, jobs=["j1"])
    recs += series("n1", 1, at(0), 30, sm=0.2, mem=10_000.0, jobs=["j1"])
    recs += series("n1", 2, at(0), 30, sm=0.0, mem=500.0)
    # j2 (team vision): 1 GPU for 60 minutes at 0.5, memory 12,000 MiB of 81,559
    recs += [job("submitted", "j2", at(0), gpus=1, team="vision", gpu_mem_mib=40_000.0),
             job("started", "j2", at(0), allocation=alloc("n1", 3)),
             job("finished", "j2", at(60))]
    recs += series("n1", 3, at(0), 60, sm=0.5, mem=12_000.0, jobs=["j2"])
    return recs


def test_allocated_used_idle_inefficient_per_job_and_team(process: Callable[..., Facts]) -> None:
    facts = process(_two_jobs())
    att = {r["job_id"]: r for r in facts.table("job_attempts").iter_rows(named=True)}
    j1 = att["j1"]
    assert j1["allocated_gpu_hours"] == pytest.approx(90 / 60)          # 3 GPUs × 30 min
    assert j1["used_gpu_hours"] == pytest.approx((0.9 + 0.2 + 0.0) * 30 / 60)
    assert j1["idle_gpu_hours"] == pytest.approx(30 / 60)
    assert j1["inefficient_gpu_hours"] == pytest.approx(30 / 60)
    assert j1["waste_gpu_hours"] == pytest.approx(90 / 60 - 33 / 60)
    assert j1["utilisation_of_allocation"] == pytest.approx(33 / 90)
    assert j1["idle_gpus"] == 1
    j2 = att["j2"]
    assert j2["allocated_gpu_hours"] == pytest.approx(1.0)
    assert j2["used_gpu_hours"] == pytest.approx(0.5)
    daily = facts.table("gpu_daily")
    team = {r["team"]: r for r in daily.iter_rows(named=True) if r["team"]}
    assert team["nlp"]["allocated_gpu_hours"] == pytest.approx(1.5)
    assert team["nlp"]["allocated_idle_gpu_hours"] == pytest.approx(0.5)
    assert team["nlp"]["allocated_inefficient_gpu_hours"] == pytest.approx(0.5)
    assert team["vision"]["used_gpu_hours"] == pytest.approx(0.5)
    free = [r for r in daily.iter_rows(named=True) if r["team"] is None]
    assert sum(r["free_gpu_hours"] for r in free) == pytest.approx(90 / 60)  # GPUs 0-2 after j1


def test_memory_peak_held_requested_and_oversized(process: Callable[..., Facts]) -> None:
    facts = process(_two_jobs())
    att = {r["job_id"]: r for r in facts.table("job_attempts").iter_rows(named=True)}
    assert att["j1"]["mem_peak_mib"] == 30_000.0
    assert att["j1"]["mem_held_mib"] == 81_559.0
    assert att["j1"]["memory_oversized"] is False                 # 36.8 % ≥ 25 %
    assert att["j2"]["mem_peak_mib"] == 12_000.0
    assert att["j2"]["mem_peak_ratio"] == pytest.approx(12_000 / 81_559)
    assert att["j2"]["memory_oversized"] is True                  # 14.7 % < 25 %
    assert att["j2"]["mem_peak_of_requested"] == pytest.approx(12_000 / 40_000)
    recs = facts.table("recommendations")
    kinds = {(r["job_id"], r["kind"]) for r in recs.iter_rows(named=True)}
    assert ("j2", "right_size_memory") in kinds
    assert ("j1", "reduce_gpus") in kinds                         # 1 of 3 GPUs idle


def test_gpu_and_memory_advice_counts_only_the_gpus_that_reported(
        process: Callable[..., Facts]) -> None:
    """Job r holds 4 GPUs for 30 minutes: n1/0 idle, n1/1 at 0.9, both at 1,000 MiB;
    n2/0 and n2/1 never report. Allocated 2.0 GPU-h, observed 1.0: 1 of the 2 observed
    GPUs idled (not "1 of 4"), and the stakes are taken on the 1.0 observed GPU-h."""
    recs = [inventory("n1", at(0), gpus=2), inventory("n2", at(0), gpus=2)]
    recs += [job("submitted", "r", at(0), gpus=4),
             job("started", "r", at(0), allocation=alloc("n1", 0, 1) + alloc("n2", 0, 1)),
             job("finished", "r", at(30))]
    recs += series("n1", 0, at(0), 30, sm=0.0, mem=1_000.0)
    recs += series("n1", 1, at(0), 30, sm=0.9, mem=1_000.0)
    facts = process(recs)
    att = facts.table("job_attempts").row(0, named=True)
    assert att["allocated_gpu_hours"] == pytest.approx(2.0)
    assert att["observed_gpu_hours"] == pytest.approx(1.0)
    assert (att["gpus_observed"], att["idle_gpus"]) == (2, 1)
    rec = {r["kind"]: r for r in facts.table("recommendations").iter_rows(named=True)}
    reduce = rec["reduce_gpus"]
    assert reduce["gpu_hours"] == pytest.approx(1.0 * 1 / 2)    # observed × idle / observed
    assert reduce["evidence"] == "1 of 2 observed GPUs stayed idle (2 more had no telemetry)"
    assert reduce["recommendation"] == "request 3 GPUs"          # the unknown two are kept
    memory = rec["right_size_memory"]
    assert memory["gpu_hours"] == pytest.approx(1.0 * (1 - 1_000 / 81_559))


def test_an_idle_notebook_is_weighed_on_the_hours_it_reported(
        process: Callable[..., Facts]) -> None:
    """An interactive job holds 2 GPUs for 30 minutes: n1/0 idle throughout, n1/1 never
    reports. Idle 0.5 of 1.0 allocated GPU-hours was not "more than half", so it went
    unadvised; of the 0.5 observed GPU-hours it was idle all 0.5."""
    recs = [inventory("n1", at(0), gpus=2),
            job("submitted", "nb", at(0), gpus=2, job_type="interactive"),
            job("started", "nb", at(0), allocation=alloc("n1", 0, 1)),
            job("finished", "nb", at(30))]
    recs += series("n1", 0, at(0), 30, sm=0.0, mem=1_000.0)
    facts = process(recs)
    rec = {r["kind"]: r for r in facts.table("recommendations").iter_rows(named=True)}
    idle = rec["release_idle"]
    assert idle["gpu_hours"] == pytest.approx(0.5)
    assert idle["evidence"] == ("0.5 of 0.5 observed GPU-hours idle "
                                "(0.5 more without telemetry)")


def test_no_gpu_advice_when_the_only_idle_doubt_is_missing_telemetry(
        process: Callable[..., Facts]) -> None:
    """4 GPUs, 2 report at 0.9, 2 never report: "2 of 4 idle" was advised before."""
    recs = [inventory("n1", at(0), gpus=4)]
    recs += [job("submitted", "s", at(0), gpus=4),
             job("started", "s", at(0), allocation=alloc("n1", 0, 1, 2, 3)),
             job("finished", "s", at(30))]
    recs += series("n1", 0, at(0), 30, sm=0.9, mem=60_000.0)
    recs += series("n1", 1, at(0), 30, sm=0.9, mem=60_000.0)
    facts = process(recs)
    att = facts.table("job_attempts").row(0, named=True)
    assert (att["gpus_observed"], att["idle_gpus"]) == (2, 0)
    kinds = {r["kind"] for r in facts.table("recommendations").iter_rows(named=True)}
    assert "reduce_gpus" not in kinds


def test_shared_gpu_charges_each_job_its_fraction(process: Callable[..., Facts]) -> None:
    recs = [inventory("n1", at(0), gpus=1, card="L40S-48GB", mem=46_068.0)]
    for j in ("a", "b"):
        recs += [job("submitted", j, at(0), gpus=1, job_type="inference"),
                 job("started", j, at(0), allocation=alloc("n1", 0, fraction=0.5))]
    # one sample stream; processes of both jobs, 6,000 MiB each (GPU total 12,000)
    from datetime import timedelta

    from events import telemetry
    for i in range(60):
        t = at(0) + timedelta(seconds=10 * i)
        rec = telemetry("n1", 0, t, util=40.0, mem=12_000.0, card="L40S-48GB", seq=i)
        rec["processes"] = [{"pid": 1, "used_mib": 6_000.0, "job_id": "a"},
                            {"pid": 2, "used_mib": 6_000.0, "job_id": "b"}]
        recs.append(rec)
    recs += [job("finished", "a", at(10)), job("finished", "b", at(10))]
    facts = process(recs)
    att = {r["job_id"]: r for r in facts.table("job_attempts").iter_rows(named=True)}
    for j in ("a", "b"):
        assert att[j]["allocated_gpu_hours"] == pytest.approx(0.5 * 10 / 60)
        assert att[j]["used_gpu_hours"] == pytest.approx(0.5 * 0.4 * 10 / 60)
        assert att[j]["mem_peak_mib"] == 6_000.0
        assert att[j]["mem_held_mib"] == pytest.approx(46_068.0 / 2)
    gm = facts.table("gpu_minute")
    assert gm["alloc_fraction"].max() == 1.0
    assert gm["jobs_on_gpu"].max() == 2
    # the per-minute memory view names no job of a shared GPU-minute: it named one (a)
    # with the whole GPU's 12,000 MiB, and b not at all (a probe); job_gpu has each one's
    from gpuledger.pipeline import query
    con = query.connect(facts.root)
    try:
        assert con.sql("SELECT count(*) FROM job_gpu_memory").fetchall() == [(0,)]
        peaks = con.sql("SELECT job_id, mem_peak_mib FROM job_gpu ORDER BY 1").fetchall()
    finally:
        con.close()
    assert peaks == [("a", 6_000.0), ("b", 6_000.0)]


def test_queue_wait_with_requeue_and_preemption_lost_work(process: Callable[..., Facts]) -> None:
    recs = [inventory("n1", at(0), gpus=8)]
    recs += [job("submitted", "p", at(0), gpus=4, preemptible=True, queue="batch"),
             job("started", "p", at(5), allocation=alloc("n1", 0, 1, 2, 3), borrowed=True),
             job("checkpointed", "p", at(15)),
             job("preempted", "p", at(20), reason="reclaimed for prod"),
             job("requeued", "p", at(20)),
             job("started", "p", at(30), allocation=alloc("n1", 4, 5, 6, 7)),
             job("finished", "p", at(40))]
    recs += series("n1", 0, at(0), 45, sm=0.0)
    facts = process(recs)
    att = facts.table("job_attempts").sort("attempt")
    assert att["attempt"].to_list() == [0, 1]
    assert att["queue_wait_s"].to_list() == [300.0, 600.0]          # 10:05−10:00, 10:30−10:20
    assert att["end_event"].to_list() == ["preempted", "finished"]
    assert att["lost_gpu_hours"][0] == pytest.approx(4 * 5 / 60)    # 4 GPUs × (10:20 − 10:15)
    assert att["borrowed"].to_list() == [True, False]
    pre = facts.table("preemptions")
    assert pre.height == 1
    assert pre["requeued"][0] is True
    assert pre["lost_gpu_hours"][0] == pytest.approx(4 * 5 / 60)
    pend = facts.table("pending_minute")
    # pending 10:00–10:05 (5 minutes) and 10:20–10:30 (10 minutes), 4 GPUs each
    assert pend["pending_jobs"].sum() == 15
    assert pend["pending_gpus"].sum() == 60


def test_a_requeue_of_an_attempt_never_seen_running(process: Callable[..., Facts]) -> None:
    """A bridge that missed a run (between two polls, or before it started) says only
    `requeued` (docs/slurm.md): the attempt before it ends there without a start, and
    the next attempt waits from the requeue."""
    recs = [inventory("n1", at(0), gpus=8),
            job("submitted", "r", at(0), gpus=2),
            job("requeued", "r", at(12), reason="the attempt before it was not observed"),
            job("started", "r", at(15), allocation=alloc("n1", 0, 1)),
            job("finished", "r", at(25))]
    recs += series("n1", 7, at(0), 30, sm=0.0)
    att = process(recs).table("job_attempts").sort("attempt")
    assert att["attempt"].to_list() == [0, 1]
    assert att["end_event"].to_list() == ["requeued", "finished"]
    assert att["started_at"][0] is None and att["queue_wait_s"][0] is None
    assert att["queue_wait_s"][1] == 180.0                           # 10:15 − 10:12


def test_preemption_without_checkpoint_loses_everything_since_start(
    process: Callable[..., Facts],
) -> None:
    recs = [inventory("n1", at(0), gpus=2),
            job("submitted", "p", at(0), gpus=2, checkpointable=False),
            job("started", "p", at(0), allocation=alloc("n1", 0, 1)),
            job("preempted", "p", at(30))]
    recs += series("n1", 0, at(0), 31, sm=0.0)
    pre = process(recs).table("preemptions")
    assert pre["lost_gpu_hours"][0] == pytest.approx(2 * 30 / 60)
    assert pre["requeued"][0] is False


def test_running_and_pending_jobs_land_in_the_snapshot(process: Callable[..., Facts]) -> None:
    recs = [inventory("n1", at(0), gpus=2),
            job("submitted", "r", at(0), gpus=1),
            job("started", "r", at(0), allocation=alloc("n1", 0)),
            job("submitted", "w", at(1), gpus=4)]
    recs += series("n1", 0, at(0), 10, sm=0.5)
    snap = process(recs).table("running_attempts")
    by = {r["job_id"]: r for r in snap.iter_rows(named=True)}
    assert by["r"]["allocated_gpu_hours"] == pytest.approx(10 / 60)
    assert by["w"]["started_at"] is None


def _candidates_case(*extra: dict[str, object]) -> list[dict[str, object]]:
    """One 8-GPU node: run4 (preemptible, checkpointable, borrowed) holds 4 GPUs from
    10:00; h100 (preemptible, 2 GPUs of H100) waits from 10:05; a submission at 10:10
    closes the facts there. No telemetry: candidates are scheduler facts."""
    return [inventory("n1", at(0), gpus=8),
            job("submitted", "run4", at(0), gpus=4, preemptible=True),
            job("started", "run4", at(0), allocation=alloc("n1", 0, 1, 2, 3), borrowed=True),
            job("submitted", "h100", at(5), gpus=2, preemptible=True),
            *extra,
            job("submitted", "tick", at(10), gpus=1)]


def test_candidates_stake_the_gpu_hours_held_or_waited_so_far(
        process: Callable[..., Facts]) -> None:
    """The candidates' gpu_hours were the GPU count (4.0 and 2.0)."""
    cands = process(_candidates_case()).table("candidates")
    by = {r["job_id"]: r for r in cands.iter_rows(named=True)}
    assert set(by) == {"run4", "h100"}
    run4, h100 = by["run4"], by["h100"]
    assert run4["kind"] == "preemption_candidate"
    assert run4["gpu_hours"] == pytest.approx(4 * 10 / 60)      # held 10:00–10:10
    assert run4["evidence"] == ("priority 50, borrowed, checkpointable, 4 GPUs, "
                                "0.67 GPU-h since its start (no checkpoint yet)")
    assert h100["kind"] == "backfill_candidate"
    assert h100["gpu_hours"] == pytest.approx(2 * 5 / 60)       # waited 10:05–10:10
    assert h100["evidence"] == ("needs 2 GPUs, largest free block 4 on H100-SXM5-80GB, "
                                "pending 5 min")


def test_a_pending_job_of_any_card_type_is_a_backfill_candidate(
        process: Callable[..., Facts]) -> None:
    """anyc accepts any card type of its pool: it had no row (an inner join on the card
    type dropped it), while the same job asking for H100 had one."""
    extra = job("submitted", "anyc", at(5), gpus=2, preemptible=True, card_type=None)
    cands = process(_candidates_case(extra)).table("candidates")
    by = {r["job_id"]: r for r in cands.iter_rows(named=True)}
    assert set(by) == {"run4", "h100", "anyc"}
    anyc = by["anyc"]
    assert anyc["kind"] == "backfill_candidate"
    assert anyc["gpu_hours"] == pytest.approx(2 * 5 / 60)
    assert anyc["evidence"] == ("needs 2 GPUs of any card type, largest free block 4 on "
                                "H100-SXM5-80GB, pending 5 min")


def test_a_job_of_any_card_type_fits_a_block_of_one_card_type_not_their_sum() -> None:
    """Two card types with 2 free each: a 2-GPU job fits, a 3-GPU job does not."""
    from datetime import UTC, datetime

    from gpuledger.pipeline.facts import recommendations
    from gpuledger.pipeline.state.jobs import ATTEMPT_SCHEMA
    base = {c: None for c in ATTEMPT_SCHEMA.names()}
    rows = [{**base, "job_id": j, "attempt": 0, "pool": "p", "gpus": g, "preemptible": True,
             "queued_at": datetime(2026, 1, 5, 10, tzinfo=UTC)} for j, g in (("a", 2), ("b", 3))]
    running = pl.DataFrame(rows, schema=ATTEMPT_SCHEMA)
    free = pl.DataFrame({"pool": ["p", "p"], "card_type": ["A100", "L40S"],
                         "largest_free_block": [2, 2]})
    usage = pl.DataFrame(schema={"job_id": pl.String, "attempt": pl.Int64,
                                 "allocated_gpu_hours": pl.Float64})
    out = recommendations.candidates(running, usage, free, 10,
                                     datetime(2026, 1, 5, 11, tzinfo=UTC))
    assert out["job_id"].to_list() == ["a"]
    assert out["gpu_hours"].to_list() == [pytest.approx(2.0)]     # 2 GPUs × 1 h pending
    assert "largest free block 2 on A100" in out["evidence"][0]


@pytest.mark.parametrize("outage", ["unhealthy", "xid", "down"])
def test_minutes_a_held_gpu_was_unavailable_are_not_the_jobs(
        process: Callable[..., Facts], outage: str) -> None:
    """j1 holds GPU 0 from 10:05 to 10:35 at 50 %; from 10:20 to 10:40 the GPU is
    unavailable (listed unhealthy, an XID error in each minute, or its node down with no
    telemetry). Those minutes are the GPU's `unavailable` time in the roll-ups; the
    attempt charged them as allocated (0.5 GPU-h against the team's 0.25), and a node
    down as no telemetry the team's rows did not have (a probe)."""
    from datetime import timedelta

    from events import telemetry
    recs: list[dict[str, object]] = [inventory("n1", at(0), gpus=1)]
    if outage == "unhealthy":
        recs += [inventory("n1", at(20), gpus=1, unhealthy=[0]),
                 inventory("n1", at(40), gpus=1)]
    if outage == "down":
        recs += [inventory("n1", at(20), gpus=1, health="down"),
                 inventory("n1", at(40), gpus=1)]
    recs += [job("submitted", "j1", at(0), gpus=1, team="nlp"),
             job("started", "j1", at(5), allocation=alloc("n1", 0)),
             job("finished", "j1", at(35))]
    for i in range(60 * 6):
        t = at(0) + timedelta(seconds=10 * i)
        if outage == "down" and at(20) <= t < at(40):
            continue
        xid = 1 if outage == "xid" and at(20) <= t < at(40) else 0
        recs.append(telemetry("n1", 0, t, sm=0.5 if at(5) <= t < at(35) else 0.0,
                              jobs=["j1"] if at(5) <= t < at(35) else [], seq=i,
                              xid_errors=xid))
    facts = process(recs)
    att = facts.table("job_attempts").row(0, named=True)
    assert att["allocated_gpu_hours"] == pytest.approx(15 / 60)     # 10:05-10:20
    assert att["used_gpu_hours"] == pytest.approx(0.5 * 15 / 60)
    assert att["no_telemetry_gpu_hours"] == pytest.approx(0.0)
    assert att["job_gpu_hours"] == pytest.approx(30 / 60)           # held 30 minutes
    hourly = facts.table("gpu_hourly").filter(pl.col("team") == "nlp")
    assert hourly["allocated_gpu_hours"].sum() == pytest.approx(att["allocated_gpu_hours"])
    assert hourly["used_gpu_hours"].sum() == pytest.approx(att["used_gpu_hours"])
    assert hourly["no_telemetry_gpu_hours"].sum() == pytest.approx(0.0)
    assert hourly["unavailable_gpu_hours"].sum() == pytest.approx(15 / 60)
    assert hourly["job_gpu_hours"].sum() == pytest.approx(att["job_gpu_hours"])
