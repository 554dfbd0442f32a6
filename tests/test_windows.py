"""Event-time windows: out-of-order, late and duplicated events (docs/metrics.md)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import polars as pl
import pytest
from conftest import Facts
from events import alloc, at, frames, inventory, job, series

from gpuledger.pipeline import query
from gpuledger.pipeline.config import ProcessorConfig
from gpuledger.pipeline.processor import Processor
from gpuledger.pipeline.warehouse import Warehouse


def _base() -> list[dict[str, object]]:
    recs: list[dict[str, object]] = [inventory("n1", at(0), gpus=2),
                                     job("submitted", "j", at(0)),
                                     job("started", "j", at(0), allocation=alloc("n1", 0))]
    recs += series("n1", 0, at(0), 20, sm=0.6, jobs=["j"])
    recs += series("n1", 1, at(0), 20, sm=0.0, seq0=500)
    return recs


def _gpu_minutes(facts: Facts) -> pl.DataFrame:
    return facts.table("gpu_minute").sort("minute", "node", "gpu_index").drop("date")


def test_out_of_order_within_lateness_gives_the_same_facts(process: Callable[..., Facts]) -> None:
    recs = _base()
    in_order = process(recs, name="a")
    tel = [r for r in recs if r["type"] == "telemetry"]
    minutes = [[r for r in tel if r["time"].minute == m] for m in range(20)]  # type: ignore[union-attr]
    batches = [recs[:3]]
    for m in range(0, 20, 2):  # swap each pair of minutes, reverse inside each batch
        batches.append(list(reversed(minutes[m + 1])))
        batches.append(list(reversed(minutes[m])))
    out_of_order = process(batches=batches, name="b")
    assert out_of_order.processor.counters.late_telemetry == 0
    assert _gpu_minutes(in_order).equals(_gpu_minutes(out_of_order))


def test_duplicates_are_harmless(process: Callable[..., Facts]) -> None:
    recs = _base()
    once = process(recs, name="once")
    twice = process(batches=[recs, recs[:3] + recs[3:200]], name="twice")
    assert _gpu_minutes(once).equals(_gpu_minutes(twice))
    assert twice.processor.counters.duplicate_job_events == 3 - 1  # submitted, started
    assert once.table("job_attempts").height == 0  # still running


def test_late_telemetry_is_kept_and_counted_not_merged(process: Callable[..., Facts]) -> None:
    recs = _base()
    early = [r for r in recs if r["type"] != "telemetry" or r["time"] < at(2)]
    rest = [r for r in recs if r["type"] == "telemetry" and r["time"] >= at(2)]
    late = series("n1", 1, at(0), 1, sm=0.9, seq0=900)  # minute 10:00, arrives at the end
    facts = process(batches=[early, rest, late], name="late")
    ref = process(recs, name="ref")
    assert _gpu_minutes(facts).equals(_gpu_minutes(ref))      # closed minutes untouched
    assert facts.processor.counters.late_telemetry == len(late)
    kept = facts.table("late_telemetry")
    assert kept.height == len(late)
    assert kept["sm_active"].to_list() == [0.9] * len(late)
    # and analysts read them through the catalog (there was no view: docs/metrics.md
    # named a table no query could reach)
    _cols, rows = query.run(facts.root, "SELECT count(*), min(sm_active), max(sm_active), "
                            "min(minute) FROM late_telemetry")
    assert rows == [(len(late), 0.9, 0.9, at(0))]
    _cols, rows = query.run(ref.root, "SELECT count(*) FROM late_telemetry")
    assert rows == [(0,)]


def test_late_job_event_updates_job_facts(process: Callable[..., Facts]) -> None:
    recs = _base()
    finish = job("finished", "j", at(10))
    facts = process(batches=[recs, [finish]], name="latejob")
    att = facts.table("job_attempts")
    assert att["ended_at"].to_list() == [at(10)]
    assert facts.processor.counters.late_job_events == 1


def _allocated_ms(facts: Facts) -> float:
    """Allocated GPU-milliseconds in the minute facts (alloc_fraction is capped at 1)."""
    gm = facts.table("gpu_minute")
    return float(gm.select(pl.col("alloc_fraction").clip(upper_bound=1.0).sum()).item()) \
        * 60_000


def test_late_job_events_say_how_far_closed_facts_are_off(
        process: Callable[..., Facts], caplog: pytest.LogCaptureFixture) -> None:
    """A job's end (or start) that arrives after its minute closed leaves the closed
    minutes charged as the book stood (closed facts are not rewritten). Before, nothing
    said so: job ``j`` ended at 10:10 and was charged 17 minutes, exit status 0. The
    counters now hold the error each way, to the millisecond of what the facts hold."""
    recs = _base()
    end = job("finished", "j", at(10))
    late_start = [job("submitted", "k", at(3)),
                  job("started", "k", at(4, 30), allocation=alloc("n1", 1))]
    on_time = process(batches=[[*recs, end, *late_start]], name="ontime")
    with caplog.at_level(logging.WARNING, logger="gpuledger"):
        late = process(batches=[recs, [end, *late_start]], name="late")
    c = late.processor.counters
    # the first batch's samples run to 10:19:50; 120 s of lateness: closed up to 10:17
    assert c.late_job_max_ms == (17 - 3) * 60_000      # k's submission, at 10:03
    assert c.late_overcharged_ms == (17 - 10) * 60_000       # j: 10:10 to 10:17
    assert c.late_undercharged_ms == (17 - 4.5) * 60_000     # k: 10:04:30 to 10:17
    # exactly what the facts got wrong
    assert _allocated_ms(late) - _allocated_ms(on_time) == pytest.approx(
        c.late_overcharged_ms - c.late_undercharged_ms)
    assert on_time.processor.counters.late_overcharged_ms == 0
    said = [r.getMessage() for r in caplog.records if "charged to attempts after" in r.msg]
    assert len(said) == 1 and "windows.allowed_lateness_s" in said[0], said


def test_watermark_closes_minutes_only_after_lateness(process: Callable[..., Facts]) -> None:
    recs = _base()
    from gpuledger.pipeline.config import ProcessorConfig, Windows

    facts = process(batches=[recs], config=ProcessorConfig(windows=Windows(allowed_lateness_s=300)),
                    name="wm")
    proc = facts.processor
    # after flush every minute with an event is closed
    assert proc.closed_until == at(20)


def test_sequence_gaps_and_duplicate_samples_are_counted(process: Callable[..., Facts]) -> None:
    recs = [inventory("n1", at(0), gpus=1)]
    samples = series("n1", 0, at(0), 10, sm=0.2)              # seq 0..59
    kept = [s for s in samples if not 10 <= s["seq"] < 15]    # 5 samples lost on the way
    repeated = kept[20:23]                                    # 3 delivered twice
    facts = process(batches=[recs + kept[:30], kept[30:] + repeated])
    c = facts.processor.counters
    assert c.telemetry_lost_samples == 5
    assert c.duplicate_samples == 3
    assert facts.table("gpu_minute")["telemetry_samples"].sum() == 55


def test_two_starts_of_one_job_at_one_time_give_the_same_facts_in_any_order(
        process: Callable[..., Facts]) -> None:
    """Two 'started' of one job at the same instant naming different GPUs: which was
    charged depended on the input's order, and the other was counted as a duplicate.
    One is kept whatever the order (the first by allocation), the other is rejected."""
    head = [inventory("n1", at(0), gpus=2), job("submitted", "j", at(0))]
    starts = [job("started", "j", at(1), allocation=alloc("n1", 0)),
              job("started", "j", at(1), allocation=alloc("n1", 1))]
    tail = [job("finished", "j", at(3)), job("submitted", "end", at(5))]
    runs = [process(head + order + tail, name=f"o{i}")
            for i, order in enumerate((starts, starts[::-1]))]
    charged = [r.table("job_gpu").select("node", "gpu_index").rows() for r in runs]
    assert charged[0] == charged[1] and len(charged[0]) == 1
    for r in runs:
        rejects = r.table("rejects")
        assert rejects.height == 1
        assert "again at the same time with other GPUs" in rejects["reason"][0]


def test_a_job_history_sent_again_is_duplicates_and_its_new_attempt(
        process: Callable[..., Facts]) -> None:
    """A feed restarted after its job was preempted and started again on another GPU
    sends the job's whole history again. The first attempt's `started` was refused as
    a second start on other GPUs (the job held its new attempt's GPUs by then), or, sent
    only from the new attempt on, the new `started` while the book still ran the first:
    one of the two attempts lost either way. Now the events seen are duplicates."""
    first = [inventory("n1", at(0), gpus=2), job("submitted", "j", at(0)),
             job("started", "j", at(1), allocation=alloc("n1", 0))]
    whole = [job("submitted", "j", at(0)),
             job("started", "j", at(1), allocation=alloc("n1", 0)),
             job("preempted", "j", at(5)), job("requeued", "j", at(5, 30)),
             job("started", "j", at(7), allocation=alloc("n1", 1))]
    end = [job("finished", "j", at(10)), job("submitted", "later", at(12))]
    facts = process(batches=[first, whole, whole, end])
    assert facts.table("rejects").is_empty()
    attempts = facts.table("job_attempts").sort("attempt")
    assert attempts["attempt"].to_list() == [0, 1]
    assert attempts["allocated_gpu_hours"].to_list() == pytest.approx([4 / 60, 3 / 60])
    assert facts.processor.jobs.counters.duplicates == 2 + 5


def test_events_before_a_window_are_early_not_late(tmp_path: Path) -> None:
    """A window of a history (``begin_at``) counts the events before its first minute
    early, not late, while no minute is closed: they only update the books, and no
    closed minute is wrong for them. Before, every one was counted late (and ingest
    had to take them back out of the late counters by hand). An event before the window
    that comes once minutes are closed is late: it changed what those minutes held."""
    proc = Processor(ProcessorConfig(), Warehouse(tmp_path / "w"))
    proc.begin_at(at(5))
    proc.process(frames([inventory("n1", at(0), gpus=2), job("submitted", "j", at(1)),
                         job("started", "j", at(2), allocation=alloc("n1", 0)),
                         *series("n1", 0, at(5), 20, sm=0.5, jobs=["j"])]),
                 validated=True)
    c = proc.counters
    assert (c.early_job_events, c.early_inventory) == (2, 1)
    assert (c.late_job_events, c.late_inventory, c.late_job_max_ms) == (0, 0, 0)
    assert proc.closed_until is not None and proc.closed_until > at(5)
    proc.process(frames([job("finished", "j", at(4)), inventory("n1", at(4), gpus=2)]),
                 validated=True)
    assert (c.early_job_events, c.early_inventory) == (2, 1)
    assert (c.late_job_events, c.late_inventory) == (1, 1)
    assert c.late_overcharged_ms > 0   # j held its GPU in the closed minutes from 10:05
