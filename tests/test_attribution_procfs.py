"""Reading processes from a proc root built in a temporary folder."""

from __future__ import annotations

from pathlib import Path

from proctree import add_process, v1_lines

from gpuledger.agent.attribution.procfs import Procfs


def test_cgroups_environ_and_parent(tmp_path: Path) -> None:
    add_process(tmp_path, 1, 0, comm="systemd")
    add_process(tmp_path, 700, 1, comm="tricky) name (x", cgroup=v1_lines("/a/b"),
                environ={"A": "1", "EMPTY": "", "WITH=EQUALS": "x=y"})
    procfs = Procfs(tmp_path)
    assert procfs.cgroups(700) == ["/a/b", "/a/b", "/a/b", "/a/b", "/"]
    env = procfs.environ(700)
    assert env["A"] == "1" and env["EMPTY"] == ""
    assert env["WITH"] == "EQUALS=x=y"   # the first '=' splits, as the kernel's readers do
    assert procfs.parent(700) == 1


def test_ancestry_stops_at_init_at_depth_and_at_gone_processes(tmp_path: Path) -> None:
    add_process(tmp_path, 1, 0)
    for pid, ppid in ((10, 1), (20, 10), (30, 20), (40, 30)):
        add_process(tmp_path, pid, ppid)
    procfs = Procfs(tmp_path)
    assert procfs.ancestry(40, 8) == [40, 30, 20, 10]
    assert procfs.ancestry(40, 2) == [40, 30, 20]
    add_process(tmp_path, 50, 999)                  # parent already exited
    assert procfs.ancestry(50, 8) == [50]


def test_a_gone_process_reads_as_empty(tmp_path: Path) -> None:
    procfs = Procfs(tmp_path)
    assert procfs.cgroups(4242) == [] and procfs.environ(4242) == {}
    assert procfs.parent(4242) is None
