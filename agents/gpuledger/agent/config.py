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
import re
import socket
import string
import types
import typing
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any

import yaml

from gpuledger.agent.attribution import job_id_problem
from gpuledger.http_url import http_url_problem
from gpuledger.yaml_file import YamlFileError, load_yaml, read_yaml, yaml_problem

ENV_PREFIX = "GPULEDGER_AGENT__"
SOURCES = ("nvml", "dcgm-exporter", "simulator")
METHODS = ("slurm", "kubernetes", "mapping_dir", "static")
SHOW_CHARS = 40
"""Values in error messages are cut after this many characters."""
MIN_INTERVAL_S = 0.1
DAY_S = 86400.0
"""Bounds of ``interval_s``, ``inventory.check_s`` and ``attribution.kubernetes.refresh_s``."""
MIN_TIMEOUT_S = 0.001
MAX_TIMEOUT_S = 3600.0
"""Bounds of every ``timeout_s``."""
MAX_NAME = 256
"""The longest ``node`` and ``agent_id``."""
MAX_SEGMENT_BYTES = 1 << 30
_HOST = re.compile(r"[A-Za-z0-9._\-\[\]:%]*")


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


def _show(value: Any) -> str:
    """``repr(value)``, cut to :data:`SHOW_CHARS` characters for error messages."""
    text = repr(value)
    return text if len(text) <= SHOW_CHARS else text[:SHOW_CHARS] + "…"


def _yaml_value(path: str, text: str) -> Any:
    try:
        return load_yaml(text)
    except yaml.YAMLError as exc:
        raise AgentConfigError(f"{path}: {yaml_problem(exc)}") from None


def _number(path: str, value: Any, hint: type) -> int | float:
    """A float, or for ``int`` a whole number ('5', 5.0, '5.0' and '1e3' are whole)."""
    kind = "a whole number" if hint is int else "a number"
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise AgentConfigError(f"{path}: expected {kind}, got {_show(value)}")
    if hint is int and isinstance(value, int):
        return value
    if hint is int and isinstance(value, str):
        try:
            return int(value)            # exact, however many digits
        except ValueError:
            pass
    try:
        number = float(value)
    except ValueError:
        raise AgentConfigError(f"{path}: expected {kind}, got {_show(value)}") from None
    except OverflowError:                # float(10 ** 400)
        raise AgentConfigError(f"{path}: expected a finite number, got {_show(value)}") from None
    if not math.isfinite(number):
        raise AgentConfigError(f"{path}: expected a finite number, got {_show(value)}")
    if hint is float:
        return number
    if not number.is_integer():
        raise AgentConfigError(f"{path}: expected a whole number, got {_show(value)}")
    return int(number)


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
        raise AgentConfigError(f"{path}: expected true or false, got {_show(value)}")
    if hint in (int, float):
        return _number(path, value, hint)
    if hint is str:
        if isinstance(value, str | int | float) and not isinstance(value, bool):
            return str(value)
        raise AgentConfigError(f"{path}: expected text, got {_show(value)}")
    if hint is Path:
        if isinstance(value, str) and value:
            return Path(value)
        raise AgentConfigError(f"{path}: expected a path, got {_show(value)}")
    if origin is list:
        if isinstance(value, str):
            value = (_yaml_value(path, value) if value.strip().startswith("[")
                     else [v.strip() for v in value.split(",") if v.strip()])
        if not isinstance(value, list):
            raise AgentConfigError(f"{path}: expected a list, got {_show(value)}")
        return [_coerce(f"{path}[{i}]", v, args[0]) for i, v in enumerate(value)]
    if origin is dict:
        if isinstance(value, str):
            value = _yaml_value(path, value) if value.strip() else {}
        if not isinstance(value, dict):
            raise AgentConfigError(f"{path}: expected a mapping, got {_show(value)}")
        out: dict[str, Any] = {}
        for k, v in value.items():
            if k is None or isinstance(k, bool) or not str(k).strip():
                raise AgentConfigError(f"{path}: a key is empty or null ({_show(k)})")
            out[str(k)] = _coerce(f"{path}.{k}", v, args[1])
        return out
    raise AgentConfigError(f"{path}: unsupported type {hint!r}")  # pragma: no cover


def _build(path: str, cls: Any, raw: Any) -> Any:
    if raw is None:
        return cls()
    if isinstance(raw, str) and path:
        example = f"{ENV_PREFIX}{path.upper().replace('.', '__')}__{fields(cls)[0].name.upper()}"
        raise AgentConfigError(f"{path}: expected a mapping, got {_show(raw)} (a section's keys "
                               f"are set one by one, e.g. {example}=...)")
    if not isinstance(raw, dict):
        raise AgentConfigError(f"{path or 'configuration'}: expected a mapping, got "
                               f"{_show(raw)}")
    hints = typing.get_type_hints(cls)
    known = [f.name for f in fields(cls)]
    values: dict[str, Any] = {}
    for key, value in raw.items():
        where = f"{path}.{key}" if path else str(key)
        if key not in known:
            raise AgentConfigError(f"{where}: unknown key (known: {', '.join(known)})")
        values[key] = _coerce(where, value, hints[key])
    return cls(**values)


def _env_overrides(raw: dict[str, Any], environ: dict[str, str],
                   origins: dict[str, str] | None = None) -> dict[str, Any]:
    """``raw`` with the variables applied; ``origins`` gets key path → variable."""
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
        if origins is not None:
            origins[".".join(parts)] = var
    return merged


def _refuse_near_misses(environ: dict[str, str]) -> None:
    """A variable meant for the agent but not of the form ``GPULEDGER_AGENT__<KEY>``
    (``GPULEDGER_AGENT_INTERVAL_S``, ``GPULEDGER_AGENTS__INTERVAL_S``) was ignored in
    silence: refused, naming the variable it was likely meant to be."""
    import difflib

    for var in sorted(environ):
        if not var.upper().startswith("GPULEDGER_") or var.startswith(ENV_PREFIX):
            continue
        rest = var[len("GPULEDGER_"):]
        head = rest.split("_", 1)[0]
        if not head or difflib.SequenceMatcher(None, head.upper(), "AGENT").ratio() < 0.8:
            continue
        key = rest[len(head):].lstrip("_")
        meant = ENV_PREFIX + key if key else ENV_PREFIX + "<KEY>"
        raise AgentConfigError(f"{var}: not an agent setting; the form is "
                               f"GPULEDGER_AGENT__<KEY> (did you mean {meant}?)")


def _naming_variable(message: str, origins: dict[str, str]) -> str:
    """``message`` with the variable that set its key, when one did."""
    key = message.partition(":")[0]
    hits = [p for p in origins if key == p or key.startswith((p + ".", p + "["))]
    if not hits:  # a variable that set a key inside it (NODE__X made `node` a mapping)
        inside = sorted(p for p in origins if p.startswith(key + "."))
        if inside:
            return f"{message} (set by {', '.join(origins[p] for p in inside)})"
        return message
    return f"{message} (set by {origins[max(hits, key=len)]})"


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
    origins: dict[str, str] = {}
    env = dict(os.environ) if environ is None else environ
    _refuse_near_misses(env)
    raw = _env_overrides(raw, env, origins)
    try:
        config: AgentConfig = _build("", AgentConfig, raw)
        validate(config)
    except AgentConfigError as exc:
        raise AgentConfigError(_naming_variable(str(exc), origins)) from None
    return config


def _template(path: str, template: str, **sample: str) -> None:
    """Only plain ``{name}`` placeholders of ``sample`` (no format spec, conversion,
    attribute or index), and a sample rendering must be a valid job id."""
    names = ", ".join("{" + k + "}" for k in sample)
    try:
        parts = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise AgentConfigError(f"{path}: {_show(template)} is not a valid template "
                               f"(placeholders: {names}): {exc}") from None
    for _text, name, spec, conversion in parts:
        if name is not None and (name not in sample or spec or conversion):
            raise AgentConfigError(
                f"{path}: {_show(template)} is not a valid template: only the placeholders "
                f"{names} are allowed, as they are (no format spec, conversion, attribute "
                "or index)")
    _job_id(path, template.format(**sample))


def _job_id(path: str, job_id: str) -> None:
    problem = job_id_problem(job_id)
    if problem:
        raise AgentConfigError(f"{path}: {problem}, got {_show(job_id)}")


def _within(path: str, value: float, low: float, high: float) -> None:
    if not low <= value <= high:
        raise AgentConfigError(f"{path}: must be between {low:g} and {high:g}, got {value:g}")


def _host_port(path: str, text: str) -> None:
    host, _, port = text.rpartition(":")
    if not port.isdigit() or not 0 <= int(port) < 65536 or not _HOST.fullmatch(host):
        raise AgentConfigError(f"{path}: expected HOST:PORT, got {_show(text)}")


def _http_url(path: str, url: str) -> None:
    problem = http_url_problem(url)
    if problem is not None:
        raise AgentConfigError(f"{path}: expected an http:// or https:// URL "
                               f"(http://HOST[:PORT]/PATH), got {_show(url)}: {problem}")


def _name(path: str, value: str | None) -> None:
    if value is None:
        return
    if not value.strip():
        raise AgentConfigError(f"{path}: must not be empty")
    if len(value) > MAX_NAME or not value.isprintable():
        raise AgentConfigError(f"{path}: must be printable text of at most {MAX_NAME} "
                               f"characters, got {_show(value)}")


def validate(c: AgentConfig) -> None:
    """Ranges and cross-key rules; raises :class:`AgentConfigError` naming the key."""
    _name("node", c.node)
    _name("agent_id", c.agent_id)
    _within("interval_s", c.interval_s, MIN_INTERVAL_S, DAY_S)
    if c.source not in SOURCES:
        raise AgentConfigError(f"source: {_show(c.source)} is not one of {', '.join(SOURCES)}")
    a = c.attribution
    for i, method in enumerate(a.methods):
        if method not in METHODS:
            raise AgentConfigError(f"attribution.methods[{i}]: {_show(method)} is not one of "
                                   f"{', '.join(METHODS)}")
        if method in a.methods[:i]:
            raise AgentConfigError(f"attribution.methods[{i}]: {method!r} is listed twice")
    if "mapping_dir" in a.methods and a.mapping_dir.path is None:
        raise AgentConfigError("attribution.mapping_dir.path: required when the "
                               "mapping_dir method is used")
    _within("attribution.slurm.walk_parents", a.slurm.walk_parents, 0, 4096)
    _template("attribution.slurm.job_id", a.slurm.job_id, id="1")
    _template("attribution.kubernetes.job_id", a.kubernetes.job_id, namespace="ns",
              pod="p", container="c")
    _within("attribution.kubernetes.timeout_s", a.kubernetes.timeout_s, MIN_TIMEOUT_S,
            MAX_TIMEOUT_S)
    _within("attribution.kubernetes.refresh_s", a.kubernetes.refresh_s, MIN_INTERVAL_S, DAY_S)
    if a.static.job_id is not None:
        _job_id("attribution.static.job_id", a.static.job_id)
    for gpu, job in a.static.gpus.items():
        _job_id(f"attribution.static.gpus.{gpu}", job)
    _http_url("dcgm_exporter.url", c.dcgm_exporter.url)
    _within("dcgm_exporter.timeout_s", c.dcgm_exporter.timeout_s, MIN_TIMEOUT_S, MAX_TIMEOUT_S)
    _within("simulator.seed", c.simulator.seed, 0, 2**63 - 1)
    _within("simulator.hours", c.simulator.hours, 0.01, 366 * 24)
    inv = c.inventory
    if inv.pool is not None and not inv.pool.strip():
        raise AgentConfigError("inventory.pool: must not be empty")
    _within("inventory.check_s", inv.check_s, MIN_INTERVAL_S, DAY_S)
    _within("inventory.republish_s", inv.republish_s, 0, 366 * DAY_S)
    k = c.kafka
    if k.bootstrap is not None:
        for i, server in enumerate(k.bootstrap.split(",")):
            _host_port(f"kafka.bootstrap[{i}]" if "," in k.bootstrap else "kafka.bootstrap",
                       server.strip())
    _within("kafka.send_timeout_s", k.send_timeout_s, MIN_TIMEOUT_S, MAX_TIMEOUT_S)
    _within("kafka.batch", k.batch, 1, 1_000_000)
    s = c.spool
    if s.segment_bytes < 4096:
        raise AgentConfigError("spool.segment_bytes: must be at least 4096")
    if s.segment_bytes > MAX_SEGMENT_BYTES:
        raise AgentConfigError(f"spool.segment_bytes: must be at most {MAX_SEGMENT_BYTES}")
    if s.max_bytes < s.segment_bytes:
        raise AgentConfigError("spool.max_bytes: must be at least spool.segment_bytes "
                               f"({s.max_bytes} < {s.segment_bytes})")
    if c.metrics.listen:
        _host_port("metrics.listen", c.metrics.listen)
