"""Allocation exact to the second (docs/metrics.md, *Time grain*), computed by hand.

Every case runs twice: with spans for GPUs without telemetry (the default) and with a row
per GPU-minute (``spans=False``); both must give the same facts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import timedelta
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from conftest import Facts
from events import T0, alloc, at, frames, held_per_minute, inventory, job, series
from fact_views import assert_same_facts
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuledger.pipeline.config import ProcessorConfig
from gpuledger.pipeline.processor import Processor
from gpuledger.pipeline.warehouse import Warehouse

Records = list[dict[str, Any]]


def _run(root: Path, records: Iterable[dict[str, Any]], spans: bool = True) -> Facts:
    proc = Processor(ProcessorConfig(), Warehouse(root), spans=spans)
    proc.process(frames(list(records)), validated=True)
    proc.flush()
    return Facts(root, proc)


@pytest.fixture(params=[True, False], ids=["spans", "rows"])
def run(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[Records], Facts]:
    return lambda records: _run(tmp_path / "wh", records, spans=request.param)


def _attempts(facts: Facts) -> dict[tuple[str, int], dict[str, Any]]:
    return {(r["job_id"], r["attempt"]): r
            for r in facts.table("job_attempts").iter_rows(named=True)}


def test_30_seconds_on_8_gpus_is_4_gpu_minutes(run: Callable[[Records], Facts]) -> None:
    recs = [inventory("n1", at(0), gpus=8),
            job("submitted", "j", at(0), gpus=8),
            job("started", "j", at(1, 0), allocation=alloc("n1", *range(8))),
            job("finished", "j", at(1, 30)),
            job("submitted", "end", at(3))]   # the history goes on to 10:03
    facts = run(recs)
    att = _attempts(facts)[("j", 0)]
    assert att["allocated_gpu_hours"] * 60 == pytest.approx(4.0)
    assert att["job_gpu_hours"] * 60 == pytest.approx(4.0)
    gpus = facts.table("job_gpu").filter(pl.col("job_id") == "j")
    assert gpus.height == 8                       # every attempt × GPU has a row
    assert (gpus["allocated_gpu_hours"] * 3600).to_list() == pytest.approx([30.0] * 8)
    gm = facts.table("gpu_minute").filter(pl.col("minute") == at(1))
    assert gm.height == 8
    assert gm["alloc_fraction"].to_list() == pytest.approx([0.5] * 8)
    assert gm["state"].unique().to_list() == ["no_telemetry"]   # no samples: not idle
    hourly = facts.table("gpu_hourly")
    assert hourly["allocated_gpu_hours"].sum() * 60 == pytest.approx(4.0)
    assert hourly["no_telemetry_gpu_hours"].sum() * 60 == pytest.approx(4.0)
    assert hourly["gpu_hours"].sum() * 60 == pytest.approx(8 * 3)  # 10:00-10:03
    assert hourly["free_gpu_hours"].sum() * 60 == pytest.approx(8 * 3 - 4)


def test_start_and_end_inside_one_minute(run: Callable[[Records], Facts]) -> None:
    recs = [inventory("n1", at(0), gpus=1),
            job("submitted", "j", at(0)),
            job("started", "j", at(0, 10), allocation=alloc("n1", 0)),
            job("finished", "j", at(0, 40))]
    recs += series("n1", 0, at(0), 1, sm=0.6)
    recs += series("n1", 0, at(1), 1, sm=0.0, seq0=6)
    facts = run(recs)
    att = _attempts(facts)[("j", 0)]
    assert att["allocated_gpu_hours"] * 3600 == pytest.approx(30.0)
    assert att["used_gpu_hours"] * 3600 == pytest.approx(30.0 * 0.6)
    gm = facts.table("gpu_minute").sort("minute")
    assert gm["alloc_fraction"].to_list() == pytest.approx([0.5, 0.0])
    assert gm["state"].to_list() == ["allocated_busy", "free"]
    hourly = facts.table("gpu_hourly")
    # the half minute held is busy, the other half free: states add up to capacity
    assert hourly["allocated_busy_gpu_hours"].sum() * 60 == pytest.approx(0.5)
    assert hourly["free_gpu_hours"].sum() * 60 == pytest.approx(1.5)
    assert hourly["used_gpu_hours"].sum() * 60 == pytest.approx(0.3)


def test_from_20_seconds_into_one_minute_to_40_into_the_next(
    run: Callable[[Records], Facts],
) -> None:
    recs = [inventory("n1", at(0), gpus=2),
            job("submitted", "j", at(0), gpus=2),
            job("started", "j", at(0, 20), allocation=alloc("n1", 0, 1)),
            job("finished", "j", at(1, 40)),
            job("submitted", "end", at(2))]
    facts = run(recs)
    att = _attempts(facts)[("j", 0)]
    assert att["allocated_gpu_hours"] * 3600 == pytest.approx(2 * 80.0)
    gm = facts.table("gpu_minute").filter(pl.col("gpu_index") == 0).sort("minute")
    assert gm["alloc_fraction"].to_list() == pytest.approx([40 / 60, 40 / 60])


def test_a_requeue_inside_a_minute(run: Callable[[Records], Facts]) -> None:
    recs = [inventory("n1", at(0), gpus=2),
            job("submitted", "j", at(0)),
            job("started", "j", at(0, 0), allocation=alloc("n1", 0)),
            job("requeued", "j", at(0, 20), reason="node drain"),
            job("started", "j", at(0, 40), allocation=alloc("n1", 1)),
            job("finished", "j", at(1, 30)),
            job("submitted", "end", at(2))]
    facts = run(recs)
    att = _attempts(facts)
    assert att[("j", 0)]["allocated_gpu_hours"] * 3600 == pytest.approx(20.0)
    assert att[("j", 1)]["allocated_gpu_hours"] * 3600 == pytest.approx(50.0)
    assert att[("j", 1)]["queue_wait_s"] == pytest.approx(20.0)   # from the requeue
    gm = facts.table("gpu_minute").filter(pl.col("minute") == at(0)).sort("gpu_index")
    assert gm["alloc_fraction"].to_list() == pytest.approx([20 / 60, 20 / 60])
    assert gm["attempt"].to_list() == [0, 1]


@pytest.mark.parametrize("arrival", ["life cycle", "reversed"])
def test_preempted_requeued_and_started_in_the_same_second(
        run: Callable[[Records], Facts], arrival: str) -> None:
    """A scheduler that preempts a job, requeues it and starts it again in one second
    (the simulator does): the second attempt is kept, whatever order the three events
    of that second arrive in (found at 50 simulated hours: the restart was ranked
    before the preemption and rejected, and a 75 s attempt vanished)."""
    same_second = [job("preempted", "j", at(1, 30)),
                   job("requeued", "j", at(1, 30), reason="preempted"),
                   job("started", "j", at(1, 30), allocation=alloc("n1", 1))]
    if arrival == "reversed":
        same_second.reverse()
    recs = [inventory("n1", at(0), gpus=2),
            job("submitted", "j", at(0)),
            job("started", "j", at(0, 0), allocation=alloc("n1", 0)),
            *same_second,
            job("preempted", "j", at(2, 45)),
            job("requeued", "j", at(2, 45), reason="preempted"),
            job("submitted", "end", at(4))]
    facts = run(recs)
    att = _attempts(facts)
    assert att[("j", 0)]["allocated_gpu_hours"] * 3600 == pytest.approx(90.0)
    assert att[("j", 1)]["allocated_gpu_hours"] * 3600 == pytest.approx(75.0)
    assert facts.table("rejects").is_empty()
    gm = facts.table("gpu_minute").filter(pl.col("job_id") == "j").sort("minute", "gpu_index")
    assert [(r["minute"], r["gpu_index"], r["attempt"]) for r in gm.iter_rows(named=True)] \
        == [(at(0), 0, 0), (at(1), 0, 0), (at(1), 1, 1), (at(2), 1, 1)]


@pytest.mark.parametrize("second", [0, 10])
def test_an_attempt_that_ends_the_instant_it_starts_has_its_gpu_rows(
        run: Callable[[Records], Facts], second: int) -> None:
    """A job that fails as it starts (Slurm's one-second times make it 0 s): 0 GPU-hours,
    yet a ``job_gpu`` row per GPU, with the node's card, as every attempt × GPU has. It
    had none: nothing of it fell into a minute. A GPU no inventory knows gets no row,
    as it gets no charge."""
    recs = [inventory("n1", at(0), gpus=4, card="H100"),
            job("submitted", "j", at(0), gpus=3),
            job("started", "j", at(1, second), allocation=alloc("n1", 0, 1, 7)),
            job("failed", "j", at(1, second)),
            job("submitted", "end", at(3))]
    facts = run(recs)
    att = _attempts(facts)[("j", 0)]
    assert att["allocated_gpu_hours"] == 0 and att["job_gpu_hours"] == 0
    gpus = facts.table("job_gpu").filter(pl.col("job_id") == "j").sort("gpu_index")
    assert gpus["gpu_index"].to_list() == [0, 1]             # GPU 7 is not on n1
    assert gpus["card_type"].to_list() == ["H100", "H100"]
    assert gpus["allocated_gpu_hours"].to_list() == [0.0, 0.0]
    assert gpus["ended_at"].to_list() == [at(1, second)] * 2
    assert facts.table("gpu_minute").filter(pl.col("job_id") == "j").is_empty()


def test_two_jobs_share_one_gpu_inside_a_minute(run: Callable[[Records], Facts]) -> None:
    recs = [inventory("n1", at(0), gpus=1, card="L40S-48GB", mem=46_068.0)]
    for name, start, end in (("a", at(0, 0), at(0, 30)), ("b", at(0, 15), at(0, 45))):
        recs += [job("submitted", name, at(0), team=f"team-{name}"),
                 job("started", name, start, allocation=alloc("n1", 0, fraction=0.5)),
                 job("finished", name, end)]
    recs.append(job("submitted", "end", at(1)))
    facts = run(recs)
    att = _attempts(facts)
    for name in ("a", "b"):
        assert att[(name, 0)]["allocated_gpu_hours"] * 3600 == pytest.approx(0.5 * 30)
        assert att[(name, 0)]["job_gpu_hours"] * 3600 == pytest.approx(30.0)
    gm = facts.table("gpu_minute").filter(pl.col("minute") == at(0)).row(0, named=True)
    assert gm["alloc_fraction"] == pytest.approx(0.5)       # 0.5 × 30 s + 0.5 × 30 s
    assert gm["occupied_share"] == pytest.approx(45 / 60)  # someone held it 0:00–0:45
    assert gm["jobs_on_gpu"] == 2
    hourly = facts.table("gpu_hourly")
    by_team = {r["team"]: r for r in hourly.iter_rows(named=True)}
    for name in ("a", "b"):   # each team charged its own share, not the whole GPU
        assert by_team[f"team-{name}"]["allocated_gpu_hours"] * 60 == pytest.approx(0.25)
        assert by_team[f"team-{name}"]["job_gpu_hours"] * 60 == pytest.approx(0.5)
    assert hourly["occupied_gpu_hours"].sum() * 60 == pytest.approx(0.75)
    assert hourly["gpu_hours"].sum() * 60 == pytest.approx(1.0)
    assert hourly["free_gpu_hours"].sum() * 60 == pytest.approx(0.5)


def test_minute_aligned_history_gives_whole_minutes(run: Callable[[Records], Facts]) -> None:
    recs = [inventory("n1", at(0), gpus=4),
            job("submitted", "j", at(0), gpus=2),
            job("started", "j", at(2), allocation=alloc("n1", 0, 1)),
            job("finished", "j", at(7))]
    recs += series("n1", 0, at(0), 9, sm=0.5)
    facts = run(recs)
    gm = facts.table("gpu_minute")
    assert set(gm["alloc_fraction"].unique().to_list()) <= {0.0, 1.0}
    assert _attempts(facts)[("j", 0)]["allocated_gpu_hours"] * 60 == pytest.approx(10.0)


def _history(seed: int) -> Records:
    """Jobs on a two-node cluster with a telemetry stream on some GPUs (the rest spans)."""
    import random
    rnd = random.Random(seed)
    recs: Records = [inventory("n1", at(0), gpus=4), inventory("n2", at(0), gpus=2)]
    for i in range(12):
        start = at(seconds=rnd.randrange(0, 3600))
        end = start + timedelta(seconds=rnd.randrange(1, 5400))
        node, gpus = ("n1", 4) if rnd.random() < 0.6 else ("n2", 2)
        recs += [job("submitted", f"j{i}", at(0), gpus=1),
                 job("started", f"j{i}", start, allocation=alloc(
                     node, rnd.randrange(gpus), fraction=rnd.choice([1.0, 0.5, 0.25]))),
                 job("finished", f"j{i}", end)]
    recs += series("n1", 0, at(0), 150, sm=0.4)
    recs += series("n2", 1, at(30), 40, sm=0.1)
    return recs


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_spans_give_the_facts_of_a_row_per_minute(tmp_path: Path, seed: int) -> None:
    records = _history(seed)
    _run(tmp_path / "spans", records, spans=True)
    _run(tmp_path / "rows", records, spans=False)
    assert list((tmp_path / "spans" / "facts" / "gpu_span").glob("date=*/*.parquet"))
    assert_same_facts(tmp_path / "spans", tmp_path / "rows",
                      ("blocked_minute", "preemptions", "pending_minute", "candidates",
                       "recommendations", "running_attempts"))


@st.composite
def _intervals(draw: st.DrawFn) -> list[tuple[int, int, int, float]]:
    """(gpu, start s, length s, fraction) — fractional ones may overlap on a GPU."""
    n = draw(st.integers(1, 8))
    return [(draw(st.integers(0, 3)), draw(st.integers(0, 7200)), draw(st.integers(1, 7200)),
             draw(st.sampled_from([1.0, 0.5, 0.3]))) for _ in range(n)]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(_intervals())
def test_allocated_seconds_add_up_to_the_intervals(
    tmp_path_factory: pytest.TempPathFactory, intervals: list[tuple[int, int, int, float]],
) -> None:
    """For random interval sets, Σ (alloc_fraction × 60 s) over the minute facts equals
    Σ (length × fraction) of the intervals, to the second — per GPU and per minute."""
    recs: Records = [inventory("n1", at(0), gpus=4)]
    for i, (gpu, start, length, fraction) in enumerate(intervals):
        s = T0 + timedelta(seconds=start)
        recs += [job("submitted", f"j{i}", at(0)),
                 job("started", f"j{i}", s, allocation=alloc("n1", gpu, fraction=fraction)),
                 job("finished", f"j{i}", s + timedelta(seconds=length))]
    recs.append(job("submitted", "end", at(300)))
    facts = _run(tmp_path_factory.mktemp("prop"), recs)
    gm = facts.table("gpu_minute")
    want_total = sum(length * fraction for _, _, length, fraction in intervals)
    assert gm["alloc_fraction"].sum() * 60 == pytest.approx(want_total, abs=1e-4)
    for gpu in {g for g, _, _, _ in intervals}:
        want = held_per_minute(
            (T0 + timedelta(seconds=s), T0 + timedelta(seconds=s + n), f)
            for g, s, n, f in intervals if g == gpu)
        got = {m: v for m, v in gm.filter(pl.col("gpu_index") == gpu).select(
            "minute", "alloc_fraction").iter_rows() if v > 0}
        assert set(got) == set(want)
        for m, v in want.items():
            assert got[m] == pytest.approx(v, abs=1e-8), m
    att = facts.table("job_attempts")
    assert att["allocated_gpu_hours"].sum() * 3600 == pytest.approx(want_total, abs=1e-4)


def test_two_jobs_given_the_same_whole_gpu_are_counted_as_overcommitted(
        run: Callable[[Records], Facts], caplog: pytest.LogCaptureFixture) -> None:
    """docs/metrics.md, *Overcommitted GPUs*: GPU 0 given whole to a and b for 10 minutes
    (b from 10:00:30): alloc_fraction keeps the sum, capacity is never exceeded, each job
    keeps its own share, and the overcommitted GPU-minutes are counted and said."""
    recs = [inventory("n1", at(0), gpus=2),
            job("submitted", "a", at(0)), job("started", "a", at(0), allocation=alloc("n1", 0)),
            job("submitted", "b", at(0)),
            job("started", "b", at(0, 30), allocation=alloc("n1", 0)),
            job("finished", "a", at(10)), job("finished", "b", at(10, 30)),
            job("submitted", "end", at(12))]
    facts = run(recs)
    gm = facts.table("gpu_minute").filter((pl.col("gpu_index") == 0)
                                          & (pl.col("minute") < at(11))).sort("minute")
    assert gm["alloc_fraction"].to_list() == pytest.approx([1.5] + [2.0] * 9 + [0.5])
    assert facts.processor.counters.overcommitted_gpu_minutes == 10   # 10:00 to 10:09
    assert "10 GPU-minute(s) had allocations summing to more than the whole GPU" in caplog.text
    hourly = facts.table("gpu_hourly").filter(pl.col("gpu_index") == 0) \
        if "gpu_index" in facts.table("gpu_hourly").columns else facts.table("gpu_hourly")
    # the GPU's capacity: 11 minutes held at most, once, whatever the sum of the shares
    assert hourly["allocated_gpu_hours"].sum() * 60 == pytest.approx(10.5)
    att = _attempts(facts)
    assert att[("a", 0)]["job_gpu_hours"] * 60 == pytest.approx(10.0)
    assert att[("b", 0)]["job_gpu_hours"] * 60 == pytest.approx(10.0)
