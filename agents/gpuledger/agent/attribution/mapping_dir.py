"""Device → job from a mapping directory in dcgm-exporter's ``hpc_job`` style.

dcgm-exporter's HPC job mapping (``--hpc-job-mapping-dir`` / ``DCGM_HPC_JOB_MAPPING_DIR``)
reads a folder that the workload manager's prolog and epilog keep up to date: one file
per GPU, named by the GPU's index (``0``, ``1``, ...), or ``<gpu>.<gpu instance>`` for a
MIG instance (``2.0``), holding the ids of the jobs on it, one per line; an empty or
missing file means no job. The same folder can serve dcgm-exporter and this agent.
Files named by GPU UUID (``GPU-...`` / ``MIG-...``) are read too.
"""

from __future__ import annotations

import logging
from pathlib import Path

from gpuledger.agent.attribution import Method, Record, mig_gi

log = logging.getLogger("gpuledger.agent.attribution.mapping_dir")


class MappingDirAttribution(Method):
    """Reads the folder once per collection."""

    name = "mapping_dir"

    def __init__(self, path: Path) -> None:
        self.path = path
        self._jobs: dict[str, list[str]] = {}

    def begin_cycle(self) -> None:
        jobs: dict[str, list[str]] = {}
        try:
            entries = list(self.path.iterdir())
        except FileNotFoundError:
            entries = []          # no job has started yet: the folder may not exist
        except OSError as exc:
            self.errors += 1
            log.warning("cannot read the job mapping folder %s: %s", self.path, exc)
            entries = []
        for entry in entries:
            if entry.name.startswith("."):
                continue
            try:
                text = entry.read_text(errors="replace")
            except OSError:
                continue          # a directory, or removed by the epilog meanwhile
            ids = [line.strip() for line in text.splitlines() if line.strip()]
            if ids:
                jobs[entry.name] = ids
        self._jobs = jobs

    def device_jobs(self, record: Record) -> list[str]:
        gi = mig_gi(record)
        name = f"{record.get('gpu_index')}.{gi}" if gi is not None else str(
            record.get("gpu_index"))
        return list(self._jobs.get(name) or self._jobs.get(str(record.get("gpu_uuid")), []))
