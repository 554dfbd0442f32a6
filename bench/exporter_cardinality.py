"""Exporter cardinality and scrape cost under the demo workload.

The built-in 576-GPU cluster, 24 simulated hours, 60-second samples: the most series per
metric family seen over the run (one scrape every 20 batches) and the time one scrape
takes. Run: ``.venv/bin/python bench/exporter_cardinality.py``.
"""

from __future__ import annotations

import collections
import tempfile
import time
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from gpuledger.pipeline.config import ProcessorConfig
from gpuledger.pipeline.exporter import Exporter
from gpuledger.pipeline.processor import Processor
from gpuledger.pipeline.simulate import SimConfig, simulate
from gpuledger.pipeline.warehouse import Warehouse


def main() -> None:
    proc = Processor(ProcessorConfig(), Warehouse(Path(tempfile.mkdtemp())))
    exporter = Exporter(proc.config)
    exporter.attach(proc)
    most: collections.Counter[str] = collections.Counter()
    total = 0
    scrapes: list[float] = []
    t0 = time.monotonic()
    for i, batch in enumerate(simulate(SimConfig(hours=24, seed=7, sample_interval_s=60))):
        proc.process(batch)
        if i % 20:
            continue
        t1 = time.perf_counter()
        text = exporter.render().decode()
        scrapes.append(time.perf_counter() - t1)
        now = collections.Counter({f.name: len(f.samples)
                                   for f in text_string_to_metric_families(text)})
        for name, n in now.items():
            most[name] = max(most[name], n)
        total = max(total, sum(now.values()))
    scrapes.sort()
    print(f"run {time.monotonic() - t0:.0f} s, {len(scrapes)} scrapes, most series {total}, "
          f"scrape p50 {scrapes[len(scrapes) // 2] * 1000:.0f} ms, "
          f"max {scrapes[-1] * 1000:.0f} ms")
    for name, n in sorted(most.items()):
        print(f"{name:50} {n}")


if __name__ == "__main__":
    main()
