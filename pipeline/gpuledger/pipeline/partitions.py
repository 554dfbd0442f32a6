"""Telemetry partitions: who owns which node, and who writes what.

Telemetry is keyed by node, so a node belongs to the partition its key hashes to —
Kafka's default partitioner, murmur2 of the UTF-8 node name, the one every Kafka client
uses by default (librdkafka: set ``partitioner=murmur2_random``).

A processor instance runs **one engine** over all the telemetry partitions it is
assigned (``processor.py``): the partition is a column of its state and of its output,
not an object. What stays per partition is *ownership*:

- the per-GPU facts of a partition's nodes (``gpu_minute``, ``job_gpu``, the roll-ups,
  late telemetry) go to files named after it (``…-pNNN.parquet``), so one instance or
  several, and any rebalance in between, write the same files;
- the cluster-wide facts (fragmentation, pending and blocked demand, preemptions, queue
  wait, per-attempt totals, snapshots) are written by the *owner*, the instance that holds
  partition 0, once, whatever the number of instances;
- per-attempt totals sum GPUs that may live in partitions of other instances: each
  instance sends its partitions' parts of an ended attempt to the owner through the
  *attempt exchange* (a Kafka topic); inside one instance no exchange is needed.

Without partitioning (the embedded bus, ``gpuledger ingest``, the demo) there is one
partition, 0, and the files carry no suffix.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import polars as pl
from kafka.partitioner.default import murmur2


def partition_of(node: str, partitions: int) -> int:
    """The partition Kafka's default partitioner gives the key ``node``."""
    return int((murmur2(node.encode("utf-8")) & 0x7FFFFFFF) % partitions)


@dataclass
class Partitioning:
    """The telemetry topic's partitions and the ones this engine holds now."""

    count: int
    owned: set[int] = field(default_factory=set)
    _cache: dict[str, int] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        bad = [p for p in self.owned if not 0 <= p < self.count]
        if bad:
            raise ValueError(f"partition {bad[0]} not in 0..{self.count - 1}")

    def of(self, node: str) -> int:
        found = self._cache.get(node)
        if found is None:
            found = self._cache[node] = partition_of(node, self.count)
        return found

    def column(self, nodes: pl.Expr | str = "node", frame: pl.DataFrame | None = None,
               names: list[str] | None = None) -> pl.Expr:
        """An expression giving each row's partition from its node name (each distinct
        name hashed once, in Python; then one columnar lookup)."""
        expr = pl.col(nodes) if isinstance(nodes, str) else nodes
        if names is None:
            assert frame is not None
            names = frame.select(expr.drop_nulls().unique()).to_series().to_list()
        mapping = {n: self.of(n) for n in names}
        return expr.replace_strict(mapping, default=None, return_dtype=pl.Int64)

    def suffix(self, partition: int) -> str:
        """File-name suffix of a partition's fact files."""
        return f"p{partition:03d}"

    @property
    def owner(self) -> bool:
        """This engine holds partition 0: it writes the cluster-wide facts."""
        return 0 in self.owned

    def partitions_of(self, nodes: str | None) -> set[int]:
        """The partitions holding the comma-separated ``nodes`` of an attempt."""
        if not nodes:
            return set()
        return {self.of(n) for n in nodes.split(",") if n}
