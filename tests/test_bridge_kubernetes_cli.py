"""``gpuledger bridge kubernetes`` against the recorded API server (real HTTP)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from k8s_api_server import HOSTILE_NODE, FakeApiServer, HostileApiServer

from gpuledger.cli.main import main

FIXTURES = Path(__file__).parent / "fixtures" / "kubernetes"


def _config(tmp_path: Path, server: str, token_file: Path | None = None) -> Path:
    kube: dict[str, object] = {"server": server}
    if token_file is not None:
        kube["token_file"] = str(token_file)
    path = tmp_path / "k8s.yaml"
    path.write_text(yaml.safe_dump({"kubernetes": kube,
                                    "mapping": {"pools": {"node_label": "gpuledger.io/pool"}}}))
    return path


def test_once_lists_everything_and_a_second_run_adds_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    token = tmp_path / "token"
    token.write_text("abc\n")
    out, state = tmp_path / "events.jsonl", tmp_path / "k8s.state"
    with FakeApiServer(FIXTURES, token="abc") as server:
        args = ["bridge", "kubernetes", "--config", str(_config(tmp_path, server.url, token)),
                "--out", str(out), "--state", str(state), "--once", "--quiet"]
        assert main(args) == 0
        first = out.read_text()
        assert main(args) == 0
        assert [r for r, kind, _ in server.requests if kind == "watch"] == []
    assert out.read_text() == first  # the second run found nothing new
    records = [json.loads(line) for line in first.splitlines()]
    listed = {n["metadata"]["name"] for n in
              json.loads((FIXTURES / "nodes-list.json").read_text())["items"]
              if "nvidia.com/gpu.count" in n["metadata"]["labels"]}
    assert {r["node"] for r in records if r["type"] == "inventory"} == listed
    workloads = json.loads((FIXTURES / "workloads-list.json").read_text())["items"]
    submitted = {r["job_id"] for r in records if r["type"] == "job"
                 and r["event"] == "submitted"}
    assert {f"kueue/{w['metadata']['namespace']}/{w['metadata']['name']}"
            for w in workloads} <= submitted
    assert "kubernetes bridge:" in capsys.readouterr().err


def test_wrong_token_and_bad_config_are_clear_errors(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    token = tmp_path / "token"
    token.write_text("wrong\n")
    with FakeApiServer(FIXTURES, token="abc") as server:
        code = main(["bridge", "kubernetes", "--config", str(_config(tmp_path, server.url, token)),
                     "--out", str(tmp_path / "o.jsonl"), "--state", str(tmp_path / "s"),
                     "--once", "--quiet"])
    assert code == 2
    assert "HTTP 401" in capsys.readouterr().err
    bad = tmp_path / "bad.yaml"
    bad.write_text("kubernetes:\n  server: https://x\n  watch_timeout: 3\n")
    code = main(["bridge", "kubernetes", "--config", str(bad), "--out", str(tmp_path / "o"),
                 "--once"])
    assert code == 2
    assert "kubernetes.watch_timeout: unknown key" in capsys.readouterr().err


@pytest.mark.parametrize(("token", "message"), [
    (b"\xff\xfe\x00", "not a token (not UTF-8 text)"),
    (b"abc\r\nX-Evil: 1", "not a token"),
    (None, "no such file"),
])
def test_a_bad_token_file_fails_at_start_and_creates_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], token: bytes | None,
        message: str) -> None:
    token_file = tmp_path / "token"
    if token is not None:
        token_file.write_bytes(token)
    out, state = tmp_path / "new" / "o.jsonl", tmp_path / "s"
    code = main(["bridge", "kubernetes", "--config",
                 str(_config(tmp_path, "http://127.0.0.1:1", token_file)),
                 "--out", str(out), "--state", str(state), "--once", "--quiet"])
    err = capsys.readouterr().err
    assert code == 2
    assert f"kubernetes.token_file: {token_file}: {message}" in err
    assert "Evil" not in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not out.parent.exists() and not state.exists()


@pytest.mark.parametrize("content", [b"\xff\xfe\x00", b'{"memory": 5, "outbox": 7}',
                                     b'{"version": 1, "outbox": {"position": -1}}',
                                     b'{"memory": {}}',
                                     b'{"version": 1, "translator": 5}',
                                     b'{"version": 1, "translator": {"nodes": []}}',
                                     b'{"version": 1, "translator": {"nodes": {"a": {}}}}',
                                     b'{"version": 1, "translator": {"pods": {"p": 3}}}',
                                     b'{"version": 1, "translator": {"pods": {"p": '
                                     b'{"slots": 3, "job_id": null}}}}',
                                     b'{"version": 1, "resource_versions": [1]}'])
def test_a_bad_state_file_fails_at_start_and_creates_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes) -> None:
    token = tmp_path / "token"
    token.write_text("abc\n")
    state = tmp_path / "s"
    state.write_bytes(content)
    out = tmp_path / "new" / "o.jsonl"
    code = main(["bridge", "kubernetes", "--config",
                 str(_config(tmp_path, "http://127.0.0.1:1", token)),
                 "--out", str(out), "--state", str(state), "--once", "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and f"--state {state}: not a " in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not out.parent.exists() and state.read_bytes() == content


def test_unreachable_kafka_says_what_was_spooled_and_once_exits_1(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("kafka")
    import time

    token = tmp_path / "token"
    token.write_text("abc\n")
    state = tmp_path / "k8s.state"
    with FakeApiServer(FIXTURES, token="abc") as server:
        started = time.monotonic()
        code = main(["bridge", "kubernetes", "--config",
                     str(_config(tmp_path, server.url, token)), "--kafka", "127.0.0.1:1",
                     "--state", str(state), "--once", "--quiet"])
        elapsed = time.monotonic() - started
    err = capsys.readouterr().err
    assert elapsed < 60, elapsed
    assert code == 1, err
    summary = err.strip().splitlines()[-1]
    assert summary.startswith("kubernetes bridge: ") and "Traceback" not in err
    assert (f"record(s) spooled in {tmp_path / 'k8s.state.spool'}, not sent to Kafka yet "
            "(the next run sends them)") in summary


def test_sigterm_while_the_start_list_trickles_in_exits_promptly(tmp_path: Path) -> None:
    """A node list served one byte every 0.2 s (a per-read timeout never fires): SIGTERM
    during the start's list ends the bridge within a few seconds, status 0."""
    def answer(server: HostileApiServer, h: Any, path: str, watch: bool, n: int) -> bool:
        server.trickle(h, json.dumps({"items": [HOSTILE_NODE]}).encode(), 0.2)
        return True

    config = tmp_path / "k8s.yaml"
    with HostileApiServer(answer) as server:
        config.write_text(yaml.safe_dump({"kubernetes": {
            "server": server.url, "kueue": False, "request_timeout_s": 60}}))
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpuledger.cli.main", "bridge", "kubernetes",
             "--config", str(config), "--out", str(tmp_path / "o.jsonl"),
             "--state", str(tmp_path / "s")],
            stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and not server.count("/api/v1/nodes", False):
                time.sleep(0.05)
            time.sleep(0.5)
            proc.send_signal(signal.SIGTERM)
            sent = time.monotonic()
            _, err = proc.communicate(timeout=10)
            elapsed = time.monotonic() - sent
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert proc.returncode == 0, err
    assert elapsed < 5, elapsed  # the list trickled on for 40 s before
    assert "Traceback" not in err and "stopped while listing" in err


def test_a_list_that_never_ends_is_a_clear_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An API that repeats its ``continue`` token: one request more, then exit 2."""
    def answer(server: HostileApiServer, h: Any, path: str, watch: bool, n: int) -> bool:
        server.json(h, {"metadata": {"resourceVersion": "5", "continue": "again"},
                        "items": [HOSTILE_NODE]})
        return True

    with HostileApiServer(answer) as server:
        config = tmp_path / "k8s.yaml"
        config.write_text(yaml.safe_dump({"kubernetes": {"server": server.url,
                                                         "kueue": False}}))
        code = main(["bridge", "kubernetes", "--config", str(config),
                     "--out", str(tmp_path / "o.jsonl"), "--state", str(tmp_path / "s"),
                     "--once", "--quiet"])
        requests = server.count("/api/v1/nodes", False)
    err = capsys.readouterr().err
    assert code == 2 and requests == 2
    assert err.strip().splitlines() == [
        f"gpuledger: error: cannot read the Kubernetes API at {server.url}: /api/v1/nodes: "
        "the API sent the continue token 'again' again (page 2); the list would never end"]


def test_the_help_says_what_config_and_interval_are_here(
        capsys: pytest.CaptureFixture[str]) -> None:
    """--config was described as a mapping file (it holds the `kubernetes:` section
    too) and --interval as the seconds between polls (this bridge does not poll)."""
    with pytest.raises(SystemExit):
        main(["bridge", "kubernetes", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--config FILE YAML with a `kubernetes:` section" in text
    assert "--interval SECONDS not used: this bridge watches instead of polling" in text
