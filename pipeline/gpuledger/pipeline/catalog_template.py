"""Templates of the catalog's views: the views over the base views, bound once per release.

Building a views database (``catalog.duckdb``, or a reader's own) binds each of its
views and macros as it creates them, and DuckDB binds a view with every view under it:
0.11-0.26 CPU-s, a quarter of a one-hour run of the processor. Only the statements of
the SQL files with placeholders (``sql/00_facts.sql``: the base views over each
table's files) differ from one warehouse or generation to the next; the measures and
the analyst views are this release's text. A *template* is a views database built once
over an empty warehouse of this release's schema files, in a temporary folder. A build
copies it and creates the base views again over the warehouse's files; the views above
them are not bound again (DuckDB binds a view again whenever it is read).
``warehouse.build_views`` uses a template only when the base views come out with the
columns they have in it (a warehouse written by an earlier release may hold other schema
files); otherwise it builds in full, as without one.

Templates are kept in memory per process, and on disk in the user's cache folder
(:func:`cache_dir`), named by a digest of everything a template is built from: the SQL
files, the tables' schemas, DuckDB's and Polars' versions and the storage format
(:func:`template_key`). A file there that is not the user's own, or that others may
write, is not used; one that DuckDB cannot open is deleted and built again.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import stat
import tempfile
import threading
from pathlib import Path

import duckdb
import polars as pl

log = logging.getLogger(__name__)

CACHE_ENV = "GPULEDGER_CACHE_DIR"
"""The cache folder; set to the empty string, no template is kept on disk."""

_memory: dict[str, bytes] = {}
_lock = threading.Lock()


def cache_dir() -> Path | None:
    """Where templates are kept on disk: ``$GPULEDGER_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/gpuledger``, else ``~/.cache/gpuledger``; None when
    ``$GPULEDGER_CACHE_DIR`` is set empty (or no home folder is known)."""
    chosen = os.environ.get(CACHE_ENV)
    if chosen is not None:
        return Path(chosen).expanduser() if chosen.strip() else None
    xdg = os.environ.get("XDG_CACHE_HOME", "").strip()
    if xdg:
        return Path(xdg) / "gpuledger"
    try:
        return Path.home() / ".cache" / "gpuledger"
    except RuntimeError:  # no home folder
        return None


def template_key(sql_files: list[tuple[str, str]], schemas: str, storage_version: str) -> str:
    """The digest naming a template: the SQL files (name and text), the tables' schemas
    (their text), the storage format, and the DuckDB and Polars that build and read it."""
    digest = hashlib.sha256()
    for part in (*[f"{name}\0{text}" for name, text in sql_files], schemas, storage_version,
                 duckdb.__version__, pl.__version__):
        digest.update(part.encode())
        digest.update(b"\0\0")
    return digest.hexdigest()[:32]


def _file(folder: Path, key: str) -> Path:
    return folder / f"catalog-template-{key}.duckdb"


def _private(path: Path) -> bool:
    """``path`` is the user's own and no one else may write it."""
    info = path.stat()
    return (not hasattr(os, "getuid") or info.st_uid == os.getuid()) \
        and not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def cached(key: str) -> bytes | None:
    """The template named ``key``: from memory, else from the cache folder."""
    with _lock:
        data = _memory.get(key)
    if data is not None:
        return data
    folder = cache_dir()
    if folder is None:
        return None
    path = _file(folder, key)
    try:
        if not (_private(folder) and _private(path)):
            log.debug("catalog template %s not used: others may write it", path)
            return None
        data = path.read_bytes()
    except OSError:  # none yet, or not readable: built again
        return None
    with _lock:
        _memory[key] = data
    return data


def keep(key: str, data: bytes) -> None:
    """Keep the template ``key`` in memory, and in the cache folder where it can be
    written (whole or not at all: written aside, then renamed)."""
    with _lock:
        _memory[key] = data
    folder = cache_dir()
    if folder is None:
        return
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        if not _private(folder):
            return
        fd, aside = tempfile.mkstemp(dir=folder, prefix=".catalog-template-")
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(data)
            os.replace(aside, _file(folder, key))
        except BaseException:
            Path(aside).unlink(missing_ok=True)
            raise
    except OSError as exc:  # a read-only home, a full disk: kept in memory only
        log.debug("catalog template not kept on disk: %s", exc)


def forget(key: str) -> None:
    """Drop the template ``key`` (DuckDB could not open it): from memory and from the
    cache folder."""
    with _lock:
        _memory.pop(key, None)
    folder = cache_dir()
    if folder is not None:
        with contextlib.suppress(OSError):
            _file(folder, key).unlink(missing_ok=True)
