"""The Kubernetes bridge's configuration: validation names the key; where the API is."""

from __future__ import annotations

import base64
import re
from pathlib import Path

import pytest
import yaml

from gpuledger.bridges.kubernetes.config import (
    ConfigError,
    connection,
    load_config,
    parse_config,
)


@pytest.mark.parametrize(("raw", "message"), [
    ({"kubernetes": {"sever": "https://x"}}, "config.kubernetes.sever: unknown key"),
    ({"kubernetes": {"server": "10.0.0.1:6443"}},
     "config.kubernetes.server: expected an http(s):// URL"),
    ({"kubernetes": {"watch_timeout_s": 0}}, "config.kubernetes.watch_timeout_s: expected"),
    ({"kubernetes": {"read_timeout_s": float("nan")}},
     "config.kubernetes.read_timeout_s: expected a number of seconds > 0, got nan"),
    ({"kubernetes": {"request_timeout_s": float("inf")}},
     "config.kubernetes.request_timeout_s: expected a number of seconds > 0, got inf"),
    ({"kubernetes": {"kueue": "yes"}}, "config.kubernetes.kueue: expected true or false"),
    ({"kubernetes": {"node_labels": "zone"}}, "config.kubernetes.node_labels: expected a list"),
    ({"kubernetes": {"node_labels": ["zone", 3]}}, "config.kubernetes.node_labels[1]"),
    ({"mapping": {"teams": {"namespaces": {"ml": 3}}}}, "config.mapping.teams.namespaces.ml"),
    ({"state_file": "x"}, "config.state_file: unknown key"),
    ([1, 2], "config: expected a mapping"),
])
def test_errors_name_the_bad_key(raw: object, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse_config(raw)


def test_values_and_defaults(tmp_path: Path) -> None:
    path = tmp_path / "k8s.yaml"
    path.write_text(yaml.safe_dump({
        "kubernetes": {"server": "https://10.0.0.1:6443", "kueue": False,
                       "gpu_index_annotation": "example.com/gpu-indices",
                       "label_selector": "gpu=true", "read_timeout_s": 5},
        "mapping": {"pools": {"node_label": "pool"}}}))
    config = load_config(path)
    assert config.server == "https://10.0.0.1:6443"
    assert config.options.kueue is False
    assert config.options.gpu_index_annotation == "example.com/gpu-indices"
    assert config.label_selector == "gpu=true" and config.read_timeout_s == 5.0
    assert config.watch_timeout_s == 300.0
    assert config.mapping.pool(node_labels={"pool": "train"}) == "train"
    # a plain mapping file is read as the mapping section
    plain = parse_config({"teams": {"default": "ml"}})
    assert plain.mapping.team() == "ml" and plain.server is None


def test_in_cluster_service_account(tmp_path: Path) -> None:
    conn = connection(parse_config({}), {"KUBERNETES_SERVICE_HOST": "10.96.0.1",
                                         "KUBERNETES_SERVICE_PORT": "443"}, tmp_path)
    assert conn.server == "https://10.96.0.1:443"
    assert conn.token_file == tmp_path / "token" and conn.ca_file == tmp_path / "ca.crt"
    (tmp_path / "token").write_text("tok-1\n")
    assert conn.bearer() == "tok-1"
    (tmp_path / "token").write_text("tok-2\n")  # rotated tokens are re-read
    assert conn.bearer() == "tok-2"
    with pytest.raises(ConfigError, match=r"kubernetes\.server: not set"):
        connection(parse_config({}), {}, tmp_path)


def test_kubeconfig_token_user(tmp_path: Path) -> None:
    ca = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "prod",
        "clusters": [{"name": "c1", "cluster": {
            "server": "https://api.prod:6443",
            "certificate-authority-data": base64.b64encode(ca.encode()).decode()}}],
        "users": [{"name": "bridge", "user": {"token": "s3cret"}},
                  {"name": "oidc", "user": {"exec": {"command": "kubelogin"}}}],
        "contexts": [{"name": "prod", "context": {"cluster": "c1", "user": "bridge"}},
                     {"name": "dev", "context": {"cluster": "c1", "user": "oidc"}}]}))
    conn = connection(parse_config({"kubernetes": {"kubeconfig": str(kubeconfig)}}), {})
    assert conn.server == "https://api.prod:6443"
    assert conn.bearer() == "s3cret" and conn.ca_data == ca
    with pytest.raises(ConfigError, match="exec/auth-provider users are not supported"):
        connection(parse_config({"kubernetes": {"kubeconfig": str(kubeconfig),
                                                "context": "dev"}}), {})
    with pytest.raises(ConfigError, match="has no context 'qa'"):
        connection(parse_config({"kubernetes": {"kubeconfig": str(kubeconfig),
                                                "context": "qa"}}), {})
