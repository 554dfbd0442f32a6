"""The openb trace for the tests: the published one where it is (``GPULEDGER_OPENB_DIR``,
or ``../shared/data/openb`` beside the checkout), else a synthetic trace in its format.

The published trace (Alibaba, USENIX ATC '23) is not part of this repository. Where it is
absent (a clone elsewhere, CI), the tests run on a trace written here in the same columns
and units: nodes of several card types (some without GPUs), GPU and CPU-only pods with
whole and fractional GPUs, four QoS classes, created and scheduled around the tests' window
(hours 3552–3554) and deleted inside and after it. The tests compare the importer with a
direct computation from whichever CSV files they get, so both give real checks.
"""

from __future__ import annotations

import os
import random
import tempfile
from pathlib import Path

NODE_FILE = "openb_node_list_gpu_node.csv"
POD_FILE = "openb_pod_list_default.csv"
WINDOW_FROM_S = 3552 * 3600
PODS = 350
VERSION = 3
"""Bump when the synthetic trace changes (its folder name carries it)."""


def _published() -> Path | None:
    here = Path(__file__).resolve().parents[2] / "shared" / "data" / "openb"
    for folder in (os.environ.get("GPULEDGER_OPENB_DIR"), here):
        if folder and (Path(folder) / POD_FILE).is_file() and (Path(folder) / NODE_FILE).is_file():
            return Path(folder)
    return None


def _write_synthetic(folder: Path, seed: int = 23) -> None:
    rng = random.Random(seed)
    node_lines = ["sn,cpu_milli,memory_mib,gpu,model"]
    kinds = [("V100M32", 8)] * 24 + [("A100", 8)] * 16 + [("T4", 2)] * 10 + [("P100", 2)] * 6
    for i, (model, gpus) in enumerate(kinds):
        node_lines.append(f"openb-node-{i:04d},96000,786432,{gpus},{model}")
    for i in range(len(kinds), len(kinds) + 4):              # CPU-only nodes
        node_lines.append(f"openb-node-{i:04d},64000,262144,0,")
    pod_lines = ["name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
                 "creation_time,deletion_time,scheduled_time"]
    lo = WINDOW_FROM_S - 3 * 3600
    hi = WINDOW_FROM_S + 3 * 3600
    for i in range(PODS):
        num_gpu = rng.choices([0, 1, 2, 4, 8], weights=[10, 60, 15, 10, 5])[0]
        milli = rng.choice([250, 500, 1000]) if num_gpu == 1 else 1000
        qos = rng.choices(["LS", "BE", "Burstable", "Guaranteed"], weights=[5, 3, 1, 1])[0]
        phase = rng.choices(["Running", "Succeeded", "Failed"], weights=[6, 3, 1])[0]
        created = rng.randrange(lo, hi)
        wait = 0 if rng.random() < 0.3 else rng.randrange(1, 900)
        duration = rng.randrange(30, 3 * 3600)
        scheduled = "" if rng.random() < 0.03 else str(created + wait)
        deleted = created + wait + duration
        pod_lines.append(f"openb-pod-{i:04d},{rng.choice([2000, 4000, 8000])},16384,{num_gpu},"
                         f"{milli if num_gpu else 0},,{qos},{phase},{created},{deleted},"
                         f"{scheduled}")
    folder.mkdir(parents=True, exist_ok=True)
    for name, lines in ((NODE_FILE, node_lines), (POD_FILE, pod_lines)):
        tmp = folder / f".{name}.{os.getpid()}"
        tmp.write_text("\n".join(lines) + "\n")
        tmp.replace(folder / name)


def openb_trace() -> tuple[Path, Path, bool]:
    """(node list, pod list, whether they are the published trace)."""
    folder = _published()
    if folder is not None:
        return folder / NODE_FILE, folder / POD_FILE, True
    folder = Path(tempfile.gettempdir()) / f"gpuledger-openb-synthetic-v{VERSION}-{os.getuid()}"
    if not (folder / POD_FILE).is_file():
        _write_synthetic(folder)
    return folder / NODE_FILE, folder / POD_FILE, False
