"""The list/watch client against the recorded API server (real HTTP, chunked streams)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from k8s_api_server import FakeApiServer

from gpuledger.bridges.kubernetes.api import ApiClient, ApiError, Connection, Gone

FIXTURES = Path(__file__).parent / "fixtures" / "kubernetes"


def test_list_follows_continue_tokens() -> None:
    listed = json.loads((FIXTURES / "pods-list.json").read_text())
    with FakeApiServer(FIXTURES) as server:
        client = ApiClient(Connection(server.url), page_size=1)
        items, version = client.list("/api/v1/pods")
        pages = sum(1 for res, kind, _ in server.requests if res == "pods" and kind == "list")
    assert [i["metadata"]["uid"] for i in items] == \
        [i["metadata"]["uid"] for i in listed["items"]]
    assert pages == len(listed["items"]) and version == listed["metadata"]["resourceVersion"]


def test_watch_streams_events_and_an_expired_version_is_gone() -> None:
    script = [json.loads(line) for line in
              (FIXTURES / "nodes-watch.jsonl").read_text().splitlines()]
    first = script[0]["object"]["metadata"]["resourceVersion"]
    with FakeApiServer(FIXTURES) as server:
        server.sent.update(r for r in server.order if r < 420)  # the other streams' turns
        client = ApiClient(Connection(server.url))
        _, version = client.list("/api/v1/nodes")
        # the node stream's first event, then an expiry: the stream ends, the next
        # watch from the same version is answered 410 as an HTTP status
        events = list(client.watch("/api/v1/nodes", version, 2, 1))
        assert [(k, o["metadata"]["resourceVersion"]) for k, o in events] == \
            [("MODIFIED", first)]
        with pytest.raises(Gone) as gone:
            list(client.watch("/api/v1/nodes", first, 2, 1))
        assert gone.value.status == 410
        with pytest.raises(ApiError) as missing:
            client.list("/api/v1/namespaces")
        assert missing.value.status == 404


def test_watch_error_event_with_code_410_raises_gone() -> None:
    folder_events = [json.loads(line) for line in
                     (FIXTURES / "workloads-watch.jsonl").read_text().splitlines()]
    before = folder_events[:folder_events.index({"expire": "event"})]
    with FakeApiServer(FIXTURES) as server:
        server.sent.update(r for r in server.order if r < 400)  # the other streams' turns
        client = ApiClient(Connection(server.url))
        _, version = client.list("/apis/kueue.x-k8s.io/v1beta1/workloads")
        seen = []
        with pytest.raises(Gone):
            for _kind, obj in client.watch("/apis/kueue.x-k8s.io/v1beta1/workloads", version,
                                           5, 2):
                seen.append(obj["metadata"]["resourceVersion"])
    assert seen == [e["object"]["metadata"]["resourceVersion"] for e in before]
