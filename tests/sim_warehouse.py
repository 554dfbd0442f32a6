"""A small simulated warehouse (the built-in cluster, 3 hours, 30-second samples).

Built through the real simulator and processor on the embedded bus (about 4 s), for the
tests of the analyst SQL, the report and the dashboards' SQL panels.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from gpuledger.pipeline.advisor.diagnosis_batch import diagnose_warehouse
from gpuledger.pipeline.config import ProcessorConfig
from gpuledger.pipeline.demo import run_demo
from gpuledger.pipeline.simulate import SimConfig
from gpuledger.pipeline.warehouse import read_table

SIM_HOURS = 3.0


def build(root: Path, diagnose: bool = True) -> Path:
    """Simulate and process into ``root``, and diagnose it as ``gpuledger demo`` does
    (``diagnose``); return it."""
    run_demo(SimConfig(hours=SIM_HOURS, seed=7, sample_interval_s=30), ProcessorConfig(), root)
    if diagnose:
        diagnose_warehouse(root)
    return root


def table(root: Path, name: str) -> pl.DataFrame:
    """A fact table read straight from its published Parquet files (the schema file
    included)."""
    return read_table(root, name)
