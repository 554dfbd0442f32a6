"""A small Kubernetes API client: list (paginated) and watch, over http.client.

No client library: the bridge needs two verbs on three resources. Authentication is a
bearer token (a service account's, re-read from its file on every request because
projected tokens rotate, or a kubeconfig's) or a client certificate; TLS is verified
against the cluster CA unless the configuration says otherwise.

``watch`` yields the API's watch events (``ADDED``, ``MODIFIED``, ``DELETED``,
``BOOKMARK``) from a chunked stream of JSON lines and ends when the server closes the
stream; the caller resumes from the last ``resourceVersion`` it saw. A ``410 Gone``
answer, or an ``ERROR`` event whose status has code 410 (the resource version was
compacted away), raises :class:`Gone`: the caller must list again.

Hostile or broken answers are refused with a reason, never a traceback or a hang: a list
answer that is not JSON or not the shape of a list, a watch line that is not an event,
a ``continue`` token sent twice (a list that would never end) raise
:class:`MalformedResponse`; ``request_timeout_s`` bounds a list page's whole answer, not
each read (a server trickling one byte at a time cannot hold it); :meth:`ApiClient.abort`
cuts every open request at once (a stop while a list or a quiet watch is in flight).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import ssl
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

from gpuledger.deadline import RequestDeadline, shut_socket
from gpuledger.http_url import http_url_problem
from gpuledger.yaml_file import NotUtf8Error, YamlFileError, read_text


class ApiError(Exception):
    """The API server answered with an error status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


class Gone(ApiError):
    """410: the requested resourceVersion is too old; list again."""


class MalformedResponse(ApiError):
    """A 200 answer that is not what the API sends: not JSON, not the shape of a list or
    of a watch event, cut short, or a ``continue`` token repeated."""

    def __init__(self, message: str) -> None:
        Exception.__init__(self, message)
        self.status = 200


class Stopped(Exception):
    """The request was cut by :meth:`ApiClient.abort` (the bridge is stopping)."""


def _shown(doc: Any) -> str:
    text = json.dumps(doc)
    return text if len(text) <= 80 else text[:77] + "..."


def _page(path: str, raw: bytes) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The items and metadata of one list page, or :class:`MalformedResponse`."""
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise MalformedResponse(f"{path}: the answer is not JSON ({exc})") from None
    except RecursionError:  # Python's reader recurses per level of nesting
        raise MalformedResponse(f"{path}: the answer is not JSON (nested too deeply)"
                                ) from None
    if not isinstance(body, dict):
        raise MalformedResponse(f"{path}: the answer is not a JSON object: {_shown(body)}")
    items = body.get("items") or []
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        raise MalformedResponse(f"{path}: the answer's items are not a list of objects")
    meta = body.get("metadata") or {}
    if not isinstance(meta, dict):
        raise MalformedResponse(f"{path}: the answer's metadata is not an object")
    if not all(isinstance(i.get("metadata"), dict) for i in items):
        raise MalformedResponse(f"{path}: an item's metadata is not an object")
    return items, meta


def _event(path: str, line: bytes) -> tuple[str, dict[str, Any]]:
    """The type and object of one watch line, or :class:`MalformedResponse`."""
    try:
        event = json.loads(line)
    except (ValueError, RecursionError):
        event = None
    obj = event.get("object") if isinstance(event, dict) else None
    if (not isinstance(event, dict) or not isinstance(event.get("type"), str)
            or not isinstance(obj, dict)
            or not isinstance(obj.get("metadata", {}), dict)):
        text = line.decode("utf-8", "replace").strip()
        shown = text if len(text) <= 80 else text[:77] + "..."
        raise MalformedResponse(f"{path}: a watch line that is not an event: {shown}")
    return event["type"], obj


@dataclass(frozen=True)
class Connection:
    """Where the API server is and how to authenticate."""

    server: str
    token: str | None = None
    token_file: Path | None = None
    ca_file: Path | None = None
    ca_data: str | None = None
    cert_file: Path | None = None
    key_file: Path | None = None
    insecure: bool = False

    def bearer(self) -> str | None:
        """The bearer token, re-read from its file; :class:`TokenError` when the file
        cannot be read or does not hold a token."""
        if self.token_file is not None:
            return read_token(self.token_file)
        if self.token is not None and token_problem(self.token):
            raise TokenError(f"token: {token_problem(self.token)}")
        return self.token


class TokenError(OSError):
    """A token file that cannot be read or holds no usable token (never echoed)."""


def token_problem(token: str) -> str | None:
    """Why ``token`` cannot go into an HTTP header, or None: a bearer token is printable
    ASCII without spaces (a line break inside could inject a header)."""
    if not token:
        return "empty"
    if not all("!" <= c <= "~" for c in token):
        return "not a token (it holds spaces, control or non-ASCII characters)"
    return None


def read_token(path: Path) -> str:
    """The token in the file ``path`` (surrounding white space removed)."""
    try:
        text = read_text(path).strip()
    except NotUtf8Error:
        raise TokenError(f"{path}: not a token (not UTF-8 text)") from None
    except YamlFileError as exc:  # missing, a folder, unreadable
        raise TokenError(str(exc)) from None
    problem = token_problem(text)
    if problem:
        raise TokenError(f"{path}: {problem}")
    return text


class TlsError(ValueError):
    """A CA or client certificate that cannot be loaded; ``what`` is the Connection field
    (``ca_file``, ``ca_data``, ``cert_file``)."""

    def __init__(self, what: str, message: str) -> None:
        super().__init__(message)
        self.what = what


def tls_context(connection: Connection) -> ssl.SSLContext:
    """The TLS context of an https connection, or :class:`TlsError` naming the file."""
    def reason(exc: Exception) -> str:
        if isinstance(exc, OSError) and exc.strerror:
            return exc.strerror
        return str(getattr(exc, "reason", None) or exc).splitlines()[0]

    try:
        ctx = ssl.create_default_context(
            cafile=str(connection.ca_file) if connection.ca_file else None)
    except (OSError, ValueError) as exc:
        raise TlsError("ca_file", f"{connection.ca_file}: not a readable PEM CA "
                       f"certificate ({reason(exc)})") from None
    if connection.ca_data:
        try:
            ctx.load_verify_locations(cadata=connection.ca_data)
        except (OSError, ValueError) as exc:
            raise TlsError("ca_data", f"not a PEM CA certificate ({reason(exc)})") from None
    if connection.insecure:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if connection.cert_file:
        try:
            ctx.load_cert_chain(str(connection.cert_file),
                                str(connection.key_file) if connection.key_file else None)
        except (OSError, ValueError) as exc:
            raise TlsError("cert_file", f"{connection.cert_file}"
                           + (f" / {connection.key_file}" if connection.key_file else "")
                           + f": not a readable PEM certificate and key ({reason(exc)})"
                           ) from None
    return ctx


def server_problem(server: str) -> str | None:
    """Why ``server`` is not an API server URL (``http(s)://HOST[:PORT][/PATH]``,
    ``http_url.py``), or None."""
    return http_url_problem(server)


class ApiClient:
    """List and watch collections such as ``/api/v1/pods``."""

    def __init__(self, connection: Connection, request_timeout_s: float = 30.0,
                 page_size: int = 500) -> None:
        self.connection = connection
        self.request_timeout_s = request_timeout_s
        self.page_size = page_size
        problem = server_problem(connection.server)
        if problem:
            raise ValueError(f"server {connection.server!r}: {problem}")
        url = urlsplit(connection.server)
        self._https = url.scheme == "https"
        self._host = url.hostname or ""
        self._port = url.port or (443 if self._https else 80)
        self._prefix = url.path.rstrip("/")
        self._ssl = tls_context(connection) if self._https else None
        self.stop: threading.Event | None = None  # set: no new request starts
        self._live: set[http.client.HTTPConnection] = set()
        self._lock = threading.Lock()

    def abort(self) -> None:
        """Cut every request in flight (their reads end at once) and start no new one
        while ``stop`` is set."""
        with self._lock:
            live = list(self._live)
        for conn in live:
            shut_socket(conn.sock)

    def _stopping(self) -> bool:
        return self.stop is not None and self.stop.is_set()

    def _request(self, path: str, params: dict[str, Any],
                 timeout: float) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        conn: http.client.HTTPConnection
        if self._https:
            conn = http.client.HTTPSConnection(self._host, self._port, timeout=timeout,
                                               context=self._ssl)
        else:
            conn = http.client.HTTPConnection(self._host, self._port, timeout=timeout)
        headers = {"Accept": "application/json", "User-Agent": "gpuledger-bridge"}
        token = self.connection.bearer()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        query = urlencode({k: v for k, v in params.items() if v not in (None, "")})
        with self._lock:
            self._live.add(conn)
        try:
            conn.request("GET", f"{self._prefix}{path}?{query}", headers=headers)
            if self._stopping():  # connected and listed: a stop from now on cuts it
                raise Stopped(path)
            resp = conn.getresponse()
        except BaseException:
            self._close(conn)
            if self._stopping():
                raise Stopped(path) from None
            raise
        if resp.status != 200:
            body = resp.read(4096).decode("utf-8", "replace")
            conn.close()
            message = body
            with contextlib.suppress(ValueError, AttributeError, RecursionError):
                message = json.loads(body).get("message", body)
            cls = Gone if resp.status == 410 else ApiError
            raise cls(resp.status, f"{path}: {message}")
        return conn, resp

    def _close(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            self._live.discard(conn)
        conn.close()

    def _read_page(self, path: str, params: dict[str, Any]) -> bytes:
        """One list page's whole body within ``request_timeout_s``, or TimeoutError;
        :class:`Stopped` when cut by :meth:`abort`."""
        timeout = self.request_timeout_s
        conn, resp = self._request(path, params, timeout)
        watch = RequestDeadline(timeout)
        watch.add(conn.sock)
        try:
            body = resp.read()
        except (http.client.IncompleteRead, OSError) as exc:
            if self._stopping():
                raise Stopped(path) from None
            if watch.expired or isinstance(exc, TimeoutError):
                raise TimeoutError(f"{path}: no complete answer within {timeout:g} s"
                                   ) from None
            raise MalformedResponse(f"{path}: the answer was cut short ({exc!r})") from None
        finally:
            watch.finish()
            self._close(conn)
        if self._stopping():
            raise Stopped(path)
        if watch.expired:
            raise TimeoutError(f"{path}: no complete answer within {timeout:g} s")
        return body

    def list(self, path: str, label_selector: str | None = None
             ) -> tuple[list[dict[str, Any]], str]:
        """Every item of a collection (following ``continue``) and the list's version."""
        items: list[dict[str, Any]] = []
        token: str | None = None
        seen: set[str] = set()
        while True:
            page, meta = _page(path, self._read_page(
                path, {"limit": self.page_size, "continue": token,
                       "labelSelector": label_selector}))
            items += page
            token = meta.get("continue")
            if not token:
                return items, str(meta.get("resourceVersion") or "")
            token = str(token)
            if token in seen:
                raise MalformedResponse(
                    f"{path}: the API sent the continue token {token!r} again (page "
                    f"{len(seen) + 1}); the list would never end")
            seen.add(token)

    def watch(self, path: str, resource_version: str, timeout_s: float = 300.0,
              read_timeout_s: float = 90.0, label_selector: str | None = None,
              opened: Callable[[], None] | None = None,
              ) -> Iterator[tuple[str, dict[str, Any]]]:
        """Watch events after ``resource_version`` until the server ends the stream.

        A read that waits longer than ``read_timeout_s`` ends the stream too (the caller
        resumes); bookmarks keep a quiet watch alive. ``opened`` is called once the API
        has answered 200 (a quiet watch may send no event for minutes).
        """
        params = {"watch": 1, "resourceVersion": resource_version,
                  "allowWatchBookmarks": "true", "timeoutSeconds": int(timeout_s),
                  "labelSelector": label_selector}
        conn, resp = self._request(path, params, read_timeout_s)
        try:
            if opened is not None:
                opened()
            while True:
                try:
                    line = resp.readline()
                except (TimeoutError, http.client.IncompleteRead):
                    return
                if not line:
                    return
                if not line.strip():
                    continue
                kind, obj = _event(path, line)
                if kind == "ERROR":
                    code = obj.get("code")
                    code = code if isinstance(code, int) else 0
                    cls = Gone if code == 410 else ApiError
                    raise cls(code, f"{path}: {obj.get('message', 'watch error')}")
                yield kind, obj
        finally:
            self._close(conn)
