"""Kubernetes attribution: pods from cgroup paths and from a real pod-resources server."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from kubelet_podresources import FakeKubelet
from proctree import add_process, v1_lines

from gpuledger.agent.attribution import Chain
from gpuledger.agent.attribution.kubernetes import KubernetesAttribution, pod_from_cgroups
from gpuledger.agent.attribution.podresources import PodResourcesClient
from gpuledger.agent.attribution.procfs import Procfs

UID = "6f1c2d7e-8a1b-4c3d-9e2f-0a1b2c3d4e5f"
CID = "a" * 60 + "b7c9"
UUID = "GPU-00000000-0000-4000-8000-00000000000{}"
MIG = "MIG-11111111-2222-5333-8444-555555555555"

SHAPES = {
    "cgroupfs v1 burstable": v1_lines(f"/kubepods/burstable/pod{UID}/{CID}"),
    "cgroupfs v2 guaranteed": [f"0::/kubepods/pod{UID}/{CID}"],
    "systemd v2 containerd": [
        "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod"
        f"{UID.replace('-', '_')}.slice/cri-containerd-{CID}.scope"],
    "systemd v1 docker": v1_lines(
        f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
        f"{UID.replace('-', '_')}.slice/docker-{CID}.scope"),
    "systemd v2 cri-o": [
        f"0::/kubepods.slice/kubepods-pod{UID.replace('-', '_')}.slice/crio-{CID}.scope"],
    "cgroup namespace of a container": [f"0::/../../kubepods/burstable/pod{UID}/{CID}"],
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_pod_uid_and_container_from_every_cgroup_shape(shape: str) -> None:
    assert pod_from_cgroups(SHAPES[shape]) == (UID, CID)


def test_pod_cgroup_without_container_and_non_pod_paths() -> None:
    assert pod_from_cgroups([f"0::/kubepods/besteffort/pod{UID}"]) == (UID, None)
    assert pod_from_cgroups(["0::/system.slice/containerd.service"]) is None
    assert pod_from_cgroups(["0::/kubepods.slice/kubepods-besteffort.slice"]) is None


def _record(index: int, pids: list[int], uuid: str | None = None,
            mig: str | None = None) -> dict[str, Any]:
    return {"gpu_index": index, "gpu_uuid": uuid or UUID.format(index), "mig_instance": mig,
            "processes": [{"pid": p, "used_mib": 10.0, "job_id": None} for p in pids]}


def _pod_uid(n: int) -> str:
    return f"{n:08x}-0000-4000-8000-{n:012x}"


def test_processes_and_idle_gpus_with_the_kubelet(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    add_process(proc, 1, 0)
    add_process(proc, 100, 1, cgroup=[f"0::/kubepods/pod{_pod_uid(1)}/{CID}"])   # GPU 0
    add_process(proc, 101, 1, cgroup=[f"0::/kubepods/pod{_pod_uid(1)}/{CID}"])   # GPU 1
    add_process(proc, 200, 1, cgroup=[f"0::/kubepods/pod{_pod_uid(2)}/{CID}"])   # MIG
    add_process(proc, 300, 1, cgroup=[f"0::/kubepods/pod{_pod_uid(3)}/{CID}"])   # GPU 6 a
    add_process(proc, 301, 1, cgroup=[f"0::/kubepods/pod{_pod_uid(4)}/{CID}"])   # GPU 6 b
    add_process(proc, 400, 1, cgroup=["0::/user.slice/user-1000.slice"])        # GPU 3, host
    kubelet = FakeKubelet(tmp_path / "kubelet.sock")
    method = KubernetesAttribution(
        Procfs(proc), PodResourcesClient(str(tmp_path / "kubelet.sock"), timeout_s=5))
    records = [_record(0, [100]), _record(1, [101]), _record(2, [200], MIG, "1g.10gb/9"),
               _record(3, [400]), _record(5, []), _record(6, [300, 301]), _record(7, [])]
    try:
        Chain([method]).apply(records)
    finally:
        method.close()
        kubelet.stop()
    jobs = {r["gpu_index"]: [(p["pid"], p["job_id"]) for p in r["processes"]] for r in records}
    assert jobs[0] == [(100, "vision/llm-train-0")]
    assert jobs[1] == [(101, "vision/llm-train-0")]
    assert jobs[2] == [(200, "notebooks/nb-ana")]       # MIG device UUID
    assert jobs[3] == [(400, None)]                      # not in a pod: use outside Kubernetes
    assert jobs[5] == []                                 # no process, no pod: free
    # two pods time-slice GPU 6: the kubelet cannot tell which process is whose
    assert jobs[6] == [(300, _pod_uid(3)), (301, _pod_uid(4))]
    assert jobs[7] == [(0, "research/idle-claim")]       # held by a pod, no process yet
    assert method.errors == 0


def test_without_socket_the_pod_uid_is_the_job(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    add_process(proc, 1, 0)
    add_process(proc, 100, 1, cgroup=SHAPES["systemd v2 containerd"])
    records = [_record(0, [100]), _record(1, [])]
    Chain([KubernetesAttribution(Procfs(proc))]).apply(records)
    assert records[0]["processes"][0]["job_id"] == UID
    assert records[1]["processes"] == []


def test_kubelet_gone_counts_an_error_and_attributes_by_uid(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    add_process(proc, 1, 0)
    add_process(proc, 100, 1, cgroup=SHAPES["cgroupfs v2 guaranteed"])
    client = PodResourcesClient(str(tmp_path / "absent.sock"), timeout_s=0.3)
    method = KubernetesAttribution(Procfs(proc), client, job_id="{namespace}.{pod}")
    records = [_record(0, [100]), _record(7, [])]
    try:
        Chain([method]).apply(records)
    finally:
        method.close()
    assert method.errors == 1
    assert records[0]["processes"][0]["job_id"] == UID
    assert records[1]["processes"] == []
