"""A warehouse's own files are data someone could have tampered with: nothing a manifest,
a retired log or a link says may make gpuledger read or delete outside the warehouse, a
second writer of a unit is stopped instead of overwriting the first, and I/O failures
are one line, not a traceback."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import time
from pathlib import Path

import pytest
from events import alloc, at, frames, inventory, job, series

from gpuledger.cli.errors import CliError
from gpuledger.cli.main import main
from gpuledger.pipeline.compaction import orphans
from gpuledger.pipeline.config import ProcessorConfig
from gpuledger.pipeline.generations import (
    Manifest,
    Publisher,
    manifest_path,
    read_manifests,
    read_retired,
    retired_path,
)
from gpuledger.pipeline.processor import Processor
from gpuledger.pipeline.store import StoreError, StoreIOError, open_store
from gpuledger.pipeline.warehouse import Warehouse

LOGICAL = "facts/gpu_minute/date=2026-01-01/gpu_minute-2026-01-01T00.parquet"
OLD = time.time() - 30 * 86400


def _published(root: Path) -> Path:
    """A small real warehouse (an hour of one node)."""
    recs = [inventory("n1", at(0), gpus=2), job("submitted", "j", at(0)),
            job("started", "j", at(1), allocation=alloc("n1", 0)), job("finished", "j", at(50)),
            *series("n1", 0, at(0), 60, sm=0.5, mem=1000.0, jobs=["j"])]
    proc = Processor(ProcessorConfig(), Warehouse(root))
    proc.process(frames(recs), validated=True)
    proc.flush()
    proc.warehouse.close()
    return root


def _victim(tmp_path: Path, name: str = "victim.txt") -> Path:
    victim = tmp_path / name
    victim.write_text("precious")
    os.utime(victim, (OLD, OLD))
    return victim


def test_a_retired_log_naming_a_path_outside_deletes_nothing(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    root = _published(tmp_path / "wh")
    victim = _victim(tmp_path)
    (root / "facts" / "README.md").write_text("someone's notes")
    for i, name in enumerate(["../victim.txt", "facts/../../victim.txt", "/etc/passwd",
                              "facts/gpu_minute/_schema.parquet", "facts/README.md",
                              "facts/../../victim.0123456789abcdef.parquet"]):
        (root / retired_path("warehouse", 10 + i)).parent.mkdir(parents=True, exist_ok=True)
        (root / retired_path("warehouse", 10 + i)).write_text(json.dumps(
            {"version": 1, "unit": "warehouse", "generation": 10 + i, "retired": {name: 0}}))
    assert read_retired(open_store(root)) == []        # none of them is one of ours
    assert caplog.text.count("passed over (what it lists is not deleted)") == 6
    assert main(["compact", "--force", "--warehouse", str(root)]) == 0
    assert victim.read_text() == "precious"
    assert (root / "facts" / "README.md").exists()
    assert (root / "facts" / "gpu_minute" / "_schema.parquet").exists()
    # a writer that loads the unit goes on deleting what logs list: not these
    pub = Publisher(open_store(root), retain_s=0)
    pub.put("warehouse", LOGICAL, b"other rows")
    pub.commit(wait=True)
    pub.close()
    assert victim.read_text() == "precious"


def test_a_manifest_naming_a_path_outside_is_passed_over(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    root = _published(tmp_path / "wh")
    victim = _victim(tmp_path)
    newest = read_manifests(open_store(root))["warehouse"].generation
    good = json.loads((root / manifest_path("warehouse", newest)).read_text())
    for generation, files in ((newest + 1, {LOGICAL: "facts/gpu_minute/../../../victim.txt"}),
                              (newest + 2, {LOGICAL: 5}),            # not a name at all
                              (newest + 3, {"../x": "facts/a.0123456789abcdef.parquet"})):
        (root / manifest_path("warehouse", generation)).write_text(json.dumps(
            {**good, "generation": generation, "files": files}))
    store = open_store(root)
    assert read_manifests(store)["warehouse"].generation == newest   # the last good one
    assert caplog.text.count("passed over for the generation before it") == 3
    # compact and a later writer: the outside file is neither read nor deleted
    assert main(["compact", "--force", "--warehouse", str(root)]) == 0
    pub = Publisher(store, retain_s=0)
    pub.put("warehouse", LOGICAL, b"new rows")
    pub.commit(wait=True)
    pub.close()
    assert victim.read_text() == "precious"
    with pytest.raises(StoreError, match="not a path inside the warehouse"):
        store.read("facts/../../victim.txt")


def test_links_under_facts_are_not_followed_and_foreign_files_are_kept(tmp_path: Path) -> None:
    root = _published(tmp_path / "wh")
    outside = tmp_path / "outside"
    outside.mkdir()
    important = outside / "important.0123456789abcdef.parquet"
    important.write_bytes(b"x")
    os.utime(important, (OLD, OLD))
    (root / "facts" / "evil").symlink_to(outside)
    (root / "facts" / "link.0123456789abcdef.parquet").symlink_to(important)
    mine = root / "facts" / "my_export.parquet"      # a user's own file
    mine.write_bytes(b"y")
    os.utime(mine, (OLD, OLD))
    store = open_store(root)
    listed = {e.path for e in store.list("facts")}
    assert not any("evil" in p or "link" in p for p in listed)
    assert "facts/my_export.parquet" in listed
    assert orphans(store, read_manifests(store).values(), time.time()) == []
    assert main(["compact", "--force", "--warehouse", str(root)]) == 0
    assert important.exists() and mine.exists()


def test_temporary_files_of_killed_writers_are_swept_by_compact(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A writer killed mid-write leaves its hidden temporary file (``.NAME.<12 hex>.tmp``:
    facts, manifests, checkpoints); they piled up under a service killed at random.
    ``compact`` deletes those untouched for an hour, and nothing else: a fresh one (a
    write going on), a user's hidden files, a link, what lies behind a link."""
    root = _published(tmp_path / "wh")
    day = root / "facts" / "gpu_minute" / "date=2026-01-05"
    day.mkdir(parents=True, exist_ok=True)
    dead = [day / ".gpu_minute-x.parquet.0123456789ab.tmp",
            root / "state" / "g" / ".partition-p000.checkpoint.4242aa4242aa.tmp"]
    fresh = day / ".gpu_minute-y.parquet.ba9876543210.tmp"
    kept = [fresh, root / ".my-notes.tmp", root / ".backup.2024.tmp",
            day / ".x.0123456789ab.tmp.bak"]
    outside = tmp_path / "outside"
    outside.mkdir()
    behind = outside / ".other.0123456789ab.tmp"
    for path in [*dead, *kept, behind]:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"partial")
        if path is not fresh:
            os.utime(path, (OLD, OLD))
    (root / "facts" / "elsewhere").symlink_to(outside)
    link = day / ".link.0123456789ab.tmp"
    link.symlink_to(behind)
    os.utime(link, (OLD, OLD), follow_symlinks=False)
    assert main(["compact", "--force", "--warehouse", str(root)]) == 0
    assert "deleted 2 temporary file(s) of writers killed mid-write" in capsys.readouterr().out
    assert not any(p.exists() for p in dead)
    assert all(p.exists() for p in kept) and behind.exists() and link.is_symlink()
    assert open_store(root).sweep_temporary() == []


def _generations(root: Path) -> list[str]:
    return sorted(p.name for p in (root / "manifests" / "warehouse").glob("*.json"))


def test_a_commit_that_fails_in_compact_says_nothing_was_published(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Found with a disk full at the manifest's write: compact said "the days are
    compacted and published, but the catalog … could not be built (…/000000000007.json:
    cannot write: No space left on device)", and generation 7 did not exist. It says
    now that the commit failed and nothing was published; a run after publishes it."""
    from gpuledger.pipeline.store import Store

    root = _published(tmp_path / "wh")
    before = _generations(root)
    create = Store.create

    def full(self: Store, path: str, data: bytes) -> None:
        if path.startswith("manifests/warehouse/0"):       # not its retired log
            raise StoreIOError(f"{self.url_of(path)}: cannot write: No space left on device")
        create(self, path, data)

    monkeypatch.setattr(Store, "create", full)
    assert main(["compact", "--force", "--quiet", "--before", "2026-01-07T00:00Z",
                 "--warehouse", str(root)]) == 2
    err = capsys.readouterr().err
    name = f"{root}/manifests/warehouse/{int(before[-1][:-5]) + 1:012d}.json"
    assert err == (f"gpuledger: error: {root}: the commit failed ({name}: cannot write: No "
                   "space left on device); nothing published, readers see the warehouse as "
                   "before; run gpuledger compact again\n"), err
    assert _generations(root) == before
    monkeypatch.setattr(Store, "create", create)
    assert main(["compact", "--force", "--quiet", "--before", "2026-01-07T00:00Z",
                 "--warehouse", str(root)]) == 0
    assert len(_generations(root)) > len(before)


def test_a_compact_beaten_by_another_writer_says_so(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by running two compacts at once: the loser said the days were compacted
    and published, wrapping "generation 7 … was published by another writer meanwhile".
    It says now that the other writer published first and nothing of its own was."""
    from gpuledger.pipeline.store import Store

    root = _published(tmp_path / "wh")
    generation = int(_generations(root)[-1][:-5]) + 1
    create = Store.create
    theirs = Manifest("warehouse", 0, {}).to_bytes()

    def beaten(self: Store, path: str, data: bytes) -> None:
        if path.startswith("manifests/warehouse/0"):
            create(self, path, theirs)       # the other writer, an instant before
        create(self, path, data)

    monkeypatch.setattr(Store, "create", beaten)
    assert main(["compact", "--force", "--quiet", "--before", "2026-01-07T00:00Z",
                 "--warehouse", str(root)]) == 2
    err = capsys.readouterr().err
    assert err == (f"gpuledger: error: {root}: another writer published generation "
                   f"{generation} of unit 'warehouse' meanwhile (a second compact, or an "
                   "ingest or import); nothing published, readers see the warehouse as "
                   "before; run gpuledger compact again once that writer is done\n"), err


def _hourly(root: Path) -> list[str]:
    """The hourly files the newest generation names."""
    files = read_manifests(open_store(root))["warehouse"].files
    return sorted(k for k in files if re.search(r"T\d\d\.parquet$", k))


def test_days_compact_puts_off_are_counted_and_fail_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Found running compact as a user who may not run the interpreter: every day was put
    off ("child process did not start"), each with "tried again at the next commit" (a
    one-shot command has none), and it said "compacted 0 table-day(s)", exit status 0.
    It counts them now, says the first reason and to run it again, exit status 2."""
    from gpuledger.pipeline import sort_worker

    root = _published(tmp_path / "wh")
    hourly = _hourly(root)
    monkeypatch.setattr(sort_worker.sys, "executable", str(tmp_path / "no-python"))
    assert main(["compact", "--force", "--quiet", "--before", "2026-01-07T00:00Z",
                 "--warehouse", str(root)]) == 2
    out, err = capsys.readouterr()
    tables = len({name.rsplit("/", 1)[0] for name in hourly})    # its table-days
    assert out.startswith(f"compacted 0 table-day(s) before 2026-01-07T00:00Z and put off "
                          f"{tables} in {root}; "), out
    assert err.startswith(f"gpuledger: error: {root}: {tables} table-day(s) put off, their "
                          "hourly files stay (the first, facts/"), err
    assert err.endswith(f": the compaction's child process did not start ({tmp_path}/"
                        "no-python: No such file or directory)); run gpuledger compact "
                        "again\n"), err
    assert "next commit" not in out + err and err.count("\n") == 1
    assert _hourly(root) == hourly
    monkeypatch.undo()
    assert main(["compact", "--force", "--quiet", "--before", "2026-01-07T00:00Z",
                 "--warehouse", str(root)]) == 0
    assert _hourly(root) == []


def test_a_day_put_off_for_a_full_spill_folder_names_the_folder(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Found with $TMPDIR on a 100 KB tmpfs: a day put off said "the spill folder failed:
    OSError: [Errno 28] …" (which folder?), then "compacted 8 table-day(s)", exit 0."""
    import errno
    import tempfile

    from gpuledger.pipeline import warehouse

    root = _published(tmp_path / "wh")
    spill = tmp_path / "spill"
    spill.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(spill))
    sort = warehouse.Warehouse._sorted_day
    calls: list[str] = []

    def full(self: Warehouse, table: str, day: str, *args: object, **kw: object) -> object:
        calls.append(day)
        if len(calls) == 1:
            raise warehouse._SpillFailed from OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return sort(self, table, day, *args, **kw)

    monkeypatch.setattr(warehouse.Warehouse, "_sorted_day", full)
    assert main(["compact", "--force", "--quiet", "--before", "2026-01-07T00:00Z",
                 "--warehouse", str(root)]) == 2
    out, err = capsys.readouterr()
    assert f"compacted {len(calls) - 1} table-day(s) before 2026-01-07T00:00Z and put off 1 " \
        in out, out
    assert err == (f"gpuledger: error: {root}: 1 table-day(s) put off, their hourly files "
                   f"stay (the first, {calls[0]}: the spill folder {spill} ($TMPDIR) failed: "
                   "No space left on device); run gpuledger compact again\n"), err


def _left_behind(base: Path, pids: tuple[int, int]) -> tuple[list[Path], list[Path]]:
    """Folders of killed compactions and catalog builds: of the dead pid ``pids[0]``
    untouched for two hours, and those to keep (of the live pid ``pids[1]``, and the dead
    one's touched just now: another PID namespace's?)."""
    old = time.time() - 7200
    dead: list[Path] = []
    kept: list[Path] = []
    for prefix in ("gpuledger-compact-", "gpuledger-catalog-"):
        for pid, kind, when, tag in ((pids[0], dead, old, "d"), (pids[1], kept, old, "a"),
                                     (pids[0], kept, None, "y")):
            folder = base / f"{prefix}{pid}-{tag}"
            folder.mkdir()
            (folder / "00000.parquet").write_bytes(b"spill")
            if when is not None:
                os.utime(folder, (when, when))
            kind.append(folder)
    return dead, kept


def test_spill_folders_of_killed_compactions_and_catalog_builds_are_swept(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by killing compact (kill -9) part-way: each kill left a gpuledger-compact-*
    folder in $TMPDIR (spill Parquet, up to ~250 MB a day's table on 576 GPUs), a killed
    demo a gpuledger-catalog-* one, and nothing ever removed them. Their names hold the
    owner's pid now, and the next compaction or catalog build removes those of processes
    that are gone, untouched for an hour (the sweep of readers' folders, shared)."""
    import subprocess
    import sys
    import tempfile
    from datetime import UTC, datetime

    from gpuledger.pipeline import warehouse

    root = _published(tmp_path / "wh")
    base = tmp_path / "tmp"
    base.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(base))
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    dead, kept = _left_behind(base, (gone.pid, os.getppid()))
    used: list[str] = []
    footer, views = warehouse._check_footer, warehouse.build_views

    def spill(file: Path, named: str) -> None:
        used.append(file.parent.name)
        footer(file, named)

    def built(path: Path, *args: object) -> None:
        used.append(path.parent.name)
        views(path, *args)

    monkeypatch.setattr(warehouse, "_check_footer", spill)
    monkeypatch.setattr(warehouse, "build_views", built)
    wh = Warehouse(root)
    assert wh.compact_unit("warehouse", datetime(2026, 1, 7, tzinfo=UTC)) > 0
    assert [f.exists() for f in dead] == [False, True]     # compaction's, not the catalog's
    wh.publish_catalog()
    wh.close()
    assert not any(f.exists() for f in dead) and all(f.exists() for f in kept)
    assert sorted(p.name for p in base.iterdir()) == sorted(f.name for f in kept)
    assert {name.rsplit("-", 1)[0] for name in used} == \
        {f"gpuledger-compact-{os.getpid()}", f"gpuledger-catalog-{os.getpid()}"}
    # the command counts those it removed
    for folder in kept:
        shutil.rmtree(folder)
    dead, kept = _left_behind(base, (gone.pid, os.getppid()))
    assert main(["compact", "--force", "--warehouse", str(root)]) == 0
    assert capsys.readouterr().out.endswith(
        f"; removed 2 folder(s) of compactions and catalog builds killed mid-way from {base}\n")
    assert not any(f.exists() for f in dead) and all(f.exists() for f in kept)


def test_a_second_writer_of_a_unit_is_stopped_not_overwriting(tmp_path: Path) -> None:
    store = open_store(tmp_path / "wh")
    first, second = Publisher(store, retain_s=0), Publisher(store, retain_s=0)
    first.unit("warehouse")
    second.unit("warehouse")                 # both loaded the unit before either wrote
    first.put("warehouse", LOGICAL, b"first")
    first.commit(wait=True)
    second.put("warehouse", LOGICAL, b"second")
    with pytest.raises(StoreError, match="published by another writer meanwhile"):
        second.commit(wait=True)
    manifest = read_manifests(store)["warehouse"]
    assert manifest.generation == 1
    assert store.read(manifest.files[LOGICAL]) == b"first"     # the first one's facts
    first.close()
    second._pool.shutdown()
    second._committer.shutdown()


def test_a_copied_manifest_folder_is_not_taken_for_the_unit(tmp_path: Path) -> None:
    root = _published(tmp_path / "wh")
    backup = root / "manifests" / "warehouse.bak"
    backup.mkdir()
    stale = Manifest("warehouse", 99, {}).to_bytes()            # names nothing
    (backup / "000000000099.json").write_bytes(stale)
    (root / "manifests" / "warehouse" / "²³.json").write_bytes(stale)  # not ASCII digits
    (root / "manifests" / "zzz").mkdir()
    (root / "manifests" / "zzz" / "000000000099.json").write_bytes(stale)
    manifests = read_manifests(open_store(root))
    assert list(manifests) == ["warehouse"] and manifests["warehouse"].files
    assert manifests["warehouse"].generation < 99


def test_io_failures_are_one_line(tmp_path: Path) -> None:
    root = tmp_path / "wh"
    root.mkdir()
    (root / "facts").write_text("a file where a folder must be")
    store = open_store(root)
    with pytest.raises(StoreIOError, match=r"facts/gpu_minute/x: cannot write") as err:
        store.write("facts/gpu_minute/x", b"data")
    assert isinstance(err.value, OSError) and isinstance(err.value, CliError)
    assert "\n" not in str(err.value)
    with pytest.raises(StoreIOError, match="cannot list: not a folder"):
        store.list("facts")


@pytest.mark.parametrize("damage", ["cut", "nested"])
def test_a_warning_says_when_the_newest_manifest_is_damaged(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: str) -> None:
    """Cut in half, or nested deeper than Python's JSON reader goes (a RecursionError
    escaped every reader of the warehouse)."""
    root = _published(tmp_path / "wh")
    newest = read_manifests(open_store(root))["warehouse"].generation
    good = (root / manifest_path("warehouse", newest)).read_bytes()
    (root / manifest_path("warehouse", newest + 1)).write_bytes(
        good[: len(good) // 2] if damage == "cut" else b"[" * 100_000)
    with caplog.at_level(logging.WARNING):
        assert read_manifests(open_store(root))["warehouse"].generation == newest
    assert f"{newest + 1:012d}.json: not a gpuledger manifest" in caplog.text


def test_an_error_raised_under_duckdb_is_named_by_its_last_line() -> None:
    from gpuledger.pipeline.query import _one_line

    quoted = RuntimeError("Traceback (most recent call last):\n  File \"x.py\", line 1\n"
                          "FileNotFoundError: Path does not exist 'bkt/wh/facts/a.parquet'")
    assert _one_line(quoted) == "FileNotFoundError: Path does not exist 'bkt/wh/facts/a.parquet'"
    assert _one_line(ValueError("first line\nLINE 1: caret")) == "first line"


def test_a_commit_cut_off_between_its_retired_log_and_its_manifest_is_no_conflict(
        tmp_path: Path) -> None:
    """A writer killed after writing generation N's retired log, before its manifest: the
    next writer goes on past N instead of taking it for another writer's."""
    root = _published(tmp_path / "wh")
    store = open_store(root)
    newest = read_manifests(store)["warehouse"].generation
    (root / retired_path("warehouse", newest + 1)).parent.mkdir(parents=True, exist_ok=True)
    (root / retired_path("warehouse", newest + 1)).write_text('{"cut off')
    pub = Publisher(store, retain_s=3600)
    pub.put("warehouse", LOGICAL, b"after the crash")
    pub.commit(wait=True)
    pub.close()
    assert read_manifests(store)["warehouse"].generation == newest + 2


def test_a_damaged_hourly_file_stops_compact_in_one_line_naming_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Found by cutting an hourly file short: ``compact`` printed two tracebacks (its
    sort child's and its own) ending in "compaction's sort failed: ComputeError: parquet:
    File out of specification", naming no file. Now one line names the object; and a
    run that goes draws its bar (it was silent for minutes on a month's backlog)."""
    root = _published(tmp_path / "wh")
    good = tmp_path / "good"
    shutil.copytree(root, good)
    hour = next((root / "facts" / "gpu_minute").rglob("gpu_minute-*.parquet"))
    hour.write_bytes(hour.read_bytes()[:1000])
    assert main(["compact", "--force", "--before", "2026-01-07T00:00Z",
                 "--warehouse", str(root)]) == 2
    err = capsys.readouterr().err   # (the bar, where it stopped, then the line)
    assert err.endswith(f"\ngpuledger: error: {hour}: not a readable Parquet file (parquet: "
                        "File out of specification: The file must end with PAR1 or PARE): "
                        "the day is not compacted; restore it, or ingest (or import) the "
                        "whole history again in one run, which writes it anew\n"), err
    assert "Traceback" not in err and "100.0%" not in err
    assert main(["compact", "--force", "--before", "2026-01-07T00:00Z",
                 "--warehouse", str(good)]) == 0
    out, err = capsys.readouterr()
    assert "compacting" in err and "━" in err and "100.0%" in err, err
    assert out.startswith("compacted ") and "compacting" not in out, out
    assert main(["compact", "--force", "--quiet", "--warehouse", str(good)]) == 0
    assert capsys.readouterr().err == ""


def test_a_store_gone_while_compact_builds_the_catalog_is_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by stopping the S3 server 1.3 s into a compact: the days were compacted,
    then building the catalog failed with a traceback (duckdb.Error from an AWS network
    error). One line now says what is done and what to do; a run after builds it."""
    from gpuledger.pipeline.warehouse import Warehouse

    root = _published(tmp_path / "wh")
    tables = len({name.rsplit("/", 1)[0] for name in _hourly(root)})   # its table-days
    build = Warehouse.publish_catalog

    def gone(self: Warehouse, required: bool = True) -> str:
        raise OSError("When reading information for key 'catalog.duckdb': AWS Error "
                      "NETWORK_CONNECTION during GetObject operation")

    monkeypatch.setattr(Warehouse, "publish_catalog", gone)
    assert main(["compact", "--force", "--quiet", "--before", "2026-01-07T00:00Z",
                 "--warehouse", str(root)]) == 2
    err = capsys.readouterr().err
    assert err == (f"gpuledger: error: {root}: {tables} table-day(s) compacted and "
                   "published; the catalog readers use could not be built (When reading "
                   "information for key 'catalog.duckdb': AWS Error NETWORK_CONNECTION "
                   "during GetObject operation); run gpuledger compact again\n"), err
    monkeypatch.setattr(Warehouse, "publish_catalog", build)
    assert main(["compact", "--force", "--quiet", "--warehouse", str(root)]) == 0


def test_a_catalog_failure_after_days_put_off_says_what_was_done(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A probe ran compact with a $TMPDIR too small for anything: every day was put off,
    then the catalog's build failed too, and it said "the days are compacted and
    published" (none was) and nothing of the days put off."""
    from gpuledger.pipeline import sort_worker
    from gpuledger.pipeline.warehouse import Warehouse

    root = _published(tmp_path / "wh")
    hourly = _hourly(root)

    def full(self: Warehouse, required: bool = True) -> str:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(sort_worker.sys, "executable", str(tmp_path / "no-python"))
    monkeypatch.setattr(Warehouse, "publish_catalog", full)
    assert main(["compact", "--force", "--quiet", "--before", "2026-01-07T00:00Z",
                 "--warehouse", str(root)]) == 2
    err = capsys.readouterr().err
    tables = len({name.rsplit("/", 1)[0] for name in hourly})
    assert err.startswith(f"gpuledger: error: {root}: nothing compacted, {tables} put off, "
                          "their hourly files stay (the first, facts/"), err
    assert err.endswith("; the catalog readers use could not be built ([Errno 28] No space "
                        "left on device); run gpuledger compact again\n"), err
    assert "published" not in err and _hourly(root) == hourly
