"""The cluster laid out as arrays: one entry per node and one per GPU.

Nodes are named ``{group}-{nnn}`` (1-based) and sorted by name; GPUs are numbered
globally node by node in that order (``gpu_index`` within a node follows). This is the
row order of every telemetry sample. GPU UUIDs are derived from the node name and index,
so they are stable across runs.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import dataclass

import numpy as np

from gpuledger.pipeline.simulate.cluster import ClusterSpec

NODES_PER_RACK = 4


@dataclass(frozen=True)
class Layout:
    """Per-node and per-GPU attributes of a cluster."""

    node_names: tuple[str, ...]
    node_group: np.ndarray  # index into spec.node_groups
    node_pool: tuple[str, ...]
    node_card: tuple[str, ...]
    node_gpus: np.ndarray  # GPUs per node
    node_first_gpu: np.ndarray  # global index of the node's GPU 0
    node_labels: tuple[str, ...]  # JSON object text
    node_nvlink_domain: tuple[str | None, ...]
    node_topology: tuple[str, ...]
    gpu_node: np.ndarray
    gpu_local: np.ndarray
    gpu_uuid: tuple[str, ...]
    gpu_mem_mib: np.ndarray
    gpu_tdp_w: np.ndarray
    gpu_idle_w: np.ndarray
    gpu_max_clock: np.ndarray
    gpu_idle_clock: np.ndarray
    gpu_dcgm: np.ndarray  # bool: reports DCGM profiling fields
    gpu_nvlink: np.ndarray  # bool: has NVLink counters

    @property
    def node_count(self) -> int:
        """Number of nodes."""
        return len(self.node_names)

    @property
    def gpu_count(self) -> int:
        """Number of GPUs."""
        return len(self.gpu_uuid)


def gpu_uuid(node: str, index: int) -> str:
    """A stable, UUID-shaped GPU id for ``node``'s GPU ``index``."""
    digest = hashlib.sha1(f"{node}/{index}".encode()).digest()[:16]
    return f"GPU-{uuid.UUID(bytes=digest)}"


def build_layout(spec: ClusterSpec) -> Layout:
    """Lay out every node and GPU of ``spec``."""
    nodes: list[tuple[str, int, int]] = []  # name, group index, index within group
    for g_index, group in enumerate(spec.node_groups):
        for i in range(group.nodes):
            nodes.append((f"{group.name}-{i + 1:03d}", g_index, i))
    nodes.sort()
    groups = [spec.node_groups[g] for _, g, _ in nodes]
    node_gpus = np.array([g.gpus_per_node for g in groups], dtype=np.int64)
    first = np.concatenate([[0], np.cumsum(node_gpus)[:-1]]).astype(np.int64)
    gpu_node = np.repeat(np.arange(len(nodes), dtype=np.int64), node_gpus)
    gpu_local = np.arange(int(node_gpus.sum()), dtype=np.int64) - first[gpu_node]
    labels = []
    for (_, _, i), group in zip(nodes, groups, strict=True):
        merged = {"group": group.name, "rack": f"{group.name}-r{i // NODES_PER_RACK + 1:02d}"}
        merged.update(group.labels)
        labels.append(json.dumps(merged, sort_keys=True, separators=(",", ":")))

    def per_gpu(values: list[float]) -> np.ndarray:
        return np.repeat(np.array(values, dtype=np.float64), node_gpus)

    return Layout(
        node_names=tuple(n for n, _, _ in nodes),
        node_group=np.array([g for _, g, _ in nodes], dtype=np.int64),
        node_pool=tuple(g.pool for g in groups),
        node_card=tuple(g.card_type for g in groups),
        node_gpus=node_gpus,
        node_first_gpu=first,
        node_labels=tuple(labels),
        node_nvlink_domain=tuple(
            f"{name}/nvswitch" if g.topology == "nvlink" else None
            for (name, _, _), g in zip(nodes, groups, strict=True)
        ),
        node_topology=tuple(g.topology for g in groups),
        gpu_node=gpu_node,
        gpu_local=gpu_local,
        gpu_uuid=tuple(
            gpu_uuid(nodes[n][0], int(k)) for n, k in zip(gpu_node, gpu_local, strict=True)
        ),
        gpu_mem_mib=per_gpu([g.gpu_mem_mib for g in groups]),
        gpu_tdp_w=per_gpu([g.tdp_w for g in groups]),
        gpu_idle_w=per_gpu([g.idle_w for g in groups]),
        gpu_max_clock=per_gpu([g.max_sm_clock_mhz for g in groups]),
        gpu_idle_clock=per_gpu([g.idle_sm_clock_mhz for g in groups]),
        gpu_dcgm=np.repeat(np.array([g.dcgm for g in groups], dtype=bool), node_gpus),
        gpu_nvlink=np.repeat(
            np.array([g.topology == "nvlink" for g in groups], dtype=bool), node_gpus
        ),
    )
