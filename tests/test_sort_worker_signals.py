"""Compaction's sort child (``sort_worker.py``) ends quietly, with no traceback, when its
parent goes or a signal reaches it: real child processes, each wait bounded.

A sort is held in its middle by a part that is a FIFO no one writes: the child blocks
opening it. The child is ready once it has set SIGINT back to the default (after its
Polars import, before it reads its request); the signals are sent a little later.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import polars as pl
import pytest

from gpuledger.pipeline import sort_worker

pytestmark = pytest.mark.skipif(not Path("/proc/self/status").exists(),
                                reason="watches the child through /proc")
WAIT_S = 20.0


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}


def _request(out: Path, part: Path) -> bytes:
    return json.dumps({"out": str(out), "parts": [str(part)], "sort_by": ["a"],
                       "row_group_size": 10, "bucket_rows": 10}).encode() + b"\n"


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _wait_gone(pid: int) -> bool:
    deadline = time.monotonic() + WAIT_S
    while _alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.fixture
def fifo(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "part.parquet"
    os.mkfifo(path)
    yield path


def _catches_sigint(pid: int) -> bool:
    status = Path(f"/proc/{pid}/status").read_text()
    caught = next(line for line in status.splitlines() if line.startswith("SigCgt:"))
    return bool(int(caught.split()[1], 16) & (1 << (signal.SIGINT - 1)))


def _held(pid: int) -> None:
    """Wait until the child is ready (SIGINT caught by Python, then by no one), then a
    moment for it to read its request and block on the FIFO."""
    deadline = time.monotonic() + WAIT_S
    while not _catches_sigint(pid):
        assert time.monotonic() < deadline, "the child's Python never started"
        time.sleep(0.01)
    while _catches_sigint(pid):
        assert time.monotonic() < deadline, "the child still catches SIGINT"
        time.sleep(0.01)
    time.sleep(0.5)


def _kill(pid: int | None) -> None:
    if pid is not None and _alive(pid):
        os.kill(pid, signal.SIGKILL)


def test_the_child_ends_when_its_parent_is_killed_in_the_middle_of_a_sort(
        tmp_path: Path, fifo: Path) -> None:
    parent_code = f"""
import threading, time
from pathlib import Path
from gpuledger.pipeline.sort_worker import SortWorker
w = SortWorker()
threading.Thread(target=w.sort_into, args=(Path({str(tmp_path / 'out')!r}),
                 [Path({str(fifo)!r})], ["a"], 10, 10), daemon=True).start()
while w.pid is None:
    time.sleep(0.01)
print(w.pid, flush=True)
time.sleep(600)
"""
    parent = subprocess.Popen([sys.executable, "-c", parent_code], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, env=_env())
    child: int | None = None
    try:
        assert parent.stdout is not None and parent.stderr is not None
        child = int(parent.stdout.readline())
        _held(child)
        parent.send_signal(signal.SIGTERM)  # killed: no handler, no finally
        parent.wait(timeout=WAIT_S)
        assert _wait_gone(child), "the child outlived its parent"
        err = parent.stderr.read().decode()  # the child's stderr too: it is closed now
        assert "Traceback" not in err and "Error" not in err, err
    finally:
        _kill(child)
        if parent.poll() is None:
            parent.kill()
        parent.wait()


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_ends_the_child_in_the_middle_of_a_sort_without_a_traceback(
        tmp_path: Path, fifo: Path, signum: int) -> None:
    child = subprocess.Popen([sys.executable, "-m", sort_worker.__name__],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, env=_env())
    try:
        assert child.stdin is not None
        child.stdin.write(_request(tmp_path / "out", fifo))
        child.stdin.flush()
        _held(child.pid)
        child.send_signal(signum)
        _, err = child.communicate(timeout=WAIT_S)
        assert child.returncode == -signum
        assert err.decode() == ""
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()


def test_a_reply_nobody_reads_ends_the_child_quietly(tmp_path: Path) -> None:
    child = subprocess.Popen([sys.executable, "-m", sort_worker.__name__],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, env=_env())
    try:
        assert child.stdin is not None and child.stdout is not None
        child.stdout.close()  # the parent stopped reading: the reply finds a broken pipe
        pl.DataFrame({"a": [2, 1]}).write_parquet(tmp_path / "part.parquet")
        child.stdin.write(_request(tmp_path / "out", tmp_path / "part.parquet"))
        child.stdin.flush()  # stdin stays open: the child must end by itself
        assert child.wait(timeout=WAIT_S) != 0
        assert child.stderr is not None
        err = child.stderr.read().decode()
        assert "Traceback" not in err and "BrokenPipe" not in err, err
    finally:
        if child.poll() is None:
            child.kill()
        child.wait()
        if child.stdin is not None:
            child.stdin.close()
