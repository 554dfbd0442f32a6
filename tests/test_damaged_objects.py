"""A published fact object that is missing or damaged (cut short, deleted by hand, a
disk that lost it): writing the same facts again repairs it, readers say what to do
about it in one line, and a unit none of whose manifests can be read is refused, never
taken for an empty warehouse."""

from __future__ import annotations

import builtins
from pathlib import Path

import pytest
from events import alloc, at, frames, inventory, job, series

from gpuledger.pipeline.config import ProcessorConfig
from gpuledger.pipeline.generations import Publisher, read_manifests
from gpuledger.pipeline.processor import Processor
from gpuledger.pipeline.store import Entry, Store, open_store
from gpuledger.pipeline.warehouse import Warehouse, read_table

LOGICAL = "facts/gpu_minute/date=2026-01-01/gpu_minute-2026-01-01T00.parquet"


def _records() -> list[dict[str, object]]:
    return [inventory("n1", at(0), gpus=2), job("submitted", "j", at(0)),
            job("started", "j", at(1), allocation=alloc("n1", 0)),
            job("finished", "j", at(50)),
            *series("n1", 0, at(0), 60, sm=0.5, mem=1000.0, jobs=["j"])]


def _process(root: Path) -> Path:
    """Process the same hour of one node into ``root`` (a small real warehouse)."""
    proc = Processor(ProcessorConfig(), Warehouse(root))
    proc.process(frames(_records()), validated=True)
    proc.flush()
    proc.warehouse.close()
    return root


def _object(root: Path, table: str) -> Path:
    """The published object of ``table``'s hour."""
    files = read_manifests(open_store(root))["warehouse"].files
    return root / next(o for k, o in files.items() if k.startswith(f"facts/{table}/date="))


def test_processing_the_hour_again_rewrites_a_cut_or_missing_published_object(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Found by cutting a gpu_minute hour short and deleting a job_attempts hour, then
    ingesting the input again with --afresh: the manifest already named objects of those
    names (a digest of the same content), so nothing was written, the run said it
    succeeded, and every later query of either table failed."""
    root = _process(tmp_path / "wh")
    cut, gone = _object(root, "gpu_minute"), _object(root, "job_attempts")
    whole = cut.read_bytes()
    minutes, attempts = read_table(root, "gpu_minute"), read_table(root, "job_attempts")
    cut.write_bytes(whole[:1000])
    gone.unlink()
    _process(root)
    assert cut.read_bytes() == whole and gone.exists()
    assert read_table(root, "gpu_minute").equals(minutes)
    assert read_table(root, "job_attempts").equals(attempts)
    assert f"{cut}: damaged (1000 bytes where the manifest says {len(whole)}); " \
           "written again" in caplog.text
    assert f"{gone}: missing; written again" in caplog.text


def test_an_object_named_again_is_looked_at_once_and_alone(tmp_path: Path) -> None:
    """The check costs one stat (a HEAD on S3) of the object put, once per writer: never a
    listing of the store, and nothing at all for an object this writer wrote itself."""
    store = open_store(tmp_path / "wh")
    first = Publisher(store, retain_s=0)
    first.put("warehouse", LOGICAL, b"facts")
    first.commit(wait=True)
    first.close()
    looked: list[str] = []
    listed: list[str] = []

    class Counting(Store):
        def size(self, path: str) -> int | None:
            looked.append(path)
            return super().size(path)

        def list(self, prefix: str) -> builtins.list[Entry]:
            listed.append(prefix)
            return super().list(prefix)

    counting = Counting(store.fs, store.base, store.url, store.remote)
    second = Publisher(counting, retain_s=0)
    second.unit("warehouse")
    listed.clear()
    obj = second.put("warehouse", LOGICAL, b"facts")
    second.put("warehouse", LOGICAL, b"facts")
    assert looked == [obj] and listed == [] and second.objects_written == 0
    assert second.commit(wait=True) == set()      # whole: nothing to publish
    (tmp_path / "wh" / obj).write_bytes(b"fac")
    third = Publisher(counting, retain_s=0)
    assert third.put("warehouse", LOGICAL, b"facts") == obj and third.objects_written == 1
    third.commit(wait=True)
    assert (tmp_path / "wh" / obj).read_bytes() == b"facts"
    second.close()
    third.close()


def _all_manifests_garbage(root: Path) -> int:
    manifests = sorted((root / "manifests" / "warehouse").glob("*.json"))
    for m in manifests:
        m.write_text("garbage")
    return len(manifests)


@pytest.mark.parametrize("command", [
    ["query", "--format", "csv", "select count(*) from gpu_minute"],
    ["report"],
    ["compact", "--force", "--quiet"],
    ["diagnose", "--quiet", "--dry-run"],
])
def test_a_unit_none_of_whose_manifests_can_be_read_is_refused_never_empty(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str]) -> None:
    """Found by overwriting every manifest with garbage: query printed 0 (exit 0), report
    said "no data in this window", compact "nothing published here", with one warning per
    manifest on stderr."""
    from gpuledger.cli.main import main

    root = _process(tmp_path / "wh")
    _process(root)  # a second generation: none of them can be read
    n = _all_manifests_garbage(root)
    assert n >= 1
    assert main([*command, "--warehouse", str(root)]) == 2
    out, err = capsys.readouterr()
    newest = sorted((root / "manifests" / "warehouse").glob("*.json"))[-1]
    assert err == (f"gpuledger: error: unit 'warehouse': none of its {n} manifest(s) can be "
                   f"read (the newest: {newest}: not a gpuledger manifest (Expecting value: "
                   f"line 1 column 1 (char 0))); restore {root}/manifests/warehouse/ from a "
                   "backup: without them nothing of the unit can be read or written (the "
                   "facts they name are under facts/)\n"), err
    assert "0" not in out


def test_a_writer_does_not_start_a_fresh_generation_over_unreadable_manifests(
        tmp_path: Path) -> None:
    from gpuledger.pipeline.store import StoreError

    root = _process(tmp_path / "wh")
    n = _all_manifests_garbage(root)
    before = sorted(p.name for p in (root / "manifests" / "warehouse").iterdir())
    with pytest.raises(StoreError, match=f"none of its {n} manifest"):
        _process(root)
    assert sorted(p.name for p in (root / "manifests" / "warehouse").iterdir()) == before


def test_a_damaged_newest_manifest_still_falls_back_to_the_one_before(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        caplog: pytest.LogCaptureFixture) -> None:
    from gpuledger.cli.main import main

    root = _process(tmp_path / "wh")
    (root / "manifests" / "warehouse" / "000000000099.json").write_text("garbage")
    assert main(["query", "--format", "csv", "--warehouse", str(root),
                 "select count(*) > 0 AS some from gpu_minute"]) == 0
    assert capsys.readouterr().out == "some\nTrue\n"
    assert "000000000099.json: not a gpuledger manifest" in caplog.text


REPAIR = ("restore it, or ingest (or import) the whole history again in one run, which "
          "writes it anew")
REPAIR_MERGED = ("restore it, or ingest (or import) the whole history again into a new "
                 "warehouse (a run into this one reads the object to merge rows into it, "
                 "and stops on it)")


@pytest.mark.parametrize("command", [
    ["query", "--format", "csv", "select count(*) from {table}"],
    ["report"],
    ["diagnose", "--quiet", "--dry-run"],
    ["whatif", "--quiet"],
])
@pytest.mark.parametrize("damage", ["cut", "gone", "garbled"])
def test_readers_say_a_published_object_is_missing_or_damaged_and_what_to_do(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str],
        damage: str) -> None:
    """Found by cutting a gpu_minute hour short and deleting a job_attempts hour: query and
    report printed DuckDB's "No files found that match the pattern …" or "No magic bytes
    found at end of file …", diagnose Polars' "No such file or directory (os error 2):
    ...g/facts/… (set POLARS_VERBOSE=1 to see full path)": the file, but not what to do.
    whatif said DuckDB's "Invalid Input Error: File '…' too small to be a Parquet file"."""
    from gpuledger.cli.main import main

    root = _process(tmp_path / "wh")
    table = "gpu_minute" if command[0] == "diagnose" else "job_attempts"
    victim = _object(root, table)
    whole = victim.read_bytes()
    if damage == "cut":
        victim.write_bytes(whole[:1000])
    elif damage == "gone":
        victim.unlink()
    else:  # the same size, not Parquet
        victim.write_bytes(b"x" * len(whole))
    # what repairs it: a run of the whole history puts a missing object, or a damaged one
    # of a table each hour replaces whole, again (test above; its hour alone is refused
    # as older than the history's end); a merged table's (job_attempts) is read first
    repair = REPAIR_MERGED if table == "job_attempts" and damage != "gone" else REPAIR
    args = [word.format(table=table) for word in command]
    assert main([*args, "--warehouse", str(root)]) == 2
    out, err = capsys.readouterr()
    said = {
        "cut": f"{victim}: damaged: it holds 1000 bytes where the generation's manifest says "
               f"{len(whole)} (cut short or replaced since it was written); {repair}",
        "gone": f"{victim}: missing: the published generation names this object, but the "
                f"store has none; {repair}",
        "garbled": f"{victim}: damaged: the published generation names this object, but it "
                   f"is not a readable Parquet file; {repair}",
    }[damage]
    assert err.endswith(f"gpuledger: error: {said}\n"), err
    assert err.count("\n") == 1 and out == "", err


@pytest.mark.parametrize("command", [["query", "select 1"], ["report"], ["compact"],
                                     ["diagnose"]])
def test_a_warehouse_path_that_is_a_file_is_said_alike_by_every_reader(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str]) -> None:
    """query and report said "not a gpuledger warehouse (nothing published yet)" where
    compact and diagnose said "a file, not a warehouse folder"."""
    from gpuledger.cli.main import main

    afile = tmp_path / "wh"
    afile.write_text("not a warehouse")
    assert main([*command, "--quiet", "--warehouse", str(afile)] if command[0] != "query"
                else [*command, "--warehouse", str(afile)]) == 2
    assert capsys.readouterr().err == f"gpuledger: error: {afile}: a file, not a warehouse " \
                                      "folder\n"


@pytest.mark.parametrize("command", [
    ["query", "--format", "csv", "select count(*) from gpu_minute"],
    ["report", "--quiet"],
    ["whatif", "--quiet"],
    ["diagnose", "--quiet", "--dry-run"],
])
@pytest.mark.parametrize("gone", ["manifests", "the unit's manifests"])
def test_facts_no_manifest_names_are_refused_never_an_empty_warehouse(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str],
        gone: str) -> None:
    """Found with `rm W/manifests/warehouse/*.json` (or `rm -r W/manifests`): query
    answered 0 rows and report "no data in this window", exit 0, while facts/ held every
    data object. Every reader refuses it in one line now."""
    import shutil

    from gpuledger.cli.main import main

    root = _process(tmp_path / "wh")
    if gone == "manifests":
        shutil.rmtree(root / "manifests")
    else:
        for manifest in (root / "manifests" / "warehouse").glob("*.json"):
            manifest.unlink()
    assert main([*command, "--warehouse", str(root)]) == 2
    out, err = capsys.readouterr()
    assert err == (f"gpuledger: error: {root}: the facts are there but no manifest names "
                   f"them ({root}/manifests/ deleted?): restore manifests/ from a backup, or "
                   "ingest the whole history again into a new warehouse\n"), err
    assert out == ""


def test_facts_uploaded_ahead_of_a_units_first_manifest_are_nothing_published_yet(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Found by a reader looping beside a first ingest on a loaded machine: between the
    first uploads and the unit's first manifest, readers stopped with "the facts are
    there but no manifest names them (manifests/ deleted?)". The writer's ``started``
    object says a first commit is under way; it goes with that commit, so manifests
    deleted later are still refused (the test above)."""
    import time

    from gpuledger.cli.main import main
    from gpuledger.pipeline.warehouse import open_snapshot

    root = tmp_path / "wh"
    publisher = Publisher(open_store(root), 3600)
    obj = publisher.put("warehouse", LOGICAL, b"PAR1 not yet named by any manifest")
    deadline = time.monotonic() + 30
    while not (root / obj).exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert (root / obj).exists() and (root / "manifests/warehouse/started").exists()
    assert open_snapshot(root)[1].generations == {}
    assert main(["query", "--format", "csv", "select 1 AS n", "--warehouse", str(root)]) == 2
    assert "nothing published yet" in capsys.readouterr().err
    publisher.commit(wait=True)
    publisher.close()
    assert open_snapshot(root)[1].generations == {"warehouse": 1}
    assert not (root / "manifests/warehouse/started").exists()


def test_a_warehouse_of_schema_files_alone_is_read_as_empty(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The listing looks past the tables' schema files: a warehouse with nothing
    published but them is read as before (empty tables), not refused."""
    from gpuledger.cli.main import main

    root = _process(tmp_path / "wh")
    for path in sorted((root / "facts").rglob("*"), reverse=True):
        if path.is_file() and path.name != "_schema.parquet":
            path.unlink()
    import shutil
    shutil.rmtree(root / "manifests")
    assert main(["query", "--format", "csv", "select count(*) AS n from gpu_minute",
                 "--warehouse", str(root)]) == 0
    assert capsys.readouterr().out == "n\n0\n"


def test_a_damaged_object_a_run_merges_into_is_one_line_with_what_works(
        tmp_path: Path) -> None:
    """A helper garbled a job_attempts hour (a merged table) and processed the hour
    again: the writer reads that object to merge rows into it, and stopped with Polars'
    ComputeError traceback. Now a StoreError (one line at the command) names it and
    says what works: a new warehouse."""
    from gpuledger.pipeline.store import StoreError
    from gpuledger.pipeline.warehouse import REPAIR_MERGED

    root = _process(tmp_path / "wh")
    garbled = _object(root, "job_attempts")
    garbled.write_bytes(b"\0" * garbled.stat().st_size)   # its size, not Parquet
    with pytest.raises(StoreError) as caught:
        _process(root)
    message = str(caught.value)
    assert message.startswith(f"{root}/facts/job_attempts/date=2026-01-05/job_attempts-"
                              "2026-01-05T10") and "not a readable Parquet file" in message
    assert message.endswith(REPAIR_MERGED) and "\n" not in message


def test_a_newer_manifest_listed_and_not_read_sends_the_reader_to_a_new_listing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A reader never takes an older generation than the newest it listed without listing
    again: a newer manifest that reads as not there (pruned after two newer ones were
    written, or a store's passing 404) means the unit has moved on. It took generation 3
    while 5 was there; an S3 reader in CI once went back three generations."""
    from gpuledger.pipeline.generations import Manifest, manifest_path

    store = open_store(tmp_path)
    for gen in (3, 4):
        store.write(manifest_path("warehouse", gen), Manifest("warehouse", gen).to_bytes())
    read = Store.read
    misses = {manifest_path("warehouse", 4): 1}

    def passing_404(self: Store, path: str) -> bytes | None:
        if misses.get(path):
            misses[path] -= 1   # the first read of generation 4: not there; then 5 is
            store.write(manifest_path("warehouse", 5), Manifest("warehouse", 5).to_bytes())
            return None
        return read(self, path)
    monkeypatch.setattr(Store, "read", passing_404)
    assert read_manifests(store)["warehouse"].generation == 5
