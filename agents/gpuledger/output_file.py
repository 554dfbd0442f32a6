"""Writing a file a user asked for (a report, rule files, boards) so that nothing is lost.

The text goes into a hidden file beside the target, then replaces it in one rename: a
write that fails part way (a full disk, an interrupt) leaves the old file as it was and
no half-written one. Before, the report was written in place: a full disk left 40 KiB
of a report and the old one gone; Prometheus or Grafana, watching a folder, could read a
rule file or a board half written. A link is followed: the file it points at is
replaced, as writing through it did.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def replace_text(path: Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` in one rename; OSError as ``open`` raises it,
    the target untouched. The new file has the permissions a new file gets (umask)."""
    target = Path(os.path.realpath(path)) if path.is_symlink() else path
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
