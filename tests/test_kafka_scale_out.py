"""Scale-out on a real broker: one processor or two in a consumer group, same facts —
also on two hosts without a shared disk, writing one S3 bucket (S3Proxy).

The telemetry topic has 4 partitions; each instance runs one engine over the partitions it
is assigned (partitions.py). Two instances split the partitions, the owner (partition 0)
writes the cluster-wide facts and gathers the other instance's parts of job attempts.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

import polars as pl
import pytest
from fact_views import assert_same_facts
from kafka_broker import Broker
from s3_server import S3Server
from test_kafka_pipeline import SPARSE, _process, _process_cmd, _publish, _settings, _sim

from gpuledger.pipeline.config import ProcessorConfig
from gpuledger.pipeline.demo import run_demo
from gpuledger.pipeline.kafka.producer import KafkaSink
from gpuledger.pipeline.kafka.settings import KafkaSettings
from gpuledger.pipeline.kafka.topics import create_topics
from gpuledger.pipeline.simulate import simulate
from gpuledger.pipeline.store import open_store


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("embedded")
    run_demo(_sim(), ProcessorConfig(), root)
    return root


def test_two_processors_write_the_facts_of_one(
    kafka: Broker, reference: Path, tmp_path: Path,
) -> None:
    settings = _settings(kafka)
    _publish(settings)
    one = tmp_path / "one"
    _process(settings, one, group="single")
    assert_same_facts(one, reference, SPARSE)

    # a second group: both instances join before the input arrives, so both read some
    settings_two = _settings(kafka)
    create_topics(settings_two, telemetry_partitions=4)
    two = tmp_path / "two"
    cmd = _process_cmd(kafka, settings_two, two, "pair", "--exit-when-idle", "8",
                       "--checkpoint-interval", "1")
    logs = [tmp_path / f"instance-{i}.log" for i in (1, 2)]
    run_pair(cmd, logs, settings_two)
    texts = [log.read_text() for log in logs]
    read = [int(m.group(1)) for t in texts
            for m in [re.search(r"exiting \((\d+) telemetry message", t)] if m]
    assert len(read) == 2 and all(n > 0 for n in read), [t[-2000:] for t in texts]
    assert set().union(*(_shards(log) for log in logs)) == {"000", "001", "002", "003"}
    assert_same_facts(two, one, SPARSE)
    assert_same_facts(two, reference, SPARSE)


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


def run_pair(cmd: list[str], logs: list[Path], settings: KafkaSettings,
             cwds: list[Path] | None = None, env: dict[str, str] | None = None) -> None:
    """Start two instances of ``cmd`` (logs to ``logs``, in ``cwds``), publish the
    simulation as agents once both hold partitions, and wait for both to exit 0."""
    procs = [subprocess.Popen([*cmd, "--instance-id", f"pair-{i}"], env=env,
                              cwd=cwds[i - 1] if cwds else None,
                              stdout=open(log, "wb"), stderr=subprocess.STDOUT)  # noqa: SIM115
             for i, log in enumerate(logs, 1)]
    try:
        deadline = time.monotonic() + 60
        while not all(_shards(log) for log in logs) and time.monotonic() < deadline:
            time.sleep(0.2)
        _publish_as_agents(settings)
        for proc, log in zip(procs, logs, strict=True):
            assert proc.wait(timeout=300) == 0, log.read_text()[-3000:]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _publish_as_agents(settings: KafkaSettings) -> None:
    """Publish the simulation the way live agents and a scheduler do: a message per
    node and minute, each minute's in order (the simulator's batches span 10 minutes).

    Each minute is flushed before the next one is sent: live, a minute's scheduler
    events reach Kafka well within the lateness allowance of the next minute's
    telemetry; here, where a simulated minute takes milliseconds, the producer's
    batching could otherwise hold one partition's events back behind several later
    minutes of another partition's telemetry."""
    sink = KafkaSink(settings)
    for batch in simulate(_sim()):
        minute = {k: f.with_columns(pl.col("time").dt.truncate("1m").alias("_m"))
                  for k, f in batch.items() if not f.is_empty()}
        for m in sorted(set().union(*(set(f["_m"].to_list()) for f in minute.values()))):
            sink.publish_batch({k: f.filter(pl.col("_m") == m).drop("_m")
                                for k, f in minute.items()})
            sink.flush()
    sink.close()


def _shards(log: Path) -> set[str]:
    """The partitions an instance has taken (from its log)."""
    return {f"{int(p):03d}" for p in re.findall(r"partition (\d+) of \S+: from",
                                                 log.read_text())} if log.exists() else set()
