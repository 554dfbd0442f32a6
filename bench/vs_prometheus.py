"""gpuledger beside Prometheus on the same GPU samples, in one run.

Simulates HOURS of the default cluster (576 GPUs; ``--scale`` multiplies it) at
INTERVAL-second samples and hands the same samples to both:

- **Prometheus**: written as OpenMetrics text with the 16 DCGM fields a dcgm-exporter
  scrape carries per GPU (one series per field and GPU, labels as dcgm-exporter's:
  ``gpu``, ``UUID``, ``Hostname``, ``modelName``), then loaded by Debian's
  ``promtool tsdb create-blocks-from openmetrics`` into TSDB blocks (what a backfill or
  two hours of scrapes leave on disk). Writing the text is not counted; promtool's CPU
  (user + system of the child) is.
- **gpuledger**: the samples published to the embedded bus as Arrow messages, processed
  by the engine into the warehouse (decode, validation, facts, Parquet writes), CPU of
  this process (all threads).

Reports GPU-samples per CPU-second for each, their ratio, and bytes on disk per
GPU-minute: the Prometheus blocks against the fact files (``gpu_minute`` alone, and the
whole warehouse with roll-ups, job and cluster facts). Goal (issue 11): ≥ 10× Prometheus
per core, and ≤ 1/10 of its bytes per GPU-minute. Usage:

    python bench/vs_prometheus.py [--hours 1] [--interval 10] [--scale 1] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import polars as pl
from cluster_scale import scaled_cluster

from gpuledger.pipeline.bus import EmbeddedBus
from gpuledger.pipeline.config import ProcessorConfig
from gpuledger.pipeline.processor import Processor
from gpuledger.pipeline.simulate import SimConfig, simulate
from gpuledger.pipeline.warehouse import Warehouse

# our column → the dcgm-exporter metric (and a scale to its unit)
DCGM: dict[str, tuple[str, float]] = {
    "util_gpu": ("DCGM_FI_DEV_GPU_UTIL", 1.0),
    "sm_active": ("DCGM_FI_PROF_SM_ACTIVE", 1.0),
    "sm_occupancy": ("DCGM_FI_PROF_SM_OCCUPANCY", 1.0),
    "tensor_active": ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", 1.0),
    "dram_active": ("DCGM_FI_PROF_DRAM_ACTIVE", 1.0),
    "mem_used_mib": ("DCGM_FI_DEV_FB_USED", 1.0),
    "mem_free_mib": ("DCGM_FI_DEV_FB_FREE", 1.0),
    "power_w": ("DCGM_FI_DEV_POWER_USAGE", 1.0),
    "temp_c": ("DCGM_FI_DEV_GPU_TEMP", 1.0),
    "sm_clock_mhz": ("DCGM_FI_DEV_SM_CLOCK", 1.0),
    "pcie_rx_bytes_s": ("DCGM_FI_PROF_PCIE_RX_BYTES", 1.0),
    "pcie_tx_bytes_s": ("DCGM_FI_PROF_PCIE_TX_BYTES", 1.0),
    "nvlink_rx_bytes_s": ("DCGM_FI_PROF_NVLINK_RX_BYTES", 1.0),
    "nvlink_tx_bytes_s": ("DCGM_FI_PROF_NVLINK_TX_BYTES", 1.0),
    "xid_errors": ("DCGM_FI_DEV_XID_ERRORS", 1.0),
    "ecc_dbe": ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", 1.0),
}


def _openmetrics(telemetry: pl.DataFrame, path: Path) -> int:
    """Write the samples as OpenMetrics text, one metric family after the other, each
    series' samples in time order; the number of samples written."""
    tel = telemetry.with_columns(
        (pl.col("mem_total_mib") - pl.col("mem_used_mib")).alias("mem_free_mib"),
        (pl.col("time").cast(pl.Int64) / 1000).alias("_ts"))
    labels = (pl.lit('{gpu="') + pl.col("gpu_index").cast(pl.String) + pl.lit('",UUID="')
              + pl.col("gpu_uuid").fill_null("") + pl.lit('",Hostname="') + pl.col("node")
              + pl.lit('",modelName="') + pl.col("card_type").fill_null("") + pl.lit('"}'))
    written = 0
    with open(path, "w", encoding="utf-8") as out:
        for column, (metric, scale) in DCGM.items():
            rows = tel.filter(pl.col(column).is_not_null()).sort(["node", "gpu_index", "time"])
            if rows.is_empty():
                continue
            out.write(f"# TYPE {metric} gauge\n")
            lines = rows.select(pl.lit(metric) + labels + pl.lit(" ")
                                + (pl.col(column) * scale).cast(pl.String) + pl.lit(" ")
                                + pl.col("_ts").cast(pl.String))
            out.write("\n".join(lines.to_series().to_list()))
            out.write("\n")
            written += rows.height
        out.write("# EOF\n")
    return written


def _tree_bytes(root: Path, pattern: str = "**/*") -> int:
    return sum(f.stat().st_size for f in root.glob(pattern) if f.is_file())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hours", type=float, default=1.0)
    parser.add_argument("--interval", type=int, default=10, help="sample interval, s")
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    if shutil.which("promtool") is None:
        sys.exit("vs_prometheus: promtool is not installed (Debian package prometheus)")
    sim = SimConfig(hours=args.hours, chunk_minutes=10, sample_interval_s=args.interval,
                    cluster=scaled_cluster(args.scale))
    bus = EmbeddedBus()
    tel_parts: list[pl.DataFrame] = []
    pending: list[dict[str, pl.DataFrame]] = []
    for batch in simulate(sim):
        tel_parts.append(batch["telemetry"])
        pending.append(batch)
        if len(pending) == 6:  # hourly bus batches, as bench/processor_throughput.py
            bus.publish_batch({k: pl.concat([b[k] for b in pending]) for k in pending[0]})
            pending = []
    if pending:
        bus.publish_batch({k: pl.concat([b[k] for b in pending]) for k in pending[0]})
    telemetry = pl.concat(tel_parts)
    samples = telemetry.height
    gpu_minutes = telemetry.select(pl.struct(pl.col("time").dt.truncate("1m"), "node",
                                             "gpu_index").n_unique()).item()
    result: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"), "hours": args.hours, "interval_s": args.interval,
        "scale": args.scale, "gpu_samples": samples, "gpu_minutes": gpu_minutes,
        "loadavg_at_start": os.getloadavg(),
        "promtool": subprocess.run(["promtool", "--version"], capture_output=True,
                                   text=True).stdout.splitlines()[0],
    }
    with tempfile.TemporaryDirectory(prefix="vs-prometheus-") as tmp_name:
        tmp = Path(tmp_name)
        text = tmp / "samples.om"
        prom_samples = _openmetrics(telemetry, text)
        del telemetry, tel_parts
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", "-q",
                        str(text), str(tmp / "blocks")], check=True)
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        prom_cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        prom_bytes = _tree_bytes(tmp / "blocks")
        result["prometheus"] = {
            "series_samples": prom_samples, "openmetrics_bytes": text.stat().st_size,
            "cpu_s": round(prom_cpu, 2), "wall_s": round(wall, 2),
            "gpu_samples_per_cpu_s": round(samples / prom_cpu),
            "block_bytes": prom_bytes,
            "bytes_per_gpu_minute": round(prom_bytes / gpu_minutes, 1),
        }
        text.unlink()
        print("prometheus", result["prometheus"], file=sys.stderr, flush=True)

        root = tmp / "warehouse"
        proc = Processor(ProcessorConfig(), Warehouse(root))
        c0, w0 = time.process_time(), time.perf_counter()
        for batch in bus.batches():
            proc.process(batch)
        proc.flush()
        cpu, wall = time.process_time() - c0, time.perf_counter() - w0
        facts = _tree_bytes(root / "facts", "**/*.parquet")
        minute_bytes = _tree_bytes(root / "facts" / "gpu_minute", "**/*.parquet")
        result["gpuledger"] = {
            "cpu_s": round(cpu, 2), "wall_s": round(wall, 2),
            "gpu_samples_per_cpu_s": round(samples / cpu),
            "fact_bytes": facts, "gpu_minute_bytes": minute_bytes,
            "bytes_per_gpu_minute_all_facts": round(facts / gpu_minutes, 1),
            "bytes_per_gpu_minute_gpu_minute": round(minute_bytes / gpu_minutes, 1),
        }
        print("gpuledger", result["gpuledger"], file=sys.stderr, flush=True)
    p, g = result["prometheus"], result["gpuledger"]
    result["ratios"] = {
        "speed_per_core": round(g["gpu_samples_per_cpu_s"] / p["gpu_samples_per_cpu_s"], 2),
        "bytes_all_facts_vs_blocks": round(g["bytes_per_gpu_minute_all_facts"]
                                           / p["bytes_per_gpu_minute"], 3),
        "bytes_gpu_minute_vs_blocks": round(g["bytes_per_gpu_minute_gpu_minute"]
                                            / p["bytes_per_gpu_minute"], 3),
    }
    result["goal"] = {"speed_per_core": ">= 10", "bytes": "<= 0.1"}
    result["loadavg_at_end"] = os.getloadavg()
    out = json.dumps(result, indent=2)
    print(out)
    if args.json:
        args.json.write_text(out + "\n")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    main()
