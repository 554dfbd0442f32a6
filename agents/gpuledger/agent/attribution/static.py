"""Device → job from configuration or an environment variable.

For nodes given whole to one job (an agent started inside a job allocation, a
dedicated inference box), or a fixed split: ``job_id`` names the job of every GPU,
``gpus`` maps GPU index or UUID to a job (and wins over ``job_id``), and ``env`` names
an environment variable of the agent whose value, when set and not empty, is the job
of every GPU (for example ``SLURM_JOB_ID`` when the agent runs as a job step); a value
that is not a valid job id is ignored with a warning.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

from gpuledger.agent.attribution import Method, Record, job_id_problem

log = logging.getLogger("gpuledger.agent.attribution.static")


class StaticAttribution(Method):
    """Fixed jobs per node or per GPU."""

    name = "static"

    def __init__(self, job_id: str | None = None, gpus: Mapping[str, str] | None = None,
                 env: str | None = None, environ: Mapping[str, str] | None = None) -> None:
        from_env = (environ if environ is not None else os.environ).get(env) if env else None
        problem = job_id_problem(from_env) if from_env else None
        if problem:
            log.warning("attribution.static.env: ignoring $%s: %s", env, problem)
            from_env = None
        self.job_id = from_env or job_id
        self.gpus = {str(k): str(v) for k, v in (gpus or {}).items()}

    def device_jobs(self, record: Record) -> list[str]:
        for key in (str(record.get("gpu_uuid")), str(record.get("gpu_index"))):
            if key in self.gpus:
                return [self.gpus[key]]
        return [self.job_id] if self.job_id else []
