"""A real gRPC server speaking the kubelet's pod-resources v1 protocol on a unix socket.

It encodes its answers with the *full* upstream message shapes (the fields the agent's
minimal proto leaves out, such as ``ContainerResources.memory`` = 4 and
``dynamic_resources`` = 5, included), built here from descriptors, so a test shows
that the agent decodes what a kubelet really sends.
"""

from __future__ import annotations

import json
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory

from gpuledger.agent.attribution import podresources_api_pb2 as minimal

FIXTURE = Path(__file__).parent / "fixtures" / "podresources_list.json"


def _field(msg: Any, name: str, number: int, kind: int, label: int = 1,
           type_name: str = "") -> None:
    f = msg.field.add(name=name, number=number, type=kind, label=label)
    if type_name:
        f.type_name = type_name


def full_response_class() -> Any:
    """ListPodResourcesResponse with the upstream fields the agent does not declare."""
    fdp = descriptor_pb2.FileDescriptorProto()
    minimal.DESCRIPTOR.CopyToProto(fdp)
    fdp.name = "upstream_podresources.proto"
    t = descriptor_pb2.FieldDescriptorProto
    memory = fdp.message_type.add(name="ContainerMemory")
    _field(memory, "memory_type", 1, t.TYPE_STRING)
    _field(memory, "size", 2, t.TYPE_UINT64)
    _field(memory, "topology", 3, t.TYPE_MESSAGE, type_name=".v1.TopologyInfo")
    dyn = fdp.message_type.add(name="DynamicResource")
    _field(dyn, "class_name", 1, t.TYPE_STRING)
    _field(dyn, "claim_name", 2, t.TYPE_STRING)
    _field(dyn, "claim_namespace", 3, t.TYPE_STRING)
    container = next(m for m in fdp.message_type if m.name == "ContainerResources")
    _field(container, "memory", 4, t.TYPE_MESSAGE, 3, ".v1.ContainerMemory")
    _field(container, "dynamic_resources", 5, t.TYPE_MESSAGE, 3, ".v1.DynamicResource")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return message_factory.GetMessageClass(
        pool.FindMessageTypeByName("v1.ListPodResourcesResponse"))


def recorded_answer(path: Path = FIXTURE) -> bytes:
    raw = json.loads(path.read_text())
    raw.pop("_comment", None)
    msg = json_format.ParseDict(raw, full_response_class()())
    data: bytes = msg.SerializeToString()
    return data


class FakeKubelet:
    """Serves ``v1.PodResourcesLister/List`` on ``socket``; answers can be swapped."""

    def __init__(self, socket: Path, answer: bytes | None = None) -> None:
        self.socket = socket
        self.answer = recorded_answer() if answer is None else answer
        self.calls = 0
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        handler = grpc.method_handlers_generic_handler("v1.PodResourcesLister", {
            "List": grpc.unary_unary_rpc_method_handler(
                self._list, request_deserializer=lambda b: b,
                response_serializer=lambda b: b),
        })
        self.server.add_generic_rpc_handlers((handler,))
        self.server.add_insecure_port(f"unix://{socket}")
        self.server.start()

    def _list(self, request: bytes, context: Any) -> bytes:
        self.calls += 1
        return self.answer

    def stop(self) -> None:
        self.server.stop(grace=None)
