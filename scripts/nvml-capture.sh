#!/usr/bin/env bash
# Capture what gpuledger's NVML source reads on a machine with a real NVIDIA GPU.
#
# Read-only: it only queries the driver (NVML, nvidia-smi -q / --query-gpu); it never
# changes a GPU setting. Needs python3 and the NVIDIA driver; the network only for pip.
#
#   OUT=/some/folder bash scripts/nvml-capture.sh      (CAPTURE_S=60 INTERVAL_S=1 by default)
#
# Writes into $OUT:
#   nvml-capture.jsonl     one telemetry record per line (NvmlSource.collect every INTERVAL_S)
#   nvml-inventory.json    NvmlSource.inventory("capture") and devices(), at start and end
#   nvml-cost.json         CPU seconds per collection (per GPU), errors, RSS
#   nvml-probe.json        raw NVML answers used to check the field file: each field's
#                          way and result, NVLink throughput per link vs all links
#   nvidia-smi-q.txt       nvidia-smi -q (start), nvidia-smi-query.csv (start and end)
#   capture.log            what the script did
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:?set OUT to the folder for the capture}"
CAPTURE_S="${CAPTURE_S:-60}"
INTERVAL_S="${INTERVAL_S:-1}"
VENV="${VENV:-${TMPDIR:-/tmp}/gpuledger-nvml-venv}"
mkdir -p "$OUT"
exec > >(tee -a "$OUT/capture.log") 2>&1

QUERY="index,uuid,name,utilization.gpu,utilization.memory,memory.used,memory.total,power.draw,temperature.gpu,clocks.sm,pcie.link.gen.current,mig.mode.current"
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi -q > "$OUT/nvidia-smi-q.txt" 2>&1 || true
  nvidia-smi --query-gpu="$QUERY" --format=csv > "$OUT/nvidia-smi-query.csv" 2>&1 || true
  nvidia-smi topo -m > "$OUT/nvidia-smi-topo.txt" 2>&1 || true
else
  echo "nvidia-smi not found; capturing through NVML only"
fi

if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install --quiet --upgrade pip >/dev/null 2>&1 || true
"$VENV/bin/python" -m pip install --quiet -e ".[agent]"
echo "installed: $("$VENV/bin/python" -m pip list 2>/dev/null | grep -i -E 'nvidia-ml-py|gpuledger' | tr -s ' ' | tr '\n' ' ')"

"$VENV/bin/python" - "$OUT" "$CAPTURE_S" "$INTERVAL_S" <<'PY'
import json, resource, sys, time
from importlib.metadata import version
from pathlib import Path

import pynvml

from gpuledger.agent.sources.nvml import NvmlSource
from gpuledger.agent.sources.nvml_spec import load_field_spec

out, capture_s, interval_s = Path(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
source = NvmlSource("capture")
gpus = len(source.devices())
inventories = {"start": source.inventory("capture"), "devices": source.devices()}

# Probe: how each way of the field file answers on this GPU (before the source's own
# memory of unsupported ways hides it), and NVLink throughput per link vs all links.
probe = {"driver": source.driver_version, "nvidia-ml-py": version("nvidia-ml-py"),
         "ways": [], "nvlink": []}
spec = load_field_spec(pynvml)
for index in range(gpus):
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    except pynvml.NVMLError as err:
        probe["ways"].append({"gpu": index, "error": str(err)})
        continue
    for name, ways in spec.readers.items():
        for way in ways:
            entry = {"gpu": index, "field": name, "way": way.call or way.field_id}
            try:
                if way.call:
                    value = getattr(pynvml, way.call)(handle, *way.args)
                    entry["value"] = str(getattr(value, way.attr) if way.attr else value)
                else:
                    req = (way.field_id, way.scope) if way.scope is not None else way.field_id
                    fv = pynvml.nvmlDeviceGetFieldValues(handle, [req])[0]
                    entry["return"] = int(fv.nvmlReturn)
                    entry["value"] = int(fv.value.ullVal) if fv.nvmlReturn == 0 else None
            except pynvml.NVMLError as err:
                entry["error"] = str(err)
            probe["ways"].append(entry)
    for fid in (pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
                pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX):
        scopes = [0xFFFFFFFF, *range(int(pynvml.NVML_NVLINK_MAX_LINKS))]
        try:
            values = pynvml.nvmlDeviceGetFieldValues(handle, [(fid, s) for s in scopes])
            probe["nvlink"].append({"gpu": index, "field": fid, "by_scope": {
                str(s): (int(v.value.ullVal) if v.nvmlReturn == 0 else f"ret {v.nvmlReturn}")
                for s, v in zip(scopes, values)}})
        except pynvml.NVMLError as err:
            probe["nvlink"].append({"gpu": index, "field": fid, "error": str(err)})
(out / "nvml-probe.json").write_text(json.dumps(probe, indent=1))

costs = []
deadline = time.monotonic() + capture_s
with (out / "nvml-capture.jsonl").open("w") as f:
    while time.monotonic() < deadline:
        tick = time.monotonic()
        cpu = time.process_time()
        records = source.collect()
        costs.append(time.process_time() - cpu)
        for rec in records:
            f.write(json.dumps(rec) + "\n")
        f.flush()
        time.sleep(max(0.0, interval_s - (time.monotonic() - tick)))
inventories["end"] = source.inventory("capture")
(out / "nvml-inventory.json").write_text(json.dumps(inventories, indent=1))
steady = sorted(costs[1:]) or costs
(out / "nvml-cost.json").write_text(json.dumps({
    "gpus": gpus, "collections": len(costs), "errors": source.errors,
    "cpu_s_first": costs[0] if costs else None,
    "cpu_s_median": steady[len(steady) // 2] if steady else None,
    "cpu_s_max": max(steady) if steady else None,
    "cpu_ms_per_gpu_median": steady[len(steady) // 2] * 1000 / max(gpus, 1) if steady else None,
    "max_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}, indent=1))
source.close()
print(f"captured {len(costs)} collections of {gpus} GPU(s)")
PY

if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu="$QUERY" --format=csv,noheader >> "$OUT/nvidia-smi-query.csv" 2>&1 || true
fi
echo "done: $(ls "$OUT" | tr '\n' ' ')"
