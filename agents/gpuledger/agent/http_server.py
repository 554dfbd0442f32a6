"""A small HTTP server for ``/metrics`` and ``/healthz`` that does not hold doors open.

Shared by the node agent, the scheduler bridges and the processor's exporter (it lives
with the agent, the leanest install: standard library only):

* one request per connection (HTTP/1.0 responses, ``Connection: close``);
* an **idle timeout** on every read and write of a connection;
* a **header deadline**: the request line and headers must arrive within it, however
  slowly they trickle in (a slow-loris client is cut off by one reaper thread, not by a
  thread per connection);
* a **bound on concurrent connections**: beyond it a connection gets no thread; one
  refuser thread answers its request ``503 Service Unavailable`` (``Retry-After: 1``)
  if the request arrives within a second, else closes it; either way it is counted
  (``refused``), so idle clients cannot pile up threads;
* ``GET`` (and ``HEAD``) of the configured paths only: anything else is 404, other
  methods 405, an HTTP/0.9 request (no version) 400 at once.
"""

from __future__ import annotations

import contextlib
import logging
import selectors
import socket
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

log = logging.getLogger("gpuledger.http")

Route = Callable[[], tuple[int, bytes, str]]
"""A path's handler: (status, body, content type)."""

DEFAULT_IDLE_TIMEOUT_S = 10.0
DEFAULT_HEADER_TIMEOUT_S = 5.0
DEFAULT_MAX_CONNECTIONS = 16
REFUSED_WAIT_S = 1.0
"""How long a refused connection's request may take to arrive for its 503."""
REFUSED_PENDING_MAX = 256
"""Refused connections waiting for their request at once; beyond, closed at once."""
_BUSY_TEXT = b"too many connections; try again in 1 s\n"
BUSY_REPLY = (b"HTTP/1.0 503 Service Unavailable\r\nRetry-After: 1\r\n"
              b"Content-Type: text/plain; charset=utf-8\r\n"
              b"Content-Length: " + str(len(_BUSY_TEXT)).encode() + b"\r\n"
              b"Connection: close\r\n\r\n" + _BUSY_TEXT)


class _Handler(BaseHTTPRequestHandler):
    server: BoundedHTTPServer
    protocol_version = "HTTP/1.0"
    default_request_version = "HTTP/1.0"  # errors before the version is read get a status line

    raw_requestline: bytes

    def setup(self) -> None:
        super().setup()
        self.connection.settimeout(self.server.idle_timeout_s)  # every read and write
        self.server.watch(self.connection)

    def finish(self) -> None:
        self.server.unwatch(self.connection)
        with contextlib.suppress(OSError):
            super().finish()

    def parse_request(self) -> bool:
        words = self.raw_requestline.split()
        if len(words) == 2:  # HTTP/0.9: no version, no headers would follow
            self.command, self.request_version = "", self.default_request_version
            self.requestline = self.raw_requestline.decode("iso-8859-1").rstrip("\r\n")
            self.close_connection = True
            self.send_error(400, "HTTP/0.9 requests are not supported")
            return False
        ok = super().parse_request()
        self.server.unwatch(self.connection)  # the request is in: the deadline is met
        return ok

    def do_GET(self) -> None:
        self._answer(body=True)

    def do_HEAD(self) -> None:
        self._answer(body=False)

    def _answer(self, body: bool) -> None:
        route = self.server.routes.get(self.path.split("?", 1)[0])
        if route is None:
            status, data, ctype = 404, (f"not found; try {' or '.join(self.server.routes)}"
                                        "\n").encode(), "text/plain; charset=utf-8"
        else:
            try:
                status, data, ctype = route()
            except Exception:
                log.exception("%s failed", self.path)
                status, data, ctype = 500, b"internal error\n", "text/plain; charset=utf-8"
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Connection", "close")
        self.end_headers()
        if body:
            self.wfile.write(data)

    def _method_not_allowed(self) -> None:
        self.send_error(405, "only GET and HEAD")

    do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_TRACE = do_CONNECT = (
        _method_not_allowed)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)


class BoundedHTTPServer(ThreadingHTTPServer):
    """``routes`` (path → handler) on ``address``, with the bounds of the module's doc."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 64  # connections beyond the bound are accepted and closed at once

    def __init__(self, address: tuple[str, int], routes: dict[str, Route], *,
                 idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
                 header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S,
                 max_connections: int = DEFAULT_MAX_CONNECTIONS) -> None:
        self.routes = routes
        self.idle_timeout_s = idle_timeout_s
        self.header_timeout_s = header_timeout_s
        self.refused = 0
        """Connections closed at once because ``max_connections`` were open."""
        self.cut_off = 0
        """Connections closed because their request did not arrive in time."""
        self._slots = threading.BoundedSemaphore(max_connections)
        self._deadlines: dict[socket.socket, float] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        host = address[0]
        if ":" in host:  # an IPv6 literal
            self.address_family = socket.AF_INET6
        super().__init__(address, _Handler)
        self._reaper = threading.Thread(target=self._reap, name="gpuledger-http-reaper",
                                        daemon=True)
        self._reaper.start()
        self._refusing = selectors.DefaultSelector()
        self._refuser = threading.Thread(target=self._refuse_all, daemon=True,
                                         name="gpuledger-http-refuser")
        self._refuser.start()

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    # -- connection bound --------------------------------------------------------------

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.refused += 1
            self._refuse(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def _refuse(self, request: socket.socket) -> None:
        """Hand a connection beyond the bound to the refuser thread (closed at once when
        too many wait already)."""
        with self._lock:
            if len(self._refusing.get_map()) >= REFUSED_PENDING_MAX or self._stop.is_set():
                self.shutdown_request(request)
                return
            request.setblocking(False)
            self._refusing.register(request, selectors.EVENT_READ,
                                    [time.monotonic() + REFUSED_WAIT_S, b""])

    def _refuse_all(self) -> None:
        """Answer each refused connection's request 503 once its headers are in; close
        the ones whose request does not come within ``REFUSED_WAIT_S``."""
        while not self._stop.is_set():
            with self._lock:
                waiting = bool(self._refusing.get_map())
            if not waiting:
                self._stop.wait(0.05)
                continue
            ready = self._refusing.select(timeout=0.1)
            now = time.monotonic()
            done: dict[socket.socket, bool] = {}
            for key, _ in ready:
                conn, state = key.fileobj, key.data
                assert isinstance(conn, socket.socket)
                try:
                    chunk = conn.recv(4096)
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError:
                    chunk = b""
                state[1] += chunk
                if b"\r\n\r\n" in state[1] or not chunk or len(state[1]) > 8192:
                    done[conn] = bool(chunk) and b"\r\n\r\n" in state[1]
            with self._lock:
                for key in list(self._refusing.get_map().values()):
                    if key.data[0] <= now and isinstance(key.fileobj, socket.socket):
                        done.setdefault(key.fileobj, False)
                for conn in done:
                    with contextlib.suppress(KeyError, ValueError):
                        self._refusing.unregister(conn)
            for conn, answer in done.items():
                if answer:
                    with contextlib.suppress(OSError):
                        conn.send(BUSY_REPLY)
                self.shutdown_request(conn)

    # -- header deadline ---------------------------------------------------------------

    def watch(self, connection: socket.socket) -> None:
        with self._lock:
            self._deadlines[connection] = time.monotonic() + self.header_timeout_s

    def unwatch(self, connection: socket.socket) -> None:
        with self._lock:
            self._deadlines.pop(connection, None)

    def _reap(self) -> None:
        step = min(0.25, self.header_timeout_s / 4)
        while not self._stop.wait(step):
            now = time.monotonic()
            with self._lock:
                late = [c for c, t in self._deadlines.items() if t <= now]
                for c in late:
                    del self._deadlines[c]
            for connection in late:
                self.cut_off += 1
                with contextlib.suppress(OSError):
                    connection.shutdown(socket.SHUT_RDWR)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went away or was cut off: no traceback on stderr."""
        log.debug("request from %s failed", client_address, exc_info=True)

    # -- running -----------------------------------------------------------------------

    def start(self) -> BoundedHTTPServer:
        """Serve on a daemon thread."""
        threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.5},
                         name="gpuledger-http", daemon=True).start()
        return self

    def close(self) -> None:
        self._stop.set()
        self.shutdown()
        self.server_close()
        self._refuser.join(1.0)
        with self._lock:
            for key in list(self._refusing.get_map().values()):
                self._refusing.unregister(key.fileobj)
                if isinstance(key.fileobj, socket.socket):
                    self.shutdown_request(key.fileobj)
            self._refusing.close()
