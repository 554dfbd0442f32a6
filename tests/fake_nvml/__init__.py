"""The fake NVML driver for tests: build it, write scenarios, run NVML code against it.

``fake_nvml.c`` is compiled once per test session into ``libnvidia-ml.so.1`` (gcc, with
NVML's own ``nvml.h`` from the ``nvidia-nvml-dev`` package). The real bindings (pynvml)
load it by that name, so code under test runs in a subprocess whose ``LD_LIBRARY_PATH``
names the build folder (the dynamic loader reads that variable only at process start).
The scenario format is documented at the top of ``fake_nvml.c``; :class:`Scenario` writes
it and answers "what value is in effect at step N" so that tests derive their expected
values from the scenario they wrote.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).parent
SOURCE = HERE / "fake_nvml.c"
DRIVE = HERE / "drive.py"
LIBRARY = "libnvidia-ml.so.1"


def nvml_header_dir() -> Path:
    """The folder holding nvml.h from the nvidia-nvml-dev package (in site-packages)."""
    for entry in sys.path:
        base = Path(entry) / "nvidia"
        if base.is_dir():
            headers = sorted(base.glob("*/include/nvml.h")) + sorted(base.glob("include/nvml.h"))
            if headers:
                return headers[0].parent
    raise RuntimeError("nvml.h not found: install the dev extra (pip install nvidia-nvml-dev)")


def build(dest: Path) -> Path:
    """Compile the fake driver into dest/libnvidia-ml.so.1; returns dest."""
    gcc = shutil.which("gcc")
    if gcc is None:
        raise RuntimeError("gcc not found: run scripts/setup.sh (scripts/setup.d/30-gcc.sh)")
    dest.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [gcc, "-shared", "-fPIC", "-O2", "-Wall", "-Wextra", "-Werror",
         "-Wno-deprecated-declarations", f"-I{nvml_header_dir()}",
         f"-Wl,-soname,{LIBRARY}", "-o", str(dest / LIBRARY), str(SOURCE)],
        check=True, capture_output=True, text=True)
    return dest


@pytest.fixture(scope="session")
def fake_nvml_lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder holding the built fake libnvidia-ml.so.1 (put it on LD_LIBRARY_PATH)."""
    return build(tmp_path_factory.mktemp("fake_nvml"))


def nvml_env(lib_dir: Path, scenario: Path | None, step_s: float | None = None) -> dict[str, str]:
    """Environment for a process that should load the fake driver with this scenario."""
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = str(lib_dir)
    env.pop("FAKE_NVML_SCENARIO", None)
    if scenario is not None:
        env["FAKE_NVML_SCENARIO"] = str(scenario)
    if step_s is not None:
        env["FAKE_NVML_STEP_S"] = str(step_s)
    return env


def drive(lib_dir: Path, scenario: Path | None, step_s: float | None = None,
          **plan: Any) -> dict[str, Any]:
    """Run NvmlSource in a subprocess against the fake driver (see drive.py for ``plan``);
    ``step_s`` lets the scenario advance by itself (FAKE_NVML_STEP_S)."""
    proc = subprocess.run(
        [sys.executable, str(DRIVE), json.dumps(plan)], env=nvml_env(lib_dir, scenario, step_s),
        capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        raise AssertionError(f"drive.py failed ({proc.returncode}):\n{proc.stderr}")
    result: dict[str, Any] = json.loads(proc.stdout)
    return result


MIB = 1024 * 1024


@dataclass
class Scenario:
    """A scenario file for the fake driver, built statement by statement."""

    gpus: int
    driver: str = "550.54.15"
    values: list[tuple[int, str, str, str]] = field(default_factory=list)
    migs: list[tuple[int, int, int, int]] = field(default_factory=list)

    def at(self, step: int, target: str, key: str, value: object) -> Scenario:
        """From ``step`` on, ``key`` of ``target`` (gN or gN.mS) is ``value``."""
        self.values.append((step, target, key, str(value)))
        return self

    def set(self, target: str, **values: object) -> Scenario:
        """Values from step 0 on; keys use '_' for '.' (util_gpu → util.gpu)."""
        for key, value in values.items():
            self.at(0, target, key.replace("_", "."), value)
        return self

    def mig(self, gpu: int, slot: int, gi: int, ci: int) -> Scenario:
        self.migs.append((gpu, slot, gi, ci))
        return self

    def value(self, step: int, target: str, key: str) -> str | None:
        """The value the fake driver answers at ``step`` (None: never set)."""
        found: tuple[int, str] | None = None
        for s, t, k, v in self.values:
            if t == target and k == key and s <= step and (found is None or s >= found[0]):
                found = (s, v)
        return None if found is None else found[1]

    def number(self, step: int, target: str, key: str) -> float:
        value = self.value(step, target, key)
        assert value is not None, f"{target} {key} is not set at step {step}"
        return float(value)

    def processes(self, step: int, target: str) -> list[tuple[int, int]]:
        """[(pid, bytes)] in effect at ``step``."""
        value = self.value(step, target, "processes") or "-"
        if value == "-":
            return []
        return [(int(p), int(b)) for p, b in (item.split(":") for item in value.split(","))]

    def text(self) -> str:
        lines = [f"driver {self.driver}", f"gpus {self.gpus}"]
        lines += [f"mig {g} {s} {gi} {ci}" for g, s, gi, ci in self.migs]
        lines += [f"at {s} {t} {k} {v}" for s, t, k, v in self.values]
        return "\n".join(lines) + "\n"

    def write(self, path: Path) -> Path:
        path.write_text(self.text())
        return path


def processes_value(procs: list[tuple[int, int]]) -> str:
    """The scenario form of a process list: pid:bytes,..."""
    return ",".join(f"{pid}:{used}" for pid, used in procs) or "-"
