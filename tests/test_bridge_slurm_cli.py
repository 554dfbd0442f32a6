"""``gpuledger bridge slurm`` against recorded Slurm answers (fake squeue/sinfo/scontrol
on PATH printing tests/fixtures/slurm): bad options, places and state files are one line
and exit 2 at start, before the first poll, and leave nothing behind."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from gpuledger.cli.main import main

FIX = Path(__file__).parent / "fixtures" / "slurm"


@pytest.fixture(autouse=True)
def fake_slurm(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch,
               tmp_path: Path) -> None:
    bin_dir = tmp_path_factory.mktemp("fakebin")
    scripts = {"squeue": f"cat {FIX}/squeue.json", "sinfo": f"cat {FIX}/sinfo.json",
               "scontrol": f'if [ "$4" = job ]; then cat {FIX}/scontrol_jobs.txt; '
                           f"else cat {FIX}/scontrol_nodes.txt; fi"}
    for name, body in scripts.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{Path(sys.executable).parent}:/usr/bin:/bin")
    monkeypatch.chdir(tmp_path)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(["bridge", "slurm", "--once", "--quiet", *argv])
    return code, capsys.readouterr().err


def test_the_base_command_works(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, err = run(capsys, "--out", "out.jsonl", "--state", "st")
    assert code == 0 and "8 job events, 1 inventory records" in err
    assert len((tmp_path / "out.jsonl").read_text().splitlines()) == 9


def _one_line_exit_2(code: int, err: str, *expected: str) -> None:
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    for text in expected:
        assert text in err, err


@pytest.mark.parametrize(("out", "message"), [
    ("{tmp}", "--out: {tmp} is a directory"),
    ("/dev/null", "--out: /dev/null is not a regular file"),
    ("/proc/self/status", "--out: cannot write /proc/self/status"),
    ("/proc/x/y", "--out: cannot create /proc/x/y"),
    ("afile/out.jsonl", "is not a directory"),
])
def test_out_at_a_bad_place(capsys: pytest.CaptureFixture[str], tmp_path: Path, out: str,
                            message: str) -> None:
    if out.startswith("/proc") and not Path("/proc/self/status").exists():
        pytest.skip("no /proc")
    (tmp_path / "afile").write_text("x")
    out = out.format(tmp=tmp_path)
    code, err = run(capsys, "--out", out, "--state", "st")
    _one_line_exit_2(code, err, message.format(tmp=tmp_path))
    assert not (tmp_path / "st").exists()


@pytest.mark.parametrize("state", ["/proc/x", "{tmp}/afile/st", "{tmp}"])
def test_state_at_a_bad_place_is_refused_before_the_first_poll(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, state: str) -> None:
    if state.startswith("/proc") and not Path("/proc").is_dir():
        pytest.skip("no /proc")
    (tmp_path / "afile").write_text("x")
    code, err = run(capsys, "--out", "new/out.jsonl", "--state", state.format(tmp=tmp_path))
    _one_line_exit_2(code, err, "--state")
    assert not (tmp_path / "new").exists()


@pytest.mark.parametrize(("content", "why"), [
    (b"\xff\xfe\x00", "not UTF-8"),
    (b'{"memory": 5, "outbox": 7}', "memory: expected an object"),
    (b'{"memory": {}, "outbox": 7}', "outbox: expected an object or null"),
    (b'{"outbox": {"position": 4.5, "records": []}}', "outbox.position"),
    (b'{"outbox": {"position": 0, "records": [1]}}', "outbox.records"),
    (b'{"memory": {"jobs": {"1": 5}}}', "memory"),
    (b"", "Expecting value"),
    (b"[1]", "expected a JSON object, got list"),
    (b"NaN", "NaN is not JSON"),
    (b'{"memory": {"jobs": {}, "nod', "Unterminated string"),
])
def test_a_bad_state_file_is_one_line_and_creates_nothing(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, content: bytes, why: str) -> None:
    (tmp_path / "st").write_bytes(content)
    code, err = run(capsys, "--out", "new_x/out.jsonl", "--state", "st")
    _one_line_exit_2(code, err, "--state st: not a ", "state file", why)
    assert not (tmp_path / "new_x").exists()
    code, err = run(capsys, "--kafka", "127.0.0.1:1", "--state", "st")
    _one_line_exit_2(code, err, "--state st: not a ")
    assert not (tmp_path / "st.spool").exists()
    assert (tmp_path / "st").read_bytes() == content


@pytest.mark.parametrize(("spool", "message"), [
    ("afile", "--spool: afile is not a directory"),
    ("/proc/x", "--spool: cannot create /proc/x"),
])
def test_spool_at_a_bad_place(capsys: pytest.CaptureFixture[str], tmp_path: Path, spool: str,
                              message: str) -> None:
    pytest.importorskip("kafka")
    (tmp_path / "afile").write_text("x")
    code, err = run(capsys, "--kafka", "127.0.0.1:1", "--spool", spool, "--state", "st")
    _one_line_exit_2(code, err, message)
    assert not (tmp_path / "st").exists()


def test_an_outbox_past_the_end_of_a_new_out_file_is_appended_not_padded(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    record = {"v": 1, "type": "inventory", "time": "2026-01-01T00:00:00Z", "node": "n9"}
    (tmp_path / "st").write_text(json.dumps(
        {"memory": {}, "outbox": {"position": 4096, "records": [record]}}))
    code, err = run(capsys, "--out", "o2new.jsonl", "--state", "st")
    assert code == 0, err
    data = (tmp_path / "o2new.jsonl").read_bytes()
    assert b"\0" not in data
    lines = [json.loads(x) for x in data.splitlines()]
    assert lines[0] == record and len(lines) == 10
    assert json.loads((tmp_path / "st").read_text())["outbox"] is None


@pytest.mark.parametrize("value", ["1e-300", "0.05", "0", "nan", "inf", "86401", "1e18"])
def test_interval_has_bounds(capsys: pytest.CaptureFixture[str], value: str) -> None:
    """(1e18 overflowed the wait between polls: a traceback after the first poll.)"""
    with pytest.raises(SystemExit) as done:
        main(["bridge", "slurm", "--out", "o", "--interval", value])
    assert done.value.code == 2
    assert "--interval must be" in capsys.readouterr().err


def test_unreachable_kafka_is_a_bounded_wait_and_says_what_was_spooled(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    pytest.importorskip("kafka")
    import time

    started = time.monotonic()
    code, err = run(capsys, "--kafka", "127.0.0.1:1", "--state", "st")
    assert time.monotonic() - started < 40
    assert code == 1, err
    assert "9 record(s) spooled in st.spool, not sent to Kafka yet" in err
