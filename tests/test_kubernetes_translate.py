"""Kubernetes objects → contract records, case by case (translate.py, objects.py)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from gpuledger.bridges.kubernetes import objects as k8s
from gpuledger.bridges.kubernetes.translate import Options, Translator
from gpuledger.bridges.mapping import Mapping

NOW = datetime(2026, 1, 5, 12, 0, tzinfo=UTC)


def _translator(**options: Any) -> Translator:
    return Translator(Mapping(), Options(**options), lambda: NOW)


def _cond(kind: str, status: bool, at: str, reason: str = "", message: str = "") -> dict[str, Any]:
    return {"type": kind, "status": "True" if status else "False",
            "lastTransitionTime": f"2026-01-05T{at}Z", "reason": reason, "message": message}


def _pod(name: str, *, gpus: dict[str, str] | None = None, node: str | None = None,
         phase: str = "Pending", conds: list[dict[str, Any]] | None = None,
         annotations: dict[str, str] | None = None, init: dict[str, str] | None = None,
         deleted: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [
        {"name": "a", "resources": {"limits": dict(gpus or {})}},
        {"name": "sidecar", "resources": {"requests": {"cpu": "100m"}}}]}
    if init:
        spec["initContainers"] = [{"name": "i", "resources": {"limits": init}}]
    if node:
        spec["nodeName"] = node
    meta: dict[str, Any] = {"name": name, "namespace": "ns", "uid": f"u-{name}",
                            "creationTimestamp": "2026-01-05T10:00:00Z"}
    if annotations:
        meta["annotations"] = annotations
    if deleted:
        meta["deletionTimestamp"] = f"2026-01-05T{deleted}Z"
    return {"metadata": meta, "spec": spec, "status": {"phase": phase,
                                                       "conditions": conds or []}}


def _node(name: str, *, count: str = "8", ready: bool = True, pressure: bool = False,
          allocatable: str = "8", unschedulable: bool = False,
          taints: list[dict[str, str]] | None = None) -> dict[str, Any]:
    labels = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.count": count,
              "nvidia.com/gpu.memory": "81559"}
    return {"metadata": {"name": name, "labels": labels},
            "spec": {"unschedulable": unschedulable, "taints": taints or []},
            "status": {"capacity": {"nvidia.com/gpu": count},
                       "allocatable": {"nvidia.com/gpu": allocatable},
                       "conditions": [_cond("Ready", ready, "09:00:00"),
                                      _cond("DiskPressure", pressure, "09:00:00")]}}


def test_gpu_requests_whole_mig_and_init_containers() -> None:
    assert k8s.pod_gpus(_pod("a", gpus={"nvidia.com/gpu": "2"})) == k8s.GpuRequest(2)
    mig = k8s.pod_gpus(_pod("b", gpus={"nvidia.com/mig-3g.40gb": "1",
                                       "nvidia.com/mig-1g.10gb": "2"}))
    assert mig.whole == 0 and sorted(mig.mig) == pytest.approx([1 / 7, 1 / 7, 3 / 7])
    assert k8s.pod_gpus(_pod("c", gpus={"nvidia.com/gpu": "1"},
                             init={"nvidia.com/gpu": "4"})).whole == 4
    assert not k8s.pod_gpus(_pod("d"))
    assert k8s.quantity("500m") == 0.5 and k8s.quantity("2") == 2.0


@pytest.mark.parametrize(("node", "schedulable", "health"), [
    (_node("ok"), True, "ok"),
    (_node("notready", ready=False), True, "down"),
    (_node("pressure", pressure=True), True, "degraded"),
    (_node("lost-gpu", allocatable="7"), True, "degraded"),
    (_node("cordoned", unschedulable=True), False, "ok"),
    (_node("gpu-taint", taints=[{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]), True, "ok"),
    (_node("unreachable", taints=[{"key": "node.kubernetes.io/unreachable",
                                   "effect": "NoExecute"}]), False, "ok"),
])
def test_node_schedulable_and_health(node: dict[str, Any], schedulable: bool,
                                     health: str) -> None:
    (rec,) = _translator().apply("nodes", "ADDED", node)
    assert (rec["schedulable"], rec["health"]) == (schedulable, health)
    assert rec["card_type"] == "H100-SXM5-80GB" and rec["gpu_count"] == 8
    assert rec["time"] == "2026-01-05T12:00:00.000Z"
    assert _translator().apply("nodes", "ADDED", _node("cpu", count="0")) == []


def test_absurd_gpu_counts_leave_the_node_out_and_never_crash(
        caplog: pytest.LogCaptureFixture) -> None:
    """A count label of 1025 raised ValueError from the placer (a traceback, and the
    healthy node beside it went out with it); a negative label dropped a node whose
    capacity says 8; a pod quantity of 1e400 raised OverflowError."""
    tr = _translator()
    huge = _node("huge", count="1025")
    assert tr.apply("nodes", "ADDED", huge) == []
    assert tr.apply("nodes", "MODIFIED", huge) == []
    assert [r.message for r in caplog.records].count(
        "node huge left out of the inventory: it is said to hold 1025 GPUs, more than a "
        "node can (0-1024)") == 1                           # one warning, not one a poll
    (ok,) = tr.apply("nodes", "ADDED", _node("ok"))
    assert ok["gpu_count"] == 8
    negative = _node("neg")
    negative["metadata"]["labels"]["nvidia.com/gpu.count"] = "-4"
    (rec,) = tr.apply("nodes", "ADDED", negative)
    assert rec["gpu_count"] == 8                            # the capacity's count
    assert k8s.quantity("1e400") == 0.0 and k8s.quantity(float("inf")) == 0.0
    assert k8s.quantity("1e400k") == 0.0 and k8s.quantity("nan") == 0.0
    assert not k8s.pod_gpus(_pod("p", gpus={"nvidia.com/gpu": "1e400"}))


def test_device_plugin_annotation_gives_the_indices() -> None:
    tr = _translator(gpu_index_annotation="example.com/gpu-idx")
    sched = [_cond("PodScheduled", True, "10:00:05")]
    records = tr.apply("pods", "ADDED", _pod("p", gpus={"nvidia.com/gpu": "2"}, node="n1",
                                              phase="Running", conds=sched,
                                              annotations={"example.com/gpu-idx": "5,7"}))
    started = next(r for r in records if r["event"] == "started")
    assert [a["gpu_index"] for a in started["allocation"]] == [5, 7]
    # the next pod on that node gets the lowest indices the first did not take
    records = tr.apply("pods", "ADDED", _pod("q", gpus={"nvidia.com/gpu": "3"}, node="n1",
                                              phase="Running", conds=sched))
    started = next(r for r in records if r["event"] == "started")
    assert [a["gpu_index"] for a in started["allocation"]] == [0, 1, 2]


def test_pod_lifecycle_and_deletion() -> None:
    tr = _translator()
    pending = _pod("p", gpus={"nvidia.com/gpu": "1"})
    (sub,) = tr.apply("pods", "ADDED", pending)
    assert sub["event"] == "submitted" and sub["job_id"] == "ns/p" and sub["gpus"] == 1
    assert tr.apply("pods", "MODIFIED", pending) == []          # nothing new
    (cancel,) = tr.apply("pods", "DELETED", _pod("p", gpus={"nvidia.com/gpu": "1"},
                                                  deleted="10:05:00"))
    assert (cancel["event"], cancel["time"]) == ("cancelled", "2026-01-05T10:05:00.000Z")
    assert tr.state["jobs"] == {} and tr.state["pods"] == {}


def _workload(conds: list[dict[str, Any]], active: bool = True) -> dict[str, Any]:
    return {"metadata": {"name": "w", "namespace": "ns", "uid": "wl",
                         "creationTimestamp": "2026-01-05T10:00:00Z",
                         "ownerReferences": [{"kind": "Job", "name": "j", "uid": "job"}]},
            "spec": {"queueName": "lq", "priority": 5, "active": active,
                     "podSets": [{"name": "main", "count": 1, "template": {"spec": {
                         "containers": [{"name": "c", "resources": {
                             "limits": {"nvidia.com/gpu": "2"}}}]}}}]},
            "status": {"conditions": conds}}


def test_eviction_that_is_not_a_preemption_requeues() -> None:
    tr = _translator()
    admitted = [_cond("QuotaReserved", True, "10:01:00"), _cond("Admitted", True, "10:01:00")]
    tr.apply("workloads", "ADDED", _workload(admitted))
    pod = _pod("j-0", gpus={"nvidia.com/gpu": "2"}, node="n", phase="Running",
               conds=[_cond("PodScheduled", True, "10:01:02")])
    pod["metadata"]["ownerReferences"] = [{"kind": "Job", "name": "j", "uid": "job"}]
    (started,) = tr.apply("pods", "ADDED", pod)
    assert (started["event"], started["time"]) == ("started", "2026-01-05T10:01:00.000Z")
    evicted = [*admitted, _cond("Evicted", True, "10:20:00", "PodsReadyTimeout")]
    (requeued,) = tr.apply("workloads", "MODIFIED", _workload(evicted))
    assert requeued["event"] == "requeued" and "PodsReadyTimeout" in requeued["reason"]
    (cancel,) = tr.apply("workloads", "DELETED", _workload(evicted))
    assert cancel["event"] == "cancelled" and cancel["job_id"] == "kueue/ns/w"


def test_workload_without_gpus_is_ignored_and_finished_before_start() -> None:
    tr = _translator()
    cpu = _workload([])
    cpu["spec"]["podSets"][0]["template"]["spec"]["containers"][0]["resources"] = {}
    assert tr.apply("workloads", "ADDED", cpu) == []
    rejected = [_cond("Finished", True, "10:03:00", "AdmissionChecksRejected", "no capacity")]
    events = [(r["event"], r.get("reason")) for r in
              tr.apply("workloads", "ADDED", _workload(rejected))]
    assert events == [("submitted", None), ("cancelled", "no capacity")]


def test_state_round_trips_through_json() -> None:
    import json

    tr = _translator()
    tr.apply("nodes", "ADDED", _node("n"))
    tr.apply("pods", "ADDED", _pod("p", gpus={"nvidia.com/gpu": "3"}, node="n",
                                   phase="Running",
                                   conds=[_cond("PodScheduled", True, "10:00:09")]))
    again = Translator(Mapping(), Options(), lambda: NOW, json.loads(json.dumps(tr.state)))
    assert again.placer.free["n"] == tr.placer.free["n"]
    records = again.apply("pods", "ADDED", _pod("q", gpus={"nvidia.com/gpu": "1"}, node="n",
                                                phase="Running",
                                                conds=[_cond("PodScheduled", True,
                                                             "10:00:10")]))
    assert [a["gpu_index"] for r in records if r["event"] == "started"
            for a in r["allocation"]] == [3]


def test_partial_admission_counts_the_admitted_pods() -> None:
    wl = _workload([_cond("Admitted", True, "10:01:00")])
    wl["spec"]["podSets"][0]["count"] = 4
    assert k8s.workload_gpu_pods(wl)[:2] == (4, 8)
    wl["status"]["admission"] = {"clusterQueue": "cq", "podSetAssignments": [
        {"name": "main", "count": 3, "resourceUsage": {"nvidia.com/gpu": "6"}}]}
    assert k8s.workload_gpu_pods(wl)[:2] == (3, 6)


def test_a_workload_whose_pods_are_not_all_bound_starts_after_the_grace_time() -> None:
    clock = [datetime(2026, 1, 5, 10, 1, 30, tzinfo=UTC)]
    tr = Translator(Mapping(), Options(start_grace_s=120), lambda: clock[0])
    wl = _workload([_cond("Admitted", True, "10:01:00")])
    wl["spec"]["podSets"][0]["count"] = 2          # two pods expected, one is ever bound
    tr.apply("workloads", "ADDED", wl)
    pod = _pod("j-0", gpus={"nvidia.com/gpu": "2"}, node="n", phase="Running",
               conds=[_cond("PodScheduled", True, "10:01:02")])
    pod["metadata"]["ownerReferences"] = [{"kind": "Job", "name": "j", "uid": "job"}]
    assert tr.apply("pods", "ADDED", pod) == []     # waits for the second pod
    assert tr.tick() == []                          # 30 s after admission: still waiting
    clock[0] = datetime(2026, 1, 5, 10, 3, 1, tzinfo=UTC)
    (started,) = tr.tick()
    assert started["time"] == "2026-01-05T10:01:00.000Z"
    assert len(started["allocation"]) == 2
    assert tr.tick() == []
