"""Where the warehouse lives: a local folder or an S3 bucket, through one filesystem layer.

A *location* is a local path (``warehouse``, ``/srv/gpuledger``, ``file:///srv/gpuledger``)
or ``s3://bucket/prefix``. Every read and write of the warehouse — fact files,
manifests, the catalog, checkpoints — goes through :class:`Store`, which holds one
PyArrow filesystem (``pyarrow.fs.LocalFileSystem`` or ``pyarrow.fs.S3FileSystem``); the
code that writes facts never asks which one it is.

S3 settings come from the standard AWS variables, as with every AWS SDK:
``AWS_ENDPOINT_URL`` (or ``AWS_ENDPOINT_URL_S3``) for a store other than AWS,
``AWS_REGION`` (or ``AWS_DEFAULT_REGION``), and credentials from
``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY`` (``AWS_SESSION_TOKEN``), a profile
(``AWS_PROFILE``) or the shared files (``~/.aws/credentials``, ``~/.aws/config``).
With a custom endpoint, buckets are addressed path-style (``http://host/bucket/key``,
what MinIO, Ceph RGW and S3Proxy expect); on AWS, virtual-hosted style.
``GPULEDGER_S3_ADDRESSING=virtual`` forces virtual-hosted style with a custom endpoint.
Credentials are never part of a location, a message or a log line: a URL that carries
them (``s3://key:secret@bucket``) is refused.

Any other scheme (``gs://``, ``foo://``) is refused with one line; it is never taken for
a local folder name.
"""

from __future__ import annotations

import builtins
import os
import re
import shutil
import stat
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pyarrow as pa
import pyarrow.fs as pafs

from gpuledger.pipeline.location import StoreError, check_location, display

__all__ = ["Entry", "Store", "StoreConflict", "StoreError", "StoreIOError", "check_location",
           "display", "open_store"]

CONNECT_TIMEOUT_S = 5.0
REQUEST_TIMEOUT_S = 30.0
RETRIES = 3
_CHUNK = 1 << 20
"""Bytes per read and write when a local file is copied into the store."""


def _s3_filesystem(environ: Mapping[str, str]) -> pafs.S3FileSystem:
    endpoint = environ.get("AWS_ENDPOINT_URL_S3") or environ.get("AWS_ENDPOINT_URL")
    kw: dict[str, Any] = {
        "connect_timeout": CONNECT_TIMEOUT_S, "request_timeout": REQUEST_TIMEOUT_S,
        "retry_strategy": pafs.AwsStandardS3RetryStrategy(max_attempts=RETRIES),
        "allow_delayed_open": True,  # a small object is one PUT, not a multipart upload
    }
    region = environ.get("AWS_REGION") or environ.get("AWS_DEFAULT_REGION")
    if region:
        if not re.fullmatch(r"[a-z0-9-]{1,64}", region):  # (a newline read as no region)
            raise StoreError(f"AWS_REGION: not a region name, got {region[:40]!r} "
                             "(such as us-east-1)")
        kw["region"] = region
    if endpoint:
        parts = urlsplit(endpoint)
        if "://" not in endpoint:   # assumed https, a plain-http server gave an SSL error
            raise StoreError(f"AWS_ENDPOINT_URL: give the scheme, http:// or https://, "
                             f"got {display(endpoint)!r}")
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise StoreError("AWS_ENDPOINT_URL: expected http(s)://host[:port], got "
                             f"{display(endpoint)!r}")
        if parts.path.strip("/") or parts.query or parts.fragment:  # dropped in silence
            raise StoreError("AWS_ENDPOINT_URL: a path, query or fragment after the host "
                             f"is not served (http(s)://host[:port]), got {display(endpoint)!r}")
        kw["endpoint_override"] = parts.netloc
        kw["scheme"] = parts.scheme
    addressing = environ.get("GPULEDGER_S3_ADDRESSING", "auto").lower()
    if addressing not in ("auto", "path", "virtual"):
        raise StoreError("GPULEDGER_S3_ADDRESSING: expected auto, path or virtual, "
                         f"got {addressing!r}")
    if addressing == "virtual":
        kw["force_virtual_addressing"] = True
    elif addressing == "path" and not endpoint:
        raise StoreError("GPULEDGER_S3_ADDRESSING=path needs AWS_ENDPOINT_URL (AWS itself "
                         "is addressed virtual-hosted style)")
    try:
        return pafs.S3FileSystem(**kw)
    except (OSError, ValueError, pa.ArrowException) as exc:
        raise StoreError(f"S3: {_one_line(exc)}") from None


class StoreIOError(OSError, StoreError):
    """A read, write, listing or deletion of the store that failed (no permission, a file
    where a folder must be, a full disk, a refused request), with the path, in one line.
    Still an ``OSError``: what retries or reports I/O failures goes on doing so."""


_TEMPORARY = re.compile(r"\..+\.[0-9a-f]{12}\.tmp")
"""A temporary file of :meth:`Store.write` (facts, manifests, checkpoints)."""
TEMPORARY_AGE_S = 3600.0
"""A temporary file this old is a dead writer's."""


class StoreConflict(StoreError):
    """An object created only if absent (a manifest generation) was there already."""


def safe_path(path: str) -> str:
    """``path`` when it names something inside the store: relative, ``/``-separated, no
    empty, ``.`` or ``..`` part. A path read from a manifest or a retired log must never
    reach outside the warehouse."""
    if path and (path.startswith("/") or "\0" in path
                 or any(part in ("", ".", "..") for part in path.split("/"))):
        raise StoreError(f"{path!r}: not a path inside the warehouse")
    return path


def _link_or_replace(tmp: str, full: str) -> None:
    """Put ``tmp`` at ``full`` only if nothing is there (FileExistsError otherwise): a hard
    link, which fails when the name is taken; where the filesystem has no hard links
    (some network and FUSE mounts), a look first, then a rename."""
    try:
        os.link(tmp, full)
    except FileExistsError:
        raise
    except OSError:
        if os.path.lexists(full):
            raise FileExistsError(full) from None
        os.replace(tmp, full)
        return
    os.unlink(tmp)


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


@dataclass(frozen=True)
class Entry:
    """A file under a store: its path relative to the store, size and modification time."""

    path: str
    size: int
    mtime: float


class Store:
    """One folder or bucket prefix, read and written through a PyArrow filesystem.

    Paths given to its methods are relative (``facts/gpu_minute/…``), with ``/``."""

    def __init__(self, fs: pafs.FileSystem, base: str, url: str, remote: bool) -> None:
        self.fs = fs
        self.base = base.rstrip("/")
        self.url = url.rstrip("/")
        self.remote = remote

    def __repr__(self) -> str:
        return f"Store({self.url})"

    def full(self, path: str) -> str:
        """The path in the filesystem (``path`` must stay inside the store)."""
        return f"{self.base}/{safe_path(path)}" if path else self.base

    def _failed(self, doing: str, path: str, exc: OSError) -> StoreIOError:
        code = exc.errno or next((int(m) for m in re.findall(r"\[errno (\d+)\]", str(exc))), 0)
        why = os.strerror(code) if code else (exc.strerror or _one_line(exc))
        out = StoreIOError(f"{self.url_of(path)}: cannot {doing}: {why}")
        out.errno = exc.errno
        return out

    def url_of(self, path: str) -> str:
        """What DuckDB, Polars or a person uses to name the file."""
        return f"{self.url}/{path}" if path else self.url

    def child(self, path: str) -> Store:
        return Store(self.fs, self.full(path), self.url_of(path), self.remote)

    def read(self, path: str) -> bytes | None:
        """The file's bytes, or None when there is none."""
        try:
            with self.fs.open_input_stream(self.full(path)) as f:
                data: bytes = f.read()
                return data
        except FileNotFoundError:
            return None
        except OSError as exc:
            if _missing(exc):
                return None
            raise self._failed("read", path, exc) from None

    def write(self, path: str, data: bytes) -> None:
        """Write ``path`` whole or not at all: a reader sees the old content or the new.

        An object store replaces an object in one request; a local file is written
        aside and renamed over the old one."""
        self._replace(path, lambda f: f.write(data))

    def create(self, path: str, data: bytes) -> None:
        """``write``, but only if ``path`` is not there yet (:class:`StoreConflict`
        otherwise): a local file is linked into place, which fails if one is there; an
        object store is asked first (a race of two writers in the same instant is not
        seen there)."""
        if self.remote:
            if self.exists(path):
                raise StoreConflict(f"{self.url_of(path)}: already there")
            self.write(path, data)
            return
        self._replace(path, lambda f: f.write(data), exclusive=True)

    def write_file(self, path: str, local: Path) -> None:
        """``write`` of the bytes of the local file ``local``, copied in chunks (never
        held in memory whole)."""
        with open(local, "rb") as src:
            self._replace(path, lambda f: shutil.copyfileobj(src, f, _CHUNK))

    def _replace(self, path: str, fill: Callable[[Any], object],
                 exclusive: bool = False) -> None:
        full = self.full(path)
        try:
            if self.remote:
                with self.fs.open_output_stream(full) as f:
                    fill(f)
                return
            folder, _, name = full.rpartition("/")
            self.fs.create_dir(folder, recursive=True)
            tmp = f"{folder}/.{name}.{uuid.uuid4().hex[:12]}.tmp"
            try:
                with open(tmp, "wb") as f:  # a plain file: fsync before the rename
                    fill(f)
                    f.flush()
                    os.fsync(f.fileno())
                if exclusive:
                    _link_or_replace(tmp, full)
                else:
                    os.replace(tmp, full)
            except BaseException:
                if os.path.lexists(tmp):
                    os.unlink(tmp)
                raise
        except FileExistsError as exc:
            if exclusive and os.path.lexists(full):
                raise StoreConflict(f"{self.url_of(path)}: already there") from None
            raise self._failed("write", path, exc) from None
        except StoreIOError:
            raise
        except OSError as exc:
            raise self._failed("write", path, exc) from None

    def delete(self, path: str) -> None:
        try:
            self.fs.delete_file(self.full(path))
        except FileNotFoundError:
            pass
        except OSError as exc:
            if not _missing(exc):
                raise self._failed("delete", path, exc) from None

    def exists(self, path: str) -> bool:
        info = self.fs.get_file_info(self.full(path))
        return bool(info.type == pafs.FileType.File)

    def size(self, path: str) -> int | None:
        """The size of the file ``path`` in bytes, or None when there is none (one stat
        of a local file, one HEAD request of an object)."""
        try:
            info = self.fs.get_file_info(self.full(path))
        except OSError as exc:
            if _missing(exc):
                return None
            raise self._failed("look at", path, exc) from None
        return int(info.size or 0) if info.type == pafs.FileType.File else None

    def list(self, prefix: str) -> list[Entry]:
        """Every file under ``prefix`` (recursively), hidden temporary files left out. In a
        local folder, symbolic links below ``prefix`` are neither followed nor listed:
        what such a link points at is outside the warehouse, and nothing of it is read or
        deleted (``prefix`` itself may be a link: a warehouse's facts on another disk)."""
        if not self.remote:
            return self._list_local(prefix)
        selector = pafs.FileSelector(self.full(prefix), recursive=True, allow_not_found=True)
        out: list[Entry] = []
        start = len(self.base) + 1
        try:
            infos = self.fs.get_file_info(selector)
        except OSError as exc:
            raise self._failed("list", prefix, exc) from None
        for info in infos:
            if info.type != pafs.FileType.File or info.base_name.startswith("."):
                continue
            mtime = info.mtime.timestamp() if info.mtime is not None else 0.0
            out.append(Entry(info.path[start:], info.size or 0, mtime))
        return out

    def _list_local(self, prefix: str) -> builtins.list[Entry]:
        top = self.full(prefix)
        out: builtins.list[Entry] = []
        start = len(self.base) + 1
        if not os.path.exists(top):
            return out
        if not os.path.isdir(top):  # (a link to a folder, set up by whoever set up the
            # warehouse, is listed; links further down are not followed)
            raise StoreIOError(f"{self.url_of(prefix)}: cannot list: not a folder")

        def failed(exc: OSError) -> None:
            raise self._failed("list", prefix, exc)

        for folder, dirs, files in os.walk(top, onerror=failed, followlinks=False):
            dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(folder, d))]
            for name in files:
                if name.startswith("."):
                    continue
                path = os.path.join(folder, name)
                try:
                    st = os.lstat(path)
                except FileNotFoundError:
                    continue  # deleted meanwhile
                if not stat.S_ISREG(st.st_mode):
                    continue  # a link or anything but a plain file
                out.append(Entry(path[start:].replace(os.sep, "/"), st.st_size, st.st_mtime))
        return out

    def sweep_temporary(self, older_than_s: float = TEMPORARY_AGE_S,
                        now: float | None = None) -> builtins.list[str]:
        """Delete the temporary files writers killed mid-write left in a local folder
        (``.NAME.<12 hex>.tmp`` of :meth:`write`: facts, manifests, checkpoints) not
        touched for ``older_than_s``: a write takes seconds, so none of them is still
        being written. Links are neither followed nor deleted; an object
        store has none (an object appears whole or not at all). The paths deleted."""
        if self.remote or not os.path.isdir(self.base):
            return []
        now = time.time() if now is None else now
        gone: builtins.list[str] = []
        for folder, dirs, files in os.walk(self.base, followlinks=False):
            dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(folder, d))]
            for name in files:
                if not _TEMPORARY.fullmatch(name):
                    continue
                path = os.path.join(folder, name)
                try:
                    st = os.lstat(path)
                    if stat.S_ISREG(st.st_mode) and now - st.st_mtime >= older_than_s:
                        os.unlink(path)
                        gone.append(path[len(self.base) + 1:].replace(os.sep, "/"))
                except OSError:
                    continue  # gone meanwhile, or not ours to delete: left as it is
        return gone

    def check(self) -> None:
        """Reach the store once: a missing bucket, refused credentials or an endpoint
        that does not answer becomes one :class:`StoreError` line."""
        try:
            self.fs.get_file_info(self.full(""))
            if self.remote:
                bucket = self.base.split("/", 1)[0]
                info = self.fs.get_file_info(bucket)
                if info.type == pafs.FileType.NotFound:
                    raise StoreError(f"{self.url}: bucket '{bucket}' does not exist")
        except StoreError:
            raise
        except (OSError, pa.ArrowException) as exc:
            raise StoreError(f"{self.url}: {_explain(exc)}") from None


def _missing(exc: OSError) -> bool:
    text = str(exc)
    return "NO_SUCH_KEY" in text or "Path does not exist" in text or "NoSuchKey" in text


def _explain(exc: BaseException) -> str:
    """One line on why an S3 request failed (never the credentials: the SDK's messages
    do not carry them)."""
    text = str(exc)
    if any(s in text for s in ("ACCESS_DENIED", "AccessDenied", "SignatureDoesNotMatch",
                               "InvalidAccessKeyId", "HTTP status 403", "INVALID_ACCESS_KEY",
                               "SIGNATURE_DOES_NOT_MATCH", "HTTP status 401")):
        return ("access denied: the credentials were refused (AWS_ACCESS_KEY_ID / "
                "AWS_SECRET_ACCESS_KEY, AWS_PROFILE or ~/.aws/credentials)")
    if any(s in text for s in ("NETWORK_CONNECTION", "curlCode", "Couldn't connect",
                               "Connection refused", "Could not resolve", "Timeout",
                               "timed out")):
        return ("cannot reach the S3 endpoint (AWS_ENDPOINT_URL, network): "
                f"{_cut(_one_line(exc), 160)}")
    if "NO_SUCH_BUCKET" in text or "NoSuchBucket" in text:
        return "the bucket does not exist"
    return _cut(_one_line(exc), 240)


def _cut(text: str, size: int) -> str:
    """``text`` in at most ``size`` characters, cut at a word with '…' (it was cut
    mid-word: '…; Deta')."""
    if len(text) <= size:
        return text
    head = text[:size - 1]
    return (head.rsplit(" ", 1)[0] if " " in head else head).rstrip(" ,;:") + "…"


def open_store(location: str | Path, environ: Mapping[str, str] | None = None,
               create: bool = True) -> Store:
    """A :class:`Store` for ``location``; a local folder is created when ``create``."""
    where = check_location(location)
    env = os.environ if environ is None else environ
    if isinstance(where, Path):
        root = where.expanduser().resolve()
        if create:
            try:
                root.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise StoreError(f"{where}: cannot create the folder: {exc.strerror}") from None
        return Store(pafs.LocalFileSystem(), root.as_posix(), root.as_posix(), remote=False)
    path = where[len("s3://"):]
    return Store(_s3_filesystem(env), path, where, remote=True)
