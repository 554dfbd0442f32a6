"""docker-compose.yml and the Dockerfile, checked without Docker: images pinned, every
mounted path exists, every command parses with the real CLI, every GPULEDGER_ variable
is one the code reads and is valid, ports and service names agree across the files,
the Prometheus configuration passes `promtool check config` with the rules of alerts/,
and Grafana's provisioning points at the generated boards and the processor's warehouse."""

from __future__ import annotations

import re
import subprocess
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


def test_kafka_is_kraft_single_node() -> None:
    env = SERVICES["kafka"]["environment"]
    assert set(env["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}
    assert env["KAFKA_CONTROLLER_QUORUM_VOTERS"] == f"{env['KAFKA_NODE_ID']}@kafka:9093"
    assert "PLAINTEXT://kafka:9092" in env["KAFKA_ADVERTISED_LISTENERS"]


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
        if name in ("topics", "feed"):
            continue  # one-shot / client: nothing to probe
        assert svc.get("healthcheck", {}).get("test"), f"{name} has no health check"
        for dep, cond in svc.get("depends_on", {}).items():
            assert dep in SERVICES, (name, dep)
            if cond["condition"] == "service_healthy":
                assert "healthcheck" in SERVICES[dep], (name, dep)
    assert SERVICES["processor"]["depends_on"]["topics"]["condition"] == \
        "service_completed_successfully"


@pytest.mark.parametrize("name", ["topics", "processor", "feed"])
def test_commands_parse_with_the_real_cli(name: str) -> None:
    argv = SERVICES[name]["command"]
    args = build_parser().parse_args(argv)
    assert args.command == argv[0]
    if getattr(args, "kafka", None):
        host, port = args.kafka.split(":")
        assert host == "kafka" and port == "9092"
    if getattr(args, "warehouse", None) is not None and name == "processor":
        assert str(args.warehouse) in [t for _, t in _mounts(SERVICES[name])]


def test_the_dockerfile_default_command_parses() -> None:
    text = (REPO / "Dockerfile").read_text()
    cmd = yaml.safe_load(re.search(r"^CMD (.*)$", text, re.M).group(1))  # type: ignore[union-attr]
    assert build_parser().parse_args(cmd).command == "process"
    assert re.search(r'^ENTRYPOINT \["gpuledger"\]$', text, re.M)
    port = re.search(r"^EXPOSE (\d+)$", text, re.M)
    assert port and f"0.0.0.0:{port.group(1)}" in cmd


def test_environment_variables_are_read_by_the_code_and_valid() -> None:
    code = _code_text()
    for name in ("processor", "feed", "topics"):
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
                assert getattr(getattr(config, section), key) == pytest.approx(float(value))


def test_ports_agree() -> None:
    processor = SERVICES["processor"]
    addr = processor["command"][processor["command"].index("--metrics-address") + 1]
    port = addr.rsplit(":", 1)[1]
    assert f"{port}:{port}" in processor["ports"]
    assert port in str(processor["healthcheck"]["test"])
    prom = yaml.safe_load(COMPOSE["configs"]["prometheus"]["content"])
    targets = [t for sc in prom["scrape_configs"] for c in sc["static_configs"]
               for t in c["targets"]]
    assert f"processor:{port}" in targets
    datasources = yaml.safe_load(
        (REPO / "dashboards/provisioning/datasources/gpuledger.yml").read_text())["datasources"]
    prom_ds = next(d for d in datasources if d["type"] == "prometheus")
    assert prom_ds["url"] == "http://prometheus:9090"
    assert "9090:9090" in SERVICES["prometheus"]["ports"]


def test_prometheus_config_passes_promtool(tmp_path: Path) -> None:
    svc = SERVICES["prometheus"]
    config_target = svc["configs"][0]["target"]
    assert svc["configs"][0]["source"] in COMPOSE["configs"]
    assert f"--config.file={config_target}" in svc["command"]
    prom = yaml.safe_load(COMPOSE["configs"]["prometheus"]["content"])
    rules_mount = dict((t, s) for s, t in _mounts(svc))["/etc/prometheus/rules"]
    local_rules = []
    for pattern in prom["rule_files"]:
        assert pattern.startswith("/etc/prometheus/rules/")
        local = str((REPO / rules_mount).resolve() / pattern.rsplit("/", 1)[1])
        local_rules.append(local)
    prom["rule_files"] = local_rules
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(prom))
    proc = subprocess.run(["promtool", "check", "config", str(path)], capture_output=True,
                          text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    found = re.findall(r"SUCCESS: (\d+) rules found", proc.stdout)
    assert found and sum(map(int, found)) > 0, proc.stdout  # the alerts/ rules were loaded


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
    assert mounts["/var/lib/grafana/plugins"] == "./dashboards/plugins"
