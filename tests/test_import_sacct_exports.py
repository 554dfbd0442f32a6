"""``gpuledger import slurm-sacct`` over several exports: daily (or monthly) ``sacct``
files read as one history.

The exports are cut from the one-file fixture of ``test_import_slurm_sacct.py`` the way
``sacct --starttime/--endtime`` prints them: a job that is still running or pending at
the cut is in the earlier export as ``RUNNING``/``PENDING`` (End ``Unknown``) and in the
later one as it ended. Imported together, the exports must give the facts of the whole
history, view by view.
"""

from __future__ import annotations

import random
import tempfile
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from pathlib import Path

import polars as pl
import pytest
from fact_views import VIEWS, views
from polars.testing import assert_frame_equal
from test_import_slurm_sacct import HEADER, ROWS

from gpuledger.cli.main import main
from gpuledger.pipeline.importers.slurm_sacct import load_sacct

CUT = "2026-01-05T10:30:00"


def _field(line: str, name: str) -> str:
    return line.split("|")[HEADER.split("|").index(name)]


def _with(line: str, **values: str) -> str:
    fields = line.split("|")
    for name, value in values.items():
        fields[HEADER.split("|").index(name)] = value
    return "|".join(fields)


def _as_of(line: str, cut: str) -> str | None:
    """The line as an export ending at ``cut`` prints it (None: submitted later)."""
    submit, start, end = (_field(line, c) for c in ("Submit", "Start", "End"))
    if submit and submit >= cut:
        return None
    if end != "Unknown" and end <= cut:
        return line
    if start != "Unknown" and start < cut:
        return _with(line, End="Unknown", State="RUNNING")
    return _with(line, Start="Unknown", End="Unknown", State="PENDING", AllocTRES="",
                 NodeList="None assigned")


def _after(line: str, cut: str) -> bool:
    """Whether an export from ``cut`` on prints the line (its job was not over)."""
    end = _field(line, "End")
    return end == "Unknown" or end > cut


def _exports(tmp_path: Path, cut: str = CUT) -> tuple[Path, Path, Path]:
    whole = tmp_path / "whole.txt"
    whole.write_text(HEADER + "\n" + "\n".join(ROWS) + "\n")
    first = tmp_path / "day-1.txt"
    first.write_text(HEADER + "\n" + "\n".join(
        out for line in ROWS if (out := _as_of(line, cut)) is not None) + "\n")
    # the later export names its columns in another order (a different --format)
    names = HEADER.split("|")
    order = names[::-1]
    second = tmp_path / "day-2.txt"
    second.write_text("|".join(order) + "\n" + "\n".join(
        "|".join(dict(zip(names, line.split("|"), strict=True))[c] for c in order)
        for line in ROWS if _after(line, cut)) + "\n")
    return whole, first, second


def _same(root: Path, expected: dict[str, object]) -> None:
    got = views(root)
    for name in VIEWS:
        assert_frame_equal(got[name], expected[name])  # type: ignore[arg-type]


def _import(root: Path | str, capsys: pytest.CaptureFixture[str], *files: Path,
            extra: tuple[str, ...] = ()) -> str:
    assert main(["import", "slurm-sacct", *map(str, files), "--warehouse", str(root),
                 "--quiet", *extra]) == 0
    return capsys.readouterr().out


def test_two_daily_exports_give_the_facts_of_one(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    whole, first, second = _exports(tmp_path)
    # the cut really splits the history: jobs running across it, jobs only in one export
    one, two = first.read_text(), second.read_text()
    assert "|RUNNING|" in one and "|PENDING|" in one and "|COMPLETED|" in one
    assert "|train-a|" in one and "|train-a|" in two
    assert "oops" in one and "oops" not in two       # cancelled before the cut
    _import(tmp_path / "whole", capsys, whole)
    expected = views(tmp_path / "whole")
    assert expected["job_attempts"].height == 11 and expected["gpu_minute"].height > 0
    out = _import(tmp_path / "both", capsys, first, second)
    assert out.startswith("slurm-sacct: 2 files, "), out
    # 100, 101's second attempt, 102, 103, 104, 106, 107, 200_1 and 200_2 are in both
    # (103 and 104 as they were, the others as they ended)
    assert "9 attempt(s) in more than one line (the line that knows most taken)" in out, out
    _same(tmp_path / "both", expected)
    # the order of the files does not matter
    _import(tmp_path / "reversed", capsys, second, first)
    _same(tmp_path / "reversed", expected)


def test_exports_joined_by_hand_into_one_file_are_read_the_same(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``cat day-1.txt day-2.txt`` (one header kept): an attempt printed twice is one
    attempt, not a requeue at its own Submit."""
    whole, first, _second = _exports(tmp_path)
    joined = tmp_path / "joined.txt"
    later = [line for line in ROWS if _after(line, CUT)]
    joined.write_text(first.read_text() + "\n".join(later) + "\n")
    _import(tmp_path / "whole", capsys, whole)
    _import(tmp_path / "joined", capsys, joined)
    _same(tmp_path / "joined", views(tmp_path / "whole"))


def test_the_line_that_knows_most_is_taken_whatever_the_order() -> None:
    """Per attempt (job id and Submit): an End over none, a Start over none, else the
    last one given."""
    def probe(state: str, start: str, end: str, nodes: str = "gpu-1") -> str:
        return (f"9|9|x|a|u|gpu|n|1|2026-01-05T10:00:00|{start}|{end}|{state}|0:0|"
                f"gres/gpu=1|gres/gpu=1|{nodes}|")
    pending = probe("PENDING", "Unknown", "Unknown", "None assigned")
    running = probe("RUNNING", "2026-01-05T10:05:00", "Unknown")
    done = probe("COMPLETED", "2026-01-05T10:05:00", "2026-01-05T10:25:00")
    for lines in ([pending, running, done], [done, running, pending],
                  [running, done, pending]):
        events = _events(lines)
        assert events == [("submitted", "10:00:00"), ("started", "10:05:00"),
                          ("finished", "10:25:00")], lines
    assert _events([pending, running]) == [("submitted", "10:00:00"),
                                           ("started", "10:05:00")]
    # both ended, differently (a record corrected in the database): the last given
    late = probe("FAILED", "2026-01-05T10:05:00", "2026-01-05T10:26:00")
    assert _events([done, late])[-1] == ("failed", "10:26:00")
    assert _events([late, done])[-1] == ("finished", "10:25:00")


def _events(lines: list[str]) -> list[tuple[str, str]]:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "s.txt"
        path.write_text(HEADER + "\n" + "\n".join(lines) + "\n")
        job = load_sacct([path]).frames["job"]
    return [(e, t.strftime("%H:%M:%S"))
            for e, t in zip(job["event"].to_list(), job["time"].to_list(), strict=True)
            if isinstance(t, datetime)]


def test_bad_lines_and_errors_name_their_file(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = tmp_path / "good.txt"
    good.write_text(HEADER + "\n" + ROWS[0] + "\n")
    bad = tmp_path / "bad.txt"
    bad.write_text(HEADER + "\n" + _with(ROWS[0], JobID="1", JobIDRaw="1",
                                         State="BOGUS") + "\n")
    out = _import(tmp_path / "wh", capsys, good, bad)
    assert f"{bad}:2: State 'BOGUS' is not a job state" in out, out
    assert f"{good}:2" not in out
    # a file that cannot be read stops the whole import before anything is written
    broken = tmp_path / "broken.txt"
    broken.write_text("JobID|State\n1|COMPLETED\n")
    assert main(["import", "slurm-sacct", str(good), str(broken), "--warehouse",
                 str(tmp_path / "wh2"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert f"{broken}: missing column(s) Submit, Start, End" in err, err
    assert not (tmp_path / "wh2").exists()
    # the same file named twice is one input
    assert main(["import", "slurm-sacct", str(good), str(good), "--warehouse",
                 str(tmp_path / "wh3"), "--quiet"]) == 2
    assert f"{good} is named twice" in capsys.readouterr().err


def test_todays_export_goes_in_with_the_earlier_ones_without_replace(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Yesterday's export was imported; today all exports are imported again: the hours
    yesterday's file alone wrote are replaced without ``--replace``, and the warehouse
    holds the facts of the whole history. A file that was not part of that import is
    still refused."""
    whole, first, second = _exports(tmp_path)
    _import(tmp_path / "whole", capsys, whole)
    wh = tmp_path / "wh"
    _import(wh, capsys, first)
    _import(wh, capsys, first, second)
    _same(wh, views(tmp_path / "whole"))
    # the same again (a cron job run twice) goes too
    _import(wh, capsys, first, second)
    _same(wh, views(tmp_path / "whole"))
    # the later export alone is not the history the warehouse holds: refused
    assert main(["import", "slurm-sacct", str(second), "--warehouse", str(wh),
                 "--quiet"]) == 2
    assert "already holds facts" in capsys.readouterr().err
    _same(wh, views(tmp_path / "whole"))


def test_an_import_replaced_since_is_refused_when_run_again(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Import A, then B over A's hours with ``--replace``: A's facts are gone, so A run
    again would replace B's. It went silently before (A was recorded); refused now:
    A does not go on from B's history (job 108 was cancelled at 10:30 as A tells it,
    requeued as B does)."""
    whole, first, _second = _exports(tmp_path)
    wh = tmp_path / "wh"
    _import(wh, capsys, first)
    _import(wh, capsys, whole, extra=("--replace",))
    held = views(wh)
    assert main(["import", "slurm-sacct", str(first), "--warehouse", str(wh),
                 "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "before 2026-01-05 11:21 UTC, where the warehouse's Slurm history ends" in err, err
    _same(wh, held)


def test_reading_says_how_far_it_is(tmp_path: Path) -> None:
    """Reading several exports reports the share of their bytes read, rising to 1."""
    _whole, first, second = _exports(tmp_path)
    seen: list[float] = []
    load_sacct([first, second], on_progress=seen.append)
    assert seen == sorted(seen) and seen[-1] == 1.0
    share = first.stat().st_size / (first.stat().st_size + second.stat().st_size)
    assert share in seen          # after the first file


NODES = "".join(f"NodeName=gpu-{i} Gres=gpu:h100:8 State=IDLE Partitions=gpu\n"
                for i in range(1, 7))


def _same_but_waiting_cards(root: Path | str, expected: dict[str, pl.DataFrame],
                            teams: set[str]) -> None:
    """Every view equal but ``pending_minute``, whose waiting jobs and GPUs per minute
    are equal and whose card types differ only for the jobs of ``teams`` pending at a
    cut, typed by a later export."""
    got = views(root)
    for name in VIEWS:
        if name != "pending_minute":
            assert_frame_equal(got[name], expected[name])
    keys = ["minute", "queue", "pool", "team"]

    def waiting(frame: pl.DataFrame) -> pl.DataFrame:
        return frame.group_by(keys).agg(pl.col("pending_jobs", "pending_gpus").sum()
                                         ).sort(keys)

    assert_frame_equal(waiting(got["pending_minute"]), waiting(expected["pending_minute"]))
    differ = got["pending_minute"].join(expected["pending_minute"], how="anti",
                                        on=got["pending_minute"].columns, nulls_equal=True)
    assert set(differ["team"]) == teams, differ


def _whole_with_nodes(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                      *more: str) -> tuple[tuple[str, ...], dict[str, pl.DataFrame]]:
    """The options that give the nodes (``NODES``, and ``more``), and the views of the one
    export imported with them."""
    nodes = tmp_path / "nodes.txt"
    nodes.write_text(NODES)
    extra = ("--nodes", str(nodes), *more)
    whole = tmp_path / "whole.txt"
    whole.write_text(HEADER + "\n" + "\n".join(ROWS) + "\n")
    _import(tmp_path / "whole", capsys, whole, extra=extra)
    return extra, views(tmp_path / "whole")


def _daily(tmp_path: Path, cuts: list[str]) -> list[Path]:
    """The exports of the windows between ``cuts`` (open at both ends), as sacct prints
    each: a job over before the window's start is not in it."""
    bounds = ["", *cuts, "9999"]
    files = []
    for k, (since, until) in enumerate(pairwise(bounds)):
        path = tmp_path / f"export-{k}.txt"
        path.write_text(HEADER + "\n" + "\n".join(
            out for line in ROWS
            if (not since or _after(line, since)) and (out := _as_of(line, until)) is not None)
            + "\n")
        files.append(path)
    return files


def test_todays_export_alone_goes_on_from_the_history(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The daily cron: each export imported alone, the day after the one before, goes on
    from where the warehouse's history ended and gives the facts of the one export.
    Cut at 10:12 and 10:35: jobs 100 and 102 hold GPUs 0-2 of gpu-1 across the first
    cut, and 200_1 and 200_2 start there after it (on GPUs 3 and 4, as in the one
    export: a placement that forgot the running attempts would give them 0 and 1, held
    twice); 103, 106 and 107 run or wait across the second. Before, the second export
    was refused.

    One difference, on purpose: a job pending at a cut waits, in ``pending_minute``,
    with the card type its line then requested (``ReqTRES`` ``gres/gpu=8``: any card,
    null), where the one export gives its whole wait the card it got later (its last
    line's typed ``AllocTRES``). The jobs and GPUs waiting per minute are the same."""
    files = _daily(tmp_path, ["2026-01-05T10:12:00", "2026-01-05T10:35:00"])
    assert "|RUNNING|" in files[0].read_text() and "|RUNNING|" in files[1].read_text()
    extra, expected = _whole_with_nodes(tmp_path, capsys)
    assert expected["gpu_minute"].filter(pl.col("alloc_fraction") > 1).is_empty()
    wh = tmp_path / "wh"
    out = _import(wh, capsys, files[0], extra=extra)
    assert "went on from" not in out
    out = _import(wh, capsys, files[1], extra=extra)
    assert ("went on from the Slurm history in " in out
            and "which ended at 2026-01-05 10:10 UTC" in out), out
    out = _import(wh, capsys, files[2], extra=extra)
    assert "which ended at 2026-01-05 10:33 UTC" in out, out
    # 103 (pending 10:05-10:15 across the 10:12 cut) and 107 (10:09-10:41, both cuts)
    _same_but_waiting_cards(wh, expected, {"platform", "nlp"})
    # the last export again (the cron run twice): it goes on from the same point again
    out = _import(wh, capsys, files[2], extra=extra)
    assert "which ended at 2026-01-05 10:33 UTC" in out, out
    _same_but_waiting_cards(wh, expected, {"platform", "nlp"})
    # the middle export alone again would drop the last one's facts: refused
    assert main(["import", "slurm-sacct", str(files[1]), "--warehouse", str(wh),
                 "--quiet", *extra]) == 2
    err = capsys.readouterr().err
    assert ("would go on from the warehouse's Slurm history at 2026-01-05 10:10 UTC, but "
            "it goes on past there with 1 export(s) not given here") in err, err
    # with the last one it goes: both go on from the first
    out = _import(wh, capsys, files[1], files[2], extra=extra)
    assert "which ended at 2026-01-05 10:10 UTC" in out, out
    _same_but_waiting_cards(wh, expected, {"platform", "nlp"})
    # every export together, as before: on its own, the same facts
    out = _import(wh, capsys, *files, extra=extra)
    assert "went on from" not in out
    _same(wh, expected)
    # and the next export would go on from there
    assert main(["import", "slurm-sacct", str(files[0]), "--warehouse", str(wh),
                 "--quiet", *extra]) == 2
    assert "already holds facts" in capsys.readouterr().err
    _same(wh, expected)


def test_an_export_after_a_missing_one_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The cron missed a day: the export after it, alone, starts after the history's end.
    sacct prints every job that ran in its window, so jobs the history holds running at
    its end that the export does not print ended in the gap.
    Going on, they would hold their GPUs for ever (102 here, preempted at 10:31:10, and
    106, failed at 10:33:20): refused, nothing changed. Before, it went on. With the
    missing export it goes, and gives the facts of the one export."""
    files = _daily(tmp_path, ["2026-01-05T10:12:00", "2026-01-05T10:35:00"])
    assert "|102|" in files[1].read_text() and "|102|" not in files[2].read_text()
    extra, expected = _whole_with_nodes(tmp_path, capsys)
    wh = tmp_path / "wh"
    _import(wh, capsys, files[0], extra=extra)
    held = views(wh)
    assert main(["import", "slurm-sacct", str(files[2]), "--warehouse", str(wh),
                 "--quiet", *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpuledger: error: 2 job(s) running at 2026-01-05 "
                          "10:10 UTC, where the warehouse's Slurm history ends, are in "
                          "none of these exports (e.g. 102, 106)"), err
    assert err.rstrip().endswith("Import the missing export first (or with these), or "
                                 "every export together"), err
    _same(wh, held)
    # an export of its header alone (sacct of a window when the cluster's accounting was
    # down) is refused the same way: the jobs running there are in none of it
    empty = tmp_path / "empty.txt"
    empty.write_text(HEADER + "\n")
    assert main(["import", "slurm-sacct", str(empty), "--warehouse", str(wh),
                 "--quiet", *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpuledger: error: 5 job(s) running at 2026-01-05 10:10 UTC, "
                          "where the warehouse's Slurm history ends, are in none of "
                          "these exports"), err
    _same(wh, held)
    out = _import(wh, capsys, files[1], files[2], extra=extra)
    assert "which ended at 2026-01-05 10:10 UTC" in out, out
    _same_but_waiting_cards(wh, expected, {"platform", "nlp"})


HELD = ("300|300|held|vision|ana|gpu|normal|50|2026-01-05T10:05:00|2026-01-05T10:40:00|"
        "2026-01-05T10:50:00|COMPLETED|0:0|cpu=1,gres/gpu:h100=1,gres/gpu=1,node=1|"
        "cpu=1,gres/gpu=1|gpu-6|")
"""A job submitted at 10:05 but held (or waiting on a dependency, or on a begin time)
until 10:40: sacct prints it in no window before it is eligible to run."""

DEMAND = ["frag_demand", "demand_source", "pending_jobs", "pending_gpus", "blocked_jobs",
          "blocked_gpus"]


def test_a_job_held_before_the_history_ends_is_taken_from_its_submission(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Found with a real slurmdbd: a job submitted before the history's end that no
    earlier export printed, as sacct prints a job only once it is eligible to run (held,
    a dependency, ``--begin``), came up in the next export with its Submit before the
    history's end, and the import was refused as "events before then that it does not
    hold". It is taken now, counted: its attempt, queue wait and GPU-time are those of
    the one export. Only its wait in the minutes the history had closed (10:05-10:32) is
    not in ``pending_minute``, nor in those minutes' demand in ``frag_minute``."""
    rows = [*ROWS, HELD]
    whole = tmp_path / "whole.txt"
    whole.write_text(HEADER + "\n" + "\n".join(rows) + "\n")
    cut = "2026-01-05T10:35:00"
    first = tmp_path / "first.txt"
    first.write_text(HEADER + "\n" + "\n".join(
        out for line in ROWS if (out := _as_of(line, cut)) is not None) + "\n")
    second = tmp_path / "second.txt"
    second.write_text(HEADER + "\n" + "\n".join(
        line for line in rows if _after(line, cut)) + "\n")
    nodes = tmp_path / "nodes.txt"
    nodes.write_text(NODES)
    extra = ("--nodes", str(nodes))
    _import(tmp_path / "whole", capsys, whole, extra=extra)
    expected = views(tmp_path / "whole")
    wh = tmp_path / "wh"
    _import(wh, capsys, first, extra=extra)
    out = _import(wh, capsys, second, extra=extra)
    assert ("which ended at 2026-01-05 10:33 UTC" in out
            and "; 1 job(s) submitted before then that no earlier export printed (held, "
            "or waiting on a dependency or a begin time" in out), out
    got = views(wh)
    for name in VIEWS:
        if name not in ("pending_minute", "frag_minute"):
            assert_frame_equal(got[name], expected[name])
    held = got["job_attempts"].filter(pl.col("job_id") == "300")
    assert held["queue_wait_s"].to_list() == [35 * 60]
    before = pl.col("minute").dt.replace_time_zone(None) < datetime(2026, 1, 5, 10, 33)
    for name in ("pending_minute", "frag_minute"):
        assert_frame_equal(got[name].filter(~before), expected[name].filter(~before))
    # before the history's end: one waiting job and GPU fewer each minute it waited
    waiting = [views_of.filter(before).group_by("minute").agg(
        pl.col("pending_jobs", "pending_gpus").sum()).sort("minute")
        for views_of in (expected["pending_minute"], got["pending_minute"])]
    gap = waiting[0].join(waiting[1], on="minute", how="left").select(
        "minute", pl.col("pending_jobs") - pl.col("pending_jobs_right").fill_null(0),
        pl.col("pending_gpus") - pl.col("pending_gpus_right").fill_null(0)).filter(
        pl.col("pending_jobs") != 0)
    assert gap["minute"].dt.minute().to_list() == list(range(5, 33))
    assert set(gap["pending_jobs"]) == {1} and set(gap["pending_gpus"]) == {1}
    rest = [c for c in expected["frag_minute"].columns if c not in DEMAND]
    assert_frame_equal(got["frag_minute"].select(rest), expected["frag_minute"].select(rest))


def test_an_export_alone_without_nodes_keeps_the_attempts_exact(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Without ``--nodes`` the inventory is inferred from each export: a node first seen
    in a later one (gpu-4 and gpu-5, job 107 after the cut) counts from where that
    export goes on, not from the history's start. The attempts, their GPUs and
    preemptions are those of the one export all the same."""
    files = _daily(tmp_path, ["2026-01-05T10:35:00"])
    whole = tmp_path / "whole.txt"
    whole.write_text(HEADER + "\n" + "\n".join(ROWS) + "\n")
    _import(tmp_path / "whole", capsys, whole)
    wh = tmp_path / "wh"
    _import(wh, capsys, files[0])
    _import(wh, capsys, files[1])
    names = ["job_attempts", "job_gpu", "preemptions"]
    got, want = views(wh, names), views(tmp_path / "whole", names)
    for name in names:
        assert_frame_equal(got[name], want[name])
    daily = [views(root, ["gpu_daily"])["gpu_daily"].select(
        pl.col("gpu_hours", "allocated_gpu_hours").sum()).row(0)
        for root in (wh, tmp_path / "whole")]
    assert daily[0][1] == pytest.approx(daily[1][1])    # allocated: the same
    assert daily[0][0] < daily[1][0]                    # capacity: less before the cut


def test_a_damaged_state_stops_the_next_export_with_its_reason(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The state the next export would go on from cannot be read: refused with the
    state's name and what to do, nothing changed."""
    files = _daily(tmp_path, ["2026-01-05T10:35:00"])
    wh = tmp_path / "wh"
    _import(wh, capsys, files[0])
    held = views(wh)
    (state,) = (wh / "state" / "import-slurm-sacct").iterdir()
    (state / "partition-p000.checkpoint").write_bytes(b"garbage")
    assert main(["import", "slurm-sacct", str(files[1]), "--warehouse", str(wh),
                 "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"gpuledger: error: state/import-slurm-sacct/{state.name}: the "
                          "saved state this input continues from cannot be read"), err
    assert err.rstrip().endswith("Import every export together, or pass --replace"), err
    _same(wh, held)


def test_an_export_overlapping_the_history_goes_on_from_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A cron that exports from further back than the last cut (for safety): the jobs the
    history holds are taken from it, those over before its end that its book no longer
    remembers (here a minute before the history's end: ``windows.ended_job_memory_s``
    past ``handover_retention_s``, 30 s each) are counted and left out, and the facts
    are those of the one export."""
    files = _daily(tmp_path, ["2026-01-05T10:35:00"])
    overlapping = tmp_path / "from-10-20.txt"
    overlapping.write_text(HEADER + "\n" + "\n".join(
        line for line in ROWS if _after(line, "2026-01-05T10:20:00")) + "\n")
    config = tmp_path / "config.yaml"
    config.write_text("windows:\n  ended_job_memory_s: 30\n  handover_retention_s: 30\n")
    extra, expected = _whole_with_nodes(tmp_path, capsys, "--config", str(config))
    wh = tmp_path / "wh"
    _import(wh, capsys, files[0], extra=extra)
    out = _import(wh, capsys, overlapping, extra=extra)
    # 102 (preempted 10:31:10, not requeued): over before 10:32, forgotten at 10:33
    assert "which ended at 2026-01-05 10:33 UTC" in out, out
    assert "1 job(s) over before then that it no longer remembers" in out, out
    _same_but_waiting_cards(wh, expected, {"nlp"})   # 107


def test_a_quiet_day_changes_nothing_and_the_next_goes_on(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An export in which nothing happened (10:35-10:36: jobs still running or waiting,
    as the history has them) writes nothing and says so, exit 0 (a cron must not fail on
    a quiet day); the next export goes on from the history as before."""
    files = _daily(tmp_path, ["2026-01-05T10:35:00", "2026-01-05T10:36:00"])
    assert "|RUNNING|" in files[1].read_text()
    extra, expected = _whole_with_nodes(tmp_path, capsys)
    wh = tmp_path / "wh"
    _import(wh, capsys, files[0], extra=extra)
    held = views(wh)
    out = _import(wh, capsys, files[1], extra=extra)
    assert ("did not hold already: it is unchanged (the next export goes on from "
            "2026-01-05 10:33 UTC)" in out), out
    _same(wh, held)
    out = _import(wh, capsys, files[2], extra=extra)
    assert "which ended at 2026-01-05 10:33 UTC" in out, out
    _same_but_waiting_cards(wh, expected, {"nlp"})   # 107


def test_until_closes_a_days_facts_to_the_exports_end(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--until`` (the exports' ``--endtime``): each import's facts reach it, not only
    its newest event (10:33:20 in the first export: the history ended at 10:33), a quiet
    export's too, and the next export goes on from there; the end result is the one
    export's facts. A time after now, or before where the history ends, is refused."""
    files = _daily(tmp_path, ["2026-01-05T10:35:00", "2026-01-05T10:36:00"])
    extra, expected = _whole_with_nodes(tmp_path, capsys)
    wh = tmp_path / "wh"
    _import(wh, capsys, files[0], extra=(*extra, "--until", "2026-01-05T10:35:00"))
    last = views(wh, ["gpu_minute"])["gpu_minute"]["minute"].max()
    assert last == datetime(2026, 1, 5, 10, 34, tzinfo=UTC)     # the minute before 10:35
    out = _import(wh, capsys, files[1], extra=(*extra, "--until", "2026-01-05T10:36:00"))
    assert "which ended at 2026-01-05 10:35 UTC" in out and "unchanged" not in out, out
    assert main(["import", "slurm-sacct", str(files[2]), "--warehouse", str(wh), "--quiet",
                 *extra, "--until", "2026-01-05T10:30:00"]) == 2
    assert "--until 2026-01-05 10:30 UTC is before 2026-01-05 10:36 UTC" in \
        capsys.readouterr().err
    assert main(["import", "slurm-sacct", str(files[2]), "--warehouse", str(wh), "--quiet",
                 *extra, "--until", "2999-01-01T00:00:00"]) == 2
    assert "after now" in capsys.readouterr().err
    # an --until before the export's end: its later events wait in the job book
    early = tmp_path / "early"
    out = _import(early, capsys, files[0], extra=(*extra, "--until", "2026-01-05T10:20:00"))
    assert "event(s) at or after --until 2026-01-05 10:20 UTC: taken into the job" in out
    for f, until in ((files[1], "2026-01-05T10:36:00"), (files[2], None)):
        _import(early, capsys, f, extra=(*extra, *(["--until", until] if until else [])))
    _same_but_waiting_cards(early, expected, {"nlp"})   # 107
    out = _import(wh, capsys, files[2], extra=extra)
    assert "which ended at 2026-01-05 10:36 UTC" in out, out
    _same_but_waiting_cards(wh, expected, {"nlp"})   # 107


def test_the_daily_chain_on_a_bucket(s3_env: str, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    """The warehouse in an S3 bucket (a real S3 server): the states are kept there, and
    three exports imported one by one give the one export's facts, as in a folder."""
    files = _daily(tmp_path, ["2026-01-05T10:12:00", "2026-01-05T10:35:00"])
    extra, expected = _whole_with_nodes(tmp_path, capsys)
    url = s3_env + "/wh"
    outs = [_import(url, capsys, f, extra=extra) for f in files]
    assert "went on from" not in outs[0]
    assert "which ended at 2026-01-05 10:10 UTC" in outs[1], outs[1]
    assert "which ended at 2026-01-05 10:33 UTC" in outs[2], outs[2]
    _same_but_waiting_cards(url, expected, {"platform", "nlp"})


def _random_history(seed: int) -> list[dict[str, object]]:
    """Six hours of a 64-GPU cluster (8 nodes of 8): jobs of 1-8 GPUs on the node whose
    GPUs free up first, some requeued once, some still running or pending at the end;
    times to the second, so that cuts fall inside minutes."""
    rng = random.Random(seed)
    t0 = datetime(2026, 1, 5, 8, tzinfo=UTC)
    free = [[0.0] * 8 for _ in range(8)]
    out: list[dict[str, object]] = []
    t = 0.0
    for job in range(100, 100 + 60):
        t += rng.expovariate(1 / 300)
        size = rng.choice([1, 1, 2, 4, 8])
        node = min(range(8), key=lambda n: sorted(free[n])[size - 1])
        start = max(t, sorted(free[node])[size - 1])
        run = rng.uniform(120, 5400)
        requeue = rng.random() < 0.15
        attempts = [(t, start, start + (run / 3 if requeue else run),
                     "REQUEUED" if requeue else rng.choice(["COMPLETED", "FAILED"]))]
        if requeue:
            again = attempts[0][2] + 20
            attempts.append((again, again + 45, again + 45 + run, "COMPLETED"))
        order = sorted(range(8), key=lambda i: free[node][i])
        for i in order[:size]:
            free[node][i] = attempts[-1][2]
        for sub, st, en, state in attempts:
            out.append({"job": str(job), "submit": t0 + timedelta(seconds=round(sub)),
                        "start": t0 + timedelta(seconds=round(st)),
                        "end": t0 + timedelta(seconds=round(en)), "state": state,
                        "gpus": size, "node": f"gpu-{node + 1}"})
    return out


def _line(a: dict[str, object], cut: datetime) -> str | None:
    """The attempt as an export ending at ``cut`` prints it (None: submitted later)."""
    submit, start, end = a["submit"], a["start"], a["end"]
    assert isinstance(submit, datetime) and isinstance(start, datetime)
    assert isinstance(end, datetime)
    if submit >= cut:
        return None
    state, s_text, e_text = str(a["state"]), f"{start:%Y-%m-%dT%H:%M:%S}", \
        f"{end:%Y-%m-%dT%H:%M:%S}"
    tres, nodes = f"gres/gpu={a['gpus']}", str(a["node"])
    if end > cut:
        e_text = "Unknown"
        if start < cut:
            state = "RUNNING"
        else:
            state, s_text, tres, nodes = "PENDING", "Unknown", "", "None assigned"
    return (f"{a['job']}|{a['job']}|j|acct|u|gpu|normal|50|{submit:%Y-%m-%dT%H:%M:%S}|"
            f"{s_text}|{e_text}|{state}|0:0|{tres}|gres/gpu={a['gpus']}|{nodes}|")


@pytest.mark.parametrize("seed", [1, 2, 3, 10, 26])
def test_random_histories_cut_anywhere_give_the_facts_of_one_export(
        seed: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Random histories (requeues, jobs running and waiting at the end) cut at three
    random seconds into exports as ``sacct --starttime/--endtime`` prints them, imported
    one by one, each going on from the last: every view equals the one export's
    (untyped GPUs: no card type learnt later). Seeds 10 and 26 cut a minute between a
    job's last event in one export and its end in the next (10:27:06, and the end at
    10:27:38): a history closed to the minute after its newest event refused that end;
    it now ends inside the minute its newest event falls in."""
    rng = random.Random(seed)
    attempts = _random_history(seed)
    t0 = datetime(2026, 1, 5, 8, tzinfo=UTC)
    end = max(a["submit"] for a in attempts) + timedelta(minutes=1)  # type: ignore[type-var]
    span = int((end - t0).total_seconds())  # type: ignore[operator]
    cuts = sorted(t0 + timedelta(seconds=rng.randrange(1800, span - 60)) for _ in range(3))
    nodes = tmp_path / "nodes.txt"
    nodes.write_text(NODES.replace("Gres=gpu:h100:8", "Gres=gpu:8")
                     + "NodeName=gpu-7 Gres=gpu:8 State=IDLE Partitions=gpu\n"
                     "NodeName=gpu-8 Gres=gpu:8 State=IDLE Partitions=gpu\n")
    extra = ("--nodes", str(nodes))
    whole = tmp_path / "whole.txt"
    whole.write_text(HEADER + "\n" + "\n".join(
        x for a in attempts if (x := _line(a, end)) is not None) + "\n")
    _import(tmp_path / "whole", capsys, whole, extra=extra)
    wh = tmp_path / "wh"
    bounds = [None, *cuts, end]
    for k, (since, until) in enumerate(pairwise(bounds)):
        path = tmp_path / f"export-{k}.txt"
        path.write_text(HEADER + "\n" + "\n".join(
            x for a in attempts
            if (since is None or a["end"] > since)  # type: ignore[operator]
            and (x := _line(a, until)) is not None) + "\n")  # type: ignore[arg-type]
        out = _import(wh, capsys, path, extra=extra)
        # (an export in which nothing happened changes nothing)
        assert (k == 0) == ("went on from" not in out and "unchanged" not in out), out
    _same(wh, views(tmp_path / "whole"))
