"""Reading Kubernetes objects (Pod, Node, Kueue Workload) as plain dicts.

Pure functions over the JSON the API server returns; no client library. Field names
follow the Kubernetes API reference (core/v1 Pod and Node) and Kueue's
``kueue.x-k8s.io/v1beta1`` Workload.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

GPU_RESOURCE = "nvidia.com/gpu"
MIG_PREFIX = "nvidia.com/mig-"
# 1g.10gb, 3g.40gb, 7g.80gb, also 1g.10gb+me: compute slices of the 7 on A100/H100
_MIG_PROFILE = re.compile(r"^(\d+)g\.")
MIG_SLICES = 7

LABEL_PRODUCT = "nvidia.com/gpu.product"
LABEL_COUNT = "nvidia.com/gpu.count"
LABEL_MEMORY = "nvidia.com/gpu.memory"
LABEL_CLIQUE = "nvidia.com/gpu.clique"

Obj = dict[str, Any]


def meta(obj: Obj) -> Obj:
    value = obj.get("metadata")
    return value if isinstance(value, dict) else {}


def labels(obj: Obj) -> dict[str, str]:
    value = meta(obj).get("labels")
    return {str(k): str(v) for k, v in value.items()} if isinstance(value, dict) else {}


def annotations_of(obj: Obj) -> dict[str, str]:
    value = meta(obj).get("annotations")
    return {str(k): str(v) for k, v in value.items()} if isinstance(value, dict) else {}


def key(obj: Obj) -> str:
    """``namespace/name`` (or ``name`` for cluster-scoped objects)."""
    m = meta(obj)
    ns = m.get("namespace")
    return f"{ns}/{m.get('name')}" if ns else str(m.get("name"))


def uid(obj: Obj) -> str:
    m = meta(obj)
    return str(m.get("uid") or key(obj))


def owner_uids(obj: Obj) -> list[str]:
    refs = meta(obj).get("ownerReferences") or []
    return [str(r["uid"]) for r in refs if isinstance(r, dict) and r.get("uid")]


def parse_time(text: Any) -> datetime | None:
    """An RFC 3339 timestamp from the API (``2026-01-05T10:00:00Z``), or None."""
    if not isinstance(text, str) or not text:
        return None
    try:
        value = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        return None
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def created(obj: Obj) -> datetime | None:
    return parse_time(meta(obj).get("creationTimestamp"))


def deleted(obj: Obj) -> datetime | None:
    return parse_time(meta(obj).get("deletionTimestamp"))


@dataclass(frozen=True)
class Condition:
    status: bool
    time: datetime | None
    reason: str
    message: str


def conditions(status: Any) -> dict[str, Condition]:
    """``status.conditions`` by type (the Pod, Node and Workload form alike)."""
    out: dict[str, Condition] = {}
    items = status.get("conditions") if isinstance(status, dict) else None
    for c in items or []:
        if isinstance(c, dict) and c.get("type"):
            out[str(c["type"])] = Condition(
                status=str(c.get("status")) == "True",
                time=parse_time(c.get("lastTransitionTime")),
                reason=str(c.get("reason") or ""), message=str(c.get("message") or ""))
    return out


# -- quantities and GPU requests -----------------------------------------------------


def quantity(value: Any) -> float:
    """A resource quantity as a number (``"2"``, ``2``, ``"500m"``, ``"1k"``); 0 if bad."""
    if isinstance(value, bool):
        return 0.0
    if isinstance(value, int | float):
        given = float(value)
        return given if math.isfinite(given) else 0.0
    text = str(value).strip()
    factors = {"m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "Ki": 1024.0, "Mi": 1024.0**2,
               "Gi": 1024.0**3}
    number, factor = text, 1.0
    for suffix in ("Ki", "Mi", "Gi", "m", "k", "M", "G"):
        if text.endswith(suffix):
            number, factor = text[: -len(suffix)], factors[suffix]
            break
    try:
        value = float(number) * factor
    except ValueError:
        return 0.0
    return value if math.isfinite(value) else 0.0  # "1e400", "inf": not a quantity


@dataclass(frozen=True)
class GpuRequest:
    """What one pod asks for: whole GPUs and MIG slices (fraction of a GPU each)."""

    whole: int = 0
    mig: tuple[float, ...] = ()

    @property
    def devices(self) -> int:
        return self.whole + len(self.mig)

    def __bool__(self) -> bool:
        return self.devices > 0


def mig_fraction(resource: str) -> float:
    """Share of a GPU held by one instance of a MIG resource (compute slices / 7)."""
    match = _MIG_PROFILE.match(resource[len(MIG_PREFIX):])
    slices = int(match.group(1)) if match else 1
    return min(1.0, slices / MIG_SLICES)


def _container_resources(container: Any) -> dict[str, float]:
    res = container.get("resources") if isinstance(container, dict) else None
    if not isinstance(res, dict):
        return {}
    out: dict[str, float] = {}
    for part in ("limits", "requests"):  # extended resources: requests == limits
        values = res.get(part)
        if isinstance(values, dict):
            for name, q in values.items():
                if name == GPU_RESOURCE or str(name).startswith(MIG_PREFIX):
                    out[str(name)] = max(out.get(str(name), 0.0), quantity(q))
    return out


def pod_spec_gpus(spec: Any) -> GpuRequest:
    """GPUs of a pod spec: the sum over containers, or the largest init container."""
    if not isinstance(spec, dict):
        return GpuRequest()

    def total(containers: Any, combine: str) -> dict[str, float]:
        acc: dict[str, float] = {}
        for c in containers or []:
            for name, q in _container_resources(c).items():
                acc[name] = acc.get(name, 0.0) + q if combine == "sum" else max(
                    acc.get(name, 0.0), q)
        return acc

    main = total(spec.get("containers"), "sum")
    init = total(spec.get("initContainers"), "max")
    merged = {n: max(main.get(n, 0.0), init.get(n, 0.0)) for n in set(main) | set(init)}
    whole = int(merged.pop(GPU_RESOURCE, 0.0))
    mig: list[float] = []
    for name in sorted(merged):
        mig.extend([mig_fraction(name)] * int(merged[name]))
    return GpuRequest(whole, tuple(mig))


def pod_gpus(pod: Obj) -> GpuRequest:
    return pod_spec_gpus(pod.get("spec"))


# -- pods ------------------------------------------------------------------------------


def pod_node(pod: Obj) -> str | None:
    spec = pod.get("spec")
    node = spec.get("nodeName") if isinstance(spec, dict) else None
    return str(node) if node else None


def pod_phase(pod: Obj) -> str:
    status = pod.get("status")
    return str(status.get("phase") or "Pending") if isinstance(status, dict) else "Pending"


def pod_scheduled_time(pod: Obj) -> datetime | None:
    cond = conditions(pod.get("status")).get("PodScheduled")
    return cond.time if cond and cond.status else None


def pod_end_time(pod: Obj) -> datetime | None:
    """When a Succeeded/Failed pod's last container ended (else its Ready transition)."""
    status = pod.get("status")
    latest: datetime | None = None
    if isinstance(status, dict):
        for cs in status.get("containerStatuses") or []:
            term = (cs.get("state") or {}).get("terminated") if isinstance(cs, dict) else None
            t = parse_time(term.get("finishedAt")) if isinstance(term, dict) else None
            if t is not None and (latest is None or t > latest):
                latest = t
    if latest is None:
        ready = conditions(status).get("Ready")
        latest = ready.time if ready else None
    return latest


def pod_priority(pod: Obj) -> int | None:
    spec = pod.get("spec")
    value = spec.get("priority") if isinstance(spec, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


# -- nodes -----------------------------------------------------------------------------


def node_gpu_count(node: Obj) -> int:
    """Physical GPUs: the GPU feature discovery count label, else the capacity."""
    count = labels(node).get(LABEL_COUNT)
    if count is not None:
        try:
            if int(count) >= 0:  # a negative count is no count: the capacity says
                return int(count)
        except ValueError:
            pass
    status = node.get("status")
    cap = status.get("capacity") if isinstance(status, dict) else None
    return int(quantity(cap.get(GPU_RESOURCE, 0))) if isinstance(cap, dict) else 0


def node_allocatable_gpus(node: Obj) -> int | None:
    status = node.get("status")
    alloc = status.get("allocatable") if isinstance(status, dict) else None
    if not isinstance(alloc, dict) or GPU_RESOURCE not in alloc:
        return None
    return int(quantity(alloc[GPU_RESOURCE]))


def node_capacity_gpus(node: Obj) -> int | None:
    status = node.get("status")
    cap = status.get("capacity") if isinstance(status, dict) else None
    if not isinstance(cap, dict) or GPU_RESOURCE not in cap:
        return None
    return int(quantity(cap[GPU_RESOURCE]))


def node_taints(node: Obj) -> list[tuple[str, str]]:
    spec = node.get("spec")
    taints = spec.get("taints") if isinstance(spec, dict) else None
    return [(str(t.get("key")), str(t.get("effect"))) for t in taints or []
            if isinstance(t, dict)]


def node_unschedulable(node: Obj) -> bool:
    spec = node.get("spec")
    return bool(spec.get("unschedulable")) if isinstance(spec, dict) else False


# -- Kueue workloads --------------------------------------------------------------------


def workload_gpu_pods(workload: Obj) -> tuple[int, int, list[GpuRequest]]:
    """(GPU pods expected, GPU devices in all, per-pod request of each GPU pod set).

    Counts are the admission's (``podSetAssignments[].count``, which partial admission
    lowers) when the workload is admitted, else the spec's.
    """
    spec = workload.get("spec")
    status = workload.get("status")
    admission = status.get("admission") if isinstance(status, dict) else None
    admitted: dict[str, int] = {}
    if isinstance(admission, dict):
        for psa in admission.get("podSetAssignments") or []:
            if isinstance(psa, dict) and isinstance(psa.get("count"), int):
                admitted[str(psa.get("name"))] = int(psa["count"])
    pods = devices = 0
    requests: list[GpuRequest] = []
    for ps in (spec.get("podSets") if isinstance(spec, dict) else None) or []:
        if not isinstance(ps, dict):
            continue
        template = ps.get("template")
        req = pod_spec_gpus(template.get("spec") if isinstance(template, dict) else None)
        count = admitted.get(str(ps.get("name")), int(ps.get("count") or 1))
        if req:
            pods += count
            devices += count * req.devices
            requests.append(req)
    return pods, devices, requests


def workload_queue(workload: Obj) -> str | None:
    spec = workload.get("spec")
    value = spec.get("queueName") if isinstance(spec, dict) else None
    return str(value) if value else None


def workload_priority(workload: Obj) -> int | None:
    spec = workload.get("spec")
    value = spec.get("priority") if isinstance(spec, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def workload_cluster_queue(workload: Obj) -> str | None:
    status = workload.get("status")
    adm = status.get("admission") if isinstance(status, dict) else None
    value = adm.get("clusterQueue") if isinstance(adm, dict) else None
    return str(value) if value else None


def workload_active(workload: Obj) -> bool:
    spec = workload.get("spec")
    return not (isinstance(spec, dict) and spec.get("active") is False)
