"""Deployment files: parsed, and every path, port and config they name is real."""

from __future__ import annotations

import configparser
import re
import shlex
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

from gpuledger.agent.config import AgentConfig, load_agent_config

ROOT = Path(__file__).parent.parent
DEPLOY = ROOT / "deploy"


def _config(text: str, tmp_path: Path) -> AgentConfig:
    path = tmp_path / "agent.yaml"
    path.write_text(text)
    return load_agent_config(path, {})


def _under(path: str | PurePosixPath, folder: str) -> bool:
    return PurePosixPath(path).is_relative_to(PurePosixPath(folder))


def test_daemonset(tmp_path: Path) -> None:
    docs = list(yaml.safe_load_all((DEPLOY / "kubernetes" / "agent-daemonset.yaml").read_text()))
    kinds = {d["kind"]: d for d in docs}
    assert set(kinds) == {"Namespace", "ConfigMap", "DaemonSet"}
    cm, ds = kinds["ConfigMap"], kinds["DaemonSet"]
    namespace = kinds["Namespace"]["metadata"]["name"]
    assert cm["metadata"]["namespace"] == ds["metadata"]["namespace"] == namespace
    pod = ds["spec"]["template"]["spec"]
    assert ds["spec"]["selector"]["matchLabels"].items() <= \
        ds["spec"]["template"]["metadata"]["labels"].items()
    assert pod["hostPID"] is True and pod["runtimeClassName"] == "nvidia"
    (agent,) = pod["containers"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m for m in agent["volumeMounts"]}
    assert all(m["name"] in volumes for m in mounts.values())

    # the config the container is told to read is the ConfigMap's key, and it is valid
    args = agent["args"]
    config_path = args[args.index("--config") + 1]
    mount = mounts[config_path]
    source = volumes[mount["name"]]["configMap"]
    assert source["name"] == cm["metadata"]["name"] and mount["subPath"] == "agent.yaml"
    assert {i["key"] for i in source["items"]} <= set(cm["data"])
    config = _config(cm["data"]["agent.yaml"], tmp_path)
    assert config.source == "nvml" and "kubernetes" in config.attribution.methods

    # the pod-resources socket lies in the mounted kubelet folder, from the host
    socket = config.attribution.kubernetes.pod_resources_socket
    assert socket is not None
    pr_mount = next(p for p in mounts if _under(socket, p))
    assert volumes[mounts[pr_mount]["name"]]["hostPath"]["path"] == pr_mount \
        == "/var/lib/kubelet/pod-resources"
    # the spool is on a host folder (survives pod restarts); cgroups and labels mounted
    spool_mount = next(p for p in mounts if _under(config.spool.path.as_posix(), p))
    assert "hostPath" in volumes[mounts[spool_mount]["name"]]
    assert not mounts[spool_mount].get("readOnly", False)
    assert any(_under(config.attribution.cgroup_root.as_posix(), p) for p in mounts)
    assert config.inventory.labels_file is not None
    labels_mount = next(p for p in mounts if _under(config.inventory.labels_file.as_posix(), p))
    labels_items = volumes[mounts[labels_mount]["name"]]["configMap"]["items"]
    assert [PurePosixPath(labels_mount) / i["path"] for i in labels_items] == [
        PurePosixPath(config.inventory.labels_file.as_posix())]

    # the metrics port is the config's, and the probes use /healthz on it
    assert config.metrics.listen is not None
    port = int(config.metrics.listen.rpartition(":")[2])
    (metrics_port,) = agent["ports"]
    assert metrics_port["containerPort"] == port
    annotations = ds["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == str(port)
    for probe in ("livenessProbe", "readinessProbe"):
        get = agent[probe]["httpGet"]
        assert get == {"path": "/healthz", "port": metrics_port["name"]}
    env = {e["name"]: e for e in agent["env"]}
    assert env["GPULEDGER_AGENT__NODE"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert "SYS_PTRACE" in agent["securityContext"]["capabilities"]["add"]


def test_systemd_unit(tmp_path: Path) -> None:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string((DEPLOY / "gpuledger-agent.service").read_text())
    assert set(parser.sections()) == {"Unit", "Service", "Install"}
    service = parser["Service"]
    argv = shlex.split(service["ExecStart"])
    assert argv[0].endswith("/bin/gpuledger") and argv[1] == "agent"
    config_path = argv[argv.index("--config") + 1]
    assert config_path == "/etc/gpuledger/agent.yaml"
    config = _config((DEPLOY / "agent.yaml").read_text(), tmp_path)
    assert config.source == "nvml" and config.attribution.methods[0] == "slurm"
    state = "/var/lib/" + service["StateDirectory"]
    assert _under(config.spool.path.as_posix(), state)
    assert state in service["ReadWritePaths"].split()
    assert service["KillSignal"] == "SIGTERM"
    assert "CAP_SYS_PTRACE" in service["AmbientCapabilities"].split()


def test_dockerfile() -> None:
    lines = [line.strip() for line in (DEPLOY / "agent.Dockerfile").read_text().splitlines()
             if line.strip() and not line.strip().startswith("#")]
    base = next(line for line in lines if line.startswith("FROM")).split()[1]
    assert re.fullmatch(r"python:\d+\.\d+\.\d+-slim-\w+", base), base   # an exact release
    for line in lines:
        if line.startswith("COPY"):
            *sources, _dest = line.split()[1:]
            for src in sources:
                assert (ROOT / src).exists(), src
    assert any(".[agent]" in line and "pipeline]" not in line for line in lines)
    entry = next(line for line in lines if line.startswith("ENTRYPOINT"))
    cmd = next(line for line in lines if line.startswith("CMD"))
    argv: list[Any] = yaml.safe_load(entry.split(None, 1)[1]) + yaml.safe_load(
        cmd.split(None, 1)[1])
    assert argv[:2] == ["gpuledger", "agent"] and argv[3] == "/etc/gpuledger/agent.yaml"
    assert "COPY deploy/agent.yaml /etc/gpuledger/agent.yaml" in lines
    exposed = int(next(line for line in lines if line.startswith("EXPOSE")).split()[1])
    config = load_agent_config(DEPLOY / "agent.yaml", {})
    assert config.metrics.listen is not None
    assert exposed == int(config.metrics.listen.rpartition(":")[2])
