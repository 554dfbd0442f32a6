"""Kafka connection settings: bootstrap, security, topic names.

Credentials come from the environment or from files, never from the command line, and
are never printed: :class:`KafkaSettings` masks them in ``repr`` and logs.

Environment (all optional except the bootstrap, which may also come from ``--kafka``):

| variable | meaning |
|---|---|
| ``GPULEDGER_KAFKA_BOOTSTRAP`` | ``host:port[,host:port]`` |
| ``GPULEDGER_KAFKA_SECURITY_PROTOCOL`` | ``PLAINTEXT`` (default), ``SASL_PLAINTEXT``, ... |
| ``GPULEDGER_KAFKA_SASL_MECHANISM`` | ``PLAIN`` or ``SCRAM-SHA-512`` (also ``SCRAM-SHA-256``) |
| ``GPULEDGER_KAFKA_SASL_USERNAME`` / ``_FILE`` | user name, or a file holding it |
| ``GPULEDGER_KAFKA_SASL_PASSWORD`` / ``_FILE`` | password, or a file holding it |
| ``GPULEDGER_KAFKA_SSL_CAFILE`` | CA bundle for TLS |
| ``GPULEDGER_KAFKA_TOPIC_PREFIX`` | prefix for every topic name (default none) |
| ``GPULEDGER_KAFKA_CLIENT`` | ``kafka-python`` (default) or ``confluent`` (``kafka-fast`` extra) |
| ``GPULEDGER_KAFKA_COMPRESSION`` | codec: ``zstd`` (default), ``lz4``, ``gzip``, ``none``|
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from gpuledger.yaml_file import YamlFileError, read_text

PROTOCOLS = ("PLAINTEXT", "SASL_PLAINTEXT", "SASL_SSL", "SSL")
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
CLIENTS = ("kafka-python", "confluent")
# Producer codecs, and the module kafka-python needs for each (zstd: 12x cheaper to
# produce than gzip and 10 % smaller, bench/README.md).
CODECS = {"zstd": "zstandard", "lz4": "lz4", "gzip": None, "snappy": "snappy", "none": None}


class KafkaSettingsError(ValueError):
    """A Kafka setting is missing or wrong; the message names the variable."""


TOPIC_CHARACTERS = re.compile(r"[A-Za-z0-9._-]+")
"""What Kafka allows in a topic name."""
TOPIC_NAME_MAX = 249
"""Kafka's longest topic name."""

@dataclass(frozen=True)
class Topics:
    """Topic names (see ``docs/kafka.md`` for partitions, retention and compaction)."""

    telemetry: str = "gpu.telemetry.v1"
    inventory: str = "gpu.inventory.v1"
    jobs: str = "sched.events.v1"
    dead_letters: str = "gpuledger.deadletter.v1"
    attempt_parts: str = "gpuledger.attempt-parts.v1"
    """Internal: processors' parts of job attempts, for the owner shard (shard.py)."""
    alerts: str = "gpuledger.alerts.v1"
    """The alert engine's events (alerts/sinks.py, docs/alerts.md)."""

    def prefixed(self, prefix: str) -> Topics:
        return Topics(**{f.name: prefix + getattr(self, f.name) for f in fields(self)})

    def for_record_type(self, record_type: str) -> str:
        return {"telemetry": self.telemetry, "inventory": self.inventory,
                "job": self.jobs}[record_type]

    def record_type_of(self, topic: str) -> str | None:
        return {self.telemetry: "telemetry", self.inventory: "inventory",
                self.jobs: "job"}.get(topic)


@dataclass(frozen=True)
class KafkaSettings:
    """How to reach the cluster. ``password`` never appears in ``repr``."""

    bootstrap: str
    security_protocol: str = "PLAINTEXT"
    sasl_mechanism: str | None = None
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    ssl_cafile: str | None = None
    topics: Topics = field(default_factory=Topics)
    client_id: str = "gpuledger"
    client: str = "kafka-python"
    """Which Kafka library the processor's consumers use (``client.py``)."""
    compression: str = "zstd"
    """Producer codec (``CODECS``)."""

    def __repr__(self) -> str:
        secret = "set" if self.password else "unset"
        return (f"KafkaSettings(bootstrap={self.bootstrap!r}, "
                f"security_protocol={self.security_protocol!r}, "
                f"sasl_mechanism={self.sasl_mechanism!r}, username={self.username!r}, "
                f"password=<{secret}>)")

    __str__ = __repr__

    def client_config(self) -> dict[str, Any]:
        """Keyword arguments shared by kafka-python producers, consumers and admins."""
        cfg: dict[str, Any] = {
            "bootstrap_servers": self.bootstrap.split(","),
            "security_protocol": self.security_protocol,
            "client_id": self.client_id,
        }
        if self.security_protocol.startswith("SASL"):
            cfg.update(sasl_mechanism=self.sasl_mechanism, sasl_plain_username=self.username,
                       sasl_plain_password=self.password)
        if self.security_protocol in ("SSL", "SASL_SSL") and self.ssl_cafile:
            cfg["ssl_cafile"] = self.ssl_cafile
        return cfg


    def producer_config(self, **overrides: Any) -> dict[str, Any]:
        """kafka-python producer settings: no loss, no duplicates, compressed batches.
        The one definition for every gpuledger producer (agent, bridges, processor)."""
        cfg = self.client_config()
        cfg.update(acks="all", enable_idempotence=True,
                   compression_type=None if self.compression == "none" else self.compression,
                   linger_ms=20, batch_size=1 << 20, max_request_size=8 << 20,
                   retries=2_147_483_647, max_in_flight_requests_per_connection=5)
        cfg.update(overrides)
        return cfg


def _secret(environ: dict[str, str], name: str) -> str | None:
    value = environ.get(name)
    path = environ.get(f"{name}_FILE")
    if value is not None and path is not None:
        raise KafkaSettingsError(f"{name} and {name}_FILE are both set; use one")
    if path is not None:
        if not path.strip():
            raise KafkaSettingsError(f"{name}_FILE is set but empty: name the file")
        try:
            text = read_text(Path(path)).strip()
        except YamlFileError as exc:  # missing, a folder, unreadable, not UTF-8
            raise KafkaSettingsError(f"{name}_FILE: {exc}") from None
        if not text:
            raise KafkaSettingsError(f"{name}_FILE: {path} is empty")
        return text
    return value


KAFKA_ENV_PREFIX = "GPULEDGER_KAFKA_"
# Every GPULEDGER_KAFKA_* name something reads: the settings above, the service's
# timeouts and knobs (cli/main.py, kafka/service.py, kafka/log_setup), and the test
# suite's broker (tests/kafka_broker.py, scripts/kafka-jars.sh).
KNOWN_VARIABLES = frozenset(KAFKA_ENV_PREFIX + name for name in (
    "BOOTSTRAP", "SECURITY_PROTOCOL", "SASL_MECHANISM", "SASL_USERNAME",
    "SASL_USERNAME_FILE", "SASL_PASSWORD", "SASL_PASSWORD_FILE", "SSL_CAFILE",
    "TOPIC_PREFIX", "CLIENT", "CLIENT_LOG", "COMPRESSION", "MAX_POLL_SAMPLES",
    "SESSION_TIMEOUT_MS", "HEARTBEAT_INTERVAL_MS", "MAX_POLL_INTERVAL_MS",
    "REQUEST_TIMEOUT_MS",
    "HOME", "VERSION", "CERT_TOOL", "CDS", "JAVA_OPTS"))


def unknown_variables(environ: dict[str, str]) -> list[str]:
    """Each ``GPULEDGER_KAFKA_*`` variable of ``environ`` that nothing reads, said with the
    closest known name: a misspelt one (``GPULEDGER_KAFKA_BOOTSTRAPP``,
    ``GPULEDGER_KAFKA_SESSION_TIMEOUT`` for ``…_MS``) was ignored in silence, where a
    misspelt ``GPULEDGER_SECTION__KEY`` is refused. ``GPULEDGER_KAFKA__*`` is the
    configuration's form (refused there: no section ``kafka``)."""
    import difflib

    out = []
    for var in sorted(environ):
        if (not var.startswith(KAFKA_ENV_PREFIX) or var.startswith(KAFKA_ENV_PREFIX + "_")
                or var in KNOWN_VARIABLES):
            continue
        names = sorted(v.removeprefix(KAFKA_ENV_PREFIX) for v in KNOWN_VARIABLES)
        close = difflib.get_close_matches(var.removeprefix(KAFKA_ENV_PREFIX), names, n=1,
                                          cutoff=0.6)
        out.append(f"{var}: unknown Kafka variable" + (
            f" (did you mean {KAFKA_ENV_PREFIX}{close[0]}?)" if close else
            f" (known: {KAFKA_ENV_PREFIX}{{{', '.join(names)}}}; docs/kafka.md)"))
    return out


def load_settings(bootstrap: str | None = None,
                  environ: dict[str, str] | None = None,
                  given_by: str = "pass --kafka HOST:PORT") -> KafkaSettings:
    """Settings from ``bootstrap`` (e.g. ``--kafka``) and the environment, validated.
    ``given_by``: how the caller's user gives a bootstrap, for the error without one.
    An unknown ``GPULEDGER_KAFKA_*`` variable is refused, naming the closest known one."""
    env = dict(os.environ) if environ is None else environ
    unknown = unknown_variables(env)
    if unknown:
        raise KafkaSettingsError("; ".join(unknown))
    servers = bootstrap or env.get("GPULEDGER_KAFKA_BOOTSTRAP")
    if not servers:
        raise KafkaSettingsError(f"no Kafka bootstrap: {given_by} or set "
                                 "GPULEDGER_KAFKA_BOOTSTRAP")
    for server in servers.split(","):
        host, _, port = server.rpartition(":")
        if not host or not port.isdigit():
            raise KafkaSettingsError(f"bootstrap {server!r}: expected HOST:PORT")
        if not 0 < int(port) < 65536:
            raise KafkaSettingsError(f"bootstrap {server!r}: port {port} is not 1-65535")
    protocol = env.get("GPULEDGER_KAFKA_SECURITY_PROTOCOL", "PLAINTEXT").upper()
    if protocol not in PROTOCOLS:
        raise KafkaSettingsError(
            f"GPULEDGER_KAFKA_SECURITY_PROTOCOL: {protocol!r} is not one of {', '.join(PROTOCOLS)}")
    mechanism = env.get("GPULEDGER_KAFKA_SASL_MECHANISM")
    username = _secret(env, "GPULEDGER_KAFKA_SASL_USERNAME")
    password = _secret(env, "GPULEDGER_KAFKA_SASL_PASSWORD")
    if protocol.startswith("SASL"):
        mechanism = (mechanism or "PLAIN").upper()
        if mechanism not in MECHANISMS:
            raise KafkaSettingsError(
                f"GPULEDGER_KAFKA_SASL_MECHANISM: {mechanism!r} is not one of "
                f"{', '.join(MECHANISMS)}")
        if not username or not password:
            raise KafkaSettingsError(
                f"{protocol} needs GPULEDGER_KAFKA_SASL_USERNAME and "
                "GPULEDGER_KAFKA_SASL_PASSWORD (or their _FILE variants)")
    prefix = env.get("GPULEDGER_KAFKA_TOPIC_PREFIX", "")
    if prefix and not TOPIC_CHARACTERS.fullmatch(prefix):
        raise KafkaSettingsError(
            f"topic prefix {prefix!r}: Kafka topic names hold only ASCII letters, digits, "
            "'.', '_' and '-'")
    longest = max(len(name) for name in vars(Topics().prefixed(prefix)).values())
    if longest > TOPIC_NAME_MAX:
        raise KafkaSettingsError(
            f"topic prefix {prefix[:20]!r}...: the topic names would be {longest} characters, "
            f"Kafka allows {TOPIC_NAME_MAX}")
    client = env.get("GPULEDGER_KAFKA_CLIENT", "kafka-python").lower()
    if client not in CLIENTS:
        raise KafkaSettingsError(
            f"GPULEDGER_KAFKA_CLIENT: {client!r} is not one of {', '.join(CLIENTS)}")
    compression = env.get("GPULEDGER_KAFKA_COMPRESSION", "zstd").lower()
    if compression not in CODECS:
        raise KafkaSettingsError(f"GPULEDGER_KAFKA_COMPRESSION: {compression!r} is not one "
                                 f"of {', '.join(CODECS)}")
    cafile = env.get("GPULEDGER_KAFKA_SSL_CAFILE") or None
    if cafile is not None and protocol in ("SSL", "SASL_SSL"):
        try:
            pem = read_text(Path(cafile))
        except YamlFileError as exc:
            raise KafkaSettingsError(f"GPULEDGER_KAFKA_SSL_CAFILE: {exc}") from None
        if "-----BEGIN CERTIFICATE-----" not in pem:
            raise KafkaSettingsError(f"GPULEDGER_KAFKA_SSL_CAFILE: {cafile}: no PEM "
                                     "certificate in it (-----BEGIN CERTIFICATE-----)")
    return KafkaSettings(
        bootstrap=servers, security_protocol=protocol, sasl_mechanism=mechanism,
        username=username, password=password, ssl_cafile=cafile,
        topics=Topics().prefixed(prefix), client=client, compression=compression,
    )
