"""Self-metrics and health over real HTTP, parsed with Prometheus' own text parser."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from agent_sources import TinySource
from http_client import get
from prometheus_client.parser import text_string_to_metric_families

from gpuledger.agent.attribution import Chain
from gpuledger.agent.config import AgentConfig
from gpuledger.agent.metrics import MetricsServer, registry_for
from gpuledger.agent.run import Agent, SharedSpool
from gpuledger.agent.sender import Sender

T0 = datetime(2026, 1, 5, 10, 0, tzinfo=UTC)



def _values(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def _no_room(path: Path, data: bytes) -> None:
    raise OSError(28, "No space left on device")


@pytest.fixture
def agent(tmp_path: Path) -> Agent:
    # a spool too small for what is written, so that it drops and counts
    spool = SharedSpool(tmp_path / "spool", max_bytes=8192, segment_bytes=4096)
    sender = Sender(spool, lambda: None)
    return Agent(AgentConfig(node="n1", source="dcgm-exporter"), TinySource(gpus=4),
                 Chain([]), spool, sender)


def test_metrics_reflect_the_agent(agent: Agent, monkeypatch: pytest.MonkeyPatch) -> None:
    for k in range(12):
        agent.cycle(T0 + timedelta(seconds=10 * k))
    with monkeypatch.context() as m:    # a full disk for one cycle: counted, not stored
        m.setattr("gpuledger.agent.spool._write_all", _no_room)
        with pytest.raises(OSError):
            agent.cycle(T0 + timedelta(seconds=125))
    agent.source.fail = True                                      # type: ignore[attr-defined]
    agent.cycle(T0 + timedelta(seconds=130))
    server = MetricsServer("127.0.0.1", 0, registry_for(agent), agent.health)
    try:
        status, text = get(server.port, "/metrics")
        health_code, health_text = get(server.port, "/healthz")
        missing, _ = get(server.port, "/nope")
    finally:
        server.close()
    assert status == 200 and missing == 404
    v = _values(text)
    src = (("collector", "dcgm-exporter"),)
    assert v[("gpuledger_agent_collector_success", src)] == 0
    assert v[("gpuledger_agent_collector_errors_total", src)] == 1
    assert v[("gpuledger_agent_collector_duration_seconds", src)] == agent.last_duration_s
    assert v[("gpuledger_agent_samples_total", ())] == 48 == agent.samples
    assert agent.spool is not None and agent.spool.dropped_messages > 0
    assert v[("gpuledger_agent_spool_dropped_messages_total", ())] == agent.spool.dropped_messages
    assert v[("gpuledger_agent_spool_dropped_bytes_total", ())] == agent.spool.dropped_bytes
    assert v[("gpuledger_agent_spool_failed_appends_total", ())] == 1 == agent.spool.failed_appends
    assert v[("gpuledger_agent_spool_bytes", ())] == agent.spool.bytes_used
    assert v[("gpuledger_agent_spool_backlog_messages", ())] == agent.spool.backlog
    assert v[("gpuledger_agent_sent_messages_total", ())] == 0
    # the spool dropped messages: the inventory was spooled again after each drop
    assert v[("gpuledger_agent_inventory_published_total", ())] \
        == agent.publisher.published > 1
    assert ("gpuledger_agent_last_send_success_timestamp_seconds", ()) not in v
    info = (("agent", "n1"), ("node", "n1"), ("source", "dcgm-exporter"))
    assert v[("gpuledger_agent_info", info)] == 1
    assert health_code == 503 and "driver hiccup" in health_text


def test_healthz_before_and_after_a_good_collection(agent: Agent) -> None:
    server = MetricsServer("127.0.0.1", 0, registry_for(agent), agent.health)
    try:
        before = get(server.port, "/healthz")
        agent.cycle(T0)
        after = get(server.port, "/healthz")
    finally:
        server.close()
    assert before[0] == 503 and "no collection" in before[1]
    assert after[0] == 200 and after[1].startswith("ok")
