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


def _hour(hour: int, rng: random.Random, day: datetime = DAY) -> pl.DataFrame:
    minutes = [day + timedelta(hours=hour, minutes=m) for m in range(60)]
    gpus = range(4)
    return pl.DataFrame({
        "minute": [m for m in minutes for _ in gpus], "node": "n1",
        "gpu_index": [g for _ in minutes for g in gpus], "attempt": 0,
        "job_id": [rng.choice(["j1", "j2", "j3", None]) for _ in minutes for _ in gpus],
        "value": [rng.randrange(1000) / 8 for _ in minutes for _ in gpus]})


def _fill(wh: Warehouse, tables: list[str], day: datetime = DAY) -> None:
    rng = random.Random(5)
    for table in tables:
        for h in range(24):
            wh.write_part(table, day + timedelta(hours=h), _hour(h, rng, day), KEYS)


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
    child process and in the processor give the same bytes."""
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


def test_the_child_serves_the_next_rounds_and_ends_when_idle_or_at_the_end(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rounds that follow closely (an import, a catch-up: a day a second) share one child
    (a child's start cost an import of the openb trace 17-23 % of its CPU); it ends at
    the first commit ``SORT_CHILD_IDLE_S`` after its round, at the end of the input, and
    when the warehouse closes."""
    from gpuledger.pipeline import warehouse

    wh = Warehouse(tmp_path / "wh", options=WarehouseOptions(compact_after_s=0,
                                                             compact_bucket_rows=1000))
    days = [DAY + timedelta(days=d) for d in range(4)]
    _fill(wh, ["gpu_minute"], days[0])
    wh.commit(days[1], wait=True)
    first = wh.compaction_child
    assert first is not None and _running(first)           # kept for the next round
    _fill(wh, ["gpu_minute"], days[1])
    wh.commit(days[2], wait=True)
    assert wh.compaction_child == first                    # the same child sorted day 2
    files = published_files(tmp_path / "wh")
    assert {k for k in files if "/gpu_minute/" in k} == {
        f"facts/gpu_minute/date={d:%Y-%m-%d}/gpu_minute-{d:%Y-%m-%d}.parquet"
        for d in days[:2]}
    os.kill(first, signal.SIGKILL)                         # killed while kept: the
    while _running(first):                                 # next round starts another,
        time.sleep(0.01)                                   # no day put off
    _fill(wh, ["gpu_minute"], days[2])
    wh.commit(days[3], wait=True)
    assert wh.compaction_child not in (None, first)
    first = wh.compaction_child
    assert first is not None
    monkeypatch.setattr(warehouse, "SORT_CHILD_IDLE_S", 0.0)
    wh.commit(days[3], wait=True)                          # idle long enough: it ends
    assert wh.compaction_child is None and not _running(first)
    _fill(wh, ["gpu_minute"], days[3])
    wh.commit(days[3] + timedelta(days=1), wait=True)
    second = wh.compaction_child
    assert second not in (None, first)
    wh.end_compaction()                                    # the input has ended
    assert wh.compaction_child is None and not _running(second)  # type: ignore[arg-type]
    days.append(days[3] + timedelta(days=1))
    _fill(wh, ["gpu_minute"], days[4])
    wh.commit(days[4] + timedelta(days=1), wait=True)
    third = wh.compaction_child
    wh.close()
    assert third is not None and not _running(third) and wh.compaction_child is None
    files = published_files(tmp_path / "wh")
    assert {k for k in files if "/gpu_minute/" in k} == {
        f"facts/gpu_minute/date={d:%Y-%m-%d}/gpu_minute-{d:%Y-%m-%d}.parquet" for d in days}
    assert read_table(tmp_path / "wh", "gpu_minute").height == 5 * 24 * 240


def test_a_processor_run_ends_the_kept_child_with_its_input(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run over two days compacts the first in a child, which is kept while the input
    goes on and ended by the flush: no child outlives the run."""
    from events import at, frames, inventory, series

    from gpuledger.pipeline.config import ProcessorConfig
    from gpuledger.pipeline.processor import Processor

    children: list[int] = []
    sort = SortWorker.sort_into

    def noting(self: SortWorker, *args: object) -> int:
        rows = sort(self, *args)  # type: ignore[arg-type]
        assert self.pid is not None
        children.append(self.pid)
        return rows

    monkeypatch.setattr(SortWorker, "sort_into", noting)
    proc = Processor(ProcessorConfig(), Warehouse(tmp_path / "wh"))
    for hour in range(27):
        proc.process(frames([inventory("n1", at(hour * 60), gpus=1),
                             *series("n1", 0, at(hour * 60), 60, every_s=60)]))
        if hour == 26:
            assert proc.warehouse.compaction_child in children  # kept while input comes
    proc.flush()
    assert children and proc.warehouse.compaction_child is None
    assert not any(_running(pid) for pid in set(children))
