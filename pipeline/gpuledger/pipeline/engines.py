"""Which Polars engine runs each of the processor's lazy plans.

Polars 2 runs ``LazyFrame.collect()`` on its streaming engine unless told otherwise
(eager ``DataFrame`` methods always run in memory). Two things decide the engine of a
plan (bench/README.md, *Engines*):

- **Cost.** A close step runs tens of joins and group-bys over thousands to a few
  hundred thousand GPU-minute rows; the in-memory engine starts a plan for less and
  runs these 10–20 % cheaper in all (576 GPUs and 9,216, 10 s samples). Grouping
  millions of samples into GPU-minutes is the other way round: streaming did a million
  samples' partials in 0.38× the CPU.
- **Memory.** With the partials of batches under 300,000 samples and their merge (kept
  until their minutes close) on the in-memory engine too, a catch-up through Kafka
  peaked at 3.9 GiB instead of 1.2 GiB (``catch_up.py --hours 0.5``: 30 minutes of
  9,216 GPUs at 1 s); with those on streaming and only the step's own frames in memory
  it peaked at 1.15 GiB. Why was not pinned down (a suspect: in-memory results that
  keep their inputs' buffers alive while they are held across polls). So results kept
  past the step that made them, and plans that read a whole batch of samples, run
  streaming.

Every plan gives the same rows on either engine (float sums may differ in the last bit,
as between any two runs of a parallel sum; facts are written rounded, ``warehouse.py``).
"""

from __future__ import annotations

import polars as pl


def step_frame(plan: pl.LazyFrame) -> pl.DataFrame:
    """Run a plan whose result lives only within one close step (its GPU rows, job rows,
    inventory runs, allocation pieces, free-GPU histogram): in memory."""
    return plan.collect(engine="in-memory")


def kept_frame(plan: pl.LazyFrame) -> pl.DataFrame:
    """Run a plan whose result is kept across batches or close steps (telemetry
    partials, job memory, job usage, roll-up partials) or that reads a whole batch of
    samples: streaming."""
    return plan.collect(engine="streaming")
