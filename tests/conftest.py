"""Shared fixtures: run hand-written events through the real processor."""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import polars as pl
import pytest

sys.path.insert(0, str(Path(__file__).parent))

# templates of the catalog's views (catalog_template.py) in a folder of this run's own,
# for every test and the commands they start, not in the user's cache folder
if "GPULEDGER_CACHE_DIR" not in os.environ:
    os.environ["GPULEDGER_CACHE_DIR"] = tempfile.mkdtemp(prefix="gpuledger-test-cache-")
    atexit.register(shutil.rmtree, os.environ["GPULEDGER_CACHE_DIR"], True)

from events import frames
from kafka_fixtures import kafka  # noqa: F401
from s3_fixtures import s3, s3_env  # noqa: F401

from gpuledger.pipeline.config import ProcessorConfig
from gpuledger.pipeline.processor import Processor
from gpuledger.pipeline.warehouse import Warehouse, read_table


class Facts:
    """A processed warehouse, read back table by table."""

    def __init__(self, root: Path, processor: Processor) -> None:
        self.root = root
        self.processor = processor

    def table(self, name: str) -> pl.DataFrame:
        """A table's rows from its published files (``gpu_minute`` with its spans
        expanded, as the catalog's view does)."""
        frame = read_table(self.root, name)
        if name != "gpu_minute":
            return frame
        spans = self.table("gpu_span")
        if spans.is_empty():
            return frame
        minutes = spans.with_columns(pl.datetime_ranges(
            pl.col("minute"), pl.col("minute") + pl.duration(minutes=pl.col("minutes") - 1),
            "1m").alias("minute")).explode("minute").drop("minutes")
        return pl.concat([frame, minutes], how="diagonal_relaxed") if not frame.is_empty() \
            else minutes


@pytest.fixture
def process(tmp_path: Path) -> Callable[..., Facts]:
    """Process records (one batch, or a list of batches) and flush."""

    def run(records: Iterable[dict[str, Any]] | None = None, *,
            batches: list[list[dict[str, Any]]] | None = None,
            config: ProcessorConfig | None = None, validated: bool = True,
            name: str = "wh") -> Facts:
        root = tmp_path / name
        proc = Processor(config or ProcessorConfig(), Warehouse(root))
        for batch in batches or [list(records or [])]:
            proc.process(frames(batch), validated=validated)
        proc.flush()
        return Facts(root, proc)

    return run


from fake_nvml import fake_nvml_lib  # noqa: E402, F401  (the fake NVML driver, built once)
