"""Compaction's sorts in a child process of their own, started for one round of
compaction and ended with it.

A day's sort (``external_sort.sort_into``) is the largest transient work a long-running
processor does, once a day. Run inside the processor, it left the processor's baseline
higher after the first compaction: code that only compaction runs (Polars' sort, Arrow's
IPC, the Parquet writer) stays resident, and the allocator keeps heap the sort freed
between live blocks (bench/README.md, *Compaction's memory, second pass*). A child
process hands all of it back when it ends, so the processor's memory stays that of its
state; and a sort killed for memory fails that round's compaction (the hourly files stay
and are compacted at the next commit) instead of the processor.

The child is a fresh interpreter (``python -m gpuledger.pipeline.sort_worker``, never a
fork: the processor's threads hold locks a forked child would inherit held, and it
never runs the caller's ``__main__`` again, as ``multiprocessing``'s spawn would). It
imports Polars and PyArrow once, about a second of CPU per round; a round compacts
every table and partition of the days that closed. It only reads and writes local
files: the parts the warehouse fetched into a temporary folder, and the day written
beside them. Requests and replies are one JSON line each, on its stdin and stdout.

The child ends quietly, without a traceback, when its parent goes (killed by SIGTERM,
say): its stdin closes while it waits for a request, a watch thread sees the parent gone
in the middle of a sort (within :data:`PARENT_CHECK_S`), and a reply that finds the pipe
broken ends it. SIGINT and SIGTERM sent to the child end it as signals do, without a
``KeyboardInterrupt`` traceback (a Ctrl-C at the terminal does not reach it: see
``SortWorker._start``).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import IO, Any

CHILD_ENV = {"POLARS_MAX_THREADS": "1", "ARROW_DEFAULT_MEMORY_POOL": "system"}
"""The child's defaults: a sort of one bucket at a time gains nothing from Polars' thread
pool, and each pool thread's and jemalloc's caches cost memory; 201 MiB at its peak for a
day of ``gpu_minute`` against 229-233 MiB without, and the same CPU (bench/README.md,
*Compaction in a child process*)."""

PARENT_ENV = "GPULEDGER_SORT_WORKER_PARENT"
"""The parent's process id, given to the child: it ends when its parent is another."""
PARENT_CHECK_S = 0.5
"""How often the child checks that its parent is still there."""


class SortWorkerDied(Exception):
    """The child process ended before its sort did (killed for memory, most often)."""


class SortWorker:
    """Runs ``external_sort.sort_into`` in one child process, started at the first sort
    and ended by :meth:`close` (or the ``with`` block's end)."""

    def __init__(self) -> None:
        self._child: subprocess.Popen[bytes] | None = None
        self.peak_rss_kib = 0
        """The largest peak resident memory of this worker's children (their
        ``VmHWM``, as each sort ends), KiB."""

    @property
    def pid(self) -> int | None:
        """The child's process id; None while none runs."""
        return None if self._child is None else self._child.pid

    @property
    def ended(self) -> bool:
        """Whether its child has ended (killed while it waited for a sort, say); a
        worker whose child has not started yet has not ended."""
        return self._child is not None and self._child.poll() is not None

    def _start(self) -> subprocess.Popen[bytes]:
        env = {**CHILD_ENV, **os.environ}  # what the user set wins
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)  # the caller's imports
        env[PARENT_ENV] = str(os.getpid())
        try:
            # a session of its own: a Ctrl-C at the terminal reaches the processor alone,
            # which stops the child (``stop``); Polars' collect would turn it into a
            # traceback of the child's even with SIGINT ignored
            return subprocess.Popen([sys.executable, "-m", __name__], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, env=env, start_new_session=True)
        except OSError as exc:  # not the spill folder's: said as what it is
            raise SortWorkerDied(f"the compaction's child process did not start "
                                 f"({sys.executable}: {exc.strerror or exc})") from exc

    def sort_into(self, out: Path, parts: list[Path], sort_by: list[str],
                  row_group_size: int, bucket_rows: int) -> int:
        """``external_sort.sort_into`` of files ``parts`` into the file ``out``, in the
        child; the number of rows. An ``OSError`` there is raised here as one (errno
        and message kept); any other failure as ``RuntimeError`` with its message (the
        child prints its traceback on the processor's stderr). A child that did not
        start or died raises :class:`SortWorkerDied`, and the next sort starts a new
        child."""
        if self._child is None:
            self._child = self._start()
        child = self._child
        assert child.stdin is not None and child.stdout is not None
        request = {"out": str(out), "parts": [str(p) for p in parts], "sort_by": sort_by,
                   "row_group_size": row_group_size, "bucket_rows": bucket_rows}
        try:
            child.stdin.write(json.dumps(request).encode() + b"\n")
            child.stdin.flush()
            line = child.stdout.readline()
        except OSError:  # the pipe broke: the child is gone
            line = b""
        if not line:
            code = self._end()
            how = (f"killed by signal {-code}" + ("; for memory?" if -code == 9 else "")
                   if code < 0 else f"exit status {code}; its error is on stderr above")
            raise SortWorkerDied(f"the compaction's child process ended before its sort "
                                 f"did ({how})")
        reply = json.loads(line)
        self.peak_rss_kib = max(self.peak_rss_kib, reply["peak_rss_kib"])
        if "error" in reply:
            if not reply["os_error"]:
                raise RuntimeError(f"compaction's sort failed: {reply['error']}")
            if reply["errno"] is None:
                raise OSError(reply["error"])
            raise OSError(reply["errno"], reply["error"])
        return int(reply["rows"])

    def _end(self) -> int:
        child, self._child = self._child, None
        if child is None:
            return 0
        for pipe in (child.stdin, child.stdout):
            if pipe is not None:
                # a request left in the buffer of a dead child's stdin fails its flush
                # again here (BrokenPipeError); the pipe is closed all the same
                with contextlib.suppress(OSError):
                    pipe.close()
        return child.wait()

    def close(self) -> None:
        """End the child process (waits for it: its memory is back when this returns)."""
        self._end()

    def stop(self) -> None:
        """End the child process now, in the middle of a sort if one runs (the processor
        is stopping: the sort's output is not wanted)."""
        if self._child is not None and self._child.poll() is None:
            self._child.terminate()
        self._end()

    def __enter__(self) -> SortWorker:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        if kind is None:
            self.close()
        else:
            self.stop()


def _peak_rss_kib() -> int:
    """This process's peak resident memory since its ``exec`` (``VmHWM``; ``ru_maxrss``
    would also count the parent's pages the child held between fork and exec)."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return 0


def _serve(requests: IO[bytes], replies: IO[bytes]) -> None:
    """The child: one sort per request line, one reply line each, until stdin closes."""
    import traceback

    from gpuledger.pipeline import external_sort

    for line in requests:
        ask = json.loads(line)
        reply: dict[str, Any]
        try:
            rows = external_sort.sort_into(
                Path(ask["out"]), [Path(p) for p in ask["parts"]], ask["sort_by"],
                ask["row_group_size"], ask["bucket_rows"])
            reply = {"rows": rows}
        except OSError as exc:  # the spill folder's: the processor puts the day off
            reply = {"error": exc.strerror or str(exc), "errno": exc.errno, "os_error": True}
        except Exception as exc:  # reported to the processor, which raises it there
            traceback.print_exc(file=sys.stderr)
            reply = {"error": f"{type(exc).__name__}: {exc}", "os_error": False}
        reply["peak_rss_kib"] = _peak_rss_kib()
        try:
            replies.write(json.dumps(reply).encode() + b"\n")
            replies.flush()
        except BrokenPipeError:  # the parent is gone or stopped reading: nobody waits
            os._exit(1)  # no cleanup: it would flush the broken pipe again


def _end_when_orphaned(parent: int) -> None:
    """End this process as soon as its parent is no longer ``parent`` (it died: the
    child is given to init or a subreaper), even in the middle of a sort."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_CHECK_S)
        os._exit(1)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


if __name__ == "__main__":
    from gpuledger.pipeline import external_sort  # noqa: F401  (Polars, before the below)

    # end quietly, as signals do: no KeyboardInterrupt, and not Polars' SIGINT handler
    # (installed by its import), which swallows the signal
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_DFL)
    _end_when_orphaned(int(os.environ.get(PARENT_ENV) or os.getppid()))
    protocol = sys.stdout.buffer
    sys.stdout = sys.stderr  # a stray print must not break the replies
    _serve(sys.stdin.buffer, protocol)
