"""``gpuledger bridge kubernetes --kafka`` into a real broker: the same records as the
JSON-lines output, job events keyed by job id, inventory keyed by node."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import yaml
from k8s_api_server import FakeApiServer
from kafka import KafkaConsumer

from gpuledger.cli.main import main

FIXTURES = Path(__file__).parent / "fixtures" / "kubernetes"


def _consume(kafka: Any, topic: str, want: int) -> list[tuple[str, dict[str, Any]]]:
    consumer = KafkaConsumer(topic, auto_offset_reset="earliest", enable_auto_commit=False,
                             consumer_timeout_ms=2000, **kafka.client_kwargs())
    got: list[tuple[str, dict[str, Any]]] = []
    deadline = time.monotonic() + 30
    try:
        while len(got) < want and time.monotonic() < deadline:
            for msg in consumer:
                got.append((msg.key.decode(), json.loads(msg.value)))
    finally:
        consumer.close()
    return got


def test_records_reach_kafka_keyed_like_the_contract(kafka: Any, tmp_path: Path) -> None:
    prefix = f"k8s-{uuid.uuid4().hex[:8]}."
    assert main(["topics", "create", "--kafka", kafka.bootstrap, "--topic-prefix", prefix,
                 "--telemetry-partitions", "1"]) == 0
    with FakeApiServer(FIXTURES) as server:
        config = tmp_path / "k8s.yaml"
        config.write_text(yaml.safe_dump({"kubernetes": {"server": server.url}}))
        assert main(["bridge", "kubernetes", "--config", str(config), "--once", "--quiet",
                     "--out", str(tmp_path / "events.jsonl"),
                     "--state", str(tmp_path / "file.state")]) == 0
        assert main(["bridge", "kubernetes", "--config", str(config), "--once", "--quiet",
                     "--kafka", kafka.bootstrap, "--topic-prefix", prefix,
                     "--state", str(tmp_path / "kafka.state")]) == 0
    expected = [json.loads(line) for line in
                (tmp_path / "events.jsonl").read_text().splitlines()]
    jobs = [r for r in expected if r["type"] == "job"]
    inventory = [r for r in expected if r["type"] == "inventory"]
    got_jobs = _consume(kafka, f"{prefix}sched.events.v1", len(jobs))
    got_inventory = _consume(kafka, f"{prefix}gpu.inventory.v1", len(inventory))
    assert sorted(json.dumps(v, sort_keys=True) for _, v in got_jobs) == \
        sorted(json.dumps(r, sort_keys=True) for r in jobs)
    # inventory carries the bridge's clock; the two runs saw the same nodes
    def state(r: dict[str, Any]) -> str:
        return json.dumps({k: v for k, v in r.items() if k != "time"}, sort_keys=True)

    assert sorted(state(v) for _, v in got_inventory) == sorted(state(r) for r in inventory)
    assert all(k == v["job_id"] for k, v in got_jobs)
    assert all(k == v["node"] for k, v in got_inventory)
