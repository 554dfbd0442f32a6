"""Analysts can query while the processor writes (DuckDB's one-writer rule respected)."""

from __future__ import annotations

from collections.abc import Callable

from conftest import Facts
from events import alloc, at, inventory, job, series

from gpuledger.pipeline import query
from gpuledger.pipeline.config import ProcessorConfig
from gpuledger.pipeline.processor import Processor
from gpuledger.pipeline.warehouse import Warehouse


def test_reader_keeps_working_while_the_processor_publishes(
    process: Callable[..., Facts],
) -> None:
    first = [inventory("n1", at(0), gpus=1), job("submitted", "a", at(0)),
             job("started", "a", at(0), allocation=alloc("n1", 0)), job("finished", "a", at(5))]
    first += series("n1", 0, at(0), 5, sm=0.5)
    root = process(first).root
    reader = query.connect(root)               # read-only, held open throughout
    assert reader.execute("SELECT count(*) FROM job_attempts").fetchone() == (1,)

    # a second processor run adds the next hour while the reader is connected
    later = [inventory("n1", at(60), gpus=1), job("submitted", "b", at(60)),
             job("started", "b", at(60), allocation=alloc("n1", 0)),
             job("finished", "b", at(65))]
    later += series("n1", 0, at(60), 5, sm=0.5)
    from events import frames

    proc = Processor(ProcessorConfig(), Warehouse(root))
    proc.process(frames(later), validated=True)
    proc.flush()                                # publishes the next generation

    # the open connection still answers, from the generation it opened (snapshot reads:
    # the files it names are kept for warehouse.retain_s); a new one sees the next
    assert reader.execute("SELECT count(*) FROM job_attempts").fetchone() == (1,)
    reader.close()
    _, rows = query.run(root, "SELECT job_id FROM job_attempts ORDER BY job_id")
    assert rows == [("a",), ("b",)]
