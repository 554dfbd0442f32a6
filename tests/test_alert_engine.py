"""The processor's alert engine: fire once after the grace period, hold, resolve with
hysteresis, no flapping, memory over-sizing, fragmentation blocking; delivery to an
Alertmanager-shaped webhook (a real local HTTP server) and to the Kafka alerts topic."""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from events import alloc, at, frames, inventory, job, series

from gpuledger.pipeline.alerts.engine import AlertEngine
from gpuledger.pipeline.alerts.model import Alert
from gpuledger.pipeline.alerts.sinks import KafkaAlertSink, ListSink, WebhookSink, alerts_topic
from gpuledger.pipeline.config import ProcessorConfig
from gpuledger.pipeline.processor import Processor
from gpuledger.pipeline.warehouse import Warehouse

CONFIG = ProcessorConfig()
A = CONFIG.alerts


def ramp(node: str, gpu: int, job_id: str, levels: list[tuple[int, float]],
         mem: float = 40_000.0) -> list[dict[str, Any]]:
    """Samples for consecutive spans: [(minutes, activity), ...] from minute 0."""
    out: list[dict[str, Any]] = []
    start = 0
    for minutes, level in levels:
        out += series(node, gpu, at(start), minutes, sm=level, mem=mem, jobs=[job_id],
                      seq0=start * 6)
        start += minutes
    return out


def scenario() -> list[dict[str, Any]]:
    recs: list[dict[str, Any]] = [inventory("n1", at(0), gpus=8)]
    # j1: 5 % for an hour, then 50 %: fires after the grace period, resolves on recovery
    recs += [job("submitted", "j1", at(0), team="nlp", queue="prod"),
             job("started", "j1", at(0), allocation=alloc("n1", 0)),
             job("finished", "j1", at(90))]
    recs += ramp("n1", 0, "j1", [(60, 0.05), (30, 0.5)])
    # j2: 5 % for 20 min, then 12 % (between 10 % and 15 %): fires once, never flaps,
    # resolves when the job ends
    recs += [job("submitted", "j2", at(0), team="cv"),
             job("started", "j2", at(0), allocation=alloc("n1", 1)),
             job("finished", "j2", at(80))]
    recs += ramp("n1", 1, "j2", [(20, 0.05), (60, 0.12)])
    # j3: 12 % all along (never below 10 %): never fires
    recs += [job("submitted", "j3", at(0)), job("started", "j3", at(0), allocation=alloc("n1", 2)),
             job("finished", "j3", at(90))]
    recs += ramp("n1", 2, "j3", [(90, 0.12)])
    # j4: idle, but ends inside its grace period: never fires
    recs += [job("submitted", "j4", at(0)), job("started", "j4", at(0), allocation=alloc("n1", 3)),
             job("finished", "j4", at(10))]
    recs += ramp("n1", 3, "j4", [(10, 0.0)])
    # j5: busy but holds 81,559 MiB and uses 8,000: memory over-sized once it ran 1 h
    recs += [job("submitted", "j5", at(0)), job("started", "j5", at(0), allocation=alloc("n1", 4)),
             job("finished", "j5", at(90))]
    recs += ramp("n1", 4, "j5", [(90, 0.6)], mem=8000.0)
    # GPUs 5-7 idle without a job, so the node never has telemetry gaps
    for g in (5, 6, 7):
        recs += series("n1", g, at(0), 95, sm=0.0, mem=0.0)
    return recs


def run(recs: list[dict[str, Any]], tmp_path: Path, sinks: list[Any],
        step_minutes: int = 10) -> AlertEngine:
    proc = Processor(CONFIG, Warehouse(tmp_path / "wh"))
    engine = AlertEngine(CONFIG, sinks)
    engine.attach(proc)
    end = max(r["time"] for r in recs)
    t = at(0)
    while t <= end:
        nxt = t + timedelta(minutes=step_minutes)
        proc.process(frames([r for r in recs if t <= r["time"] < nxt]))
        t = nxt
    proc.flush()
    return engine


def by_job(events: list[Alert]) -> dict[str, list[Alert]]:
    out: dict[str, list[Alert]] = {}
    for e in events:
        out.setdefault(e.job_id, []).append(e)
    return out


def first_minute_above(low: float, high: float, threshold: float, window: int = 30) -> int:
    """Minutes of ``high`` after ``low`` until the trailing mean passes ``threshold``."""
    k = 0
    while (low * (window - k) + high * k) / window <= threshold:
        k += 1
    return k


@pytest.fixture(scope="module")
def scenario_events(tmp_path_factory: pytest.TempPathFactory) -> list[Alert]:
    sink = ListSink()
    run(scenario(), tmp_path_factory.mktemp("alerts"), [sink])
    return sink.events


def test_low_utilisation_fires_once_after_grace_and_resolves_with_hysteresis(
        scenario_events: list[Alert]) -> None:
    ev = by_job([e for e in scenario_events if e.name == "GpuJobLowUtilisation"])
    grace = timedelta(seconds=A.low_util_grace_s)
    # j1: fires once, at the end of the grace period, with its evidence
    j1 = ev["j1"]
    assert [e.status for e in j1] == ["firing", "resolved"]
    fire, resolve = j1
    assert fire.starts_at == at(0) + grace
    assert fire.evidence["mean_activity"] == pytest.approx(0.05)
    assert fire.evidence["runtime_s"] == A.low_util_grace_s
    assert fire.evidence["window_s"] == A.low_util_grace_s          # shorter than 30 min
    wasted = (A.low_util_grace_s / 60) * (1 - 0.05) / 60
    assert fire.evidence["wasted_gpu_hours"] == pytest.approx(wasted)
    assert fire.severity == ("info" if wasted < A.waste_warning_gpu_hours else "warning")
    assert fire.labels["team"] == "nlp" and fire.labels["queue"] == "prod"
    assert "5.0%" in fire.description and fire.recommendation
    # resolves when the trailing 30-minute mean passes 15 %, not when it passes 10 %
    k = first_minute_above(0.05, 0.5, A.low_util_resolve_activity)
    assert resolve.ends_at == at(60 + k)
    assert resolve.resolution == "recovered"
    assert resolve.evidence["resolved_mean_activity"] > A.low_util_resolve_activity
    assert first_minute_above(0.05, 0.5, A.low_util_activity) < k   # hysteresis mattered
    # j2 hovers at 12 %: one firing, held (no flapping), resolved when the job ends
    assert [(e.status, e.resolution) for e in ev["j2"]] == [("firing", None),
                                                            ("resolved", "job ended")]
    assert ev["j2"][0].starts_at == at(0) + grace and ev["j2"][1].ends_at == at(80)
    assert "j3" not in ev and "j4" not in ev


def test_memory_oversized_fires_after_the_minimum_runtime(
        scenario_events: list[Alert]) -> None:
    mem = by_job([e for e in scenario_events if e.name == "GpuJobMemoryOversized"])
    assert set(mem) == {"j5"}
    fire, end = mem["j5"]
    # the first minute whose end is more than 1 h after the start
    assert fire.starts_at == at(0) + timedelta(seconds=A.memory_oversized_runtime_s,
                                               minutes=1)
    assert fire.evidence["mem_peak_mib"] == 8000.0
    assert fire.evidence["mem_held_mib"] == 81_559.0
    assert fire.evidence["mem_peak_ratio"] == pytest.approx(8000 / 81_559, abs=1e-4)
    assert "A10-24GB" in fire.recommendation          # 8,000 MiB fits 90 % of 23,028
    assert end.status == "resolved" and end.ends_at == at(90) and end.resolution == "job ended"


def test_same_events_whatever_the_batching(tmp_path: Path,
                                          scenario_events: list[Alert]) -> None:
    other = ListSink()
    run(scenario(), tmp_path, [other], step_minutes=3)

    def key(e: Alert) -> tuple[Any, ...]:
        return (e.name, e.job_id, e.status, e.starts_at, e.ends_at)

    assert [key(e) for e in scenario_events] == [key(e) for e in other.events]
    assert len(other.events) == 6     # j1, j2: fire + resolve; j5 memory: fire + resolve


def blocked_scenario() -> list[dict[str, Any]]:
    recs: list[dict[str, Any]] = [inventory("n1", at(0), gpus=4), inventory("n2", at(0), gpus=4)]
    # two GPUs busy on each node: 4 free, but at most 2 on one node; a 3-GPU job waits.
    # b ends at minute 44 (n2 then has 4 free: big is no longer blocked); big starts at 45
    recs += [job("submitted", "a", at(0)), job("started", "a", at(0), allocation=alloc("n1", 0, 1)),
             job("submitted", "b", at(0)), job("started", "b", at(0), allocation=alloc("n2", 0, 1)),
             job("finished", "b", at(44)),
             job("submitted", "big", at(0), gpus=3, team="nlp", queue="batch"),
             job("started", "big", at(45), allocation=alloc("n2", 0, 1, 2))]
    for node in ("n1", "n2"):
        for g in range(4):
            recs += [{**r, "node": node} for r in series("x", g, at(0), 60, sm=0.5)]
    return recs


def test_blocked_by_fragmentation_fires_after_30_minutes_and_resolves(tmp_path: Path) -> None:
    sink = ListSink()
    run(blocked_scenario(), tmp_path, [sink])
    ev = [e for e in sink.events if e.name == "GpuJobBlockedByFragmentation"]
    assert [(e.job_id, e.status) for e in ev] == [("big", "firing"), ("big", "resolved")]
    fire, resolve = ev
    assert fire.starts_at == at(0) + timedelta(seconds=A.blocked_s)
    assert fire.evidence["gpus"] == 3 and fire.evidence["free_gpus"] == 4
    assert fire.evidence["largest_free_block"] == 2
    assert fire.labels["queue"] == "batch"
    assert resolve.ends_at == at(44) and resolve.resolution == "unblocked"


class Receiver:
    """A real HTTP server that records what is POSTed to /api/v2/alerts. ``answers``: the
    HTTP status of each next POST (200 once they run out); ``gate``: while clear, every
    POST waits for it (a hung Alertmanager)."""

    def __init__(self) -> None:
        self.posts: list[Any] = []
        self.answers: list[int] = []
        self.tries = 0
        self.gate = threading.Event()
        self.gate.set()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                outer.gate.wait(30)
                outer.tries += 1
                code = outer.answers.pop(0) if outer.answers else 200
                if code == 200:
                    outer.posts.append((self.path, self.headers["Content-Type"],
                                        json.loads(body)))
                self.send_response(code)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/api/v2/alerts"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.gate.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


def test_webhook_receives_alertmanager_shaped_alerts(tmp_path: Path, receiver: Receiver) -> None:
    listed = ListSink()
    hook = WebhookSink(receiver.url, resend_s=3600)
    run(scenario(), tmp_path, [listed, hook])
    assert hook.flush(30)
    sent = [a for path, ctype, body in receiver.posts for a in body]
    assert all(path == "/api/v2/alerts" and ctype == "application/json"
               for path, ctype, _ in receiver.posts)
    assert len(sent) == len(listed.events) == hook.posts + sum(
        len(b) - 1 for _, _, b in receiver.posts)
    for alert, event in zip(sent, listed.events, strict=True):
        assert set(alert) >= {"labels", "annotations", "startsAt", "generatorURL"}
        assert alert["labels"]["alertname"] == event.name
        assert alert["labels"]["job_id"] == event.job_id
        assert alert["labels"]["severity"] in ("info", "warning", "critical")
        assert {"summary", "description", "recommendation", "evidence"} <= set(
            alert["annotations"])
        assert json.loads(alert["annotations"]["evidence"])  # the numbers, as JSON
        assert datetime.fromisoformat(alert["startsAt"].replace("Z", "+00:00")) == \
            event.starts_at
        assert ("endsAt" in alert) == (event.status == "resolved")
        assert alert["generatorURL"].startswith("gpuledger://job/")


def test_the_ops_surface_counts_alerts_and_keeps_none(tmp_path: Path) -> None:
    """``gpuledger process`` runs for months: its summary counts the alerts fired by name,
    and no event stays referenced once the sinks have had it."""
    import gc
    import weakref
    from collections import Counter

    from gpuledger.pipeline.ops import OpsSurface

    surface = OpsSurface(CONFIG, alerts=True)
    assert surface.engine is not None
    listed = ListSink()
    refs: list[weakref.ref[Alert]] = []

    class Watch:
        def publish(self, events: list[Alert], active: list[Alert]) -> None:
            refs.extend(weakref.ref(e) for e in events)

    run(scenario(), tmp_path, [*surface.engine.sinks, listed, Watch()])
    counts = dict(Counter(e.name for e in listed.events if e.status == "firing"))
    assert counts and surface.tally.fired == counts
    assert (surface.summary() or "").startswith(f"alerts: {sum(counts.values())} fired (")
    listed.events.clear()  # the engine run is gone too: only the surface's sinks remain
    gc.collect()
    assert refs and all(r() is None for r in refs)


def test_webhook_resends_firing_alerts(tmp_path: Path, receiver: Receiver) -> None:
    hook = WebhookSink(receiver.url, resend_s=0)  # resend at every evaluation
    run(scenario(), tmp_path, [hook], step_minutes=10)
    assert hook.flush(30)
    firing_posts = [b for _, _, b in receiver.posts
                    if any(a["labels"]["job_id"] == "j2" and "endsAt" not in a for a in b)]
    assert len(firing_posts) > 3      # j2 fires at minute 15 and is resent until minute 80


def firing(job_id: str) -> Alert:
    return Alert(name="GpuLowUtilisation", job_id=job_id, attempt=0, severity="warning",
                 starts_at=at(0), summary="s", description="d", recommendation="r",
                 evidence={"mean_activity": 0.05})


def test_a_hung_webhook_does_not_hold_up_the_close_pass(receiver: Receiver) -> None:
    """publish only queues: with the endpoint hung, it returns at once and the alerts go
    out, in order, once the endpoint answers."""
    receiver.gate.clear()
    hook = WebhookSink(receiver.url, resend_s=3600)
    for name in ("a", "b", "c"):
        hook.publish([firing(name)], [])
    assert receiver.posts == [] and hook.posts == 0   # nothing answered yet
    assert not hook.flush(0.2)
    receiver.gate.set()
    assert hook.flush(30)
    assert [b[0]["labels"]["job_id"] for _, _, b in receiver.posts] == ["a", "b", "c"]
    assert (hook.posts, hook.delivered, hook.failures, hook.dropped) == (3, 3, 0, 0)
    hook.close()


def test_the_webhook_retries_while_the_failure_may_pass(receiver: Receiver) -> None:
    """503, connection trouble and 429 are tried again; a later list waits behind."""
    receiver.answers = [503, 429]
    hook = WebhookSink(receiver.url, resend_s=3600, retry_first_s=0.01)
    hook.publish([firing("a")], [])
    hook.publish([firing("b")], [])
    assert hook.flush(30)
    assert [b[0]["labels"]["job_id"] for _, _, b in receiver.posts] == ["a", "b"]
    assert receiver.tries == 4
    assert (hook.posts, hook.delivered, hook.failures, hook.dropped) == (2, 2, 2, 0)
    hook.close()


def test_the_webhook_gives_up_what_cannot_pass(receiver: Receiver,
                                                caplog: pytest.LogCaptureFixture) -> None:
    """A 400 (Alertmanager rejects the list) is not tried again; a 500 that lasts past
    ``retry_for_s`` is given up; both are logged and counted, and the next list goes."""
    receiver.answers = [400] + [500] * 1000
    hook = WebhookSink(receiver.url, resend_s=3600, retry_first_s=0.01, retry_max_s=0.02,
                       retry_for_s=0.3)
    hook.publish([firing("a")], [])
    hook.publish([firing("b"), firing("c")], [])
    assert hook.flush(30)
    assert receiver.posts == [] and 2 < receiver.tries < 100
    assert (hook.posts, hook.dropped) == (0, 3)
    assert "HTTP 400 Bad Request; 1 alert event(s) given up after 1 try" in caplog.text
    assert "HTTP 500 Internal Server Error; 2 alert event(s) given up after" in caplog.text
    receiver.answers = []
    hook.publish([firing("d")], [])
    assert hook.flush(30) and hook.delivered == 1
    hook.close()


def test_the_webhook_queue_is_bounded_and_close_is_bounded(
        receiver: Receiver, caplog: pytest.LogCaptureFixture) -> None:
    """A hung endpoint: past ``max_queued`` the oldest waiting list is given up, and
    ``close`` waits at most its timeout, then counts what was left."""
    receiver.gate.clear()
    hook = WebhookSink(receiver.url, resend_s=3600, timeout_s=0.5, retry_first_s=0.05,
                       max_queued=2)
    hook.publish([firing("a")], [])
    deadline = time.monotonic() + 10
    while hook._in_flight is None and time.monotonic() < deadline:  # "a" is being posted
        time.sleep(0.01)
    for name in ("b", "c", "d", "e"):
        hook.publish([firing(name)], [])
    assert hook.dropped == 2   # b, then c: the oldest waiting
    assert caplog.text.count("the oldest are given up from now on") == 1   # said once
    started = time.monotonic()
    hook.close(timeout_s=0.2)
    assert time.monotonic() - started < 1.0      # its budget, not the POST's timeout
    assert hook.dropped == 5 and hook.posts == 0  # d, e and the one being posted
    assert "3 alert event(s) not delivered at exit" in caplog.text
    hook.publish([firing("f")], [])  # after close: counted, not queued
    assert hook.dropped == 6
    assert hook._thread is not None
    hook._thread.join(5)
    assert not hook._thread.is_alive() and hook.dropped == 6   # it counted nothing more


class Misbehaving:
    """A TCP server that answers every connection with ``reply`` (raw bytes), then
    ``then``: "close", or "hold" (keeps the connection open, sending nothing more), or
    "drip" (a byte every 0.2 s, for ever)."""

    def __init__(self, reply: bytes, then: str = "close") -> None:
        import socket

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/api/v2/alerts"
        self.requests: list[bytes] = []
        self.reply, self.then = reply, then
        self.stop = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: Any) -> None:
        with conn:
            conn.settimeout(5)
            try:
                self.requests.append(conn.recv(65536))
                conn.sendall(self.reply)
                while self.then != "close" and not self.stop.is_set():
                    if self.then == "drip":
                        conn.sendall(b"x")
                    time.sleep(0.2)
            except OSError:
                pass

    def close(self) -> None:
        self.stop.set()
        self.sock.close()


@pytest.mark.parametrize("reply, then", [
    (b"HTTP/1.1 301 Moved\r\nLocation: ftp://127.0.0.1:1/etc/passwd\r\n"
     b"Content-Length: 0\r\n\r\n", "close"),
    (b"HTTP/1.1 302 Found\r\nLocation: /elsewhere\r\nContent-Length: 0\r\n\r\n", "close"),
], ids=["301-to-ftp", "302"])
def test_a_redirect_is_not_followed_and_not_counted_delivered(reply: bytes, then: str) -> None:
    server = Misbehaving(reply, then)
    try:
        hook = WebhookSink(server.url, retry_first_s=0.01)
        hook.publish([firing("a")], [])
        assert hook.flush(30)
        assert (hook.posts, hook.delivered, hook.failures, hook.dropped) == (0, 0, 1, 1)
        assert len(server.requests) == 1 and server.requests[0].startswith(b"POST ")
        hook.close()
    finally:
        server.close()


def test_a_200_whose_body_is_cut_short_is_delivered() -> None:
    """The status line said the list was taken; the rest of the answer is not needed."""
    server = Misbehaving(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\nshort", "close")
    try:
        hook = WebhookSink(server.url, retry_first_s=0.01)
        hook.publish([firing("a")], [])
        assert hook.flush(30) and hook.delivered == 1 and hook.dropped == 0
        hook.close()
    finally:
        server.close()


@pytest.mark.parametrize("reply, then", [
    (b"this is not HTTP\r\n\r\n", "close"),
    (b"HTTP/1.1 200 OK\r\n" + b"X-A: b\r\n" * 150 + b"\r\n", "close"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", "drip"),
    (b"HTTP/1.1 200 OK\r\nContent-Le", "hold"),
], ids=["garbage", "too-many-headers", "endless-body", "stops-in-headers"])
def test_a_broken_answer_is_a_failure_and_the_sender_lives_on(reply: bytes, then: str) -> None:
    """Each answer is a failed POST, retried, then given up: counted, never a traceback,
    never more than the POST's time limit, and the next list is sent."""
    server = Misbehaving(reply, then)
    try:
        hook = WebhookSink(server.url, timeout_s=1.0, retry_first_s=0.01, retry_max_s=0.02,
                           retry_for_s=0.05)
        started = time.monotonic()
        hook.publish([firing("a")], [])
        assert hook.flush(30)
        assert time.monotonic() - started < 8
        assert hook.posts == 0 and hook.dropped == 1 and hook.failures >= 1
        assert hook._thread is not None and hook._thread.is_alive()
        hook.publish([firing("b")], [])
        assert hook.flush(30) and hook.dropped == 2
        hook.close()
    finally:
        server.close()


def test_new_alerts_do_not_cut_a_retry_wait_short(receiver: Receiver) -> None:
    receiver.answers = [500] * 100
    hook = WebhookSink(receiver.url, retry_first_s=0.5, retry_max_s=0.5, retry_for_s=600)
    hook.publish([firing("a")], [])
    for name in "bcdefghij":
        time.sleep(0.1)
        hook.publish([firing(name)], [])
    assert receiver.tries <= 3     # 1 s of 0.5 s waits: 2 or 3 tries, not one per list
    hook.close(timeout_s=0)


@pytest.mark.parametrize("url", [
    "http://admin:s3cret@127.0.0.1:9093/api/v2/alerts",
    "http://127.0.0.1:9093/api/v2/alerts x", "http://127.0.0.1:9093/a\nb"])
def test_webhook_urls_with_credentials_or_spaces_are_refused(url: str) -> None:
    from gpuledger.pipeline.alerts.sinks import webhook_problem

    assert webhook_problem(url)
    with pytest.raises(ValueError):
        WebhookSink(url)


def test_a_webhook_url_with_nobody_listening_is_retried_then_given_up() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]   # closed again: nothing listens there
    hook = WebhookSink(f"http://127.0.0.1:{port}/api/v2/alerts", retry_first_s=0.01,
                       retry_max_s=0.02, retry_for_s=0.2)
    hook.publish([firing("a")], [])
    assert hook.flush(30)
    assert hook.posts == 0 and hook.failures >= 2 and hook.dropped == 1
    hook.close()


def test_kafka_alerts_topic_receives_each_event_once(tmp_path: Path, kafka: Any) -> None:
    from kafka import KafkaConsumer

    from gpuledger.pipeline.kafka.settings import load_settings

    settings = load_settings(kafka.bootstrap, {"GPULEDGER_KAFKA_TOPIC_PREFIX":
                                               f"alerts-{uuid.uuid4().hex[:8]}."})
    topic = alerts_topic(settings)
    listed = ListSink()
    sink = KafkaAlertSink(settings)
    try:
        run(scenario(), tmp_path, [listed, sink])
    finally:
        sink.close()
    consumer = KafkaConsumer(topic, **settings.client_config(), auto_offset_reset="earliest",
                             consumer_timeout_ms=2000)
    got: list[tuple[str, dict[str, Any]]] = []
    deadline = time.monotonic() + 30
    while len(got) < len(listed.events) and time.monotonic() < deadline:
        for m in consumer:
            got.append((m.key.decode(), json.loads(m.value)))
    consumer.close()
    assert len(got) == len(listed.events) == sink.sent
    for (key, msg), event in zip(got, listed.events, strict=True):
        assert key == f"{event.name}/{event.job_id}/{event.attempt}"
        assert msg["status"] == event.status
        assert msg["labels"]["alertname"] == event.name
        assert msg["evidence"] == json.loads(json.dumps(event.evidence, default=str))


def test_kafka_alert_events_in_a_broker_outage_are_held_and_sent_once_it_answers(
        kafka: Any, caplog: pytest.LogCaptureFixture) -> None:
    """The broker down before the first event: ``publish`` returns within about a second
    (the producer's first send waited 60 s for the topic's metadata, holding the Kafka
    service's close pass, which then said nothing of the outage), holds the events, and
    sends them, each once and in order, when the broker answers again."""
    from kafka_fixtures import topic_messages

    from gpuledger.pipeline.alerts.sinks import SEND_WAIT_MS
    from gpuledger.pipeline.kafka.settings import load_settings

    if not kafka.managed:
        pytest.skip("broker from GPULEDGER_TEST_KAFKA_BOOTSTRAP: not ours to stop")
    caplog.set_level(logging.INFO, logger="gpuledger.alerts")
    settings = load_settings(kafka.bootstrap, {"GPULEDGER_KAFKA_TOPIC_PREFIX":
                                               f"held-{uuid.uuid4().hex[:8]}."})
    sink = KafkaAlertSink(settings)   # the topic made; the producer has sent nothing
    try:
        kafka.stop_process()
        try:
            waited = []
            for name in ("a", "b", "c"):
                t0 = time.monotonic()
                sink.publish([firing(f"{name}1"), firing(f"{name}2")], [])
                waited.append(time.monotonic() - t0)
        finally:
            kafka.start_again(timeout_s=90)
        assert len(sink.held) == 6 and sink.failures == 0, (len(sink.held), sink.failures)
        # one bounded wait per evaluation, not one per event
        assert max(waited) < SEND_WAIT_MS / 1000 + 5, waited
        sink.publish([firing("after")], [])
    finally:
        sink.close()
    assert not sink.held and sink.failures == 0 and sink.sent == 7
    got = [m.key.decode().split("/")[1] for m in topic_messages(
        kafka.bootstrap, alerts_topic(settings))]
    assert got == ["a1", "a2", "b1", "b2", "c1", "c2", "after"]
    said = [r.getMessage() for r in caplog.records if r.name == "gpuledger.alerts"]
    # the outage said once (not at each of its three evaluations), and its end
    assert sum("broker not reachable" in m for m in said) == 1, said
    assert any("held alert event(s) handed to the producer" in m for m in said), said
