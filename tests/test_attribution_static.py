"""Fixed jobs from configuration or the agent's environment."""

from __future__ import annotations

from typing import Any

from gpuledger.agent.attribution import Chain
from gpuledger.agent.attribution.static import StaticAttribution


def _records() -> list[dict[str, Any]]:
    return [{"gpu_index": i, "gpu_uuid": f"GPU-{i}", "mig_instance": None,
             "processes": [{"pid": 10 + i, "used_mib": 5.0, "job_id": None}] if i < 2 else []}
            for i in range(4)]


def test_node_job_per_gpu_overrides_and_env() -> None:
    records = _records()
    method = StaticAttribution(job_id="node-job", gpus={"1": "gpu1-job", "GPU-3": "uuid-job"})
    Chain([method]).apply(records)
    assert [[p["job_id"] for p in r["processes"]] for r in records] == [
        ["node-job"], ["gpu1-job"], ["node-job"], ["uuid-job"]]
    env = StaticAttribution(job_id="fallback", env="SLURM_JOB_ID",
                            environ={"SLURM_JOB_ID": "991"})
    assert env.device_jobs(_records()[0]) == ["991"]
    unset = StaticAttribution(job_id=None, env="SLURM_JOB_ID", environ={})
    assert unset.device_jobs(_records()[0]) == []


def test_an_invalid_job_id_in_the_environment_is_ignored() -> None:
    for bad in ("   ", "9\x0091", "x" * 300):
        env = StaticAttribution(job_id="fallback", env="SLURM_JOB_ID",
                                environ={"SLURM_JOB_ID": bad})
        assert env.device_jobs(_records()[0]) == ["fallback"]
