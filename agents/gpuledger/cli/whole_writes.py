"""Standard output that writes everything or raises.

CPython's buffered writer takes a short write of its file descriptor as the end of the
write: on a disk that fills part way, ``gpuledger query --format csv > out.csv`` wrote
the first 8 KiB of 2.3 MB, said nothing and exited 0 (one ``write(2)`` answered 8,192 of
100,000 bytes, and no second one was tried; the same with ``report --html -`` and
``diagnose --json``). Under :func:`install` every write goes on until all is written, so
the next ``write(2)`` raises the full disk's ``ENOSPC`` and the command says it.
"""

from __future__ import annotations

import errno
import io
import os
import sys
from typing import Any

_replaced: list[io.TextIOWrapper] = []


class WholeWrites(io.RawIOBase):
    """A file descriptor whose ``write`` writes all it is given, or raises."""

    def __init__(self, fd: int) -> None:
        super().__init__()
        self._fd = fd

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._fd

    def isatty(self) -> bool:
        return os.isatty(self._fd)

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        done = 0
        while done < len(view):
            done += os.write(self._fd, view[done:])
        return done


class Closed(io.TextIOBase):
    """Standard output when the process was started without one (``>&-``): Python then
    sets ``sys.stdout`` to None, and the first ``print`` was a traceback."""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        raise OSError(errno.EBADF, "standard output is closed")


def install() -> None:
    """Put :class:`WholeWrites` under ``sys.stdout`` when it is the process's own file
    descriptor (not a test's capture, not one a caller replaced), keeping its encoding,
    its error handler and its line buffering; :class:`Closed` when there is none."""
    out = sys.stdout
    if out is None:
        sys.stdout = Closed()
        return
    try:
        fd = out.fileno()
    except (AttributeError, OSError, ValueError):
        return
    if not isinstance(out, io.TextIOWrapper) or isinstance(
            getattr(out.buffer, "raw", None), WholeWrites):
        return
    out.flush()
    _replaced.append(out)  # its file object must not close the descriptor when freed
    buffered = io.BufferedWriter(WholeWrites(fd))
    sys.stdout = io.TextIOWrapper(buffered, encoding=out.encoding, errors=out.errors,
                                  newline=None, line_buffering=out.line_buffering,
                                  write_through=False)
