"""The agent's configuration: a YAML file, environment overrides, validated at start.

Every key is optional (``docs/agent.md`` lists them all). An environment variable
``GPULEDGER_AGENT__<KEY>[__<KEY>...]`` overrides the key at that path, for example
``GPULEDGER_AGENT__KAFKA__BOOTSTRAP=broker:9092`` or
``GPULEDGER_AGENT__ATTRIBUTION__METHODS=slurm,static``; values are read as the key's type
(lists as ``a,b`` or YAML ``[a, b]``, mappings as YAML ``{a: b}``). Kafka security comes
from the ``GPULEDGER_KAFKA_*`` variables, as for the processor (``docs/kafka.md``).
Errors name the bad key: ``attribution.kubernetes.refresh_s: expected a number, got 'x'``.
"""

from __future__ import annotations

import math
import os
import socket
import types
import typing
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any

import yaml

from gpuledger.yaml_file import YamlFileError, read_yaml

ENV_PREFIX = "GPULEDGER_AGENT__"
SOURCES = ("nvml", "dcgm-exporter", "simulator")
METHODS = ("slurm", "kubernetes", "mapping_dir", "static")


class AgentConfigError(ValueError):
    """A configuration value is missing, unknown, of the wrong type or out of range."""


@dataclass(frozen=True)
class NvmlConfig:
    fields: Path | None = None
    """Field file (YAML) replacing the packaged ``nvml_fields.yaml``."""


@dataclass(frozen=True)
class DcgmExporterConfig:
    url: str = "http://127.0.0.1:9400/metrics"
    timeout_s: float = 5.0
    card_type: str | None = None
    """Card type to report (default: dcgm-exporter's ``modelName`` label)."""


@dataclass(frozen=True)
class SimulatorConfig:
    cluster: Path | None = None
    """Cluster spec YAML (default: the simulator's built-in 576-GPU cluster)."""
    seed: int = 7
    hours: float = 24.0
    """Span planned at a time; a new span starts when it runs out."""


@dataclass(frozen=True)
class SlurmConfig:
    job_id: str = "{id}"
    """Job id template; ``{id}`` is Slurm's numeric id (match the Slurm bridge's prefix)."""
    walk_parents: int = 8
    device_cgroups: bool = True
    """Read GPU holders of idle GPUs from cgroup v1 ``devices.list``."""


@dataclass(frozen=True)
class KubernetesConfig:
    job_id: str = "{namespace}/{pod}"
    """Job id template: ``{namespace}``, ``{pod}``, ``{container}``."""
    pod_resources_socket: str | None = "/var/lib/kubelet/pod-resources/kubelet.sock"
    """The kubelet's pod-resources socket; empty or null: cgroups only."""
    resources: list[str] = field(default_factory=lambda: ["nvidia.com/gpu", "nvidia.com/mig-*"])
    timeout_s: float = 2.0
    refresh_s: float = 10.0


@dataclass(frozen=True)
class MappingDirConfig:
    path: Path | None = None
    """Folder of per-GPU job files (dcgm-exporter's ``--hpc-job-mapping-dir``)."""


@dataclass(frozen=True)
class StaticConfig:
    job_id: str | None = None
    env: str | None = None
    gpus: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class AttributionConfig:
    methods: list[str] = field(default_factory=list)
    """Methods in the order they are asked (see docs/agent.md)."""
    proc_root: Path = Path("/proc")
    cgroup_root: Path = Path("/sys/fs/cgroup")
    slurm: SlurmConfig = field(default_factory=SlurmConfig)
    kubernetes: KubernetesConfig = field(default_factory=KubernetesConfig)
    mapping_dir: MappingDirConfig = field(default_factory=MappingDirConfig)
    static: StaticConfig = field(default_factory=StaticConfig)


@dataclass(frozen=True)
class InventoryConfig:
    pool: str | None = None
    pool_label: str | None = None
    """Take the pool from this label when ``pool`` is not set."""
    labels: dict[str, str] = field(default_factory=dict)
    labels_file: Path | None = None
    """``key=value`` lines, re-read at every check (e.g. written by provisioning)."""
    schedulable: bool = True
    check_s: float = 60.0
    """How often the inventory is re-read and compared with the last one published."""
    republish_s: float = 3600.0
    """Publish again after this long even when nothing changed (0: never)."""


@dataclass(frozen=True)
class KafkaConfig:
    bootstrap: str | None = None
    """``host:port[,host:port]`` (default ``$GPULEDGER_KAFKA_BOOTSTRAP``)."""
    topic_prefix: str = ""
    send_timeout_s: float = 10.0
    batch: int = 2000


@dataclass(frozen=True)
class SpoolConfig:
    path: Path = Path("/var/lib/gpuledger/spool")
    max_bytes: int = 256 << 20
    segment_bytes: int = 8 << 20


@dataclass(frozen=True)
class MetricsConfig:
    listen: str | None = "127.0.0.1:9466"
    """``host:port`` of /metrics and /healthz (loopback unless configured otherwise;
    ``0.0.0.0:9466`` for Prometheus on another host); empty or null: no endpoint."""


@dataclass(frozen=True)
class AgentConfig:
    node: str | None = None
    """Node name (default: the host name)."""
    agent_id: str | None = None
    """The ``agent`` field of every sample (default: the node name)."""
    interval_s: float = 10.0
    source: str = "nvml"
    nvml: NvmlConfig = field(default_factory=NvmlConfig)
    dcgm_exporter: DcgmExporterConfig = field(default_factory=DcgmExporterConfig)
    simulator: SimulatorConfig = field(default_factory=SimulatorConfig)
    attribution: AttributionConfig = field(default_factory=AttributionConfig)
    inventory: InventoryConfig = field(default_factory=InventoryConfig)
    kafka: KafkaConfig = field(default_factory=KafkaConfig)
    spool: SpoolConfig = field(default_factory=SpoolConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)

    @property
    def node_name(self) -> str:
        return self.node or socket.gethostname()

    @property
    def agent_name(self) -> str:
        return self.agent_id or self.node_name


# -- reading -----------------------------------------------------------------------

_TRUE = ("true", "yes", "on", "1")
_FALSE = ("false", "no", "off", "0")


def _coerce(path: str, value: Any, hint: Any) -> Any:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (types.UnionType, typing.Union):
        if value is None or value == "":
            return None
        inner = next(a for a in args if a is not type(None))
        return _coerce(path, value, inner)
    if is_dataclass(hint):
        return _build(path, hint, value)
    if hint is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in _TRUE + _FALSE:
            return value.lower() in _TRUE
        raise AgentConfigError(f"{path}: expected true or false, got {value!r}")
    if hint in (int, float):
        if isinstance(value, bool):
            raise AgentConfigError(f"{path}: expected a number, got {value!r}")
        try:
            number = hint(value)
        except (TypeError, ValueError):
            raise AgentConfigError(f"{path}: expected a number, got {value!r}") from None
        except OverflowError:  # int(inf)
            raise AgentConfigError(f"{path}: expected a finite number, got {value!r}") from None
        if not math.isfinite(number):
            raise AgentConfigError(f"{path}: expected a finite number, got {value!r}")
        if hint is int and isinstance(value, float) and value != number:
            raise AgentConfigError(f"{path}: expected a whole number, got {value!r}")
        return number
    if hint is str:
        if isinstance(value, str | int | float) and not isinstance(value, bool):
            return str(value)
        raise AgentConfigError(f"{path}: expected text, got {value!r}")
    if hint is Path:
        if isinstance(value, str) and value:
            return Path(value)
        raise AgentConfigError(f"{path}: expected a path, got {value!r}")
    if origin is list:
        if isinstance(value, str):
            value = (yaml.safe_load(value) if value.strip().startswith("[")
                     else [v.strip() for v in value.split(",") if v.strip()])
        if not isinstance(value, list):
            raise AgentConfigError(f"{path}: expected a list, got {value!r}")
        return [_coerce(f"{path}[{i}]", v, args[0]) for i, v in enumerate(value)]
    if origin is dict:
        if isinstance(value, str):
            value = yaml.safe_load(value) if value.strip() else {}
        if not isinstance(value, dict):
            raise AgentConfigError(f"{path}: expected a mapping, got {value!r}")
        return {str(k): _coerce(f"{path}.{k}", v, args[1]) for k, v in value.items()}
    raise AgentConfigError(f"{path}: unsupported type {hint!r}")  # pragma: no cover


def _build(path: str, cls: Any, raw: Any) -> Any:
    if raw is None:
        return cls()
    if not isinstance(raw, dict):
        raise AgentConfigError(f"{path or 'configuration'}: expected a mapping, got {raw!r}")
    hints = typing.get_type_hints(cls)
    known = [f.name for f in fields(cls)]
    values: dict[str, Any] = {}
    for key, value in raw.items():
        where = f"{path}.{key}" if path else str(key)
        if key not in known:
            raise AgentConfigError(f"{where}: unknown key (known: {', '.join(known)})")
        values[key] = _coerce(where, value, hints[key])
    return cls(**values)


def _env_overrides(raw: dict[str, Any], environ: dict[str, str]) -> dict[str, Any]:
    merged: dict[str, Any] = _copy(raw)
    for var, value in sorted(environ.items()):
        if not var.startswith(ENV_PREFIX):
            continue
        parts = [p.lower() for p in var[len(ENV_PREFIX):].split("__")]
        if not all(parts):
            raise AgentConfigError(f"{var}: empty key in the variable name")
        target = merged
        for i, part in enumerate(parts[:-1]):
            nested = target.setdefault(part, {})
            if not isinstance(nested, dict):
                where = ".".join(parts[:i + 1])
                raise AgentConfigError(f"{where}: set by {var} but not a mapping")
            target = nested
        target[parts[-1]] = value
    return merged


def _copy(raw: dict[str, Any]) -> dict[str, Any]:
    return {k: (_copy(v) if isinstance(v, dict) else v) for k, v in raw.items()}


def load_agent_config(path: Path | None = None,
                      environ: dict[str, str] | None = None) -> AgentConfig:
    """Read ``path`` (optional), apply ``GPULEDGER_AGENT__*`` overrides, validate."""
    raw: Any = {}
    if path is not None:
        try:
            raw = read_yaml(path) or {}
        except YamlFileError as exc:
            raise AgentConfigError(str(exc)) from None
        if not isinstance(raw, dict):
            raise AgentConfigError(f"{path}: expected a mapping at the top level")
    raw = _env_overrides(raw, dict(os.environ) if environ is None else environ)
    config: AgentConfig = _build("", AgentConfig, raw)
    validate(config)
    return config


def _template(path: str, template: str, **sample: str) -> None:
    try:
        template.format(**sample)
    except (KeyError, IndexError, ValueError) as exc:
        raise AgentConfigError(
            f"{path}: {template!r} is not a valid template (placeholders: "
            f"{', '.join('{' + k + '}' for k in sample)}): {exc}") from None


def _host_port(path: str, text: str) -> None:
    port = text.rpartition(":")[2]
    if not port.isdigit() or not 0 <= int(port) < 65536:
        raise AgentConfigError(f"{path}: expected HOST:PORT, got {text!r}")


def validate(c: AgentConfig) -> None:
    """Ranges and cross-key rules; raises :class:`AgentConfigError` naming the key."""
    if c.node is not None and not c.node.strip():
        raise AgentConfigError("node: must not be empty")
    if c.interval_s <= 0:
        raise AgentConfigError(f"interval_s: must be > 0, got {c.interval_s}")
    if c.source not in SOURCES:
        raise AgentConfigError(f"source: {c.source!r} is not one of {', '.join(SOURCES)}")
    a = c.attribution
    for i, method in enumerate(a.methods):
        if method not in METHODS:
            raise AgentConfigError(f"attribution.methods[{i}]: {method!r} is not one of "
                                   f"{', '.join(METHODS)}")
        if method in a.methods[:i]:
            raise AgentConfigError(f"attribution.methods[{i}]: {method!r} is listed twice")
    if "mapping_dir" in a.methods and a.mapping_dir.path is None:
        raise AgentConfigError("attribution.mapping_dir.path: required when the "
                               "mapping_dir method is used")
    if a.slurm.walk_parents < 0:
        raise AgentConfigError("attribution.slurm.walk_parents: must be >= 0")
    _template("attribution.slurm.job_id", a.slurm.job_id, id="1")
    _template("attribution.kubernetes.job_id", a.kubernetes.job_id, namespace="ns",
              pod="p", container="c")
    for name in ("timeout_s", "refresh_s"):
        if getattr(a.kubernetes, name) <= 0:
            raise AgentConfigError(f"attribution.kubernetes.{name}: must be > 0")
    if c.dcgm_exporter.timeout_s <= 0:
        raise AgentConfigError("dcgm_exporter.timeout_s: must be > 0")
    if c.simulator.hours <= 0:
        raise AgentConfigError("simulator.hours: must be > 0")
    inv = c.inventory
    if inv.pool is not None and not inv.pool.strip():
        raise AgentConfigError("inventory.pool: must not be empty")
    if inv.check_s <= 0:
        raise AgentConfigError("inventory.check_s: must be > 0")
    if inv.republish_s < 0:
        raise AgentConfigError("inventory.republish_s: must be >= 0")
    k = c.kafka
    if k.bootstrap is not None:
        for i, server in enumerate(k.bootstrap.split(",")):
            _host_port(f"kafka.bootstrap[{i}]" if "," in k.bootstrap else "kafka.bootstrap",
                       server.strip())
    if k.send_timeout_s <= 0:
        raise AgentConfigError("kafka.send_timeout_s: must be > 0")
    if k.batch <= 0:
        raise AgentConfigError("kafka.batch: must be > 0")
    s = c.spool
    if s.segment_bytes < 4096:
        raise AgentConfigError("spool.segment_bytes: must be at least 4096")
    if s.max_bytes < s.segment_bytes:
        raise AgentConfigError("spool.max_bytes: must be at least spool.segment_bytes "
                               f"({s.max_bytes} < {s.segment_bytes})")
    if c.metrics.listen:
        _host_port("metrics.listen", c.metrics.listen)
