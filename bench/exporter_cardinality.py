"""Exporter cardinality and scrape cost under the demo workload (built-in 576-GPU cluster,
24 simulated hours, 60-second samples): the most series per metric family seen over the
run (a scrape every 20 batches) and the time one scrape takes. Run:
.venv/bin/python bench/exporter_cardinality.py"""

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

p = Processor(ProcessorConfig(), Warehouse(Path(tempfile.mkdtemp())))
ex = Exporter(p.config); ex.attach(p)
mx = collections.Counter(); tot = 0; rt = []
t0 = time.time()
for i, b in enumerate(simulate(SimConfig(hours=24, seed=7, sample_interval_s=60))):
    p.process(b)
    if i % 20 == 0:
        t1 = time.perf_counter(); txt = ex.render().decode(); rt.append(time.perf_counter() - t1)
        c = collections.Counter()
        for f in text_string_to_metric_families(txt):
            c[f.name] += len(f.samples)
        for k, v in c.items(): mx[k] = max(mx[k], v)
        tot = max(tot, sum(c.values()))
print("wall", time.time() - t0, "max series", tot, "render p50/max ms", sorted(rt)[len(rt)//2]*1000, max(rt)*1000)
for k, v in sorted(mx.items()): print(k, v)
