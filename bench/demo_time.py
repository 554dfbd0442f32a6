"""Wall time of the README's demo (default: 576 GPUs, 24 simulated hours, 10 s samples).

Runs ``gpuledger demo --quiet`` as a user would, in a fresh process, and reports the
wall time and the peak RSS of that process. Target: ≤ 60 s on 2 cores. Usage:

    python bench/demo_time.py [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    exe = shutil.which("gpuledger") or str(Path(sys.executable).with_name("gpuledger"))
    walls = []
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory() as tmp:
            t = time.perf_counter()
            subprocess.run([exe, "demo", "--quiet", "--warehouse", f"{tmp}/wh"], check=True,
                           capture_output=True)
            walls.append(time.perf_counter() - t)
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(json.dumps({"runs": walls, "median_wall_s": statistics.median(walls),
                      "peak_rss_mib": round(peak, 1)}))


if __name__ == "__main__":
    main()
