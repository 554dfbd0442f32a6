"""``gpuledger import slurm-sacct`` on what a real slurmdbd prints.

A real Slurm 22.05 with slurmdbd on MariaDB (``slurm_cluster.py``, ``accounting``) runs
jobs for two minutes: a job that runs across both, jobs waiting for GPUs (one across the
cut), a requeue, a job held from its submission and released in the second minute. As a
daily cron would, the test exports each minute's window with ``sacct --starttime/--endtime``
just after it ends, and the two minutes as one export at the end. Then:

- the windows imported one by one (``--until`` each window's end) give the facts of the
  one export, view by view, but the held job's wait in the first minute (sacct prints a
  job only once it is eligible to run: the first window does not have it);
- an export that starts after the history's end (a window missing) is refused, naming
  the jobs that ran at the history's end and ended in the gap;
- the parser takes real sacct lines: step lines skipped, GPUs from ``AllocTRES``,
  ``--duplicates`` attempts, a job name with a ``|`` and a line break.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import polars as pl
import pytest
from fact_views import VIEWS, views
from polars.testing import assert_frame_equal
from slurm_cluster import SlurmCluster, missing_tools

from gpuledger.cli.main import main

if missing_tools(accounting=True) or os.geteuid() != 0:
    if os.environ.get("CI"):
        raise RuntimeError(f"the slurmdbd tests need {missing_tools(accounting=True)} and "
                           "root (scripts/setup.d/20-slurm.sh)")
    pytest.skip(f"no slurmdbd here ({', '.join(missing_tools(accounting=True)) or 'not root'})",
                allow_module_level=True)

FORMAT = ("JobID,JobIDRaw,JobName,Account,User,Partition,QOS,Priority,Submit,Start,End,"
          "State,ExitCode,AllocTRES,ReqTRES,NodeList")


@dataclass
class Run:
    folder: Path
    t0: datetime
    ids: dict[str, str]

    def at(self, seconds: float) -> str:
        return (self.t0 + timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")


def _export(cluster: SlurmCluster, path: Path, since: datetime, until: datetime) -> None:
    """``TZ=UTC sacct ...`` of the window ``[since, until)``, as docs/import.md has it."""
    stamp = "%Y-%m-%dT%H:%M:%S"
    done = subprocess.run(
        ["sacct", "--allusers", "--duplicates", "--parsable2", "--starttime",
         since.strftime(stamp), "--endtime", until.strftime(stamp), "--format", FORMAT],
        env={**cluster.env(), "TZ": "UTC"}, capture_output=True, text=True, check=True,
        timeout=30)
    path.write_text(done.stdout)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    folder = tmp_path_factory.mktemp("slurmdbd")
    cluster = SlurmCluster(folder / "cluster", accounting=True)
    cluster.start()
    try:
        # two whole minutes from the next one (--until is read down to its minute)
        t0 = (datetime.now(UTC) + timedelta(seconds=5)).replace(second=0, microsecond=0) \
            + timedelta(minutes=1)
        ids: dict[str, str] = {}

        def submit(name: str, gpus: int, seconds: int, *extra: str,
                   as_name: str | None = None) -> Callable[[], None]:
            return lambda: ids.__setitem__(name, cluster.sbatch(gpus, seconds,
                                                                as_name or name, *extra))

        def scontrol(verb: str, name: str) -> Callable[[], None]:
            def step() -> None:
                cluster.run("scontrol", verb, ids[name])
            return step

        def export(name: str, since: float, until: float) -> Callable[[], None]:
            return lambda: _export(cluster, folder / name, t0 + timedelta(seconds=since),
                                   t0 + timedelta(seconds=until))

        # The scheduler is FIFO (sched/builtin): a job waiting at the head of the queue
        # holds back the ones behind it
        steps: list[tuple[float, Callable[[], None]]] = [
            (5, submit("across", 2, 100)),        # runs across the first cut, ends at 105 s
            (8, submit("requeued", 1, 50)),       # requeued at 30 s, runs again at 40 s
            (10, submit("short", 4, 30, as_name="short|as\nany name")),  # sacct prints it raw
            (12, submit("waits", 4, 40)),         # waits for `short`'s GPUs (40-80 s)
            (18, submit("held", 1, 10, "-H")),    # held from its submission to 80 s
            (30, scontrol("requeue", "requeued")),
            (50, submit("queued", 4, 20)),        # waits across the cut (80-100 s)
            (63, export("first.txt", 0, 60)),
            (80, scontrol("release", "held")),
            (123, export("second.txt", 60, 120)),
            (123, export("late.txt", 110, 120)),  # a window starting after the first's end
            (123, export("whole.txt", 0, 120)),
        ]
        for offset, step in steps:
            while datetime.now(UTC) < t0 + timedelta(seconds=offset):
                time.sleep(0.1)
            step()
        (folder / "nodes.txt").write_text(
            cluster.run("scontrol", "-o", "show", "node", "-d").stdout)
        yield Run(folder, t0, ids)
    finally:
        cluster.stop()


def _import(run: Run, warehouse: str, *files: str, until: float,
            capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(["import", "slurm-sacct", *(str(run.folder / f) for f in files),
                 "--nodes", str(run.folder / "nodes.txt"), "--until", run.at(until),
                 "--warehouse", str(run.folder / warehouse), "--quiet"])
    out = capsys.readouterr()
    return code, out.out + out.err


def _lines(path: Path, job_id: str) -> list[str]:
    return [line for line in path.read_text().splitlines() if line.startswith(f"{job_id}|")]


def test_sacct_printed_what_the_scenario_needs(run: Run) -> None:
    first, second = run.folder / "first.txt", run.folder / "second.txt"
    # the held job is in no window before it was released; the requeued one has a line
    # per attempt; step lines are there
    assert not _lines(first, run.ids["held"]) and _lines(second, run.ids["held"])
    assert len(_lines(run.folder / "whole.txt", run.ids["requeued"])) == 2
    assert f"{run.ids['across']}.batch|" in first.read_text()
    assert "|RUNNING|" in first.read_text() and "|PENDING|" in first.read_text()
    assert "gres/gpu=2" in _lines(first, run.ids["across"])[0]


def test_the_windows_one_by_one_give_the_facts_of_one_export(
        run: Run, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = _import(run, "whole", "whole.txt", until=120, capsys=capsys)
    assert code == 0, out
    # the job name with a '|' and a line break: its line and its step's
    assert "1 line(s) whose job name held a '|' or a line break, read back whole" in out, out
    expected = views(run.folder / "whole")
    attempts = expected["job_attempts"]
    assert attempts.height == 7 and attempts["allocated_gpu_hours"].sum() > 0, attempts
    code, out = _import(run, "daily", "first.txt", until=60, capsys=capsys)
    assert code == 0, out
    code, out = _import(run, "daily", "second.txt", until=120, capsys=capsys)
    assert code == 0, out
    assert f"which ended at {run.at(60)[:16].replace('T', ' ')} UTC" in out, out
    assert "1 job(s) submitted before then that no earlier export printed" in out, out
    got = views(run.folder / "daily")
    for name in VIEWS:
        if name not in ("pending_minute", "frag_minute"):
            assert_frame_equal(got[name], expected[name])
    # the held job waits in the first minute in the one export only (submitted at 18 s)
    later = pl.col("minute").dt.replace_time_zone(None) >= \
        (run.t0 + timedelta(minutes=1)).replace(tzinfo=None)
    for name in ("pending_minute", "frag_minute"):
        assert_frame_equal(got[name].filter(later), expected[name].filter(later))
    first = [v.filter(~later)["pending_jobs"].sum() for v in
             (expected["pending_minute"], got["pending_minute"])]
    assert first[0] == first[1] + 1, first


def test_an_export_after_a_gap_is_refused_and_goes_with_the_missing_one(
        run: Run, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = _import(run, "gap", "first.txt", until=60, capsys=capsys)
    assert code == 0, out
    held = views(run.folder / "gap")
    code, out = _import(run, "gap", "late.txt", until=120, capsys=capsys)
    assert code == 2, out
    missing = sorted((run.ids["across"], run.ids["waits"], run.ids["requeued"]))
    assert (f"3 job(s) running at {run.at(60)[:16].replace('T', ' ')} UTC, where the "
            f"warehouse's Slurm history ends, are in none of these exports (e.g. "
            f"{', '.join(missing)})") in out, out
    for name in VIEWS:
        assert_frame_equal(views(run.folder / "gap")[name], held[name])
    code, out = _import(run, "gap", "second.txt", "late.txt", until=120, capsys=capsys)
    assert code == 0, out
    _import(run, "daily2", "first.txt", until=60, capsys=capsys)
    _import(run, "daily2", "second.txt", until=120, capsys=capsys)
    expected = views(run.folder / "daily2")
    got = views(run.folder / "gap")
    for name in VIEWS:
        assert_frame_equal(got[name], expected[name])
