"""Which Polars engine runs each of the processor's lazy plans.

Polars 2 runs ``LazyFrame.collect()`` on its streaming engine unless told otherwise
(eager ``DataFrame`` methods always run in memory). The processor's plans are of two
kinds, and each is cheaper on a different engine (bench/README.md, *Engines*):

- **over GPU-minutes**: a close step's joins and group-bys of inventory runs,
  allocation pieces and per-minute telemetry, tens of plans per step, each over
  thousands to a few hundred thousand rows. The in-memory engine starts a plan for less
  and runs these 13–20 % cheaper in all (576 GPUs and 9,216, 10 s samples);
- **over samples**: a batch's job memory and per-GPU-minute partials, up to millions
  of samples. Streaming is cheaper for job memory at every size measured (207,000 to
  a million samples: 0.68–0.7× the CPU) and for the partials from about 300,000
  samples (a million: 0.38×); below that the partials are a little cheaper in memory
  (``SAMPLES_STREAMING_FROM``).

Every plan gives the same rows on either engine; only the CPU differs.
"""

from __future__ import annotations

import polars as pl

SAMPLES_STREAMING_FROM = 300_000
"""Partials of at least this many samples run streaming."""


def over_minutes(plan: pl.LazyFrame) -> pl.DataFrame:
    """Run a plan over a close step's GPU-minutes (in memory)."""
    return plan.collect(engine="in-memory")


def over_samples(plan: pl.LazyFrame) -> pl.DataFrame:
    """Run a plan over a batch's samples (streaming)."""
    return plan.collect(engine="streaming")


def partials_of(plan: pl.LazyFrame, samples: int) -> pl.DataFrame:
    """Run the per-GPU-minute partials of ``samples`` samples: streaming from
    ``SAMPLES_STREAMING_FROM`` samples, in memory below."""
    return plan.collect(engine="streaming" if samples >= SAMPLES_STREAMING_FROM
                        else "in-memory")
