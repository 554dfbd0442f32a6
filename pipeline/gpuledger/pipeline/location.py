"""A warehouse location: a local path or a URL of a scheme gpuledger serves.

Pure Python (no PyArrow), so that the command line checks ``--warehouse`` before it
loads anything: any scheme but ``s3://`` (and ``file://``) is refused in one line and
never taken for a local folder name (``gs://bucket`` would otherwise become a folder
``gs:``); a URL that carries credentials is refused too. ``store.py`` opens it.
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import urlsplit

from gpuledger.cli.errors import CliError

SCHEMES = ("s3",)
"""URL schemes served besides local paths (and ``file://``)."""
class StoreError(CliError):
    """A warehouse location that cannot be used, in one line (exit status 2)."""


_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


def is_url(location: str | Path) -> bool:
    """Whether ``location`` names a scheme (``s3://…``), as opposed to a local path."""
    return isinstance(location, str) and _SCHEME.match(location) is not None


def display(location: str | Path) -> str:
    """``location`` as it may be printed (a local path, or the URL without userinfo)."""
    if not is_url(location):
        return str(location)
    parts = urlsplit(str(location))
    host = parts.hostname or ""
    return f"{parts.scheme}://{host}{parts.path}"


def check_location(location: str | Path) -> str | Path:
    """A served location as given (a local ``Path`` or an ``s3://`` URL string), or a
    :class:`StoreError` that says why not. Nothing is opened."""
    if isinstance(location, Path):
        return _no_pattern(location)
    if not location.strip():
        raise StoreError("the warehouse location is empty: name a folder or "
                         "s3://bucket/prefix")
    if _CONTROL.search(location):  # (before urlsplit, which drops tabs and newlines)
        _readable_back(location, location)
    match = _SCHEME.match(location)
    if match is None:
        return _no_pattern(Path(location))
    scheme = match.group(1).lower()
    parts = urlsplit(location)
    if scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise StoreError(f"{location}: a file:// URL names a local path (file:///path)")
        return _no_pattern(Path(parts.path))
    if scheme not in SCHEMES:
        raise StoreError(f"{display(location)}: the URL scheme '{scheme}' is not served; "
                         "use a local folder or s3://bucket/prefix")
    if parts.username is not None or parts.password is not None:
        raise StoreError(f"{display(location)}: credentials do not belong in the URL; set "
                         "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or a profile")
    if not parts.hostname:
        raise StoreError(f"{location}: no bucket (s3://bucket/prefix)")
    if parts.query or parts.fragment:
        raise StoreError(f"{display(location)}: no query or fragment expected "
                         "(settings come from the AWS_* variables)")
    written = parts.netloc.split(":", 1)[0]  # (no credentials here: refused above)
    if written != parts.hostname:  # urlsplit's hostname lower-cased it: another bucket
        raise StoreError(f"{location}: bucket names are lower case (S3 has no bucket "
                         f"{written!r}); write s3://{parts.hostname}{parts.path}")
    segments = parts.path.rstrip("/").split("/")[1:]
    if "" in segments:
        raise StoreError(f"{display(location)}: an empty part in the prefix ('//'): S3 "
                         "keys cannot hold one (a traceback before); write the prefix "
                         "with single slashes")
    if "." in segments or ".." in segments:
        raise StoreError(f"{display(location)}: '.' and '..' are not folders in an S3 "
                         "prefix (the request's signature was refused, read as wrong "
                         "credentials); write the prefix as it is")
    url = f"s3://{parts.hostname}{parts.path.rstrip('/')}"
    _readable_back(url, url)
    return url


_PATTERN = re.compile(r"[*?\[]")
_PATTERN_WHY = ("the location holds '*', '?' or '[': DuckDB reads such names as patterns, "
                "so the facts written there could not be read back (a query read another "
                "warehouse's files, or none); use a location without them")
_USERINFO = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://)[^/]*@")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_CONTROL_WHY = ("a warehouse location cannot hold control characters (a newline, a tab, "
                "…: the views over its facts could not be built); use one without them")


def _readable_back(whole: str, given: str | Path) -> None:
    """A :class:`StoreError` when the location ``whole`` (absolute) holds a character
    its facts could not be read back through: a pattern character (:data:`_PATTERN`) or
    a control character (:data:`_CONTROL`). ``given``: the location as given, named in
    the message (a control character in it shown escaped, so the message stays one
    line)."""
    if _CONTROL.search(whole):
        # (display()'s urlsplit drops tabs and newlines: the userinfo is cut here)
        shown = repr(_USERINFO.sub(r"\1", given) if isinstance(given, str) else str(given))
        raise StoreError(f"{shown}: {_CONTROL_WHY}")
    if _PATTERN.search(whole):
        raise StoreError(f"{display(given) if isinstance(given, str) else given}: "
                         f"{_PATTERN_WHY}")


def _no_pattern(path: Path) -> Path:
    """``path``, unless its absolute form holds a character its facts could not be read
    back through (:func:`_readable_back`)."""
    _readable_back(str(path.expanduser().absolute()), path)
    return path
