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

# A self-signed test CA (EC P-256, valid until 2126) and its key: loadable PEM.
TEST_CA = """-----BEGIN CERTIFICATE-----
MIIBjzCCATWgAwIBAgIUF8gIDIkF8gRygNoVfMSpIa1fNJIwCgYIKoZIzj0EAwIw
HDEaMBgGA1UEAwwRZ3B1bGVkZ2VyLXRlc3QtY2EwIBcNMjYxMjA0MjIzNzQ0WhgP
MjEyNjExMTAyMjM3NDRaMBwxGjAYBgNVBAMMEWdwdWxlZGdlci10ZXN0LWNhMFkw
EwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAETWuLEb69qTb++yQunIiU8QQWSItM3Lgu
m/Y+hLcBmp5huuudWzuBUVHquy0MeP1+M0z64YhHwfEys7X3hbYPDKNTMFEwHQYD
VR0OBBYEFGy7mpi7NKa4xvRS2Oh968trPJvEMB8GA1UdIwQYMBaAFGy7mpi7NKa4
xvRS2Oh968trPJvEMA8GA1UdEwEB/wQFMAMBAf8wCgYIKoZIzj0EAwIDSAAwRQIh
AIMuHHazv6RZoDkc2y4C1mojaoqrs5KpHrlM37YMPJXPAiA/WnvUBd6o2RPWYMKn
6/L1RBjZBDGjsaMhhlGmzYAOPw==
-----END CERTIFICATE-----
"""


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
    (tmp_path / "token").write_text("tok-1\n")
    (tmp_path / "ca.crt").write_text(TEST_CA)
    conn = connection(parse_config({}), {"KUBERNETES_SERVICE_HOST": "10.96.0.1",
                                         "KUBERNETES_SERVICE_PORT": "443"}, tmp_path)
    assert conn.server == "https://10.96.0.1:443"
    assert conn.token_file == tmp_path / "token" and conn.ca_file == tmp_path / "ca.crt"
    assert conn.bearer() == "tok-1"
    (tmp_path / "token").write_text("tok-2\n")  # rotated tokens are re-read
    assert conn.bearer() == "tok-2"
    with pytest.raises(ConfigError, match=r"kubernetes\.server: not set"):
        connection(parse_config({}), {}, tmp_path)


def test_kubeconfig_token_user(tmp_path: Path) -> None:
    ca = TEST_CA
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


def _kubeconfig(tmp_path: Path, cluster: dict[str, object] | None = None,
                user: dict[str, object] | None = None, **top: object) -> Path:
    doc: dict[str, object] = {
        "current-context": "a",
        "clusters": [{"name": "c", "cluster": {"server": "https://api:6443",
                                               "certificate-authority-data": base64.b64encode(
                                                   TEST_CA.encode()).decode(),
                                               **(cluster or {})}}],
        "users": [{"name": "u", "user": {"token": "tok", **(user or {})}}],
        "contexts": [{"name": "a", "context": {"cluster": "c", "user": "u"}}]}
    doc.update(top)
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(doc))
    return path


def _connect(path: Path) -> object:
    return connection(parse_config({"kubernetes": {"kubeconfig": str(path)}}), {})


@pytest.mark.parametrize("value", ["false", "true", "no", 0, 1])
def test_kubeconfig_insecure_skip_tls_verify_takes_yaml_booleans_only(
        tmp_path: Path, value: object) -> None:
    path = _kubeconfig(tmp_path, {"insecure-skip-tls-verify": value})
    with pytest.raises(ConfigError, match=re.escape(
            f"kubernetes.kubeconfig {path}: clusters[c].cluster.insecure-skip-tls-verify: "
            f"expected true or false, got {value!r}")):
        _connect(path)
    assert _connect(_kubeconfig(tmp_path, {"insecure-skip-tls-verify": False})) \
        .insecure is False  # type: ignore[attr-defined]
    assert _connect(_kubeconfig(tmp_path, {"insecure-skip-tls-verify": True})) \
        .insecure is True  # type: ignore[attr-defined]


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"contexts": 5}, "contexts: expected a list, got int"),
    ({"clusters": "x"}, "clusters: expected a list, got str"),
    ({"cluster": {"server": "http://"}},
     "clusters[c].cluster.server: 'http://': no host in the URL"),
    ({"cluster": {"server": "http://127.0.0.1:99999"}},
     "clusters[c].cluster.server: 'http://127.0.0.1:99999': Port out of range"),
    ({"cluster": {"certificate-authority-data": "!!not base64"}},
     "clusters[c].cluster.certificate-authority-data: not base64 of a PEM certificate"),
    ({"cluster": {"certificate-authority-data": base64.b64encode(b"\xff\xfe").decode()}},
     "clusters[c].cluster.certificate-authority-data: not base64 of a PEM certificate"),
    ({"cluster": {"certificate-authority-data": base64.b64encode(b"garbage").decode()}},
     "clusters[c].cluster.certificate-authority-data: not a PEM CA certificate"),
    ({"user": {"client-certificate": "nope.crt"}},
     "users[u].user.client-certificate: "),
    ({"user": {"token": "abc\r\nX-Evil: 1"}}, "users[u].user.token: token: not a token"),
])
def test_kubeconfig_errors_name_the_file_and_key(tmp_path: Path, kwargs: dict[str, object],
                                                 message: str) -> None:
    path = _kubeconfig(tmp_path, kwargs.pop("cluster", None),  # type: ignore[arg-type]
                       kwargs.pop("user", None), **kwargs)  # type: ignore[arg-type]
    with pytest.raises(ConfigError) as err:
        _connect(path)
    text = str(err.value)
    assert text.startswith(f"kubernetes.kubeconfig {path}: ") and message in text, text
    assert "\n" not in text and "X-Evil" not in text


@pytest.mark.parametrize(("content", "message"), [
    (b"\xff\xfe\x00", "not a token (not UTF-8 text)"),
    (b"abc\r\nX-Evil: 1", "not a token (it holds spaces, control or non-ASCII"),
    (b"\n", "empty"),
    (None, "no such file"),
    ("dir", "is a directory"),
])
def test_token_file_is_checked_at_start_and_never_echoed(
        tmp_path: Path, content: bytes | str | None, message: str) -> None:
    token = tmp_path / "token"
    if content == "dir":
        token.mkdir()
    elif isinstance(content, bytes):
        token.write_bytes(content)
    config = parse_config({"kubernetes": {"server": "http://127.0.0.1:1",
                                          "token_file": str(token)}})
    with pytest.raises(ConfigError) as err:
        connection(config, {})
    assert str(err.value) == f"kubernetes.token_file: {token}: {message}" or \
        str(err.value).startswith(f"kubernetes.token_file: {token}: {message}")
    assert "Evil" not in str(err.value)


def test_ca_file_problems_name_the_key_and_file(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.crt"
    garbage.write_text("garbage\n")
    for ca, why in ((tmp_path / "nonexistent", "No such file"), (tmp_path, "not a readable"),
                    (garbage, "not a readable PEM CA certificate")):
        config = parse_config({"kubernetes": {"server": "https://api:6443",
                                              "ca_file": str(ca)}})
        with pytest.raises(ConfigError, match=re.escape(f"kubernetes.ca_file: {ca}: ")) as err:
            connection(config, {})
        assert why in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(("value", "message"), [
    (1.0e300, "at most 86,400 seconds"),
    ("1.0e+300", "at most 86,400 seconds"),
    ("abc", "expected a number of seconds > 0, got 'abc'"),
    ("nan", "expected a number of seconds > 0"),
])
def test_timeouts_are_bounded(value: object, message: str) -> None:
    for key in ("request_timeout_s", "read_timeout_s", "watch_timeout_s", "start_grace_s"):
        with pytest.raises(ConfigError, match=re.escape(f"config.kubernetes.{key}: {message}")):
            parse_config({"kubernetes": {key: value}})


def test_yaml_1_1_exponent_strings_are_numbers(tmp_path: Path) -> None:
    path = tmp_path / "k8s.yaml"
    path.write_text("kubernetes:\n  request_timeout_s: 1e3\n  read_timeout_s: 86400\n")
    config = load_config(path)
    assert config.request_timeout_s == 1000.0 and config.read_timeout_s == 86400.0


def test_server_errors_name_the_key() -> None:
    for server, why in (("http://", "no host in the URL"),
                        ("http://127.0.0.1:99999", "Port out of range")):
        with pytest.raises(ConfigError, match=re.escape(
                f"config.kubernetes.server: {server!r}: {why}")):
            parse_config({"kubernetes": {"server": server}})
