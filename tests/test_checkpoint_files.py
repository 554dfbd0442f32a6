"""Checkpoint files are read as data: a file naming any callable a checkpoint does not
hold is refused before anything in it runs (a bucket others can write must not run code
in the processor), and a damaged file is one line naming it."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import polars as pl
import pytest
from test_simulate import SMALL

from gpuledger.pipeline import checkpoint
from gpuledger.pipeline.checkpoint import CheckpointError
from gpuledger.pipeline.config import ProcessorConfig
from gpuledger.pipeline.facts.telemetry_minutes import SampleKeys
from gpuledger.pipeline.processor import Processor
from gpuledger.pipeline.simulate import SimConfig, parse_cluster, simulate
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


def test_a_checkpoint_naming_another_callable_is_refused_before_it_runs(
        tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    path = tmp_path / "engine.checkpoint"
    path.write_bytes(pickle.dumps({"version": checkpoint.VERSION, "state": Runs(marker)}))
    with pytest.raises(CheckpointError, match=(
            rf"^{path}: not a readable gpuledger checkpoint \(refers to "
            r"(posix|os)\.system, which no gpuledger checkpoint holds\)$")):
        checkpoint.load(Processor(ProcessorConfig(), Warehouse(tmp_path / "wh")), path)
    assert not marker.exists()


def test_getattr_in_a_checkpoint_reaches_only_what_a_time_zone_needs(tmp_path: Path) -> None:
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


def test_a_damaged_checkpoint_of_an_earlier_release_is_one_line(tmp_path: Path) -> None:
    """A bare pickle (before the SHA-256) still reads; a damaged one is one error, also
    where Polars panics on a frame's damaged bytes."""
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
    path.write_bytes(pickle.dumps({"version": 1, "state": {}}))
    with pytest.raises(CheckpointError, match=rf"^{path}: checkpoint version 1 is not "
                       f"{checkpoint.VERSION}$"):
        checkpoint.load(Processor(ProcessorConfig(), Warehouse(tmp_path / "wh")), path)
