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


@pytest.mark.parametrize("cut", [0.5, 0.99])
def test_a_damaged_checkpoint_is_one_line_naming_the_file(tmp_path: Path, cut: float) -> None:
    proc = _engine(tmp_path)
    path = tmp_path / "engine.checkpoint"
    checkpoint.save(proc, {}, path)
    data = path.read_bytes()
    path.write_bytes(data[:int(len(data) * cut)])
    with pytest.raises(CheckpointError, match=rf"^{path}: not a readable gpuledger "
                       r"checkpoint \(.+\)$") as refused:
        checkpoint.load(Processor(ProcessorConfig(), Warehouse(tmp_path / "wh2")), path)
    assert "\n" not in str(refused.value)


def test_a_checkpoint_of_another_version_says_so(tmp_path: Path) -> None:
    path = tmp_path / "engine.checkpoint"
    path.write_bytes(pickle.dumps({"version": 1, "state": {}}))
    with pytest.raises(CheckpointError, match=rf"^{path}: checkpoint version 1 is not "
                       f"{checkpoint.VERSION}$"):
        checkpoint.load(Processor(ProcessorConfig(), Warehouse(tmp_path / "wh")), path)
