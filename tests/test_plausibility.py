"""Input that cannot fabricate facts (issue 12): a clock running ahead, a line from a wrong
year, telemetry of GPUs no inventory knows, impossible memory, job events out of order.
Each is set aside with its reason and counted; the good facts stay as they are."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from conftest import Facts
from events import alloc, at, frames, inventory, job, jsonl, series, telemetry
from fact_views import assert_same_facts

from gpuledger.cli.main import main
from gpuledger.pipeline.config import ProcessorConfig
from gpuledger.pipeline.ingest import IngestResult, ingest
from gpuledger.pipeline.partitions import Partitioning
from gpuledger.pipeline.processor import Processor
from gpuledger.pipeline.warehouse import Warehouse, read_table

SPARSE = ("blocked_minute", "preemptions", "pending_minute", "candidates", "recommendations",
          "running_attempts")


def _fleet(minutes: int = 20) -> list[dict[str, Any]]:
    recs: list[dict[str, Any]] = []
    for n in range(12):
        recs.append(inventory(f"n{n}", at(0), gpus=2))
        for g in range(2):
            recs += series(f"n{n}", g, at(0), minutes, sm=0.4, seq0=1000 * g)
    recs += [job("submitted", "j", at(0), gpus=2),
             job("started", "j", at(1), allocation=alloc("n0", 0, 1)),
             job("finished", "j", at(15))]
    return recs


def _live(root: Path, batches: list[list[dict[str, Any]]]) -> Processor:
    proc = Processor(ProcessorConfig(), Warehouse(root), telemetry_clock=True)
    for batch in batches:
        proc.process(frames(batch), validated=True)
    proc.flush()
    return proc


def _minutes_by_time(recs: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """One batch per minute of event time, in order (as a live stream arrives)."""
    out: dict[Any, list[dict[str, Any]]] = {}
    for r in sorted(recs, key=lambda r: r["time"]):
        out.setdefault(r["time"].replace(second=0), []).append(r)
    return [out[k] for k in sorted(out)]


def test_a_node_clock_ahead_neither_moves_the_windows_nor_makes_facts(tmp_path: Path) -> None:
    good = _fleet()
    _live(tmp_path / "good", _minutes_by_time(good))
    skewed = [dict(r) for r in good]
    # node n5's clock runs 50 minutes ahead from minute 5 on
    for r in skewed:
        if r["type"] == "telemetry" and r["node"] == "n5" and r["time"] >= at(5):
            r["time"] = r["time"] + timedelta(minutes=50)
    batches = _minutes_by_time([r for r in skewed if not (r.get("node") == "n5"
                                                         and r["time"] >= at(50))])
    ahead = [r for r in skewed if r.get("node") == "n5" and r["time"] >= at(50)]
    for i, batch in enumerate(batches[5:], 5):  # n5's skewed samples arrive with minute i
        batch += [r for r in ahead if r["time"] - timedelta(minutes=50) < at(i + 1)
                  and r["time"] - timedelta(minutes=50) >= at(i)]
    proc = _live(tmp_path / "skewed", batches)
    assert proc.counters.ahead_telemetry == len(ahead)
    assert proc.counters.late_telemetry == 0           # nobody's minute closed early
    rejects = read_table(tmp_path / "skewed", "rejects")
    assert rejects.height == len(ahead)
    assert rejects["reason"].str.contains("ahead of the fleet").all()
    gm = Facts(tmp_path / "skewed", proc).table("gpu_minute")
    assert gm["minute"].max() < at(21)                 # no minute fabricated up to 10:70
    # n5's minutes from 10:05 have no telemetry (its samples were rejected), the rest is
    # exactly the good run's
    assert gm.filter((pl.col("node") == "n5") & (pl.col("minute") >= at(5)))[
        "telemetry_samples"].max() == 0
    good_gm = Facts(tmp_path / "good", proc).table("gpu_minute")
    others = ~((pl.col("node") == "n5") & (pl.col("minute") >= at(5)))
    assert gm.filter(others).sort(["minute", "node", "gpu_index"])["activity"].to_list() == \
        good_gm.filter(others).sort(["minute", "node", "gpu_index"])["activity"].to_list()


@pytest.mark.parametrize("stray", ["2000-01-01T00:00:00Z", "2026-12-01T10:00:00Z"])
def test_ingest_sets_aside_a_line_far_outside_the_input(tmp_path: Path, stray: str) -> None:
    recs = _fleet()
    clean = tmp_path / "clean.jsonl"
    clean.write_bytes(jsonl(recs))
    ingest([clean], tmp_path / "wh-clean", ProcessorConfig())
    bad = dict(telemetry("n3", 0, at(0), sm=0.9, seq=999))
    bad["time"] = stray
    dirty = tmp_path / "dirty.jsonl"
    dirty.write_bytes(jsonl(recs) + jsonl([bad]))
    result = ingest([dirty], tmp_path / "wh-dirty", ProcessorConfig())
    assert result.rejects.height == 1
    assert "far outside the input's time range" in result.rejects["reason"][0]
    assert_same_facts(tmp_path / "wh-dirty", tmp_path / "wh-clean", SPARSE)
    files = list((tmp_path / "wh-dirty" / "facts").rglob("*.parquet"))
    assert len(files) < 60, len(files)   # no walk over the years between
    # nor over the 31 days before the bulk: a stray sample is no early record (only job
    # and inventory records move where the facts begin)
    assert result.facts_begin is None


def _catching_up(root: Path, batches: list[list[dict[str, Any]]],
                 partitioning: Partitioning | None = None) -> Processor:
    """Batches processed as a transport behind its input passes them (``behind``)."""
    proc = Processor(ProcessorConfig(), Warehouse(root), telemetry_clock=True,
                     partitioning=partitioning)
    for i, batch in enumerate(batches):
        proc.process(frames(batch), validated=True, behind=i < len(batches) - 1)
    proc.flush()
    return proc


def test_a_node_clock_days_ahead_makes_no_facts_while_catching_up(tmp_path: Path) -> None:
    """Read in a catch-up (a replay, a batch run), 8 samples of n5 two days ahead were
    taken: the end of input closed every GPU's minutes up to them, two days of invented
    idle minutes. They are rejected as they are live, and the facts are the good run's."""
    good = _fleet()
    _catching_up(tmp_path / "good", _minutes_by_time(good))
    skewed = [dict(r) for r in good]
    moved = 0
    for r in skewed:
        if r["type"] == "telemetry" and r["node"] == "n5" and at(5) <= r["time"] < at(7):
            r["time"] += timedelta(days=2)
            moved += 1
    proc = _catching_up(tmp_path / "skewed", _minutes_by_time(skewed))
    assert proc.counters.ahead_telemetry == moved > 0
    rejects = read_table(tmp_path / "skewed", "rejects")
    assert rejects["reason"].str.contains(" ahead of ").all()
    assert rejects["reason"].str.contains("86400 s ahead of its partition's median node").any()
    gm = read_table(tmp_path / "skewed", "gpu_minute")
    assert gm["minute"].max() < at(21)
    assert gm.height == read_table(tmp_path / "good", "gpu_minute").height


def test_partitions_read_hours_apart_while_catching_up_are_not_ahead(tmp_path: Path) -> None:
    """A replay may read one partition far ahead of another (a fetch of one partition's
    backlog): 12 hours apart is not a clock running ahead, and nothing is rejected."""
    count = 2
    parts = Partitioning(count, {0, 1})
    recs = []
    for n in range(12):
        node = f"n{n}"
        recs.append(inventory(node, at(0), gpus=1))
        recs += series(node, 0, at(0), 30, sm=0.4)
    lead = [r for r in recs if r["type"] == "telemetry" and parts.of(r["node"]) == 1]
    rest = [r for r in recs if r not in lead]
    late_part = [r for r in lead if r["time"] >= at(10)]
    # partition 1 read to minute 30 first, then everyone else, then its first minutes
    batches = [[r for r in rest if r["type"] == "inventory"], late_part,
               [r for r in rest if r["type"] == "telemetry"],
               [r for r in lead if r["time"] < at(10)]]
    proc = _catching_up(tmp_path / "wh", batches, parts)
    assert proc.counters.ahead_telemetry == 0
    assert read_table(tmp_path / "wh", "rejects").is_empty()


def _early_and_burst(tmp_path: Path, early: datetime, burst: datetime) -> IngestResult:
    """Ingest a node's record and a long job's submission and start at ``early``, then a
    1-hour burst of 400 short jobs from ``burst`` (the long one ends 61 min into it)."""
    recs = [inventory("n1", early, gpus=8), job("submitted", "long", early),
            job("started", "long", early + timedelta(seconds=30),
                allocation=alloc("n1", 0))]
    for i in range(400):  # the three early records are below the 1st percentile
        t = burst + timedelta(seconds=9 * i)
        recs += [job("submitted", f"s{i}", t),
                 job("started", f"s{i}", t + timedelta(seconds=1),
                     allocation=alloc("n1", 1 + i % 7)),
                 job("finished", f"s{i}", t + timedelta(seconds=5))]
    recs.append(job("finished", "long", burst + timedelta(minutes=61)))
    path = tmp_path / "history.jsonl"
    path.write_bytes(jsonl(recs))
    return ingest([path], tmp_path / "wh", ProcessorConfig())


def test_inventory_and_a_long_jobs_start_days_before_a_burst_are_kept(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A node's record and a long job's submission and start, 8 days before a 1-hour
    burst of short jobs: set aside as outliers before, so the node had no capacity, every
    job was charged 0 and the long one had no attempt. Kept now, with a warning; the
    long job holds its GPU for the whole 8 days and an hour."""
    result = _early_and_burst(tmp_path, at(0), at(8 * 24 * 60))
    assert result.rejects.is_empty()
    assert "come 8.0 days before the bulk of the input" in caplog.text
    attempts = read_table(tmp_path / "wh", "job_attempts")
    long = attempts.filter(pl.col("job_id") == "long")["allocated_gpu_hours"].item()
    assert long * 3600 == pytest.approx(8 * 86400 + 61 * 60 - 30)
    short = attempts.filter(pl.col("job_id") != "long")["allocated_gpu_hours"]
    assert short.len() == 400 and short.sum() * 3600 == pytest.approx(400 * 4)


def test_a_record_years_before_the_bulk_only_updates_the_books(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A node's record and a long job's submission and start dated 400 days before a
    1-hour burst: the run walked those days (a submission six years early wrote 2.1 GB
    in 14 CPU-minutes before a probe killed it). The facts now begin 31 days before the
    first quartile of the event times (14 minutes into the burst); the early records
    still give the node its capacity and the job its attempt, charged from there."""
    burst = at(0)
    result = _early_and_burst(tmp_path, at(-400 * 24 * 60), burst)
    assert result.rejects.is_empty()
    assert "the facts begin at" in caplog.text and "31 days before it" in caplog.text
    attempts = read_table(tmp_path / "wh", "job_attempts")
    long = attempts.filter(pl.col("job_id") == "long")["allocated_gpu_hours"].item()
    assert "first quartile 2026-01-05 10:14 UTC" in caplog.text
    assert long * 3600 == pytest.approx(31 * 86400 + (61 - 14) * 60, abs=60)
    short = attempts.filter(pl.col("job_id") != "long")["allocated_gpu_hours"]
    assert short.len() == 400 and short.sum() * 3600 == pytest.approx(400 * 4)
    hourly = read_table(tmp_path / "wh", "gpu_hourly")
    assert hourly["hour"].min() >= burst - timedelta(days=31, hours=1)
    assert hourly["gpu_hours"].sum() == pytest.approx(8 * (31 * 24 + 2), rel=0.01)


def test_a_few_records_one_of_them_far_early_do_not_walk_the_time_between(
        tmp_path: Path) -> None:
    """Ten records, one submission 200 days before the rest: ingest set nothing aside
    under 20 records, so the run walked the 200 days minute by minute (a probe's one
    six years early took 95 s) and wrote facts for all of them. The rule of imports
    (quartiles, whatever the count) now applies: the facts begin 31 days before the
    bulk, and the early submission only updates the books."""
    recs = [job("submitted", "old", at(-200 * 24 * 60)), inventory("n1", at(0), gpus=1)]
    recs += [job("submitted", f"s{i}", at(i)) for i in range(8)]
    path = tmp_path / "history.jsonl"
    path.write_bytes(jsonl(recs))
    result = ingest([path], tmp_path / "wh", ProcessorConfig())
    assert result.facts_begin is not None
    assert result.facts_begin >= at(0) - timedelta(days=31, minutes=1)
    assert result.early == {"job": 1, "inventory": 0}
    hourly = read_table(tmp_path / "wh", "gpu_hourly")
    assert hourly["hour"].min() >= at(0) - timedelta(days=31, hours=1)


def test_allocations_no_inventory_knows_are_counted_and_said(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Not charged, as documented, but no longer silent: a 2-GPU job on a node with no
    inventory (600 s), GPU 5 of a 2-GPU node (600 s) and a GPU that leaves the inventory
    half-way through a 600 s hold: 2 × 600 + 600 + 300 GPU-seconds uncharged."""
    recs = [inventory("n1", at(0), gpus=2), inventory("n2", at(0), gpus=1),
            job("submitted", "a", at(0), gpus=2),
            job("started", "a", at(1), allocation=alloc("ghost", 0, 1)),
            job("finished", "a", at(11)),
            job("submitted", "b", at(0)),
            job("started", "b", at(1), allocation=alloc("n1", 5)),
            job("finished", "b", at(11)),
            job("submitted", "c", at(0)),
            job("started", "c", at(1), allocation=alloc("n2", 0)),
            inventory("n2", at(6), gpus=0),
            job("finished", "c", at(11)),
            job("submitted", "end", at(15))]
    path = tmp_path / "history.jsonl"
    path.write_bytes(jsonl(recs))
    result = ingest([path], tmp_path / "wh", ProcessorConfig())
    assert result.counters.uncharged_allocation_ms == (2 * 600 + 600 + 300) * 1000
    assert "2,100.0 allocated GPU-second(s) were on GPUs no inventory knew" in caplog.text
    charged = read_table(tmp_path / "wh", "job_attempts").filter(pl.col("job_id") == "c")
    assert charged["allocated_gpu_hours"].item() * 3600 == pytest.approx(300)


def test_rejected_telemetry_is_said_at_the_end_of_the_input(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Samples of GPUs no inventory knows were rejected in silence: `ingest` printed
    "ingested N telemetry", exit status 0. Now the end of the input says how many, and
    why; an input with no inventory at all (every sample rejected) is told what is
    missing. And the run's record counts are its own (ingest counted each record
    twice)."""
    recs: list[dict[str, Any]] = [inventory("n1", at(0), gpus=8)]
    recs += series("n1", 0, at(0), 5, sm=0.5)
    recs += series("ghost", 0, at(0), 5, sm=0.5, seq0=900)      # a node no inventory knows
    path = tmp_path / "some.jsonl"
    path.write_bytes(jsonl(recs))
    result = ingest([path], tmp_path / "wh", ProcessorConfig())
    assert result.counters.records_in == {"telemetry": 60, "inventory": 1, "job": 0}
    assert result.records == result.counters.records_in
    assert ("30 telemetry sample(s) were rejected, not counted in any fact: 30 of GPUs no "
            "inventory knew") in caplog.text
    assert "every sample" not in caplog.text
    caplog.clear()
    path = tmp_path / "none.jsonl"
    path.write_bytes(jsonl(recs[1:]))                            # no inventory record
    result = ingest([path], tmp_path / "wh2", ProcessorConfig())
    assert result.counters.unplaced_telemetry == result.counters.records_in["telemetry"] == 60
    assert "60 telemetry sample(s) were rejected" in caplog.text
    assert "every sample this run read: were the inventory records left out?" in caplog.text
    assert read_table(tmp_path / "wh2", "gpu_minute").is_empty()
    # --strict fails such an input (it looked at bad lines only: exit status 0)
    assert main(["ingest", str(path), "--quiet", "--strict",
                 "--warehouse", str(tmp_path / "wh3")]) == 1
    assert main(["ingest", str(path), "--quiet", "--warehouse", str(tmp_path / "wh4")]) == 0


def test_telemetry_of_unknown_gpus_is_rejected_not_capacity(
    process: Callable[..., Facts],
) -> None:
    recs: list[dict[str, Any]] = [inventory("n1", at(0), gpus=8)]
    recs += series("n1", 0, at(0), 5, sm=0.5)
    recs += series("n1", 99, at(0), 5, sm=0.5, seq0=500)        # GPU 99 of an 8-GPU node
    recs += series("ghost", 0, at(0), 5, sm=0.5, seq0=900)      # a node no inventory knows
    facts = process(recs)
    gm = facts.table("gpu_minute")
    assert set(gm["node"].unique()) == {"n1"} and gm["gpu_index"].max() == 7
    assert gm.group_by("minute").len()["len"].unique().to_list() == [8]
    rejects = facts.table("rejects")
    reasons = " | ".join(rejects["reason"].to_list())
    assert "GPU 99 of node 'n1', which has 8 GPUs" in reasons
    assert "no inventory for node 'ghost'" in reasons
    assert facts.processor.counters.unplaced_telemetry == 2 * 5 * 6
    # gpuledger_rejected_records counts samples, not reject rows (one a GPU-minute)
    assert facts.processor.counters.rejected["telemetry"] == 2 * 5 * 6
    hourly = facts.table("gpu_hourly")
    assert hourly["gpu_hours"].sum() * 60 == pytest.approx(8 * 5)


def test_memory_beyond_the_card_is_rejected(process: Callable[..., Facts]) -> None:
    recs: list[dict[str, Any]] = [inventory("n1", at(0), gpus=1, mem=81_559.0),
                                  job("submitted", "j", at(0)),
                                  job("started", "j", at(0), allocation=alloc("n1", 0)),
                                  job("finished", "j", at(3))]
    recs += series("n1", 0, at(0), 3, sm=0.5, mem=30_000.0, total=None)
    huge = telemetry("n1", 0, at(1, 5), sm=0.5, mem=1e7, total=None, seq=99)
    facts = process([*recs, huge])
    att = facts.table("job_attempts").row(0, named=True)
    assert att["mem_peak_mib"] == 30_000.0          # not 10 TB
    rejects = facts.table("rejects")
    assert rejects.height == 1 and "more than the card's 81559.0 MiB" in rejects["reason"][0]
    assert facts.processor.counters.implausible_telemetry == 1


def test_memory_beyond_its_own_card_is_rejected_in_a_mixed_fleet(
        process: Callable[..., Facts]) -> None:
    """50 GB fits the 80 GB card of n1 but not the 24 GB card of n2: each sample is held
    against its own node's card, not the fleet's smallest or largest."""
    recs: list[dict[str, Any]] = [inventory("n1", at(0), gpus=1, mem=81_559.0),
                                  inventory("n2", at(0), gpus=1, mem=23_028.0)]
    recs += series("n1", 0, at(0), 3, sm=0.5, mem=50_000.0, total=None)
    recs += series("n2", 0, at(0), 3, sm=0.5, mem=20_000.0, total=None)
    over = telemetry("n2", 0, at(1, 5), sm=0.5, mem=50_000.0, total=None, seq=99)
    facts = process([*recs, over])
    rejects = facts.table("rejects")
    assert rejects.height == 1 and "more than the card's 23028.0 MiB" in rejects["reason"][0]
    assert '"node":"n2"' in rejects["raw"][0]
    assert facts.processor.counters.implausible_telemetry == 1
    peaks = facts.table("gpu_minute").group_by("node").agg(pl.col("mem_used_mib").max())
    assert dict(peaks.iter_rows()) == {"n1": 50_000.0, "n2": 20_000.0}


def test_job_events_out_of_order_are_rejected_with_reasons(
    process: Callable[..., Facts],
) -> None:
    recs = [inventory("n1", at(0), gpus=2),
            job("submitted", "a", at(0)),
            job("started", "a", at(1), allocation=alloc("n1", 0)),
            job("started", "a", at(2), allocation=alloc("n1", 1)),      # a second start
            job("finished", "a", at(5)),
            job("started", "a", at(6), allocation=alloc("n1", 0)),      # after it ended
            job("finished", "never-seen", at(3)),                       # unknown job
            job("checkpointed", "b", at(4)),                            # unknown job
            job("submitted", "end", at(8))]
    facts = process(recs)
    rejects = facts.table("rejects").filter(pl.col("record_type") == "job")
    reasons = sorted(rejects["reason"].to_list())
    assert len(reasons) == 4
    assert any("started for job 'a', which is running" in r for r in reasons)
    assert any("started for job 'a', which is already ended" in r for r in reasons)
    assert any("finished for job 'never-seen', which was never submitted" in r
               for r in reasons)
    assert any("checkpointed for job 'b', which was never submitted" in r for r in reasons)
    att = facts.table("job_attempts").filter(pl.col("job_id") == "a").row(0, named=True)
    assert att["allocated_gpu_hours"] == pytest.approx(4 / 60)   # the first start held


def test_an_allocation_of_a_gpu_no_inventory_knows_adds_no_capacity(
    process: Callable[..., Facts],
) -> None:
    recs = [inventory("n1", at(0), gpus=2),
            job("submitted", "j", at(0), gpus=1),
            job("started", "j", at(0), allocation=alloc("n1", 7)),
            job("finished", "j", at(4))]
    recs += series("n1", 0, at(0), 5, sm=0.0)
    facts = process(recs)
    gm = facts.table("gpu_minute")
    assert gm["gpu_index"].max() == 1
    assert not gm["allocated"].any()
    assert facts.table("gpu_hourly")["gpu_hours"].sum() * 60 == pytest.approx(2 * 5)


def test_a_job_ending_hours_after_a_burst_of_submissions_is_not_an_outlier(
        tmp_path: Path) -> None:
    """200 jobs submitted within a minute, one of them run for three hours: its start and
    end are ordinary times, not a clock from another year."""
    recs = [inventory("n1", at(0), gpus=1)]
    recs += [job("submitted", f"q{i}", at(0, seconds=i * 0.25)) for i in range(200)]
    recs += [job("started", "q0", at(1), allocation=alloc("n1", 0)),
             job("finished", "q0", at(180))]
    events = tmp_path / "burst.jsonl"
    events.write_bytes(jsonl(recs))
    result = ingest([events], tmp_path / "wh", ProcessorConfig())
    assert result.rejects.height == 0, result.rejects["reason"].to_list()
    attempts = read_table(tmp_path / "wh", "job_attempts")
    assert attempts.filter(pl.col("job_id") == "q0")["allocated_gpu_hours"].to_list() == \
        [pytest.approx(179 / 60)]


def test_samples_before_a_nodes_first_inventory_say_so(tmp_path: Path) -> None:
    """Samples of a node from before its first inventory record are rejected (nothing
    unknown adds to capacity); the reason said 'GPU 0 of node n1, which has 2 GPUs', as
    if the GPU did not exist, where the node had no inventory at that time."""
    recs = [inventory("n1", at(10), gpus=2), inventory("n2", at(0), gpus=2)]
    recs += series("n1", 0, at(0), 20, sm=0.5)
    recs += series("n2", 0, at(0), 20, sm=0.5, seq0=500)
    proc = _live(tmp_path / "wh", _minutes_by_time(recs))
    assert proc.counters.unplaced_telemetry > 0
    reasons = read_table(tmp_path / "wh", "rejects")["reason"]
    assert reasons.len() > 0
    assert reasons.str.starts_with("no inventory for node 'n1'").all(), reasons.to_list()
    assert reasons.str.contains("at that time").any()   # read after its record came


def test_no_minute_after_the_processors_clock_is_closed(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A probe ingested one node whose clock ran 50 minutes ahead (within the hour ahead
    that input may be): its GPUs' minutes were closed, and a running job charged, up to
    50 minutes past the wall clock. Neither the watermark nor the end of the input closes
    a minute that is not over; those after it stay open for the next run."""
    now = at(30, 20)
    skew = timedelta(minutes=50)
    recs = [inventory("n0", at(0), gpus=1), job("submitted", "j", at(0), gpus=1),
            job("started", "j", at(2), allocation=alloc("n0", 0))]
    recs += series("n0", 0, at(0) + skew, 30, sm=0.5)   # to 10:80, by the node's clock
    proc = Processor(ProcessorConfig(), Warehouse(tmp_path / "wh"), now=lambda: now)
    batch = frames(recs)
    proc.process(batch)
    assert proc.closed_until is not None and proc.closed_until <= at(30)
    proc.flush()
    assert proc.closed_until == at(31)      # the current minute, as live input's
    said = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert sum("the input runs to 2026-01-05 11:20 UTC, 0:49:00 after this machine's "
               "clock (10:30:20 UTC): the minutes from 10:31 on are not closed" in m
               for m in said) == 1, said
    facts = Facts(tmp_path / "wh", proc)
    assert facts.table("gpu_minute")["minute"].max() == at(30)
    running = facts.table("running_attempts").row(0, named=True)
    assert running["allocated_gpu_hours"] == pytest.approx(29 / 60)
