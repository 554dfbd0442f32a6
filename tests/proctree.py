"""Builds /proc-shaped process trees and cgroup folders in a temporary folder."""

from __future__ import annotations

from pathlib import Path


def add_process(proc: Path, pid: int, ppid: int, *, comm: str = "python",
                cgroup: str | list[str] = "0::/", environ: dict[str, str] | None = None
                ) -> None:
    """Write ``<proc>/<pid>/{stat,cgroup,environ}`` as the kernel formats them."""
    folder = proc / str(pid)
    folder.mkdir(parents=True, exist_ok=True)
    # comm may hold spaces and parentheses; the parent pid is the 2nd field after ')'
    (folder / "stat").write_text(f"{pid} ({comm}) S {ppid} {pid} {pid} 0 -1 4194560 0 0\n")
    lines = [cgroup] if isinstance(cgroup, str) else cgroup
    (folder / "cgroup").write_text("".join(line + "\n" for line in lines))
    env = environ or {}
    (folder / "environ").write_bytes(b"".join(f"{k}={v}".encode() + b"\0"
                                              for k, v in env.items()))


def v1_lines(path: str) -> list[str]:
    """A cgroup v1 process file: one line per hierarchy, all at ``path``."""
    return [f"12:devices:{path}", f"11:memory:{path}", f"4:cpu,cpuacct:{path}",
            f"1:name=systemd:{path}", "0::/"]
