"""Retired objects are listed in a log per commit, not in every manifest: a manifest
names what is current only, so its size does not grow with the run; what a commit
replaced is deleted ``retain_s`` later, by this writer or by the next one."""

from __future__ import annotations

import json
from pathlib import Path

from gpuledger.pipeline.compaction import orphans
from gpuledger.pipeline.generations import (
    Manifest,
    Publisher,
    manifest_path,
    read_manifests,
    read_retired,
    retired_objects,
)
from gpuledger.pipeline.store import open_store

LOGICAL = "facts/gpu_minute/date=2026-01-01/gpu_minute-2026-01-01T{h:02d}.parquet"


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def _on_disk(root: Path, under: str) -> set[str]:
    return {p.relative_to(root).as_posix() for p in (root / under).rglob("*") if p.is_file()}


def test_manifests_name_the_current_files_only_and_logs_go_when_done(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    clock = Clock()
    pub = Publisher(store, retain_s=100, clock=clock)
    first = pub.put("warehouse", LOGICAL.format(h=0), b"one")
    pub.commit(wait=True)
    sizes = []
    replaced = [first]
    for i in range(2, 60):   # the same part replaced 58 times, a second apart
        clock.now += 1
        replaced.append(pub.put("warehouse", LOGICAL.format(h=0), f"v{i}".encode()))
        pub.commit(wait=True)
        sizes.append(len(store.read(manifest_path("warehouse", pub.manifests[
            "warehouse"].generation)) or b""))
    current = replaced.pop()
    assert max(sizes) - min(sizes) <= 4   # the same size (but the digits): no retired list
    manifest = read_manifests(store)["warehouse"]
    assert manifest.files == {LOGICAL.format(h=0): current} and not manifest.retired
    # each replaced object is listed once, in the log of the commit that replaced it
    logs = read_retired(store)
    assert [o for log in logs for o in log.objects] == replaced
    assert retired_objects(store) == set(replaced)
    assert all((tmp_path / o).exists() for o in replaced)   # a reader may be on them
    # 100 s after the first replacement, the objects retired by then go, with their logs
    clock.now = 1_000_000.0 + 1 + 100 + 10
    pub.put("warehouse", LOGICAL.format(h=1), b"other")
    pub.commit(wait=True)
    gone = [o for o in replaced if not (tmp_path / o).exists()]
    assert gone == replaced[:11]
    assert retired_objects(store) == set(replaced[11:])
    assert len(read_retired(store)) == len(replaced) - 11
    pub.close()


def test_a_new_writer_goes_on_deleting_and_keeps_what_is_named_again(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    clock = Clock()
    pub = Publisher(store, retain_s=100, clock=clock)
    a = pub.put("p001", LOGICAL.format(h=0), b"a")
    pub.commit(wait=True)
    clock.now += 1
    b = pub.put("p001", LOGICAL.format(h=0), b"b")     # a retired
    pub.commit(wait=True)
    pub.close()
    # a restart (or the partition's next holder): the log is read, and a is named again
    clock.now += 1
    again = Publisher(store, retain_s=100, clock=clock)
    assert again.put("p001", LOGICAL.format(h=0), b"a") == a   # same bytes, same object
    again.commit(wait=True)                                     # b retired now
    clock.now += 200
    again.put("p001", LOGICAL.format(h=1), b"x")
    again.commit(wait=True)
    assert (tmp_path / a).exists() and not (tmp_path / b).exists()
    assert read_retired(store) == [] and retired_objects(store) == set()
    again.close()


def test_a_manifest_of_the_earlier_version_has_its_retired_objects_moved_to_a_log(
        tmp_path: Path) -> None:
    store = open_store(tmp_path)
    old_obj = "facts/gpu_minute/date=2026-01-01/gpu_minute-2026-01-01T00.0123456789abcdef.parquet"
    store.write(old_obj, b"old")
    cur = "facts/gpu_minute/date=2026-01-01/gpu_minute-2026-01-01T00.fedcba9876543210.parquet"
    store.write(cur, b"cur")
    store.write(manifest_path("warehouse", 7), Manifest(
        "warehouse", 7, {LOGICAL.format(h=0): cur}, {old_obj: 999_950.0}, 999_950.0,
        {cur: 3}).to_bytes())
    assert retired_objects(store) == {old_obj}
    # compaction's orphan sweep leaves it alone (a reader may still be on generation 6)
    assert old_obj not in orphans(store, read_manifests(store).values(), 2e9)
    clock = Clock()
    pub = Publisher(store, retain_s=100, clock=clock)
    pub.put("warehouse", LOGICAL.format(h=1), b"new")
    pub.commit(wait=True)
    newest = json.loads(store.read(manifest_path("warehouse", 8)) or b"{}")
    assert newest["retired"] == {}
    assert [log.objects for log in read_retired(store)] == [{old_obj: 999_950.0}]
    assert (tmp_path / old_obj).exists()
    clock.now += 100
    pub.put("warehouse", LOGICAL.format(h=2), b"newer")
    pub.commit(wait=True)
    assert not (tmp_path / old_obj).exists() and read_retired(store) == []
    pub.close()
