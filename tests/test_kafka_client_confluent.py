"""The service on confluent-kafka (GPULEDGER_KAFKA_CLIENT=confluent) keeps the promises it
keeps on kafka-python (tests/test_kafka_pipeline.py): the same facts as the embedded bus,
dead letters with their origin while the rest goes through, nothing lost or doubled over
10 SIGKILLs, offsets committed only with a checkpoint."""

from __future__ import annotations

import dataclasses
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer
from confluent_kafka import TopicPartition as CTP
from fact_views import assert_same_facts
from kafka import KafkaProducer, TopicPartition
from kafka_broker import Broker
from test_kafka_pipeline import (  # noqa: F401  (reference: a fixture)
    SPARSE,
    _process_cmd,
    _publish,
    reference,
)

from gpuledger.pipeline.config import ProcessorConfig
from gpuledger.pipeline.kafka.client import open_consumer
from gpuledger.pipeline.kafka.client_confluent import ConfluentConsumer, consumer_config
from gpuledger.pipeline.kafka.service import KafkaProcessorService, ServiceOptions
from gpuledger.pipeline.kafka.settings import (
    KafkaSettings,
    KafkaSettingsError,
    Topics,
    load_settings,
)
from gpuledger.pipeline.kafka.wire import ARROW, JSONL
from gpuledger.pipeline.warehouse import read_table


def _settings(kafka: Broker) -> KafkaSettings:
    prefix = f"c{uuid.uuid4().hex[:8]}."
    return KafkaSettings(bootstrap=kafka.bootstrap, topics=Topics().prefixed(prefix),
                         client="confluent")


def _process(settings: KafkaSettings, root: Path, group: str = "g") -> KafkaProcessorService:
    service = KafkaProcessorService(settings, ProcessorConfig(), root,
                                    ServiceOptions(group_id=group, exit_when_idle_s=2.0,
                                                   checkpoint_interval_s=1.0))
    try:
        service.run()
    finally:
        service.close()
    return service


def _committed(kafka: Broker, group: str, topic: str, partitions: int) -> list[int]:
    c = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": group})
    try:
        got = c.committed([CTP(topic, p) for p in range(partitions)], timeout=30)
        return [tp.offset for tp in got]
    finally:
        c.close()


def test_the_client_is_chosen_by_the_environment() -> None:
    env = {"GPULEDGER_KAFKA_CLIENT": "confluent"}
    assert load_settings("h:1", env).client == "confluent"
    assert load_settings("h:1", {}).client == "kafka-python"
    with pytest.raises(KafkaSettingsError, match="GPULEDGER_KAFKA_CLIENT"):
        load_settings("h:1", {"GPULEDGER_KAFKA_CLIENT": "pykafka"})


def test_options_translate_and_unknown_ones_are_refused() -> None:
    settings = KafkaSettings(bootstrap="h:1", client="confluent")
    cfg = consumer_config(settings, {"group_id": "g", "max_partition_fetch_bytes": 1 << 20,
                                     "fetch_max_bytes": 8 << 20, "group_instance_id": None})
    assert cfg["group.id"] == "g" and cfg["max.partition.fetch.bytes"] == 1 << 20
    assert cfg["enable.auto.commit"] is False and "group.instance.id" not in cfg
    assert cfg["receive.message.max.bytes"] > cfg["fetch.max.bytes"]
    with pytest.raises(ValueError, match="consumer_timeout_ms"):
        consumer_config(settings, {"consumer_timeout_ms": 5})
    with pytest.raises(ValueError, match="enable_auto_commit"):
        consumer_config(settings, {"enable_auto_commit": True})


@pytest.mark.parametrize("fmt", [ARROW, JSONL], ids=["arrow", "jsonl"])
def test_confluent_gives_the_same_facts_as_the_embedded_bus(
    kafka: Broker, reference: Path, tmp_path: Path, fmt: bytes,  # noqa: F811
) -> None:
    settings = _settings(kafka)
    assert _publish(settings, fmt) > 0
    service = _process(settings, tmp_path / "wh", group="same")
    assert isinstance(service.telemetry, ConfluentConsumer)
    assert service.counters().late_telemetry == 0
    assert_same_facts(tmp_path / "wh", reference, SPARSE)
    # what was committed is the end of every telemetry partition, no more
    tele = settings.topics.telemetry
    ends = [service.offsets[(tele, p)] for p in range(4)]
    assert _committed(kafka, "same", tele, 4) == ends


def test_assign_then_seek_reads_from_there(kafka: Broker) -> None:
    settings = _settings(kafka)
    messages = _publish(settings)
    jobs = settings.topics.jobs
    reader = open_consumer(settings, enable_auto_commit=False, auto_offset_reset="earliest",
                           max_poll_records=100_000)
    try:
        parts = sorted(reader.partitions_for_topic(jobs) or [])
        assert parts == [0, 1, 2]
        tps = [TopicPartition(jobs, p) for p in parts]  # kafka-python's, as the service
        reader.assign(tps)
        reader.seek(tps[0], 2)
        reader.seek_to_beginning(tps[1], tps[2])
        ends = reader.end_offsets(tps)
        got: dict[int, list[int]] = {}
        deadline = time.monotonic() + 30
        while sum(len(v) for v in got.values()) < sum(ends.values()) - 2 \
                and time.monotonic() < deadline:
            for tp, recs in reader.poll(timeout_ms=500).items():
                got.setdefault(tp.partition, []).extend(r.offset for r in recs)
        assert got[0] == list(range(2, ends[tps[0]]))
        assert got[1] == list(range(ends[tps[1]])) and got[2] == list(range(ends[tps[2]]))
        assert messages > sum(ends.values())  # telemetry went elsewhere
    finally:
        reader.close()


def test_malformed_messages_go_to_dead_letters_with_confluent(
    kafka: Broker, reference: Path, tmp_path: Path,  # noqa: F811
) -> None:
    settings = _settings(kafka)
    _publish(settings)
    t = settings.topics
    producer = KafkaProducer(bootstrap_servers=kafka.bootstrap)
    producer.send(t.telemetry, key=b"h100-001", value=b"\x00\x01garbage",
                  headers=[("gpuledger-format", ARROW), ("gpuledger-type", b"telemetry")])
    producer.send(t.telemetry, key=b"h100-001", value=b"whatever",
                  headers=[("gpuledger-format", b"protobuf-v9")])
    producer.send(t.jobs, key=b"x", value=b"{not json\n")
    producer.flush()
    producer.close()
    service = _process(settings, tmp_path / "wh")
    assert service.stats.dead_letters == 3
    reader = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": uuid.uuid4().hex,
                       "auto.offset.reset": "earliest"})
    try:
        reader.subscribe([t.dead_letters])
        dead = []
        deadline = time.monotonic() + 30
        while len(dead) < 3 and time.monotonic() < deadline:
            m = reader.poll(1.0)
            if m is not None and m.error() is None:
                dead.append(m)
    finally:
        reader.close()
    assert len(dead) == 3
    headers = [dict(m.headers()) for m in dead]
    reasons = sorted(h["reason"].decode() for h in headers)
    assert any("unreadable Arrow IPC" in r for r in reasons)
    assert any("unknown gpuledger-format" in r for r in reasons)
    assert any("malformed JSON" in r for r in reasons)
    assert {h["source-topic"].decode() for h in headers} == {t.telemetry, t.jobs}
    assert b"{not json" in [m.value() for m in dead]
    assert_same_facts(tmp_path / "wh", reference, SPARSE)


def test_sigkill_at_random_points_with_confluent(
    kafka: Broker, reference: Path, tmp_path: Path,  # noqa: F811
) -> None:
    settings = _settings(kafka)
    _publish(settings)
    root = tmp_path / "wh"
    cmd = _process_cmd(kafka, settings, root, "crashy", "--instance-id", "crashy-1",
                       "--checkpoint-interval", "0.3", "--exit-when-idle", "3")
    env = {**os.environ, "GPULEDGER_KAFKA_CLIENT": "confluent"}
    rng = random.Random(11)
    kills = 0
    log = open(tmp_path / "service.log", "wb")  # noqa: SIM115 - closed below
    try:
        while kills < 10:
            proc = subprocess.Popen(cmd, stdout=log, stderr=log, env=env)
            time.sleep(rng.uniform(1.0, 3.5))  # from start-up to mid-stream
            if proc.poll() is not None:
                break  # it finished before the kill
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            kills += 1
        final = subprocess.run(cmd, stdout=log, stderr=log, timeout=300, env=env)
        assert final.returncode == 0
    finally:
        log.close()
    assert kills == 10, (tmp_path / "service.log").read_text()[-2000:]
    assert_same_facts(root, reference, SPARSE)


def test_sasl_scram_with_confluent_and_the_password_never_logged(
    kafka: Broker, tmp_path: Path,
) -> None:
    if kafka.sasl_bootstrap is None:
        pytest.skip("the external broker has no SASL listener configured")
    user, password = next(iter(kafka.users.items()))
    secret_file = tmp_path / "password"
    secret_file.write_text(password + "\n")
    prefix = f"cs{uuid.uuid4().hex[:8]}."
    env = {**os.environ, "GPULEDGER_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
           "GPULEDGER_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
           "GPULEDGER_KAFKA_SASL_USERNAME": user,
           "GPULEDGER_KAFKA_SASL_PASSWORD_FILE": str(secret_file),
           "GPULEDGER_KAFKA_CLIENT": "confluent", "GPULEDGER_KAFKA_TOPIC_PREFIX": prefix}
    settings = load_settings(kafka.sasl_bootstrap, env)
    assert settings.client == "confluent"
    _publish(dataclasses.replace(settings, client="kafka-python"))
    cmd = [sys.executable, "-m", "gpuledger.cli.main", "process", "--kafka",
           kafka.sasl_bootstrap, "--warehouse", str(tmp_path / "wh"), "--exit-when-idle", "2"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    logs = done.stdout + done.stderr
    assert "messages=" in logs or "flushing" in logs  # it did log, verbosely
    assert password not in logs
    gm = read_table(tmp_path / "wh", "gpu_minute")
    assert gm.height > 0


def test_a_group_shared_by_two_warehouses_is_refused_with_confluent(
    kafka: Broker, tmp_path: Path,
) -> None:
    """The commits' deployment metadata through librdkafka, which stores it with its C
    string's NUL: read back, it names the deployment, and a second warehouse in the group
    is refused at its start, on either client (kafka-python saw the NUL, read the
    metadata as no claim, and let the second warehouse in)."""
    from gpuledger.pipeline.kafka.service import ServiceStartError

    settings = _settings(kafka)
    _publish(settings)
    first = _process(settings, tmp_path / "first", group="shared")
    c = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": "shared"})
    try:
        got = c.committed([CTP(settings.topics.telemetry, 0)], timeout=30)
    finally:
        c.close()
    assert (got[0].metadata or "").rstrip("\x00").split()[:2] == ["gpuledger",
                                                                  first.deployment]
    for client in ("confluent", "kafka-python"):
        with pytest.raises(ServiceStartError,
                           match=f"another deployment \\({first.deployment}, "):
            KafkaProcessorService(dataclasses.replace(settings, client=client),
                                  ProcessorConfig(), tmp_path / f"second-{client}",
                                  ServiceOptions(group_id="shared"))
