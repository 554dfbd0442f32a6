"""The chain: process answers first, then device jobs; order and precedence."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from proctree import add_process

from gpuledger.agent.attribution import Chain, Method, Record
from gpuledger.agent.attribution.procfs import Procfs
from gpuledger.agent.attribution.slurm import SlurmAttribution
from gpuledger.agent.attribution.static import StaticAttribution


class Counting(Method):
    name = "counting"

    def __init__(self) -> None:
        self.cycles = 0

    def begin_cycle(self) -> None:
        self.cycles += 1


def _rec(pids: list[int] | None, job: str | None = None) -> Record:
    procs = None if pids is None else [{"pid": p, "used_mib": 1.0, "job_id": job}
                                       for p in pids]
    return {"gpu_index": 0, "gpu_uuid": "GPU-0", "mig_instance": None, "processes": procs}


def test_process_answers_win_over_device_jobs(tmp_path: Path) -> None:
    add_process(tmp_path, 1, 0)
    add_process(tmp_path, 50, 1, cgroup="0::/system.slice/slurmstepd.scope/job_8/step_0")
    add_process(tmp_path, 60, 1, cgroup="0::/user.slice")
    counting = Counting()
    chain = Chain([counting, SlurmAttribution(Procfs(tmp_path), device_cgroups=False),
                   StaticAttribution(job_id="static-job")])
    records: list[dict[str, Any]] = [_rec([50, 60]), _rec(None), _rec([70], job="kept")]
    chain.apply(records)
    assert [p["job_id"] for p in records[0]["processes"]] == ["8", "static-job"]
    assert records[1]["processes"] is None            # not collected stays not collected
    assert records[2]["processes"][0]["job_id"] == "kept"   # the source's own answer stays
    chain.apply([_rec([])])
    assert counting.cycles == 2
