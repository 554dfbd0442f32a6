"""A deadline over one whole HTTP request, for clients a peer can hold forever.

A socket timeout bounds each read, not the answer: a server that trickles a byte every
second never trips it. :class:`RequestDeadline` shuts the request's sockets when its time
is up, so a blocked read returns at once; the caller then sees ``expired``. Used by the
DCGM exporter scrape, the Kubernetes API client and the alert webhook.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time


def shut_socket(sock: socket.socket | None) -> None:
    """End every read and write on ``sock`` from another thread: ``socket.socket``'s own
    shutdown, also for an SSL socket (``SSLSocket.shutdown`` would unwrap its TLS state
    under a thread still reading it)."""
    if sock is not None:
        with contextlib.suppress(OSError):
            socket.socket.shutdown(sock, socket.SHUT_RDWR)


class RequestDeadline:
    """A deadline over one request: at expiry the sockets :meth:`add`-ed are shut down
    (one added after expiry is shut at once); :meth:`finish` ends the watch."""

    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds
        self.expired = False
        self._done = False
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True
        self._timer.start()

    def remaining(self) -> float:
        return max(self.end - time.monotonic(), 0.0)

    def add(self, sock: socket.socket | None) -> None:
        if sock is None:
            return
        with self._lock:
            if self.expired:
                shut_socket(sock)
            elif not self._done:
                self._sockets.append(sock)

    def _expire(self) -> None:
        with self._lock:
            if self._done:
                return
            self.expired = True
            for sock in self._sockets:
                shut_socket(sock)

    def finish(self) -> None:
        with self._lock:
            self._done = True
            self._sockets.clear()
        self._timer.cancel()
