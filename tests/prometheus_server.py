"""A real Prometheus server for tests (Debian's ``prometheus``; scripts/setup.d/10-prometheus.sh).

    from prometheus_server import prometheus  # noqa: F401  (a fixture)

    def test_x(prometheus):
        server = prometheus(targets=["127.0.0.1:9108"], rule_files=[...])
        server.wait_for("up == 1")
        server.query("sum by (pool) (gpuledger_allocated_gpus)")

Each server gets a temporary configuration and data folder, a free 127.0.0.1 port and a
short scrape and rule-evaluation interval (default 1 s); it is stopped at the end of the
test. The HTTP API is used through the standard library only.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PrometheusServer:
    """One running Prometheus; :meth:`query` returns the API's ``result`` list."""

    def __init__(self, folder: Path, targets: Sequence[str], rule_files: Sequence[Path] = (),
                 interval_s: float = 1.0) -> None:
        binary = shutil.which("prometheus")
        if binary is None:
            raise RuntimeError("prometheus is not installed: run scripts/setup.d/10-prometheus.sh")
        self.folder = folder
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        folder.mkdir(parents=True, exist_ok=True)
        interval = f"{int(interval_s * 1000)}ms"
        config = {
            "global": {"scrape_interval": interval, "evaluation_interval": interval,
                       "scrape_timeout": interval},
            "rule_files": [str(p) for p in rule_files],
            "scrape_configs": [{"job_name": "gpuledger",
                                "static_configs": [{"targets": list(targets)}]}],
        }
        (folder / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.log = open(folder / "prometheus.log", "wb")  # noqa: SIM115 (closed in stop)
        self.process = subprocess.Popen(
            [binary, f"--config.file={folder / 'prometheus.yml'}",
             f"--storage.tsdb.path={folder / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}",
             "--web.enable-lifecycle", "--log.level=warn"],
            stdout=self.log, stderr=subprocess.STDOUT)
        self._wait_ready()

    def _wait_ready(self, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"prometheus exited: {self.logs()}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"prometheus not ready after {timeout_s} s: {self.logs()}")

    def logs(self) -> str:
        return (self.folder / "prometheus.log").read_text(errors="replace")[-4000:]

    def api(self, path: str, **params: Any) -> Any:
        url = f"{self.url}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        with urllib.request.urlopen(url, timeout=10) as r:
            body = json.load(r)
        if body.get("status") != "success":
            raise RuntimeError(f"{path}: {body}")
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        """Instant query; each result has ``metric`` (labels) and ``value`` [t, "v"]."""
        params: dict[str, Any] = {"query": expr}
        if at is not None:
            params["time"] = at
        result: list[dict[str, Any]] = self.api("query", **params)["result"]
        return result

    def values(self, expr: str, by: Sequence[str], at: float | None = None
               ) -> dict[tuple[str, ...], float]:
        """``{(label values...): value}`` of an instant query."""
        return {tuple(r["metric"].get(b, "") for b in by): float(r["value"][1])
                for r in self.query(expr, at)}

    def wait_for(self, expr: str, check: Callable[[list[dict[str, Any]]], bool] = bool,
                 timeout_s: float = 30.0) -> list[dict[str, Any]]:
        """Poll ``expr`` until ``check(result)`` holds; the result."""
        deadline = time.monotonic() + timeout_s
        result: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            result = self.query(expr)
            if check(result):
                return result
            time.sleep(0.2)
        raise AssertionError(f"{expr}: still {result} after {timeout_s} s\n{self.logs()}")

    def targets_up(self) -> list[dict[str, Any]]:
        return list(self.api("targets")["activeTargets"])

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[Callable[..., PrometheusServer]]:
    """Start real Prometheus servers: ``prometheus(targets=[...], rule_files=[...])``."""
    servers: list[PrometheusServer] = []

    def start(targets: Sequence[str], rule_files: Sequence[Path] = (),
              interval_s: float = 1.0) -> PrometheusServer:
        server = PrometheusServer(tmp_path / f"prometheus{len(servers)}", targets,
                                  rule_files, interval_s)
        servers.append(server)
        return server

    try:
        yield start
    finally:
        for server in servers:
            server.stop()
