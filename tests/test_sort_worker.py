"""Compaction's sorts in a child process (``sort_worker.py``): the same objects as a sort
in the processor, the child's own peak measured, and a child killed mid-round puts off
only its day (the hours stay, readable; the next commit compacts them)."""

from __future__ import annotations

import logging
import os
import random
import signal
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import polars as pl
import pytest

from gpuledger.pipeline import external_sort
from gpuledger.pipeline.config import WarehouseOptions
from gpuledger.pipeline.sort_worker import SortWorker, SortWorkerDied
from gpuledger.pipeline.warehouse import Warehouse, published_files, read_table

DAY = datetime(2026, 1, 5, tzinfo=UTC)
KEYS = ["minute", "node", "gpu_index"]


def _hour(hour: int, rng: random.Random) -> pl.DataFrame:
    minutes = [DAY + timedelta(hours=hour, minutes=m) for m in range(60)]
    gpus = range(4)
    return pl.DataFrame({
        "minute": [m for m in minutes for _ in gpus], "node": "n1",
        "gpu_index": [g for _ in minutes for g in gpus], "attempt": 0,
        "job_id": [rng.choice(["j1", "j2", "j3", None]) for _ in minutes for _ in gpus],
        "value": [rng.randrange(1000) / 8 for _ in minutes for _ in gpus]})


def _fill(wh: Warehouse, tables: list[str]) -> None:
    rng = random.Random(5)
    for table in tables:
        for h in range(24):
            wh.write_part(table, DAY + timedelta(hours=h), _hour(h, rng), KEYS)


def _day_bytes(root: Path, table: str) -> bytes:
    day = f"facts/{table}/date=2026-01-05/{table}-2026-01-05.parquet"
    files = {k for k in published_files(root) if f"/{table}/" in k}
    assert files == {day}
    wh = Warehouse(root)
    data = wh.read_bytes(day, "")
    assert data is not None
    return data


def test_a_day_sorted_in_the_child_is_the_object_sorted_in_the_processor(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same hourly parts (5,760 rows, buckets of 1,000: the spill path) compacted in a
    child process and in the processor give the same bytes; the child is gone after."""
    in_child = Warehouse(tmp_path / "child", options=WarehouseOptions(
        compact_after_s=0, compact_bucket_rows=1000))
    in_place = Warehouse(tmp_path / "here", options=WarehouseOptions(
        compact_after_s=0, compact_bucket_rows=1000, compact_worker=False))
    _fill(in_child, ["gpu_minute"])
    _fill(in_place, ["gpu_minute"])
    in_place.commit(DAY + timedelta(days=1), wait=True)

    def not_here(*_args: object, **_kwargs: object) -> int:
        raise AssertionError("sorted in the processor, not in the child")

    monkeypatch.setattr(external_sort, "sort_into", not_here)  # the parent's copy only
    in_child.commit(DAY + timedelta(days=1), wait=True)
    assert 50_000 < in_child.compaction_peak_rss_kib < 4 << 20  # its own peak, measured
    assert in_place.compaction_peak_rss_kib == 0
    assert _day_bytes(tmp_path / "child", "gpu_minute") == \
        _day_bytes(tmp_path / "here", "gpu_minute")


def test_a_child_killed_mid_round_puts_off_its_day_and_loses_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    """Three tables' days in one round; the child is killed (SIGKILL, as the kernel's
    OOM killer does) as the second table's sort is handed to it: that day stays in hours,
    the third table is sorted in a new child, and the next commit compacts the second."""
    tables = ["gpu_minute", "gpu_span", "job_gpu"]  # compacted in this order
    wh = Warehouse(tmp_path / "wh", options=WarehouseOptions(compact_after_s=0,
                                                             compact_bucket_rows=1000))
    _fill(wh, tables)
    sort = SortWorker.sort_into
    calls: list[int] = []
    children: list[int] = []

    def killing(self: SortWorker, *args: object) -> int:
        calls.append(len(calls))
        if len(calls) == 2:
            assert self.pid is not None
            children.append(self.pid)
            os.kill(self.pid, signal.SIGKILL)
        return sort(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(SortWorker, "sort_into", killing)
    with caplog.at_level(logging.WARNING, logger="gpuledger.warehouse"):
        wh.commit(DAY + timedelta(days=1), wait=True)
    assert len(calls) == 3
    assert "compaction of facts/gpu_span/date=2026-01-05/gpu_span-2026-01-05.parquet put off" \
        in caplog.text
    assert "ended before its sort did (killed by signal 9" in caplog.text
    files = published_files(tmp_path / "wh")
    assert len({k for k in files if "/gpu_span/" in k}) == 24  # the hours stay
    assert {k for k in files if "/job_gpu/" in k} == \
        {"facts/job_gpu/date=2026-01-05/job_gpu-2026-01-05.parquet"}
    assert read_table(tmp_path / "wh", "gpu_span").height == 24 * 240
    assert not _running(children[0])
    monkeypatch.setattr(SortWorker, "sort_into", sort)
    wh.commit(DAY + timedelta(days=1), wait=True)
    for table in tables:
        assert _day_bytes(tmp_path / "wh", table) is not None
        assert read_table(tmp_path / "wh", table).height == 24 * 240


def test_a_dead_child_is_named_and_the_next_sort_starts_another(tmp_path: Path) -> None:
    """Killed between sorts, the child is reported at the next sort (not a hang, not the
    broken pipe its request met), and the sort after that runs in a new child."""
    part = tmp_path / "part.parquet"
    pl.DataFrame({"k": [3, 1, 2]}).write_parquet(part)
    with SortWorker() as worker:
        assert worker.pid is None  # started by the first sort
        assert worker.sort_into(tmp_path / "a.parquet", [part], ["k"], 10, 1000) == 3
        first = worker.pid
        assert first is not None
        os.kill(first, signal.SIGKILL)
        while _running(first):  # dead before the request: its write meets a broken pipe
            time.sleep(0.01)
        with pytest.raises(SortWorkerDied, match="killed by signal 9"):
            worker.sort_into(tmp_path / "b.parquet", [part], ["k"], 10, 1000)
        assert not _running(first) and worker.pid is None
        assert worker.sort_into(tmp_path / "c.parquet", [part], ["k"], 10, 1000) == 3
        second = worker.pid
        assert second not in (None, first)
    assert pl.read_parquet(tmp_path / "c.parquet")["k"].to_list() == [1, 2, 3]
    assert worker.pid is None and second is not None and not _running(second)


def test_the_childs_failures_come_back_as_in_the_processor(tmp_path: Path) -> None:
    """A spill folder that fails in the child is an ``OSError`` here (so the warehouse
    puts the day off, as it does in place); any other failure names its cause; the
    child serves the next sort either way."""
    part = tmp_path / "part.parquet"
    pl.DataFrame({"k": [3, 1, 2]}).write_parquet(part)
    with SortWorker() as worker:
        with pytest.raises(OSError):
            worker.sort_into(tmp_path / "missing" / "a.parquet", [part], ["k"], 10, 1000)
        with pytest.raises(RuntimeError, match=r"compaction.s sort failed: .*nope"):
            worker.sort_into(tmp_path / "b.parquet", [part], ["nope"], 10, 1000)
        first = worker.pid
        assert worker.sort_into(tmp_path / "c.parquet", [part], ["k"], 10, 1000) == 3
        assert worker.pid == first


def _running(pid: int) -> bool:
    """Whether ``pid`` is a live process (not a zombie left unreaped)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_child_that_cannot_start_is_named_with_its_exit_status(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An interpreter that exits at once (here ``false`` stands in for one that cannot
    import gpuledger) is reported with its exit status, not as a hang or a pipe error."""
    part = tmp_path / "part.parquet"
    pl.DataFrame({"k": [3, 1, 2]}).write_parquet(part)
    monkeypatch.setattr(sys, "executable", "/bin/false")
    with SortWorker() as worker, pytest.raises(SortWorkerDied, match="exit status 1; its error"):
        worker.sort_into(tmp_path / "a.parquet", [part], ["k"], 10, 1000)


def test_an_interpreter_that_is_not_there_is_named(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A missing interpreter is said as such (not as the spill folder's failure, which an
    ``OSError`` from the sort would be taken for)."""
    part = tmp_path / "part.parquet"
    pl.DataFrame({"k": [1]}).write_parquet(part)
    monkeypatch.setattr(sys, "executable", str(tmp_path / "no-python"))
    with SortWorker() as worker, pytest.raises(SortWorkerDied, match=r"did not start .*no-python"):
        worker.sort_into(tmp_path / "a.parquet", [part], ["k"], 10, 1000)


def test_a_round_cut_off_ends_its_child_at_once(tmp_path: Path) -> None:
    """An exception through the ``with`` block (a stop, Ctrl-C in the processor) ends
    the child by a signal, not by waiting for it to finish; the error goes on."""
    part = tmp_path / "part.parquet"
    pl.DataFrame({"k": [3, 1, 2]}).write_parquet(part)
    with pytest.raises(KeyboardInterrupt), SortWorker() as worker:
        worker.sort_into(tmp_path / "a.parquet", [part], ["k"], 10, 1000)
        child = worker.pid
        raise KeyboardInterrupt
    assert child is not None and not _running(child) and worker.pid is None
