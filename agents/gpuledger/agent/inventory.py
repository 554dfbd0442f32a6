"""The node's inventory record: built, labelled, and published when it changes.

Sources that read the GPUs themselves (NVML, the simulator) build the record; for the
dcgm-exporter source it is derived from a scrape's samples. The pool comes from
configuration (``inventory.pool``), else from a label (``inventory.pool_label``), else
the source's own (the simulator knows its nodes' pools), else ``default``. Labels are
the configured ones, those of ``inventory.labels_file`` (``key=value`` lines) and the
source's own.

:class:`InventoryPublisher` decides when to publish: at start, whenever the record
(apart from its ``time``) differs from the last one published, and every
``republish_s`` (the topic is compacted by node, so this only refreshes it).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from pathlib import Path
from typing import Any

from gpuledger.yaml_file import YamlFileError, read_text

log = logging.getLogger("gpuledger.agent.inventory")

DEFAULT_POOL = "default"


def read_labels_file(path: Path) -> dict[str, str]:
    """``key=value`` lines; blank lines and ``#`` comments skipped.

    A file that cannot be read (missing, a folder, not UTF-8) and a line without a label
    name are one warning each; the agent goes on with the labels it has."""
    labels: dict[str, str] = {}
    try:
        text = read_text(path)
    except YamlFileError as exc:    # missing, a folder, unreadable, not UTF-8
        log.warning("cannot read the labels file %s", exc)
        return labels
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.partition("=")
        if not key.strip():
            log.warning("labels file %s, line %d: no label name before '='; skipped",
                        path, number)
            continue
        labels[key.strip()] = value.strip()
    return labels


def node_labels(static: dict[str, str], labels_file: Path | None) -> dict[str, str]:
    labels = dict(static)
    if labels_file is not None:
        labels.update(read_labels_file(labels_file))
    return labels


def explicit_pool(configured: str | None, pool_label: str | None,
                  labels: dict[str, str]) -> str | None:
    """The configured pool, else the value of ``pool_label``; None when neither is set."""
    if configured:
        return configured
    if pool_label and labels.get(pool_label):
        return labels[pool_label]
    return None


def inventory_from_samples(node: str, pool: str, samples: list[dict[str, Any]],
                           stamp: str, schedulable: bool = True) -> dict[str, Any]:
    """An inventory record from one collection's telemetry (dcgm-exporter source)."""
    whole = [s for s in samples if not s.get("mig_instance")]
    indices = sorted({int(s["gpu_index"]) for s in samples})
    types = Counter(str(s.get("card_type")) for s in whole or samples)
    sizes = [float(s["mem_total_mib"]) for s in whole if s.get("mem_total_mib") is not None]
    unhealthy = sorted({int(s["gpu_index"]) for s in samples if s.get("healthy") is False})
    mig = sorted({f"{s['gpu_index']}:{s['mig_instance']}" for s in samples
                  if s.get("mig_instance")})
    health = ("down" if indices and len(unhealthy) == len(indices)
              else "degraded" if unhealthy else "ok")
    record: dict[str, Any] = {
        "v": 1, "type": "inventory", "time": stamp, "node": node, "pool": pool,
        "card_type": types.most_common(1)[0][0] if types else "unknown",
        "gpu_count": len(indices), "gpu_mem_mib": max(sizes, default=0.0),
        "topology": "nvlink" if any("nvlink_rx_bytes_s" in s for s in samples) else "pcie",
        "labels": {"gpuledger.mig": ",".join(mig)} if mig else {},
        "schedulable": schedulable, "health": health, "unhealthy_gpus": unhealthy,
    }
    return record


def with_labels(record: dict[str, Any], labels: dict[str, str], pool: str,
                schedulable: bool) -> dict[str, Any]:
    """The source's record with the configured pool, labels and schedulability."""
    out = dict(record)
    merged = dict(out.get("labels") or {})
    merged.update(labels)
    out["labels"] = merged
    out["pool"] = pool
    out["schedulable"] = bool(out.get("schedulable", True)) and schedulable
    return out


class InventoryPublisher:
    """Remembers the last published record and says when to publish again."""

    def __init__(self, republish_s: float = 3600.0) -> None:
        self.republish_s = republish_s
        self.last: dict[str, Any] | None = None
        self.last_at = float("-inf")
        self.published = 0

    @staticmethod
    def _content(record: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in record.items() if k != "time"}

    def due(self, record: dict[str, Any], now: float | None = None) -> bool:
        now = time.monotonic() if now is None else now
        if self.last is None or self._content(record) != self.last:
            return True
        return bool(self.republish_s) and now - self.last_at >= self.republish_s

    def forget(self) -> None:
        """The last record may not reach Kafka (a full spool dropped it): the next
        check publishes again, changed or not."""
        self.last = None

    def mark(self, record: dict[str, Any], now: float | None = None) -> None:
        self.last = self._content(record)
        self.last_at = time.monotonic() if now is None else now
        self.published += 1
