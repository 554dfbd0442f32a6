"""How much event time ingest and the demo feed per batch: about SLICE_SAMPLES telemetry
samples, between ten minutes and an hour (each batch costs a close pass)."""

from __future__ import annotations

import json
import re
import shutil
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from fact_views import VIEWS, assert_same_facts, views
from polars.testing import assert_frame_equal
from test_simulate import SMALL

from gpuledger.pipeline.config import ProcessorConfig
from gpuledger.pipeline.demo import run_demo
from gpuledger.pipeline.ingest import (
    INGEST_STATE,
    IngestRefused,
    IngestResult,
    ingest,
    telemetry_slice,
)
from gpuledger.pipeline.processor import Processor
from gpuledger.pipeline.simulate import SimConfig, parse_cluster, simulate, write_jsonl
from gpuledger.pipeline.warehouse import Warehouse

SPARSE = ("blocked_minute", "preemptions", "candidates", "recommendations",
          "pending_minute")


@pytest.mark.parametrize(("gpus", "interval_s", "minutes"), [
    (24, 60, 60),        # a small cluster: an hour a batch
    (576, 10, 28),       # the built-in cluster: 3,456 samples a minute
    (9_216, 1, 10),      # a large one: ten minutes, as before
])
def test_the_slice_holds_about_the_samples_aimed_at(gpus: int, interval_s: int,
                                                     minutes: int) -> None:
    span = timedelta(hours=6)
    samples = gpus * int(span.total_seconds()) // interval_s
    assert telemetry_slice(samples, span) == timedelta(minutes=minutes)


def _batches(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Telemetry rows of every batch the processor takes from now on."""
    seen: list[int] = []
    real = Processor.process

    def counted(self: Processor, batch: Any, *args: Any, **kwargs: Any) -> None:
        telemetry = batch.get("telemetry")
        seen.append(0 if telemetry is None else telemetry.height)
        real(self, batch, *args, **kwargs)

    monkeypatch.setattr(Processor, "process", counted)
    return seen


def test_ingest_and_the_demo_feed_hours_of_a_small_cluster_with_the_same_facts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sim = SimConfig(hours=4, seed=5, sample_interval_s=60, cluster=parse_cluster(SMALL))
    write_jsonl(simulate(sim), tmp_path / "events")
    seen = _batches(monkeypatch)
    run_demo(sim, ProcessorConfig(), tmp_path / "demo")
    demo_batches = list(seen)
    seen.clear()
    ingest(sorted((tmp_path / "events").glob("*.jsonl")), tmp_path / "ingest",
           ProcessorConfig())
    assert len(demo_batches) == 4                   # an hour a batch, not 24 of 10 minutes
    assert 4 <= len(seen) <= 5                       # (the first hour may start mid-minute)
    assert sum(seen) == sum(demo_batches) > 0
    assert_same_facts(tmp_path / "ingest", tmp_path / "demo", SPARSE)


def _split(events: Path, at_iso: str, before: Path, after: Path) -> None:
    """Each JSON-lines file of ``events`` cut in two by event time (``at_iso`` starts the
    second piece)."""
    for path in sorted(events.glob("*.jsonl")):
        lines = path.read_text().splitlines()
        early = [line for line in lines if json.loads(line)["time"] < at_iso]
        late = [line for line in lines if json.loads(line)["time"] >= at_iso]
        for folder, part in ((before, early), (after, late)):
            folder.mkdir(exist_ok=True)
            (folder / path.name).write_text("".join(f"{line}\n" for line in part))


def _ingest(tmp_path: Path, folder: str, warehouse: str) -> IngestResult:
    return ingest(sorted((tmp_path / folder).glob("*.jsonl")), tmp_path / warehouse,
                  ProcessorConfig())


def _whole(tmp_path: Path, interval_s: int) -> None:
    """Three simulated hours of the small cluster in ``events``, ingested into ``whole``."""
    sim = SimConfig(hours=3, seed=5, sample_interval_s=interval_s,
                    cluster=parse_cluster(SMALL))
    write_jsonl(simulate(sim), tmp_path / "events")
    _ingest(tmp_path, "events", "whole")


@pytest.mark.parametrize("cut", ["2026-01-05T02:00:00", "2026-01-05T01:37:00"])
def test_an_ingest_in_two_pieces_writes_the_facts_of_one(tmp_path: Path, cut: str) -> None:
    """Yesterday's file, then today's: jobs the first piece left running are finished by
    the second (one attempt each, charged from start to end), and every view equals one
    ingest of the whole. The second piece says where it went on from."""
    _whole(tmp_path, 60)
    _split(tmp_path / "events", cut, tmp_path / "one", tmp_path / "two")
    first = _ingest(tmp_path, "one", "pieces")
    second = _ingest(tmp_path, "two", "pieces")
    assert first.continued_from is None
    assert second.continued_from is not None
    assert second.continued_from.isoformat().startswith(cut[:16])
    assert_same_facts(tmp_path / "pieces", tmp_path / "whole", SPARSE)


@pytest.mark.parametrize(("cut", "goes_on_from"), [
    ("2026-01-05T01:37:25", "2026-01-05T01:37"),   # a file cut inside a minute
    ("2026-01-05T02:00:00", "2026-01-05T02:00"),   # on a whole minute, as before
])
def test_a_piece_cut_inside_a_minute_goes_on_with_the_facts_of_one(
        tmp_path: Path, cut: str, goes_on_from: str) -> None:
    """10 s samples, the files cut at 01:37:25 (by size, by ``split -l``): the first
    piece's end closes 01:37 too, and saves a state closed at 01:37 beside the one at
    01:38; the second piece, starting inside that minute, goes on from 01:37 with no
    late sample, and every view equals one ingest of the whole. (It was refused: no
    state closed at or before its first event.) Cut on a whole minute, the second piece
    goes on from the state closed there."""
    _whole(tmp_path, 10)
    _split(tmp_path / "events", cut, tmp_path / "one", tmp_path / "two")
    first = _ingest(tmp_path, "one", "pieces")
    assert first.open_from is not None and first.closed_to is not None
    assert first.closed_to - first.open_from == timedelta(minutes=1)
    second = _ingest(tmp_path, "two", "pieces")
    assert second.continued_from is not None
    assert second.continued_from.isoformat()[:16] == goes_on_from
    assert second.counters.late_telemetry == 0 and second.rejects.is_empty()
    assert_same_facts(tmp_path / "pieces", tmp_path / "whole", SPARSE)


def test_three_pieces_the_last_starting_inside_the_middle_one_s_last_minute(
        tmp_path: Path) -> None:
    """Pieces cut at 00:40:00 and 01:37:25. The third starts inside the second's last
    minute: it goes on from the state the second saved there, with the facts of one
    ingest. It went on silently from the first piece's state (the only one closed before
    it), dropping the second's events from 00:40 on: 20 minutes with no telemetry, job
    events out of order, GPUs overcommitted. With that state gone (a piece ingested by an
    earlier release has none), the third is refused, nothing written, and names the
    piece it would skip."""
    _whole(tmp_path, 10)
    _split(tmp_path / "events", "2026-01-05T00:40:00", tmp_path / "p1", tmp_path / "rest")
    _split(tmp_path / "rest", "2026-01-05T01:37:25", tmp_path / "p2", tmp_path / "p3")
    for name in ("p1", "p2"):
        _ingest(tmp_path, name, "pieces")
    shutil.copytree(tmp_path / "pieces", tmp_path / "no-inside-state")
    third = _ingest(tmp_path, "p3", "pieces")
    assert third.continued_from is not None
    assert third.continued_from.isoformat()[:16] == "2026-01-05T01:37"
    assert third.counters.late_telemetry == 0 and sum(third.counters.rejected.values()) == 0
    assert_same_facts(tmp_path / "pieces", tmp_path / "whole", SPARSE)
    again = _ingest(tmp_path, "p3", "pieces")     # the last piece run again: the same state, facts
    assert again.continued_from == third.continued_from
    assert_same_facts(tmp_path / "pieces", tmp_path / "whole", SPARSE)

    shutil.rmtree(tmp_path / "no-inside-state" / INGEST_STATE / "until-2026-01-05T01-37-00Z")
    before = views(tmp_path / "no-inside-state")
    with pytest.raises(IngestRefused, match=re.escape(
            "the input starts at 2026-01-05 01:37:30 UTC, inside a piece ingested from "
            "2026-01-05 00:40:00 UTC, and the state it would go on from closes at "
            "2026-01-05 00:40 UTC")):
        _ingest(tmp_path, "p3", "no-inside-state")
    after = views(tmp_path / "no-inside-state")
    for name in VIEWS:
        assert_frame_equal(after[name], before[name])


def test_an_input_reaching_back_before_the_last_ingest_is_processed_afresh(
        tmp_path: Path) -> None:
    """Re-running the same files does not continue the previous run: the same facts."""
    sim = SimConfig(hours=2, seed=5, sample_interval_s=60, cluster=parse_cluster(SMALL))
    write_jsonl(simulate(sim), tmp_path / "events")
    files = sorted((tmp_path / "events").glob("*.jsonl"))
    ingest(files, tmp_path / "once", ProcessorConfig())
    ingest(files, tmp_path / "twice", ProcessorConfig())
    again = ingest(files, tmp_path / "twice", ProcessorConfig())
    assert again.continued_from is None and again.counters.late_telemetry == 0
    assert_same_facts(tmp_path / "twice", tmp_path / "once", SPARSE)


def test_a_damaged_ingest_state_is_said_and_the_input_processed_afresh(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    sim = SimConfig(hours=1, seed=5, sample_interval_s=60, cluster=parse_cluster(SMALL))
    write_jsonl(simulate(sim), tmp_path / "events")
    files = sorted((tmp_path / "events").glob("*.jsonl"))
    ingest(files, tmp_path / "wh", ProcessorConfig())
    (tmp_path / "wh" / "state" / "ingest" / "partition-p000.checkpoint").write_bytes(b"junk")
    again = ingest(files, tmp_path / "wh", ProcessorConfig())
    assert again.continued_from is None
    assert "the state an earlier release left cannot be read" in caplog.text


def test_the_end_of_the_input_closes_the_last_batch_in_one_pass_with_the_same_facts(
        tmp_path: Path) -> None:
    """The demo and ingest leave the last batch's minutes to the flush (``close=False``):
    one close pass where there were two (the batch's, then a few minutes the lateness had
    kept open), and the facts of closing every batch as it comes."""
    sim = SimConfig(hours=2, seed=7, sample_interval_s=60, cluster=parse_cluster(SMALL))
    batches = list(simulate(sim))
    passes, minutes = {}, {}
    for name, close_last in (("each", True), ("last", False)):
        proc = Processor(ProcessorConfig(), Warehouse(tmp_path / name))
        for i, batch in enumerate(batches):
            proc.process(batch, close=close_last or i < len(batches) - 1)
        proc.flush()
        passes[name] = proc.counters.close_passes
        minutes[name] = proc.counters.minutes_closed
    assert minutes["last"] == minutes["each"] > 100
    # the last batch (10 minutes) and the lateness's 2 minutes before it: one pass, not two
    assert passes["last"] == passes["each"] - 1
    assert_same_facts(tmp_path / "each", tmp_path / "last")


def test_a_close_step_takes_a_short_tail_with_it(tmp_path: Path) -> None:
    """Closing 63 minutes of telemetry (an hourly batch closed to the lateness, then the
    end of input) is one step: a step of 3 minutes on its own would cost a whole pass."""
    sim = SimConfig(hours=2, seed=3, sample_interval_s=60, cluster=parse_cluster(SMALL))
    proc = Processor(ProcessorConfig(), Warehouse(tmp_path / "w"))
    frames = list(simulate(sim))
    for batch in frames:
        proc.process(batch, close=False)
    assert proc.closed_until is not None
    start = proc.closed_until
    proc.close_until(start + timedelta(minutes=63))
    assert proc.counters.close_passes == 1
    proc.close_until(start + timedelta(minutes=63 + 75))   # 75 minutes: an hour, then 15
    assert proc.counters.close_passes == 3


def test_a_piece_inside_one_minute_keeps_the_state_it_went_on_from(tmp_path: Path) -> None:
    """A 40-second piece (01:00:00 to 01:00:40) goes on from the state closed at 01:00:
    its state inside its last minute would be that same point, and would overwrite the
    state of the piece before it; none is saved. A next piece starting inside that
    minute is then refused, naming the short piece, rather than going on without it."""
    _whole(tmp_path, 10)
    _split(tmp_path / "events", "2026-01-05T01:00:00", tmp_path / "a", tmp_path / "rest")
    _split(tmp_path / "rest", "2026-01-05T01:00:40", tmp_path / "b", tmp_path / "c")
    _ingest(tmp_path, "a", "pieces")
    short = _ingest(tmp_path, "b", "pieces")
    assert short.continued_from is not None and short.open_from is None
    with pytest.raises(IngestRefused, match="inside a piece ingested from 2026-01-05 "
                                            "01:00:00 UTC"):
        _ingest(tmp_path, "c", "pieces")
    again = _ingest(tmp_path, "b", "pieces")      # the short piece again: the same state
    assert again.continued_from == short.continued_from
    assert again.counters.duplicate_samples == 0


def test_an_older_piece_starting_inside_a_last_minute_is_refused_with_the_reason(
        tmp_path: Path) -> None:
    """Four pieces, the second starting inside the first's last minute; the second run
    again once two pieces closed further: the state inside the first's last minute is
    gone (kept for the two pieces closed furthest), so it is refused, and the reason says
    that. It said "the one before it was pruned: those of 8 runs are kept" after three
    runs (a probe)."""
    _whole(tmp_path, 10)
    _split(tmp_path / "events", "2026-01-05T00:20:25", tmp_path / "p1", tmp_path / "r1")
    _split(tmp_path / "r1", "2026-01-05T00:50:00", tmp_path / "p2", tmp_path / "r2")
    _split(tmp_path / "r2", "2026-01-05T01:20:00", tmp_path / "p3", tmp_path / "p4")
    for name in ("p1", "p2", "p3", "p4"):
        _ingest(tmp_path, name, "pieces")
    with pytest.raises(IngestRefused, match=re.escape(
            "(it starts inside the last minute of the piece that closed at 2026-01-05 "
            "00:21 UTC, and a state inside a piece's last minute is kept for the 2 pieces "
            "closed furthest only)")):
        _ingest(tmp_path, "p2", "pieces")
