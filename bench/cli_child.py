"""A ``gpuledger`` command in a child process, measured (``os.wait4``): wall time, CPU
(user and system, with the processes it waited for, such as compaction's sort child),
the peak RSS of its largest process, the bytes it wrote to disk, its output. With a
``tree`` (a checkout) the child runs that checkout's code: its ``pipeline`` and
``agents`` folders go first on ``PYTHONPATH``, so that benchmarks compare trees side by
side on the same machine in the same minutes."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ChildRun:
    """What one run of the command took and said."""

    exit: int
    wall_s: float
    user_s: float
    sys_s: float
    peak_rss_mib: float
    written_mib: float
    stdout: str
    stderr: str

    @property
    def cpu_s(self) -> float:
        return self.user_s + self.sys_s


def run_cli(args: list[str], tree: Path | None = None) -> ChildRun:
    """``python -m gpuledger.cli.main ARGS`` in a child (the code of ``tree`` when given),
    its output kept in temporary files (a pipe left unread could stop it)."""
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(tree / "pipeline"), str(tree / "agents"),
                                             env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        child = subprocess.Popen([sys.executable, "-m", "gpuledger.cli.main", *args],
                                 env=env, stdout=out, stderr=err)
        _, status, usage = os.wait4(child.pid, 0)
        wall = time.perf_counter() - start
        out.seek(0)
        err.seek(0)
        return ChildRun(exit=os.waitstatus_to_exitcode(status), wall_s=wall,
                        user_s=usage.ru_utime, sys_s=usage.ru_stime,
                        peak_rss_mib=usage.ru_maxrss / 1024,
                        written_mib=usage.ru_oublock * 512 / 2**20,
                        stdout=out.read().decode(errors="replace"),
                        stderr=err.read().decode(errors="replace"))
