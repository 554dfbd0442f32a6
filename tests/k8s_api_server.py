"""A recorded Kubernetes API server for the bridge tests: real HTTP on 127.0.0.1.

It serves, per resource (``nodes``, ``workloads``, ``pods``), an initial list
(``<resource>-list.json``) and a recorded watch history (``<resource>-watch.jsonl``,
one watch event per line) the way the API server does:

- ``GET <collection>`` lists the objects as they are now (the initial list with every
  event that has happened applied), with the newest ``resourceVersion``, in pages of
  ``limit`` items (``continue`` tokens);
- ``GET <collection>?watch=1&resourceVersion=RV`` streams, chunked, one JSON event per
  line: first the events after ``RV`` that already happened, then the rest of the
  recording as it happens; when the recording is exhausted it holds the stream open
  until ``timeoutSeconds``;
- a watch from a version older than the compaction point answers ``410 Gone``.

Directives between the recorded events script the failures a client must survive:

- ``{"cut": true}`` ends the current stream there (a dropped connection); the client
  must resume from the last version it saw;
- ``{"expire": "event"}`` / ``{"expire": "http"}`` compacts the history: the events up to
  the next ``{"resume": true}`` happen while the client cannot see them, and the stream
  ends with an ``ERROR`` event of code 410 (``event``) or is cut so that the client's
  next watch gets an HTTP ``410`` (``http``). The client must list again; the missed
  events show only in the list.

Events of all resources share one resourceVersion sequence (as etcd's): an event is
sent only after every event with a smaller version was sent, so the streams interleave
in recorded order.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Self
from urllib.parse import parse_qs, urlsplit

PATHS = {"/api/v1/nodes": "nodes", "/api/v1/pods": "pods",
         "/apis/kueue.x-k8s.io/v1beta1/workloads": "workloads"}
LIST_KIND = {"nodes": ("v1", "NodeList"), "pods": ("v1", "PodList"),
             "workloads": ("kueue.x-k8s.io/v1beta1", "WorkloadList")}


def _rv(event: dict[str, Any]) -> int:
    return int(event["object"]["metadata"]["resourceVersion"])


class Recording:
    """One resource's list, history and script position."""

    def __init__(self, folder: Path, name: str) -> None:
        listing = json.loads((folder / f"{name}-list.json").read_text())
        self.name = name
        self.list_rv = int(listing["metadata"]["resourceVersion"])
        self.objects: dict[str, dict[str, Any]] = {
            self.ident(o): o for o in listing["items"]}
        self.script: list[dict[str, Any]] = [
            json.loads(line) for line in (folder / f"{name}-watch.jsonl").read_text()
            .splitlines() if line.strip()]
        self.position = 0                 # next script entry to happen
        self.history: list[dict[str, Any]] = []   # events that happened, in order
        self.compacted_rv = 0
        self.pending_http_gone = False
        self.generation = 0  # a new watch supersedes the older streams

    @staticmethod
    def ident(obj: dict[str, Any]) -> str:
        m = obj["metadata"]
        return str(m.get("uid") or m["name"])

    def happen(self, event: dict[str, Any]) -> None:
        self.history.append(event)
        if event["type"] == "BOOKMARK":
            return
        if event["type"] == "DELETED":
            self.objects.pop(self.ident(event["object"]), None)
        else:
            self.objects[self.ident(event["object"])] = event["object"]

    @property
    def current_rv(self) -> int:
        return max([self.list_rv] + [_rv(e) for e in self.history])

    def exhausted(self) -> bool:
        return self.position >= len(self.script)


class _LoopbackServer:
    """A threaded HTTP server on 127.0.0.1 (``url``) that hands each GET to ``_get``;
    ``stopping`` is set when it stops."""

    def _serve(self) -> None:
        self.stopping = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                server._get(self)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def _get(self, h: BaseHTTPRequestHandler) -> None:
        raise NotImplementedError

    def _wake(self) -> None:
        """Let requests waiting inside the server see ``stopping``."""

    def __enter__(self) -> Self:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stopping.set()
        self._wake()
        self.httpd.shutdown()
        self.httpd.server_close()


class FakeApiServer(_LoopbackServer):
    """Serves recordings from ``folder``; ``requests`` logs (resource, kind, rv)."""

    def __init__(self, folder: Path, token: str | None = None) -> None:
        self.recordings: dict[str, Recording] = {
            n: Recording(folder, n) for n in ("nodes", "workloads", "pods")
            if (folder / f"{n}-list.json").exists()}
        self.token = token
        self.lock = threading.Condition()
        self.sent: set[int] = set()
        self.order = sorted(_rv(e) for r in self.recordings.values() for e in r.script
                            if "type" in e)
        self.requests: list[tuple[str, str, str]] = []
        self._serve()

    def _get(self, h: BaseHTTPRequestHandler) -> None:
        self._handle(h)

    def _wake(self) -> None:
        with self.lock:
            self.lock.notify_all()

    def final_versions(self) -> dict[str, str]:
        return {n: str(max([r.list_rv] + [_rv(e) for e in r.script if "type" in e]))
                for n, r in self.recordings.items()}

    def all_happened(self) -> bool:
        return all(r.exhausted() for r in self.recordings.values())

    # -- HTTP -------------------------------------------------------------------------

    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        url = urlsplit(h.path)
        resource = PATHS.get(url.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        if self.token and h.headers.get("Authorization") != f"Bearer {self.token}":
            self._status(h, 401, "Unauthorized", "Unauthorized")
            return
        watch = query.get("watch") in ("1", "true")
        rv = int(query.get("resourceVersion") or 0)
        if resource is not None:
            self.requests.append((resource, "watch", str(rv)) if watch
                                 else (resource, "list", ""))
        if resource is None or resource not in self.recordings:
            self._status(h, 404, "NotFound", f"the server could not find {url.path}")
            return
        rec = self.recordings[resource]
        if watch:
            self._watch(h, rec, rv, float(query.get("timeoutSeconds") or 5))
        else:
            with self.lock:
                api, kind = LIST_KIND[resource]
                items = list(rec.objects.values())
                offset = int(query.get("continue") or 0)
                limit = int(query.get("limit") or 0) or len(items) or 1
                page = items[offset:offset + limit]
                meta: dict[str, Any] = {"resourceVersion": str(rec.current_rv)}
                if offset + limit < len(items):
                    meta["continue"] = str(offset + limit)
                    meta["remainingItemCount"] = len(items) - offset - limit
                body = {"kind": kind, "apiVersion": api, "metadata": meta, "items": page}
                rec.pending_http_gone = False
            data = json.dumps(body).encode()
            h.send_response(200)
            h.send_header("Content-Type", "application/json")
            h.send_header("Content-Length", str(len(data)))
            h.end_headers()
            h.wfile.write(data)

    def _status(self, h: BaseHTTPRequestHandler, code: int, reason: str, message: str) -> None:
        data = json.dumps({"kind": "Status", "apiVersion": "v1", "metadata": {},
                           "status": "Failure", "message": message, "reason": reason,
                           "code": code}).encode()
        h.send_response(code)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)

    def _chunk(self, h: BaseHTTPRequestHandler, event: dict[str, Any]) -> None:
        line = (json.dumps(event) + "\n").encode()
        h.wfile.write(f"{len(line):x}\r\n".encode() + line + b"\r\n")
        h.wfile.flush()

    def _end(self, h: BaseHTTPRequestHandler) -> None:
        h.wfile.write(b"0\r\n\r\n")
        h.wfile.flush()

    def _ready(self, rv: int) -> bool:
        """Every recorded event older than ``rv`` was sent."""
        return all(r in self.sent for r in self.order if r < rv)

    def _watch(self, h: BaseHTTPRequestHandler, rec: Recording, rv: int,
               timeout_s: float) -> None:
        with self.lock:
            if rv < rec.compacted_rv or rec.pending_http_gone:
                self._status(h, 410, "Expired", f"too old resource version: {rv} "
                             f"({rec.compacted_rv})")
                return
            replay = [e for e in rec.history if _rv(e) > rv]
            rec.generation += 1
            mine = rec.generation
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Transfer-Encoding", "chunked")
        h.end_headers()
        try:
            for event in replay:
                self._chunk(h, event)
            deadline = time.monotonic() + timeout_s
            while not self.stopping.is_set():
                with self.lock:
                    if rec.generation != mine:
                        break  # the client reconnected; this stream is dead
                    if rec.exhausted():
                        step = None
                    else:
                        step = rec.script[rec.position]
                        first = step if "type" in step else next(
                            (e for e in rec.script[rec.position:] if "type" in e), None)
                        if first is not None and not self._ready(_rv(first)):
                            self.lock.wait(0.05)
                            continue
                        rec.position += 1
                    if step is not None and "type" in step:
                        rec.happen(step)
                if step is None:
                    if time.monotonic() >= deadline:
                        break
                    time.sleep(0.05)
                    continue
                if "type" in step:
                    try:
                        self._chunk(h, step)
                        time.sleep(0.02)  # let the client take it before the next version
                    finally:  # it happened either way; a resumed watch replays it
                        with self.lock:
                            self.sent.add(_rv(step))
                            self.lock.notify_all()
                    continue
                if step.get("cut"):
                    break
                if step.get("expire"):
                    self._expire(rec)
                    if step["expire"] == "event":
                        self._chunk(h, {"type": "ERROR", "object": {
                            "kind": "Status", "apiVersion": "v1", "metadata": {},
                            "status": "Failure", "reason": "Expired", "code": 410,
                            "message": "too old resource version"}})
                    else:
                        with self.lock:
                            rec.pending_http_gone = True
                    break
            self._end(h)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def _expire(self, rec: Recording) -> None:
        """The events up to the next resume marker happen unseen; history is compacted."""
        with self.lock:
            while not rec.exhausted() and not rec.script[rec.position].get("resume"):
                step = rec.script[rec.position]
                while not self._ready(_rv(step)) and not self.stopping.is_set():
                    self.lock.wait(0.05)
                rec.position += 1
                rec.happen(step)
                self.sent.add(_rv(step))
            if not rec.exhausted():
                rec.position += 1  # the resume marker
            rec.compacted_rv = rec.current_rv
            self.lock.notify_all()


# -- a hostile API server: scripted misbehaviour ------------------------------------------

HOSTILE_NODE = {"metadata": {"name": "gpu-1", "uid": "u1", "resourceVersion": "5",
                             "labels": {"nvidia.com/gpu.count": "8"}},
                "status": {"capacity": {"nvidia.com/gpu": "8"},
                           "allocatable": {"nvidia.com/gpu": "8"},
                           "conditions": [{"type": "Ready", "status": "True"}]}}


class HostileApiServer(_LoopbackServer):
    """An API server that misbehaves as ``answer`` says (real HTTP on 127.0.0.1).

    ``answer(server, handler, path, watch, n)`` answers the ``n``-th request (from 0) of
    that kind (list or watch) for ``path`` with the helpers below; ``requests`` logs
    ``(path, watch)``. By default lists hold :data:`HOSTILE_NODE` (no pods) and watches
    end empty after a short while.
    """

    def __init__(self, answer: Any = None) -> None:
        self.answer = answer
        self.requests: list[tuple[str, bool]] = []
        self.lock = threading.Lock()
        self._serve()

    def _get(self, h: BaseHTTPRequestHandler) -> None:
        url = urlsplit(h.path)
        watch = parse_qs(url.query).get("watch") == ["1"]
        with self.lock:
            n = sum(1 for r in self.requests if r == (url.path, watch))
            self.requests.append((url.path, watch))
        try:
            if self.answer is None or not self.answer(self, h, url.path, watch, n):
                self.default(h, url.path, watch)
        except (BrokenPipeError, ConnectionError):
            pass

    def count(self, path: str, watch: bool) -> int:
        with self.lock:
            return sum(1 for r in self.requests if r == (path, watch))

    def default(self, h: BaseHTTPRequestHandler, path: str, watch: bool) -> None:
        if watch:
            self.stream(h, [])
        else:
            items = [HOSTILE_NODE] if path == "/api/v1/nodes" else []
            self.json(h, {"metadata": {"resourceVersion": "5"}, "items": items})

    @staticmethod
    def body(h: BaseHTTPRequestHandler, body: bytes, status: int = 200) -> None:
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    def json(self, h: BaseHTTPRequestHandler, doc: Any, status: int = 200) -> None:
        self.body(h, json.dumps(doc).encode(), status)

    def trickle(self, h: BaseHTTPRequestHandler, body: bytes, every_s: float) -> None:
        """The body one byte per ``every_s`` (every read gets a byte in time)."""
        h.send_response(200)
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        for b in body:
            if self.stopping.wait(every_s):
                return
            h.wfile.write(bytes([b]))
            h.wfile.flush()

    def stream(self, h: BaseHTTPRequestHandler, lines: list[bytes],
               hold_s: float = 0.3) -> None:
        """A watch answer: ``lines`` as chunks, then held ``hold_s``, then ended."""
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Transfer-Encoding", "chunked")
        h.end_headers()
        for line in lines:
            h.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
            h.wfile.flush()
        self.stopping.wait(hold_s)
        h.wfile.write(b"0\r\n\r\n")
        h.wfile.flush()
