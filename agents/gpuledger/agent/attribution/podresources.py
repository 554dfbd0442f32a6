"""Client of the kubelet pod-resources API (``v1.PodResourcesLister/List``).

The kubelet serves it over gRPC on a unix socket (by default
``/var/lib/kubelet/pod-resources/kubelet.sock``); it names, for every container on the
node, the devices that device plugins gave it: ``nvidia.com/gpu`` with GPU UUIDs (or
indices, with the device plugin's ``index`` strategy) and the MIG resources
(``nvidia.com/mig-3g.40gb``) with MIG device UUIDs. Time-sliced replicas appear as
``<uuid>::<n>``; the replica suffix is dropped. grpcio is imported only here, so an
agent that does not use Kubernetes never loads it.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from typing import Any

from gpuledger.agent.attribution import podresources_api_pb2 as api

LIST_METHOD = "/v1.PodResourcesLister/List"
DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
DEFAULT_RESOURCES = ("nvidia.com/gpu", "nvidia.com/mig-*")


@dataclass(frozen=True)
class DeviceHolder:
    """A container that holds a device."""

    namespace: str
    pod: str
    container: str
    resource: str


def device_map(response: Any, resources: tuple[str, ...] = DEFAULT_RESOURCES
               ) -> dict[str, list[DeviceHolder]]:
    """Device id (UUID or index) → holders, for the resources matching ``resources``."""
    out: dict[str, list[DeviceHolder]] = {}
    for pod in response.pod_resources:
        for container in pod.containers:
            for devices in container.devices:
                name = devices.resource_name
                if not any(fnmatch.fnmatchcase(name, pattern) for pattern in resources):
                    continue
                holder = DeviceHolder(pod.namespace, pod.name, container.name, name)
                for device_id in devices.device_ids:
                    key = device_id.split("::", 1)[0]
                    holders = out.setdefault(key, [])
                    if holder not in holders:
                        holders.append(holder)
    return out


class PodResourcesClient:
    """Lists pod resources over the kubelet's unix socket."""

    def __init__(self, socket: str = DEFAULT_SOCKET, timeout_s: float = 2.0) -> None:
        import grpc

        self.socket = socket
        self.timeout_s = timeout_s
        self._channel = grpc.insecure_channel(
            f"unix://{socket}", options=[("grpc.max_receive_message_length", 16 << 20)])
        self._list = self._channel.unary_unary(
            LIST_METHOD,
            request_serializer=api.ListPodResourcesRequest.SerializeToString,
            response_deserializer=api.ListPodResourcesResponse.FromString,
        )

    def list(self) -> api.ListPodResourcesResponse:
        """One ``List`` call; raises ``grpc.RpcError`` when the kubelet does not answer."""
        response: api.ListPodResourcesResponse = self._list(
            api.ListPodResourcesRequest(), timeout=self.timeout_s)
        return response

    def close(self) -> None:
        self._channel.close()
