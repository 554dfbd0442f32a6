"""Slurm attribution on process trees and cgroup folders built in a temporary root."""

from __future__ import annotations

from pathlib import Path

from proctree import add_process, v1_lines

from gpuledger.agent.attribution import Chain
from gpuledger.agent.attribution.procfs import Procfs
from gpuledger.agent.attribution.slurm import SlurmAttribution, job_from_cgroups

V2 = "0::/system.slice/slurmstepd.scope/job_{}/step_0/user/task_0"


def _record(index: int, pids: list[int]) -> dict[str, object]:
    return {"gpu_index": index, "gpu_uuid": f"GPU-{index}", "mig_instance": None,
            "processes": [{"pid": p, "used_mib": 100.0 * (n + 1), "job_id": None}
                          for n, p in enumerate(pids)]}


def test_cgroup_paths_of_both_versions() -> None:
    assert job_from_cgroups(["/slurm/uid_1000/job_4242/step_0/task_0"]) == "4242"
    assert job_from_cgroups([V2.format(77)]) == "77"
    assert job_from_cgroups(["/system.slice/slurmstepd.scope/job_9"]) == "9"
    assert job_from_cgroups(["/user.slice/user-1000.slice/session-3.scope"]) is None
    assert job_from_cgroups(["/slurm/uid_1000/job_12x/step_0"]) is None


def test_processes_of_two_jobs_env_and_children(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    add_process(proc, 1, 0)
    # job 101 on cgroup v1: batch script → python (GPU 0)
    add_process(proc, 500, 1, cgroup=v1_lines("/slurm/uid_1000/job_101/step_batch/task_0"))
    add_process(proc, 501, 500, cgroup=v1_lines("/slurm/uid_1000/job_101/step_batch/task_0"))
    # job 202 on cgroup v2 (GPU 1)
    add_process(proc, 600, 1, cgroup=V2.format(202))
    # job 303 known only from the environment; its child cleared the environment
    add_process(proc, 700, 1, cgroup="0::/user.slice", environ={"SLURM_JOB_ID": "303"})
    add_process(proc, 701, 700, cgroup="0::/user.slice", environ={"PATH": "/bin"})
    # a process outside Slurm
    add_process(proc, 800, 1, cgroup="0::/user.slice/user-1000.slice/session-3.scope")
    method = SlurmAttribution(Procfs(proc), job_id="slurm-{id}")
    records = [_record(0, [501]), _record(1, [600]), _record(2, [701, 800])]
    Chain([method]).apply(records)
    jobs = [[p["job_id"] for p in r["processes"]] for r in records]  # type: ignore[attr-defined]
    assert jobs == [["slurm-101"], ["slurm-202"], ["slurm-303", None]]


def test_walk_depth_limits_the_search(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    add_process(proc, 1, 0)
    add_process(proc, 10, 1, environ={"SLURM_JOB_ID": "55"})
    for pid in range(11, 15):
        add_process(proc, pid, pid - 1)
    deep = SlurmAttribution(Procfs(proc), walk_parents=8)
    shallow = SlurmAttribution(Procfs(proc), walk_parents=2)
    assert deep.process_job(14, {}) == "55"
    assert shallow.process_job(14, {}) is None


def test_idle_gpus_from_v1_device_cgroups(tmp_path: Path) -> None:
    cg = tmp_path / "cgroup" / "devices" / "slurm" / "uid_1000"
    allowed = {"job_31": [2, 3], "job_32": [5]}
    for job, minors in allowed.items():
        (cg / job / "step_0").mkdir(parents=True)
        lines = ["c 195:255 rwm", "c 243:0 rwm"] + [f"c 195:{m} rwm" for m in minors]
        (cg / job / "devices.list").write_text("\n".join(lines) + "\n")
        (cg / job / "step_0" / "devices.list").write_text("c 195:7 rwm\n")  # steps ignored
    (tmp_path / "cgroup" / "devices" / "devices.list").write_text("a *:* rwm\n")
    method = SlurmAttribution(Procfs(tmp_path / "proc"), cgroup_root=tmp_path / "cgroup")
    records = [_record(i, []) for i in range(8)]
    Chain([method]).apply(records)
    held = {r["gpu_index"]: [p["job_id"] for p in r["processes"]]  # type: ignore[attr-defined]
            for r in records if r["processes"]}
    expected = {m: [job.removeprefix("job_")] for job, ms in allowed.items() for m in ms}
    assert held == expected
    assert all(p["pid"] == 0 for r in records for p in r["processes"])  # type: ignore[attr-defined]
