"""Processors on many hosts, one bucket: two `gpuledger process` instances, each in a
folder of its own (no shared disk), write one S3 warehouse (S3Proxy) with their
checkpoints in the bucket; the facts equal one instance's and the embedded bus's."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from fact_views import assert_same_facts
from kafka_broker import Broker
from s3_server import S3Server
from test_kafka_pipeline import SPARSE, _process_cmd, _settings, _sim
from test_kafka_scale_out import _shards, run_pair

from gpuledger.pipeline.config import ProcessorConfig
from gpuledger.pipeline.demo import run_demo
from gpuledger.pipeline.kafka.topics import create_topics
from gpuledger.pipeline.store import open_store


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("embedded")
    run_demo(_sim(), ProcessorConfig(), root)
    return root


def test_two_processors_on_two_hosts_write_one_bucket(
    kafka: Broker, s3: S3Server, reference: Path, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url = s3.bucket() + "/wh"
    settings = _settings(kafka)
    create_topics(settings, telemetry_partitions=4)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("AWS_")}, **s3.env()}
    cmd = _process_cmd(kafka, settings, Path("unused"), "bucket", "--exit-when-idle", "8",
                       "--checkpoint-interval", "1")
    cmd[cmd.index("--warehouse") + 1] = url
    hosts = [tmp_path / f"host-{i}" for i in (1, 2)]
    for host in hosts:
        host.mkdir()
    logs = [h / "process.log" for h in hosts]
    run_pair(cmd, logs, settings, cwds=hosts, env=env)
    assert set().union(*(_shards(log) for log in logs)) == {"000", "001", "002", "003"}
    for host in hosts:  # nothing of the warehouse or its state on either host's disk
        assert sorted(p.name for p in host.iterdir()) == ["process.log"]
    texts = [log.read_text() for log in logs]
    assert not any(s3.secret_key in t for t in texts)
    for key, value in s3.env().items():
        monkeypatch.setenv(key, value)
    store = open_store(url)
    state = {e.path for e in store.list("state/bucket")}
    assert {f"state/bucket/partition-p{p:03d}.checkpoint" for p in range(4)} <= state
    assert_same_facts(url, reference, SPARSE)
