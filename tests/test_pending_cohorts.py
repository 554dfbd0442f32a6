"""Pending and blocked demand are counted per cohort of alike jobs (a sweep over the
pending intervals' ends), never a row per job and minute: the facts must equal a count
of each job at each minute's middle, done by hand."""

from __future__ import annotations

import tempfile
from collections import Counter
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import polars as pl
from conftest import Facts
from events import T0, alloc, frames, inventory, job
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuledger.pipeline.config import ProcessorConfig
from gpuledger.pipeline.facts.minutes import (
    expand_to_minutes,
    middle_span,
    sweep_minutes,
    to_time,
)
from gpuledger.pipeline.processor import Processor
from gpuledger.pipeline.warehouse import Warehouse

END_S = 1800  # the history's last event: 30 minutes after T0
CARD = "H100-SXM5-80GB"


def _history(pending: list[tuple[int, int | None, int, str, str | None]]) -> list[dict[str, Any]]:
    """Four 8-GPU nodes with (3, 1, 4, 0) free GPUs throughout: 8 free, largest block 4,
    no whole node free; so a job of 5 to 8 GPUs is blocked, one of 1-4 fits and one
    of more than 8 is short of GPUs. Then the ``pending`` jobs: (submitted at, seconds
    until cancelled or None, GPUs, team, card type)."""
    recs: list[dict[str, Any]] = [inventory(f"n{i}", T0, gpus=8) for i in range(4)]
    for node, n in {"n0": 5, "n1": 7, "n2": 4, "n3": 8}.items():
        recs += [job("submitted", f"hold-{node}", T0, gpus=n),
                 job("started", f"hold-{node}", T0, allocation=alloc(node, *range(n)))]
    for i, (at_s, wait_s, gpus, team, card) in enumerate(pending):
        recs.append(job("submitted", f"p{i}", T0 + timedelta(seconds=at_s), gpus=gpus,
                        team=team, card_type=card))
        if wait_s is not None and at_s + wait_s < END_S:
            recs.append(job("cancelled", f"p{i}", T0 + timedelta(seconds=at_s + wait_s)))
    recs.append(job("checkpointed", "hold-n0", T0 + timedelta(seconds=END_S)))
    return recs


def _by_hand(pending: list[tuple[int, int | None, int, str, str | None]]
             ) -> tuple[Counter[tuple[datetime, str, int]], Counter[tuple[datetime, str]]]:
    """Jobs pending at each minute's middle per (minute, team, GPUs), and the blocked
    ones per (minute, job)."""
    jobs: Counter[tuple[datetime, str, int]] = Counter()
    blocked: Counter[tuple[datetime, str]] = Counter()
    for i, (at_s, wait_s, gpus, team, _card) in enumerate(pending):
        end_s = END_S + 60 if wait_s is None or at_s + wait_s >= END_S else at_s + wait_s
        for m in range(END_S // 60):
            if at_s <= m * 60 + 30 < end_s:
                minute = T0 + timedelta(minutes=m)
                jobs[(minute, team, gpus)] += 1
                if 5 <= gpus <= 8:
                    blocked[(minute, f"p{i}")] += 1
    return jobs, blocked


_JOBS = st.lists(st.tuples(st.integers(0, END_S - 1),
                           st.one_of(st.none(), st.integers(1, END_S)),
                           st.sampled_from([1, 2, 4, 5, 6, 8, 16]),
                           st.sampled_from(["vision", "speech"]),
                           st.sampled_from([CARD, None])), max_size=12)


@settings(max_examples=20, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(_JOBS)
def test_pending_and_blocked_facts_equal_a_count_by_hand(
        tmp_path: Path, pending: list[tuple[int, int | None, int, str, str | None]]) -> None:
    root = Path(tempfile.mkdtemp(dir=tmp_path)) / "wh"  # hypothesis may repeat an example
    proc = Processor(ProcessorConfig(), Warehouse(root))
    proc.process(frames(_history(pending)), validated=True)
    proc.flush()
    facts = Facts(root, proc)
    jobs, blocked = _by_hand(pending)

    pend = facts.table("pending_minute")
    got = pend.group_by("minute", "team").agg(pl.col("pending_jobs").sum(),
                                              pl.col("pending_gpus").sum(),
                                              pl.col("blocked_jobs").sum())
    want: dict[tuple[datetime, str], list[int]] = {}
    for (minute, team, gpus), n in jobs.items():
        row = want.setdefault((minute, team), [0, 0, 0])
        row[0] += n
        row[1] += n * gpus
        row[2] += n if 5 <= gpus <= 8 else 0
    assert {(r["minute"], r["team"]): [r["pending_jobs"], r["pending_gpus"], r["blocked_jobs"]]
            for r in got.iter_rows(named=True)} == want

    rows = facts.table("blocked_minute")
    assert Counter(zip(rows["minute"], rows["job_id"], strict=True)) == blocked
    assert (rows["free_gpus"] == 8).all() and (rows["largest_free_block"] == 4).all()

    frag = facts.table("frag_minute")
    per_minute = Counter[datetime]()
    for (minute, _team, _gpus), n in jobs.items():
        per_minute[minute] += n
    assert {r["minute"]: r["pending_jobs"] for r in frag.iter_rows(named=True)
            if r["pending_jobs"]} == dict(per_minute)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.integers(-120, 900), st.one_of(st.none(), st.integers(0, 900)),
                          st.sampled_from(["a", "b", None])), max_size=20))
def test_a_sweep_counts_what_a_row_per_interval_and_minute_counts(
        spans: list[tuple[int, int | None, str | None]]) -> None:
    frame = pl.DataFrame(
        {"start": [T0 + timedelta(seconds=s) for s, _, _ in spans],
         "end": [None if d is None else T0 + timedelta(seconds=s + d) for s, d, _ in spans],
         "key": [k for _, _, k in spans]},
        schema={"start": pl.Datetime("ms", "UTC"), "end": pl.Datetime("ms", "UTC"),
                "key": pl.String()})
    a, b = T0, T0 + timedelta(minutes=10)
    rows = expand_to_minutes(frame, "start", "end", a, b)
    want = Counter(zip(rows["minute"], rows["key"], strict=True))
    swept = sweep_minutes(middle_span(frame, "start", "end", a, b), ["key"], "_first",
                          "_stop").with_columns(to_time(pl.col("minute"))).collect()
    assert {(r["minute"], r["key"]): r["n"] for r in swept.iter_rows(named=True)} == dict(want)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.integers(-120, 3_000), st.one_of(st.none(), st.integers(0, 3_000))),
                max_size=20), st.integers(1, 13), st.integers(0, 9))
def test_a_sampled_expansion_is_the_full_one_on_the_grid(
        spans: list[tuple[int, int | None]], every: int, offset: int) -> None:
    """``expand_to_minutes(..., every)`` (whatif's sampled grid: months of intervals are
    not expanded to every minute first) gives the rows of the full expansion whose minute
    is ``range_start + k·every``."""
    frame = pl.DataFrame(
        {"start": [T0 + timedelta(seconds=s) for s, _ in spans],
         "end": [None if d is None else T0 + timedelta(seconds=s + d) for s, d in spans],
         "i": list(range(len(spans)))},
        schema={"start": pl.Datetime("ms", "UTC"), "end": pl.Datetime("ms", "UTC"),
                "i": pl.Int64()})
    a, b = T0 + timedelta(minutes=offset), T0 + timedelta(minutes=50)
    full = expand_to_minutes(frame, "start", "end", a, b)
    on_grid = full.filter(((pl.col("minute") - a).dt.total_minutes() % every) == 0)
    sampled = expand_to_minutes(frame, "start", "end", a, b, every)
    assert sampled.sort("i", "minute").equals(on_grid.sort("i", "minute"))
