"""A real single-node Apache Kafka broker (KRaft, combined broker+controller) for tests.

The jars come from ``scripts/kafka-jars.sh`` (run by the setup script); this module
never downloads anything. It writes a ``server.properties`` under a work folder,
formats the storage with Kafka's StorageTool (creating the SCRAM users up front when
SASL is on), launches ``kafka.Kafka`` as a child process in its own process group and
waits until a real client gets metadata back. With ``tls=True`` it first makes a
throwaway CA and a broker certificate in the work folder and opens a SASL_SSL listener.

    broker = start_broker(tmp_path, sasl=True)
    try:
        producer = KafkaProducer(**broker.client_kwargs())
        ...
    finally:
        broker.stop()

``broker_from_env()`` points the tests at a broker of your own instead (for example
one run in Docker): see docs/kafka-dev.md.

Environment:
    GPULEDGER_KAFKA_VERSION   Kafka version of the jar cache (default DEFAULT_KAFKA_VERSION)
    GPULEDGER_KAFKA_HOME      jar cache folder (default ~/.cache/gpuledger/kafka-<version>)
    GPULEDGER_TEST_KAFKA_BOOTSTRAP, ..._SASL_BOOTSTRAP, ..._SASL_USER, ..._SASL_PASSWORD,
    ..._SASL_SSL_BOOTSTRAP, ..._SSL_CAFILE
                              use an existing broker (see broker_from_env)
    GPULEDGER_KAFKA_JAVA_OPTS extra JVM options for the broker (appended)
    GPULEDGER_KAFKA_CDS=0     do not make or use the class-data-sharing archive
    GPULEDGER_KAFKA_CERT_TOOL make the TLS certificates with `openssl` or `keytool`
                              (default: openssl when on PATH, else keytool)
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import hashlib
import logging
import os
import random
import re
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "DEFAULT_KAFKA_VERSION",
    "SASL_LISTENER",
    "SASL_SSL_LISTENER",
    "Broker",
    "KafkaSetupError",
    "TlsFiles",
    "broker_from_env",
    "kafka_libs",
    "make_tls_files",
    "start_broker",
]

# Keep in step with KAFKA_VERSION in scripts/kafka-jars.sh.
DEFAULT_KAFKA_VERSION = "4.3.1"
SASL_LISTENER = "SASL_PLAINTEXT"
SASL_SSL_LISTENER = "SASL_SSL"
DEFAULT_SASL_USER = "gpuledger"

_JVM_OPTS = (
    "-Xms256m",
    "-Xmx512m",
    "-XX:+UseSerialGC",
    "-XX:+ExitOnOutOfMemoryError",
    "-Djava.awt.headless=true",
)
_STOP_GRACE_S = 20.0
_LOG_TAIL_LINES = 50

_LOG4J2 = """\
status = warn
appender.out.type = Console
appender.out.name = OUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.out.ref = OUT
logger.state.name = state.change.logger
logger.state.level = WARN
logger.request.name = kafka.request.logger
logger.request.level = WARN
"""


class KafkaSetupError(RuntimeError):
    """The broker cannot be started here (no Java, no jars) or did not come up."""


# --------------------------------------------------------------------------- paths


def kafka_version() -> str:
    return os.environ.get("GPULEDGER_KAFKA_VERSION") or DEFAULT_KAFKA_VERSION


def kafka_home() -> Path:
    env = os.environ.get("GPULEDGER_KAFKA_HOME")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "gpuledger" / f"kafka-{kafka_version()}"


def kafka_libs() -> Path:
    """The folder of broker jars that scripts/kafka-jars.sh filled; raises if it is missing."""
    libs = kafka_home() / "libs"
    core = libs / f"kafka_2.13-{kafka_version()}.jar"
    if not (libs / ".gpuledger-complete").is_file() or not core.is_file():
        raise KafkaSetupError(
            f"Kafka {kafka_version()} jars not found in {libs}. "
            "Run `bash scripts/kafka-jars.sh` (scripts/setup.sh does), or point the tests "
            "at a broker of your own with GPULEDGER_TEST_KAFKA_BOOTSTRAP=host:port."
        )
    return libs


def _java() -> tuple[str, str]:
    """The java executable (JAVA_HOME's, else PATH's) and its `-version` text; Java 17+."""
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "java").is_file():
        java = str(Path(java_home) / "bin" / "java")
    else:
        found = shutil.which("java")
        if found is None:
            raise KafkaSetupError("`java` not found on PATH; the test broker needs Java 17+.")
        java = found
    out = subprocess.run(
        [java, "-version"], capture_output=True, text=True, timeout=30, check=False
    )
    match = re.search(r'version "(\d+)', out.stderr + out.stdout)
    if match and int(match.group(1)) < 17:
        raise KafkaSetupError(
            f"{java} is Java {match.group(1)}; Kafka {kafka_version()} needs Java 17+ "
            "(set JAVA_HOME to a newer JDK)."
        )
    return java, out.stderr + out.stdout


def _class_archive(java: str, java_version: str, libs: Path) -> Path | None:
    """Where the broker's class-data-sharing archive lives (None: CDS switched off).

    The first broker started with a given JVM and jar set dumps the classes it loaded
    (-XX:ArchiveClassesAtExit, when it is stopped cleanly); later JVMs map the archive
    (-XX:SharedArchiveFile) and start 2-3 s sooner. A JVM that finds the archive stale or
    broken starts without it (silently); delete the .jsa file to have it made again.
    GPULEDGER_KAFKA_CDS=0 turns this off.
    """
    if os.environ.get("GPULEDGER_KAFKA_CDS", "1") == "0":
        return None
    stamp = libs / ".gpuledger-complete"
    key = "\n".join([java, java_version, stamp.read_text(), str(libs)])
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    return libs.parent / f"broker-cds-{digest}.jsa"


# --------------------------------------------------------------------------- helpers


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[:2]
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def _free_ports(n: int) -> list[int]:
    """n distinct free TCP ports on 127.0.0.1, held open together while chosen.

    They are picked below the kernel's ephemeral range where there is room, so that no
    client's outgoing connection can take one while the broker is down between
    stop_process() and start_again() (which reuses them).
    """
    low, _high = _ephemeral_range()
    candidates = list(range(20000, low)) if low - 20000 >= 1000 else []
    random.shuffle(candidates)
    socks: list[socket.socket] = []
    try:
        for port in [*candidates[:200], *([0] * n)]:
            if len(socks) == n:
                break
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                s.close()
                continue
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _cluster_id() -> str:
    """A Kafka cluster id: 16 random bytes, URL-safe base64 without padding."""
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cid.startswith("-"):  # Kafka's own generator avoids these too
            return cid


def _tail(path: Path | None, lines: int = _LOG_TAIL_LINES) -> str:
    if path is None or not path.is_file():
        return "(no log)"
    with path.open("rb") as fh:
        fh.seek(0, os.SEEK_END)
        size = fh.tell()
        fh.seek(max(0, size - 256 * 1024))
        data = fh.read().decode("utf-8", "replace")
    return "\n".join(data.splitlines()[-lines:])


def _jaas_quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _pdeathsig_prefix() -> list[str]:
    """`setpriv --pdeathsig TERM`, so the broker gets SIGTERM if the test process dies.

    util-linux's setpriv sets the signal and execs the JVM; preexec_fn would do the same
    but is unsafe in a process with threads (kafka-python clients run some). Where setpriv
    is missing the broker still starts; the atexit hook and stop() remain.
    """
    setpriv = shutil.which("setpriv")
    if setpriv is None or not sys.platform.startswith("linux"):
        return []
    return [setpriv, "--pdeathsig", "TERM", "--"]


# --------------------------------------------------------------------------- TLS

_CERT_DAYS = 7
_OPENSSL_CNF = """\
# Written by tests/kafka_broker.py: extensions for the throwaway test CA and broker cert.
[req]
distinguished_name = dn
prompt = no
[dn]
CN = gpuledger test
[v3_ca]
basicConstraints = critical, CA:TRUE, pathlen:0
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash
[v3_broker]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = serverAuth
subjectAltName = IP:127.0.0.1, DNS:localhost
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
"""


@dataclass(frozen=True)
class TlsFiles:
    """A throwaway CA and a broker certificate for 127.0.0.1 and localhost.

    ca_file: the CA certificate (PEM), what a client trusts (`ssl_cafile`).
    keystore: PKCS12 with the broker's key and its chain (broker cert, CA cert).
    """

    ca_file: Path
    keystore: Path
    keystore_password: str = field(repr=False)
    tool: str
    seconds: float


def _run_tool(cmd: list[str], folder: Path, env: Mapping[str, str] | None = None) -> None:
    try:
        done = subprocess.run(
            cmd,
            cwd=folder,
            env=None if env is None else {**os.environ, **env},
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise KafkaSetupError(f"{Path(cmd[0]).name} timed out making test certificates") from exc
    if done.returncode != 0:
        step = next((a for a in cmd[1:] if not a.startswith("-J")), "")
        raise KafkaSetupError(
            f"making test certificates failed (exit {done.returncode}): "
            f"{Path(cmd[0]).name} {step}\n{(done.stdout + done.stderr)[-2000:]}"
        )


def _certs_with_openssl(openssl: str, folder: Path, password: str) -> None:
    (folder / "openssl.cnf").write_text(_OPENSSL_CNF)
    # Relative names: every command runs in folder.
    new_key = "-config openssl.cnf -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes"
    days = f"-days {_CERT_DAYS}"
    serial = f"0x{secrets.token_hex(8)}"
    steps = [
        f"req -x509 {new_key} -extensions v3_ca -keyout ca.key -out ca.pem {days} "
        "-subj '/CN=gpuledger test CA'",
        f"req -new {new_key} -keyout broker.key -out broker.csr -subj /CN=localhost",
        f"x509 -req -in broker.csr -CA ca.pem -CAkey ca.key -set_serial {serial} {days} "
        "-sha256 -extfile openssl.cnf -extensions v3_broker -out broker.pem",
        "pkcs12 -export -in broker.pem -inkey broker.key -certfile ca.pem -name broker "
        "-out broker.p12 -passout env:GPULEDGER_TEST_KEYSTORE_PASSWORD",
    ]
    for step in steps:
        _run_tool(
            [openssl, *shlex.split(step)], folder, {"GPULEDGER_TEST_KEYSTORE_PASSWORD": password}
        )


def _certs_with_keytool(keytool: str, folder: Path, password: str) -> None:
    # Six JVMs (~0.5 s each); the CA's two and the broker key's two run side by side.
    kt = [keytool, "-J-XX:TieredStopAtLevel=1", "-J-XX:+UseSerialGC"]
    ca = f"-keystore ca.p12 -storetype PKCS12 -storepass {password}"
    br = f"-keystore broker.p12 -storetype PKCS12 -storepass {password}"
    ec = f"-keyalg EC -groupname secp256r1 -validity {_CERT_DAYS}"

    def run_all(*steps: str) -> Callable[[], None]:
        def go() -> None:
            for step in steps:
                _run_tool([*kt, *shlex.split(step)], folder)

        return go

    make_ca = run_all(
        f"-genkeypair -alias ca {ec} -dname 'CN=gpuledger test CA' {ca} "
        "-ext bc:c=ca:true,pathlen:0 -ext ku:c=keyCertSign,cRLSign",
        f"-exportcert -rfc -alias ca -file ca.pem {ca}",
    )
    make_key = run_all(
        f"-genkeypair -alias broker {ec} -dname CN=localhost {br}",
        f"-certreq -alias broker -file broker.csr {br}",
    )
    with ThreadPoolExecutor(2) as pool:
        for future in [pool.submit(make_ca), pool.submit(make_key)]:
            future.result()
    run_all(
        f"-gencert -alias ca -infile broker.csr -outfile broker.pem -rfc -validity {_CERT_DAYS} "
        f"-ext san=ip:127.0.0.1,dns:localhost -ext ku:c=digitalSignature -ext eku=serverAuth {ca}"
    )()
    chain = (folder / "broker.pem").read_text() + (folder / "ca.pem").read_text()
    (folder / "chain.pem").write_text(chain)
    run_all(f"-importcert -noprompt -alias broker -file chain.pem {br}")()


def _keytool(java: str) -> str | None:
    beside = Path(java).resolve().parent / "keytool"
    return str(beside) if beside.is_file() else shutil.which("keytool")


def make_tls_files(folder: Path, *, java: str = "java", tool: str | None = None) -> TlsFiles:
    """Make a throwaway CA and a broker certificate (127.0.0.1, localhost) in folder.

    tool: "openssl" or "keytool"; default GPULEDGER_KAFKA_CERT_TOOL, else openssl when it
    is on PATH, else the keytool beside `java`. EC P-256 keys, valid for a week; the CA's
    key stays in folder (ca.key or ca.p12) and is never used again.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    want = tool or os.environ.get("GPULEDGER_KAFKA_CERT_TOOL") or None
    if want not in (None, "openssl", "keytool"):
        raise ValueError(f"certificate tool {want!r}: use openssl or keytool")
    openssl = shutil.which("openssl") if want in (None, "openssl") else None
    keytool = _keytool(java) if openssl is None and want in (None, "keytool") else None
    password = secrets.token_urlsafe(18)
    t0 = time.monotonic()
    if openssl is not None:
        _certs_with_openssl(openssl, folder, password)
        used = "openssl"
    elif keytool is not None:
        _certs_with_keytool(keytool, folder, password)
        used = "keytool"
    else:
        raise KafkaSetupError(f"no {want or 'openssl or keytool'} to make test certificates")
    return TlsFiles(
        ca_file=folder / "ca.pem",
        keystore=folder / "broker.p12",
        keystore_password=password,
        tool=used,
        seconds=time.monotonic() - t0,
    )


_LIVE: set[Broker] = set()


def _stop_all_at_exit() -> None:
    for broker in list(_LIVE):
        with contextlib.suppress(Exception):
            broker.stop()


atexit.register(_stop_all_at_exit)


# --------------------------------------------------------------------------- broker


@dataclass(eq=False)
class Broker:
    """A Kafka broker for tests: one this module started, or one named by the environment."""

    bootstrap: str
    sasl_bootstrap: str | None = None
    users: dict[str, str] = field(default_factory=dict)
    log_path: Path | None = None
    workdir: Path | None = None
    ports: dict[str, int] = field(default_factory=dict)
    # start_broker: format + start until ready; after start_again: that start alone.
    start_seconds: float = 0.0
    # tls=True: the SASL_SSL listener ("127.0.0.1:PORT") and the CA (PEM) it chains to.
    sasl_ssl_bootstrap: str | None = None
    ca_file: Path | None = None
    _cmd: list[str] = field(default_factory=list, repr=False)
    _java: str = field(default="java", repr=False)
    _cds: Path | None = field(default=None, repr=False)
    _cds_dump: Path | None = field(default=None, repr=False)
    _ready: bool = field(default=False, repr=False)
    _proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    _closed: bool = field(default=False, repr=False)

    # -- what tests use

    @property
    def managed(self) -> bool:
        """True when this module started the broker (so it can be stopped and restarted)."""
        return bool(self._cmd)

    @property
    def running(self) -> bool:
        if not self.managed:
            return True
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def client_kwargs(
        self, mechanism: str | None = None, *, user: str | None = None, tls: bool = False
    ) -> dict[str, Any]:
        """kafka-python keyword arguments for this broker.

        mechanism None: the PLAINTEXT listener. "PLAIN" or "SCRAM-SHA-512": the SASL
        listener as `user` (default: the first user); with tls=True the SASL_SSL listener
        instead, trusting ca_file.
        """
        if mechanism is None:
            if tls:
                raise ValueError("tls=True needs a SASL mechanism (the TLS listener is SASL_SSL)")
            return {"bootstrap_servers": self.bootstrap}
        bootstrap = self.sasl_ssl_bootstrap if tls else self.sasl_bootstrap
        if bootstrap is None or not self.users:
            kind = "SASL_SSL" if tls else "SASL"
            raise KafkaSetupError(f"this broker has no {kind} listener or no SASL user")
        name = user if user is not None else next(iter(self.users))
        kwargs: dict[str, Any] = {
            "bootstrap_servers": bootstrap,
            "security_protocol": "SASL_SSL" if tls else "SASL_PLAINTEXT",
            "sasl_mechanism": mechanism,
            "sasl_plain_username": name,
            "sasl_plain_password": self.users[name],
        }
        if tls and self.ca_file is not None:
            kwargs["ssl_cafile"] = str(self.ca_file)
        return kwargs

    def create_topic(
        self,
        name: str,
        partitions: int = 1,
        *,
        configs: Mapping[str, str] | None = None,
        timeout_s: float = 30,
    ) -> None:
        """Create a topic (replication factor 1) and wait until every partition has a leader."""
        from kafka import KafkaAdminClient

        admin = KafkaAdminClient(
            bootstrap_servers=self.bootstrap,
            bootstrap_timeout_ms=int(timeout_s * 1000),
            request_timeout_ms=int(timeout_s * 1000),
        )
        try:
            spec: dict[str, Any] = {"num_partitions": partitions, "replication_factor": 1}
            if configs:
                spec["configs"] = dict(configs)
            admin.create_topics(
                {name: spec}, timeout_ms=int(timeout_s * 1000), wait_for_metadata=True
            )
        finally:
            admin.close()

    def log_tail(self, lines: int = _LOG_TAIL_LINES) -> str:
        return _tail(self.log_path, lines)

    # -- lifecycle

    def stop(self) -> None:
        """Stop the broker for good (SIGTERM to its process group, SIGKILL after 20 s).

        Idempotent; a no-op for a broker from the environment. The data stays in workdir.
        """
        self.stop_process()
        self._closed = True
        _LIVE.discard(self)

    def stop_process(self, *, grace_s: float = _STOP_GRACE_S) -> None:
        """Stop the JVM but keep ports, config and data, so start_again() can follow."""
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
        # Anything left in the group (there should be nothing) goes too.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        self._proc = None
        self._adopt_class_archive(keep=self._ready and proc.returncode != -signal.SIGKILL)
        self._ready = False

    def kill_process(self) -> None:
        """SIGKILL the broker (a crash, not a clean shutdown); start_again() recovers it."""
        self.stop_process(grace_s=0)

    def start_again(self, timeout_s: float = 90) -> None:
        """Start the stopped broker on the same ports with the same log dirs and users."""
        if not self.managed:
            raise KafkaSetupError("this broker comes from the environment; it cannot be restarted")
        if self._closed:
            raise KafkaSetupError("this broker was stopped for good with stop()")
        if self.running:
            return
        self._launch()
        self._wait_ready(timeout_s)

    def __enter__(self) -> Broker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- internals

    def _cds_opts(self) -> list[str]:
        if self._cds is None:
            return []
        if self._cds.is_file() and self._cds.stat().st_size > 0:
            return [f"-XX:SharedArchiveFile={self._cds}"]
        self._cds_dump = self._cds.with_name(
            f"{self._cds.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp"
        )
        return [f"-XX:ArchiveClassesAtExit={self._cds_dump}"]

    def _adopt_class_archive(self, *, keep: bool) -> None:
        dump, self._cds_dump = self._cds_dump, None
        if dump is None or self._cds is None:
            return
        with contextlib.suppress(OSError):
            if keep and dump.is_file() and dump.stat().st_size > 0:
                os.replace(dump, self._cds)
            else:
                dump.unlink(missing_ok=True)

    def _launch(self) -> None:
        assert self.log_path is not None and self.workdir is not None
        cmd = [*_pdeathsig_prefix(), self._java, *self._cds_opts(), *self._cmd]
        with self.log_path.open("ab") as log:
            log.write(f"\n==== gpuledger: starting broker at {time.ctime()} ====\n".encode())
            log.flush()
            self._proc = subprocess.Popen(
                cmd,
                cwd=self.workdir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        _LIVE.add(self)

    def _wait_ready(self, timeout_s: float) -> None:
        started = time.monotonic()
        deadline = started + timeout_s
        last_error: Exception | None = None
        checks: list[dict[str, Any]] = [self.client_kwargs()]
        if self.sasl_bootstrap is not None and self.users:
            checks.append(self.client_kwargs("SCRAM-SHA-512"))
        if self.sasl_ssl_bootstrap is not None and self.users:
            checks.append(self.client_kwargs("SCRAM-SHA-512", tls=True))
        while checks:
            proc = self._proc
            if proc is None or proc.poll() is not None:
                code = None if proc is None else proc.returncode
                self.stop_process()
                raise KafkaSetupError(
                    f"Kafka broker exited with code {code} during start-up "
                    f"(log {self.log_path}):\n{self.log_tail()}"
                )
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.stop_process()
                raise KafkaSetupError(
                    f"Kafka broker not ready after {timeout_s:.0f} s ({last_error!r}); "
                    f"log {self.log_path}, last lines:\n{self.log_tail()}"
                )
            try:
                with _quiet_kafka_client_logs():
                    _probe_metadata(checks[0], min(5.0, max(1.0, remaining)))
                checks.pop(0)
            except Exception as exc:  # not up yet: refused, no metadata, ...
                last_error = exc
                time.sleep(0.25)
        self._ready = True
        self.start_seconds = time.monotonic() - started


@contextlib.contextmanager
def _quiet_kafka_client_logs() -> Iterator[None]:
    """While polling a starting broker, kafka-python logs every refused connection."""
    logger = logging.getLogger("kafka")
    old = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(old)


def _probe_metadata(kwargs: Mapping[str, Any], timeout_s: float) -> None:
    from kafka import KafkaAdminClient

    ms = int(timeout_s * 1000)
    admin = KafkaAdminClient(
        **kwargs,
        bootstrap_timeout_ms=ms,
        request_timeout_ms=ms,
        reconnect_backoff_ms=100,
        reconnect_backoff_max_ms=500,
    )
    try:
        admin.list_topics()
    finally:
        admin.close()


def _sasl_listener_lines(listener: str, users: Mapping[str, str]) -> list[str]:
    prefix = f"listener.name.{listener.lower()}"
    plain_users = " ".join(f"user_{n}={_jaas_quote(p)}" for n, p in users.items())
    return [
        f"{prefix}.sasl.enabled.mechanisms=PLAIN,SCRAM-SHA-512",
        f"{prefix}.plain.sasl.jaas.config="
        f"org.apache.kafka.common.security.plain.PlainLoginModule required {plain_users};",
        f"{prefix}.scram-sha-512.sasl.jaas.config="
        "org.apache.kafka.common.security.scram.ScramLoginModule required;",
    ]


def _properties_value(value: str) -> str:
    """A value for a java.util.Properties file (backslashes and line ends escaped)."""
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")


def _server_properties(
    workdir: Path,
    ports: Mapping[str, int],
    users: Mapping[str, str],
    tls: TlsFiles | None = None,
) -> str:
    host = "127.0.0.1"
    listeners = [
        f"PLAINTEXT://{host}:{ports['plaintext']}",
        f"CONTROLLER://{host}:{ports['controller']}",
    ]
    advertised = [f"PLAINTEXT://{host}:{ports['plaintext']}"]
    protocol_map = ["PLAINTEXT:PLAINTEXT", "CONTROLLER:PLAINTEXT"]
    lines = [
        "# Written by tests/kafka_broker.py: a single-node KRaft test broker.",
        "process.roles=broker,controller",
        "node.id=1",
        f"controller.quorum.voters=1@{host}:{ports['controller']}",
        "controller.listener.names=CONTROLLER",
        "inter.broker.listener.name=PLAINTEXT",
        f"log.dirs={workdir / 'data'}",
        "num.partitions=1",
        "default.replication.factor=1",
        "min.insync.replicas=1",
        "offsets.topic.replication.factor=1",
        "offsets.topic.num.partitions=1",
        "transaction.state.log.replication.factor=1",
        "transaction.state.log.min.isr=1",
        "transaction.state.log.num.partitions=1",
        "share.coordinator.state.topic.replication.factor=1",
        "share.coordinator.state.topic.min.isr=1",
        "share.coordinator.state.topic.num.partitions=1",
        "group.initial.rebalance.delay.ms=0",
        "auto.create.topics.enable=false",
        "delete.topic.enable=true",
        # 1 MiB is the smallest segment Kafka 4.x accepts.
        "log.segment.bytes=1048576",
        # Small and few: two cores, a 512 MiB heap.
        "num.network.threads=2",
        "num.io.threads=2",
        "background.threads=2",
        "num.recovery.threads.per.data.dir=1",
        "num.replica.fetchers=1",
        "log.cleaner.threads=1",
        "log.cleaner.dedupe.buffer.size=16777216",
    ]
    if users and ("sasl" in ports or "sasl_ssl" in ports):
        lines.append("sasl.enabled.mechanisms=PLAIN,SCRAM-SHA-512")
    if users and "sasl" in ports:
        listeners.append(f"{SASL_LISTENER}://{host}:{ports['sasl']}")
        advertised.append(f"{SASL_LISTENER}://{host}:{ports['sasl']}")
        protocol_map.append(f"{SASL_LISTENER}:SASL_PLAINTEXT")
        lines += _sasl_listener_lines(SASL_LISTENER, users)
    if users and tls is not None and "sasl_ssl" in ports:
        listeners.append(f"{SASL_SSL_LISTENER}://{host}:{ports['sasl_ssl']}")
        advertised.append(f"{SASL_SSL_LISTENER}://{host}:{ports['sasl_ssl']}")
        protocol_map.append(f"{SASL_SSL_LISTENER}:SASL_SSL")
        prefix = f"listener.name.{SASL_SSL_LISTENER.lower()}"
        lines += _sasl_listener_lines(SASL_SSL_LISTENER, users)
        lines += [
            f"{prefix}.ssl.keystore.type=PKCS12",
            f"{prefix}.ssl.keystore.location={_properties_value(str(tls.keystore))}",
            f"{prefix}.ssl.keystore.password={_properties_value(tls.keystore_password)}",
            f"{prefix}.ssl.key.password={_properties_value(tls.keystore_password)}",
            f"{prefix}.ssl.client.auth=none",
        ]
    lines += [
        f"listeners={','.join(listeners)}",
        f"advertised.listeners={','.join(advertised)}",
        f"listener.security.protocol.map={','.join(protocol_map)}",
    ]
    return "\n".join(lines) + "\n"


def start_broker(
    workdir: Path,
    *,
    sasl: bool = False,
    tls: bool = False,
    timeout_s: float = 90,
    users: Mapping[str, str] | None = None,
) -> Broker:
    """Format and start a single-node KRaft broker on free 127.0.0.1 ports under workdir.

    sasl: also open a SASL_PLAINTEXT listener with PLAIN and SCRAM-SHA-512, for `users`
    (default: {"gpuledger": <random password>}); each user has the same password for both
    mechanisms. tls: make a throwaway CA and broker certificate in workdir/tls (see
    make_tls_files) and open a SASL_SSL listener with the same mechanisms and users
    (`sasl_ssl_bootstrap`, `ca_file`); it works with or without sasl. Waits until the
    broker answers a metadata request on every listener; raises KafkaSetupError with the
    log's last lines if it does not within timeout_s.
    """
    libs = kafka_libs()
    java, java_version = _java()
    cds = _class_archive(java, java_version, libs)
    workdir = Path(workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    if (workdir / "data").exists():
        raise KafkaSetupError(f"{workdir / 'data'} exists: start_broker needs a fresh workdir")
    sasl_users: dict[str, str] = {}
    if sasl or tls:
        sasl_users = dict(users) if users else {DEFAULT_SASL_USER: secrets.token_urlsafe(18)}
        for name in sasl_users:
            if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
                raise ValueError(f"SASL user name {name!r}: use letters, digits, _ . -")
    names = ["plaintext", "controller", *(["sasl"] if sasl else []), *(["sasl_ssl"] if tls else [])]
    ports = dict(zip(names, _free_ports(len(names)), strict=True))

    t0 = time.monotonic()
    tls_files = make_tls_files(workdir / "tls", java=java) if tls else None
    (workdir / "server.properties").write_text(
        _server_properties(workdir, ports, sasl_users, tls_files)
    )
    (workdir / "log4j2.properties").write_text(_LOG4J2)
    log_path = workdir / "broker.log"
    jvm = [
        *_JVM_OPTS,
        *os.environ.get("GPULEDGER_KAFKA_JAVA_OPTS", "").split(),
        f"-Dlog4j2.configurationFile={workdir / 'log4j2.properties'}",
        f"-Dkafka.logs.dir={workdir / 'logs'}",
        "-cp",
        f"{libs}/*",
    ]

    fmt = [
        java,
        *([f"-XX:SharedArchiveFile={cds}"] if cds is not None and cds.is_file() else []),
        *jvm,
        "kafka.tools.StorageTool",
        "format",
        "--cluster-id",
        _cluster_id(),
        "--config",
        str(workdir / "server.properties"),
    ]
    for name, password in sasl_users.items():
        fmt += ["--add-scram", f"SCRAM-SHA-512=[name={name},password={password}]"]
    with log_path.open("wb") as log:
        log.write(b"==== gpuledger: formatting storage ====\n")
        log.flush()
        try:
            done = subprocess.run(
                fmt,
                cwd=workdir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                timeout=max(30.0, timeout_s),
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise KafkaSetupError(f"StorageTool format timed out:\n{_tail(log_path)}") from exc
    if done.returncode != 0:
        raise KafkaSetupError(
            f"StorageTool format failed (exit {done.returncode}); log {log_path}:\n"
            f"{_tail(log_path)}"
        )

    broker = Broker(
        bootstrap=f"127.0.0.1:{ports['plaintext']}",
        sasl_bootstrap=f"127.0.0.1:{ports['sasl']}" if sasl else None,
        users=sasl_users,
        log_path=log_path,
        workdir=workdir,
        ports=ports,
        sasl_ssl_bootstrap=f"127.0.0.1:{ports['sasl_ssl']}" if tls else None,
        ca_file=tls_files.ca_file if tls_files is not None else None,
        _cmd=[*jvm, "kafka.Kafka", str(workdir / "server.properties")],
        _java=java,
        _cds=cds,
    )
    broker._launch()
    try:
        broker._wait_ready(max(1.0, timeout_s - (time.monotonic() - t0)))
    except BaseException:
        broker.stop()
        raise
    broker.start_seconds = time.monotonic() - t0
    return broker


def broker_from_env(environ: Mapping[str, str] | None = None) -> Broker | None:
    """A Broker for an existing Kafka named by the environment, or None.

    GPULEDGER_TEST_KAFKA_BOOTSTRAP=host:port        PLAINTEXT listener (required)
    GPULEDGER_TEST_KAFKA_SASL_BOOTSTRAP=host:port   SASL_PLAINTEXT listener (optional)
    GPULEDGER_TEST_KAFKA_SASL_USER / _SASL_PASSWORD a user valid for PLAIN and SCRAM-SHA-512
    GPULEDGER_TEST_KAFKA_SASL_SSL_BOOTSTRAP=h:p     SASL_SSL listener, same user (optional)
    GPULEDGER_TEST_KAFKA_SSL_CAFILE=path            CA (PEM) of that listener's certificate

    Such a broker is neither started nor stopped here (stop() does nothing).
    """
    env = os.environ if environ is None else environ
    bootstrap = env.get("GPULEDGER_TEST_KAFKA_BOOTSTRAP", "").strip()
    if not bootstrap:
        return None
    sasl_bootstrap = env.get("GPULEDGER_TEST_KAFKA_SASL_BOOTSTRAP", "").strip() or None
    user = env.get("GPULEDGER_TEST_KAFKA_SASL_USER", "").strip()
    password = env.get("GPULEDGER_TEST_KAFKA_SASL_PASSWORD", "")
    sasl_ssl_bootstrap = env.get("GPULEDGER_TEST_KAFKA_SASL_SSL_BOOTSTRAP", "").strip() or None
    ca_file = env.get("GPULEDGER_TEST_KAFKA_SSL_CAFILE", "").strip()
    users = {user: password} if (sasl_bootstrap or sasl_ssl_bootstrap) and user else {}
    return Broker(
        bootstrap=bootstrap,
        sasl_bootstrap=sasl_bootstrap,
        users=users,
        sasl_ssl_bootstrap=sasl_ssl_bootstrap,
        ca_file=Path(ca_file).expanduser() if ca_file else None,
    )


@contextlib.contextmanager
def running_broker(
    workdir: Path, *, sasl: bool = False, tls: bool = False, timeout_s: float = 90
) -> Iterator[Broker]:
    """`with running_broker(path) as b:` — the broker from the environment, or a new one."""
    env_broker = broker_from_env()
    if env_broker is not None:
        yield env_broker
        return
    broker = start_broker(workdir, sasl=sasl, tls=tls, timeout_s=timeout_s)
    try:
        yield broker
    finally:
        broker.stop()
