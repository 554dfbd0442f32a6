"""Device → job from a mapping folder in dcgm-exporter's hpc_job style."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from gpuledger.agent.attribution import Chain
from gpuledger.agent.attribution.mapping_dir import MappingDirAttribution


def _records() -> list[dict[str, Any]]:
    def rec(i: int, pids: list[int], mig: str | None = None,
            uuid: str | None = None) -> dict[str, Any]:
        return {"gpu_index": i, "gpu_uuid": uuid or f"GPU-{i}", "mig_instance": mig,
                "processes": [{"pid": p, "used_mib": 1.0, "job_id": None} for p in pids]}
    return [rec(0, [11]), rec(1, []), rec(2, [], "1g.10gb/0", "MIG-a"),
            rec(2, [22], "1g.10gb/1", "MIG-b"), rec(3, [33]), rec(4, []), rec(5, []),
            rec(6, [], uuid="GPU-uuid-6")]


def test_files_by_index_mig_and_uuid(tmp_path: Path) -> None:
    folder = tmp_path / "jobs"
    folder.mkdir()
    files = {"0": "4242\n", "1": "4243\n", "2.0": "4244\n", "2.1": "4245\n",
             "3": "5001\n5002\n", "4": "", "5": "\n  \n", "GPU-uuid-6": "6006\n",
             ".hidden": "9\n"}
    for name, text in files.items():
        (folder / name).write_text(text)
    records = _records()
    Chain([MappingDirAttribution(folder)]).apply(records)
    got = [[(p["pid"], p["job_id"]) for p in r["processes"]] for r in records]
    assert got == [
        [(11, "4242")],                       # the process gets the GPU's job
        [(0, "4243")],                        # idle but held: pid 0
        [(0, "4244")],                        # MIG instance 2.0
        [(22, "4245")],                       # MIG instance 2.1
        [(33, None)],                         # two jobs share GPU 3: not guessed
        [],                                   # empty file: no job
        [],                                   # blank lines only: no job
        [(0, "6006")],                        # file named by UUID
    ]


def test_missing_folder_means_no_jobs_and_files_are_reread(tmp_path: Path) -> None:
    folder = tmp_path / "absent"
    method = MappingDirAttribution(folder)
    records = _records()
    Chain([method]).apply(records)
    assert records[1]["processes"] == [] and method.errors == 0
    folder.mkdir()
    (folder / "1").write_text("77\n")          # the prolog of a new job
    again = _records()
    Chain([method]).apply(again)
    assert again[1]["processes"] == [{"pid": 0, "used_mib": 0.0, "job_id": "77"}]
    (folder / "1").write_text("")              # its epilog
    third = _records()
    Chain([method]).apply(third)
    assert third[1]["processes"] == []


def test_files_with_invalid_ids_are_skipped_with_one_warning(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """No job rather than an invented one: not UTF-8, NUL, blank-looking, too long."""
    folder = tmp_path / "jobs"
    folder.mkdir()
    (folder / "0").write_bytes(b"\xff\xfe=\xff\n")
    (folder / "1").write_bytes(b"42\x00\n")
    (folder / "3").write_text("x" * 300_000)
    (folder / "4").write_text("a" * 257 + "\n")
    (folder / "5").write_text("4711\n")                     # a good one still counts
    method = MappingDirAttribution(folder)
    with caplog.at_level(logging.WARNING):
        records = _records()
        Chain([method]).apply(records)
        Chain([method]).apply(_records())                   # said once, not per cycle
    assert records[1]["processes"] == []
    assert records[0]["processes"] == [{"pid": 11, "used_mib": 1.0, "job_id": None}]
    assert records[4]["processes"] == [{"pid": 33, "used_mib": 1.0, "job_id": None}]
    assert records[5]["processes"] == []
    assert records[6]["processes"] == [{"pid": 0, "used_mib": 0.0, "job_id": "4711"}]
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 4 and method.errors == 4
    assert any("0 skipped (no job attributed): not UTF-8 text (byte 0)" in m for m in lines)
    assert any("1 skipped" in m and "control characters" in m for m in lines)
    assert any("3 skipped" in m and "larger than 65536 bytes" in m for m in lines)
    assert any("4 skipped" in m and "at most 256 characters" in m for m in lines)
    assert all("\n" not in m for m in lines)
    (folder / "0").write_text("4242\n")                     # fixed by the prolog
    fixed = _records()
    Chain([method]).apply(fixed)
    assert fixed[0]["processes"] == [{"pid": 11, "used_mib": 1.0, "job_id": "4242"}]
