"""`gpuledger dashboards push` and `generate` given hostile input: credentials in the URL,
a token that would inject a header or cannot be sent, a "Grafana" that answers HTML, a
JSON list or a version that is no number, URLs that do not parse, board files that are
no boards, options of the other action, a folder uid that would walk the API's paths,
and the default board folder of an installed gpuledger. Each is one line on stderr,
exit status 2, no secret in it, and no request sent where the input was refused.

A real HTTP server on 127.0.0.1 plays Grafana (there is none here): it records every
request and answers as each test tells it."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from gpuledger.cli.main import main
from gpuledger.pipeline.dashboards import files
from gpuledger.pipeline.dashboards.boards import UIDS

Answer = tuple[int, str, bytes]  # status, content type, body


def json_answer(body: Any, status: int = 200) -> Answer:
    return status, "application/json", json.dumps(body).encode()


def grafana_answer(method: str, path: str, body: Any) -> Answer:
    """What a Grafana with no gpuledger folder yet answers."""
    if method == "GET":
        return json_answer({"message": "folder not found"}, 404)
    if path == "/api/folders":
        return json_answer({"uid": body["uid"], "title": body["title"]})
    uid = body["dashboard"]["uid"]
    return json_answer({"status": "success", "uid": uid, "version": 1, "url": f"/d/{uid}/x"})


@dataclass
class FakeGrafana:
    url: str
    calls: list[tuple[str, str, dict[str, str]]] = field(default_factory=list)
    answer: Callable[[str, str, Any], Answer] = grafana_answer


@pytest.fixture
def grafana() -> Iterator[FakeGrafana]:
    fake = FakeGrafana("")

    class Handler(BaseHTTPRequestHandler):
        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            fake.calls.append((self.command, self.path, dict(self.headers)))
            status, kind, data = fake.answer(self.command, self.path,
                                             json.loads(raw) if raw else None)
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = _serve

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    fake.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield fake
    server.shutdown()
    server.server_close()


@pytest.fixture
def boards(tmp_path: Path) -> Path:
    folder = tmp_path / "boards"
    assert main(["dashboards", "generate", "--dir", str(folder)]) == 0
    return folder


@pytest.fixture(autouse=True)
def token(monkeypatch: pytest.MonkeyPatch) -> str:
    secret = "glsa_hostile-test-token-5c1d"
    monkeypatch.delenv("GRAFANA_TOKEN", raising=False)
    monkeypatch.delenv("GPULEDGER_GRAFANA_URL", raising=False)
    monkeypatch.setenv("GPULEDGER_GRAFANA_TOKEN", secret)
    return secret


def one_error(capsys: pytest.CaptureFixture[str]) -> str:
    """The one line of stderr (``gpuledger: error: ...``), nothing on stdout."""
    out = capsys.readouterr()
    assert out.out == ""
    assert out.err.count("\n") == 1 and out.err.startswith("gpuledger: error: "), out.err
    assert "Traceback" not in out.err
    return out.err.strip()


# --- secrets ---------------------------------------------------------------------------------

def test_credentials_in_the_url_are_refused_and_never_shown(
        grafana: FakeGrafana, boards: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    with_password = grafana.url.replace("http://", "http://admin:hunter2pass@")
    assert main(["dashboards", "push", "--dir", str(boards), "--url", with_password]) == 2
    err = one_error(capsys)
    assert "hunter2pass" not in err and "admin" not in err
    assert "credentials" in err and "GPULEDGER_GRAFANA_TOKEN" in err
    # from the environment too, named as such
    monkeypatch.setenv("GPULEDGER_GRAFANA_URL", with_password)
    assert main(["dashboards", "push", "--dir", str(boards)]) == 2
    err = one_error(capsys)
    assert err.startswith("gpuledger: error: GPULEDGER_GRAFANA_URL ") and "hunter2" not in err
    assert grafana.calls == []


@pytest.mark.parametrize("bad", ["abc\r\nX-Evil: 1", "abc\nX-Evil: 1", "tok€n", "two words",
                                 "tab\tbed", "esc\x1b[31m", "del\x7f"])
def test_a_token_that_is_no_header_value_is_refused_unseen(
        grafana: FakeGrafana, boards: Path, bad: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("GPULEDGER_GRAFANA_TOKEN", bad)
    assert main(["dashboards", "push", "--dir", str(boards), "--url", grafana.url]) == 2
    assert one_error(capsys) == (
        "gpuledger: error: GPULEDGER_GRAFANA_TOKEN: the token must be printable ASCII "
        "without spaces or control characters (it is not shown)")
    assert grafana.calls == []


def test_what_grafana_answers_never_carries_the_token_out(
        grafana: FakeGrafana, boards: Path, token: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A proxy that echoes the request's headers in its error message."""
    def echo(method: str, path: str, body: Any) -> Answer:
        return json_answer({"message": f"bad request\nAuthorization: Bearer {token}"}, 400)

    grafana.answer = echo
    assert main(["dashboards", "push", "--dir", str(boards), "--url", grafana.url]) == 2
    err = one_error(capsys)
    assert token not in err and "HTTP 400: bad request Authorization: Bearer <token>" in err


# --- answers that are not Grafana's ----------------------------------------------------------

def _html(method: str, path: str, body: Any) -> Answer:
    return 200, "text/html; charset=utf-8", b"<html><form action=/login></form></html>"


def _json_list(method: str, path: str, body: Any) -> Answer:
    return json_answer([1, 2])


def _version_abc(method: str, path: str, body: Any) -> Answer:
    if method == "GET":
        return json_answer({"uid": "gpuledger", "title": "gpuledger"})
    return json_answer({"version": "abc", "url": "/d/x"})


def _garbage(method: str, path: str, body: Any) -> Answer:
    return 200, "application/json", b"{\"version\": 1,"


def _bad_gateway(method: str, path: str, body: Any) -> Answer:
    return 502, "text/html", b"<html>\n<h1>502 Bad Gateway</h1>\n</html>"


@pytest.mark.parametrize(("answer", "says"), [
    (_html, "answered something that is not Grafana's JSON (text/html)"),
    (_json_list, "not Grafana's JSON (application/json: a JSON list where an object"),
    (_version_abc, "board gpuledger-fleet: version 'abc' is not a whole number"),
    (_garbage, "answered something that is not Grafana's JSON (application/json)"),
    (_bad_gateway, "HTTP 502: an answer of text/html"),
])
def test_an_answer_that_is_not_grafanas_is_one_line(
        grafana: FakeGrafana, boards: Path, answer: Callable[[str, str, Any], Answer],
        says: str, capsys: pytest.CaptureFixture[str]) -> None:
    grafana.answer = answer
    assert main(["dashboards", "push", "--dir", str(boards), "--url", grafana.url]) == 2
    err = one_error(capsys)
    assert f"Grafana at {grafana.url}" in err and says in err, err


@pytest.mark.parametrize(("url", "says"), [
    ("http://127.0.0.1:99999", "Port out of range"),
    ("http://[::1", "Invalid IPv6 URL"),
    ("ftp://127.0.0.1/", "expected an http:// or https:// URL"),
    ("http://127.0.0.1:3000/\r\nX: 1", "spaces or control characters"),
    ("http://", "no host in the URL"),
])
def test_a_url_that_does_not_parse_is_one_line(
        boards: Path, url: str, says: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["dashboards", "push", "--dir", str(boards), "--url", url]) == 2
    err = one_error(capsys)
    assert err.startswith("gpuledger: error: --url ") and says in err


def test_an_unreachable_grafana_gives_the_reason(
        boards: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["dashboards", "push", "--dir", str(boards), "--url",
                 "http://127.0.0.1:9"]) == 2
    assert one_error(capsys) == ("gpuledger: error: cannot reach Grafana at "
                                 "http://127.0.0.1:9: Connection refused")


# --- board files -----------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "reason"), [
    (b"{not json", "not JSON: Expecting property name enclosed in double quotes at line 1"),
    (b'{"title": "x"}', "no uid"),
    (b"[1, 2]", "a JSON list, not an object"),
    (b'{"uid": 7, "title": "x"}', "uid 7 is not text"),
    (b'{"uid": "../admin/users", "title": "x"}', "uid '../admin/users': a Grafana uid is"),
    (b'{"uid": "ok", "title": ""}', "no title"),
    (b"\xff\xfe{}", "not UTF-8 text"),
    (b"[" * 100_000, "not JSON"),
])
def test_a_bad_board_file_is_named(grafana: FakeGrafana, boards: Path, text: bytes,
                                   reason: str, capsys: pytest.CaptureFixture[str]) -> None:
    bad = boards / "zz-bad.json"
    bad.write_bytes(text)
    assert main(["dashboards", "push", "--dir", str(boards), "--url", grafana.url]) == 2
    err = one_error(capsys)
    assert err.startswith(f"gpuledger: error: {bad}: not a board ({reason}"), err
    assert grafana.calls == []


def test_two_files_with_one_uid_are_refused(grafana: FakeGrafana, boards: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    (boards / "zz-copy.json").write_text((boards / "gpuledger-job.json").read_text())
    assert main(["dashboards", "push", "--dir", str(boards), "--url", grafana.url]) == 2
    err = one_error(capsys)
    assert f"{boards / 'zz-copy.json'}: not a board (uid 'gpuledger-job' is " in err
    assert grafana.calls == []


# --- options ---------------------------------------------------------------------------------

def test_push_check_is_refused_not_a_live_push(grafana: FakeGrafana, boards: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["dashboards", "push", "--check", "--dir", str(boards),
                 "--url", grafana.url]) == 2
    err = one_error(capsys)
    assert "--check" in err and "no dry run" in err
    assert grafana.calls == []
    # the push itself, with a folder of its own, goes on
    assert main(["dashboards", "push", "--dir", str(boards), "--url", grafana.url,
                 "--folder-uid", "Team_a-1", "--folder-title", "Team A"]) == 0
    assert grafana.calls[0][:2] == ("GET", "/api/folders/Team_a-1")
    assert capsys.readouterr().err.strip().endswith("(folder Team_a-1)")


def test_generate_refuses_push_options(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    assert main(["dashboards", "generate", "--dir", str(out), "--url", "http://x:3000",
                 "--folder-uid", "Y"]) == 2
    err = one_error(capsys)
    assert "--url, --folder-uid: only for dashboards push, not generate" in err
    assert main(["dashboards", "generate", "--dir", str(out), "--folder-title", "T"]) == 2
    assert "--folder-title" in one_error(capsys)
    assert not out.exists()
    # the URL variable of the environment is no option given: generate goes on
    monkeypatch.setenv("GPULEDGER_GRAFANA_URL", "http://grafana:3000")
    assert main(["dashboards", "generate", "--dir", str(out)]) == 0
    assert sorted(p.stem for p in out.glob("*.json")) == sorted(UIDS)


@pytest.mark.parametrize(("args", "says"), [
    (["--folder-uid", "../admin/users"], "--folder-uid '../admin/users': a Grafana uid is"),
    (["--folder-uid", "x" * 41], "a Grafana uid is 1 to 40"),
    (["--folder-uid", ""], "--folder-uid '': a Grafana uid is"),
    (["--folder-title", ""], "--folder-title '': must be a non-empty title"),
    (["--folder-title", "  "], "--folder-title '  ': must be a non-empty title"),
    (["--folder-title", "a\nb"], "--folder-title 'a\\nb': must be a non-empty title"),
])
def test_folder_options_are_checked(grafana: FakeGrafana, boards: Path, args: list[str],
                                    says: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["dashboards", "push", "--dir", str(boards), "--url", grafana.url,
                 *args]) == 2
    assert says in one_error(capsys)
    assert grafana.calls == []


# --- the default board folder ----------------------------------------------------------------

def test_default_folder_of_a_checkout_is_the_repositorys() -> None:
    assert files.default_dashboards_dir() == files.repo_dashboards_dir()
    assert (files.default_dashboards_dir() / "gpuledger-fleet.json").is_file()


def test_default_folder_when_installed_is_the_current_directorys(
        grafana: FakeGrafana, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Installed from a wheel, the module lies in site-packages, and no board JSON with
    it: the boards are ./dashboards, and push without them says how to make them."""
    site = tmp_path / "venv/lib/python3.11/site-packages/gpuledger/pipeline/dashboards"
    site.mkdir(parents=True)
    monkeypatch.setattr(files, "__file__", str(site / "files.py"))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    assert main(["dashboards", "push", "--url", grafana.url]) == 2
    assert one_error(capsys) == (
        "gpuledger: error: dashboards: no such folder; write the boards with: gpuledger "
        "dashboards generate --dir dashboards (or give --dir)")
    assert main(["dashboards", "generate"]) == 0
    assert sorted(p.stem for p in (work / "dashboards").glob("*.json")) == sorted(UIDS)
    assert not (tmp_path / "venv/lib/python3.11/dashboards").exists()
    capsys.readouterr()
    assert main(["dashboards", "push", "--url", grafana.url]) == 0
    posts = [c for c in grafana.calls if c[1] == "/api/dashboards/db"]
    assert len(posts) == len(UIDS)


def test_a_grafana_that_trickles_its_answer_is_given_up(boards: Path) -> None:
    """A server that sends its answer a byte a second never trips a read timeout: the
    push waited forever (a probe killed it after 60 s). The whole push has a deadline."""
    import socket
    import time

    from gpuledger.pipeline.dashboards.push import PushError, push_boards

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    stop = threading.Event()

    def trickle() -> None:
        conn, _ = listener.accept()
        conn.recv(65536)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 100000\r\n\r\n")
        while not stop.is_set():
            try:
                conn.sendall(b" ")
            except OSError:
                return
            time.sleep(0.2)

    threading.Thread(target=trickle, daemon=True).start()
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    board = json.loads(next(boards.glob("*.json")).read_text())
    began = time.monotonic()
    try:
        with pytest.raises(PushError, match=r"no whole answer within 1\.5 s \(0\.5 s for each "
                                            r"of its 3 requests\)"):
            push_boards(url, "t0ken", {board["uid"]: board}, timeout_s=0.5)
    finally:
        stop.set()
        listener.close()
    assert time.monotonic() - began < 5
