"""Checkpoint files are data: reading one calls nothing it names (a bucket others can write
must not run code in the processor), a file that is not one of ours or is damaged is one
line naming it, and an earlier release's pickles are read only when asked, through an
allow-list that refuses any callable a checkpoint does not hold before it runs."""

from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
import random
import struct
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

import events
import polars as pl
import pytest
from test_simulate import SMALL

from gpuledger.pipeline import checkpoint, state_file
from gpuledger.pipeline.checkpoint import CheckpointError
from gpuledger.pipeline.config import ProcessorConfig
from gpuledger.pipeline.facts.telemetry_minutes import SampleKeys
from gpuledger.pipeline.processor import Processor
from gpuledger.pipeline.simulate import SimConfig, parse_cluster, simulate
from gpuledger.pipeline.state.jobs import JobBook
from gpuledger.pipeline.warehouse import Warehouse


class Runs:
    """Unpickled by plain ``pickle``, it runs a shell command (it touches ``marker``)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return os.system, (f"touch {self.marker}",)


class Reaches:
    """Unpickled, it takes an attribute of an allowed type through ``getattr``."""

    def __reduce__(self) -> tuple[object, tuple[object, str]]:
        return getattr, (SampleKeys, "forget_before")


def _engine(tmp_path: Path) -> Processor:
    proc = Processor(ProcessorConfig(), Warehouse(tmp_path / "wh"))
    for batch in simulate(SimConfig(hours=0.5, seed=3, sample_interval_s=60,
                                    cluster=parse_cluster(SMALL))):
        proc.process(batch)
    return proc


def test_a_checkpoint_written_by_the_processor_reads_back(tmp_path: Path) -> None:
    proc = _engine(tmp_path)
    path = tmp_path / "engine.checkpoint"
    checkpoint.save(proc, {("t", 0): 41}, path)
    again = Processor(ProcessorConfig(), Warehouse(tmp_path / "wh2"))
    assert checkpoint.load(again, path) == {("t", 0): 41}
    assert again.closed_until == proc.closed_until
    assert again.jobs.jobs.keys() == proc.jobs.jobs.keys()
    assert pl.concat(again.tel_parts).sort(pl.all()).equals(
        pl.concat(proc.tel_parts).sort(pl.all()))


@pytest.fixture
def pickles(monkeypatch: pytest.MonkeyPatch) -> None:
    """An earlier release's pickled checkpoints are read (the operator asked)."""
    monkeypatch.setenv(checkpoint.PICKLES_ENV, "1")


def test_an_earlier_releases_pickle_is_not_read_unless_asked(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    path = tmp_path / "engine.checkpoint"
    for data in (pickle.dumps({"version": checkpoint.VERSION, "state": Runs(marker)}),
                 checkpoint.MAGIC + b"0" * 64 + b"\n" + pickle.dumps(Runs(marker))):
        path.write_bytes(data)
        with pytest.raises(CheckpointError, match=(
                rf"^{path}: a checkpoint of an earlier release \(a Python pickle\), not "
                rf"read by default; set {checkpoint.PICKLES_ENV}=1 to read it .+afresh$")):
            checkpoint.load(Processor(ProcessorConfig(), Warehouse(tmp_path / "wh")), path)
    assert not marker.exists()


@pytest.mark.usefixtures("pickles")
def test_a_pickle_naming_another_callable_is_refused_before_it_runs(
        tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    path = tmp_path / "engine.checkpoint"
    path.write_bytes(pickle.dumps({"version": checkpoint.VERSION, "state": Runs(marker)}))
    with pytest.raises(CheckpointError, match=(
            rf"^{path}: not a readable gpuledger checkpoint \(refers to "
            r"(posix|os)\.system, which no gpuledger checkpoint holds\)$")):
        checkpoint.load(Processor(ProcessorConfig(), Warehouse(tmp_path / "wh")), path)
    assert not marker.exists()


@pytest.mark.usefixtures("pickles")
def test_getattr_in_a_pickle_reaches_only_what_a_time_zone_needs(tmp_path: Path) -> None:
    path = tmp_path / "engine.checkpoint"
    path.write_bytes(pickle.dumps({"version": checkpoint.VERSION, "state": Reaches()}))
    with pytest.raises(CheckpointError, match=r"refers to SampleKeys\.forget_before"):
        checkpoint.load(Processor(ProcessorConfig(), Warehouse(tmp_path / "wh")), path)


@pytest.mark.parametrize("damage", ["cut in half", "cut at the end", "a byte changed"])
def test_a_damaged_checkpoint_is_one_line_naming_the_file(tmp_path: Path, damage: str
                                                          ) -> None:
    """Damage anywhere, even a byte inside a frame's numbers (which the pickle alone
    would load as other numbers), is found by the file's SHA-256 before it is read."""
    proc = _engine(tmp_path)
    path = tmp_path / "engine.checkpoint"
    checkpoint.save(proc, {}, path)
    data = bytearray(path.read_bytes())
    if damage == "a byte changed":
        data[len(data) * 2 // 3] ^= 0x01
    else:
        data = data[:int(len(data) * (0.5 if damage == "cut in half" else 0.99))]
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=rf"^{path}: damaged \(its SHA-256 does not "
                       r"match its content: .+\)$") as refused:
        checkpoint.load(Processor(ProcessorConfig(), Warehouse(tmp_path / "wh2")), path)
    assert "\n" not in str(refused.value)


@pytest.mark.usefixtures("pickles")
def test_a_damaged_checkpoint_of_an_earlier_release_is_one_line(tmp_path: Path) -> None:
    """A bare pickle (before the SHA-256) still reads when asked; a damaged one is one
    error, also where Polars panics on a frame's damaged bytes."""
    frame = pl.DataFrame({"a": list(range(50)), "b": [str(i) for i in range(50)]})
    bare = bytearray(pickle.dumps({"version": checkpoint.VERSION, "state": {"f": frame}}))
    path = tmp_path / "old.checkpoint"
    path.write_bytes(bytes(bare))
    assert checkpoint._read(path)["state"]["f"].equals(frame)  # type: ignore[index]
    failures = 0
    for at in range(len(bare) // 2, len(bare), 7):  # bytes in the frame's IPC stream
        damaged = bytearray(bare)
        damaged[at] ^= 0xFF
        path.write_bytes(bytes(damaged))
        try:
            checkpoint._read(path)
        except CheckpointError as exc:
            assert str(exc).startswith(f"{path}: ") and "\n" not in str(exc)
            failures += 1
    assert failures > 0


def test_a_checkpoint_of_another_version_says_so(tmp_path: Path) -> None:
    path = tmp_path / "engine.checkpoint"
    path.write_bytes(checkpoint._dump({"version": 1, "state": {}}))
    with pytest.raises(CheckpointError, match=rf"^{path}: checkpoint version 1 is not "
                       f"{checkpoint.VERSION}$"):
        checkpoint.load(Processor(ProcessorConfig(), Warehouse(tmp_path / "wh")), path)


def _state_file(doc: Any, frames: list[bytes] = ()) -> bytes:  # type: ignore[assignment]
    """A state file of the document ``doc`` and ``frames``, with a correct SHA-256: only
    what is in it can make it unreadable."""
    size = struct.Struct("<Q")
    raw = json.dumps(doc).encode()
    body = size.pack(len(raw)) + raw + b"".join(size.pack(len(f)) + f for f in frames)
    return state_file.MAGIC + hashlib.sha256(body).hexdigest().encode() + b"\n" + body


@pytest.mark.parametrize(("doc", "reason"), [
    ({"$": "obj", "class": "system", "v": {}}, "class 'system' is not one a state holds"),
    ({"$": "obj", "class": "posix.system", "v": {}}, "is not one a state holds"),
    ({"$": "call", "v": ["os.system", "touch x"]}, "unknown tag 'call'"),
    ({"$": "frame", "i": 0}, "frame 0 is not in the file"),
    ({"$": "ref", "n": 3}, "a reference to container 3 before it was written"),
    ({"$": "datetime", "v": "2026-01-01T00:00:00+05:00", "tz": None},
     "carries its zone apart"),
    ({"$": "datetime", "v": "yesterday", "tz": None}, "is not ISO 8601"),
    ({"$": "zone", "v": {"key": "../../etc/passwd"}}, "is not known"),
    ({"$": "dict", "v": [[[1], 2]]}, "a list as a key"),
    ({"$": "timedelta", "v": [10**10, 0, 0]}, "out of range"),
    ({"$": "float", "v": "1e999"}, "is not nan, inf or -inf"),
    ({"$": "obj", "class": "Counters", "v": [1, 2]}, "attributes of a Counters are not"),
])
def test_a_crafted_state_file_is_refused_and_calls_nothing(tmp_path: Path, doc: Any,
                                                          reason: str) -> None:
    path = tmp_path / "engine.checkpoint"
    path.write_bytes(_state_file({"version": checkpoint.VERSION, "state": doc}))
    with pytest.raises(CheckpointError) as refused:
        checkpoint._read(path)
    text = str(refused.value)
    assert text.startswith(f"{path}: not a readable gpuledger checkpoint (")
    assert reason in text and "\n" not in text


def test_a_frame_that_is_not_an_arrow_stream_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "engine.checkpoint"
    path.write_bytes(_state_file({"version": checkpoint.VERSION,
                                  "state": {"$": "frame", "i": 0}}, [b"PAR1 not arrow"]))
    with pytest.raises(CheckpointError, match=r"frame 0 is not an Arrow IPC stream"):
        checkpoint._read(path)


@pytest.mark.parametrize("compression", ["uncompressed", "lz4"])
def test_damaged_frames_of_a_crafted_state_file_are_refused_never_a_crash(
        tmp_path: Path, compression: Literal["uncompressed", "lz4"]) -> None:
    """A frame's bytes damaged under a correct SHA-256 (a crafted file): refused in one
    line, or read; Polars' IPC reader had aborted the process on some (an allocation of
    petabytes asked for by a damaged length), which no ``except`` catches. LZ4 frames
    are what state files hold now; uncompressed ones, what earlier versions wrote, are
    read as well."""
    n = 40
    frame = pl.DataFrame({"job_id": [f"job-{i}-with-a-long-name" for i in range(n)],
                          "x": list(range(n))})
    sink = io.BytesIO()
    frame.write_ipc_stream(sink, compression=compression)
    good = sink.getvalue()
    doc = {"version": checkpoint.VERSION, "state": {"$": "frame", "i": 0}}
    path = tmp_path / "engine.checkpoint"
    path.write_bytes(_state_file(doc, [good]))
    assert checkpoint._read(path)["state"].equals(frame)
    rng = random.Random(1)
    refused = 0
    for _ in range(400):
        damaged = bytearray(good)
        for _ in range(rng.randint(1, 8)):
            damaged[rng.randrange(len(damaged))] ^= 1 << rng.randrange(8)
        path.write_bytes(_state_file(doc, [bytes(damaged)]))
        try:
            checkpoint._read(path)["state"].to_dicts()
        except CheckpointError as exc:
            refused += 1
            assert "frame 0 is not an Arrow IPC stream" in str(exc)
    assert refused > 200


def test_junk_is_not_taken_for_a_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "engine.checkpoint"
    for junk in (b"", b"junk", b"{}"):
        path.write_bytes(junk)
        with pytest.raises(CheckpointError, match=rf"^{path}: not a readable gpuledger "
                           r"checkpoint \(not a gpuledger state file\)$"):
            checkpoint._read(path)


def test_shared_and_cyclic_containers_come_back_shared() -> None:
    """One object in two places is one object again (a job in two indexes of the book:
    changing it through one changes what the other sees), as with pickle."""
    shared: list[Any] = [1, 2]
    loop: dict[str, Any] = {"a": shared}
    loop["self"] = loop
    keys = SampleKeys()
    tree = {"x": shared, "y": [shared, (shared,)], "loop": loop, "k": [keys, keys],
            (1, "t"): {frozenset({1}), 2.5}, "$odd": float("nan")}
    back = state_file.load(state_file.dump(tree, checkpoint.CLASSES), checkpoint.CLASSES)
    assert back["x"] is back["y"][0] is back["y"][1][0] is back["loop"]["a"]
    assert back["loop"]["self"] is back["loop"]
    assert back["k"][0] is back["k"][1] and isinstance(back["k"][0], SampleKeys)
    assert back[(1, "t")] == {frozenset({1}), 2.5}
    assert back["$odd"] != back["$odd"]  # nan


def test_a_value_a_state_never_holds_is_a_programming_error() -> None:
    import numpy as np

    with pytest.raises(TypeError, match=r"cannot hold a numpy\.int64"):
        state_file.dump({"n": np.int64(3)}, checkpoint.CLASSES)



def test_global_parts_of_instances_gone_are_deleted(tmp_path: Path) -> None:
    """Without --instance-id every process writes a global part of its own (200-300 KB
    each, piling up): those not written for a day go, but never this instance's own,
    the newest, or a live instance's."""
    from gpuledger.pipeline.store import open_store

    store = open_store(tmp_path / "state")
    for name, age_h in (("global-gone1", 50), ("global-gone2", 30), ("global-me", 40),
                        ("global-live", 0.01), ("partition-p000", 90)):
        store.write(f"{name}.checkpoint", b"x")
        when = 1_000_000.0 - age_h * 3600
        os.utime(tmp_path / "state" / f"{name}.checkpoint", (when, when))
    keep = checkpoint.CheckpointStore(store, "me")
    assert sorted(keep.prune_globals(24 * 3600, 1_000_000.0)) == [
        "global-gone1.checkpoint", "global-gone2.checkpoint"]
    assert sorted(p.name for p in (tmp_path / "state").iterdir()) == [
        "global-live.checkpoint", "global-me.checkpoint", "partition-p000.checkpoint"]
    only = checkpoint.CheckpointStore(store, "other")
    os.utime(tmp_path / "state" / "global-live.checkpoint", (0, 0))
    # for another instance: the newest (40 h old) stays, the one now older goes
    assert only.prune_globals(24 * 3600, 1_000_000.0) == ["global-live.checkpoint"]
    assert (tmp_path / "state" / "global-me.checkpoint").exists()


def test_the_checkpoint_folder_holds_a_mark_a_global_part_or_a_section(tmp_path: Path) -> None:
    """`holds` (is there a checkpoint of the group, or one of the marks?) and the names
    every listing of the folder goes by: a global part, a partition's section; a
    temporary file, one in a subfolder or another name is neither."""
    from gpuledger.pipeline.store import open_store

    store = open_store(tmp_path / "state")
    folder = checkpoint.CheckpointStore(store, "me")
    assert not folder.holds("writing")
    for name in (".global-x.checkpoint.0123456789ab.tmp", "sub/global-x.checkpoint",
                 "sub/partition-p001.checkpoint", "partition-pxyz.checkpoint",
                 "global-x.checkpoint.old", "deployment.id"):
        store.write(name, b"x")
    assert not folder.holds("writing")
    assert folder.partitions() == set()
    store.write("writing", b"x")
    assert folder.holds("writing") and not folder.holds()
    store.write("partition-p002.checkpoint", b"x")
    assert folder.holds() and folder.partitions() == {2}
    store.delete("partition-p002.checkpoint")
    store.write("global-other.checkpoint", b"x")
    assert folder.holds() and folder.partitions() == set()


def _book() -> JobBook:
    """A job book with every kind of row: running, pending, ended, preempted and
    requeued attempts, a checkpoint, a shared GPU."""
    book = JobBook()
    job, at, alloc = events.job, events.at, events.alloc
    book.apply(events.frames([
        job("submitted", "a", at(0), team="nlp", gpus=2, priority=5, preemptible=True),
        job("started", "a", at(1), allocation=alloc("n1", 0, 1)),
        job("checkpointed", "a", at(3)),
        job("preempted", "a", at(5), reason="higher priority"),
        job("requeued", "a", at(6)),
        job("started", "a", at(8), allocation=alloc("n2", 3)),
        job("submitted", "b", at(2), team="cv", gpu_mem_mib=40960.0),
        job("started", "b", at(4), allocation=alloc("n1", 2, fraction=0.5)),
        job("finished", "b", at(7)),
        job("submitted", "c", at(9), team="cv", queue="low"),
    ])["job"])
    return book


def test_a_job_book_is_saved_as_frames_and_read_back_the_same() -> None:
    """The book's jobs and rows are saved as frames, not value by value (10,000 running
    jobs took 1.6 CPU-s and 14.6 MB a checkpoint so); what comes back is the book."""
    book = _book()
    assert book.preemptions and book.ended_attempts and book.closed_allocs
    data = state_file.dump({"book": book}, checkpoint.CLASSES)
    back = state_file.load(data, checkpoint.CLASSES)["book"]
    assert list(back.jobs) == list(book.jobs) and back.jobs == book.jobs
    for name in ("closed_allocs", "closed_pending", "ended_attempts", "preemptions",
                 "started_sizes", "taken", "counters", "_version"):
        assert getattr(back, name) == getattr(book, name), name
    for table in ("allocations", "pending", "attributes"):
        assert getattr(back, table)().equals(getattr(book, table)()), table
    assert b'"class":"Job"' not in data and b'"$":"datetime"' not in data   # frames


def test_a_job_book_of_an_earlier_release_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """Earlier releases saved the book value by value (its jobs as objects, its rows as
    dicts): such a state is read as it was."""
    book = _book()
    monkeypatch.setattr(JobBook, "__getstate__", lambda self: dict(self.__dict__))
    data = state_file.dump({"book": book}, checkpoint.CLASSES)
    monkeypatch.undo()
    assert b'"class":"Job"' in data
    back = state_file.load(data, checkpoint.CLASSES)["book"]
    assert back.jobs == book.jobs and back.ended_attempts == book.ended_attempts
    assert back.allocations().equals(book.allocations())


def test_a_state_files_frames_are_compressed_and_read_back_the_same() -> None:
    """Frames go in LZ4 (a Kafka service's checkpoint of 9,216 GPUs was 157 MB every
    10 s uncompressed, 90 % of it the open hour's minute rows): minute-like rows take a
    fraction of their uncompressed bytes, and come back equal."""
    n = 100_000
    frame = pl.DataFrame({"node": [f"node-{i % 576:04d}" for i in range(n)],
                          "minute": [datetime(2026, 1, 1, 10, i % 60) for i in range(n)],
                          "busy": [float(i % 7) / 7 for i in range(n)]})
    plain = io.BytesIO()
    frame.write_ipc_stream(plain, compression="uncompressed")
    data = state_file.dump({"rows": frame}, checkpoint.CLASSES)
    assert len(data) < len(plain.getvalue()) / 4, (len(data), len(plain.getvalue()))
    assert state_file.load(data, checkpoint.CLASSES)["rows"].equals(frame)
