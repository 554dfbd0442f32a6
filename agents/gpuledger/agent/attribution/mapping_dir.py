"""Device → job from a mapping directory in dcgm-exporter's ``hpc_job`` style.

dcgm-exporter's HPC job mapping (``--hpc-job-mapping-dir`` / ``DCGM_HPC_JOB_MAPPING_DIR``)
reads a folder that the workload manager's prolog and epilog keep up to date: one file
per GPU, named by the GPU's index (``0``, ``1``, ...), or ``<gpu>.<gpu instance>`` for a
MIG instance (``2.0``), holding the ids of the jobs on it, one per line; an empty or
missing file means no job. The same folder can serve dcgm-exporter and this agent.
Files named by GPU UUID (``GPU-...`` / ``MIG-...``) are read too. A file that is not
UTF-8, larger than 64 KiB, or holds an id that is not a valid job id (blank, control
characters, over 256 characters) is skipped with one warning: no job rather than an
invented one. Only regular files (or links to them) are read, opened non-blocking: a
FIFO, socket, device or folder in the folder is skipped with one warning (a FIFO would
otherwise block the collection for good).
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

from gpuledger.agent.attribution import Method, Record, job_id_problem, mig_gi

log = logging.getLogger("gpuledger.agent.attribution.mapping_dir")

MAX_FILE_BYTES = 64 << 10
"""A mapping file larger than this is not a list of job ids."""


def _job_ids(data: bytes) -> tuple[list[str], str | None]:
    """The job ids of one file, or why the file is not a valid one."""
    if len(data) > MAX_FILE_BYTES:
        return [], f"larger than {MAX_FILE_BYTES} bytes"
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return [], f"not UTF-8 text (byte {exc.start})"
    ids = [line.strip() for line in text.splitlines() if line.strip()]
    for number, job in enumerate(ids, 1):
        problem = job_id_problem(job)
        if problem:
            return [], f"job {number}: {problem}"
    return ids, None


class _NotRegular(Exception):
    """A folder entry that is not a regular file (its kind is the message)."""


def _kind(mode: int) -> str:
    for test, word in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISDIR, "a folder"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device")):
        if test(mode):
            return word
    return "not a regular file"


def _read_regular(path: Path) -> bytes:
    """At most ``MAX_FILE_BYTES + 1`` bytes of ``path`` if it is a regular file (links
    followed); :class:`_NotRegular` otherwise. Checked before opening (a device is never
    opened) and again on the open file, which is opened non-blocking (a FIFO put in place
    between the two cannot block)."""
    mode = os.stat(path).st_mode
    if not stat.S_ISREG(mode):
        raise _NotRegular(f"{_kind(mode)}, not a regular file")
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    with os.fdopen(fd, "rb") as f:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise _NotRegular(f"{_kind(mode)}, not a regular file")
        return f.read(MAX_FILE_BYTES + 1)


class MappingDirAttribution(Method):
    """Reads the folder once per collection."""

    name = "mapping_dir"

    def __init__(self, path: Path) -> None:
        self.path = path
        self._jobs: dict[str, list[str]] = {}
        self._warned: dict[str, str] = {}
        """File name → the problem last warned about (each is said once, not per cycle)."""

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
        problems: dict[str, str] = {}
        for entry in entries:
            if entry.name.startswith("."):
                continue
            try:
                data = _read_regular(entry)
            except _NotRegular as exc:
                problems[entry.name] = str(exc)
                continue
            except OSError:
                continue          # removed by the epilog meanwhile, or unreadable
            ids, problem = _job_ids(data)
            if problem:
                problems[entry.name] = problem
            elif ids:
                jobs[entry.name] = ids
        for name, problem in problems.items():
            if self._warned.get(name) != problem:
                self.errors += 1
                log.warning("job mapping file %s skipped (no job attributed): %s",
                            self.path / name, problem)
        self._warned = problems
        self._jobs = jobs

    def device_jobs(self, record: Record) -> list[str]:
        gi = mig_gi(record)
        name = f"{record.get('gpu_index')}.{gi}" if gi is not None else str(
            record.get("gpu_index"))
        return list(self._jobs.get(name) or self._jobs.get(str(record.get("gpu_uuid")), []))
