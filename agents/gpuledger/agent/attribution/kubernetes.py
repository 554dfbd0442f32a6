"""Kubernetes: process → pod from its cgroup path; device → pod from the kubelet.

The kubelet puts each container in a cgroup below its pod's, and the path names the
pod UID. The shapes, for both cgroup v1 (one line per hierarchy) and v2:

- cgroupfs driver: ``/kubepods/burstable/pod<uid>/<container id>``
  (guaranteed pods directly under ``/kubepods/``);
- systemd driver: ``/kubepods.slice/kubepods-besteffort.slice/``
  ``kubepods-besteffort-pod<uid with _>.slice/cri-containerd-<container id>.scope``
  (``docker-``, ``crio-`` prefixes alike).

The pod-resources API (:mod:`.podresources`) names the pods holding each GPU by
namespace and name. A process in a pod on a GPU held by exactly one pod gets that pod's
job id (``job_id``, default ``{namespace}/{pod}``); when the kubelet cannot tell
(no socket, several pods time-slicing the GPU), the job id is the pod UID from the
cgroup. A GPU without a process that the kubelet gives to a pod is reported as held by
that pod (see :class:`gpuledger.agent.attribution.Chain`).
"""

from __future__ import annotations

import logging
import re
import time
from typing import Any

from gpuledger.agent.attribution import Method, Record
from gpuledger.agent.attribution.podresources import (
    DEFAULT_RESOURCES,
    DeviceHolder,
    device_map,
)
from gpuledger.agent.attribution.procfs import Procfs

log = logging.getLogger("gpuledger.agent.attribution.kubernetes")

_UID = r"[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}"
POD_IN_CGROUP = re.compile(rf"pod({_UID})(?:\.slice)?(?:/|$)")
_CONTAINER = re.compile(r"^(?:cri-containerd-|docker-|crio-|containerd-)?([0-9a-f]{64})"
                        r"(?:\.scope)?$")


def pod_from_cgroups(paths: list[str]) -> tuple[str, str | None] | None:
    """(pod UID, container id or None) from a process's cgroup paths."""
    for path in paths:
        m = POD_IN_CGROUP.search(path)
        if m is None:
            continue
        uid = m.group(1).replace("_", "-")
        rest = path[m.end():].strip("/").split("/")
        cm = _CONTAINER.match(rest[0]) if rest and rest[0] else None
        return uid, (cm.group(1) if cm else None)
    return None


class KubernetesAttribution(Method):
    """Pods from cgroups and, when a socket is configured, from the kubelet."""

    name = "kubernetes"

    def __init__(self, procfs: Procfs, client: Any = None,
                 job_id: str = "{namespace}/{pod}",
                 resources: tuple[str, ...] = DEFAULT_RESOURCES,
                 refresh_s: float = 10.0) -> None:
        self.procfs = procfs
        self.client = client
        self.template = job_id
        self.resources = resources
        self.refresh_s = refresh_s
        self.errors = 0
        self._devices: dict[str, list[DeviceHolder]] = {}
        self._fetched = float("-inf")

    def begin_cycle(self) -> None:
        if self.client is None or time.monotonic() - self._fetched < self.refresh_s:
            return
        self._fetched = time.monotonic()
        try:
            self._devices = device_map(self.client.list(), self.resources)
        except Exception as exc:
            self.errors += 1
            self._devices = {}   # stale holders would misattribute
            log.warning("kubelet pod-resources API at %s did not answer: %s",
                        getattr(self.client, "socket", "?"), exc)

    def _holders(self, record: Record) -> list[DeviceHolder]:
        holders = list(self._devices.get(str(record.get("gpu_uuid")), []))
        if not record.get("mig_instance"):
            holders += self._devices.get(str(record.get("gpu_index")), [])
        return holders

    def _render(self, holder: DeviceHolder) -> str:
        return self.template.format(namespace=holder.namespace, pod=holder.pod,
                                    container=holder.container)

    def device_jobs(self, record: Record) -> list[str]:
        jobs: list[str] = []
        for holder in self._holders(record):
            job = self._render(holder)
            if job not in jobs:
                jobs.append(job)
        return jobs

    def process_job(self, pid: int, record: Record) -> str | None:
        if pid <= 0:
            return None
        found = pod_from_cgroups(self.procfs.cgroups(pid))
        if found is None:
            return None
        jobs = self.device_jobs(record)
        return jobs[0] if len(jobs) == 1 else found[0]

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
