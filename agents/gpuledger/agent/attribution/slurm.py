"""Slurm: process → job from its cgroup or environment; idle GPU → job from cgroup v1.

Slurm's task/cgroup plugin puts every job step in a cgroup whose path names the job:

- cgroup v1: ``/slurm/uid_1000/job_4242/step_0/task_0`` (one line per hierarchy);
- cgroup v2: ``/system.slice/slurmstepd.scope/job_4242/step_batch/user/task_0``.

A process outside a job cgroup (e.g. ``proctrack/linuxproc``) is recognised by
``SLURM_JOB_ID`` in its environment. Its parents are tried too (up to ``walk_parents``
levels), for children that cleared their environment.

With ``ConstrainDevices=yes`` on cgroup v1, a job's ``devices`` cgroup lists the GPU
device files it may open (``c 195:<minor> rwm``); that names the job of an allocated
GPU that runs no process yet (minor number = GPU index, the usual ``/dev/nvidia<N>``
numbering). cgroup v2 constrains devices with eBPF programs, which a file cannot show.

A job id found this way is checked as every job id the agent reports
(:func:`~gpuledger.agent.attribution.job_id_problem`: not blank, no control characters, at
most 256 characters, after the template): a process whose ``SLURM_JOB_ID`` breaks the rule
(``4242\n``, 400 digits) is left unattributed — no job rather than a phantom one — and
the method's ``errors`` count it, with one warning per distinct value.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

from gpuledger.agent.attribution import Method, Record, job_id_problem
from gpuledger.agent.attribution.procfs import Procfs

JOB_IN_CGROUP = re.compile(r"/job_(\d+)(?:/|$)")
_DEVICE_LINE = re.compile(r"^c\s+195:(\d+)\s")
NVIDIA_CONTROL_MINORS = (254, 255)  # nvidia-modeset, nvidiactl
_MAX_WARNED = 1024

log = logging.getLogger("gpuledger.agent.attribution.slurm")


def job_from_cgroups(paths: list[str]) -> str | None:
    """The Slurm job id in a process's cgroup paths."""
    for path in paths:
        m = JOB_IN_CGROUP.search(path)
        if m:
            return m.group(1)
    return None


class SlurmAttribution(Method):
    """Slurm job ids, rendered through ``job_id`` (``{id}`` is the numeric id)."""

    name = "slurm"

    def __init__(self, procfs: Procfs, cgroup_root: Path | None = None,
                 job_id: str = "{id}", walk_parents: int = 8,
                 device_cgroups: bool = True) -> None:
        self.procfs = procfs
        self.cgroup_root = cgroup_root
        self.template = job_id
        self.walk_parents = walk_parents
        self.device_cgroups = device_cgroups
        self._devices: dict[int, list[str]] = {}
        self._warned: set[str] = set()

    def _render(self, raw: str) -> str | None:
        """The job id of Slurm's ``raw`` id, or None (counted, warned once) when the result
        is not a valid job id."""
        job = self.template.format(id=raw)
        problem = job_id_problem(job)
        if problem is None:
            return job
        self.errors += 1
        if raw not in self._warned and len(self._warned) < _MAX_WARNED:
            self._warned.add(raw)
            log.warning("Slurm job id %s skipped (no job attributed): %s",
                        ascii(raw[:64] + ("..." if len(raw) > 64 else "")), problem)
        return None

    def process_job(self, pid: int, record: Record) -> str | None:
        if pid <= 0:
            return None
        for ancestor in self.procfs.ancestry(pid, self.walk_parents):
            raw = job_from_cgroups(self.procfs.cgroups(ancestor))
            if raw is None:
                raw = self.procfs.environ(ancestor).get("SLURM_JOB_ID") or None
            if raw is not None:
                return self._render(raw)     # None for an invalid id: not walked past
        return None

    def begin_cycle(self) -> None:
        self._devices = self._scan_devices() if self.device_cgroups else {}

    def device_jobs(self, record: Record) -> list[str]:
        if record.get("mig_instance"):
            return []  # device files name whole GPUs
        return self._devices.get(int(record.get("gpu_index", -1)), [])

    def _scan_devices(self) -> dict[int, list[str]]:
        """GPU minor → jobs, from ``<cgroup_root>/devices/**/job_<id>/devices.list``."""
        out: dict[int, list[str]] = {}
        if self.cgroup_root is None:
            return out
        base = self.cgroup_root / "devices"
        if not base.is_dir():
            return out
        for listing in sorted(base.glob("**/job_*/devices.list")):
            m = JOB_IN_CGROUP.search("/" + listing.parent.relative_to(base).as_posix())
            if m is None or "/step_" in listing.parent.as_posix():
                continue
            try:
                lines = listing.read_text().splitlines()
            except OSError:
                continue
            job = self._render(m.group(1))
            if job is None:
                continue
            for line in lines:
                dm = _DEVICE_LINE.match(line.strip())
                if dm is None:
                    continue
                minor = int(dm.group(1))
                if minor in NVIDIA_CONTROL_MINORS:
                    continue
                jobs = out.setdefault(minor, [])
                if job not in jobs:
                    jobs.append(job)
        return out
