"""Follow a Kafka service's shards: each assigned telemetry partition runs a processor
of its own, created and dropped as partitions are assigned and revoked."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def follow_shards(service: Any, attach: Callable[[Any], Any],
                  detach: Callable[[Any], Any]) -> None:
    """Call ``attach(processor)`` for every shard ``service`` runs now or will run, and
    ``detach(processor)`` when it drops one.

    The service's ``add_shard``/``drop_shard`` are wrapped on the instance (the seam the
    rebalance listener calls), so a shard's processor is followed from its first close.
    """
    for run in list(service.shards.values()):
        attach(run.processor)
    add, drop = service.add_shard, service.drop_shard

    def add_shard(partition: int) -> Any:
        run = add(partition)
        attach(run.processor)
        return run

    def drop_shard(partition: int) -> None:
        run = service.shards.get(partition)
        drop(partition)
        if run is not None:
            detach(run.processor)

    setattr(service, "add_shard", add_shard)  # noqa: B010 (an instance attribute on purpose)
    setattr(service, "drop_shard", drop_shard)  # noqa: B010
