"""Shards: several processors, one per telemetry partition, write each fact once.

The shards run here in one process with the attempt exchange routed in memory; the
Kafka service (tests/test_kafka_scale_out.py) does the same over a real broker.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import polars as pl
import pytest
from fact_views import assert_same_facts, view
from polars.testing import assert_frame_equal
from test_simulate import SMALL

from gpuledger.pipeline.config import ProcessorConfig
from gpuledger.pipeline.processor import Processor
from gpuledger.pipeline.shard import Shard, partition_of
from gpuledger.pipeline.simulate import SimConfig, parse_cluster, simulate
from gpuledger.pipeline.warehouse import Warehouse

# Views this short run may leave empty.
SPARSE = ("blocked_minute", "preemptions", "candidates")


def _sim() -> SimConfig:
    return SimConfig(hours=3.0, seed=11, cluster=parse_cluster(SMALL))


def _single(root: Path, sim: SimConfig) -> None:
    proc = Processor(ProcessorConfig(), Warehouse(root))
    for batch in simulate(sim):
        proc.process(batch, validated=True)
    proc.flush()


def _sharded(root: Path, sim: SimConfig, partitions: int, catching_up: bool = False,
             config: ProcessorConfig | None = None) -> list[Processor]:
    """``partitions`` shards; telemetry split by Kafka's partitioner, the rest to all.
    ``catching_up``: every batch but the last is passed as one with more input waiting,
    as the Kafka service does while it is behind."""
    config = config or ProcessorConfig()
    shards = [Processor(config, Warehouse(root, Shard(p, partitions).suffix),
                        shard=Shard(p, partitions)) for p in range(partitions)]
    owner = shards[0]

    def route() -> None:
        for proc in shards[1:]:
            for parts in proc.outbox:
                owner.receive_parts(parts)
            proc.outbox.clear()

    batches = list(simulate(sim))
    for i, batch in enumerate(batches):
        tel = batch.get("telemetry")
        for proc in shards:
            own = dict(batch)
            if tel is not None:
                assert proc.shard is not None
                part = tel["node"].map_elements(lambda n: partition_of(n, partitions),
                                                return_dtype=pl.Int64)
                own["telemetry"] = tel.filter(part == proc.shard.partition)
            proc.process(own, validated=True,
                         behind=catching_up and i < len(batches) - 1)
        route()
    for proc in shards[1:]:
        proc.flush()
    route()
    owner.flush()
    Warehouse(root).publish_catalog()  # as the service does once for all its shards
    return shards


@pytest.fixture(scope="module")
def single(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("single")
    _single(root, _sim())
    return root


def test_partition_of_is_kafkas_default_partitioner() -> None:
    from kafka.partitioner.default import DefaultPartitioner

    class Cluster:
        def topics(self) -> set[str]:
            return {"t"}

        def partitions_for_topic(self, topic: str) -> set[int]:
            return set(range(12))

        def available_partitions_for_topic(self, topic: str) -> set[int]:
            return set(range(12))

    partitioner = DefaultPartitioner()
    for node in ("h100-00", "gpu-node-117", "l40s-3", "ñode-ü", "x"):
        key = node.encode()
        assert partition_of(node, 12) == partitioner.partition(
            "t", node, key, None, None, Cluster())


@pytest.mark.parametrize("partitions", [2, 3])
def test_shards_write_the_facts_of_one_processor(
    single: Path, tmp_path: Path, partitions: int,
) -> None:
    shards = _sharded(tmp_path, _sim(), partitions)
    owner = shards[0]
    assert owner.waiting.is_empty(), "every ended attempt got its parts"
    assert_same_facts(tmp_path, single, SPARSE)
    # each shard wrote GPU rows for its own nodes only, and every node has one writer
    written = {}
    for proc in shards:
        assert proc.shard is not None
        files = sorted((tmp_path / "facts" / "gpu_minute").glob(
            f"**/*-{proc.shard.suffix}.parquet"))
        nodes = set(pl.concat([pl.read_parquet(f) for f in files])["node"].unique())
        assert all(partition_of(n, partitions) == proc.shard.partition for n in nodes)
        written[proc.shard.partition] = nodes
    assert sum(len(n) for n in written.values()) == len(set().union(*written.values()))
    # cluster-wide facts come from the owner alone
    for table in ("frag_minute", "pending_minute", "job_attempts"):
        others = [f.name for f in (tmp_path / "facts" / table).glob("**/*.parquet")
                  if not f.name.startswith("_") and not f.name.endswith("-p000.parquet")]
        assert others == [], table


def test_catching_up_closes_in_hour_steps_with_the_same_facts(
    single: Path, tmp_path: Path,
) -> None:
    """Behind its input, a shard closes minutes in steps of an hour, not per batch."""
    windows = replace(ProcessorConfig().windows, catchup_close_minutes=60,
                      catchup_close_interval_s=3600.0)  # steps by event time only here
    config = replace(ProcessorConfig(), windows=windows)
    live = _sharded(tmp_path / "live", _sim(), 2, config=config)
    behind = _sharded(tmp_path / "behind", _sim(), 2, catching_up=True, config=config)
    assert_same_facts(tmp_path / "behind", single, SPARSE)
    assert_same_facts(tmp_path / "behind", tmp_path / "live", SPARSE)
    hours = _sim().hours
    for caught_up, caught_down in zip(live, behind, strict=True):
        assert not caught_down.close_pending
        steps, batches = caught_down.counters.close_passes, caught_up.counters.close_passes
        # 10-minute batches: a pass per batch live; one per hour behind (+ the flush)
        assert batches >= 6 * hours, batches
        assert steps <= hours + 2, (steps, batches)
        assert caught_down.counters.late_telemetry == 0


def test_a_part_sent_twice_counts_once(tmp_path: Path) -> None:
    """A shard that restarts from its checkpoint sends its parts again."""
    shards = _sharded(tmp_path / "a", _sim(), 2)
    owner = shards[0]
    before = view(tmp_path / "a", "job_attempts")
    # replay every attempt part of shard 1 as it would after a restart
    proc = Processor(ProcessorConfig(), Warehouse(tmp_path / "b", "p001"), shard=Shard(1, 2))
    for batch in simulate(_sim()):
        tel = batch.get("telemetry")
        own = dict(batch)
        if tel is not None:
            part = tel["node"].map_elements(lambda n: partition_of(n, 2), return_dtype=pl.Int64)
            own["telemetry"] = tel.filter(part == 1)
        proc.process(own, validated=True)
    proc.flush()
    for parts in proc.outbox:
        owner.receive_parts(parts)
    owner.flush()
    Warehouse(tmp_path / "a").publish_catalog()
    after = view(tmp_path / "a", "job_attempts")
    assert_frame_equal(after, before)
    assert owner.received.is_empty()
