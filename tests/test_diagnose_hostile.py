"""``gpuledger diagnose`` against hostile conditions: a writer at work on the same
warehouse, files that cannot be read, absurd options, a manifest that does not parse.

The writer case is the one that lost data: diagnose published ``job_diagnosis`` into the
unit the writer commits to (``warehouse``), so the writer's next commit collided and it
stopped with its last step unpublished. Diagnose now publishes into a unit of its own
(``diagnosis_batch.UNIT``).
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import polars as pl
import pytest

from gpuledger.cli.main import main
from gpuledger.pipeline import query
from gpuledger.pipeline.advisor.diagnosis_batch import SORT, UNIT, diagnose_warehouse
from gpuledger.pipeline.advisor.history import HistoryError
from gpuledger.pipeline.config import ProcessorConfig
from gpuledger.pipeline.demo import run_demo
from gpuledger.pipeline.generations import MANIFESTS, WHOLE, read_manifests
from gpuledger.pipeline.simulate import SimConfig
from gpuledger.pipeline.store import open_store
from gpuledger.pipeline.warehouse import Warehouse, published_files, read_table

START = datetime(2026, 1, 5, tzinfo=UTC)
HOURS = 2


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two simulated hours (60-second samples), not diagnosed yet."""
    root = tmp_path_factory.mktemp("diag") / "wh"
    run_demo(SimConfig(start=START, hours=HOURS, seed=7, sample_interval_s=60),
             ProcessorConfig(), root)
    return root


@pytest.fixture
def wh(built: Path, tmp_path: Path) -> Path:
    root = tmp_path / "wh"
    shutil.copytree(built, root)
    return root


def _diagnosis_files(root: Path) -> dict[str, str]:
    return {k: v for k, v in published_files(root).items()
            if k.startswith("facts/job_diagnosis/")}


def _units(root: Path) -> dict[str, int]:
    return {u: m.generation for u, m in read_manifests(open_store(root, create=False)).items()}


WRITER = """
import sys
import time
from datetime import datetime, UTC
from gpuledger.pipeline.config import ProcessorConfig
from gpuledger.pipeline.demo import run_demo
from gpuledger.pipeline.simulate import SimConfig

hours = int(sys.argv[2])
done = [0]

def step(fraction):
    # after each simulated hour's commit, wait for the test to have diagnosed
    if int(fraction * hours) > done[0]:
        done[0] = int(fraction * hours)
        print("hour", done[0], flush=True)
        sys.stdin.readline()

run_demo(SimConfig(start=datetime(2026, 1, 5, tzinfo=UTC), hours=hours, seed=3,
                   sample_interval_s=60), ProcessorConfig(), sys.argv[1], on_progress=step)
"""


def test_diagnose_beside_a_writer_never_stops_it(tmp_path: Path) -> None:
    """A writer (the demo's processor, in its own process) stops after each hour it has
    committed, diagnose runs on the same warehouse, the writer goes on: the writer ends
    well with every GPU-minute published, and readers see one set of job_diagnosis
    rows."""
    root = tmp_path / "live"
    hours = 4
    log = tmp_path / "writer.err"
    with log.open("w") as err:
        writer = subprocess.Popen([sys.executable, "-c", WRITER, str(root), str(hours)],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
                                  text=True)
        assert writer.stdin is not None and writer.stdout is not None
        diagnosed = 0
        try:
            for line in writer.stdout:
                if line.startswith("hour"):
                    try:
                        diagnose_warehouse(root)
                        diagnosed += 1
                    except HistoryError:  # nothing published yet
                        pass
                    writer.stdin.write("\n")
                    writer.stdin.flush()
        finally:
            writer.stdin.close()
            writer.wait(timeout=300)
    said = log.read_text()
    assert writer.returncode == 0, said
    assert "published by another writer" not in said
    assert diagnosed >= 2  # between the writer's commits
    # every GPU-minute of every hour is there: the writer's last step too
    _, rows = query.run(root, "SELECT count(*), count(DISTINCT (node, gpu_index)), "
                              "min(minute), max(minute) FROM gpu_minute")
    count, gpus, first, last = rows[0]
    assert first == START
    assert last == START + timedelta(hours=hours) - timedelta(minutes=1)
    assert count == gpus * hours * 60
    # the writer's unit and diagnose's are apart; a last run sees the finished facts
    assert set(_units(root)) == {WHOLE, UNIT}
    final = diagnose_warehouse(root)
    _, rows = query.run(root, "SELECT count(*), count(DISTINCT (job_id, attempt, pattern)) "
                              "FROM job_diagnosis")
    assert rows[0] == (final.rows.height, final.rows.height)


def test_a_rerun_replaces_the_diagnosis(wh: Path) -> None:
    first = diagnose_warehouse(wh)
    files = _diagnosis_files(wh)
    assert files and all(k.endswith(f"-{UNIT}.parquet") for k in files)
    again = diagnose_warehouse(wh)
    assert _diagnosis_files(wh) == files  # the same objects: nothing added
    assert again.rows.equals(first.rows)
    written = read_table(wh, "job_diagnosis").sort(SORT)
    assert written.height == first.rows.height
    # the catalog (what dashboards open) is rebuilt with them
    _, rows = query.run(wh, "SELECT count(*) FROM job_diagnosis")
    assert rows[0][0] == first.rows.height


def test_a_diagnosis_of_an_earlier_version_is_moved_not_doubled(wh: Path) -> None:
    """job_diagnosis written by an earlier version into unit 'warehouse': refused while
    that unit was just published (its writer may be at work), taken out of it with
    --force; readers then see one set."""
    rows = diagnose_warehouse(wh, write=False).rows
    old = Warehouse(wh)
    old.write_part("job_diagnosis", START, rows, SORT)
    old.commit(wait=True)
    old.close()
    before = _units(wh)
    with pytest.raises(HistoryError, match=r"unit 'warehouse' holds job_diagnosis files of an "
                                           r"earlier gpuledger .* or --force"):
        diagnose_warehouse(wh)
    assert _units(wh) == before  # nothing written
    diagnose_warehouse(wh, force=True)
    files = _diagnosis_files(wh)
    assert files and all(k.endswith(f"-{UNIT}.parquet") for k in files)
    manifests = read_manifests(open_store(wh, create=False))
    assert not any(k.startswith("facts/job_diagnosis/") for k in manifests[WHOLE].files)
    assert read_table(wh, "job_diagnosis").height == rows.height


def _first_gpu_minute(root: Path) -> Path:
    return root / next(v for k, v in sorted(published_files(root).items())
                       if k.startswith("facts/gpu_minute/"))


def test_a_truncated_file_is_one_line_naming_it(wh: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    bad = _first_gpu_minute(wh)
    os.truncate(bad, 1000)
    before = _units(wh)
    for extra in (["--dry-run"], []):
        assert main(["diagnose", "--warehouse", str(wh), "--quiet", *extra]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1, err
        assert str(bad.relative_to(wh)) in err and "damaged: it holds 1000 bytes" in err
        assert err.endswith("restore it, or ingest (or import) the whole history again in "
                            "one run, which writes it anew"), err
    assert _units(wh) == before


def test_a_file_it_may_not_read_is_one_line(wh: Path, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    """A fact file the user may not read (PermissionError: tests run as root here, so
    the refusal is made by the reader) and a folder that may not be listed."""
    def denied(path: object, *args: object, **kwargs: object) -> pl.DataFrame:
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(pl, "read_parquet", denied)
    assert main(["diagnose", "--warehouse", str(wh), "--quiet", "--dry-run"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.endswith("permission denied"), err
    monkeypatch.undo()
    folder = wh / "facts" / "gpu_minute"
    real = os.access
    monkeypatch.setattr(os, "access",
                        lambda p, mode: Path(p) != folder and real(p, mode))
    assert main(["diagnose", "--warehouse", str(wh), "--quiet", "--dry-run"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"gpuledger: error: {folder}: permission denied"


def test_top_is_bounded_before_anything_is_written(
        wh: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        main(["diagnose", "--warehouse", str(wh), "--top", "99999999999999999999999"])
    assert stop.value.code == 2
    assert "--top must be at most 1,000,000" in capsys.readouterr().err
    assert not (wh / MANIFESTS / UNIT).exists()
    assert _diagnosis_files(wh) == {}


def test_a_manifest_passed_over_is_said_once(wh: Path, caplog: pytest.LogCaptureFixture,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    newest = max((wh / MANIFESTS / WHOLE).glob("*.json"))
    (newest.parent / f"{int(newest.stem) + 1:012d}.json").write_text("{not json")
    with caplog.at_level(logging.WARNING, logger="gpuledger.warehouse"):
        assert main(["diagnose", "--warehouse", str(wh), "--quiet", "--dry-run"]) == 0
    said = [r for r in caplog.records if "passed over" in r.getMessage()]
    assert len(said) == 1, [r.getMessage() for r in said]
    assert "Idle and inefficient GPU-hours" in capsys.readouterr().out


def test_a_file_is_not_a_warehouse(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    afile = tmp_path / "afile"
    afile.write_text("x")
    assert main(["diagnose", "--warehouse", str(afile), "--quiet"]) == 2
    assert capsys.readouterr().err.strip() == \
        f"gpuledger: error: {afile}: a file, not a warehouse folder"


def test_a_warehouse_of_imported_history_says_why_nothing_is_diagnosed(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Scheduler history alone (a pod list) has GPU-minutes, as spans without telemetry:
    "no GPU-minutes to diagnose" read as if the import had written nothing."""
    pods = tmp_path / "pods.csv"
    pods.write_text("name,created,scheduled,deleted,gpus,node,gpu_indices\n"
                    "a,2026-01-05T08:00:00Z,2026-01-05T08:01:00Z,2026-01-05T09:00:00Z,2,n1,\"0,1\"\n")
    root = tmp_path / "wh"
    assert main(["import", "pods", str(pods), "--warehouse", str(root), "--quiet"]) == 0
    capsys.readouterr()
    assert main(["diagnose", "--warehouse", str(root), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert "no GPU-minute with telemetry to diagnose" in err and "an import" in err, err


def test_diagnose_every_waits_for_a_warehouse_then_keeps_it_diagnosed(
        built: Path, tmp_path: Path) -> None:
    """`diagnose --every`, as the compose stack runs it beside the processor: started
    before anything is published, it warns and tries again rather than stop; once the
    warehouse is there each run diagnoses it, a line a run; SIGTERM ends it, status 0.
    Before, the stack had no diagnose at all and the Job board's diagnosis panel stayed
    empty."""
    root = tmp_path / "wh"
    with (tmp_path / "out").open("w") as out, (tmp_path / "err").open("w") as err:
        every = subprocess.Popen([sys.executable, "-m", "gpuledger.cli.main", "diagnose",
                                  "--warehouse", str(root), "--every", "0.5", "--quiet"],
                                 stdout=out, stderr=err, text=True)
        try:
            deadline = time.monotonic() + 60
            while "again in 0.5 s" not in (tmp_path / "err").read_text():
                assert every.poll() is None and time.monotonic() < deadline
                time.sleep(0.1)
            shutil.copytree(built, root)   # the processor has published
            while (tmp_path / "out").read_text().count("diagnose at ") < 2:
                assert every.poll() is None and time.monotonic() < deadline
                time.sleep(0.1)
        finally:
            every.send_signal(signal.SIGTERM)
            status = every.wait(timeout=30)
    said, warned = (tmp_path / "out").read_text(), (tmp_path / "err").read_text()
    assert status == 0, warned
    assert "Traceback" not in warned
    assert f"{root}: no such folder" in warned
    want = diagnose_warehouse(root, write=False).rows
    assert "diagnose at " in said and f"{want.height:,} row(s)" in said
    written = read_table(root, "job_diagnosis")
    assert written.height == want.height > 0


def test_diagnose_every_is_checked_at_the_start(
        wh: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for bad in (["--every", "0"], ["--every", "-5"], ["--every", "nan"],
                ["--every", "60", "--json"]):
        try:
            status = main(["diagnose", "--warehouse", str(wh), *bad])
        except SystemExit as stop:   # argparse's refusals
            status = stop.code
        assert status == 2, bad
        err = capsys.readouterr().err
        assert "--every" in err or "--json" in err, err
        assert "Traceback" not in err
