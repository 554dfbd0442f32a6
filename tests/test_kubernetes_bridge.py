"""The Kubernetes/Kueue bridge against a recorded API server over real HTTP.

The recording (tests/fixtures/kubernetes) has a watch that is cut mid-way (the bridge
must resume), a Workload watch that ends with an ERROR 410 and a Node watch answered
with HTTP 410 (the bridge must list again and emit what it missed, once). Expected
events and facts are derived here from the recorded objects themselves.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections import Counter
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from events import held_per_minute
from k8s_api_server import HOSTILE_NODE, FakeApiServer, HostileApiServer

from gpuledger.bridges.kubernetes import bridge as bridge_module
from gpuledger.bridges.kubernetes.api import ApiClient, MalformedResponse
from gpuledger.bridges.kubernetes.bridge import Bridge, WatcherDied
from gpuledger.bridges.kubernetes.config import BridgeConfig, connection, parse_config
from gpuledger.bridges.output import FileSink
from gpuledger.pipeline import query
from gpuledger.pipeline.config import ProcessorConfig
from gpuledger.pipeline.ingest import ingest

FIXTURES = Path(__file__).parent / "fixtures" / "kubernetes"
OBSERVED = datetime(2026, 1, 5, 9, 58, tzinfo=UTC)  # the bridge's (frozen) clock
JOB_TYPES = ("training", "evaluation", "interactive", "inference", "fine-tune")
KUEUE_LABELS = ("kueue.x-k8s.io/queue-name", "kueue.x-k8s.io/podset")


def _config(url: str, state: Path) -> BridgeConfig:
    config = parse_config({
        "kubernetes": {"server": url, "watch_timeout_s": 2, "read_timeout_s": 1},
        "mapping": {"pools": {"node_label": "gpuledger.io/pool"},
                    "job_types": {"rules": [{"type": t, "labels": {"gpuledger.io/job-type": t}}
                                            for t in JOB_TYPES]}}})
    return replace(config, state_file=state)


def _run(server: FakeApiServer, out: Path, state: Path,
         until: Any = None, timeout_s: float = 60.0) -> Bridge:
    """Run a bridge until ``until(bridge)`` (default: it has seen the whole recording)."""
    config = _config(server.url, state)
    bridge = Bridge(config, ApiClient(connection(config)), FileSink(out),
                    clock=lambda: OBSERVED)
    final = server.final_versions()
    done = until or (lambda b: b.versions == final)
    thread = threading.Thread(target=bridge.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not done(bridge):
        time.sleep(0.05)
    bridge.stop()
    thread.join(timeout=10)
    assert not thread.is_alive()
    bridge.sink.close()
    assert done(bridge), f"bridge stopped at {bridge.versions}, recording ends at {final}"
    return bridge


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict[str, Any]], Any]:
    folder = tmp_path_factory.mktemp("k8s")
    with FakeApiServer(FIXTURES) as server:
        _run(server, folder / "out.jsonl", folder / "state.json")
        requests = list(server.requests)
    return _records(folder / "out.jsonl"), requests


# -- what the recording says, read straight from the recorded objects -----------------


def _objects(resource: str) -> list[dict[str, Any]]:
    """Every recorded state of every object of a resource, in version order."""
    listing: list[dict[str, Any]] = json.loads(
        (FIXTURES / f"{resource}-list.json").read_text())["items"]
    events: list[dict[str, Any]] = [
        json.loads(line) for line in
        (FIXTURES / f"{resource}-watch.jsonl").read_text().splitlines()]
    return listing + [e["object"] for e in events if e.get("type") in ("ADDED", "MODIFIED",
                                                                         "DELETED")]


def _t(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _conds(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in obj.get("status", {}).get("conditions", [])}


def _expected_workloads() -> dict[str, dict[str, Any]]:
    """Per workload: creation, admissions, preemptions, requeues, finish."""
    out: dict[str, dict[str, Any]] = {}
    for wl in _objects("workloads"):
        m = wl["metadata"]
        job = out.setdefault(f"kueue/{m['namespace']}/{m['name']}", {
            "created": _t(m["creationTimestamp"]), "admitted": set(), "preempted": set(),
            "requeued": set(), "finished": None,
            "gpus": sum(ps["count"] * int(ps["template"]["spec"]["containers"][0]
                                          ["resources"]["limits"]["nvidia.com/gpu"])
                        for ps in wl["spec"]["podSets"])})
        c = _conds(wl)
        for kind, key in (("Admitted", "admitted"), ("Requeued", "requeued")):
            if c.get(kind, {}).get("status") == "True":
                job[key].add(_t(c[kind]["lastTransitionTime"]))
        ev = c.get("Evicted", {})
        if ev.get("status") == "True" and ev.get("reason") == "Preempted":
            job["preempted"].add(_t(ev["lastTransitionTime"]))
        if c.get("Finished", {}).get("status") == "True":
            job["finished"] = (_t(c["Finished"]["lastTransitionTime"]), c["Finished"]["reason"])
    return out


def _expected_pods() -> dict[str, dict[str, Any]]:
    """Standalone GPU pods: creation, scheduling, preemption, end."""
    out: dict[str, dict[str, Any]] = {}
    for pod in _objects("pods"):
        m = pod["metadata"]
        limits = pod["spec"]["containers"][0]["resources"].get("limits", {})
        gpus = sum(int(v) for k, v in limits.items() if k.startswith("nvidia.com/"))
        if not gpus or any(k in m.get("labels", {}) for k in KUEUE_LABELS):
            continue
        job = out.setdefault(f"{m['namespace']}/{m['name']}", {
            "created": _t(m["creationTimestamp"]), "scheduled": None, "preempted": None,
            "end": None, "gpus": gpus, "mig": sum(1 for k in limits if "mig-" in k)})
        c = _conds(pod)
        if c.get("PodScheduled", {}).get("status") == "True":
            job["scheduled"] = _t(c["PodScheduled"]["lastTransitionTime"])
        if c.get("DisruptionTarget", {}).get("reason") == "PreemptionByScheduler":
            job["preempted"] = _t(c["DisruptionTarget"]["lastTransitionTime"])
        phase = pod["status"]["phase"]
        if phase in ("Succeeded", "Failed") and job["end"] is None:
            finished = pod["status"]["containerStatuses"][0]["state"]["terminated"]
            job["end"] = (_t(finished["finishedAt"]), phase)
        elif m.get("deletionTimestamp") and job["end"] is None:
            job["end"] = (_t(m["deletionTimestamp"]), "Deleted")
    return out


def _events(records: list[dict[str, Any]]) -> dict[str, list[tuple[str, datetime]]]:
    out: dict[str, list[tuple[str, datetime]]] = {}
    for r in records:
        if r["type"] == "job":
            out.setdefault(r["job_id"], []).append((r["event"], _t(r["time"])))
    return {k: sorted(v, key=lambda e: e[1]) for k, v in out.items()}


# -- the tests ----------------------------------------------------------------------------


def test_workload_events_follow_the_kueue_conditions(recorded: Any) -> None:
    events = _events(recorded[0])
    expected = _expected_workloads()
    assert len(expected) == 4
    for job_id, wl in expected.items():
        want: set[tuple[str, datetime]] = {("submitted", wl["created"])}
        want |= {("started", t) for t in wl["admitted"]}
        want |= {("preempted", t) for t in wl["preempted"]}
        want |= {("requeued", t) for t in wl["requeued"]}
        if wl["finished"]:
            t, reason = wl["finished"]
            want.add(({"Succeeded": "finished", "Failed": "failed"}[reason], t))
        assert set(events[job_id]) == want, job_id
    # a workload preempted and re-admitted: two attempts
    assert any(len(wl["admitted"]) == 2 and wl["preempted"] for wl in expected.values())


def test_standalone_pods_become_jobs(recorded: Any) -> None:
    events = _events(recorded[0])
    expected = _expected_pods()
    assert len(expected) == 3
    for job_id, pod in expected.items():
        want = {("submitted", pod["created"]), ("started", pod["scheduled"])}
        end_time, how = pod["end"]
        if pod["preempted"]:
            want |= {("preempted", pod["preempted"]), ("cancelled", end_time)}
        else:
            want.add(({"Succeeded": "finished", "Failed": "failed",
                       "Deleted": "cancelled"}[how], end_time))
        assert set(events[job_id]) == want, job_id
    assert not any(j.startswith("kube-system/") for j in events)  # CPU pods are no jobs


def test_nothing_is_emitted_twice_and_the_streams_were_resumed_and_relisted(
        recorded: Any) -> None:
    records, requests = recorded
    keys = Counter((r["job_id"], r["event"], r["time"]) for r in records if r["type"] == "job")
    assert keys and max(keys.values()) == 1
    # the cut pod stream was resumed from the last version it delivered
    watches = [(res, rv) for res, kind, rv in requests if kind == "watch"]
    assert ("pods", "305") in watches and ("pods", "349") in watches
    # 410 by ERROR event (workloads) and by HTTP status (nodes): both listed again
    lists = Counter(res for res, kind, _ in requests if kind == "list")
    assert lists["workloads"] == 2 and lists["nodes"] == 2 and lists["pods"] == 1


def test_allocations_hold_the_requested_gpus_on_distinct_indices(recorded: Any) -> None:
    records = recorded[0]
    wls, pods = _expected_workloads(), _expected_pods()
    held: dict[tuple[str, int], float] = {}
    holding: dict[str, list[dict[str, Any]]] = {}
    for r in sorted((r for r in records if r["type"] == "job"), key=lambda r: r["time"]):
        if r["event"] == "started":
            if r["job_id"] in wls:
                assert len(r["allocation"]) == wls[r["job_id"]]["gpus"]
                assert all(a["fraction"] == 1.0 for a in r["allocation"])
            else:
                assert len(r["allocation"]) == pods[r["job_id"]]["gpus"]
            for a in r["allocation"]:
                slot = (a["node"], a["gpu_index"])
                held[slot] = held.get(slot, 0.0) + a["fraction"]
                assert held[slot] <= 1.0 + 1e-9, f"{slot} over-allocated"
            holding[r["job_id"]] = r["allocation"]
        elif r["event"] in ("preempted", "requeued", "finished", "failed", "cancelled"):
            for a in holding.pop(r["job_id"], []):
                held[(a["node"], a["gpu_index"])] -= a["fraction"]
    # MIG slices: 3g + 2 × 1g on one A100 = 5/7 of it
    mig = next(r for r in records if r["type"] == "job" and r["event"] == "started"
               and r["job_id"].endswith("llm-gateway-7f9c"))
    assert {a["gpu_index"] for a in mig["allocation"]} == {0}
    assert sum(a["fraction"] for a in mig["allocation"]) == pytest.approx(5 / 7)


def test_inventory_from_node_labels_and_state(recorded: Any) -> None:
    inventory = [r for r in recorded[0] if r["type"] == "inventory"]
    nodes = json.loads((FIXTURES / "nodes-list.json").read_text())["items"]
    gpu_nodes = {n["metadata"]["name"]: n for n in nodes
                 if "nvidia.com/gpu.count" in n["metadata"]["labels"]}
    first: dict[str, dict[str, Any]] = {}
    for r in inventory:
        first.setdefault(r["node"], r)
    assert set(first) == set(gpu_nodes)  # the CPU node is not inventory
    for name, node in gpu_nodes.items():
        labels = node["metadata"]["labels"]
        assert first[name]["gpu_count"] == int(labels["nvidia.com/gpu.count"])
        assert first[name]["gpu_mem_mib"] == float(labels["nvidia.com/gpu.memory"])
        assert first[name]["pool"] == labels["gpuledger.io/pool"]
        assert first[name]["schedulable"] and first[name]["health"] == "ok"
    last = {r["node"]: r for r in inventory}
    # allocatable GPUs below capacity (the device plugin's unhealthy GPU) → degraded;
    # cordoned during the compacted gap → seen by the relist
    assert last["gpu-a-2"]["health"] == "degraded"
    assert last["gpu-a-3"]["schedulable"] is False
    assert len(inventory) == len(gpu_nodes) + 2  # only changes are emitted


def test_restart_neither_loses_nor_repeats(tmp_path: Path, recorded: Any) -> None:
    out, state = tmp_path / "out.jsonl", tmp_path / "state.json"
    with FakeApiServer(FIXTURES) as server:
        # stop after the first cut of the pod stream, then start a new bridge process
        first = _run(server, out, state, until=lambda b: int(b.versions.get("pods", 0)) >= 305)
        stopped_at = dict(first.versions)
        second = _run(server, out, state)
        assert second.stats.lists.get("pods") is None  # resumed, not listed again
    assert int(stopped_at["pods"]) < int(server.final_versions()["pods"])
    restarted = Counter(json.dumps(r, sort_keys=True) for r in _records(out))
    single = Counter(json.dumps(r, sort_keys=True) for r in recorded[0])
    assert restarted == single


def test_facts_from_the_bridge_events(recorded: Any, tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    events.write_text("".join(json.dumps(r) + "\n" for r in recorded[0]))
    result = ingest([events], tmp_path / "wh", ProcessorConfig())
    assert result.rejects.height == 0  # every record is valid contract v1
    assert result.records["job"] == sum(r["type"] == "job" for r in recorded[0])
    _, rows = query.run(tmp_path / "wh", "SELECT job_id, attempt, queue_wait_s, "
                        "started_at, end_event FROM attempts WHERE started_at IS NOT NULL")
    got = {(r[0], r[1]): r[2] for r in rows}
    # queue wait = admission − creation (Kueue), or − the requeue for a second attempt
    expected: dict[tuple[str, int], float] = {}
    for job_id, wl in _expected_workloads().items():
        queued = [wl["created"], *sorted(wl["requeued"])]
        for n, admitted in enumerate(sorted(wl["admitted"])):  # attempts count from 0
            expected[(job_id, n)] = (admitted - queued[n]).total_seconds()
    for job_id, pod in _expected_pods().items():
        expected[(job_id, 0)] = (pod["scheduled"] - pod["created"]).total_seconds()
    assert got == expected
    # preemption: the preempted workload, with the GPUs it held
    _, rows = query.run(tmp_path / "wh", "SELECT job_id, time, allocated_gpus FROM "
                        "preemptions ORDER BY time")
    preempted = {(j, t.astimezone(UTC)): g for j, t, g in rows}
    wls, pods = _expected_workloads(), _expected_pods()
    want = {(j, t): wl["gpus"] for j, wl in wls.items() for t in wl["preempted"]}
    want |= {(j, p["preempted"]): p["gpus"] for j, p in pods.items() if p["preempted"]}
    assert preempted == want


def test_allocated_gpus_over_time(recorded: Any, tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    events.write_text("".join(json.dumps(r) + "\n" for r in recorded[0]))
    ingest([events], tmp_path / "wh", ProcessorConfig())
    _, rows = query.run(tmp_path / "wh", "SELECT minute, sum(alloc_fraction) FROM gpu_minute "
                        "WHERE allocated GROUP BY minute ORDER BY minute")
    got = {m.astimezone(UTC): g for m, g in rows}
    # intervals straight from the recording: workloads from admission to the eviction
    # or finish; pods from scheduling to preemption or end; MIG slices are g/7 of a GPU
    intervals: list[tuple[datetime, datetime, float]] = []
    for wl in _expected_workloads().values():
        starts = sorted(wl["admitted"])
        ends = sorted(wl["preempted"]) + ([wl["finished"][0]] if wl["finished"] else [])
        intervals += [(s, e, float(wl["gpus"])) for s, e in zip(starts, ends, strict=False)]
    for job_id, pod in _expected_pods().items():
        end = pod["preempted"] or pod["end"][0]
        share = 5 / 7 if job_id.endswith("llm-gateway-7f9c") else float(pod["gpus"])
        intervals.append((pod["scheduled"], end, share))
    expected = held_per_minute(intervals)  # exact to the second (docs/metrics.md)
    assert set(got) == set(expected)
    for m, g in expected.items():
        assert got[m] == pytest.approx(g), m
    assert max(expected.values()) >= 12


def test_cluster_without_kueue(tmp_path: Path) -> None:
    """The Workload API answers 404: pods and nodes still flow, every GPU pod is a job."""
    folder = tmp_path / "fixtures"
    folder.mkdir()
    for name in ("nodes-list.json", "nodes-watch.jsonl", "pods-list.json", "pods-watch.jsonl"):
        (folder / name).write_bytes((FIXTURES / name).read_bytes())
    with FakeApiServer(folder) as server:
        bridge = _run(server, tmp_path / "out.jsonl", tmp_path / "state.json")
        assert ("workloads", "list", "") in server.requests
    assert "workloads" not in bridge.resources
    events = _events(_records(tmp_path / "out.jsonl"))
    gpu_pods = set()
    for pod in _objects("pods"):
        limits = pod["spec"]["containers"][0]["resources"].get("limits", {})
        if any(k.startswith("nvidia.com/") for k in limits):
            gpu_pods.add(f"{pod['metadata']['namespace']}/{pod['metadata']['name']}")
    assert set(events) == gpu_pods


def test_a_batch_torn_by_a_crash_is_completed_once(tmp_path: Path) -> None:
    """State saved with its outbox, then the crash tore the hand-over: the next start
    completes the batch exactly once."""
    out, state = tmp_path / "out.jsonl", tmp_path / "state.json"
    with FakeApiServer(FIXTURES) as server:
        config = _config(server.url, state)
        Bridge(config, ApiClient(connection(config)), FileSink(out),
               clock=lambda: OBSERVED).sync()
        whole = out.read_bytes()
        lines = whole.splitlines(keepends=True)
        batch = [json.loads(line) for line in lines[-3:]]
        position = len(whole) - sum(len(line) for line in lines[-3:])
        saved = json.loads(state.read_text())
        saved["outbox"] = {"position": position, "records": batch}
        state.write_text(json.dumps(saved))
        out.write_bytes(whole[:position + len(lines[-3]) // 2])  # torn mid-record
        again = Bridge(config, ApiClient(connection(config)), FileSink(out),
                       clock=lambda: OBSERVED)
        assert out.read_bytes() == whole
        assert json.loads(state.read_text())["outbox"] is None
        assert again.sync() == 0 and out.read_bytes() == whole


# -- a hostile API server ------------------------------------------------------------------

NODES = "/api/v1/nodes"


def _hostile_config(url: str, state: Path, **kube: Any) -> BridgeConfig:
    config = parse_config({"kubernetes": {"server": url, "kueue": False,
                                          "watch_timeout_s": 2, "read_timeout_s": 1,
                                          "request_timeout_s": 2, **kube}})
    return replace(config, state_file=state)


def _cordoned(version: str) -> dict[str, Any]:
    node: dict[str, Any] = json.loads(json.dumps(HOSTILE_NODE))
    node["metadata"]["resourceVersion"] = version
    node["spec"] = {"unschedulable": True}
    return node


class _Running:
    """A bridge's ``run`` in a thread; ``error`` is what it raised."""

    def __init__(self, bridge: Bridge) -> None:
        self.bridge = bridge
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.bridge.run()
        except BaseException as exc:
            self.error = exc

    def wait(self, until: Any, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not until():
            time.sleep(0.05)
        return bool(until())


def _inventory(out: Path) -> list[dict[str, Any]]:
    if not out.exists():
        return []
    return [r for r in _records(out) if r["type"] == "inventory"]


def _cordoned_through(answer: Any, tmp_path: Path) -> Bridge:
    """Run a bridge against ``HostileApiServer(answer)`` until the node's cordon (its
    second inventory record) comes out, then stop it."""
    out = tmp_path / "out.jsonl"
    with HostileApiServer(answer) as server:
        config = _hostile_config(server.url, tmp_path / "state")
        bridge = Bridge(config, ApiClient(connection(config)), FileSink(out))
        running = _Running(bridge)
        cordoned = running.wait(lambda: len(_inventory(out)) >= 2, 10)
        bridge.stop()
        running.thread.join(5)
    assert running.error is None and not running.thread.is_alive()
    assert cordoned, _inventory(out)
    assert [r["schedulable"] for r in _inventory(out)] == [True, False]
    return bridge


def test_malformed_watch_events_are_counted_and_the_watch_goes_on(tmp_path: Path) -> None:
    """A ``null`` line, an event whose object is a list and one nested too deeply for
    Python's JSON reader: each is one warning and a count, the watch resumes from the last
    good version and the next real change of the node comes out."""
    def answer(server: HostileApiServer, h: Any, path: str, watch: bool, n: int) -> bool:
        if path != NODES or not watch or n > 3:
            return False
        line = [b"null\n", b'{"type":"MODIFIED","object":[1]}\n',
                b'{"type":"MODIFIED","object":' + b"[" * 100_000 + b"\n",
                json.dumps({"type": "MODIFIED", "object": _cordoned("6")}).encode()
                + b"\n"][n]
        server.stream(h, [line])
        return True

    bridge = _cordoned_through(answer, tmp_path)
    assert bridge.stats.malformed == {"nodes": 3}
    assert bridge.versions["nodes"] == "6"


def test_an_api_server_away_is_said_at_its_start_each_minute_and_at_its_end(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """Five failed watches of nodes in a row (503), 25 s apart on the outage clock: one
    warning when they start, one a minute later, one when the watch is open again
    (before, a warning at every retry: two a minute per resource at the 30 s backoff).
    The retries still happen, and the change after the outage comes out."""
    monkeypatch.setattr(bridge_module, "RETRY_FIRST_S", 0.01)
    failures = 5

    def answer(server: HostileApiServer, h: Any, path: str, watch: bool, n: int) -> bool:
        if path != NODES or not watch or n > failures:
            return False
        if n < failures:
            server.json(h, {"kind": "Status", "message": "etcd unavailable"}, 503)
        else:
            server.stream(h, [json.dumps({"type": "MODIFIED",
                                          "object": _cordoned("6")}).encode() + b"\n"])
        return True

    ticks = iter(range(25, 10_000, 25))
    out = tmp_path / "out.jsonl"
    caplog.set_level("DEBUG", logger="gpuledger.bridges.kubernetes")
    with HostileApiServer(answer) as server:
        config = _hostile_config(server.url, tmp_path / "state")
        bridge = Bridge(config, ApiClient(connection(config)), FileSink(out))
        bridge.outage_clock = lambda: float(next(ticks))
        running = _Running(bridge)
        cordoned = running.wait(lambda: len(_inventory(out)) >= 2, 10)
        bridge.stop()
        running.thread.join(5)
        tries = server.count(NODES, True)
    assert running.error is None and cordoned
    assert tries >= failures + 1
    said = [r.getMessage() for r in caplog.records
            if r.levelname == "WARNING" and r.getMessage().startswith("nodes")]
    assert len(said) == 3, said
    assert said[0].startswith("nodes: watch failed (ApiError: ") and "etcd unavailable" in said[0]
    assert "resuming from resourceVersion 5" in said[0]
    assert said[1].startswith("nodes: watch still failing after 75 s (4 tries;")
    assert said[2] == ("nodes: watch works again after 2.1 min (5 tries failed); watching "
                       "from resourceVersion 5")
    quiet = [r for r in caplog.records if r.levelname == "DEBUG"
             and r.getMessage().startswith("nodes: watch still failing")]
    assert len(quiet) == 3


def test_a_relist_cut_short_is_retried(tmp_path: Path) -> None:
    """After a 410 the watch thread lists again; a list answer cut short (an
    IncompleteRead) is counted as malformed and the list is retried."""
    def answer(server: HostileApiServer, h: Any, path: str, watch: bool, n: int) -> bool:
        if path != NODES:
            return False
        if watch and n == 0:
            h.send_response(410)
            h.send_header("Content-Length", "0")
            h.end_headers()
            return True
        if not watch and n == 1:
            h.send_response(200)
            h.send_header("Content-Length", "500")
            h.end_headers()
            h.wfile.write(b'{"items": [')
            h.close_connection = True
            return True
        if not watch and n == 2:
            server.json(h, {"metadata": {"resourceVersion": "7"}, "items": [_cordoned("7")]})
            return True
        return False

    bridge = _cordoned_through(answer, tmp_path)
    assert bridge.stats.malformed == {"nodes": 1}


@pytest.mark.parametrize(("body", "message"), [
    (b"null", "not a JSON object: null"),
    (b"[1]", "not a JSON object: [1]"),
    (b'{"items": [1]}', "items are not a list of objects"),
    (b'{"items": [], "metadata": [2]}', "metadata is not an object"),
    (b'{"items": [{"metadata": 3}]}', "an item's metadata is not an object"),
    (b"{\"items\": [", "not JSON"),
    (b"[" * 100_000, "not JSON (nested too deeply)"),  # Python's reader: a RecursionError
])
def test_a_malformed_list_is_a_clear_error(body: bytes, message: str) -> None:
    def answer(server: HostileApiServer, h: Any, path: str, watch: bool, n: int) -> bool:
        server.body(h, body)
        return True

    with HostileApiServer(answer) as server:
        client = ApiClient(connection(_hostile_config(server.url, Path("s"))))
        with pytest.raises(MalformedResponse, match=re.escape(message)):
            client.list(NODES)


def test_a_watcher_that_fails_unexpectedly_ends_the_bridge(tmp_path: Path) -> None:
    """No silent death: an unexpected error in a watch thread ends ``run`` with a
    clear error (the command exits 2) instead of running blind."""
    class Exploding(ApiClient):
        def watch(self, path: str, *args: Any, **kwargs: Any) -> Any:
            if path == NODES:
                raise RuntimeError("boom")
            return super().watch(path, *args, **kwargs)

    out = tmp_path / "out.jsonl"
    with HostileApiServer() as server:
        config = _hostile_config(server.url, tmp_path / "state")
        bridge = Bridge(config, Exploding(connection(config)), FileSink(out))
        running = _Running(bridge)
        running.thread.join(5)
        alive = running.thread.is_alive()
        bridge.stop()
        running.thread.join(5)
    assert not alive
    assert isinstance(running.error, WatcherDied)
    assert "nodes: the watch stopped on an unexpected error (RuntimeError: boom)" in str(
        running.error)
    assert len(_inventory(out)) == 1  # what was listed was handed over first


def _list_in_thread(client: ApiClient) -> tuple[threading.Thread, dict[str, Any]]:
    result: dict[str, Any] = {}

    def target() -> None:
        try:
            result["value"] = client.list(NODES)
        except Exception as exc:
            result["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, result


def test_a_repeated_continue_token_fails_the_list() -> None:
    def answer(server: HostileApiServer, h: Any, path: str, watch: bool, n: int) -> bool:
        server.json(h, {"metadata": {"resourceVersion": "5", "continue": "again"},
                        "items": [HOSTILE_NODE]})
        return True

    with HostileApiServer(answer) as server:
        client = ApiClient(connection(_hostile_config(server.url, Path("s"))))
        thread, result = _list_in_thread(client)
        thread.join(5)
        requests = server.count(NODES, False)
        client.stop = threading.Event()
        client.stop.set()  # end it, should it still run
    assert not thread.is_alive() and requests == 2, requests
    assert isinstance(result.get("error"), MalformedResponse)
    assert "continue token 'again' again" in str(result["error"])


def test_a_trickled_list_hits_the_overall_deadline() -> None:
    """``request_timeout_s`` bounds the whole answer, not each read: a list served one
    byte every 0.1 s fails after about 1 s."""
    def answer(server: HostileApiServer, h: Any, path: str, watch: bool, n: int) -> bool:
        server.trickle(h, json.dumps({"items": [HOSTILE_NODE]}).encode(), 0.1)
        return True

    with HostileApiServer(answer) as server:
        client = ApiClient(connection(_hostile_config(server.url, Path("s"))),
                           request_timeout_s=1)
        started = time.monotonic()
        thread, result = _list_in_thread(client)
        thread.join(5)
        elapsed = time.monotonic() - started
    assert not thread.is_alive() and elapsed < 5, elapsed  # 25 s without the deadline
    assert isinstance(result.get("error"), TimeoutError)
    assert str(result["error"]) == f"{NODES}: no complete answer within 1 s"


@pytest.mark.parametrize("where", ["list", "watch"])
def test_stop_ends_a_slow_list_or_a_quiet_watch_at_once(tmp_path: Path, where: str) -> None:
    """Stopping (SIGTERM) while the start's list trickles in, or while a watch is quiet,
    ends ``run`` within about a second, without an error."""
    def answer(server: HostileApiServer, h: Any, path: str, watch: bool, n: int) -> bool:
        if where == "list" and path == NODES and not watch:
            server.trickle(h, json.dumps({"items": [HOSTILE_NODE]}).encode(), 0.2)
            return True
        if where == "watch" and watch:
            server.stream(h, [], hold_s=30)
            return True
        return False

    out = tmp_path / "out.jsonl"
    with HostileApiServer(answer) as server:
        config = _hostile_config(server.url, tmp_path / "state", request_timeout_s=30,
                                 read_timeout_s=20, watch_timeout_s=30)
        bridge = Bridge(config, ApiClient(connection(config), request_timeout_s=30),
                        FileSink(out))
        running = _Running(bridge)
        kind = where == "watch"
        assert running.wait(lambda: server.count(NODES, kind) >= 1, 5)
        time.sleep(0.3)
        stopped = time.monotonic()
        bridge.stop()
        running.thread.join(10)
        elapsed = time.monotonic() - stopped
    assert not running.thread.is_alive() and elapsed < 5, elapsed  # 30 s or more before
    assert running.error is None
    assert len(_inventory(out)) == (1 if where == "watch" else 0)
