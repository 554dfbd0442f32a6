"""Partitions: one engine per instance holds any set of telemetry partitions, and every
fact is written once whatever the split.

Several engines run here in one process, as instances would, with the attempt exchange
routed in memory; the Kafka service (tests/test_kafka_scale_out.py) does the same over a
real broker.
"""

from __future__ import annotations

import pickle
import shutil
from dataclasses import replace
from pathlib import Path

import polars as pl
import pytest
from fact_views import assert_same_facts, view
from polars.testing import assert_frame_equal
from test_simulate import SMALL

from gpuledger.pipeline import checkpoint, state_file
from gpuledger.pipeline.config import ProcessorConfig
from gpuledger.pipeline.partitions import Partitioning, partition_of
from gpuledger.pipeline.processor import Processor
from gpuledger.pipeline.simulate import SimConfig, parse_cluster, simulate
from gpuledger.pipeline.store import Store, open_store
from gpuledger.pipeline.warehouse import Warehouse, published_files

# Views this short run may leave empty.
SPARSE = ("blocked_minute", "preemptions", "candidates")


def _sim() -> SimConfig:
    return SimConfig(hours=3.0, seed=11, cluster=parse_cluster(SMALL))


def _single(root: Path, sim: SimConfig) -> None:
    proc = Processor(ProcessorConfig(), Warehouse(root))
    for batch in simulate(sim):
        proc.process(batch, validated=True)
    proc.flush()


def _engine(root: Path, count: int, held: set[int],
            config: ProcessorConfig | None = None) -> Processor:
    return Processor(config or ProcessorConfig(), Warehouse(root), telemetry_clock=True,
                     partitioning=Partitioning(count, set(held)))


def _route(engines: list[Processor]) -> None:
    owner = next(e for e in engines if e.owner)
    for engine in engines:
        if engine is not owner:
            for parts in engine.outbox:
                owner.receive_parts(parts)
            engine.outbox.clear()


def _feed(engine: Processor, batch: dict[str, pl.DataFrame], count: int,
          behind: bool = False) -> None:
    """The batch as the instance reads it: its partitions' telemetry, the rest in full."""
    own = dict(batch)
    tel = batch.get("telemetry")
    if tel is not None:
        part = tel["node"].map_elements(lambda n: partition_of(n, count), return_dtype=pl.Int64)
        own["telemetry"] = tel.filter(part.is_in(list(engine.held)))
    engine.process(own, validated=True, behind=behind)


def _reread(engine: Processor, batches: list[dict[str, pl.DataFrame]], i: int, count: int,
            partition: int) -> None:
    """Batch ``i``'s telemetry of ``partition`` alone, read again after a handover; as
    the Kafka service does, the partition's unread data (the next batch) holds the
    watermark."""
    tel = batches[i]["telemetry"]
    part = tel["node"].map_elements(lambda n: partition_of(n, count), return_dtype=pl.Int64)
    engine.process({"telemetry": tel.filter(part == partition)}, validated=True,
                   event_time_limit=batches[i + 1]["telemetry"]["time"].min())


def _instances(root: Path, sim: SimConfig, count: int, split: list[set[int]],
               catching_up: bool = False,
               config: ProcessorConfig | None = None) -> list[Processor]:
    """Engines holding the partitions of ``split``; telemetry split by Kafka's
    partitioner, the rest to all. ``catching_up``: every batch but the last is passed as
    one with more input waiting, as the Kafka service does while it is behind."""
    engines = [_engine(root, count, held, config) for held in split]
    batches = list(simulate(sim))
    for i, batch in enumerate(batches):
        for engine in engines:
            _feed(engine, batch, count, catching_up and i < len(batches) - 1)
        _route(engines)
    owner = next(e for e in engines if e.owner)
    for engine in engines:
        if engine is not owner:
            engine.flush()
    _route(engines)
    owner.flush()
    return engines


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


def _files(root: Path, table: str) -> list[str]:
    """The table's published files by logical name (``generations.py``)."""
    return sorted(name for name in published_files(root)
                  if name.startswith(f"facts/{table}/"))


@pytest.mark.parametrize("split", [[{0, 1, 2}], [{0}, {1, 2}], [{0, 2}, {1}], [{0}, {1}, {2}]])
def test_any_split_of_partitions_writes_the_facts_of_one_processor(
    single: Path, tmp_path: Path, split: list[set[int]],
) -> None:
    engines = _instances(tmp_path, _sim(), 3, split)
    owner = next(e for e in engines if e.owner)
    assert owner.waiting.is_empty(), "every ended attempt got its parts"
    assert_same_facts(tmp_path, single, SPARSE)
    # each partition's GPU rows are in its own files, whoever held it
    published = published_files(tmp_path)
    for name in _files(tmp_path, "gpu_minute"):
        p = int(name.removesuffix(".parquet").rsplit("-p", 1)[1])
        nodes = set(pl.read_parquet(tmp_path / published[name])["node"].unique())
        assert nodes and all(partition_of(n, 3) == p for n in nodes)
    # cluster-wide facts come from the owner alone
    for table in ("frag_minute", "pending_minute", "job_attempts"):
        others = [f for f in _files(tmp_path, table) if not f.endswith("-p000.parquet")]
        assert others == [], table
    # one engine over every partition: the attempt exchange is not used
    assert all(not e.outbox for e in engines)


def test_one_instance_or_three_write_the_same_files_byte_for_byte(tmp_path: Path) -> None:
    _instances(tmp_path / "one", _sim(), 3, [{0, 1, 2}])
    _instances(tmp_path / "three", _sim(), 3, [{0}, {1}, {2}])
    for table in ("gpu_minute", "gpu_hourly", "job_gpu", "job_attempts", "frag_minute"):
        ones, threes = _files(tmp_path / "one", table), _files(tmp_path / "three", table)
        assert ones == threes and ones, table
        one, three = published_files(tmp_path / "one"), published_files(tmp_path / "three")
        for name in ones:
            assert one[name] == three[name], name  # objects are named after their bytes
            assert (tmp_path / "one" / one[name]).read_bytes() == \
                (tmp_path / "three" / three[name]).read_bytes(), name


def test_catching_up_closes_in_hour_steps_with_the_same_facts(
    single: Path, tmp_path: Path,
) -> None:
    """Behind its input, an engine closes minutes in steps of an hour, not per batch."""
    windows = replace(ProcessorConfig().windows, catchup_close_minutes=60,
                      catchup_close_interval_s=3600.0)  # steps by event time only here
    config = replace(ProcessorConfig(), windows=windows)
    live = _instances(tmp_path / "live", _sim(), 2, [{0}, {1}], config=config)
    behind = _instances(tmp_path / "behind", _sim(), 2, [{0}, {1}], catching_up=True,
                        config=config)
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
    """An instance that restarts from its checkpoint sends its parts again."""
    engines = _instances(tmp_path / "a", _sim(), 2, [{0}, {1}])
    owner = engines[0]
    before = view(tmp_path / "a", "job_attempts")
    # replay every attempt part of partition 1 as it would after a restart
    again = _engine(tmp_path / "b", 2, {1})
    for batch in simulate(_sim()):
        _feed(again, batch, 2)
    again.flush()
    for parts in again.outbox:
        owner.receive_parts(parts)
    owner.flush()
    after = view(tmp_path / "a", "job_attempts")
    assert_frame_equal(after, before)
    assert owner.received.is_empty()


@pytest.mark.parametrize("lag_batches", [0, 3, 8])
def test_a_partition_handed_over_mid_run_gives_the_same_facts(
    single: Path, tmp_path: Path, lag_batches: int,
) -> None:
    """Partition 1 moves from instance B to instance A (which holds 0) mid-run, with its
    section (``checkpoint.py``); B may be behind A by ``lag_batches`` batches (B read less
    telemetry of partition 1 than A read of partition 0) when it lets go: 8 batches are
    80 minutes, more than the hour of history A's books keep (``handover_retention_s``),
    so the history handed over with the partition is what closes it right."""
    count = 2
    a, b = _engine(tmp_path, count, {0}), _engine(tmp_path, count, {1})
    batches = list(simulate(_sim()))
    cut = len(batches) // 2
    for i, batch in enumerate(batches[:cut]):
        _feed(a, batch, count)
        if i < cut - lag_batches:
            _feed(b, batch, count)
        else:  # B reads the global topics, not its partition's telemetry, for a while
            _feed(b, {k: v for k, v in batch.items() if k != "telemetry"}, count)
        _route([a, b])
    # B checkpoints partition 1 and lets it go; A takes it over
    sec = checkpoint.section(b, 1, {("telemetry", 1): 1})
    checkpoint.drop_partition(b, 1)
    for parts in b.outbox:
        a.receive_parts(parts)
    b.outbox.clear()
    checkpoint.merge_section(a, sec)
    assert a.held == {0, 1}
    # A re-reads partition 1 from B's position: the batches B had not read yet; as the
    # Kafka service does, the partition's unread data holds the watermark
    for i in range(cut - lag_batches, cut):
        _reread(a, batches, i, count, 1)
    for batch in batches[cut:]:
        _feed(a, batch, count)
    a.flush()
    assert a.counters.late_telemetry == 0
    assert a.waiting.is_empty()
    assert_same_facts(tmp_path, single, SPARSE)


@pytest.mark.parametrize("unread_first", [True, False])
def test_a_partition_nobody_read_taken_over_beside_a_read_one_loses_nothing(
    single: Path, tmp_path: Path, unread_first: bool,
) -> None:
    """An instance held both partitions for a moment and read nothing (a rebalance storm
    kept it from its share); the other read partition 0 for half the run. A third takes
    both sections over: partition 1's, with nothing closed, must start where the fleet
    started, not at partition 0's closed point. It was every sample of partition 1 late
    (taken after partition 0), or partition 1 never closed (taken before it): half the
    fleet's ``gpu_minute`` rows missing (tests/test_kafka_scale_out.py failed so once)."""
    count = 2
    batches = list(simulate(_sim()))
    cut = len(batches) // 2
    idle = _engine(tmp_path, count, {0, 1})             # held both, read nothing
    unread = checkpoint.section(idle, 1, {})
    assert unread.closed is None
    a = _engine(tmp_path, count, {0})
    for batch in batches[:cut]:
        _feed(a, batch, count)
    a.warehouse.sync()   # A stops here: its writes land before another takes over
    read = checkpoint.section(a, 0, {})
    assert read.closed is not None and a.started is not None and read.closed > a.started
    c = _engine(tmp_path, count, set())
    for batch in batches[:cut]:  # the global topics up to the sections' offsets
        c.process({k: v for k, v in batch.items() if k != "telemetry"}, validated=True)
    assert c.started is None  # no telemetry read: where the fleet started is not known
    for sec in ([unread, read] if unread_first else [read, unread]):
        checkpoint.merge_section(c, sec)
    assert c.held == {0, 1} and c.started == a.started
    for i in range(cut):  # partition 1 from its start
        _reread(c, batches, i, count, 1)
    for batch in batches[cut:]:
        _feed(c, batch, count)
    c.flush()
    assert c.counters.late_telemetry == 0
    assert_same_facts(tmp_path, single, SPARSE)


def test_a_checkpoint_torn_between_its_global_part_and_a_section_loses_nothing(
    single: Path, tmp_path: Path,
) -> None:
    """A kill between writing the global part (the books) and the partitions' sections
    leaves the books newer than the sections. Which ended attempts each partition (and
    the owner) has taken is the sections' to say: attempts taken after the sections were
    written are taken again, not lost. The warehouse is as it was at the sections."""
    count = 2
    first = _engine(tmp_path / "first", count, {0, 1})
    batches = list(simulate(_sim()))
    cut, later = len(batches) // 2, len(batches) // 2 + 4
    for batch in batches[:cut]:
        _feed(first, batch, count)
    first.warehouse.sync()
    sections = [checkpoint.section(first, p, {}) for p in (0, 1)]
    sections = [checkpoint.Section(s.partition, s.closed, s.offsets,
                                   pickle.loads(pickle.dumps(s.state))) for s in sections]
    shutil.copytree(tmp_path / "first", tmp_path / "again")
    for batch in batches[cut:later]:
        _feed(first, batch, count)
    assert first.counters.close_passes > 0
    books = pickle.loads(pickle.dumps(checkpoint.global_state(first)))
    # the restart: the books of the later point, the sections of the earlier one
    again = _engine(tmp_path / "again", count, set())
    checkpoint.load_global(again, books)
    for sec in sections:
        checkpoint.merge_section(again, sec)
    for batch in batches[cut:later]:  # telemetry from the sections' offsets
        _feed(again, {"telemetry": batch["telemetry"]}, count)
    for batch in batches[later:]:
        _feed(again, batch, count)
    again.flush()
    assert again.waiting.is_empty()
    assert_same_facts(tmp_path / "again", single, SPARSE)


def test_a_section_taken_over_brings_its_newest_sample_to_the_end_of_input(
        tmp_path: Path) -> None:
    """An instance that read none of a partition takes it over, with its section, from
    one that read it all: at the end of input it closes the partition up to the
    section's newest sample. It closed only up to what it had read itself, and left the
    last minute of the partition open (a batch run of two instances, a probe)."""
    count = 2
    first = _engine(tmp_path / "first", count, {0, 1})
    for batch in simulate(SimConfig(hours=0.5, seed=11, cluster=parse_cluster(SMALL))):
        _feed(first, batch, count)
    sec = checkpoint.section(first, 1, {})
    newest = max(sec.state["node_time"].values())
    other = _engine(tmp_path / "other", count, {0})
    assert other.max_telemetry_time is None
    checkpoint.merge_section(other, sec)
    assert other.max_telemetry_time == newest


def test_the_owner_taken_over_reads_the_parts_its_own_partitions_sent(
        single: Path, tmp_path: Path) -> None:
    """Instance A holds partition 1 and sends its attempt parts through the topic to the
    owner B (partition 0). B dies; its last section of partition 0 was written before it
    had read A's latest parts. A takes partition 0 over from that section and reads the
    parts topic from the section's position: the parts there that its own partition 1
    sent while B owned are taken. They were dropped as "our own, taken here" (a probe
    killing three instances at random: attempts never written)."""
    count = 2
    a, b = _engine(tmp_path, count, {1}), _engine(tmp_path, count, {0})
    topic: list[pl.DataFrame] = []   # the attempt-parts topic, in order
    batches = list(simulate(_sim()))
    saved_at, cut = len(batches) // 3, 2 * len(batches) // 3
    sec = None
    position = read = 0
    for i, batch in enumerate(batches[:cut]):
        if i == saved_at:   # B's last section of partition 0, and its place in the topic
            b.warehouse.sync()
            sec = checkpoint.Section(0, b.part_closed.get(0), {}, pickle.loads(pickle.dumps(
                checkpoint.section(b, 0, {}).state)))
            position = len(topic)
        _feed(a, batch, count)
        _feed(b, batch, count)
        topic.extend(a.outbox)
        a.outbox.clear()
        for parts in topic[read:]:
            b.receive_parts(parts)
        read = len(topic)
    assert sec is not None and position < len(topic)
    assert any(not p.filter(pl.col("kind") == "ended").is_empty() for p in topic[position:])
    # B is gone (its last writes landed: a background publish of B's racing A's was a
    # "published by another writer" failure on a loaded machine); A takes partition 0
    # from B's section
    b.warehouse.sync()
    checkpoint.merge_section(a, sec)
    assert a.owner and a.held == {0, 1}
    for parts in topic[position:]:      # the parts topic from the section's position
        a.receive_parts(parts)
    for i in range(saved_at, cut):      # partition 0's telemetry from the section's offset
        _reread(a, batches, i, count, 0)
    for batch in batches[cut:]:
        _feed(a, batch, count)
    a.flush()
    assert a.waiting.is_empty()
    assert_same_facts(tmp_path, single, SPARSE)


def _frames_files(state: Store) -> dict[str, int]:
    return {e.path: e.size for e in state.list("") if e.path.endswith(".frames")}


def test_incremental_checkpoints_write_each_open_hours_frame_once_and_restart_exactly(
        single: Path, tmp_path: Path) -> None:
    """The Kafka service's checkpoints (``CheckpointStore(incremental=True)``) name the
    frames of the open hours by file: a save writes only the frames new since the last
    one, a save with nothing new writes no frames file, a restart from them gives the
    facts of one uninterrupted run, and the files of closed hours are swept."""
    count = 2
    state = open_store(tmp_path / "state")
    store = checkpoint.CheckpointStore(state, "a", incremental=True)
    first = _engine(tmp_path / "first", count, {0, 1})
    batches = list(simulate(_sim()))
    cut = len(batches) - 3   # past 02:00: the files of 00:00 are swept
    written: dict[str, int] = {}
    for i, batch in enumerate(batches[:cut]):
        _feed(first, batch, count)
        store.save(first, {}, {p: {("telemetry", p): i} for p in (0, 1)})
        now = _frames_files(state)
        new = now.keys() - written.keys()
        assert len(new) <= count, "more than one frames file per partition and save"
        written.update(now)
    # a save with nothing new since the last writes no frames file, and its sections hold
    # no frame of the open hours, only where each is
    store.save(first, {}, {p: {("telemetry", p): cut} for p in (0, 1)})
    assert _frames_files(state).keys() <= written.keys()
    inline = open_store(tmp_path / "inline")
    checkpoint.CheckpointStore(inline, "a").save(first, {}, {p: {} for p in (0, 1)})
    for p in (0, 1):
        path = f"partition-p{p:03d}.checkpoint"
        small, whole = state.size(path), inline.size(path)
        assert small is not None and whole is not None and small < whole
        raw = state_file.load(state.read(path) or b"", checkpoint.CLASSES)["section"].state
        assert "hour_parts" not in raw and "rollup_parts" not in raw
        assert raw["frames_at"]["hour_parts"] and raw["frames_at"]["rollup_parts"]
    # the files of hours closed over an hour ago are gone; what the sections name is there
    closed = min(first.part_closed.values())
    left = _frames_files(state)
    assert left and len(left) < len(written)
    for path in left:
        newest = checkpoint._frames_hour(path)
        assert newest is not None and newest + checkpoint.SWEEP_AFTER > closed
    # a restart: a new store and engine from the files, the warehouse as it was
    first.warehouse.sync()
    shutil.copytree(tmp_path / "first", tmp_path / "again")
    again = _engine(tmp_path / "again", count, set())
    reader = checkpoint.CheckpointStore(open_store(tmp_path / "state"), "a", incremental=True)
    assert reader.load_global(again) is not None
    for p in (0, 1):
        sec = reader.read_partition(p)
        assert sec is not None
        for name, theirs in (
                ("hour_parts", {k[:2]: v for k, v in first.hour_parts.items() if k[2] == p}),
                ("rollup_parts", {k[0]: v for k, v in first.rollup_parts.items()
                                  if k[1] == p})):
            assert sec.state[name].keys() == theirs.keys()
            for key, frames in sec.state[name].items():
                assert_frame_equal(pl.concat(frames), pl.concat(theirs[key]))
        checkpoint.merge_section(again, sec)
    # its first save writes no frame the files already hold
    reader.save(again, {}, {p: {("telemetry", p): cut} for p in (0, 1)})
    assert _frames_files(state).keys() == left.keys()
    for batch in batches[cut:]:
        _feed(again, batch, count)
    again.flush()
    assert again.waiting.is_empty()
    assert_same_facts(tmp_path / "again", single, SPARSE)


def test_a_missing_frames_file_is_one_error_naming_it(tmp_path: Path) -> None:
    count = 2
    state = open_store(tmp_path / "state")
    store = checkpoint.CheckpointStore(state, "a", incremental=True)
    engine = _engine(tmp_path / "wh", count, {0, 1})
    for batch in list(simulate(_sim()))[:4]:
        _feed(engine, batch, count)
    store.save(engine, {}, {p: {} for p in (0, 1)})
    files = sorted(p for p in _frames_files(state) if p.startswith("partition-p001/"))
    assert files
    state.delete(files[0])
    reader = checkpoint.CheckpointStore(state, "b", incremental=True)
    assert reader.read_partition(0) is not None
    with pytest.raises(checkpoint.CheckpointError, match=r"partition-p001\.checkpoint: names "
                       r"the frames file .*" + files[0].replace(".", r"\.") + ", which is missing"):
        reader.read_partition(1)
