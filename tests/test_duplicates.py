"""Duplicates count once in every fact (job memory and shared GPUs included), whatever
batches they come in: ingesting any input twice, or with any subset repeated, gives the
same facts as ingesting it once."""

from __future__ import annotations

import itertools
import random
from datetime import timedelta
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from events import alloc, at, frames, inventory, job, telemetry
from fact_views import assert_same_facts
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuledger.pipeline.config import ProcessorConfig
from gpuledger.pipeline.processor import Processor
from gpuledger.pipeline.warehouse import Warehouse

SPARSE = ("blocked_minute", "preemptions", "pending_minute", "candidates", "recommendations",
          "running_attempts")


def _history() -> list[dict[str, Any]]:
    """Two nodes; a whole-GPU job and two jobs sharing one GPU, with their processes."""
    recs: list[dict[str, Any]] = [inventory("n1", at(0), gpus=2),
                                  inventory("n2", at(0), gpus=1, card="L40S-48GB", mem=46_068.0)]
    recs += [job("submitted", "w", at(0), gpus=2),
             job("started", "w", at(0, 20), allocation=alloc("n1", 0, 1)),
             job("finished", "w", at(14, 40))]
    for name in ("a", "b"):
        recs += [job("submitted", name, at(0), job_type="inference"),
                 job("started", name, at(1), allocation=alloc("n2", 0, fraction=0.5)),
                 job("finished", name, at(12))]
    rnd = random.Random(5)
    for i in range(90):  # 15 minutes every 10 s
        t = at(0) + timedelta(seconds=10 * i)
        for gpu in (0, 1):
            recs.append(telemetry("n1", gpu, t, sm=rnd.random(), mem=20_000 + 100 * i,
                                  jobs=["w"], seq=2 * i + gpu))
        shared = telemetry("n2", 0, t, util=rnd.uniform(0, 100), mem=9_000.0,
                           card="L40S-48GB", total=46_068.0, seq=i)
        shared["processes"] = [{"pid": 1, "used_mib": 4_000.0 + 10 * i, "job_id": "a"},
                               {"pid": 2, "used_mib": 5_000.0 - 10 * i, "job_id": "b"}]
        recs.append(shared)
    recs.append(job("submitted", "end", at(16)))
    return sorted(recs, key=lambda r: r["time"])


def _run(root: Path, batches: list[list[dict[str, Any]]]) -> Processor:
    proc = Processor(ProcessorConfig(), Warehouse(root))
    for batch in batches:
        proc.process(frames(batch), validated=True)
    proc.flush()
    return proc


def _batches(recs: list[dict[str, Any]], cuts: list[int]) -> list[list[dict[str, Any]]]:
    edges = [0, *sorted({c % len(recs) for c in cuts}), len(recs)]
    return [recs[a:b] for a, b in itertools.pairwise(edges) if b > a]


def test_every_batch_sent_twice_gives_the_same_facts(tmp_path: Path) -> None:
    """An agent or a producer retrying: each batch arrives twice in a row."""
    recs = _history()
    batches = _batches(recs, [100, 250, 300])
    once = _run(tmp_path / "once", batches)
    twice = _run(tmp_path / "twice", [b for batch in batches for b in (batch, batch)])
    # a repeat of a sample whose minute the first copy already closed is late (kept in
    # late_telemetry, once: its file merges by sample); the rest are counted as repeats
    c = twice.counters
    assert c.duplicate_samples + c.late_telemetry == once.counters.records_in["telemetry"]
    assert c.duplicate_samples > c.late_telemetry
    assert c.duplicate_job_events > 0
    assert_same_facts(tmp_path / "twice", tmp_path / "once", SPARSE)
    att = pl.read_parquet(tmp_path / "twice" / "facts" / "job_attempts" / "**" / "*.parquet")
    peaks = dict(att.select("job_id", "mem_peak_mib").iter_rows())
    assert peaks["a"] == 4_000.0 + 10 * 71 and peaks["b"] == 5_000.0 - 10 * 6  # own processes


@pytest.fixture(scope="module")
def once(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The history, each record once, in one batch."""
    base = tmp_path_factory.mktemp("base")
    _run(base, [_history()])
    return base


@settings(max_examples=8, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(repeat=st.lists(st.integers(0, 10_000), min_size=1, max_size=40),
       cuts=st.lists(st.integers(0, 10_000), max_size=4), seed=st.integers(0, 1000))
def test_any_subset_repeated_anywhere_gives_the_same_facts(
    tmp_path_factory: pytest.TempPathFactory, once: Path, repeat: list[int], cuts: list[int],
    seed: int,
) -> None:
    recs = _history()
    base = once
    extra = [recs[i % len(recs)] for i in repeat]
    mixed = list(recs)
    rnd = random.Random(seed)
    for r in extra:  # each repeat lands next to its original, or a little later
        i = mixed.index(r)
        mixed.insert(min(len(mixed), i + rnd.randrange(0, 40)), r)
    got = tmp_path_factory.mktemp("dup")
    proc = _run(got, _batches(mixed, cuts))
    assert proc.counters.late_telemetry == 0
    assert_same_facts(got, base, SPARSE)



def test_samples_that_disagree_give_the_same_facts_in_any_order(tmp_path: Path) -> None:
    """Found by shuffling an input: two samples of one GPU at one second that disagree
    (util 50 and 0, as a relay that resends a corrected reading) gave allocated_busy
    read in one order and allocated_idle in the other: the first read was kept. The one
    with the least hash of its values is kept now, whatever the order."""
    t0 = at(0)
    recs = [inventory("n1", t0, gpus=1), job("submitted", "j", t0),
            job("started", "j", t0, allocation=alloc("n1", 0))]
    recs += [telemetry("n1", 0, t0 + timedelta(seconds=10 * i), util=0.5, sm=0.5, seq=i,
                       jobs=["j"]) for i in range(12)]
    recs.append(job("finished", "j", t0 + timedelta(minutes=2)))
    other = telemetry("n1", 0, t0 + timedelta(seconds=60), util=0.0, sm=0.0, seq=6,
                      jobs=["j"])
    roots = []
    for name, order in (("first", [*recs, other]), ("last", [*recs[:3], other, *recs[3:]]),
                        ("reversed", [*recs[:3], other, *reversed(recs[3:-1]), recs[-1]])):
        proc = Processor(ProcessorConfig(), Warehouse(tmp_path / name))
        proc.process(frames(order), validated=True)
        proc.flush()
        roots.append(tmp_path / name)
    for root in roots[1:]:
        assert_same_facts(root, roots[0], SPARSE)
