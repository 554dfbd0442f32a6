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
import errno
import os
from pathlib import Path


def replace_text(path: Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` in one rename; OSError as ``open`` raises it,
    the target untouched. The new file has the permissions a new file gets (umask)."""
    replace_texts({path: text})


def replace_texts(texts: dict[Path, str]) -> None:
    """Write each file of ``texts`` beside its target first, then rename them all: a
    set that belongs together (the alerting and the recording rules, the boards) is not
    left half old, half new when one cannot be written (one rule file replaced and the
    other not was a pair that did not match). Renames that fail after the first (a file
    made immutable) still leave each file whole."""
    staged: list[tuple[Path, Path]] = []
    try:
        for path, text in texts.items():
            target = Path(os.path.realpath(path)) if path.is_symlink() else path
            tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
            staged.append((tmp, target))
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
        for _tmp, target in staged:  # what would stop a rename, before the first
            if target.exists() and not target.is_file():
                raise IsADirectoryError(errno.EISDIR, "not a file", str(target))
        for tmp, target in staged:
            os.replace(tmp, target)
    except BaseException:
        for tmp, _target in staged:
            with contextlib.suppress(OSError):
                tmp.unlink()
        raise
