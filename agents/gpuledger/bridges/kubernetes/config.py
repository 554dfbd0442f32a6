"""The Kubernetes bridge's configuration file, validated with errors naming the key.

One YAML file holds the ``kubernetes:`` section and the shared ``mapping:`` section
(``docs/mapping.md``); a file with only mapping keys is read as a mapping. The state
file and the spool are command-line options (``gpuledger bridge kubernetes --help``).

```yaml
kubernetes:
  server: https://10.0.0.1:6443        # default: in-cluster, else the kubeconfig's
  kubeconfig: ~/.kube/config            # token or client-certificate users
  context: prod                         # default: the kubeconfig's current context
  token_file: /path/to/token            # bearer token file (re-read on every request)
  ca_file: /path/to/ca.crt
  insecure_skip_tls_verify: false
  kueue: true                           # watch kueue.x-k8s.io/v1beta1 Workloads
  label_selector: ""                    # only pods with these labels
  gpu_index_annotation: null            # pod annotation holding "0,1" GPU indices
  node_labels: [topology.kubernetes.io/zone, kubernetes.io/hostname]
  unschedulable_taints: [node.kubernetes.io/unschedulable, ...]
  default_pool: default
  start_grace_s: 120                    # start a Workload with the pods bound by then
  watch_timeout_s: 300
  read_timeout_s: 90
  request_timeout_s: 30
mapping: {...}                          # docs/mapping.md
```
"""

from __future__ import annotations

import base64
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuledger.bridges.kubernetes.api import (
    Connection,
    TlsError,
    TokenError,
    server_problem,
    tls_context,
)
from gpuledger.bridges.kubernetes.translate import (
    DEFAULT_NODE_LABELS,
    DEFAULT_UNSCHEDULABLE_TAINTS,
    Options,
)
from gpuledger.bridges.mapping import Mapping, MappingError, parse_mapping
from gpuledger.yaml_file import YamlFileError, read_yaml

IN_CLUSTER = Path("/var/run/secrets/kubernetes.io/serviceaccount")
_TOP = ("kubernetes", "mapping")
_MAPPING_KEYS = ("teams", "pools", "queues", "priorities", "job_types", "card_types",
                 "preemptible")
_KUBE = ("server", "kubeconfig", "context", "token_file", "ca_file",
         "insecure_skip_tls_verify", "kueue", "label_selector", "gpu_index_annotation",
         "node_labels", "unschedulable_taints", "default_pool", "watch_timeout_s",
         "read_timeout_s", "request_timeout_s", "start_grace_s")


class ConfigError(ValueError):
    """The configuration is wrong; the message names the key."""


@dataclass(frozen=True)
class BridgeConfig:
    server: str | None = None
    kubeconfig: Path | None = None
    context: str | None = None
    token_file: Path | None = None
    ca_file: Path | None = None
    insecure: bool = False
    label_selector: str | None = None
    watch_timeout_s: float = 300.0
    read_timeout_s: float = 90.0
    request_timeout_s: float = 30.0
    state_file: Path = Path("gpuledger-kubernetes-bridge.state")
    options: Options = field(default_factory=Options)
    mapping: Mapping = field(default_factory=Mapping)


def _check(raw: Any, where: str, known: tuple[str, ...]) -> dict[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a mapping, got {type(raw).__name__}")
    for k in raw:
        if k not in known:
            raise ConfigError(f"{where}.{k}: unknown key (known: {', '.join(known)})")
    return raw


def _str(where: str, value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{where}: expected a non-empty string, got {value!r}")
    return value


def _path(where: str, value: Any) -> Path | None:
    text = _str(where, value)
    return Path(text).expanduser() if text else None


def _bool(where: str, value: Any, default: bool) -> bool:
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ConfigError(f"{where}: expected true or false, got {value!r}")
    return value


SECONDS_MAX = 86_400.0
"""The longest timeout or grace a key takes (a day)."""


def _seconds(where: str, value: Any, default: float) -> float:
    if value is None:
        return default
    number = value
    if isinstance(value, str):  # YAML 1.1 reads 1e3 (no dot) as a string
        try:
            number = float(value)
        except ValueError:
            number = None
    if isinstance(number, bool) or not isinstance(number, int | float) or not number > 0 \
            or math.isinf(number):
        raise ConfigError(f"{where}: expected a number of seconds > 0, got {value!r}")
    if number > SECONDS_MAX:
        raise ConfigError(f"{where}: at most {SECONDS_MAX:,.0f} seconds (a day), "
                          f"got {value!r}")
    return float(number)


def _server(where: str, value: Any) -> str | None:
    server = _str(where, value)
    if server is None:
        return None
    if not server.startswith(("http://", "https://")):
        raise ConfigError(f"{where}: expected an http(s):// URL, got {server!r}")
    problem = server_problem(server)
    if problem:
        raise ConfigError(f"{where}: {server!r}: {problem}")
    return server


def _strings(where: str, value: Any, default: tuple[str, ...]) -> tuple[str, ...]:
    if value is None:
        return default
    if not isinstance(value, list):
        raise ConfigError(f"{where}: expected a list of strings, got {value!r}")
    return tuple(_str(f"{where}[{i}]", v) or "" for i, v in enumerate(value))


def parse_config(raw: Any, where: str = "config") -> BridgeConfig:
    """Build a :class:`BridgeConfig` from parsed YAML."""
    if isinstance(raw, dict) and raw and not set(raw) & set(_TOP) \
            and set(raw) <= set(_MAPPING_KEYS):
        raw = {"mapping": raw}  # a plain mapping file
    top = _check(raw, where, _TOP)
    kube = _check(top.get("kubernetes"), f"{where}.kubernetes", _KUBE)
    k = f"{where}.kubernetes"
    server = _server(f"{k}.server", kube.get("server"))
    try:
        mapping = parse_mapping(top.get("mapping"), f"{where}.mapping")
    except MappingError as exc:
        raise ConfigError(str(exc)) from None
    options = Options(
        kueue=_bool(f"{k}.kueue", kube.get("kueue"), True),
        gpu_index_annotation=_str(f"{k}.gpu_index_annotation",
                                  kube.get("gpu_index_annotation")),
        node_labels=_strings(f"{k}.node_labels", kube.get("node_labels"),
                             DEFAULT_NODE_LABELS),
        unschedulable_taints=_strings(f"{k}.unschedulable_taints",
                                      kube.get("unschedulable_taints"),
                                      DEFAULT_UNSCHEDULABLE_TAINTS),
        default_pool=_str(f"{k}.default_pool", kube.get("default_pool")) or "default",
        start_grace_s=_seconds(f"{k}.start_grace_s", kube.get("start_grace_s"), 120.0),
    )
    return BridgeConfig(
        server=server,
        kubeconfig=_path(f"{k}.kubeconfig", kube.get("kubeconfig")),
        context=_str(f"{k}.context", kube.get("context")),
        token_file=_path(f"{k}.token_file", kube.get("token_file")),
        ca_file=_path(f"{k}.ca_file", kube.get("ca_file")),
        insecure=_bool(f"{k}.insecure_skip_tls_verify",
                       kube.get("insecure_skip_tls_verify"), False),
        label_selector=_str(f"{k}.label_selector", kube.get("label_selector")),
        watch_timeout_s=_seconds(f"{k}.watch_timeout_s", kube.get("watch_timeout_s"), 300.0),
        read_timeout_s=_seconds(f"{k}.read_timeout_s", kube.get("read_timeout_s"), 90.0),
        request_timeout_s=_seconds(f"{k}.request_timeout_s", kube.get("request_timeout_s"),
                                   30.0),
        options=options, mapping=mapping)


def load_config(path: Path | None) -> BridgeConfig:
    """Read and validate a configuration file (``None``: all defaults)."""
    if path is None:
        return BridgeConfig()
    try:
        raw = read_yaml(path)
    except YamlFileError as exc:
        raise ConfigError(str(exc)) from None
    return parse_config(raw, str(path))


def connection(config: BridgeConfig, environ: dict[str, str] | None = None,
               in_cluster: Path = IN_CLUSTER) -> Connection:
    """How to reach the API: the config's server, else in-cluster, else the kubeconfig."""
    env = os.environ if environ is None else environ
    if config.kubeconfig is not None and config.server is None:
        return _from_kubeconfig(config)
    keys = {"token": "kubernetes.token_file", "ca_file": "kubernetes.ca_file",
            "ca_data": "kubernetes.ca_file", "cert_file": "kubernetes.ca_file"}
    server = config.server
    token_file, ca_file = config.token_file, config.ca_file
    if server is None and env.get("KUBERNETES_SERVICE_HOST"):
        host, port = env["KUBERNETES_SERVICE_HOST"], env.get("KUBERNETES_SERVICE_PORT", "443")
        host = f"[{host}]" if ":" in host else host
        server = f"https://{host}:{port}"
        if server_problem(server):
            raise ConfigError(f"KUBERNETES_SERVICE_HOST/PORT: {server!r}: "
                              f"{server_problem(server)}")
        token_file = token_file or in_cluster / "token"
        ca_file = ca_file or in_cluster / "ca.crt"
        keys = {"token": "kubernetes.token_file (in-cluster service account)",
                "ca_file": "kubernetes.ca_file (in-cluster service account)"}
        keys["ca_data"] = keys["cert_file"] = keys["ca_file"]
    if server is None:
        raise ConfigError("kubernetes.server: not set, not running in a cluster "
                          "(no KUBERNETES_SERVICE_HOST) and no kubernetes.kubeconfig")
    return checked(Connection(server=server, token_file=token_file, ca_file=ca_file,
                              insecure=config.insecure), keys)


def checked(conn: Connection, keys: dict[str, str]) -> Connection:
    """``conn`` once its token and TLS files are usable: at start, not at the first
    request; errors name the key (``keys``: token, ca_file, ca_data, cert_file → key)."""
    try:
        conn.bearer()
    except TokenError as exc:
        raise ConfigError(f"{keys['token']}: {exc}") from None
    if conn.server.startswith("https://"):
        try:
            tls_context(conn)
        except TlsError as exc:
            raise ConfigError(f"{keys[exc.what]}: {exc}") from None
    return conn


def _from_kubeconfig(config: BridgeConfig) -> Connection:
    assert config.kubeconfig is not None
    where = str(config.kubeconfig)
    try:
        raw = read_yaml(config.kubeconfig)
    except YamlFileError as exc:
        raise ConfigError(f"kubernetes.kubeconfig: {exc}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"kubernetes.kubeconfig: {where} is not a kubeconfig")

    def bad(key: str, problem: str) -> ConfigError:
        return ConfigError(f"kubernetes.kubeconfig {where}: {key}: {problem}")

    name = config.context or raw.get("current-context")

    def named(section: str, wanted: Any) -> tuple[str, dict[str, Any]]:
        entries = raw.get(section) or []
        if not isinstance(entries, list):
            raise bad(section, f"expected a list, got {type(entries).__name__}")
        for entry in entries:
            if isinstance(entry, dict) and entry.get("name") == wanted:
                value = entry.get(section[:-1])
                if isinstance(value, dict):
                    return f"{section}[{wanted}].{section[:-1]}", value
        raise ConfigError(f"kubernetes.kubeconfig: {where} has no {section[:-1]} {wanted!r}")

    _, ctx = named("contexts", name)
    ckey, cluster = named("clusters", ctx.get("cluster"))
    ukey, user = named("users", ctx.get("user"))
    base = config.kubeconfig.parent

    def rel(key: str, value: Any) -> Path | None:
        if value is None:
            return None
        if not isinstance(value, str) or not value:
            raise bad(key, f"expected a file name, got {value!r}")
        return (base / value).resolve()

    if user.get("exec") or user.get("auth-provider"):
        raise ConfigError("kubernetes.kubeconfig: exec/auth-provider users are not "
                          "supported; use a token, a token file or a client certificate")
    ca_data = None
    if cluster.get("certificate-authority-data") and not config.ca_file:
        try:
            ca_data = base64.b64decode(str(cluster["certificate-authority-data"]),
                                       validate=True).decode()
        except (ValueError, UnicodeDecodeError):
            raise bad(f"{ckey}.certificate-authority-data",
                      "not base64 of a PEM certificate") from None
    server = cluster.get("server")
    if not isinstance(server, str):
        raise ConfigError(f"kubernetes.kubeconfig: cluster of context {name!r} has no server")
    problem = server_problem(server)
    if problem:
        raise bad(f"{ckey}.server", f"{server!r}: {problem}")
    skip = cluster.get("insecure-skip-tls-verify", False)
    if not isinstance(skip, bool):  # bool("false") is True: only YAML booleans
        raise bad(f"{ckey}.insecure-skip-tls-verify", f"expected true or false, got {skip!r}")
    token = user.get("token")
    if token is not None and not isinstance(token, str):
        raise bad(f"{ukey}.token", "expected a string")
    keys = {"token": f"kubernetes.kubeconfig {where}: {ukey}."
                     + ("tokenFile" if user.get("tokenFile") else "token"),
            "ca_file": "kubernetes.ca_file" if config.ca_file
            else f"kubernetes.kubeconfig {where}: {ckey}.certificate-authority",
            "ca_data": f"kubernetes.kubeconfig {where}: {ckey}.certificate-authority-data",
            "cert_file": f"kubernetes.kubeconfig {where}: {ukey}.client-certificate"}
    return checked(Connection(
        server=server, token=token,
        token_file=rel(f"{ukey}.tokenFile", user.get("tokenFile")),
        ca_file=config.ca_file or rel(f"{ckey}.certificate-authority",
                                      cluster.get("certificate-authority")),
        ca_data=ca_data,
        cert_file=rel(f"{ukey}.client-certificate", user.get("client-certificate")),
        key_file=rel(f"{ukey}.client-key", user.get("client-key")),
        insecure=config.insecure or skip), keys)
