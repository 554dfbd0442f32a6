"""Facts summed over close steps do not depend on how the minutes were stepped.

One instance or two, a restart or a rebalance cut the same minutes into different close
steps. The accumulators that add up across steps (a job's usage per GPU, an hour's
roll-up partials) are fixed-point integers (``facts/fixed.py``), so every grouping gives
the same bits. With float accumulators these tests fail: the same rows, added in another
grouping, differ in the last bits.
"""

from __future__ import annotations

import itertools
import random

import polars as pl
import pytest

from gpuledger.pipeline.config import ProcessorConfig
from gpuledger.pipeline.facts import fixed, job_usage, rollup
from gpuledger.pipeline.facts.gpu_state import STATES

HOUR_MS = 3_600_000


def _job_rows(rng: random.Random, n: int) -> pl.DataFrame:
    """``n`` job rows of 3 attempts on 4 GPUs: the columns ``minute_usage`` reads."""
    return pl.DataFrame({
        "job_id": [f"j{rng.randrange(3)}" for _ in range(n)],
        "attempt": [1] * n,
        "node": ["n1"] * n,
        "gpu_index": [rng.randrange(4) for _ in range(n)],
        "partition": [0] * n,
        "card_type": ["H100"] * n,
        "gpu_mem_total_mib": [81559.0] * n,
        "fraction": [rng.choice([0.25, 0.5, 1.0]) for _ in range(n)],
        "share": [rng.randrange(1, 61) / 60 * rng.choice([0.25, 0.5, 1.0]) for _ in range(n)],
        "n_minutes": [rng.choice([1, 1, 1, 7]) for _ in range(n)],
        "held": [rng.randrange(1, 61) / 60 for _ in range(n)],
        "activity": [rng.random() for _ in range(n)],
        "telemetry_samples": [rng.choice([0, 6, 6, 6]) for _ in range(n)],
        "mem_used_mib": [rng.uniform(0, 80000) for _ in range(n)],
        "job_mem_mib": [rng.uniform(0, 40000) for _ in range(n)],
        "state": [rng.choice(["allocated_busy"] * 5 + ["unavailable"]) for _ in range(n)],
    })


def _steps(rng: random.Random, frame: pl.DataFrame) -> list[pl.DataFrame]:
    """``frame`` cut into consecutive steps at random places, and the steps shuffled."""
    cuts = sorted(rng.sample(range(1, frame.height), rng.randrange(1, 12)))
    bounds = [0, *cuts, frame.height]
    steps = [frame.slice(a, b - a) for a, b in itertools.pairwise(bounds)]
    rng.shuffle(steps)
    return steps


@pytest.mark.parametrize("seed", range(5))
def test_job_usage_is_the_same_however_the_minutes_are_stepped(seed: int) -> None:
    rng = random.Random(seed)
    rows = _job_rows(rng, 3000)
    config = ProcessorConfig()

    def stepped(steps: list[pl.DataFrame]) -> pl.DataFrame:
        acc = pl.DataFrame(schema=job_usage.ACC_SCHEMA)
        for step in steps:
            acc = job_usage.merge(acc, job_usage.minute_usage(step.lazy(), config))
        return acc

    whole = stepped([rows])
    per_gpu = job_usage.per_gpu(whole).sort(job_usage.ACC_KEYS)
    attempts = job_usage.attempt_usage(whole, config).sort("job_id")
    for _ in range(4):
        acc = stepped(_steps(rng, rows))
        assert job_usage.per_gpu(acc).sort(job_usage.ACC_KEYS).equals(per_gpu)
        assert job_usage.attempt_usage(acc, config).sort("job_id").equals(attempts)
    # and the facts are what the rows say, within half a unit per row
    bound = rows.height * 0.5 / fixed.UNITS_PER_HOUR
    charged = rows.filter(pl.col("state") != "unavailable")  # the GPU's time, not the job's
    seen = charged.filter(pl.col("telemetry_samples") > 0)
    used = (seen["share"] * seen["n_minutes"] * seen["activity"]).sum() / 60
    assert attempts["used_gpu_hours"].sum() == pytest.approx(used, rel=0, abs=bound)
    alloc = (charged["share"] * charged["n_minutes"]).sum() / 60
    assert attempts["allocated_gpu_hours"].sum() == pytest.approx(alloc, rel=0, abs=bound)


def _share_rows(rng: random.Random, n: int) -> pl.DataFrame:
    """``n`` share rows over 2 hours, 2 pools and 2 teams: what ``hourly_partial`` reads."""
    return pl.DataFrame({
        "hour_ms": [rng.randrange(2) * HOUR_MS for _ in range(n)],
        "partition": [0] * n,
        "pool": [rng.choice(["train", "infer"]) for _ in range(n)],
        "card_type": ["H100"] * n,
        "team": [rng.choice(["core", "vision", None]) for _ in range(n)],
        "queue": ["prod"] * n,
        "job_type": ["training"] * n,
        "state": [rng.choice(STATES) for _ in range(n)],
        "w": [rng.randrange(1, 61) / 60 * rng.choice([0.25, 1.0]) for _ in range(n)],
        "used": [rng.random() / 3 for _ in range(n)],
        "occupied": [rng.randrange(1, 61) / 60 for _ in range(n)],
        "job_gpu": [rng.randrange(1, 61) / 60 for _ in range(n)],
    })


@pytest.mark.parametrize("seed", range(5))
def test_hourly_rollup_is_the_same_however_the_minutes_are_stepped(seed: int) -> None:
    rng = random.Random(seed)
    rows = _share_rows(rng, 4000)

    def stepped(steps: list[pl.DataFrame]) -> pl.DataFrame:
        partials = [rollup.hourly_partial(step.lazy()).collect() for step in steps]
        return rollup.hourly(pl.concat(partials))

    whole = stepped([rows])
    for _ in range(4):
        assert stepped(_steps(rng, rows)).equals(whole)
    bound = rows.height * 0.5 / fixed.UNITS_PER_HOUR
    assert whole["used_gpu_hours"].sum() == pytest.approx(rows["used"].sum() / 60, abs=bound)


def test_float_accumulators_from_an_older_checkpoint_are_converted() -> None:
    """A checkpoint written before fixed point holds float GPU-minutes (accumulators) and
    float GPU-hours (roll-up partials); loading converts them, to the same facts."""
    rng = random.Random(1)
    config = ProcessorConfig()
    acc = job_usage.minute_usage(_job_rows(rng, 500).lazy(), config)
    old = acc.with_columns(fixed.to_minutes(pl.col(c)).alias(c) for c in job_usage.SUMMED)
    assert old.schema["used_min"] == pl.Float64
    assert job_usage.conform(old).equals(acc)
    partial = rollup.hourly_partial(_share_rows(rng, 500).lazy()).collect()
    old_partial = partial.with_columns(fixed.to_hours(pl.col(m)).alias(m)
                                       for m in rollup.MEASURES)
    assert rollup.conform(old_partial).equals(partial)
    assert rollup.conform(partial) is partial  # already units: untouched
