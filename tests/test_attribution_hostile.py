"""Attribution on hostile input: job ids from process environments, odd mapping files."""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import Any

import pytest
from proctree import add_process

from gpuledger.agent.attribution import Chain
from gpuledger.agent.attribution.mapping_dir import MappingDirAttribution
from gpuledger.agent.attribution.procfs import Procfs
from gpuledger.agent.attribution.slurm import SlurmAttribution


def _record(index: int, pids: list[int]) -> dict[str, Any]:
    return {"gpu_index": index, "gpu_uuid": f"GPU-{index}", "mig_instance": None,
            "processes": [{"pid": p, "used_mib": 1.0, "job_id": None} for p in pids]}


def test_invalid_slurm_job_ids_from_the_environment_are_not_charged(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    proc = tmp_path / "proc"
    add_process(proc, 1, 0)
    outside = "0::/user.slice/user-1000.slice/session-3.scope"
    add_process(proc, 100, 1, cgroup=outside, environ={"SLURM_JOB_ID": "4242"})
    add_process(proc, 200, 1, cgroup=outside, environ={"SLURM_JOB_ID": "4242\n"})
    add_process(proc, 300, 1, cgroup=outside, environ={"SLURM_JOB_ID": "9" * 400})
    add_process(proc, 400, 1, cgroup=outside, environ={"SLURM_JOB_ID": "42\t1"})
    # a child with a broken id of its own is not charged to its parent's job either
    add_process(proc, 501, 100, cgroup=outside, environ={"SLURM_JOB_ID": "x\x1by"})
    # "slurm-" + 251 digits is 257 characters: the template's result is checked
    add_process(proc, 600, 1, cgroup=outside, environ={"SLURM_JOB_ID": "7" * 251})
    method = SlurmAttribution(Procfs(proc), job_id="slurm-{id}")
    with caplog.at_level(logging.WARNING):
        for _ in range(2):
            records = [_record(0, [100, 200, 300, 400, 501, 600])]
            Chain([method]).apply(records)
    jobs = {p["pid"]: p["job_id"] for p in records[0]["processes"]}
    assert jobs == {100: "slurm-4242", 200: None, 300: None, 400: None, 501: None, 600: None}
    assert method.errors == 10                    # 5 per collection
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 5                        # one warning per distinct value
    assert all("\n" not in m and len(m) < 400 for m in lines)
    assert any("at most 256 characters" in m for m in lines)


def test_an_impossible_job_in_a_device_cgroup_is_skipped(tmp_path: Path) -> None:
    cg = tmp_path / "cgroup" / "devices" / "slurm" / "uid_1000"
    # "slurm-" + 251 digits: 257 characters (the longest name a folder may have is 255)
    for job, minor in (("job_31", 2), ("job_" + "3" * 251, 3)):
        (cg / job).mkdir(parents=True)
        (cg / job / "devices.list").write_text(f"c 195:{minor} rwm\n")
    method = SlurmAttribution(Procfs(tmp_path / "proc"), cgroup_root=tmp_path / "cgroup",
                              job_id="slurm-{id}")
    records = [_record(i, []) for i in range(4)]
    Chain([method]).apply(records)
    assert [r["processes"] for r in records] == [
        [], [], [{"pid": 0, "used_mib": 0.0, "job_id": "slurm-31"}], []]
    assert method.errors == 1


def test_a_fifo_or_device_in_the_mapping_folder_is_skipped_not_waited_for(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    folder = tmp_path / "jobs"
    folder.mkdir()
    (folder / "0").write_text("4242\n")
    os.mkfifo(folder / "1")
    (folder / "2").symlink_to("/dev/null")        # a character device
    (folder / "3").mkdir()
    (folder / "4").symlink_to(folder / "0")       # a link to a regular file is read
    method = MappingDirAttribution(folder)
    results: list[list[dict[str, Any]]] = []

    def cycles() -> None:
        for _ in range(2):
            records = [_record(i, []) for i in range(5)]
            Chain([method]).apply(records)
            results.append(records)

    with caplog.at_level(logging.WARNING):
        worker = threading.Thread(target=cycles, daemon=True)
        worker.start()
        worker.join(5)
        blocked = worker.is_alive()
        if blocked:                               # let the old code's open() return
            os.close(os.open(folder / "1", os.O_WRONLY | os.O_NONBLOCK))
            worker.join(5)
    assert not blocked, "the collection blocked on a FIFO"
    held = [[p["job_id"] for p in r["processes"]] for r in results[-1]]
    assert held == [["4242"], [], [], [], ["4242"]]
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3 and method.errors == 3  # once each, not per collection
    assert any("1 skipped" in m and "a FIFO, not a regular file" in m for m in lines)
    assert any("2 skipped" in m and "a character device" in m for m in lines)
    assert any("3 skipped" in m and "a folder" in m for m in lines)
