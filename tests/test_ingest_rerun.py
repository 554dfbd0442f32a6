"""Re-running a piece of a history that was ingested in pieces (after a killed run, or by
mistake) writes the facts of the whole: it continues from the state its predecessor
left, not from the one a later piece left (docs/warehouse.md, "Ingesting in pieces")."""

from __future__ import annotations

import hashlib
import json
import pickle
import shutil
from datetime import datetime
from pathlib import Path

import polars as pl
import pytest
from fact_views import VIEWS, assert_same_facts, views
from polars.testing import assert_frame_equal
from test_checkpoint_files import Runs
from test_simulate import SMALL

from gpuledger.pipeline import checkpoint, state_file
from gpuledger.pipeline import ingest as ingest_module
from gpuledger.pipeline.checkpoint import VERSION
from gpuledger.pipeline.config import ProcessorConfig
from gpuledger.pipeline.ingest import INGEST_STATE, IngestRefused, IngestResult, ingest
from gpuledger.pipeline.simulate import SimConfig, parse_cluster, simulate, write_jsonl
from gpuledger.pipeline.store import open_store
from gpuledger.pipeline.warehouse import read_table

SPARSE = ("blocked_minute", "preemptions", "candidates", "recommendations",
          "pending_minute")
CUT = "2026-01-05T02:00:00"


def _split(events: Path, cuts: list[str], folders: list[Path]) -> None:
    """Each JSON-lines file of ``events`` cut by event time at ``cuts`` (each starts the
    next piece) into ``folders`` (one more than the cuts)."""
    bounds = ["", *cuts, "9999"]
    assert len(folders) == len(cuts) + 1
    for path in sorted(events.glob("*.jsonl")):
        lines = path.read_text().splitlines()
        times = [json.loads(line)["time"] for line in lines]
        for folder, lo, hi in zip(folders, bounds, bounds[1:], strict=False):
            folder.mkdir(exist_ok=True)
            (folder / path.name).write_text(
                "".join(f"{line}\n" for line, t in zip(lines, times, strict=True)
                        if lo <= t < hi))


def _ingest(folder: Path, warehouse: Path) -> IngestResult:
    return ingest(sorted(folder.glob("*.jsonl")), warehouse, ProcessorConfig())


def _states(warehouse: Path) -> list[str]:
    return sorted(p.name for p in (warehouse / INGEST_STATE).iterdir()
                  if p.name.startswith("until-"))


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three simulated hours: ``events`` whole, ``whole`` (one ingest of it), the pieces
    ``pa`` (until CUT) and ``pb`` (from CUT), ``h0``, ``h1``, ``h2`` (an hour each), and
    ``pieces``: pa then pb ingested (copy it before writing to it)."""
    root = tmp_path_factory.mktemp("history")
    sim = SimConfig(hours=3, seed=5, sample_interval_s=60, cluster=parse_cluster(SMALL))
    write_jsonl(simulate(sim), root / "events")
    _ingest(root / "events", root / "whole")
    _split(root / "events", [CUT], [root / "pa", root / "pb"])
    _split(root / "events", ["2026-01-05T01:00:00", CUT],
           [root / "h0", root / "h1", root / "h2"])
    assert _ingest(root / "pa", root / "pieces").continued_from is None
    assert _ingest(root / "pb", root / "pieces").continued_from is not None
    # each piece's newest event falls inside its last minute: a state closed there too
    assert _states(root / "pieces") == ["until-2026-01-05T01-59-00Z",
                                        "until-2026-01-05T02-00-00Z",
                                        "until-2026-01-05T02-59-00Z",
                                        "until-2026-01-05T03-00-00Z"]
    assert_same_facts(root / "pieces", root / "whole", SPARSE)
    return root


def _copy(history: Path, tmp_path: Path) -> Path:
    shutil.copytree(history / "pieces", tmp_path / "wh")
    return tmp_path / "wh"


def _at_cut(result: IngestResult) -> bool:
    return (result.continued_from is not None
            and result.continued_from.isoformat().startswith(CUT[:16]))


def test_rerunning_the_last_piece_continues_from_the_state_before_it(
        history: Path, tmp_path: Path) -> None:
    """pa, pb, then pb again (its run killed after it saved its state): pb continues from
    the state pa left, no job event is out of order, and every view equals one ingest of
    the whole (the bug: pb was processed afresh and its hours lost pa's jobs)."""
    wh = _copy(history, tmp_path)
    again = _ingest(history / "pb", wh)
    assert _at_cut(again)
    assert again.rejects.is_empty() and again.counters.late_telemetry == 0
    assert sum(again.counters.rejected.values()) == 0
    assert_same_facts(wh, history / "whole", SPARSE)


def test_rerunning_the_first_piece_keeps_the_facts_of_the_later_hours(
        history: Path, tmp_path: Path) -> None:
    """pa+pb, then pa again: nothing was saved at or before pa's start, so it is processed
    afresh, as before. Every hour's facts (pb's too) stay those of the whole, and so does
    the roll-up of the day pa and pb share (gpu_daily: pa's hours and pb's; it held pa's
    alone before); what shows the end of the input is pa's end, as after pa alone: the
    latest-state views (running_attempts: pa's snapshot less the attempts whose end is
    published). Ingesting pb again continues from the state pa left: the whole again."""
    wh = _copy(history, tmp_path)
    _ingest(history / "pa", tmp_path / "pa_alone")
    again = _ingest(history / "pa", wh)
    assert again.continued_from is None
    got, whole, alone = views(wh), views(history / "whole"), views(tmp_path / "pa_alone")
    ended = whole["job_attempts"].select("job_id", "attempt")
    assert not alone["gpu_daily"].equals(whole["gpu_daily"])
    want = {**whole, "candidates": alone["candidates"],
            "running_attempts": alone["running_attempts"].join(
                ended, on=["job_id", "attempt"], how="anti")}
    for name in VIEWS:
        try:
            assert_frame_equal(got[name], want[name], check_exact=False, rel_tol=1e-9,
                               abs_tol=1e-8)
        except AssertionError as exc:
            raise AssertionError(f"view {name}: {exc}") from None
    assert got["gpu_minute"].filter(pl.col("minute").dt.replace_time_zone(None)
                                    >= datetime.fromisoformat(CUT)).height > 0
    assert _at_cut(_ingest(history / "pb", wh))
    assert_same_facts(wh, history / "whole", SPARSE)


@pytest.mark.parametrize("damage", ["junk partition", "junk global", "missing partition",
                                    "a file for the folder", "a crafted partition"])
def test_a_damaged_saved_state_refuses_the_input_unless_afresh(
        history: Path, tmp_path: Path, damage: str) -> None:
    """Processing pb on its own would replace its hours with pb alone (its jobs from pa
    lost): refused in one line, nothing written; --afresh does it."""
    wh = _copy(history, tmp_path)
    folder = wh / INGEST_STATE / "until-2026-01-05T02-00-00Z"
    if damage == "junk partition":
        (folder / "partition-p000.checkpoint").write_bytes(b"junk")
    elif damage == "junk global":
        (folder / "global-ingest.checkpoint").write_bytes(b"\x80\x05junk")
    elif damage == "missing partition":
        (folder / "partition-p000.checkpoint").unlink()
    elif damage == "a crafted partition":  # plain pickle would run a command
        (folder / "partition-p000.checkpoint").write_bytes(pickle.dumps(
            {"version": VERSION, "section": Runs(tmp_path / "ran")}))
    else:
        shutil.rmtree(folder)
        folder.write_text("x")
    before = views(wh)
    with pytest.raises(IngestRefused, match=(
            f"^{INGEST_STATE}/until-2026-01-05T02-00-00Z: the saved state this input "
            "continues from cannot be read .*--afresh$")) as refused:
        _ingest(history / "pb", wh)
    assert "\n" not in str(refused.value)
    assert not (tmp_path / "ran").exists()
    after = views(wh)
    for name in VIEWS:
        assert_frame_equal(after[name], before[name])
    alone = ingest(sorted((history / "pb").glob("*.jsonl")), wh, ProcessorConfig(),
                   afresh=True)
    assert alone.continued_from is None and sum(alone.counters.rejected.values()) > 0


def test_a_piece_with_no_state_to_go_on_from_is_refused(
        history: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """pa's states pruned (room for one run's: pb's stay): pb again would be processed
    on its own. Refused, saying so; the whole history still goes."""
    monkeypatch.setattr(ingest_module, "KEEP_STATES", 1)
    wh = tmp_path / "wh"
    _ingest(history / "pa", wh)
    _ingest(history / "pb", wh)
    assert _states(wh) == ["until-2026-01-05T02-59-00Z", "until-2026-01-05T03-00-00Z"]
    with pytest.raises(IngestRefused, match=(
            "inside the history already ingested .* no saved state closes at or before "
            r"that \(the one before it was pruned: those of 1 runs are kept\)")):
        _ingest(history / "pb", wh)
    assert _ingest(history / "events", wh).continued_from is None   # the whole: fine
    assert_same_facts(wh, history / "whole", SPARSE)


def test_a_piece_with_records_older_than_the_history_s_end_says_which(
        history: Path, tmp_path: Path) -> None:
    """Found with a piece holding a job event that came late (dated in the piece before):
    nothing closes at or before it, and it was refused saying the state before it was
    pruned (there was one run: none was), and that --afresh does it anyway (which lost
    the history's jobs and inventory: its samples rejected as of no known GPU). Now the
    refusal names the record (file:line, its time) and the history's span, and offers only
    the whole history again in one run, which gives the whole's facts; nothing changed."""
    job_lines = (history / "pa" / "job.jsonl").read_text().splitlines()
    moved = next(i for i, line in enumerate(job_lines)
                 if "2026-01-05T01:00" <= json.loads(line)["time"] < "2026-01-05T01:50")
    first, rest = tmp_path / "first", tmp_path / "next"
    shutil.copytree(history / "pa", first)
    shutil.copytree(history / "pb", rest)
    (first / "job.jsonl").write_text("".join(
        f"{line}\n" for i, line in enumerate(job_lines) if i != moved))
    late = rest / "late.jsonl"
    late.write_text(job_lines[moved] + "\n")
    when = datetime.fromisoformat(json.loads(job_lines[moved])["time"])
    wh = tmp_path / "wh"
    _ingest(first, wh)
    before = views(wh)
    with pytest.raises(IngestRefused) as refused:
        _ingest(rest, wh)
    said = str(refused.value)
    assert said == (
        "the input holds records older than the end of the history already ingested "
        "(2026-01-05 00:00 to 2026-01-05 02:00 UTC) and than every saved state a piece can "
        "go on from (the earliest closes at 2026-01-05 01:59 UTC), 1 in all, the first "
        f"{late}:1 (a job record at {when:%Y-%m-%d %H:%M:%S} UTC): a later piece cannot add "
        "them. Ingest the whole history again with this input, every file in one run (into "
        "this warehouse or a new one)"), said
    after = views(wh)
    for name in VIEWS:
        assert_frame_equal(after[name], before[name])
    whole = ingest([*sorted(first.glob("*.jsonl")), *sorted(rest.glob("*.jsonl"))], wh,
                   ProcessorConfig())
    assert whole.continued_from is None
    assert_same_facts(wh, history / "whole", SPARSE)


def test_an_input_with_no_valid_record_changes_nothing(history: Path, tmp_path: Path) -> None:
    wh = _copy(history, tmp_path)
    before = views(wh)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert ingest([empty], wh, ProcessorConfig()).nothing
    after = views(wh)
    for name in VIEWS:   # the running attempts were emptied before
        assert_frame_equal(after[name], before[name])


def test_a_piece_processed_afresh_makes_the_later_states_stale(
        history: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """h1 first (on its own), then h0 (the history's start: on its own): h1's state, which
    lacks h0's jobs, is deleted. h2 then goes on from h0's state, taking h1's hour as
    empty: said in a warning. h1 then h2 again go on as pieces in order."""
    wh = tmp_path / "wh"
    _ingest(history / "h1", wh)
    _ingest(history / "h0", wh)
    assert _states(wh) == ["until-2026-01-05T00-59-00Z", "until-2026-01-05T01-00-00Z"]
    _ingest(history / "h2", tmp_path / "scratch")   # (a warehouse of its own: no warning)
    caplog.clear()
    _ingest(history / "h2", wh)
    assert "the states after 2026-01-05 01:00 UTC were deleted" in caplog.text
    assert _ingest(history / "h1", wh).continued_from is not None
    caplog.clear()
    assert _at_cut(_ingest(history / "h2", wh))
    assert "were deleted" not in caplog.text


def test_the_state_of_an_earlier_release_is_taken_over(history: Path,
                                                        tmp_path: Path) -> None:
    """A warehouse whose one state lies directly in state/ingest/ (the earlier layout):
    the next ingest continues from it and moves it into its folder."""
    wh = tmp_path / "wh"
    _ingest(history / "pa", wh)
    state = wh / INGEST_STATE
    # an earlier release kept one state: the one closed at pa's end
    shutil.rmtree(state / "until-2026-01-05T01-59-00Z")
    (saved,) = (p for p in state.iterdir() if p.name.startswith("until-"))
    for f in saved.iterdir():
        f.rename(state / f.name)
    saved.rmdir()
    assert _at_cut(_ingest(history / "pb", wh))
    assert _states(wh) == ["until-2026-01-05T02-00-00Z", "until-2026-01-05T02-59-00Z",
                           "until-2026-01-05T03-00-00Z"]
    assert_same_facts(wh, history / "whole", SPARSE)


def test_the_saved_states_are_bounded(history: Path, tmp_path: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """With room for two runs' states, an hour-by-hour ingest keeps those of the two most
    recently written (the one closed furthest among them; each with its state inside its
    last minute, h0's gone), and still writes the whole's facts; a re-run of the last
    hour continues from the state before it."""
    monkeypatch.setattr(ingest_module, "KEEP_STATES", 2)
    wh = tmp_path / "wh"
    two_runs = ["until-2026-01-05T01-59-00Z", "until-2026-01-05T02-00-00Z",
                "until-2026-01-05T02-59-00Z", "until-2026-01-05T03-00-00Z"]
    for piece in ("h0", "h1", "h2"):
        _ingest(history / piece, wh)
        assert len(_states(wh)) <= 4
    assert _states(wh) == two_runs
    assert_same_facts(wh, history / "whole", SPARSE)
    assert _at_cut(_ingest(history / "h2", wh))
    assert _states(wh) == two_runs
    assert_same_facts(wh, history / "whole", SPARSE)


def test_a_state_inside_a_last_minute_is_kept_for_the_two_runs_closed_furthest(
        history: Path, tmp_path: Path) -> None:
    """h0, h1, h2: each run saves a state inside its last minute; h0's goes once two runs
    closed further (it holds the open hour's facts), its state at its end stays."""
    wh = tmp_path / "wh"
    for piece in ("h0", "h1", "h2"):
        _ingest(history / piece, wh)
    assert _states(wh) == ["until-2026-01-05T01-00-00Z", "until-2026-01-05T01-59-00Z",
                           "until-2026-01-05T02-00-00Z", "until-2026-01-05T02-59-00Z",
                           "until-2026-01-05T03-00-00Z"]


def test_the_whole_history_again_after_its_pieces_gives_the_whole(
        history: Path, tmp_path: Path) -> None:
    """pa, pb, then the whole history in one ingest (processed on its own, as it starts
    where the history starts): every view equals one ingest of the whole. An hour the
    new run writes no rows of a table for (a GPU's span that pa's end had cut, which the
    whole run writes as minutes) no longer keeps the pieces' file of it beside the new
    facts (gpu_minute counted 6 GPU-minutes twice)."""
    wh = _copy(history, tmp_path)
    ingest(sorted((history / "pb").glob("*.jsonl")), wh, ProcessorConfig(), afresh=True)
    again = _ingest(history / "events", wh)
    assert again.continued_from is None
    assert_same_facts(wh, history / "whole", SPARSE)


def test_an_hour_without_rows_of_a_table_in_the_new_run_keeps_none_of_the_old_ones(
        history: Path, tmp_path: Path) -> None:
    """A history in which one node's telemetry stops after 00:30 (its GPUs are
    spans of identical minutes there: gpu_span rows), then the whole history again:
    the hour has no gpu_span row in the new run, and the old run's spans no longer
    stand beside the new run's minutes (they were counted twice)."""
    gappy = tmp_path / "gappy"
    gappy.mkdir()
    node = json.loads((history / "events" / "telemetry.jsonl").open().readline())["node"]
    for path in sorted((history / "events").glob("*.jsonl")):
        lines = path.read_text().splitlines()
        (gappy / path.name).write_text("".join(
            f"{line}\n" for line in lines
            if not (path.name == "telemetry.jsonl" and json.loads(line)["node"] == node
                    and json.loads(line)["time"] >= "2026-01-05T00:30")))
    wh = tmp_path / "wh"
    _ingest(gappy, wh)
    spans = read_table(wh, "gpu_span")
    assert spans is not None and spans.filter(pl.col("node") == node).height > 0
    again = _ingest(history / "events", wh)
    assert again.continued_from is None
    assert_same_facts(wh, history / "whole", SPARSE)


def _whole_minute_end(history: Path) -> str:
    """The time of an attempt's end that falls on a whole minute inside the history."""
    for line in (history / "events" / "job.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if rec["event"] in ("finished", "failed", "preempted", "cancelled") \
                and rec["time"].endswith(":00.000Z") and "T00:30" < rec["time"][10:16] < "T02:30":
            return str(rec["time"])[:19]
    raise AssertionError("the simulation has no end on a whole minute")


def test_rerunning_a_piece_keeps_the_ends_at_the_minute_it_closes_to(
        history: Path, tmp_path: Path) -> None:
    """A piece cut where an attempt ends on a whole minute closes to that minute; the end
    is the next piece's event. Re-running the piece over the whole history kept every
    ended attempt (it took out the one ending at that minute, with its job_gpu rows and
    its preemption, as if this run had read that time)."""
    cut = _whole_minute_end(history)
    _split(history / "events", [cut], [tmp_path / "x", tmp_path / "y"])
    wh = tmp_path / "wh"
    shutil.copytree(history / "whole", wh)
    _ingest(tmp_path / "x", wh)
    got, whole = views(wh), views(history / "whole")
    for name in ("job_attempts", "job_gpu", "preemptions"):
        assert_frame_equal(got[name], whole[name], check_exact=False, rel_tol=1e-9)


def test_an_hour_replaced_whole_keeps_no_earlier_roll_up(history: Path, tmp_path: Path
                                                          ) -> None:
    """Telemetry and inventory ingested alone, then the job events alone (processed on
    their own): the hours the second run closed whole hold none of the first run's
    gpu_minute rows, and none of its gpu_hourly rows either (264 GPU-hours of roll-up were
    left over hours with no GPU-minute)."""
    tel, jobs = tmp_path / "tel", tmp_path / "jobs"
    tel.mkdir()
    jobs.mkdir()
    for name in ("telemetry.jsonl", "inventory.jsonl"):
        shutil.copy(history / "events" / name, tel / name)
    shutil.copy(history / "events" / "job.jsonl", jobs / "job.jsonl")
    wh = tmp_path / "wh"
    _ingest(tel, wh)
    assert views(wh)["gpu_hourly"].height > 0
    ingest(sorted(jobs.glob("*.jsonl")), wh, ProcessorConfig(), afresh=True)
    _ingest(jobs, tmp_path / "alone")
    got, alone = views(wh), views(tmp_path / "alone")
    for name in ("gpu_minute", "gpu_hourly"):
        assert_frame_equal(got[name], alone[name])


def _quiet_minute(history: Path) -> str:
    """A minute M (00:30–02:30) with no job or inventory event in the minute before it:
    a piece ending at M has its newest event at M − 1 min exactly (samples fall on whole
    minutes), so it leaves that minute open."""
    busy = {json.loads(line)["time"][:16]
            for name in ("job.jsonl", "inventory.jsonl")
            for line in (history / "events" / name).read_text().splitlines()}
    for minute in range(31, 150):
        before = f"2026-01-05T{(minute - 1) // 60:02d}:{(minute - 1) % 60:02d}"
        if before not in busy:
            return f"2026-01-05T{minute // 60:02d}:{minute % 60:02d}:00"
    raise AssertionError("no quiet minute")


def test_the_next_piece_after_a_rerun_goes_on_without_a_stale_warning(
        history: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """a, b, then a again (on its own: b's state is stale). a's newest event is a sample
    at the whole minute before the cut, so a leaves that minute open; b follows a
    directly: no warning that history was skipped (there was one). b then gives the
    whole."""
    _split(history / "events", [_quiet_minute(history)], [tmp_path / "a", tmp_path / "b"])
    wh = tmp_path / "wh"
    for piece in ("a", "b", "a"):
        _ingest(tmp_path / piece, wh)
    caplog.clear()
    assert _ingest(tmp_path / "b", wh).continued_from is not None
    assert "were deleted" not in caplog.text
    assert_same_facts(wh, history / "whole", SPARSE)


def test_a_last_hour_closed_in_part_is_the_rerun_s_own(history: Path, tmp_path: Path
                                                        ) -> None:
    """The history up to 02:30 ingested again over the whole (it starts where the history
    starts: on its own). Its last hour, closed in part, is written from its own rows
    alone, in every table: as the same input ingested into a fresh warehouse (tables it
    had no row of in that hour kept the whole history's hour 02 beside the others)."""
    _split(history / "events", ["2026-01-05T02:30:00"], [tmp_path / "p", tmp_path / "rest"])
    wh = tmp_path / "wh"
    shutil.copytree(history / "whole", wh)
    _ingest(tmp_path / "p", wh)
    _ingest(tmp_path / "p", tmp_path / "alone")
    hour = datetime.fromisoformat("2026-01-05T02:00:00")
    got, alone = views(wh), views(tmp_path / "alone")
    for name, column in (("gpu_minute", "minute"), ("frag_minute", "minute"),
                         ("pending_minute", "minute"), ("blocked_minute", "minute"),
                         ("gpu_hourly", "hour")):
        def in_hour(frame: pl.DataFrame, column: str = column) -> pl.DataFrame:
            return frame.filter(pl.col(column).dt.replace_time_zone(None) >= hour)
        assert_frame_equal(in_hour(got[name]), in_hour(alone[name]), check_exact=False,
                           rel_tol=1e-9)


def test_a_state_saved_by_an_earlier_release_is_read_only_when_asked(
        history: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The upgrade: the state pa left, as an earlier release wrote it (a pickle with its
    SHA-256). pb is refused in one line naming the variable, nothing changes; with
    GPULEDGER_READ_PICKLE_CHECKPOINTS=1 pb continues from it (the whole's facts), and the
    state pb leaves is data."""
    wh = _copy(history, tmp_path)
    shutil.rmtree(wh / INGEST_STATE / "until-2026-01-05T03-00-00Z")
    folder = wh / INGEST_STATE / "until-2026-01-05T02-00-00Z"
    for path in folder.glob("*.checkpoint"):
        blob = state_file.load(path.read_bytes(), checkpoint.CLASSES)
        old = pickle.dumps(blob, protocol=pickle.HIGHEST_PROTOCOL)
        path.write_bytes(checkpoint.MAGIC + hashlib.sha256(old).hexdigest().encode() + b"\n"
                         + old)
    before = views(wh)
    with pytest.raises(IngestRefused, match=(
            "a checkpoint of an earlier release .a Python pickle., not read by default; set "
            f"{checkpoint.PICKLES_ENV}=1 to read it")) as refused:
        _ingest(history / "pb", wh)
    assert "\n" not in str(refused.value)
    after = views(wh)
    for name in VIEWS:
        assert_frame_equal(after[name], before[name])
    monkeypatch.setenv(checkpoint.PICKLES_ENV, "1")
    assert _at_cut(_ingest(history / "pb", wh))
    assert_same_facts(wh, history / "whole", SPARSE)
    newest = wh / INGEST_STATE / "until-2026-01-05T03-00-00Z"
    assert all(state_file.is_state_file(p.read_bytes()) for p in newest.glob("*.checkpoint"))


def _day_sums_agree(wh: Path) -> None:
    """Every measure of every day's ``gpu_daily`` rows is the sum of its ``gpu_hourly``."""
    from gpuledger.pipeline.tables import MEASURES

    hourly = read_table(wh, "gpu_hourly").group_by("date").agg(
        pl.col(m).sum() for m in MEASURES).sort("date")
    daily = read_table(wh, "gpu_daily").group_by("date").agg(
        pl.col(m).sum() for m in MEASURES).sort("date")
    assert_frame_equal(daily, hourly, check_exact=False, rel_tol=1e-9, abs_tol=1e-6)


@pytest.mark.parametrize("order", [("h1",), ("h0", "h2", "h1"), ("h2", "h0")])
def test_a_day_covered_in_part_rolls_up_every_hour_of_it(
        history: Path, tmp_path: Path, order: tuple[str, ...]) -> None:
    """Pieces re-run on their own (--afresh) over the whole history: each covers its
    hour of the day; gpu_daily stays the sum of the day's gpu_hourly (it held the last
    piece's hours alone before)."""
    wh = tmp_path / "wh"
    shutil.copytree(history / "whole", wh)
    for piece in order:
        ingest(sorted((history / piece).glob("*.jsonl")), wh, ProcessorConfig(), afresh=True)
        _day_sums_agree(wh)
    assert read_table(wh, "gpu_hourly")["hour"].n_unique() == 3


def test_a_piece_without_inventory_leaves_no_day_roll_up_beside_empty_hours(
        tmp_path: Path) -> None:
    """A piece with jobs and no inventory, ingested --afresh over an hour and a half
    already ingested: its hours hold no GPU, and the day's roll-up says so too (it kept
    the earlier run's 1,800 allocated GPU-seconds beside an empty gpu_hourly)."""
    inv = ('{"v":1,"type":"inventory","time":"2026-01-05T10:00:00.000Z","node":"n1",'
           '"pool":"train","card_type":"H100","gpu_count":2,"gpu_mem_mib":81559.0,'
           '"schedulable":true,"health":"ok"}')

    def job(t: str, event: str, job_id: str, extra: str = "") -> str:
        return (f'{{"v":1,"type":"job","time":"2026-01-05T{t}.000Z","event":"{event}",'
                f'"job_id":"{job_id}"{extra}}}')

    alloc = ',"allocation":[{"node":"n1","gpu_index":%d}]'
    first, second = tmp_path / "p1.jsonl", tmp_path / "p2.jsonl"
    first.write_text("\n".join([
        inv, job("10:00:00", "submitted", "a", ',"team":"t"'),
        job("10:00:30", "started", "a", alloc % 0), job("10:20:00", "finished", "a"),
        job("11:06:00", "submitted", "end")]) + "\n")
    second.write_text("\n".join([
        job("10:55:00", "submitted", "b", ',"team":"t"'),
        job("10:55:30", "started", "b", alloc % 1), job("11:10:00", "finished", "b"),
        job("11:30:00", "submitted", "end2")]) + "\n")
    wh = tmp_path / "wh"
    ingest([first], wh, ProcessorConfig())
    assert read_table(wh, "gpu_daily")["allocated_gpu_hours"].sum() * 3600 == \
        pytest.approx(1170.0)
    ingest([second], wh, ProcessorConfig(), afresh=True)
    _day_sums_agree(wh)
    assert read_table(wh, "gpu_daily").is_empty()


@pytest.mark.parametrize("content", [b"{cut", b"[" * 100_000, b'{"first": 5}', b"[]"])
def test_an_unreadable_origin_is_not_known_rather_than_an_error(
        tmp_path: Path, content: bytes) -> None:
    """``origin.json`` is a file of the warehouse anyone with access could damage: read
    as not known (nested deeper than Python's JSON reader goes, it was a RecursionError
    out of every ingest)."""
    store = open_store(tmp_path / "wh")
    store.write(ingest_module.ORIGIN, json.dumps({"first": "2026-01-05T00:00:00+00:00"})
                .encode())
    assert ingest_module.read_origin(store) == datetime.fromisoformat(
        "2026-01-05T00:00:00+00:00")
    store.write(ingest_module.ORIGIN, content)
    assert ingest_module.read_origin(store) is None


def test_an_earlier_piece_after_a_later_one_is_refused(history: Path, tmp_path: Path) -> None:
    """Found by ingesting pieces in the wrong order: the history from 01:30 on, then the
    one before it. Nothing closes at or before the earlier piece's start, and it starts
    before the ingested history, so it was processed on its own: the hour both share
    (01:00) kept its minutes alone, the later piece's 01:30-01:59 were gone, with no
    word. It ends inside the history, in an hour of it: refused, nothing changed. (An
    earlier piece in hours of its own goes on its own, as the history's start:
    ``test_a_piece_processed_afresh_makes_the_later_states_stale``.) Both in one run
    (every file named) give the facts of the whole."""
    _split(history / "events", ["2026-01-05T01:30:00"],
           [tmp_path / "early", tmp_path / "late"])
    wh = tmp_path / "wh"
    _ingest(tmp_path / "late", wh)
    before = views(wh)
    with pytest.raises(IngestRefused, match=(
            r"^the input \(2026-01-05 00:00:00 to 2026-01-05 01:29:\d\d UTC\) starts before "
            r"the history already ingested \(2026-01-05 01:30 to 2026-01-05 03:00 UTC\), ends "
            r"inside it and shares its hour from 01:00: .* Ingest it together with the later")):
        _ingest(tmp_path / "early", wh)
    after = views(wh)
    for name in VIEWS:
        assert_frame_equal(after[name], before[name])
    both = ingest([*sorted((tmp_path / "early").glob("*.jsonl")),
                   *sorted((tmp_path / "late").glob("*.jsonl"))], wh, ProcessorConfig())
    assert both.continued_from is None
    assert_same_facts(wh, history / "whole", SPARSE)


def test_a_piece_given_with_the_inventory_again_goes_on_from_the_history(
        history: Path, tmp_path: Path) -> None:
    """pa, then pb with pa's inventory.jsonl again (dated at the history's start, as a
    whole inventory file is): the old records made pb start where the history starts,
    so it was processed on its own and replaced pa's hours with nothing, exit 0. Now the
    records the history already holds (the same node states) are left out: pb goes on
    from the state at the cut and every view equals one ingest of the whole. The
    inventory file alone changes nothing and deletes no state; one holding a node state
    the history does not have, or no longer holds (superseded before the cut), is
    refused, naming it, and changes nothing."""
    wh = tmp_path / "wh"
    _ingest(history / "pa", wh)
    states = _states(wh)
    before = views(wh)
    whole = history / "pa" / "inventory.jsonl"
    # a node state superseded before the cut is no longer in the saved state's book: not
    # known to be held, refused (nothing changes); the nodes that kept their state go on
    lines = whole.read_text().splitlines()
    nodes = [json.loads(x)["node"] for x in lines]
    steady = [x for x, n in zip(lines, nodes, strict=True) if nodes.count(n) == 1]
    assert 10 < len(steady) < len(lines)
    with pytest.raises(IngestRefused, match="inventory records that the history does not "
                       "hold"):
        ingest([whole], wh, ProcessorConfig())
    assert _states(wh) == states
    inventory = tmp_path / "inventory.jsonl"
    inventory.write_text("".join(f"{x}\n" for x in steady))
    alone = ingest([inventory], wh, ProcessorConfig())
    assert alone.nothing and alone.held == len(steady)
    assert _states(wh) == states
    after = views(wh)
    for name in VIEWS:
        assert_frame_equal(after[name], before[name])
    changed = tmp_path / "changed.jsonl"
    lines = inventory.read_text().splitlines()
    doc = json.loads(lines[1])
    doc["schedulable"] = not doc["schedulable"]
    changed.write_text("".join(f"{x}\n" for x in [lines[0], json.dumps(doc), *lines[2:]]))
    with pytest.raises(IngestRefused, match=(
            rf"inventory records that the history does not hold .* 1 in all, the first "
            rf"{changed}:2 \(an? inventory record")):
        ingest([*sorted((history / "pb").glob("*.jsonl")), changed], wh, ProcessorConfig())
    assert _states(wh) == states
    result = ingest([*sorted((history / "pb").glob("*.jsonl")), inventory], wh,
                    ProcessorConfig())
    assert _at_cut(result) and result.held == len(steady) and result.replaced_from is None
    assert sum(result.counters.rejected.values()) == 0
    assert_same_facts(wh, history / "whole", SPARSE)
