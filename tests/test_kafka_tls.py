"""TLS on the real broker: the CLI over SASL_SSL (SCRAM-SHA-512), and a client that does
not trust the broker's CA refused.

The broker is this module's own (`start_broker(..., sasl=True, tls=True)`), with a
throwaway CA made at start; the session's `kafka` broker stays without TLS.
"""

from __future__ import annotations

import logging
import os
import socket
import ssl
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kafka import KafkaAdminClient
from kafka.errors import KafkaError
from kafka_broker import Broker, broker_from_env, start_broker
from test_simulate import SMALL

from gpuledger.pipeline.kafka.producer import KafkaSink
from gpuledger.pipeline.kafka.settings import load_settings
from gpuledger.pipeline.simulate import SimConfig, parse_cluster, simulate
from gpuledger.pipeline.warehouse import read_table

REFUSE_WITHIN_S = 20.0


@pytest.fixture(scope="module")
def tls_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    env_broker = broker_from_env()
    if env_broker is not None:
        if env_broker.sasl_ssl_bootstrap is None or not env_broker.users:
            pytest.skip("the external broker has no SASL_SSL listener configured "
                        "(GPULEDGER_TEST_KAFKA_SASL_SSL_BOOTSTRAP, ..._SSL_CAFILE)")
        yield env_broker
        return
    broker = start_broker(tmp_path_factory.mktemp("kafka-tls"), sasl=True, tls=True)
    try:
        yield broker
    finally:
        broker.stop()


def _sasl_ssl_env(broker: Broker, password_file: Path, *, ca: bool = True) -> dict[str, str]:
    user = next(iter(broker.users))
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULEDGER_KAFKA_")}
    env |= {"GPULEDGER_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
            "GPULEDGER_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
            "GPULEDGER_KAFKA_SASL_USERNAME": user,
            "GPULEDGER_KAFKA_SASL_PASSWORD_FILE": str(password_file)}
    if ca and broker.ca_file is not None:
        env["GPULEDGER_KAFKA_SSL_CAFILE"] = str(broker.ca_file)
    return env


def _password_file(broker: Broker, folder: Path) -> Path:
    path = folder / "password"
    path.write_text(next(iter(broker.users.values())) + "\n")
    path.chmod(0o600)
    return path


def test_the_tls_listener_presents_a_certificate_for_127_0_0_1(tls_kafka: Broker) -> None:
    if not tls_kafka.managed:
        pytest.skip("broker from the environment: its certificate is not ours to inspect")
    assert tls_kafka.sasl_ssl_bootstrap is not None and tls_kafka.ca_file is not None
    assert set(tls_kafka.ports) == {"plaintext", "controller", "sasl", "sasl_ssl"}
    assert tls_kafka.sasl_bootstrap is not None  # sasl=True and tls=True together
    host, _, port = tls_kafka.sasl_ssl_bootstrap.rpartition(":")
    assert host == "127.0.0.1"
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # verifies the chain and the host name
    ctx.load_verify_locations(cafile=str(tls_kafka.ca_file))
    with socket.create_connection((host, int(port)), timeout=10) as raw, \
            ctx.wrap_socket(raw, server_hostname=host) as tls:
        cert = tls.getpeercert()
        version = tls.version()
    assert cert is not None
    names = cert.get("subjectAltName", ())
    assert ("IP Address", "127.0.0.1") in names
    assert ("DNS", "localhost") in names
    assert version in ("TLSv1.2", "TLSv1.3")


def test_cli_over_sasl_ssl_with_scram_and_a_password_file(tls_kafka: Broker,
                                                          tmp_path: Path) -> None:
    assert tls_kafka.sasl_ssl_bootstrap is not None
    bootstrap = tls_kafka.sasl_ssl_bootstrap
    password = next(iter(tls_kafka.users.values()))
    env = _sasl_ssl_env(tls_kafka, _password_file(tls_kafka, tmp_path))
    prefix = f"tls{uuid.uuid4().hex[:8]}."
    created = subprocess.run(
        [sys.executable, "-m", "gpuledger.cli.main", "topics", "create", "--kafka", bootstrap,
         "--topic-prefix", prefix, "--telemetry-partitions", "2"],
        env=env, capture_output=True, text=True, timeout=120)
    assert created.returncode == 0, created.stderr[-2000:]
    assert "created" in created.stdout

    settings = load_settings(bootstrap, {**env, "GPULEDGER_KAFKA_TOPIC_PREFIX": prefix})
    assert settings.security_protocol == "SASL_SSL"
    assert settings.client_config().get("ssl_cafile") == env.get("GPULEDGER_KAFKA_SSL_CAFILE")
    sink = KafkaSink(settings)
    for batch, _ in zip(simulate(SimConfig(hours=0.2, cluster=parse_cluster(SMALL))), range(2),
                        strict=False):
        sink.publish_batch(batch)
    sink.close()
    assert sink.messages > 0

    done = subprocess.run(
        [sys.executable, "-m", "gpuledger.cli.main", "process", "--kafka", bootstrap,
         "--topic-prefix", prefix, "--warehouse", str(tmp_path / "wh"),
         "--exit-when-idle", "2"],
        env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    logs = created.stdout + created.stderr + done.stdout + done.stderr
    assert "messages=" in logs or "flushing" in logs      # it did log, verbosely
    assert password not in logs
    gm = read_table(tmp_path / "wh", "gpu_minute")
    assert gm.height > 0


def test_a_client_without_the_ca_is_refused(tls_kafka: Broker, tmp_path: Path,
                                            caplog: pytest.LogCaptureFixture) -> None:
    if tls_kafka.ca_file is None:
        pytest.skip("the external broker's certificate needs no CA file: nothing to refuse")
    assert tls_kafka.sasl_ssl_bootstrap is not None
    env = _sasl_ssl_env(tls_kafka, _password_file(tls_kafka, tmp_path), ca=False)
    config = load_settings(tls_kafka.sasl_ssl_bootstrap, env).client_config()
    assert config["security_protocol"] == "SASL_SSL"
    assert "ssl_cafile" not in config          # so the system's CAs only: ours is not one
    caplog.set_level(logging.DEBUG, logger="kafka")
    t0 = time.monotonic()
    with pytest.raises(KafkaError):
        admin = KafkaAdminClient(**config, bootstrap_timeout_ms=3000, request_timeout_ms=3000,
                                 reconnect_backoff_ms=200, reconnect_backoff_max_ms=1000)
        try:
            admin.list_topics()
        finally:
            admin.close()
    assert time.monotonic() - t0 < REFUSE_WITHIN_S
    assert "CERTIFICATE_VERIFY_FAILED" in caplog.text
