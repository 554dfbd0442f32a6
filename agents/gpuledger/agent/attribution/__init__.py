"""Job attribution: which scheduler job each GPU process (and each GPU) belongs to.

Methods, one module each, chosen and ordered by configuration:

- :mod:`.slurm` — a process's Slurm job from its cgroup path (``.../job_<id>/...``) or
  ``SLURM_JOB_ID`` in its environment, walking up its parents; GPUs held by a job
  without a process from the job cgroup's ``devices.list`` (cgroup v1).
- :mod:`.kubernetes` — a process's pod from its cgroup path (cgroupfs and systemd
  drivers, cgroup v1 and v2), and device → pod from the kubelet pod-resources API
  (:mod:`.podresources`).
- :mod:`.mapping_dir` — device → job from files in dcgm-exporter's ``hpc_job`` style.
- :mod:`.static` — one job for the node, or per GPU, from configuration or an
  environment variable.

:class:`Chain` applies them to the telemetry records of one collection (see its doc).
"""

from __future__ import annotations

from typing import Any

Record = dict[str, Any]

MAX_JOB_ID = 256
"""The longest job id the agent reports (characters)."""


def job_id_problem(job_id: str) -> str | None:
    """Why ``job_id`` cannot be a job id, or None when it can.

    A job id is not blank, at most :data:`MAX_JOB_ID` characters, and printable (no
    control characters, NUL, line breaks or tabs): the contract's ``job_id`` is a
    non-empty string (docs/events.md) and ids are compared with the scheduler's.
    """
    if not job_id.strip():
        return "a job id must not be empty or blank"
    if len(job_id) > MAX_JOB_ID:
        return f"a job id is at most {MAX_JOB_ID} characters (this one has {len(job_id)})"
    if not job_id.isprintable():
        return "a job id must not hold control characters (tab, line break, NUL, ...)"
    return None


class Method:
    """One attribution method. Subclasses override what they can answer."""

    name = "method"
    errors = 0
    """Failed look-ups so far (exposed as a self-metric)."""

    def begin_cycle(self) -> None:
        """Called once per collection, before any question (refresh caches here)."""

    def process_job(self, pid: int, record: Record) -> str | None:
        """The job of process ``pid`` running on the GPU of ``record``, if known."""
        return None

    def device_jobs(self, record: Record) -> list[str]:
        """Jobs that hold the GPU (or MIG instance) of ``record``, if known."""
        return []

    def close(self) -> None:
        """Release what the method holds (channels, files)."""


class Chain:
    """Applies methods in order to a collection's records, in place.

    For each record (one GPU or MIG instance):

    1. every process without a job asks the methods in order; the first answer wins;
    2. the first method that names the jobs holding the device gives the *device jobs*;
       a process still without a job gets the device's job when exactly one job holds
       it (with several, the process stays unattributed rather than guessed);
    3. a GPU with no process keeps its empty list — unless the device jobs are known,
       then it gets one entry per job with ``pid`` 0 and ``used_mib`` 0, as
       dcgm-exporter's source does for its ``hpc_job``/``pod`` labels.

    A record whose ``processes`` is missing (not collected) is left alone. Methods that
    fail are logged by the caller's metrics, never raised into the collection.
    """

    def __init__(self, methods: list[Method]) -> None:
        self.methods = methods

    def apply(self, records: list[Record]) -> None:
        for method in self.methods:
            method.begin_cycle()
        for record in records:
            processes = record.get("processes")
            if processes is None:
                continue
            device_jobs: list[str] = []
            for method in self.methods:
                device_jobs = method.device_jobs(record)
                if device_jobs:
                    break
            for proc in processes:
                if proc.get("job_id"):
                    continue
                job = None
                for method in self.methods:
                    job = method.process_job(int(proc.get("pid") or 0), record)
                    if job:
                        break
                if not job and len(device_jobs) == 1:
                    job = device_jobs[0]
                proc["job_id"] = job or None
            if not processes and device_jobs:
                record["processes"] = [{"pid": 0, "used_mib": 0.0, "job_id": job}
                                       for job in device_jobs]

    def close(self) -> None:
        for method in self.methods:
            method.close()


def mig_gi(record: Record) -> str | None:
    """The GPU instance id of a MIG record (``mig_instance`` is ``profile/GI``)."""
    mig = record.get("mig_instance")
    if not mig:
        return None
    return str(mig).rpartition("/")[2] or None
