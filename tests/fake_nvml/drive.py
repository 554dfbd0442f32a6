"""Run gpuledger's NvmlSource against the fake driver and print what it produced (JSON).

Started by ``fake_nvml.drive`` in a subprocess whose LD_LIBRARY_PATH holds the fake
``libnvidia-ml.so.1``. argv[1] is a JSON plan:

    node        node name (default "node-1")
    steps       scenario steps to collect at, in order (default [0]); the source is
                created at the first step
    start       time of step 0, ISO 8601 (default 2026-01-05T10:00:00+00:00)
    interval_s  seconds between steps (default 10)
    pool        when given, an inventory record is taken after every collection
    fields      a field file for the source (default: the packaged one)
    counts      fake-driver keys whose query counts to report at the end
    times       the wall time of each collection, ISO 8601 (default: start + interval ×
                step); the source's monotonic clock still reads start + interval × step
    sleep_s     when given, the steps are not set: the driver advances them by itself
                (FAKE_NVML_STEP_S) and drive.py sleeps this long between collections

Output: {"collects": [[records]...], "inventories": [...], "devices": [...],
"counts": {key: n}, "errors": n, "heavy_modules": [...]}, or
{"error": {"type": ..., "message": ...}} when construction fails.
"""

from __future__ import annotations

import ctypes
import json
import sys
import time
from datetime import datetime, timedelta
from typing import Any


def main() -> None:
    plan: dict[str, Any] = json.loads(sys.argv[1])
    steps: list[int] = plan.get("steps", [0])
    start = datetime.fromisoformat(plan.get("start", "2026-01-05T10:00:00+00:00"))
    interval = float(plan.get("interval_s", 10))
    try:
        lib: Any = ctypes.CDLL("libnvidia-ml.so.1")  # the same library pynvml will load
        lib.fake_nvml_set_step(ctypes.c_uint(steps[0]))
    except (OSError, AttributeError):
        lib = None  # no fake driver on the path: the source must say so

    from gpuledger.agent.sources.nvml import NvmlSource, NvmlUnavailable

    times = [datetime.fromisoformat(t) for t in plan.get("times", [])]
    ticks = [start.timestamp() + interval * step for step in steps]
    clock = iter(ticks)
    try:
        source = NvmlSource(plan.get("node", "node-1"), plan.get("fields"),
                            **({} if plan.get("sleep_s") is not None
                               else {"clock": lambda: next(clock)}))
    except NvmlUnavailable as err:
        print(json.dumps({"error": {"type": type(err).__name__, "message": str(err)}}))
        return
    out: dict[str, Any] = {"collects": [], "inventories": [], "counts": {}}
    for n, step in enumerate(steps):
        if plan.get("sleep_s") is None:
            lib.fake_nvml_set_step(ctypes.c_uint(step))
        elif n > 0:
            time.sleep(float(plan["sleep_s"]))
        when = times[n] if times else start + timedelta(seconds=interval * step)
        out["collects"].append(source.collect(when))
        if plan.get("pool"):
            out["inventories"].append(source.inventory(plan["pool"], when))
    out["devices"] = source.devices()
    out["errors"] = source.errors
    out["heavy_modules"] = sorted(m for m in ("polars", "duckdb", "pyarrow", "numpy")
                                  if m in sys.modules)
    lib.fake_nvml_query_count.restype = ctypes.c_uint
    for key in plan.get("counts", []):
        out["counts"][key] = int(lib.fake_nvml_query_count(key.encode()))
    source.close()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
