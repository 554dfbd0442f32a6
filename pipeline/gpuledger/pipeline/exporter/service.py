"""Follow a Kafka service's shards: each assigned telemetry partition runs a processor
of its own, created and dropped as partitions are assigned and revoked."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def follow_shards(service: Any, attach: Callable[[Any], Any],
                  detach: Callable[[Any], Any]) -> None:
    """Call ``attach(processor)`` for every shard ``service`` runs now or will run, and
    ``detach(processor)`` when it drops one (the service's shard hooks)."""
    for run in list(service.shards.values()):
        attach(run.processor)
    service.on_shard_added.append(attach)
    service.on_shard_dropped.append(detach)
