"""docker-compose.yml and the Dockerfile, checked without Docker: images pinned, every
mounted path exists, every command parses with the real CLI, every GPULEDGER_ variable
is one the code reads and is valid, ports and service names agree across the files,
the Prometheus configuration passes `promtool check config` with the rules of alerts/,
Alertmanager's passes `amtool check-config` and a real Alertmanager delivers to the
example webhook, Grafana's provisioning points at the generated boards and the
processor's warehouse, the stack is secure by default (loopback ports, a required
Grafana password, no Prometheus lifecycle API, a read-only locked DuckDB data source),
the feed loops, and .dockerignore keeps the build context small."""

from __future__ import annotations

import contextlib
import fnmatch
import http.client
import json
import os
import re
import select
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuledger.cli.main import build_parser
from gpuledger.pipeline.config import load_config
from gpuledger.pipeline.dashboards.boards import UIDS
from gpuledger.pipeline.kafka.settings import load_settings

REPO = Path(__file__).resolve().parents[1]
COMPOSE: dict[str, Any] = yaml.safe_load((REPO / "docker-compose.yml").read_text())
SERVICES: dict[str, Any] = COMPOSE["services"]
OUR_IMAGE = "gpuledger"  # built from the Dockerfile


def _mounts(service: dict[str, Any]) -> list[tuple[str, str]]:
    out = []
    for v in service.get("volumes", []):
        source, target = v.split(":")[:2]
        out.append((source, target))
    return out


def _code_text() -> str:
    return "\n".join(p.read_text(encoding="utf-8")
                     for root in ("agents", "pipeline")
                     for p in (REPO / root).rglob("*.py"))


def test_images_are_pinned() -> None:
    for name, svc in SERVICES.items():
        image = svc["image"]
        repo, _, tag = image.rpartition(":")
        assert repo and tag and tag != "latest" and re.search(r"\d", tag), (name, image)
        if repo == OUR_IMAGE:
            assert svc.get("build") == ".", name
    version = yaml.safe_load((REPO / "pyproject.toml").read_text().split("[project]")[1]
                             .split("[")[0].replace(" = ", ": "))["version"]
    assert {s["image"] for s in SERVICES.values() if s["image"].startswith(OUR_IMAGE)} == \
        {f"{OUR_IMAGE}:{version}"}
    assert SERVICES["kafka"]["image"].startswith("apache/kafka:")
    assert "ubuntu" in SERVICES["grafana"]["image"].split(":")[1]
    # the broker image is the version the test suite's broker runs
    jars = (REPO / "scripts/kafka-jars.sh").read_text()
    tested = re.search(r'KAFKA_VERSION="\$\{GPULEDGER_KAFKA_VERSION:-([\d.]+)\}"', jars)
    assert tested and SERVICES["kafka"]["image"] == f"apache/kafka:{tested.group(1)}"


def _interpolated(value: str, env: dict[str, str] | None = None) -> str:
    """Compose's ``${VAR:-default}`` / ``${VAR}``, with ``env`` as the shell's variables."""
    env = env or {}

    def one(m: re.Match[str]) -> str:
        name, default = m.group(1), m.group(3) or ""
        return env.get(name) or default
    return re.sub(r"\$\{([A-Z_]+)(:-([^}]*))?\}", one, value)


def test_kafka_is_kraft_single_node() -> None:
    env = SERVICES["kafka"]["environment"]
    assert set(env["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}
    assert env["KAFKA_CONTROLLER_QUORUM_VOTERS"] == f"{env['KAFKA_NODE_ID']}@kafka:9093"
    assert "PLAINTEXT://kafka:9092" in env["KAFKA_ADVERTISED_LISTENERS"]


def test_kafka_does_not_create_topics_on_first_use() -> None:
    """With Kafka's default auto.create.topics.enable=true, an agent or the feed started
    before `topics` made gpu.inventory.v1 with one partition and no compaction."""
    assert SERVICES["kafka"]["environment"]["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false"


@pytest.mark.parametrize("shell", [{}, {"KAFKA_EXTERNAL_HOST": "gpu-head.example",
                                        "KAFKA_EXTERNAL_PORT": "19094",
                                        "KAFKA_EXTERNAL_BIND": "0.0.0.0"}])
def test_kafka_has_an_external_listener_published_on_the_host(shell: dict[str, str]) -> None:
    """Agents and bridges outside compose (docs/agent.md) reach the broker: a listener of
    its own, published on the host and advertised at the address they connect to (the
    internal one advertises kafka:9092, a name only compose's network resolves)."""
    kafka = SERVICES["kafka"]
    env = {k: _interpolated(str(v), shell) for k, v in kafka["environment"].items()}
    listeners = dict(x.split("://") for x in env["KAFKA_LISTENERS"].split(","))
    advertised = dict(x.split("://") for x in env["KAFKA_ADVERTISED_LISTENERS"].split(","))
    protocols = dict(x.split(":") for x in env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(","))
    assert set(listeners) == {"PLAINTEXT", "CONTROLLER", "EXTERNAL"} <= set(protocols)
    assert set(advertised) == {"PLAINTEXT", "EXTERNAL"}
    assert env["KAFKA_INTER_BROKER_LISTENER_NAME"] == "PLAINTEXT"
    container_port = listeners["EXTERNAL"].rsplit(":", 1)[1]
    [published] = [_interpolated(p, shell) for p in kafka["ports"]]
    bind, host_port, target = published.rsplit(":", 2)
    assert target == container_port
    host, port = advertised["EXTERNAL"].rsplit(":", 1)
    assert port == host_port == shell.get("KAFKA_EXTERNAL_PORT", "9094")
    assert host == shell.get("KAFKA_EXTERNAL_HOST", "localhost")
    assert bind == shell.get("KAFKA_EXTERNAL_BIND", "127.0.0.1")
    # no name a gpuledger command would read as one of its GPULEDGER_KAFKA_* settings
    text = (REPO / "docker-compose.yml").read_text()
    assert not re.search(r"\$\{GPULEDGER_", text)
    # the docs say how to reach it from the host
    docs = (REPO / "docs/deployment.md").read_text()
    assert "localhost:9094" in docs and "KAFKA_EXTERNAL_HOST" in docs


def test_stop_grace_periods_outlast_the_services_own_limits() -> None:
    """Docker sends SIGKILL after stop_grace_period (10 s by default): the processor's own
    limit after SIGTERM is STOP_GRACE_S (60 s), and a grace of 60 s killed it first."""
    from gpuledger.pipeline.kafka.service import STOP_GRACE_S

    def seconds(value: str) -> float:
        m = re.fullmatch(r"(\d+)(s|m)", value)
        assert m, value
        return float(m.group(1)) * (60 if m.group(2) == "m" else 1)
    assert seconds(SERVICES["processor"]["stop_grace_period"]) >= STOP_GRACE_S + 10
    for name in ("kafka", "feed", "diagnose"):
        assert seconds(SERVICES[name]["stop_grace_period"]) >= 30, name


def test_every_mounted_path_exists() -> None:
    named = set(COMPOSE["volumes"])
    for name, svc in SERVICES.items():
        for source, target in _mounts(svc):
            assert target.startswith("/"), (name, target)
            if source.startswith("."):
                assert (REPO / source).exists(), f"{name}: {source} does not exist"
            else:
                assert source in named, f"{name}: undeclared volume {source}"
    # what the Dockerfile copies exists
    for line in (REPO / "Dockerfile").read_text().splitlines():
        if line.startswith("COPY "):
            for src in line.split()[1:-1]:
                assert (REPO / src).exists(), src


def test_health_checks_and_dependencies() -> None:
    for name, svc in SERVICES.items():
        if name in ("topics", "rules", "feed", "diagnose"):
            continue  # one-shot / client / a loop that serves nothing: nothing to probe
        assert svc.get("healthcheck", {}).get("test"), f"{name} has no health check"
        for dep, cond in svc.get("depends_on", {}).items():
            assert dep in SERVICES, (name, dep)
            if cond["condition"] == "service_healthy":
                assert "healthcheck" in SERVICES[dep], (name, dep)
    assert SERVICES["processor"]["depends_on"]["topics"]["condition"] == \
        "service_completed_successfully"
    assert SERVICES["prometheus"]["depends_on"]["rules"]["condition"] == \
        "service_completed_successfully"


@pytest.mark.parametrize("name", ["topics", "rules", "processor", "feed", "diagnose"])
def test_commands_parse_with_the_real_cli(name: str) -> None:
    argv = SERVICES[name]["command"]
    args = build_parser().parse_args(argv)
    assert args.command == argv[0]
    if getattr(args, "kafka", None):
        host, port = args.kafka.split(":")
        assert host == "kafka" and port == "9092"
    if getattr(args, "warehouse", None) is not None and name in ("processor", "diagnose"):
        assert str(args.warehouse) in [t for _, t in _mounts(SERVICES[name])]
    if name == "diagnose":   # the processor's warehouse, diagnosed over and over
        assert _mounts(SERVICES[name]) == [m for m in _mounts(SERVICES["processor"])
                                           if m[1] == str(args.warehouse)]
        assert args.every and SERVICES[name]["restart"] == "unless-stopped"


def test_the_dockerfile_default_command_parses() -> None:
    text = (REPO / "Dockerfile").read_text()
    cmd = yaml.safe_load(re.search(r"^CMD (.*)$", text, re.M).group(1))  # type: ignore[union-attr]
    assert build_parser().parse_args(cmd).command == "process"
    assert re.search(r'^ENTRYPOINT \["gpuledger"\]$', text, re.M)
    port = re.search(r"^EXPOSE (\d+)$", text, re.M)
    assert port and f"0.0.0.0:{port.group(1)}" in cmd


def test_environment_variables_are_read_by_the_code_and_valid() -> None:
    code = _code_text()
    for name in ("processor", "feed", "topics", "rules"):
        env = {k: str(v) for k, v in SERVICES[name].get("environment", {}).items()}
        for var in env:
            assert var.startswith("GPULEDGER_"), var
            # a configuration override (SECTION__KEY) or a variable named in the code
            assert "__" in var or f'"{var}"' in code, f"{name}: nobody reads {var}"
        load_settings("kafka:9092", env)  # Kafka variables valid
        config = load_config(None, env)  # configuration overrides valid (names the bad key)
        for var, value in env.items():
            if "__" in var:
                section, key = var.removeprefix("GPULEDGER_").lower().split("__")
                got = getattr(getattr(config, section), key)
                assert got == (pytest.approx(float(value)) if isinstance(got, float) else value)
    # the rules Prometheus evaluates use the processor's thresholds
    rules_env = SERVICES["rules"]["environment"]
    for var, value in SERVICES["processor"]["environment"].items():
        if var.startswith("GPULEDGER_THRESHOLDS__") or var.startswith("GPULEDGER_ALERTS__"):
            assert rules_env.get(var) == value, var


def test_ports_agree() -> None:
    processor = SERVICES["processor"]
    addr = processor["command"][processor["command"].index("--metrics-address") + 1]
    port = addr.rsplit(":", 1)[1]
    assert f"127.0.0.1:{port}:{port}" in processor["ports"]
    assert port in str(processor["healthcheck"]["test"])
    prom = yaml.safe_load(COMPOSE["configs"]["prometheus"]["content"])
    targets = [t for sc in prom["scrape_configs"] for c in sc["static_configs"]
               for t in c["targets"]]
    assert f"processor:{port}" in targets
    datasources = yaml.safe_load(
        (REPO / "dashboards/provisioning/datasources/gpuledger.yml").read_text())["datasources"]
    prom_ds = next(d for d in datasources if d["type"] == "prometheus")
    assert prom_ds["url"] == "http://prometheus:9090"
    assert "127.0.0.1:9090:9090" in SERVICES["prometheus"]["ports"]


def _generated_rules(tmp_path: Path) -> Path:
    """What the one-shot `rules` service writes into the volume Prometheus reads: its
    command run with its environment."""
    rules = SERVICES["rules"]
    prom_mount = dict((t, s) for s, t in _mounts(SERVICES["prometheus"]))
    volume = prom_mount["/etc/prometheus/rules"]
    assert volume in COMPOSE["volumes"] and (volume, "/rules") in _mounts(rules)
    argv = list(rules["command"])
    out = tmp_path / "rules"
    argv[argv.index("--out") + 1] = str(out)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULEDGER_")}
    env.update({k: str(v) for k, v in rules["environment"].items()})
    proc = subprocess.run([sys.executable, "-m", "gpuledger.cli.main", *argv], env=env,
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    return out


def test_prometheus_config_passes_promtool(tmp_path: Path) -> None:
    svc = SERVICES["prometheus"]
    config_target = svc["configs"][0]["target"]
    assert svc["configs"][0]["source"] in COMPOSE["configs"]
    assert f"--config.file={config_target}" in svc["command"]
    prom = yaml.safe_load(COMPOSE["configs"]["prometheus"]["content"])
    rules_dir = _generated_rules(tmp_path)
    local_rules = []
    for pattern in prom["rule_files"]:
        assert pattern.startswith("/etc/prometheus/rules/")
        local = str(rules_dir / pattern.rsplit("/", 1)[1])
        local_rules.append(local)
    prom["rule_files"] = local_rules
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(prom))
    proc = subprocess.run(["promtool", "check", "config", str(path)], capture_output=True,
                          text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    found = re.findall(r"SUCCESS: (\d+) rules found", proc.stdout)
    assert found and sum(map(int, found)) > 0, proc.stdout  # the generated rules were loaded


def test_no_death_rule_watches_an_unscraped_job(tmp_path: Path) -> None:
    """A down/absent rule on a job Prometheus never scrapes would fire for ever: in the
    stack, only the processor is scraped (agents and bridge are simulated by the feed)."""
    prom = yaml.safe_load(COMPOSE["configs"]["prometheus"]["content"])
    scraped = {sc["job_name"] for sc in prom["scrape_configs"]}
    text = (_generated_rules(tmp_path) / "gpuledger-alerts.yml").read_text()
    watched = set(re.findall(r'up\{job="([^"]+)"\}', text))
    assert watched == {"gpuledger"} and watched <= scraped
    # the repository's alerts/ (production defaults) do watch agents and bridges
    repo_watched = set(re.findall(r'up\{job="([^"]+)"\}',
                                  (REPO / "alerts/gpuledger-alerts.yml").read_text()))
    assert {"gpuledger-agent", "gpuledger-bridge"} <= repo_watched


def test_grafana_provisioning_points_at_the_boards_and_the_warehouse() -> None:
    grafana = SERVICES["grafana"]
    mounts = {t: s for s, t in _mounts(grafana)}
    provider = yaml.safe_load(
        (REPO / "dashboards/provisioning/dashboards/gpuledger.yml").read_text())["providers"][0]
    boards_dir = REPO / mounts[provider["options"]["path"]]
    assert {p.stem for p in boards_dir.glob("*.json")} == set(UIDS)
    for kind in ("datasources", "dashboards"):
        assert mounts[f"/etc/grafana/provisioning/{kind}"] == \
            f"./dashboards/provisioning/{kind}"
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert (boards_dir / Path(home).name).is_file()
    assert Path(home).parent == Path(provider["options"]["path"])
    # the DuckDB catalog: the processor's warehouse, at the same path in both containers
    # (the catalog's views hold absolute paths of the Parquet files)
    duck = next(d for d in yaml.safe_load(
        (REPO / "dashboards/provisioning/datasources/gpuledger.yml").read_text())["datasources"]
        if d["type"] == "motherduck-duckdb-datasource")
    catalog = Path(duck["jsonData"]["path"])
    proc_mounts = {t: s for s, t in _mounts(SERVICES["processor"])}
    assert mounts[str(catalog.parent)] == proc_mounts[str(catalog.parent)] == "warehouse"
    cmd = SERVICES["processor"]["command"]
    assert cmd[cmd.index("--warehouse") + 1] == str(catalog.parent)
    assert catalog.name == "catalog.duckdb"
    assert grafana["environment"]["GF_PLUGINS_ALLOW_LOADING_UNSIGNED_PLUGINS"] == duck["type"]
    # the plugin folder is outside the folder the dashboard provider scans (recursively)
    plugins = mounts["/var/lib/grafana/plugins"]
    assert plugins == "./deploy/grafana-plugins" and (REPO / plugins / "README.md").is_file()
    assert not (REPO / plugins).resolve().is_relative_to(boards_dir.resolve())
    assert provider["options"]["path"] != "/var/lib/grafana/plugins"


# --- secure by default (issue 12) ---------------------------------------------------------

def test_every_port_is_published_on_loopback_only() -> None:
    published = 0
    for name, svc in SERVICES.items():
        for port in map(_interpolated, svc.get("ports", [])):  # compose's defaults
            assert isinstance(port, str) and port.startswith("127.0.0.1:"), (name, port)
            assert len(port.split(":")) == 3, (name, port)
            published += 1
    assert published >= 5  # Kafka, processor, Prometheus, Alertmanager, Grafana


def test_the_grafana_password_must_be_set() -> None:
    env = SERVICES["grafana"]["environment"]
    value = env["GF_SECURITY_ADMIN_PASSWORD"]
    # Compose's ${VAR:?message}: `docker compose` stops with the message when VAR is
    # unset or empty; no default password anywhere
    m = re.fullmatch(r"\$\{GRAFANA_ADMIN_PASSWORD:\?(.+)\}", value)
    assert m and "GRAFANA_ADMIN_PASSWORD" in m.group(1), value
    text = (REPO / "docker-compose.yml").read_text()
    assert not re.search(r"\$\{[A-Z_]*PASSWORD[A-Z_]*:?-", text), "a default password"
    assert env["GF_USERS_ALLOW_SIGN_UP"] == "false"
    assert env["GF_AUTH_ANONYMOUS_ENABLED"] == "false"


def test_prometheus_has_no_lifecycle_or_admin_api() -> None:
    flags = " ".join(SERVICES["prometheus"]["command"])
    assert "--web.enable-lifecycle" not in flags and "--web.enable-admin-api" not in flags


def test_duckdb_data_source_is_read_only_and_locked() -> None:
    duck = next(d for d in yaml.safe_load(
        (REPO / "dashboards/provisioning/datasources/gpuledger.yml").read_text())["datasources"]
        if d["type"] == "motherduck-duckdb-datasource")
    assert duck["jsonData"]["readOnly"] is True and duck["editable"] is False
    init = duck["jsonData"]["initSql"]
    statements = [s.strip() for s in init.split(";") if s.strip()]
    warehouse = str(Path(duck["jsonData"]["path"]).parent) + "/"
    assert f"SET allowed_directories = ['{warehouse}']" in statements
    for setting in ("enable_external_access = false", "autoinstall_known_extensions = false",
                    "autoload_known_extensions = false"):
        assert f"SET {setting}" in statements
    # the lock comes last: nothing after it could change a setting
    assert statements[-1] == "SET lock_configuration = true"
    # and the warehouse is mounted read-only in Grafana
    grafana = {t: v for v in SERVICES["grafana"]["volumes"] for t in [v.split(":")[1]]}
    assert grafana[warehouse.rstrip("/")].endswith(":ro")


# --- the feed, the build context ------------------------------------------------------------

def test_the_feed_loops_and_is_restarted() -> None:
    feed = SERVICES["feed"]
    args = build_parser().parse_args(feed["command"])
    assert args.loop is True  # it used to exit 0 after --hours and leave the stack silent
    assert feed["restart"] in ("unless-stopped", "always")


def _ignored(patterns: list[str], path: str) -> bool:
    """Whether Docker's .dockerignore (no negations used) leaves ``path`` out."""
    parts = path.split("/")
    prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    return any(fnmatch.fnmatch(p, pat) or fnmatch.fnmatch(p, pat.removeprefix("**/"))
               or fnmatch.fnmatch(parts[-1], pat.removeprefix("**/"))
               for pat in patterns for p in prefixes)


def test_dockerignore_keeps_the_context_small_and_the_image_whole() -> None:
    lines = (REPO / ".dockerignore").read_text().splitlines()
    patterns = [x.strip().rstrip("/") for x in lines if x.strip() and not x.startswith("#")]
    assert not [p for p in patterns if p.startswith("!")]
    for junk in (".venv", "warehouse", ".git", ".mypy_cache", ".pytest_cache", ".ruff_cache",
                 "pipeline/gpuledger/pipeline/__pycache__", "deploy/grafana-plugins",
                 "warehouse/catalog.duckdb"):
        assert _ignored(patterns, junk), junk
    # what the Dockerfile copies is all there
    copied = []
    for line in (REPO / "Dockerfile").read_text().splitlines():
        if line.startswith("COPY "):
            copied += line.split()[1:-1]
    assert copied
    tracked = subprocess.run(["git", "ls-files", *copied], cwd=REPO, capture_output=True,
                             text=True, check=True).stdout.split()
    assert tracked
    assert [f for f in tracked if _ignored(patterns, f)] == []


# --- Alertmanager -----------------------------------------------------------------------------

def test_alertmanager_is_wired_to_prometheus_and_the_processor() -> None:
    am = SERVICES["alertmanager"]
    port = am["ports"][0].rsplit(":", 1)[1]
    prom = yaml.safe_load(COMPOSE["configs"]["prometheus"]["content"])
    targets = [t for a in prom["alerting"]["alertmanagers"] for c in a["static_configs"]
               for t in c["targets"]]
    assert targets == [f"alertmanager:{port}"]
    cmd = SERVICES["processor"]["command"]
    assert cmd[cmd.index("--alert-webhook") + 1] == f"http://alertmanager:{port}/api/v2/alerts"
    mounts = {t: s for s, t in _mounts(am)}
    config_flag = next(f for f in am["command"] if f.startswith("--config.file="))
    config = REPO / mounts[config_flag.split("=", 1)[1]]
    proc = subprocess.run(["amtool", "check-config", str(config)], capture_output=True,
                          text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # the example receiver is the alert-webhook service, on the port it listens on
    receivers = yaml.safe_load(config.read_text())["receivers"]
    urls = [w["url"] for r in receivers for w in r.get("webhook_configs", [])]
    hook = SERVICES["alert-webhook"]
    hook_port = hook["entrypoint"][hook["entrypoint"].index("--port") + 1]
    assert urls == [f"http://alert-webhook:{hook_port}/alerts"]
    script = dict((t, s) for s, t in _mounts(hook))[hook["entrypoint"][1]]
    assert (REPO / script).is_file()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def webhook() -> Iterator[tuple[int, subprocess.Popen[str]]]:
    port = _free_port()
    hook = SERVICES["alert-webhook"]
    script = REPO / dict((t, s) for s, t in _mounts(hook))[hook["entrypoint"][1]]
    proc = subprocess.Popen([sys.executable, str(script), "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        assert "listening" in proc.stderr.readline()
        yield port, proc
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_the_example_webhook_answers_bad_posts_and_keeps_serving(
        webhook: tuple[int, subprocess.Popen[str]]) -> None:
    """Posts that are not Alertmanager's webhook format get a 4xx or print nothing odd,
    and the receiver goes on: a bad Content-Length, JSON nested deeper than Python's
    reader goes, alerts and labels of the wrong shape, a value with a newline."""
    port, hook = webhook

    def post(body: bytes, length: str | None = None) -> int:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.putrequest("POST", "/")
        conn.putheader("Content-Length", str(len(body)) if length is None else length)
        conn.endheaders()
        conn.send(body)
        status = conn.getresponse().status
        conn.close()
        return status

    assert post(b"{}", length="lots") == 400
    assert post(b"{}", length="-5") == 400
    assert post(b"[" * 100_000) == 400
    assert post(b"not json") == 400
    for shape in ([1], {"alerts": 5}, {"alerts": [7, None]}, {"alerts": [{"labels": [1]}]}):
        assert post(json.dumps(shape).encode()) == 200
    odd = {"alerts": [{"status": "firing", "labels": {"alertname": "X", "team": "a\nb"},
                       "annotations": {"summary": "two\nlines"}}]}
    assert post(json.dumps(odd).encode()) == 200
    assert hook.stdout is not None
    ready, _, _ = select.select([hook.stdout], [], [], 10)
    assert ready
    assert hook.stdout.readline() == "? ?\n"      # the alert whose labels are a list
    assert hook.stdout.readline() == "firing X team=a b two lines\n"
    assert hook.poll() is None


def test_a_real_alertmanager_delivers_to_the_example_webhook(
        tmp_path: Path, webhook: tuple[int, subprocess.Popen[str]]) -> None:
    """The compose Alertmanager configuration, run by the real Alertmanager with only the
    webhook's address and the wait times changed: an alert posted to its API (as the
    processor's --alert-webhook does, and Prometheus) comes out of the example receiver."""
    hook_port, hook = webhook
    with _alertmanager(tmp_path, hook_port) as base:
        alert = [{"labels": {"alertname": "GpuJobLowUtilisation", "severity": "warning",
                             "job_id": "1000123", "team": "vision", "pool": "train"},
                  "annotations": {"summary": "job 1000123 used 4 % of its GPUs for 30 min"}}]
        req = urllib.request.Request(f"{base}/api/v2/alerts", data=json.dumps(alert).encode(),
                                     headers={"Content-Type": "application/json"})
        assert urllib.request.urlopen(req, timeout=5).status == 200
        assert hook.stdout is not None
        ready, _, _ = select.select([hook.stdout], [], [], 30)
        assert ready, "no notification reached the webhook within 30 s"
        line = hook.stdout.readline()
        assert line.startswith("firing GpuJobLowUtilisation "), line
        assert "job_id=1000123" in line and "team=vision" in line
        assert "used 4 % of its GPUs" in line


@contextlib.contextmanager
def _alertmanager(tmp_path: Path, hook_port: int) -> Iterator[str]:
    """The compose Alertmanager configuration run by the real Alertmanager, with only the
    webhook's address and the wait times changed; yields its base URL."""
    mounts = {t: s for s, t in _mounts(SERVICES["alertmanager"])}
    config = yaml.safe_load((REPO / mounts["/etc/alertmanager/alertmanager.yml"]).read_text())
    for r in config["receivers"]:
        for w in r.get("webhook_configs", []):
            w["url"] = re.sub(r"//[^/]+/", f"//127.0.0.1:{hook_port}/", w["url"])
    config["route"].update(group_wait="2s", group_interval="1s")
    (tmp_path / "am.yml").write_text(yaml.safe_dump(config))
    am_port, cluster_port = _free_port(), _free_port()
    am = subprocess.Popen(["prometheus-alertmanager", f"--config.file={tmp_path / 'am.yml'}",
                           f"--storage.path={tmp_path / 'data'}",
                           f"--web.listen-address=127.0.0.1:{am_port}",
                           f"--cluster.listen-address=127.0.0.1:{cluster_port}"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        base = f"http://127.0.0.1:{am_port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"{base}/-/ready", timeout=2)
                break
            except OSError:
                assert time.monotonic() < deadline, "alertmanager did not start"
                time.sleep(0.2)
        yield base
    finally:
        am.terminate()
        am.wait(timeout=10)


def test_a_job_alert_of_both_engines_is_delivered_once(
        tmp_path: Path, webhook: tuple[int, subprocess.Popen[str]]) -> None:
    """GpuJobLowUtilisation fired by the Prometheus rule and by the processor's engine
    (its labels: source, card_type; Prometheus': requested_card_type, job, instance)
    reached the receiver twice. The processor's is delivered; the Prometheus one of the
    same job attempt is inhibited, and still delivered for a job the engine has not
    posted."""
    hook_port, hook = webhook
    common = {"alertname": "GpuJobLowUtilisation", "severity": "warning", "team": "vision",
              "pool": "train", "queue": "prod"}
    engine = {**common, "job_id": "1000123", "attempt": "0", "source": "gpuledger-processor",
              "card_type": "H100"}
    prom = {**common, "job_id": "1000123", "attempt": "0", "job": "gpuledger",
            "instance": "processor:9108", "requested_card_type": "H100"}
    prom_only = {**prom, "job_id": "1000456"}
    alerts = [{"labels": labels, "annotations": {"summary": f"job {labels['job_id']}"}}
              for labels in (engine, prom, prom_only)]
    with _alertmanager(tmp_path, hook_port) as base:
        req = urllib.request.Request(f"{base}/api/v2/alerts", data=json.dumps(alerts).encode(),
                                     headers={"Content-Type": "application/json"})
        assert urllib.request.urlopen(req, timeout=5).status == 200
        assert hook.stdout is not None
        raw = b""   # os.read, not readline: select cannot see lines a text buffer holds
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            ready, _, _ = select.select([hook.stdout], [], [], 0.5)
            if ready:
                raw += os.read(hook.stdout.fileno(), 65536)
        got = raw.decode().splitlines()
    firing = sorted(x for x in got if x.startswith("firing GpuJobLowUtilisation "))
    assert len(firing) == 2, got
    assert "job_id=1000123" in firing[0] and "source=gpuledger-processor" in firing[0]
    assert "job_id=1000456" in firing[1] and "source=" not in firing[1]
