"""Every YAML file a user hands over fails the same way: one line naming the file and
why, for each command and loader that reads one."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpuledger.agent.config import load_agent_config
from gpuledger.bridges.kubernetes.config import load_config as load_bridge_config
from gpuledger.bridges.mapping import load_mapping
from gpuledger.cli.main import main
from gpuledger.pipeline.advisor.policy import load_policies
from gpuledger.pipeline.config import load_config
from gpuledger.pipeline.simulate import load_cluster
from gpuledger.yaml_file import YamlFileError, read_yaml

LAUGHS = "\n".join(
    ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    + [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 10)]
).encode()
"""Nine lists of nine aliases of the one before: 3.5·10⁹ values once expanded (this took
over 4 GB and never ended where a value was shown in an error message)."""

BAD: list[tuple[str, bytes | None, str]] = [
    ("missing", None, "no such file"),
    ("folder", b"", "is a directory, not a file"),
    ("latin-1", "team: Zürich\n".encode("latin-1"), "not UTF-8 text (byte 7)"),
    ("broken", b"a: [1, 2\nb: 3\n", "not valid YAML at line 2, column 2"),
    ("tab", b"a:\n\t- 1\n", "not valid YAML at line 2, column 1"),
    # valid YAML that would hang or crash the reader: refused before it is built
    ("laughs", LAUGHS, "refused at line 6, column 10: aliases expand to more than 100,000 "
     "values (at *a4)"),
    ("deep", b"a: " + b"[" * 1000 + b"]" * 1000 + b"\n",
     "refused at line 1, column 67: nested more than 64 levels deep"),
    ("itself", b"a: &x [1, *x]\n",
     "refused at line 1, column 11: the alias *x is inside the value it names"),
    # found by trying: the parser kept the last of two keys, a setting lost in silence
    ("twice", b"thresholds:\n  idle_activity: 0.05\n  idle_activity: 0.5\n",
     "refused at line 3, column 3: the key 'idle_activity' appears twice in one mapping"),
    ("twice-nested", b"a:\n  - {b: 1, c: {d: 2}, b: 3}\n",
     "refused at line 2, column 23: the key 'b' appears twice in one mapping"),
]


def _make(tmp_path: Path, kind: str, content: bytes | None) -> Path:
    path = tmp_path / f"{kind}.yaml"
    if kind == "folder":
        path.mkdir()
    elif content is not None:
        path.write_bytes(content)
    return path


@pytest.mark.parametrize(("kind", "content", "says"), BAD)
def test_the_reason_is_one_line_naming_the_file(tmp_path: Path, kind: str,
                                                content: bytes | None, says: str) -> None:
    path = _make(tmp_path, kind, content)
    with pytest.raises(YamlFileError) as err:
        read_yaml(path)
    assert str(err.value).startswith(f"{path}: {says}"), str(err.value)
    assert "\n" not in str(err.value)


LOADERS: dict[str, Callable[[Path], Any]] = {
    "processor configuration": load_config,
    "agent configuration": load_agent_config,
    "mapping": load_mapping,
    "Kubernetes bridge configuration": load_bridge_config,
    "cluster spec": load_cluster,
    "what-if policies": load_policies,
}


@pytest.mark.parametrize("loader", list(LOADERS))
@pytest.mark.parametrize(("kind", "content", "says"), BAD)
def test_every_loader_says_the_same(tmp_path: Path, loader: str, kind: str,
                                    content: bytes | None, says: str) -> None:
    path = _make(tmp_path, kind, content)
    with pytest.raises(ValueError) as err:  # each loader's own error type
        LOADERS[loader](path)
    assert f"{path}: {says}" in str(err.value) and "\n" not in str(err.value), str(err.value)


@pytest.mark.parametrize(("option", "command"), [
    ("--mapping", ["import", "pods", "{csv}", "--mapping"]),
    ("--mapping", ["import", "slurm-sacct", "{csv}", "--mapping"]),
    ("--config", ["ingest", "{csv}", "--config"]),
    ("--cluster", ["simulate", "--hours", "1", "--out", "{out}", "--cluster"]),
])
@pytest.mark.parametrize(("kind", "content", "says"), BAD[2:])
def test_commands_print_it_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                      option: str, command: list[str], kind: str,
                                      content: bytes | None, says: str) -> None:
    path = _make(tmp_path, kind, content)
    csv = tmp_path / "input.csv"
    csv.write_text("x\n1\n")
    args = [a.format(csv=csv, out=tmp_path / "out") for a in command]
    assert main([*args, str(path), "--warehouse" if command[0] != "simulate" else "--quiet",
                 *([str(tmp_path / "wh")] if command[0] != "simulate" else [])]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{path}: {says}" in err, err
    assert not (tmp_path / "wh").exists() and not (tmp_path / "out").exists()


def test_aliases_depth_and_merge_keys_within_bounds_still_load(tmp_path: Path) -> None:
    path = tmp_path / "ok.yaml"
    nested = "[" * 63 + "1" + "]" * 63  # 64 levels with the mapping around it
    path.write_text("base: &base {idle: 0.05, busy: 0.5}\n"
                    "pools:\n  a: {<<: *base, busy: 0.6}\n  b: *base\n"
                    f"deep: {nested}\n")
    got = read_yaml(path)
    assert got["pools"] == {"a": {"idle": 0.05, "busy": 0.6},
                            "b": {"idle": 0.05, "busy": 0.5}}
    deep = got["deep"]
    for _ in range(62):
        deep = deep[0]
    assert deep == [1]
    path.write_text(f"deep: [{nested}]\n")  # one level more
    with pytest.raises(YamlFileError, match="nested more than 64 levels deep"):
        read_yaml(path)


def test_agent_environment_values_are_checked_the_same(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A list or mapping given in a ``GPULEDGER_AGENT__*`` variable is YAML too."""
    path = tmp_path / "agent.yaml"
    path.write_text("")
    value = "[" + ", ".join(["&a0 [1, 2, 3, 4, 5, 6, 7, 8, 9]"]
                            + [f"&a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]"
                               for i in range(1, 10)]) + "]"
    monkeypatch.setenv("GPULEDGER_AGENT__ATTRIBUTION__METHODS", value)
    with pytest.raises(ValueError) as err:
        load_agent_config(path)
    assert "GPULEDGER_AGENT__ATTRIBUTION__METHODS" in str(err.value) or \
        "attribution.methods" in str(err.value), str(err.value)
    assert "aliases expand to more than 100,000 values" in str(err.value)


def test_an_undecodable_byte_in_an_agent_variable_is_said_not_raised(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An environment variable's byte that is not UTF-8 reaches Python as a lone
    surrogate, which libyaml's reader cannot take (a UnicodeEncodeError traceback, for one
    commit); the Python reader says why it is not YAML."""
    path = tmp_path / "agent.yaml"
    path.write_text("")
    monkeypatch.setenv("GPULEDGER_AGENT__ATTRIBUTION__METHODS", "[\udcff]")
    with pytest.raises(ValueError) as err:
        load_agent_config(path)
    assert "special characters are not allowed" in str(err.value), str(err.value)
