"""Folders of this process in the system's temporary folder (``$TMPDIR``), named
``<prefix><pid>-<random>``, and the sweep that removes those left by processes that are
gone: one killed (SIGKILL, or SIGTERM mid-way) never removes its own. Readers'
(``gpuledger-query-``: views database, DuckDB's spill), compaction's (``gpuledger-compact-``:
up to a day of a table, ~250 MB for ``gpu_minute`` of 576 GPUs) and the catalog's builds
(``gpuledger-catalog-``)."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
import time
from pathlib import Path

LEFT_S = 3600.0
"""A folder untouched this long, whose process is gone, is removed by the next sweep (the
age guards a temporary folder shared with another PID namespace, where a live owner's
process is not seen)."""


def _named(prefix: str) -> str:
    return f"{prefix}{os.getpid()}-"


def make(prefix: str) -> str:
    """A new folder of this process (``tempfile.mkdtemp``; its ``OSError`` raised)."""
    return tempfile.mkdtemp(prefix=_named(prefix))


def owned(prefix: str) -> tempfile.TemporaryDirectory[str]:
    """A new folder of this process, removed at the end of a ``with`` block."""
    return tempfile.TemporaryDirectory(prefix=_named(prefix))


def sweep(prefix: str) -> list[Path]:
    """Remove the folders ``prefix`` of processes that are gone, untouched for
    :data:`LEFT_S`; those removed. Never raises (no temporary folder: nothing to do)."""
    try:
        base = Path(tempfile.gettempdir())
        folders = list(base.glob(f"{prefix}*-*"))
    except OSError:
        return []
    now = time.time()
    return [folder for folder in folders if _left(folder, prefix, now)]


def _left(folder: Path, prefix: str, now: float) -> bool:
    """Remove ``folder`` if its process is gone and it is old enough; whether it was."""
    pid = folder.name[len(prefix):].split("-", 1)[0]
    if not pid.isdigit() or int(pid) == os.getpid():
        return False
    try:
        seen = folder.lstat()  # a link is not followed, nor removed
        if now - seen.st_mtime < LEFT_S or not stat.S_ISDIR(seen.st_mode):
            return False
        os.kill(int(pid), 0)
    except ProcessLookupError:
        shutil.rmtree(folder, ignore_errors=True)
        return True
    except (OSError, OverflowError):  # another user's process, gone already, not a pid
        return False
    return False
