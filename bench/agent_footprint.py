"""Node agent footprint: CPU time per collection cycle per GPU, and resident memory.

Runs the real command, ``gpuledger agent``, in a child process against the fake NVML
driver (``tests/fake_nvml``: the real ``pynvml`` bindings over a compiled
``libnvidia-ml.so.1`` answering from a scenario), with Slurm attribution on a generated
proc root (one process per GPU, two jobs), a real Kafka broker started here
(``tests/kafka_broker.py``; ``--bootstrap`` to use one of yours, ``--no-kafka`` to let
the agent spool against an unreachable broker) and the self-metrics endpoint on.
The agent collects every ``--interval`` seconds, much faster than in production (10 s),
so that many cycles fit in the measurement window; after ``--warmup`` seconds the
child's CPU time (user + system, all threads, from ``/proc/<pid>/stat``) and its cycle
count (``gpuledger_agent_samples_total`` / GPUs) are read at the start and end of a
``--seconds`` window:

    CPU per cycle per GPU = Δ CPU time / (Δ cycles × GPUs)

which includes everything the agent does per cycle: NVML calls, attribution, encoding,
spooling, the sender thread's Kafka production, the threads' idle wake-ups and the
scrapes of /metrics by this script (every ``--scrape`` seconds, default 15, as a
Prometheus would). Resident memory: ``VmRSS`` at the end and ``VmHWM`` (peak).
Targets (issue 4): ≤ 1 ms CPU per GPU per cycle, ≤ 60 MB RSS.

Prints one JSON object. Usage:

    python bench/agent_footprint.py [--gpus 8] [--interval 0.1] [--seconds 30]
        [--warmup 5] [--scrape 15] [--bootstrap HOST:PORT | --no-kafka]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from fake_nvml import MIB, Scenario, build, nvml_env  # noqa: E402
from proctree import add_process  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS    # utime + stime


def _status_kib(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def _samples(port: int) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("gpuledger_agent_samples_total "):
                return float(line.split()[1])
    return 0.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _scenario(folder: Path, gpus: int) -> Path:
    sc = Scenario(gpus=gpus)
    for i in range(gpus):
        sc.set(f"g{i}", name="NVIDIA H100 80GB HBM3",
               uuid=f"GPU-{i:08d}-0000-4000-8000-000000000000", util_gpu=50 + i % 40,
               util_mem=20, mem_total=81559 * MIB, mem_used=(40000 + i) * MIB,
               power=400_000 + i, temp=60, clock_sm=1980, pcie_tx=1000, pcie_rx=2000,
               nvlinks=18, processes=f"{1000 + i}:{(40000 + i) * MIB}")
    return sc.write(folder / "scenario.txt")


def _proc_root(folder: Path, gpus: int) -> Path:
    proc = folder / "proc"
    add_process(proc, 1, 0)
    for i in range(gpus):
        job = 101 if i < gpus // 2 else 202
        add_process(proc, 1000 + i, 1,
                    cgroup=f"0::/system.slice/slurmstepd.scope/job_{job}/step_0/task_0")
    return proc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--interval", type=float, default=0.1)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--warmup", type=float, default=5.0)
    ap.add_argument("--scrape", type=float, default=15.0,
                    help="seconds between scrapes of /metrics during the window")
    ap.add_argument("--bootstrap", default=None)
    ap.add_argument("--no-kafka", action="store_true")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    with ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="agent-bench-")))
        lib = build(work / "lib")
        if args.no_kafka:
            bootstrap = f"127.0.0.1:{_free_port()}"   # nothing listens: the agent spools
        elif args.bootstrap:
            bootstrap = args.bootstrap
        else:
            from kafka_broker import start_broker

            broker = start_broker(work / "kafka")
            stack.callback(broker.stop)
            bootstrap = broker.bootstrap
            for topic in ("gpu.telemetry.v1", "gpu.inventory.v1"):
                broker.create_topic(topic, partitions=3)
        port = _free_port()
        config = {
            "node": "bench-node", "source": "nvml", "interval_s": args.interval,
            "attribution": {"methods": ["slurm"], "proc_root": str(_proc_root(work, args.gpus)),
                            "cgroup_root": str(work / "cgroup")},
            "inventory": {"pool": "bench"},
            "kafka": {"bootstrap": bootstrap, "send_timeout_s": 5},
            "spool": {"path": str(work / "spool")},
            "metrics": {"listen": f"127.0.0.1:{port}"},
        }
        (work / "agent.yaml").write_text(yaml.safe_dump(config))
        env = nvml_env(lib, _scenario(work, args.gpus))
        proc = subprocess.Popen([sys.executable, "-m", "gpuledger.cli.main", "agent",
                                 "--config", str(work / "agent.yaml")], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

        def stop() -> None:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
        stack.callback(stop)
        deadline = time.monotonic() + 60
        while True:
            try:
                _samples(port)
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"the agent did not start: {proc.stderr.read()!r}"
                                     if proc.stderr else "the agent did not start") from None
                time.sleep(0.2)
        time.sleep(args.warmup)
        cpu0, n0, t0 = _cpu_s(proc.pid), _samples(port), time.monotonic()
        while time.monotonic() - t0 < args.seconds:
            time.sleep(min(args.scrape, max(0.0, args.seconds - (time.monotonic() - t0))))
            _samples(port)                                 # a Prometheus-like scrape
        cpu1, n1, t1 = _cpu_s(proc.pid), _samples(port), time.monotonic()
        rss_kib, hwm_kib = _status_kib(proc.pid, "VmRSS"), _status_kib(proc.pid, "VmHWM")
        cycles = (n1 - n0) / args.gpus
        result: dict[str, Any] = {
            "gpus": args.gpus, "interval_s": args.interval, "window_s": round(t1 - t0, 2),
            "scrape_s": args.scrape,
            "kafka": "none (spooling)" if args.no_kafka else bootstrap,
            "cycles": int(cycles), "cpu_s": round(cpu1 - cpu0, 3),
            "cpu_ms_per_cycle": round(1000 * (cpu1 - cpu0) / cycles, 3),
            "cpu_ms_per_gpu_per_cycle": round(1000 * (cpu1 - cpu0) / cycles / args.gpus, 4),
            "rss_mib": round(rss_kib / 1024, 1), "peak_rss_mib": round(hwm_kib / 1024, 1),
            "python": platform.python_version(), "machine": platform.machine(),
            "cpus": os.cpu_count(), "date": time.strftime("%Y-%m-%d", time.gmtime()),
        }
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
