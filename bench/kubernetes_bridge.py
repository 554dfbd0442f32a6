"""Kubernetes bridge at cluster scale: list over HTTP, relist translation, watch events.

Builds a synthetic cluster (GPU nodes of 8 H100s, Kueue Workloads with their bound pods,
standalone GPU pods), serves it from the tests' recorded API server over real HTTP on
127.0.0.1, and measures:

- the paginated list of all pods (client side: HTTP + JSON);
- the first relist's translation (nodes, workloads, pods → inventory and job events);
- watch-event translation: every workload finishing and its pods ending, one event at
  a time;
- the state file: size and the time of one atomic write.

    .venv/bin/python bench/kubernetes_bridge.py --nodes 1000
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from k8s_api_server import FakeApiServer

from gpuledger.bridges.kubernetes.api import ApiClient, Connection
from gpuledger.bridges.kubernetes.translate import Translator
from gpuledger.bridges.state import save_state

T0 = datetime(2026, 1, 5, 8, 0, tzinfo=UTC)


def _ts(seconds: float) -> str:
    return (T0 + timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")


def _cond(kind: str, at: float, reason: str = "") -> dict[str, Any]:
    return {"type": kind, "status": "True", "lastTransitionTime": _ts(at), "reason": reason,
            "message": ""}


def cluster(nodes: int) -> tuple[list[Any], list[Any], list[Any]]:
    node_items = [{
        "kind": "Node", "apiVersion": "v1",
        "metadata": {"name": f"gpu-{i:05d}", "uid": f"n{i}", "resourceVersion": "1",
                     "labels": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
                                "nvidia.com/gpu.count": "8", "nvidia.com/gpu.memory": "81559",
                                "gpuledger.io/pool": "train"}},
        "spec": {},
        "status": {"capacity": {"nvidia.com/gpu": "8"}, "allocatable": {"nvidia.com/gpu": "8"},
                   "conditions": [_cond("Ready", 0, "KubeletReady")]}} for i in range(nodes)]
    workloads, pods = [], []
    for i in range(nodes):  # per node: one 4-GPU workload (2 pods × 2), two 1-GPU pods, ...
        node, w = f"gpu-{i:05d}", i
        job_uid = f"job-{w}"
        created = (i * 7) % 3600
        workloads.append({
            "apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "Workload",
            "metadata": {"name": f"wl-{w}", "namespace": f"team-{w % 20}", "uid": f"w{w}",
                         "resourceVersion": "1", "creationTimestamp": _ts(created),
                         "ownerReferences": [{"kind": "Job", "name": f"j{w}",
                                              "uid": job_uid}]},
            "spec": {"queueName": "research", "priority": 10, "podSets": [
                {"name": "main", "count": 2, "template": {"spec": {"containers": [
                    {"name": "m", "resources": {"limits": {"nvidia.com/gpu": "2"}}}]}}}]},
            "status": {"conditions": [_cond("QuotaReserved", created + 60),
                                      _cond("Admitted", created + 60)]}})
        for k in range(2):
            pods.append(_pod(f"wl-{w}-{k}", f"team-{w % 20}", f"p{w}-{k}", node, 2,
                             created + 61, job_uid))
        for k in range(2):
            pods.append(_pod(f"solo-{i}-{k}", f"team-{i % 20}", f"s{i}-{k}", node, 1,
                             created + 5))
    return node_items, workloads, pods


def _pod(name: str, ns: str, uid: str, node: str, gpus: int, at: float,
         owner: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": ns, "uid": uid, "resourceVersion": "1",
                            "creationTimestamp": _ts(at - 30), "labels": {}}
    if owner:
        meta["ownerReferences"] = [{"kind": "Job", "name": "j", "uid": owner}]
    return {"kind": "Pod", "apiVersion": "v1", "metadata": meta,
            "spec": {"nodeName": node, "containers": [
                {"name": "m", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]},
            "status": {"phase": "Running", "conditions": [_cond("PodScheduled", at)]}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=1000)
    args = ap.parse_args()
    nodes, workloads, pods = cluster(args.nodes)
    print(f"cluster: {len(nodes):,} nodes ({8 * len(nodes):,} GPUs), {len(workloads):,} "
          f"workloads, {len(pods):,} GPU pods")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for name, items in (("nodes", nodes), ("workloads", workloads), ("pods", pods)):
            (folder / f"{name}-list.json").write_text(json.dumps(
                {"metadata": {"resourceVersion": "10"}, "items": items}))
            (folder / f"{name}-watch.jsonl").write_text("")
        with FakeApiServer(folder) as server:
            client = ApiClient(Connection(server.url), page_size=500)
            t = time.perf_counter()
            listed, _ = client.list("/api/v1/pods")
            http_s = time.perf_counter() - t
        print(f"list pods over HTTP (pages of 500): {http_s:.2f} s "
              f"({len(listed) / http_s:,.0f} pods/s)")
        tr = Translator(clock=lambda: T0)
        t = time.perf_counter()
        records = tr.relist("nodes", nodes) + tr.relist("workloads", workloads) \
            + tr.relist("pods", pods)
        relist_s = time.perf_counter() - t
        objects = len(nodes) + len(workloads) + len(pods)
        print(f"first relist translated: {relist_s:.2f} s for {objects:,} objects "
              f"({objects / relist_s:,.0f} objects/s) → {len(records):,} records")
        # watch events: every workload finishes, then its pods and the solo pods end
        events: list[tuple[str, str, dict[str, Any]]] = []
        for wl in workloads:
            done = json.loads(json.dumps(wl))
            done["status"]["conditions"].append(_cond("Finished", 7200, "Succeeded"))
            events.append(("workloads", "MODIFIED", done))
        for pod in pods:
            done = json.loads(json.dumps(pod))
            done["status"]["phase"] = "Succeeded"
            done["status"]["containerStatuses"] = [{"name": "m", "state": {"terminated": {
                "finishedAt": _ts(7190), "exitCode": 0}}}]
            events.append(("pods", "MODIFIED", done))
        t = time.perf_counter()
        out = 0
        for res, kind, obj in events:
            out += len(tr.apply(res, kind, obj))
        watch_s = time.perf_counter() - t
        print(f"watch events translated: {len(events) / watch_s:,.0f} events/s "
              f"({len(events):,} events → {out:,} records)")
        state = {"version": 1, "resource_versions": {}, "translator": tr.state,
                 "outbox": None}
        t = time.perf_counter()
        save_state(folder / "state.json", state)
        save_s = time.perf_counter() - t
        size = (folder / "state.json").stat().st_size
        print(f"state file: {size / 1e6:.1f} MB, one atomic write {save_s * 1000:.0f} ms")
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS (whole benchmark, incl. the generated cluster): {rss:.0f} MiB")


if __name__ == "__main__":
    main()
