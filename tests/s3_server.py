"""A real S3 server for tests: S3Proxy over a folder, on 127.0.0.1 with a free port.

The jar comes from ``scripts/s3proxy-jar.sh`` (run by the setup script); nothing is
downloaded here. S3Proxy (Apache-2.0) serves the S3 API — signatures, multipart
uploads, listings — over a local folder (its ``filesystem`` provider), so the warehouse
code runs against a real HTTP S3 endpoint through PyArrow's AWS SDK, as against AWS,
MinIO or Ceph RGW. No S3 is mocked anywhere.

    server = start_s3(tmp_path / "s3")
    try:
        url = server.bucket("wh")            # "s3://wh"
        env = server.env()                   # AWS_ENDPOINT_URL, keys, region, ...
    finally:
        server.stop()

``s3_from_env()`` points the tests at an existing S3 endpoint instead:
``GPULEDGER_TEST_S3_ENDPOINT`` (``http://host:port``), ``GPULEDGER_TEST_S3_ACCESS_KEY``,
``GPULEDGER_TEST_S3_SECRET_KEY`` and optionally ``GPULEDGER_TEST_S3_REGION``; the
tests create their buckets there (``s3-test-<random>``).

Environment:
    GPULEDGER_S3PROXY_VERSION  S3Proxy version of the jar cache (default DEFAULT_VERSION)
    GPULEDGER_S3PROXY_HOME     jar cache folder (default ~/.cache/gpuledger/s3proxy-<version>)
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_VERSION = "2.6.0"  # keep in step with scripts/s3proxy-jar.sh
START_TIMEOUT_S = 60.0
CHECKSUM_ENV = {
    # S3Proxy 2.6.0 refuses the checksum headers that newer AWS SDKs send by default
    # (XAmzContentSHA256Mismatch, or 501 on reads): ask only for what the API requires
    "AWS_REQUEST_CHECKSUM_CALCULATION": "when_required",
    "AWS_RESPONSE_CHECKSUM_VALIDATION": "when_required",
}


class S3SetupError(RuntimeError):
    """S3Proxy cannot be started here (no Java, no jar) or did not come up."""


def s3proxy_jar() -> Path:
    version = os.environ.get("GPULEDGER_S3PROXY_VERSION") or DEFAULT_VERSION
    home = Path(os.environ.get("GPULEDGER_S3PROXY_HOME")
                or Path.home() / ".cache" / "gpuledger" / f"s3proxy-{version}").expanduser()
    jar = home / f"s3proxy-{version}-jar-with-dependencies.jar"
    if not jar.is_file():
        raise S3SetupError(f"S3Proxy {version} not found at {jar}. Run `bash "
                           "scripts/s3proxy-jar.sh` (scripts/setup.sh does), or point the "
                           "tests at an S3 endpoint with GPULEDGER_TEST_S3_ENDPOINT.")
    return jar


@dataclass
class S3Server:
    endpoint: str
    access_key: str
    secret_key: str
    region: str = "us-east-1"
    process: subprocess.Popen[bytes] | None = None
    log: Path | None = None
    buckets: list[str] = field(default_factory=list)

    def env(self, **extra: str) -> dict[str, str]:
        """The standard AWS variables that reach this server (what a user sets)."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": self.access_key,
                "AWS_SECRET_ACCESS_KEY": self.secret_key, "AWS_REGION": self.region,
                **CHECKSUM_ENV, **extra}

    def filesystem(self) -> object:
        import pyarrow.fs as pafs

        scheme, _, host = self.endpoint.partition("://")
        return pafs.S3FileSystem(access_key=self.access_key, secret_key=self.secret_key,
                                 region=self.region, endpoint_override=host, scheme=scheme,
                                 allow_bucket_creation=True)

    def bucket(self, name: str | None = None) -> str:
        """Create a bucket (a fresh random one by default); its ``s3://`` URL."""
        saved = {k: os.environ.get(k) for k in CHECKSUM_ENV}
        os.environ.update(CHECKSUM_ENV)
        try:
            name = name or f"s3-test-{secrets.token_hex(4)}"
            self.filesystem().create_dir(name)  # type: ignore[attr-defined]
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        self.buckets.append(name)
        return f"s3://{name}"

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def start_s3(folder: Path) -> S3Server:
    """Start S3Proxy on 127.0.0.1 with a free port, serving ``folder``."""
    java = shutil.which("java")
    if java is None:
        raise S3SetupError("`java` not found on PATH; the test S3 server needs Java 17+.")
    jar = s3proxy_jar()
    data = folder / "data"
    data.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    server = S3Server(f"http://127.0.0.1:{port}", "gpuledger-test",
                      secrets.token_hex(16), log=folder / "s3proxy.log")
    conf = folder / "s3proxy.conf"
    conf.write_text(f"""s3proxy.endpoint=http://127.0.0.1:{port}
s3proxy.authorization=aws-v2-or-v4
s3proxy.identity={server.access_key}
s3proxy.credential={server.secret_key}
jclouds.provider=filesystem
jclouds.filesystem.basedir={data}
""")
    assert server.log is not None
    server.process = subprocess.Popen(
        [java, "-Xmx256m", "-XX:+UseSerialGC", "-jar", str(jar), "--properties", str(conf)],
        stdout=open(server.log, "wb"), stderr=subprocess.STDOUT,  # noqa: SIM115
        start_new_session=True)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise S3SetupError(f"S3Proxy exited: {server.log.read_text()[-2000:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                if "Started Server" in server.log.read_text(errors="replace"):
                    return server
        except OSError:
            pass
        time.sleep(0.2)
    server.stop()
    raise S3SetupError(f"S3Proxy did not start in {START_TIMEOUT_S:.0f} s: "
                       f"{server.log.read_text()[-2000:]}")


def s3_from_env() -> S3Server | None:
    endpoint = os.environ.get("GPULEDGER_TEST_S3_ENDPOINT")
    if not endpoint:
        return None
    return S3Server(endpoint, os.environ.get("GPULEDGER_TEST_S3_ACCESS_KEY", ""),
                    os.environ.get("GPULEDGER_TEST_S3_SECRET_KEY", ""),
                    os.environ.get("GPULEDGER_TEST_S3_REGION", "us-east-1"))
