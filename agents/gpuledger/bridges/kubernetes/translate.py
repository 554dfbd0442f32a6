"""Kubernetes objects → contract v1 job events and inventory records.

The translator is *level based*: every time it sees an object (from a list, a watch
event or a relist after ``410 Gone``) it derives the events that the object's current
state implies and emits only those it has not emitted before. Its state (which job is
in which phase, which pod holds which GPU indices, the last inventory of each node) is
a JSON document that the bridge persists, so a restart, a resumed watch or a relist
neither loses nor repeats events. Event times come from the objects themselves
(creation, condition transitions, container ends), so a replayed event is identical to
the original and the processor's duplicate check drops it.

Jobs (``docs/kubernetes.md``):

- a Kueue ``Workload`` that asks for GPUs is one job ``kueue/<namespace>/<name>``:
  ``submitted`` at creation; ``started`` at its ``Admitted`` transition (queue wait =
  admission − creation) once its GPU pods are bound to nodes, with their GPUs as the
  allocation; ``Evicted`` (reason ``Preempted``) → ``preempted``, other evictions →
  ``requeued``; back in the queue after a preemption (``Requeued`` or ``QuotaReserved``
  turning False, or a new admission) → ``requeued``; ``Finished`` → ``finished``
  (``Succeeded``), ``failed`` (``Failed``) or ``cancelled`` (other reasons); deleted
  before finishing → ``cancelled``;
- a GPU pod that no Workload owns is one job ``<namespace>/<pod>`` (the name the node
  agent attributes processes to): ``submitted`` at creation, ``started`` at its
  ``PodScheduled`` transition, ``finished``/``failed`` with its phase, ``preempted``
  when the scheduler preempts it (``DisruptionTarget``/``PreemptionByScheduler``),
  ``cancelled`` when deleted before it ended.

GPU indices: a pod does not record which GPUs it got. When the device plugin (or a
webhook) writes them into an annotation named in the configuration, they are used;
otherwise indices are assigned deterministically per node by
:mod:`gpuledger.bridges.placement` (lowest free indices for whole GPUs, best fit for MIG
slices), in the order pods are bound. The node agent's pod-resources attribution gives
the true devices for usage.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from gpuledger.bridges.kubernetes import objects as k8s
from gpuledger.bridges.mapping import Mapping
from gpuledger.bridges.placement import GpuCountCheck, Placer, Slot

log = logging.getLogger("gpuledger.bridges.kubernetes")

Record = dict[str, Any]
KUEUE_POD_LABELS = ("kueue.x-k8s.io/queue-name", "kueue.x-k8s.io/podset",
                    "kueue.x-k8s.io/managed")
DEFAULT_UNSCHEDULABLE_TAINTS = ("node.kubernetes.io/unschedulable",
                                "node.kubernetes.io/not-ready",
                                "node.kubernetes.io/unreachable",
                                "node.kubernetes.io/network-unavailable")
DEFAULT_NODE_LABELS = ("topology.kubernetes.io/zone", "kubernetes.io/hostname",
                       k8s.LABEL_PRODUCT)
PRESSURE = ("MemoryPressure", "DiskPressure", "PIDPressure")


@dataclass(frozen=True)
class Options:
    """How objects become records (the ``kubernetes:`` section of the bridge config)."""

    kueue: bool = True
    gpu_index_annotation: str | None = None
    node_labels: tuple[str, ...] = DEFAULT_NODE_LABELS
    unschedulable_taints: tuple[str, ...] = DEFAULT_UNSCHEDULABLE_TAINTS
    default_pool: str = "default"
    default_card_type: str = "unknown"
    start_grace_s: float = 120.0


def iso(t: datetime) -> str:
    t = t.astimezone(UTC)
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z"


@dataclass
class Translator:
    """Derives new records from objects; ``state`` is what the bridge persists."""

    mapping: Mapping = field(default_factory=Mapping)
    options: Options = field(default_factory=Options)
    clock: Callable[[], datetime] = field(default=lambda: datetime.now(UTC))
    state: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for part in ("jobs", "pods", "nodes", "workloads"):
            self.state.setdefault(part, {})
        self.placer = Placer()
        self._counts = GpuCountCheck(log)
        for name, rec in self.state["nodes"].items():
            self.placer.add_node(name, int(rec["gpu_count"]))
        for pod in self.state["pods"].values():
            if pod.get("slots") and not pod.get("released"):
                self.placer.take([(n, i, f) for n, i, f in pod["slots"]])
        self._owner_index: dict[str, str] = {}
        for wl_uid, wl in self.state["workloads"].items():
            for owner in wl["owners"]:
                self._owner_index[owner] = wl_uid
        # pods by job, and Kueue pods still waiting for their Workload
        self._pods_of: dict[str, set[str]] = {}
        self._waiting: set[str] = set()
        for pod_uid, pod in self.state["pods"].items():
            self._set_job(pod_uid, pod, pod["job_id"])

    # -- entry points ------------------------------------------------------------------

    def apply(self, resource: str, kind: str, obj: k8s.Obj) -> list[Record]:
        """One watch event (``ADDED``, ``MODIFIED``, ``DELETED``) of ``resource``."""
        gone = kind == "DELETED"
        if resource == "nodes":
            return self._node(obj, gone)
        if resource == "workloads":
            return self._workload(obj, gone)
        if resource == "pods":
            return self._pod(obj, gone)
        raise ValueError(f"unknown resource {resource!r}")

    def tick(self) -> list[Record]:
        """Start admitted Workloads whose pods were not all bound within the grace time.

        A Workload starts when all its admitted GPU pods are bound; when some never are
        (a pod deleted before binding, an elastic job), it starts with the pods that are
        bound once ``start_grace_s`` has passed since its admission.
        """
        cutoff = iso(self.clock() - timedelta(seconds=self.options.start_grace_s))
        out: list[Record] = []
        for wl_uid in sorted(self.state["workloads"]):
            wl = self.state["workloads"][wl_uid]
            job = self.state["jobs"].get(wl["job_id"])
            admitted = wl["view"]["admitted"]
            if job is None or job["phase"] != "pending" or job["await_requeue"] \
                    or not admitted or admitted > cutoff \
                    or (job["end"] is not None and admitted <= job["end"]):
                continue
            pods = self._bound_pods(wl["job_id"])
            if pods:
                out.append(self._started(wl["job_id"], admitted, pods))
                job.update(phase="running", start=admitted)
                out += self._derive_workload(wl_uid)
        return out

    def relist(self, resource: str, items: list[k8s.Obj]) -> list[Record]:
        """A full list: derive from every object, and treat the missing as deleted."""
        out: list[Record] = []
        if resource == "pods":
            items = sorted(items, key=lambda p: (
                k8s.pod_scheduled_time(p) or datetime.max.replace(tzinfo=UTC), k8s.key(p)))
        seen: set[str] = set()
        for obj in items:
            seen.add(k8s.meta(obj).get("name", "") if resource == "nodes" else k8s.uid(obj))
            out += self.apply(resource, "MODIFIED", obj)
        known = {"nodes": self.state["nodes"], "workloads": self.state["workloads"],
                 "pods": self.state["pods"]}[resource]
        for ident in sorted(set(known) - seen):
            out += self._vanished(resource, ident)
        return out

    # -- nodes ---------------------------------------------------------------------------

    def _node(self, node: k8s.Obj, gone: bool) -> list[Record]:
        name = str(k8s.meta(node).get("name"))
        count = k8s.node_gpu_count(node)
        if count <= 0 and name not in self.state["nodes"]:
            return []
        if not self._counts.fits(name, count):
            return []
        if gone:
            return self._vanished("nodes", name)
        labels = k8s.labels(node)
        product = labels.get(k8s.LABEL_PRODUCT)
        card = self.mapping.card_type(product) or self.options.default_card_type
        mem_label = labels.get(k8s.LABEL_MEMORY)
        try:
            mem = float(mem_label) if mem_label else None
        except ValueError:
            mem = None
        if mem is None:
            mem = self.mapping.card_memory(card) or 0.0
        conds = k8s.conditions(node.get("status"))
        ready = conds.get("Ready")
        if ready is None or not ready.status:
            health = "down"
        elif any(conds[p].status for p in PRESSURE if p in conds):
            health = "degraded"
        else:
            alloc, cap = k8s.node_allocatable_gpus(node), k8s.node_capacity_gpus(node)
            health = "degraded" if alloc is not None and cap is not None and alloc < cap \
                else "ok"
        taints = {t for t, effect in k8s.node_taints(node)
                  if effect in ("NoSchedule", "NoExecute")}
        schedulable = not k8s.node_unschedulable(node) and not (
            taints & set(self.options.unschedulable_taints))
        record: Record = {
            "node": name,
            "pool": self.mapping.pool(node_labels=labels) or self.options.default_pool,
            "card_type": card, "gpu_count": count, "gpu_mem_mib": mem,
            "schedulable": schedulable, "health": health,
            "labels": {k: labels[k] for k in self.options.node_labels if k in labels},
        }
        if labels.get(k8s.LABEL_CLIQUE):
            record["nvlink_domain"] = labels[k8s.LABEL_CLIQUE]
        return self._inventory(record)

    def _inventory(self, record: Record) -> list[Record]:
        name = record["node"]
        if self.state["nodes"].get(name) == record:
            return []
        self.state["nodes"][name] = record
        self.placer.add_node(name, int(record["gpu_count"]))
        return [{"v": 1, "type": "inventory", "time": iso(self.clock()), **record}]

    # -- workloads -------------------------------------------------------------------------

    def _workload(self, wl: k8s.Obj, gone: bool) -> list[Record]:
        if not self.options.kueue:
            return []
        wl_uid = k8s.uid(wl)
        if gone:
            if wl_uid not in self.state["workloads"]:
                return []
            return self._vanished("workloads", wl_uid, k8s.deleted(wl))
        expected, devices, _ = k8s.workload_gpu_pods(wl)
        if expected == 0 and wl_uid not in self.state["workloads"]:
            return []
        m = k8s.meta(wl)
        ns, name = str(m.get("namespace") or "default"), str(m.get("name"))
        job_id = f"kueue/{ns}/{name}"
        owners = k8s.owner_uids(wl)
        entry = self.state["workloads"].setdefault(wl_uid, {"job_id": job_id})
        entry["owners"] = owners
        entry["view"] = self._workload_view(wl, expected)
        for owner in owners:
            self._owner_index[owner] = wl_uid
        if job_id not in self.state["jobs"]:
            self.state["jobs"][job_id] = {"phase": "new", "start": None, "end": None,
                                          "await_requeue": False,
                                          "attrs": self._workload_attrs(wl, ns, name, devices)}
        self._link_waiting_pods()
        return self._derive_workload(wl_uid)

    def _workload_view(self, wl: k8s.Obj, expected: int) -> dict[str, Any]:
        conds = k8s.conditions(wl.get("status"))

        def when(kind: str, status: bool = True) -> str | None:
            c = conds.get(kind)
            return iso(c.time) if c and c.status == status and c.time else None

        admitted = when("Admitted")
        if "Admitted" not in conds:  # Kueue before the Admitted condition
            admitted = when("QuotaReserved")
        evicted = conds.get("Evicted")
        preempted = conds.get("Preempted")
        finished = conds.get("Finished")
        created = k8s.created(wl)
        return {
            "created": iso(created or self.clock()),
            "admitted": admitted,
            "quota_released": when("QuotaReserved", False),
            "evicted": when("Evicted"),
            "evict_reason": evicted.reason if evicted else "",
            "evict_message": evicted.message if evicted else "",
            "preempt_reason": preempted.reason if preempted and preempted.status else "",
            "requeued": when("Requeued"),
            "finished": when("Finished"),
            "finish_reason": finished.reason if finished else "",
            "finish_message": finished.message if finished else "",
            "expected": expected,
        }

    def _workload_attrs(self, wl: k8s.Obj, ns: str, name: str, devices: int) -> Record:
        labels = k8s.labels(wl)
        queue = k8s.workload_queue(wl)
        selector: dict[str, str] = {}
        spec = wl.get("spec")
        for ps in (spec.get("podSets") if isinstance(spec, dict) else None) or []:
            template = ps.get("template") if isinstance(ps, dict) else None
            pod_spec = template.get("spec") if isinstance(template, dict) else None
            sel = pod_spec.get("nodeSelector") if isinstance(pod_spec, dict) else None
            if isinstance(sel, dict):
                selector.update({str(k): str(v) for k, v in sel.items()})
        return self._attrs(ns, name, labels, queue, k8s.workload_priority(wl), devices,
                           selector)

    def _attrs(self, ns: str, name: str, labels: dict[str, str], queue: str | None,
               priority: int | None, devices: int, selector: dict[str, str]) -> Record:
        product = selector.get(k8s.LABEL_PRODUCT)
        return {
            "team": self.mapping.team(namespace=ns, labels=labels),
            "queue": self.mapping.queue(local_queue=queue),
            "pool": self.mapping.pool(node_labels=selector),
            "priority": self.mapping.priority(native=priority),
            "job_type": self.mapping.job_type(name=name, namespace=ns, queue=queue,
                                              labels=labels),
            "gpus": devices,
            "card_type": self.mapping.card_type(product) if product else None,
            "preemptible": self.mapping.preemptible(labels=labels),
        }

    def _derive_workload(self, wl_uid: str) -> list[Record]:
        wl = self.state["workloads"][wl_uid]
        job_id, view = wl["job_id"], wl["view"]
        job = self.state["jobs"][job_id]
        out: list[Record] = []
        if job["phase"] == "new":
            out.append(self._job("submitted", job_id, view["created"], **job["attrs"]))
            job["phase"] = "pending"
        # times are normalised RFC 3339 strings (iso()), so they compare as text
        admitted, evicted, finished = view["admitted"], view["evicted"], view["finished"]
        for _ in range(4):  # a single observation may imply several steps
            before = (job["phase"], job["await_requeue"])
            start, end = job["start"], job["end"]
            if job["phase"] == "running":
                if evicted and evicted >= start:
                    if view["evict_reason"] == "Preempted":
                        reason = ": ".join(x for x in (view["preempt_reason"],
                                                       view["evict_message"]) if x)
                        out.append(self._job("preempted", job_id, evicted,
                                             reason=reason or "preempted"))
                        job["await_requeue"] = True
                    else:
                        out.append(self._job("requeued", job_id, evicted,
                                             reason=f"evicted: {view['evict_reason']}"))
                    job.update(phase="pending", end=evicted)
                elif admitted and admitted > start:
                    # an eviction and a new admission happened while we were not looking
                    t = evicted if evicted and start < evicted <= admitted else admitted
                    out.append(self._job("requeued", job_id, t, reason="re-admitted"))
                    job.update(phase="pending", end=t, await_requeue=False)
                elif finished:
                    out.append(self._end(job_id, view))
                    job["phase"] = "ended"
            elif job["phase"] == "pending" and job["await_requeue"]:
                t = None
                if view["requeued"] and view["requeued"] >= end:
                    t = view["requeued"]
                elif view["quota_released"] and view["quota_released"] >= end:
                    t = view["quota_released"]
                elif admitted and admitted > end:
                    t = end
                if t is not None:
                    out.append(self._job("requeued", job_id, t))
                    job["await_requeue"] = False
                elif finished:
                    out.append(self._end(job_id, view, after_preemption=True))
                    job["phase"] = "ended"
            elif job["phase"] == "pending":
                if admitted and (end is None or admitted > end):
                    pods = self._bound_pods(job_id)
                    if pods and (len(pods) >= view["expected"] or finished):
                        out.append(self._started(job_id, admitted, pods))
                        job.update(phase="running", start=admitted)
                if job["phase"] == "pending" and finished:
                    out.append(self._end(job_id, view))
                    job["phase"] = "ended"
            if (job["phase"], job["await_requeue"]) == before:
                break
        return out

    def _end(self, job_id: str, view: dict[str, Any],
             after_preemption: bool = False) -> Record:
        reason = view["finish_reason"]
        if after_preemption:
            event = "cancelled"
        else:
            event = {"Succeeded": "finished", "Failed": "failed"}.get(reason, "cancelled")
        text = view["finish_message"] or reason or None
        return self._job(event, job_id, view["finished"], reason=text)

    # -- pods ------------------------------------------------------------------------------

    def _pod(self, pod: k8s.Obj, gone: bool) -> list[Record]:
        pod_uid = k8s.uid(pod)
        req = k8s.pod_gpus(pod)
        if not req and pod_uid not in self.state["pods"]:
            return []
        if gone:
            return self._vanished("pods", pod_uid, k8s.deleted(pod))
        m = k8s.meta(pod)
        ns, name = str(m.get("namespace") or "default"), str(m.get("name"))
        rec = self.state["pods"].setdefault(pod_uid, {
            "key": f"{ns}/{name}", "job_id": None, "kueue": False, "slots": None,
            "released": False, "consumed": False})
        rec["owners"] = [pod_uid, *k8s.owner_uids(pod)]
        wl_uid = self._workload_of(rec)
        labels = k8s.labels(pod)
        if wl_uid is not None:
            rec["kueue"] = True
            self._set_job(pod_uid, rec, self.state["workloads"][wl_uid]["job_id"])
        elif self.options.kueue and any(k in labels for k in KUEUE_POD_LABELS):
            rec["kueue"] = True  # its Workload has not been seen yet
            self._set_job(pod_uid, rec, rec["job_id"])
        elif rec["job_id"] is None:
            self._set_job(pod_uid, rec, f"{ns}/{name}")
            spec = pod.get("spec")
            sel = spec.get("nodeSelector") if isinstance(spec, dict) else None
            selector = {str(k): str(v) for k, v in sel.items()} if isinstance(sel, dict) \
                else {}
            self.state["jobs"].setdefault(rec["job_id"], {
                "phase": "new", "start": None, "end": None, "await_requeue": False,
                "attrs": self._attrs(ns, name, labels,
                                     labels.get("kueue.x-k8s.io/queue-name"),
                                     k8s.pod_priority(pod), req.devices, selector)})
        node = k8s.pod_node(pod)
        done = k8s.pod_phase(pod) in ("Succeeded", "Failed")
        if node and rec["slots"] is None and not done:
            rec["slots"] = [list(s) for s in self._assign(pod, node, req)]
            rec["scheduled"] = iso(k8s.pod_scheduled_time(pod) or k8s.created(pod)
                                   or self.clock())
        if done:
            self._release(rec)
        if rec["kueue"]:
            wl_uid = self._workload_of(rec)
            return self._derive_workload(wl_uid) if wl_uid is not None else []
        return self._derive_pod(pod, rec)

    def _workload_of(self, rec: dict[str, Any]) -> str | None:
        for owner in rec["owners"]:
            wl_uid = self._owner_index.get(owner)
            if wl_uid is not None and wl_uid in self.state["workloads"]:
                return wl_uid
        return None

    def _set_job(self, pod_uid: str, rec: dict[str, Any], job_id: str | None) -> None:
        old = rec.get("job_id")
        if old is not None and old != job_id:
            self._pods_of.get(old, set()).discard(pod_uid)
        rec["job_id"] = job_id
        if job_id is None:
            if rec.get("kueue"):
                self._waiting.add(pod_uid)
        else:
            self._waiting.discard(pod_uid)
            self._pods_of.setdefault(job_id, set()).add(pod_uid)

    def _forget_pod(self, pod_uid: str, rec: dict[str, Any]) -> None:
        self._waiting.discard(pod_uid)
        if rec.get("job_id") is not None:
            pods = self._pods_of.get(rec["job_id"], set())
            pods.discard(pod_uid)
            if not pods:
                self._pods_of.pop(rec["job_id"], None)

    def _link_waiting_pods(self) -> None:
        for pod_uid in sorted(self._waiting):
            rec = self.state["pods"][pod_uid]
            wl_uid = self._workload_of(rec)
            if wl_uid is not None:
                self._set_job(pod_uid, rec, self.state["workloads"][wl_uid]["job_id"])

    def _assign(self, pod: k8s.Obj, node: str, req: k8s.GpuRequest) -> list[Slot]:
        name = self.options.gpu_index_annotation
        if name:
            text = k8s.annotations_of(pod).get(name)
            try:
                indices = [int(x) for x in text.split(",") if x.strip()] if text else []
            except ValueError:
                indices = []
            if indices and len(indices) == req.devices:
                fracs = [1.0] * req.whole + list(req.mig)
                given = [(node, i, f) for i, f in zip(indices, fracs, strict=True)]
                self.placer.take(given)
                return given
        slots: list[Slot] = []
        if req.whole:
            slots += self.placer.place_on(node, req.whole, grow=True) or []
        for frac in req.mig:
            slots += self.placer.place_on(node, 1, frac, grow=True) or []
        return slots

    def _release(self, rec: dict[str, Any]) -> None:
        if rec.get("slots") and not rec.get("released"):
            self.placer.release([(n, i, f) for n, i, f in rec["slots"]])
            rec["released"] = True

    def _bound_pods(self, job_id: str) -> list[dict[str, Any]]:
        all_pods = self.state["pods"]
        pods = [all_pods[u] for u in self._pods_of.get(job_id, ())
                if all_pods[u].get("slots") and not all_pods[u]["consumed"]]
        return sorted(pods, key=lambda p: p["key"])

    def _started(self, job_id: str, at: str, pods: list[dict[str, Any]]) -> Record:
        allocation = []
        for pod in pods:
            pod["consumed"] = True
            allocation += [{"node": n, "gpu_index": i, "fraction": f}
                           for n, i, f in pod["slots"]]
        return self._job("started", job_id, at, allocation=allocation)

    def _derive_pod(self, pod: k8s.Obj, rec: dict[str, Any]) -> list[Record]:
        job_id = rec["job_id"]
        job = self.state["jobs"][job_id]
        out: list[Record] = []
        created = iso(k8s.created(pod) or self.clock())
        if job["phase"] == "new":
            out.append(self._job("submitted", job_id, created, **job["attrs"]))
            job["phase"] = "pending"
        phase = k8s.pod_phase(pod)
        if job["phase"] == "pending" and rec.get("slots") and not rec["consumed"]:
            out.append(self._started(job_id, rec["scheduled"], [rec]))
            job.update(phase="running", start=rec["scheduled"])
        disruption = k8s.conditions(pod.get("status")).get("DisruptionTarget")
        if job["phase"] == "running" and disruption and disruption.status \
                and disruption.reason == "PreemptionByScheduler":
            t = iso(disruption.time or self.clock())
            out.append(self._job("preempted", job_id, t,
                                 reason=disruption.message or disruption.reason))
            job.update(phase="preempted", end=t)
        if phase in ("Succeeded", "Failed") and job["phase"] != "ended":
            t = iso(k8s.pod_end_time(pod) or self.clock())
            if job["phase"] == "preempted":
                out.append(self._job("cancelled", job_id, t,
                                     reason="preempted pod is not restarted"))
            else:
                event = "finished" if phase == "Succeeded" else "failed"
                status = pod.get("status")
                reason = status.get("reason") if isinstance(status, dict) else None
                out.append(self._job(event, job_id, t, reason=reason or None))
            job["phase"] = "ended"
        return out

    # -- deletions ---------------------------------------------------------------------------

    def _vanished(self, resource: str, ident: str,
                  when: datetime | None = None) -> list[Record]:
        """An object was deleted (or is missing from a relist)."""
        t = iso(when or self.clock())
        if resource == "nodes":
            last = self.state["nodes"].get(ident)
            if last is None:
                return []
            out = self._inventory({**last, "schedulable": False, "health": "down"})
            del self.state["nodes"][ident]
            return out
        if resource == "workloads":
            wl = self.state["workloads"].pop(ident, None)
            if wl is None:
                return []
            for owner in wl["owners"]:
                self._owner_index.pop(owner, None)
            return self._cancel(wl["job_id"], t, "workload deleted")
        rec = self.state["pods"].pop(ident, None)
        if rec is None:
            return []
        self._forget_pod(ident, rec)
        self._release(rec)
        if rec["kueue"] or rec["job_id"] is None:
            return []
        return self._cancel(rec["job_id"], t, "pod deleted")

    def _cancel(self, job_id: str, t: str, reason: str) -> list[Record]:
        job = self.state["jobs"].pop(job_id, None)
        if job is None or job["phase"] in ("ended", "new"):
            return []
        return [self._job("cancelled", job_id, t, reason=reason)]

    # -- records -------------------------------------------------------------------------------

    @staticmethod
    def _job(event: str, job_id: str, at: str, **fields: Any) -> Record:
        rec: Record = {"v": 1, "type": "job", "time": at, "event": event, "job_id": job_id}
        rec.update({k: v for k, v in fields.items() if v is not None})
        return rec
