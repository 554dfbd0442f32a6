"""The /metrics servers (agent self-metrics, processor exporter) do not hold doors open:
real sockets against the real servers — paths, HTTP/0.9, idle and slow-loris clients, a
crowd of connections — and the agent's SIGTERM against a closed Kafka port."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from agent_sources import TinySource
from http_client import get, metric

from gpuledger.agent.attribution import Chain
from gpuledger.agent.config import AgentConfig, load_agent_config
from gpuledger.agent.http_server import BoundedHTTPServer
from gpuledger.agent.metrics import MetricsServer, registry_for
from gpuledger.agent.run import Agent
from gpuledger.pipeline.config import ProcessorConfig
from gpuledger.pipeline.exporter import Exporter


def _raw(port: int, data: bytes, wait_s: float = 10.0) -> tuple[bytes, float]:
    """Send ``data``, read until the server closes; (the reply, seconds it took)."""
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=wait_s) as s:
        s.sendall(data)
        reply = b""
        while chunk := s.recv(65536):
            reply += chunk
    return reply, time.monotonic() - started


@pytest.fixture
def agent_server() -> Iterator[MetricsServer]:
    agent = Agent(AgentConfig(node="n1", source="dcgm-exporter"), TinySource(gpus=2), Chain([]))
    agent.cycle()
    server = MetricsServer("127.0.0.1", 0, registry_for(agent), agent.health)
    yield server
    server.close()


@pytest.fixture
def exporter() -> Iterator[int]:
    ex = Exporter(ProcessorConfig())
    port = ex.start("127.0.0.1", 0)
    yield port
    ex.stop()


@pytest.mark.parametrize("which", ["agent", "exporter"])
def test_metrics_and_healthz_only_everything_else_404(
        which: str, agent_server: MetricsServer, exporter: int) -> None:
    port = agent_server.port if which == "agent" else exporter
    status, text = get(port, "/metrics")
    assert status == 200 and ("gpuledger_agent_info" in text or "process_cpu" in text)
    assert get(port, "/healthz")[0] == 200
    assert get(port, "/metrics?x=1")[0] == 200
    for path in ("/", "/metrics/", "/favicon.ico", "/../etc/passwd", "/healthz/x",
                 "/METRICS"):
        assert get(port, path)[0] == 404, path
    assert get(port, "/metrics", "POST")[0] == 405
    assert get(port, "/metrics", "HEAD")[0] == 200
    # HTTP/0.9 (no version, so no headers would follow): answered at once, closed
    reply, took = _raw(port, b"GET /metrics\r\n")
    assert reply.startswith(b"HTTP/1.0 400") and took < 2.0, reply[:80]
    garbage, took = _raw(port, b"\x16\x03\x01\x02\x00\x01\xfc\x03\x03 HELLO\r\n")
    assert garbage.startswith(b"HTTP/1.0 400") and took < 2.0


def _threads() -> int:
    return threading.active_count()


def test_idle_slow_and_crowding_clients_are_cut_off(tmp_path: Path) -> None:
    server = BoundedHTTPServer(("127.0.0.1", 0), {"/metrics": lambda: (200, b"m 1\n",
                                                                        "text/plain")},
                               idle_timeout_s=1.0, header_timeout_s=1.5,
                               max_connections=4).start()
    port = server.port
    try:
        base = _threads()
        # an idle client: closed after the idle timeout
        reply, took = _raw(port, b"")
        assert reply == b"" and 0.8 < took < 4.0
        # a slow-loris client: a header byte every 0.3 s never finishes the request
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(b"GET /metrics HTTP/1.1\r\n")
            started = time.monotonic()
            closed_after = None
            for _ in range(40):
                try:
                    s.sendall(b"X")
                    s.settimeout(0.3)
                    if s.recv(1024) == b"":
                        closed_after = time.monotonic() - started
                        break
                except TimeoutError:
                    continue
                except OSError:
                    closed_after = time.monotonic() - started
                    break
        assert closed_after is not None and closed_after < 4.0, closed_after
        assert server.cut_off >= 1
        # a crowd of idle connections: at most 4 are served at once, the rest closed
        crowd = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(30)]
        time.sleep(0.5)
        assert _threads() <= base + 4 + 1, _threads()
        assert server.refused >= 26                   # closed at once, no thread each
        closed = 0
        for s in crowd:
            s.settimeout(3.0)
            closed += s.recv(1) == b""                    # the others after the timeouts
        assert closed == 30
        for s in crowd:
            s.close()
        # once they are gone, scrapes are answered again, and no thread is left behind
        deadline = time.monotonic() + 10
        while get(port, "/metrics")[0] != 200:
            assert time.monotonic() < deadline
            time.sleep(0.2)
        time.sleep(1.5)
        assert _threads() <= base + 1
    finally:
        server.close()


def test_a_request_beyond_the_connection_bound_is_answered_503() -> None:
    """With every slot held by idle clients, a scrape is told why (503, Retry-After) in
    about its request's time, not reset; an idle extra connection is closed in a second;
    once a slot is free the scrape is answered 200."""
    server = BoundedHTTPServer(("127.0.0.1", 0), {"/metrics": lambda: (200, b"m 1\n",
                                                                        "text/plain")},
                               idle_timeout_s=20.0, header_timeout_s=20.0,
                               max_connections=2).start()
    port = server.port
    try:
        holders = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(2)]
        time.sleep(0.3)
        reply, took = _raw(port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        head, _, body = reply.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.0 503 Service Unavailable"), reply[:80]
        assert b"Retry-After: 1" in head and body == b"too many connections; try again in 1 s\n"
        assert took < 3.0 and server.refused == 1
        idle, took = _raw(port, b"")
        assert idle == b"" and took < 4.0 and server.refused == 2
        holders[0].close()
        deadline = time.monotonic() + 10
        while get(port, "/metrics")[0] != 200:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        for s in holders[1:]:
            s.close()
    finally:
        server.close()


def test_the_agent_listens_on_loopback_unless_configured(tmp_path: Path) -> None:
    assert AgentConfig().metrics.listen == "127.0.0.1:9466"
    assert load_agent_config(None, environ={}).metrics.listen == "127.0.0.1:9466"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])



def test_sigterm_with_kafka_unreachable_stops_within_the_grace_period(tmp_path: Path) -> None:
    grace = 1
    metrics_port = _closed_port()
    config = tmp_path / "agent.yaml"
    config.write_text(yaml.safe_dump({
        "node": "h100-001", "source": "simulator", "interval_s": 0.5,
        "kafka": {"bootstrap": f"127.0.0.1:{_closed_port()}", "send_timeout_s": grace},
        "spool": {"path": str(tmp_path / "spool")},
        "metrics": {"listen": f"127.0.0.1:{metrics_port}"}}))
    proc = subprocess.Popen([sys.executable, "-m", "gpuledger.cli.main", "agent", "--config",
                             str(config)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        deadline = time.monotonic() + 60
        # samples are being spooled and the sender is busy failing to reach Kafka
        while metric(metrics_port, "gpuledger_agent_send_errors_total") < 1:
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < deadline, "no delivery attempt within 60 s"
            time.sleep(0.2)
        time.sleep(0.3)
        stopped = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        took = time.monotonic() - stopped
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert took <= grace + 5, f"SIGTERM took {took:.1f} s"
    assert "Traceback" not in err
    assert "messages in the spool" in err or "stay in the spool" in err
