"""Shards: how several processors split the work and still write each fact once.

A processor *shard* owns one telemetry partition. Telemetry is keyed by node, so a node
belongs to the partition its key hashes to — Kafka's default partitioner, murmur2 of the
UTF-8 node name, the one every Kafka client uses by default (librdkafka: set
``partitioner=murmur2_random``). A shard writes the per-GPU facts (``gpu_minute``,
``job_gpu``, the roll-ups) of its own nodes only, so the union of the shards' files is
exactly what one processor would write. Each shard reads scheduler events and inventory
in full; the facts that need no telemetry and are cluster-wide (fragmentation, pending
and blocked demand, preemptions, back-fill candidates) are written by the *owner*, the
shard of partition 0.

Per-attempt totals (``job_attempts``, ``recommendations``) sum GPUs that may live on
several shards. Each shard hands its part of an ended attempt to the owner through the
*attempt exchange* (a Kafka topic); the owner writes the attempt's facts once every
shard that held one of its GPUs has reported (``Processor.receive_parts``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import polars as pl
from kafka.partitioner.default import murmur2


def partition_of(node: str, partitions: int) -> int:
    """The partition Kafka's default partitioner gives the key ``node``."""
    return int((murmur2(node.encode("utf-8")) & 0x7FFFFFFF) % partitions)


@dataclass
class Shard:
    """One telemetry partition's share of the work."""

    partition: int
    partitions: int
    _cache: dict[str, int] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not 0 <= self.partition < self.partitions:
            raise ValueError(f"partition {self.partition} not in 0..{self.partitions - 1}")

    @property
    def owner(self) -> bool:
        """Writes the cluster-wide facts and the per-attempt totals."""
        return self.partition == 0

    @property
    def exchanges(self) -> bool:
        """Attempt totals need parts from other shards."""
        return self.partitions > 1

    @property
    def suffix(self) -> str:
        """File-name suffix of this shard's fact files."""
        return f"p{self.partition:03d}"

    def of(self, node: str) -> int:
        found = self._cache.get(node)
        if found is None:
            found = self._cache[node] = partition_of(node, self.partitions)
        return found

    def mine(self, frame: pl.DataFrame, column: str = "node") -> pl.DataFrame:
        """The rows of ``frame`` whose ``column`` names a node of this shard (each name
        is hashed once; then one columnar membership filter)."""
        if frame.is_empty():
            return frame
        names = frame[column].drop_nulls().unique().to_list()
        own = [n for n in names if self.of(n) == self.partition]
        if len(own) == len(names) and frame[column].null_count() == 0:
            return frame
        return frame.filter(pl.col(column).is_in(own))

    def shards_of(self, nodes: str | None) -> set[int]:
        """The shards holding the comma-separated ``nodes`` of an attempt."""
        if not nodes:
            return set()
        return {self.of(n) for n in nodes.split(",") if n}
