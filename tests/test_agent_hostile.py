"""The agent command against hostile input: one clear line and exit 2 at start, a
warning (never a crash) at run time, and nothing left behind when start-up fails."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml


def _cmd(config: Path, *more: str) -> list[str]:
    return [sys.executable, "-m", "gpuledger.cli.main", "agent", "--config", str(config), *more]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULEDGER_AGENT__")}
    env.update(GPULEDGER_KAFKA_BOOTSTRAP="127.0.0.1:1", **extra)
    return env


def _config(tmp_path: Path, **extra: Any) -> Path:
    cfg: dict[str, Any] = {"node": "h100-001", "source": "simulator", "interval_s": 1,
                           "metrics": {"listen": ""}, "kafka": {"send_timeout_s": 1},
                           "spool": {"path": str(tmp_path / "new" / "deeper" / "spool")}}
    cfg.update(extra)
    path = tmp_path / "agent.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _one_line_error(done: subprocess.CompletedProcess[str], *wanted: str) -> None:
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    for text in wanted:
        assert text in done.stderr, done.stderr


@pytest.mark.parametrize(("var", "value", "wanted"), [
    ("GPULEDGER_AGENT__ATTRIBUTION__METHODS", "[slurm",
     "attribution.methods: not valid YAML at line 1, column 7"),
    ("GPULEDGER_AGENT__ATTRIBUTION__STATIC__GPUS", "!!python/object:os.system {}",
     "attribution.static.gpus: not valid YAML"),
    ("GPULEDGER_AGENT__KAFKA", "{batch: 5}", "GPULEDGER_AGENT__KAFKA__BOOTSTRAP=..."),
])
def test_bad_yaml_in_a_variable_exits_2_naming_it(tmp_path: Path, var: str, value: str,
                                                  wanted: str) -> None:
    done = subprocess.run(_cmd(_config(tmp_path), "--once"), env=_env(**{var: value}),
                          capture_output=True, text=True, timeout=60)
    _one_line_error(done, wanted, var)


@pytest.mark.parametrize("extra", [
    {"node": "foo"},
    {"simulator": {"cluster": "/nonexistent"}},
    {"metrics": {"listen": "127.0.0.1:PORT"}},       # a port already taken
])
def test_start_up_errors_leave_no_spool_folder_behind(tmp_path: Path,
                                                      extra: dict[str, Any]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        if "metrics" in extra:
            extra = {"metrics": {"listen": f"127.0.0.1:{taken.getsockname()[1]}"}}
        done = subprocess.run(_cmd(_config(tmp_path, **extra)), env=_env(),
                              capture_output=True, text=True, timeout=120)
    _one_line_error(done)
    assert not (tmp_path / "new").exists()


def test_spool_path_mistakes_are_said_plainly(tmp_path: Path) -> None:
    a_file = tmp_path / "spool-file"
    a_file.write_text("")
    done = subprocess.run(_cmd(_config(tmp_path, spool={"path": str(a_file)})), env=_env(),
                          capture_output=True, text=True, timeout=120)
    _one_line_error(done, f"spool.path: {a_file} is a file, not a folder")
    folder = tmp_path / "spool"
    (folder / "00000000000000000000.seg").mkdir(parents=True)
    done = subprocess.run(_cmd(_config(tmp_path, spool={"path": str(folder)})), env=_env(),
                          capture_output=True, text=True, timeout=120)
    _one_line_error(done, "00000000000000000000.seg is a folder, not a file")


def test_bad_runtime_files_are_warnings_and_the_agent_keeps_going(tmp_path: Path) -> None:
    labels = tmp_path / "labels"
    labels.write_bytes(b"\xff\xfe=\xff")
    spool = tmp_path / "spool"
    spool.mkdir()
    (spool / "zzz.seg").write_text("")
    (spool / "agent.seq").write_text("-50")
    config = _config(tmp_path, spool={"path": str(spool)},
                     inventory={"labels_file": str(labels), "check_s": 1})
    proc = subprocess.Popen(_cmd(config), env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    time.sleep(6)
    assert proc.poll() is None, proc.communicate()[1]
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    assert "cannot read the labels file" in err and "not UTF-8 text (byte 0)" in err
    assert "ignoring" in err and "zzz.seg" in err
    assert "ignoring the seq file" in err and "out of range" in err
    assert int((spool / "agent.seq").read_text()) > 0
