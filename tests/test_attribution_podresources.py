"""The pod-resources client against a real gRPC server on a unix socket."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from kubelet_podresources import FIXTURE, FakeKubelet

from gpuledger.agent.attribution.podresources import (
    DEFAULT_RESOURCES,
    DeviceHolder,
    PodResourcesClient,
    device_map,
)

ROOT = Path(__file__).parent.parent


def _expected(resources: tuple[str, ...]) -> dict[str, set[tuple[str, str, str]]]:
    """Device → (namespace, pod, container), read straight from the recorded answer."""
    import fnmatch

    out: dict[str, set[tuple[str, str, str]]] = {}
    for pod in json.loads(FIXTURE.read_text())["pod_resources"]:
        for c in pod["containers"]:
            for d in c.get("devices", []):
                if any(fnmatch.fnmatchcase(d["resource_name"], r) for r in resources):
                    for dev in d["device_ids"]:
                        out.setdefault(dev.split("::")[0], set()).add(
                            (pod["namespace"], pod["name"], c["name"]))
    return out


def test_list_over_the_socket_decodes_the_kubelets_answer(tmp_path: Path) -> None:
    kubelet = FakeKubelet(tmp_path / "kubelet.sock")
    client = PodResourcesClient(str(tmp_path / "kubelet.sock"), timeout_s=5)
    try:
        mapping = device_map(client.list())
    finally:
        client.close()
        kubelet.stop()
    got = {dev: {(h.namespace, h.pod, h.container) for h in holders}
           for dev, holders in mapping.items()}
    assert got == _expected(DEFAULT_RESOURCES)
    assert len(got["GPU-00000000-0000-4000-8000-000000000006"]) == 2   # time-sliced
    assert "0000:3b:00.1" not in got                                    # not a GPU resource
    mig = mapping["MIG-11111111-2222-5333-8444-555555555555"]
    assert mig == [DeviceHolder("notebooks", "nb-ana", "notebook", "nvidia.com/mig-1g.10gb")]
    assert kubelet.calls == 1


def test_resource_patterns_select_devices(tmp_path: Path) -> None:
    kubelet = FakeKubelet(tmp_path / "k.sock")
    client = PodResourcesClient(str(tmp_path / "k.sock"), timeout_s=5)
    try:
        only_whole = device_map(client.list(), ("nvidia.com/gpu",))
    finally:
        client.close()
        kubelet.stop()
    assert set(only_whole) == set(_expected(("nvidia.com/gpu",)))
    assert not any(k.startswith("MIG-") for k in only_whole)


def test_no_kubelet_raises_an_rpc_error(tmp_path: Path) -> None:
    client = PodResourcesClient(str(tmp_path / "absent.sock"), timeout_s=0.5)
    try:
        with pytest.raises(grpc.RpcError):
            client.list()
    finally:
        client.close()


def test_committed_module_matches_the_proto(tmp_path: Path) -> None:
    """The generated module is committed; regenerating it from the .proto must give the
    same descriptor (the protoc version line may differ) and the same type stubs."""
    import re

    subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_podresources.py"),
                    str(tmp_path)], check=True, capture_output=True)
    here = ROOT / "agents" / "gpuledger" / "agent" / "attribution"

    def descriptor(path: Path) -> str:
        found = re.search(r"AddSerializedFile\((b'.*?')\)", path.read_text())
        assert found is not None, path
        return found.group(1)

    name = "podresources_api_pb2"
    assert descriptor(tmp_path / f"{name}.py") == descriptor(here / f"{name}.py")
    assert (tmp_path / f"{name}.pyi").read_text() == (here / f"{name}.pyi").read_text()
