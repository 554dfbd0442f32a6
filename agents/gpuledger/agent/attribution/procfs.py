"""Reading processes from a proc root: cgroup paths, environment, parent.

Every attribution method reads ``/proc`` through a :class:`Procfs` rooted at a
configurable folder, so tests build process trees in a temporary folder and an agent
in a container reads the host's ``/proc`` mounted anywhere. A process that has gone
(or that the agent may not read) reads as empty, never as an error: processes come
and go between the driver's answer and the attribution.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Procfs:
    """Read-only access to ``<root>/<pid>/{cgroup,environ,stat}``."""

    root: Path = Path("/proc")

    def cgroups(self, pid: int) -> list[str]:
        """The cgroup paths of ``pid`` (one per hierarchy; v2 has one)."""
        try:
            text = (self.root / str(pid) / "cgroup").read_text(errors="replace")
        except OSError:
            return []
        paths = []
        for line in text.splitlines():
            parts = line.split(":", 2)
            if len(parts) == 3 and parts[2]:
                paths.append(parts[2])
        return paths

    def environ(self, pid: int) -> dict[str, str]:
        """The environment ``pid`` started with (``NAME=value`` separated by NUL)."""
        try:
            data = (self.root / str(pid) / "environ").read_bytes()
        except OSError:
            return {}
        env: dict[str, str] = {}
        for item in data.split(b"\0"):
            name, sep, value = item.partition(b"=")
            if sep and name:
                env[name.decode(errors="replace")] = value.decode(errors="replace")
        return env

    def parent(self, pid: int) -> int | None:
        """The parent pid, from ``stat`` (field 4, after the parenthesised command)."""
        try:
            text = (self.root / str(pid) / "stat").read_text(errors="replace")
        except OSError:
            return None
        fields = text[text.rfind(")") + 1:].split()
        if len(fields) < 2 or not fields[1].isdigit():
            return None
        ppid = int(fields[1])
        return ppid if ppid > 0 else None

    def ancestry(self, pid: int, depth: int) -> list[int]:
        """``pid`` and up to ``depth`` of its living ancestors, nearest first (not pid 1)."""
        chain = [pid]
        current: int | None = pid
        while len(chain) <= depth:
            current = self.parent(current) if current is not None else None
            if (current is None or current in chain or current <= 1
                    or not (self.root / str(current)).is_dir()):
                break
            chain.append(current)
        return chain
