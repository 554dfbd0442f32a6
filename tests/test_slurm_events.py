"""The Slurm tracker: controller views in, contract events out, each said once.

Hand-made snapshots (the shapes the parsers produce) walk a job through every
transition; each expectation is written from the snapshot's own times.
"""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from gpuledger.bridges.mapping import Mapping, parse_mapping
from gpuledger.bridges.slurm_events import SlurmTracker, node_record, rfc3339
from gpuledger.bridges.slurm_parse import SlurmJob, SlurmNode

T0 = datetime(2026, 1, 5, 10, 0, tzinfo=UTC).timestamp()
NODE = SlurmNode(name="n1", state="mixed", partitions=("gpu",), gpu_type="h100", gpus=8)


def job(**kw: Any) -> SlurmJob:
    base: dict[str, Any] = {"job_id": "7", "state": "PENDING", "name": "train", "user": "ana",
                            "account": "ml", "partition": "gpu", "qos": "normal",
                            "priority": 100, "submit": T0, "gpus": 2, "gpu_type": "h100"}
    return SlurmJob(**(base | kw))


def running(start: float, idx: tuple[int, ...] = (0, 1), **kw: Any) -> SlurmJob:
    return job(**({"state": "RUNNING", "start": start,
                   "allocation": tuple(("n1", i) for i in idx)} | kw))


def events(records: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(r["event"], r["time"]) for r in records if r["type"] == "job"]


def test_a_whole_life_with_a_requeue() -> None:
    t = SlurmTracker(Mapping())
    out, _ = t.step([job()], None, T0 + 1)
    assert events(out) == [("submitted", rfc3339(T0))]
    sub = out[0]
    assert (sub["team"], sub["queue"], sub["pool"], sub["gpus"], sub["card_type"],
            sub["priority"], sub["gpu_mem_mib"]) == \
        ("ml", "gpu", "gpu", 2, "H100-SXM5-80GB", 100, 81_559.0)
    assert t.step([job()], None, T0 + 2)[0] == []               # nothing new
    out, _ = t.step([running(T0 + 30)], None, T0 + 31)
    assert events(out) == [("started", rfc3339(T0 + 30))]
    assert out[0]["allocation"] == [{"node": "n1", "gpu_index": 0, "fraction": 1.0},
                                    {"node": "n1", "gpu_index": 1, "fraction": 1.0}]
    assert t.step([running(T0 + 30)], None, T0 + 40)[0] == []
    # scontrol requeue: COMPLETING with the restart counted, SubmitTime not yet reset
    assert t.step([running(T0 + 30, restarts=1, state="COMPLETING")], None, T0 + 61)[0] == []
    out, _ = t.step([job(restarts=1, submit=T0 + 62)], None, T0 + 63)
    assert events(out) == [("requeued", rfc3339(T0 + 62))]
    out, _ = t.step([running(T0 + 90, (4, 5), restarts=1, submit=T0 + 62)], None, T0 + 91)
    assert events(out) == [("started", rfc3339(T0 + 90))]
    ended = running(T0 + 90, (), restarts=1, submit=T0 + 62, state="COMPLETED", end=T0 + 200)
    out, _ = t.step([ended], None, T0 + 201)
    assert events(out) == [("finished", rfc3339(T0 + 200))]
    assert t.step([ended], None, T0 + 202)[0] == []
    out, stats = t.step([], None, T0 + 900)                     # purged by Slurm: forgotten
    assert out == [] and stats.vanished == 0 and t.jobs == {}


def test_preemption_with_and_without_requeue() -> None:
    t = SlurmTracker(Mapping())
    t.step([running(T0 + 10)], None, T0 + 11)
    preempted = running(T0 + 10, (), state="PREEMPTED", end=T0 + 50)
    out, _ = t.step([preempted], None, T0 + 51)
    assert events(out) == [("preempted", rfc3339(T0 + 50))]
    out, _ = t.step([job(restarts=1, submit=T0 + 50)], None, T0 + 52)
    assert events(out) == [("requeued", rfc3339(T0 + 50))]

    t3 = SlurmTracker(Mapping())                      # PreemptMode=CANCEL: stays PREEMPTED
    t3.step([running(T0 + 10)], None, T0 + 11)
    assert [e for e, _ in events(t3.step([preempted], None, T0 + 51)[0])] == ["preempted"]
    out, _ = t3.step([preempted], None, T0 + 61)
    assert events(out) == [("cancelled", rfc3339(T0 + 50))]
    assert t3.step([preempted], None, T0 + 71)[0] == []

    t2 = SlurmTracker(Mapping())
    t2.step([running(T0 + 10)], None, T0 + 11)
    out, _ = t2.step([replace(preempted, requeue=False)], None, T0 + 51)
    assert [e for e, _ in events(out)] == ["preempted", "cancelled"]


def test_ends_and_what_was_missed_between_polls() -> None:
    t = SlurmTracker(Mapping())
    t.step([], None, T0)                                 # the bridge has polled once
    failed = job(job_id="1", state="TIMEOUT", start=T0 + 5, end=T0 + 65, exit_code="0:1")
    cancelled_pending = job(job_id="2", state="CANCELLED", start=T0 + 9, end=T0 + 9)
    cpu_only = job(job_id="3", gpus=0, gpu_type=None)
    out, stats = t.step([failed, cancelled_pending, cpu_only], None, T0 + 100)
    by_job = {}
    for r in out:
        by_job.setdefault(r["job_id"], []).append((r["event"], r.get("reason")))
    assert by_job["1"] == [("submitted", None), ("failed", "timeout (exit code 0:1); ran 60 s "
                                                 "between two polls (allocation not observed)")]
    assert by_job["2"] == [("submitted", None), ("cancelled", "cancelled before it started")]
    assert "3" not in by_job
    assert stats.start_unseen == 1
    # a running job that leaves squeue unseen (bridge down longer than MinJobAge)
    t.step([running(T0 + 10, job_id="4")], None, T0 + 101)
    out, stats = t.step([], None, T0 + 2000)
    assert [(r["job_id"], r["event"], r["time"]) for r in out] == \
        [("4", "cancelled", rfc3339(T0 + 2000))]
    assert stats.vanished == 1


def test_memory_survives_json_and_prefixes_ids() -> None:
    t = SlurmTracker(Mapping(), job_id_prefix="slurm-")
    t.step([running(T0 + 10)], [NODE], T0 + 11)
    again = SlurmTracker(Mapping(), job_id_prefix="slurm-")
    again.load_json(json.loads(json.dumps(t.to_json())))
    assert again.step([running(T0 + 10)], [NODE], T0 + 12)[0] == []
    out, _ = again.step([running(T0 + 10, (), state="COMPLETED", end=T0 + 70)], None, T0 + 71)
    assert [(r["job_id"], r["event"]) for r in out] == [("slurm-7", "finished")]


def test_inventory_on_change_and_refresh() -> None:
    t = SlurmTracker(Mapping(), inventory_refresh_s=300)
    out, _ = t.step([], [NODE], T0)
    assert [r["node"] for r in out] == ["n1"]
    assert t.step([], [NODE], T0 + 10)[0] == []
    drained = replace(NODE, flags=("DRAIN",), reason="bad fan")
    (rec,), _ = t.step([], [drained], T0 + 20)
    assert (rec["schedulable"], rec["health"], rec["labels"]["slurm_reason"]) == \
        (False, "ok", "bad fan")
    assert t.step([], [drained], T0 + 30)[0] == []
    assert len(t.step([], [drained], T0 + 321)[0]) == 1         # periodic refresh


def test_a_node_said_to_hold_too_many_gpus_is_left_out_with_one_warning(
        caplog: Any) -> None:
    """sinfo's ``gres: gpu:h100:2000`` went out as an inventory record of 2,000 GPUs,
    exit 0, and the processor rejected it (the node had no inventory at all); the
    Kubernetes bridge crashed on the same kind of input."""
    t = SlurmTracker(Mapping())
    huge = replace(NODE, name="huge", gpus=2000)
    out, _ = t.step([], [huge, NODE], T0)
    assert [r["node"] for r in out if r["type"] == "inventory"] == ["n1"]
    out, _ = t.step([], [huge, NODE], T0 + 400)                 # the next refresh
    assert [r["node"] for r in out if r["type"] == "inventory"] == ["n1"]
    assert [r.getMessage() for r in caplog.records] == [
        "node huge left out of the inventory: it is said to hold 2000 GPUs, more than a "
        "node can (0-1024)"]


def test_node_health_and_pools_through_the_mapping() -> None:
    m = parse_mapping({"pools": {"partitions": {"gpu": "train"}},
                       "card_types": {"names": {"h100": "H100-SXM5-80GB"}}})
    rec = node_record(m, replace(NODE, gres_drained=(3,)))
    assert (rec["pool"], rec["card_type"], rec["gpu_count"], rec["health"],
            rec["unhealthy_gpus"], rec["schedulable"]) == \
        ("train", "H100-SXM5-80GB", 8, "degraded", [3], True)
    down = node_record(m, replace(NODE, state="down", flags=("NOT_RESPONDING",)))
    assert (down["health"], down["schedulable"]) == ("down", False)
    ok = node_record(m, replace(NODE, state="idle"))
    assert (ok["health"], ok["schedulable"]) == ("ok", True)


def test_a_bridge_started_after_the_fact() -> None:
    """A new state file after jobs ended and after a requeue: ended jobs read "not
    observed by the bridge (started before it ran)", not "ran N s between two polls";
    a job first seen with a restart count still counts its earlier attempt (requeued at
    the reset SubmitTime)."""
    t = SlurmTracker(Mapping())
    done = job(job_id="1", state="COMPLETED", start=T0 + 5, end=T0 + 65)
    failed = job(job_id="2", state="FAILED", start=T0 + 5, end=T0 + 9, exit_code="3:0")
    requeued = job(job_id="3", restarts=1, submit=T0 + 80)   # pending again, submit reset
    out, stats = t.step([done, failed, requeued], None, T0 + 100)
    by_job: dict[str, list[tuple[str, str, Any]]] = {}
    for r in out:
        by_job.setdefault(r["job_id"], []).append((r["event"], r["time"], r.get("reason")))
    assert by_job["1"][1] == ("finished", rfc3339(T0 + 65),
                              "completed; not observed by the bridge (started before it ran)")
    assert by_job["2"][1][2] == \
        "failed (exit code 3:0); not observed by the bridge (started before it ran)"
    assert by_job["3"] == [
        ("submitted", rfc3339(T0 + 80), None),
        ("requeued", rfc3339(T0 + 80), "requeued by Slurm (restart 1); the attempt before "
                                       "it ran before the bridge's first poll (not observed)")]
    assert (stats.before_bridge, stats.start_unseen, stats.requeue_unseen) == (2, 0, 1)
    # the next poll: it starts; nothing is said twice
    out, _ = t.step([running(T0 + 110, restarts=1, submit=T0 + 80, job_id="3")], None,
                    T0 + 111)
    assert [(r["job_id"], r["event"]) for r in out] == [("3", "started")]
    # and the memory survives a restart of the bridge
    again = SlurmTracker(Mapping())
    again.load_json(json.loads(json.dumps(t.to_json())))
    assert again.last_poll == T0 + 111
    late = job(job_id="4", state="COMPLETED", start=T0 + 120, end=T0 + 130)
    (_, (event, _, reason)) = [(r["job_id"], (r["event"], r["time"], r.get("reason")))
                               for r in again.step([late], None, T0 + 140)[0]][1]
    assert (event, reason) == ("finished", "completed; ran 10 s between two polls "
                                           "(allocation not observed)")


def test_a_requeue_between_two_polls_counts_the_attempt_before_it() -> None:
    """The bridge saw the job pending; it ran and was requeued before the next poll (or
    while the bridge was down): only the restart count and the reset SubmitTime show it.
    The bridge still says `requeued`, so the next attempt waits from the requeue."""
    t = SlurmTracker(Mapping())
    t.step([job()], None, T0 + 1)
    out, stats = t.step([job(restarts=1, submit=T0 + 300)], None, T0 + 400)
    assert [(r["event"], r["time"], r["reason"]) for r in out] == [
        ("requeued", rfc3339(T0 + 300), "requeued by Slurm (restart 1); the attempt before it "
                                        "ran between two polls (not observed)")]
    assert stats.requeue_unseen == 1
    out, _ = t.step([running(T0 + 420, restarts=1, submit=T0 + 300)], None, T0 + 421)
    assert events(out) == [("started", rfc3339(T0 + 420))]
    # ran, requeued and started again, all between two polls: requeued, then started
    t2 = SlurmTracker(Mapping())
    t2.step([job()], None, T0 + 1)
    out, _ = t2.step([running(T0 + 420, restarts=1, submit=T0 + 300)], None, T0 + 421)
    assert events(out) == [("requeued", rfc3339(T0 + 300)), ("started", rfc3339(T0 + 420))]
