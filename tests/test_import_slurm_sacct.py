"""``gpuledger import slurm-sacct``: a sacct -P file through the processor.

The expected queue waits and allocated GPU-minutes are computed in the test from the
file itself (Start − Submit per line; minutes whose middle lies in [Start, end) × GPUs).
"""

from __future__ import annotations

import csv
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from gpuledger.cli.main import main
from gpuledger.pipeline import query
from gpuledger.pipeline.importers.slurm_sacct import SacctError, load_sacct

HEADER = ("JobID|JobIDRaw|JobName|Account|User|Partition|QOS|Priority|Submit|Start|End|State|"
          "ExitCode|AllocTRES|ReqTRES|NodeList|GresIDX")
T = "2026-01-05T"
ROWS = [
    # a 2-GPU job and its steps
    f"100|100|train-a|vision|ana|gpu|normal|50|{T}10:00:00|{T}10:00:05|{T}10:40:05|COMPLETED|0:0|"
    "billing=2,cpu=2,gres/gpu:h100=2,gres/gpu=2,mem=8G,node=1|cpu=2,gres/gpu=2|gpu-1|",
    f"100.batch|100.batch|batch|vision||||||{T}10:00:05|{T}10:40:05|COMPLETED|0:0|"
    "cpu=2,gres/gpu=2,mem=8G,node=1||gpu-1|",
    f"100.extern|100.extern|extern|vision||||||{T}10:00:05|{T}10:40:05|COMPLETED|0:0|"
    "cpu=2,gres/gpu=2,mem=8G,node=1||gpu-1|",
    # requeued once (--duplicates: one line per attempt), then completed
    f"101|101|train-b|nlp|bo|gpu|high|90|{T}10:01:00|{T}10:03:30|{T}10:20:00|REQUEUED|0:0|"
    "cpu=4,gres/gpu:h100=4,gres/gpu=4,node=1|cpu=4,gres/gpu=4|gpu-2|",
    f"101|101|train-b|nlp|bo|gpu|high|90|{T}10:20:00|{T}10:26:40|{T}11:05:00|COMPLETED|0:0|"
    "cpu=4,gres/gpu:h100=4,gres/gpu=4,node=1|cpu=4,gres/gpu=4|gpu-2|",
    f"101.0|101.0|python|nlp||||||{T}10:26:40|{T}11:05:00|COMPLETED|0:0|cpu=4|||",
    # preempted, not requeued
    f"102|102|scav|vision|ana|gpu|low|10|{T}10:02:00|{T}10:02:10|{T}10:31:10|PREEMPTED|0:15|"
    "cpu=1,gres/gpu:h100=1,gres/gpu=1,node=1|cpu=1,gres/gpu=1|gpu-1|",
    # still running
    f"103|103|serve|platform|cy|gpu|normal|50|{T}10:05:00|{T}10:15:00|Unknown|RUNNING|0:0|"
    "cpu=1,gres/gpu:h100=1,gres/gpu=1,node=1|cpu=1,gres/gpu=1|gpu-3|",
    # still pending
    f"104|104|big|nlp|bo|gpu|normal|50|{T}10:06:00|Unknown|Unknown|PENDING|0:0||"
    "cpu=8,gres/gpu=8|None assigned|",
    # cancelled before it started
    f"105|105|oops|vision|ana|gpu|normal|50|{T}10:07:00|{T}10:09:00|{T}10:09:00|"
    "CANCELLED by 1000|0:0||cpu=1,gres/gpu=1|None assigned|",
    # failed, with GPU indices recorded by a completion script
    f"106|106|eval-x|vision|ana|gpu|normal|50|{T}10:08:00|{T}10:10:00|{T}10:33:20|FAILED|1:0|"
    "cpu=2,gres/gpu:h100=2,gres/gpu=2,node=1|cpu=2,gres/gpu=2|gpu-3|gpu-3:5-6",
    # a 16-GPU job over two nodes
    f"107|107|pretrain|nlp|bo|gpu|high|90|{T}10:09:00|{T}10:41:00|{T}11:21:00|TIMEOUT|0:0|"
    "cpu=32,gres/gpu:h100=16,gres/gpu=16,node=2|cpu=32,gres/gpu=16|gpu-[4-5]|",
    # preempted and requeued (PreemptMode=REQUEUE): two lines, then completed
    f"108|108|ft-z|nlp|bo|gpu|low|10|{T}10:03:00|{T}10:04:00|{T}10:30:00|PREEMPTED|0:15|"
    "cpu=2,gres/gpu:h100=2,gres/gpu=2,node=1|cpu=2,gres/gpu=2|gpu-6|",
    f"108|108|ft-z|nlp|bo|gpu|low|10|{T}10:30:00|{T}10:50:00|{T}11:10:00|COMPLETED|0:0|"
    "cpu=2,gres/gpu:h100=2,gres/gpu=2,node=1|cpu=2,gres/gpu=2|gpu-6|",
    # array tasks (JobIDRaw is the unique id) and a pending range
    f"200_1|201|sweep|vision|ana|gpu|normal|50|{T}10:10:00|{T}10:12:00|{T}10:52:00|COMPLETED|"
    "0:0|cpu=1,gres/gpu:h100=1,gres/gpu=1,node=1|cpu=1,gres/gpu=1|gpu-1|",
    f"200_2|202|sweep|vision|ana|gpu|normal|50|{T}10:10:00|{T}10:15:00|{T}10:45:00|COMPLETED|"
    "0:0|cpu=1,gres/gpu:h100=1,gres/gpu=1,node=1|cpu=1,gres/gpu=1|gpu-1|",
    f"200_[3-5]|200|sweep|vision|ana|gpu|normal|50|{T}10:10:00|Unknown|Unknown|PENDING|0:0||"
    "cpu=1,gres/gpu=1|None assigned|",
    # a CPU-only job
    f"300|300|etl|data|di|cpu|normal|50|{T}10:00:00|{T}10:00:00|{T}10:30:00|COMPLETED|0:0|"
    "cpu=16,mem=64G,node=1|cpu=16|cpu-1|",
]
# The last event in the file: minutes close up to here.
LAST = datetime(2026, 1, 5, 11, 21, tzinfo=UTC)


@pytest.fixture(scope="module")
def sacct_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("sacct") / "sacct.txt"
    path.write_text(HEADER + "\n" + "\n".join(ROWS) + "\n")
    return path


@pytest.fixture(scope="module")
def warehouse(sacct_file: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("wh")
    assert main(["import", "slurm-sacct", str(sacct_file), "--warehouse", str(root),
                 "--quiet"]) == 0
    return root


def _lines(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return [r for r in csv.DictReader(f, delimiter="|")
                if "." not in r["JobID"] and "[" not in r["JobID"]
                and "gres/gpu=" in (r["AllocTRES"] or r["ReqTRES"])]


def _t(text: str) -> datetime | None:
    return None if text in ("Unknown", "None") else \
        datetime.fromisoformat(text).replace(tzinfo=UTC)


def _attempts(path: Path) -> list[dict[str, object]]:
    """Per attempt that ran: job, attempt number, start, end, GPUs — from the file."""
    by_job: dict[str, list[dict[str, str]]] = {}
    for r in _lines(path):
        by_job.setdefault(r["JobIDRaw"], []).append(r)
    out: list[dict[str, object]] = []
    for job, rows in by_job.items():
        rows.sort(key=lambda r: r["Submit"])
        for k, r in enumerate(rows):
            start, end = _t(r["Start"]), _t(r["End"])
            if r["State"] == "PENDING" or start is None or (end is not None and end <= start):
                continue
            gpus = int(next(p.split("=")[1] for p in r["AllocTRES"].split(",")
                            if p.startswith("gres/gpu=")))
            out.append({"job": job, "attempt": k, "submit": _t(r["Submit"]), "start": start,
                        "end": end, "gpus": gpus, "state": r["State"]})
    return out


def _seconds(start: datetime, end: datetime) -> float:
    """Seconds held (allocation is exact to the second, docs/metrics.md)."""
    return max(0.0, (end - start).total_seconds())


def _sql(warehouse: Path, sql: str) -> pl.DataFrame:
    cols, rows = query.run(warehouse, sql)
    return pl.DataFrame(rows, schema=cols, orient="row")


def test_queue_wait_per_attempt_is_start_minus_submit(sacct_file: Path, warehouse: Path) -> None:
    expected = {(a["job"], a["attempt"]): (a["start"] - a["submit"]).total_seconds()  # type: ignore[operator]
                for a in _attempts(sacct_file)}
    got = _sql(warehouse, "SELECT job_id, attempt, queue_wait_s FROM attempts "
                          "WHERE started_at IS NOT NULL")
    assert {(j, a): w for j, a, w in got.iter_rows()} == expected
    assert ("101", 1) in expected  # the requeued attempt counts from the requeue


def test_allocated_gpu_hours_per_ended_attempt(sacct_file: Path, warehouse: Path) -> None:
    expected = {(a["job"], a["attempt"]): _seconds(a["start"], a["end"]) * a["gpus"] / 3600  # type: ignore[arg-type,operator]
                for a in _attempts(sacct_file) if a["end"] is not None}
    got = _sql(warehouse, "SELECT job_id, attempt, allocated_gpu_hours FROM job_attempts")
    got_map = {(j, a): h for j, a, h in got.iter_rows() if (j, a) in expected}
    assert set(got_map) == set(expected)
    for key, hours in expected.items():
        assert got_map[key] == pytest.approx(hours), key
    # and per minute in gpu_minute: the running job holds its GPU up to the last minute
    running = [a for a in _attempts(sacct_file) if a["end"] is None]
    assert [a["job"] for a in running] == ["103"]
    _, rows = query.run(warehouse, "SELECT sum(alloc_fraction) FROM gpu_minute "
                                   "WHERE job_id = '103'")
    assert rows[0][0] * 60 == pytest.approx(_seconds(running[0]["start"], LAST))  # type: ignore[arg-type]


def test_end_events_and_skips(sacct_file: Path, warehouse: Path) -> None:
    got = _sql(warehouse, "SELECT job_id, attempt, end_event, status FROM attempts "
                          "ORDER BY job_id, attempt")
    ends = {(j, a): (e, s) for j, a, e, s in got.iter_rows()}
    assert ends[("100", 0)] == ("finished", "ended")
    assert ends[("101", 0)] == ("requeued", "ended")
    assert ends[("101", 1)] == ("finished", "ended")
    assert ends[("102", 0)] == ("preempted", "ended")
    assert ends[("103", 0)][1] == "running"
    assert ends[("104", 0)][1] == "pending"
    assert ends[("105", 0)] == ("cancelled", "ended")
    assert ends[("106", 0)] == ("failed", "ended")
    assert ends[("107", 0)] == ("failed", "ended")
    assert ends[("108", 0)] == ("preempted", "ended")
    assert ends[("108", 1)] == ("finished", "ended")
    _, rows = query.run(warehouse, "SELECT job_id, attempt FROM preemptions ORDER BY job_id")
    assert [tuple(r) for r in rows] == [("102", 0), ("108", 0)]
    assert {j for j, _ in ends} == {r["JobIDRaw"] for r in _lines(sacct_file)}
    imported = load_sacct([sacct_file])
    ids = [row.split("|", 1)[0] for row in ROWS]
    assert imported.steps_skipped == sum("." in i for i in ids) == 3
    assert imported.pending_arrays_skipped == sum("[" in i for i in ids) == 1
    assert imported.cpu_only_skipped == 1


def test_gres_idx_is_used_and_placement_fills_the_rest(warehouse: Path) -> None:
    gpus = _sql(warehouse, "SELECT job_id, node, list(gpu_index ORDER BY gpu_index) AS idx "
                           "FROM job_gpu GROUP BY job_id, attempt, node")
    by_job = {(j, n): list(i) for j, n, i in gpus.iter_rows()}
    assert by_job[("106", "gpu-3")] == [5, 6]              # from GresIDX
    assert by_job[("107", "gpu-4")] == list(range(8))      # 16 GPUs spread over 2 nodes
    assert by_job[("107", "gpu-5")] == list(range(8))
    # no GPU is held by two jobs in the same minute
    _, rows = query.run(warehouse, "SELECT max(jobs_on_gpu) FROM gpu_minute")
    assert rows[0][0] == 1


def test_teams_and_queues_through_the_mapping(sacct_file: Path, tmp_path: Path) -> None:
    mapping = tmp_path / "m.yaml"
    mapping.write_text("teams: {accounts: {nlp: language}}\nqueues: {slurm: qos}\n"
                       "priorities: {qos: {high: 100}}\n"
                       "job_types: {rules: [{type: evaluation, name: 'eval-*'}]}\n")
    root = tmp_path / "wh"
    assert main(["import", "slurm-sacct", str(sacct_file), "--mapping", str(mapping),
                 "--warehouse", str(root), "--quiet"]) == 0
    got = _sql(root, "SELECT job_id, team, queue, priority, job_type, card_type FROM attempts "
                     "WHERE attempt = 0 ORDER BY job_id")
    rows = {r[0]: r[1:] for r in got.iter_rows()}
    assert rows["101"] == ("language", "high", 100, None, "H100-SXM5-80GB")
    assert rows["106"] == ("vision", "normal", 50, "evaluation", "H100-SXM5-80GB")


def test_bad_files_name_the_problem(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    no_state = tmp_path / "a.txt"
    no_state.write_text("JobID|Submit|Start|End|AllocTRES\n1|x|y|z|gres/gpu=1\n")
    with pytest.raises(SacctError, match=r"missing column.*State"):
        load_sacct([no_state])
    bad_time = tmp_path / "b.txt"
    bad_time.write_text(HEADER + "\n" + ROWS[0].replace(f"{T}10:00:00", "yesterday", 1) + "\n")
    assert main(["import", "slurm-sacct", str(bad_time), "--warehouse",
                 str(tmp_path / "wh"), "--quiet"]) == 2
    assert "b.txt:2: Submit: 'yesterday' is not a time" in capsys.readouterr().err
    # a --nodes file without a node (another command's output) was passed over in silence,
    # the inventory inferred from the jobs
    junk = tmp_path / "nodes.txt"
    junk.write_text("PARTITION AVAIL  TIMELIMIT  NODES  STATE NODELIST\ngpu* up infinite 2 "
                    "idle gpu-[1-2]\n")
    good = tmp_path / "c.txt"
    good.write_text(HEADER + "\n" + ROWS[0] + "\n")
    assert main(["import", "slurm-sacct", str(good), "--nodes", str(junk), "--warehouse",
                 str(tmp_path / "wh"), "--quiet"]) == 2
    assert capsys.readouterr().err == (f"gpuledger: error: {junk}: no node in it (no "
                                       "NodeName=…): is it `scontrol -o show node -d` "
                                       "output?\n")
    assert not (tmp_path / "wh").exists()


PROBE_HEADER = ("JobID|JobIDRaw|JobName|Account|User|Partition|QOS|Priority|Submit|Start|"
                "End|State|ExitCode|AllocTRES|ReqTRES|NodeList")


def _probe(job: str, submit: str, start: str, end: str, state: str = "COMPLETED",
           tres: str = "gres/gpu=1", nodes: str = "gpu-1") -> str:
    return (f"{job}|{job}|x|a|u|gpu|n|1|{T}{submit}|{T}{start}|{T}{end}|{state}|0:0|"
            f"{tres}|{tres}|{nodes}")


def _import(tmp_path: Path, capsys: pytest.CaptureFixture[str], *lines: str
            ) -> tuple[Path, str]:
    path = tmp_path / "sacct.txt"
    path.write_text(PROBE_HEADER + "\n" + "\n".join(lines) + "\n")
    root = tmp_path / "wh"
    assert main(["import", "slurm-sacct", str(path), "--warehouse", str(root),
                 "--quiet"]) == 0
    return root, capsys.readouterr().out


def test_a_last_attempt_requeued_ends_at_end_and_the_job_waits_again(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root, _ = _import(tmp_path, capsys, _probe("401", "00:00:00", "00:10:00", "00:30:00",
                                               "REQUEUED"))
    got = _sql(root, "SELECT attempt, ended_at, end_event, allocated_gpu_hours, status "
                     "FROM attempts WHERE job_id = '401' ORDER BY attempt")
    assert got.rows() == [(0, datetime(2026, 1, 5, 0, 30, tzinfo=UTC), "requeued",
                           pytest.approx(20 / 60), "ended"),
                          (1, None, None, None, "pending")]


def test_lines_out_of_order_and_repeated_lines(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = _probe("503", "00:00:00", "00:10:00", "00:30:00")
    root, out = _import(tmp_path, capsys,
                        _probe("501", "00:00:00", "01:00:00", "00:30:00"),
                        _probe("502", "02:00:00", "01:00:00", "03:00:00"), good, good)
    assert "1 repeated identical line(s) dropped, 2 bad line(s)" in out, out
    # the reason names the two times as the line has them
    assert (f"{tmp_path / 'sacct.txt'}:2: End '{T}00:30:00' is before Start "
            f"'{T}01:00:00'") in out, out
    assert (f"{tmp_path / 'sacct.txt'}:3: Start '{T}01:00:00' is before Submit "
            f"'{T}02:00:00'") in out, out
    got = _sql(root, "SELECT job_id, attempt, end_event, allocated_gpu_hours FROM attempts")
    assert got.rows() == [("503", 0, "finished", pytest.approx(20 / 60))]


@pytest.mark.parametrize(("state", "tres", "nodes", "error"), [
    ("BOGUS_STATE", "gres/gpu=1", "gpu-1",
     "State 'BOGUS_STATE' is not a job state the importer knows (COMPLETED, CANCELLED"),
    ("", "gres/gpu=1", "gpu-1", "State '' is not a job state"),
    ("COMPLETED", "gres/gpu=1.5", "gpu-1", "TRES 'gres/gpu=1.5': the GPU count is not a"),
    ("COMPLETED", "gres/gpu= 2", "gpu-1", "TRES 'gres/gpu= 2': the GPU count"),
    ("COMPLETED", "gres/gpu=-1", "gpu-1", "TRES 'gres/gpu=-1': the GPU count"),
    ("COMPLETED", "gres/gpu=1e3", "gpu-1", "TRES 'gres/gpu=1e3': the GPU count"),
    ("COMPLETED", "gres/gpu=\uff12", "gpu-1", "TRES 'gres/gpu=\uff12': the GPU count is not"),
    ("COMPLETED", "gres/gpu:h100=1,gres/gpu=1,gres/gpu=3", "gpu-1",
     "TRES 'gres/gpu:h100=1,gres/gpu=1,gres/gpu=3': gres/gpu appears twice"),
    ("COMPLETED", "gres/gpu=1", "gpu-[1-2", "NodeList 'gpu-[1-2' is not a host list"),
    ("COMPLETED", "gres/gpu=3", "gpu-[001-003,x]",
     "NodeList 'gpu-[001-003,x]' is not a host list"),
    ("COMPLETED", "gres/gpu=99999", "gpu-[1-2]",
     "99,999 GPUs on 2 node(s) (gpu-[1-2]): 50,000 on a node, more than a node can have "
     "(1,024)"),
])
def test_lines_that_say_something_impossible_are_left_out(
        state: str, tres: str, nodes: str, error: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    root, out = _import(tmp_path, capsys,
                        _probe("601", "00:00:00", "00:10:00", "00:30:00", state, tres, nodes),
                        _probe("602", "00:00:00", "00:10:00", "00:30:00",
                               nodes="gpu-[001-002],login1"))
    assert "1 bad line(s)" in out and f"sacct.txt:2: {error}" in out, out
    assert "without a node list" not in out, out
    assert _sql(root, "SELECT job_id FROM attempts").rows() == [("602",)]


def test_a_date_that_does_not_exist_is_a_bad_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """2026 is not a leap year: '2026-02-29T23:00:00' is written as a time is, but names
    no day. It stopped the whole import with "is not a time (expected
    2026-01-05T10:00:00)", a format it has; now it is a bad line, as a local time the
    zone skips is, saying why. Text that is not a time still stops the import."""
    line = "{0}|{0}|x|a|u|gpu|n|1|{1}|{2}|{3}|COMPLETED|0:0|gres/gpu=1|gres/gpu=1|gpu-1"
    root, out = _import(
        tmp_path, capsys,
        line.format("1", "2024-02-29T23:00:00", "2024-02-29T23:30:00", "2024-03-01T00:30:00"),
        line.format("2", "2026-02-29T23:00:00", "2026-02-29T23:30:00", "2026-03-01T00:30:00"),
        line.format("3", "2026-01-05T10:00:00", "2026-04-31T10:00:00", "2026-05-01T00:30:00"),
        line.format("4", "2026-01-05T10:00:00", "2026-01-05T25:00:00", "2026-05-01T00:30:00"))
    assert "3 bad line(s)" in out, out
    for reason in ["3: Submit '2026-02-29T23:00:00' is not a date: 2026 has no February 29",
                   "4: Start '2026-04-31T10:00:00' is not a date: April 2026 has 30 days, "
                   "not 31",
                   "5: Start '2026-01-05T25:00:00' is not a time of day: there is no hour 25"]:
        assert f"sacct.txt:{reason}" in out, out
    assert _sql(root, "SELECT job_id FROM attempts").rows() == [("1",)]
    # --until the same way (refused: it is the command's, not a line's)
    with pytest.raises(SystemExit):
        main(["import", "slurm-sacct", str(tmp_path / "sacct.txt"), "--warehouse",
              str(root), "--quiet", "--until", "2026-02-29T00:00:00"])
    assert ("--until: '2026-02-29T00:00:00' is not a date: 2026 has no February 29"
            in capsys.readouterr().err)


@pytest.mark.parametrize("until", [[], ["--until", "2026-01-05T12:00"]])
def test_an_export_without_a_gpu_job_changes_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], until: list[str]) -> None:
    """A CPU-only export, and one of its header alone (a quiet day's cron), say there is
    nothing to import, exit 0, and do not make a warehouse (before, each left an empty
    one behind, the first with every table's files). With ``--until`` too: an export
    without a job has no time to close from."""
    cpu_only = [_probe("701", "00:00:00", "00:10:00", "00:30:00", tres="cpu=1"),
                _probe("702", "00:00:00", "00:10:00", "00:30:00", tres="cpu=2")]
    for lines, said in [(cpu_only, "(2 lines, 0 step lines, 2 CPU-only jobs, 0 bad)"),
                        ([], "(0 lines, 0 step lines, 0 CPU-only jobs, 0 bad)")]:
        path = tmp_path / "sacct.txt"
        path.write_text(PROBE_HEADER + "\n" + "".join(f"{line}\n" for line in lines))
        root = tmp_path / "wh"
        assert main(["import", "slurm-sacct", str(path), "--warehouse", str(root),
                     "--quiet", *until]) == 0
        out, err = capsys.readouterr()
        assert out == "" and err == (f"nothing to import: {path} holds no GPU job {said}; "
                                     f"{root}/ is left as it was\n"), (out, err)
        assert not root.exists()


def test_a_day_of_many_jobs_ending_imports(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """2,520 8-GPU jobs ending in one day (20,160 GPU allocations closed in one step): the
    import stopped with a Polars ShapeError traceback (a literal compared with a column
    that a join made of one value gives the wrong length from about 20,000 rows)."""
    lines = []
    for n in range(2520):
        node, slot = divmod(n, 12)        # 210 nodes, 12 two-hour jobs each in the day
        start = f"{slot * 2:02d}:00:00"
        end = f"{slot * 2 + 1:02d}:59:00"
        lines.append(_probe(str(5000 + n), start, start, end, tres="gres/gpu=8",
                            nodes=f"gpu-{node:03d}"))
    root, out = _import(tmp_path, capsys, *lines)
    assert "2,520 GPU jobs (2,520 attempts)" in out, out
    got = _sql(root, "SELECT count(*), round(sum(allocated_gpu_hours), 6) FROM attempts")
    assert got.rows() == [(2520, pytest.approx(2520 * 8 * 119 / 60))]
    assert _sql(root, "SELECT count(*) FROM job_gpu").rows() == [(2520 * 8,)]


@pytest.mark.parametrize("with_nodes", [False, True])
def test_a_time_before_2000_rejects_its_event_only(
        with_nodes: bool, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """One broken clock (job 10's Submit in 1999) must not stamp the inventory before
    2000 (which validation rejects, leaving no GPU to charge): only that ``submitted``
    is rejected. Job 1 is charged 2 GPUs × (10:03:41 − 10:00:17 = 204 s) = 408 GPU-s,
    job 10 1 GPU × 60 s."""
    path = tmp_path / "sacct.txt"
    path.write_text(PROBE_HEADER + "\n"
                    + _probe("1", "10:00:00", "10:00:17", "10:03:41", tres="gres/gpu=2") + "\n"
                    + _probe("10", "10:00:00", "10:00:30", "10:01:30", nodes="gpu-3")
                    .replace(f"{T}10:00:00", "1999-12-31T23:00:00") + "\n")
    nodes = tmp_path / "nodes.txt"
    nodes.write_text("".join(f"NodeName={n} Gres=gpu:h100:8 State=IDLE Partitions=gpu\n"
                             for n in ("gpu-1", "gpu-3")))
    root = tmp_path / "wh"
    assert main(["import", "slurm-sacct", str(path), "--warehouse", str(root), "--quiet",
                 *(["--nodes", str(nodes)] if with_nodes else [])]) == 0
    assert "; 1 event(s) rejected" in capsys.readouterr().out
    assert _sql(root, "SELECT record_type, reason FROM rejects").rows() == [
        ("job", "field 'time': 1999-12-31T23:00:00Z is before 2000-01-01T00:00:00Z")]
    got = _sql(root, "SELECT job_id, allocated_gpu_hours * 3600 FROM job_attempts "
                     "ORDER BY job_id")
    assert got.rows() == [("1", pytest.approx(408)), ("10", pytest.approx(60))]
    _, rows = query.run(root, "SELECT sum(alloc_fraction) * 60, "
                              "count(DISTINCT (node, gpu_index)) FROM gpu_minute")
    assert rows[0][0] == pytest.approx(408 + 60)
    assert rows[0][1] == (16 if with_nodes else 3)  # 2 × 8 listed, or the 2 + 1 seen


def _oct25(hms: str) -> datetime:
    """``hms`` UTC on 2026-10-25, the day Europe/Berlin's clocks go back."""
    return datetime.fromisoformat(f"2026-10-25T{hms}").replace(tzinfo=UTC)


def _import_tz(tmp_path: Path, capsys: pytest.CaptureFixture[str], zone: str,
               *lines: str) -> tuple[Path, str]:
    path = tmp_path / "sacct.txt"
    path.write_text(PROBE_HEADER + "\n" + "\n".join(lines) + "\n")
    root = tmp_path / "wh"
    assert main(["import", "slurm-sacct", str(path), "--warehouse", str(root), "--quiet",
                 "--tz", zone]) == 0
    return root, capsys.readouterr().out


def test_tz_times_are_converted_to_utc_with_or_without_an_offset(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Europe/Berlin on 2026-10-25 (clocks go back from 03:00 CEST to 02:00 CET): 03:00
    is CET (UTC+1) → 02:00 UTC; an explicit offset is taken as it is; 02:10–02:50 occur
    twice and are read as the first occurrence (CEST, UTC+2) → 00:10–00:50 UTC."""
    line = "{0}|{0}|x|a|u|gpu|n|1|{1}|{2}|{3}|COMPLETED|0:0|gres/gpu=1|gres/gpu=1|gpu-{0}"
    day = "2026-10-25T"
    root, out = _import_tz(
        tmp_path, capsys, "Europe/Berlin",
        line.format("1", f"{day}03:00:00", f"{day}03:00:30", f"{day}03:10:30"),
        line.format("2", f"{day}03:00:00+00:00", f"{day}03:00:30+00:00",
                    f"{day}03:10:30+00:00"),
        line.format("3", f"{day}02:10:00", f"{day}02:30:00", f"{day}02:50:00"))
    assert "bad line" not in out and "rejected" not in out, out
    got = _sql(root, "SELECT job_id, submitted_at, started_at, ended_at, "
                     "allocated_gpu_hours * 3600 FROM attempts ORDER BY job_id")

    assert got.rows() == [
        ("1", _oct25("02:00:00"), _oct25("02:00:30"), _oct25("02:10:30"), pytest.approx(600)),
        ("2", _oct25("03:00:00"), _oct25("03:00:30"), _oct25("03:10:30"), pytest.approx(600)),
        ("3", _oct25("00:10:00"), _oct25("00:30:00"), _oct25("00:50:00"), pytest.approx(1200)),
    ]


def test_tz_a_repeated_hour_is_read_so_that_the_times_keep_their_order(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Europe/Berlin on 2026-10-25 repeats 02:00–02:59 (CEST, then CET). Job 2 started
    at 02:50 CEST and ended at 02:10 CET, 20 minutes later: it was a bad line, "End is
    before Start", every time of the hour read as the first occurrence. Each line's
    times are now read in the occurrences that keep them in order (the first where both
    do: job 3), counted; a line no reading puts in order (job 4) is a bad line that names
    its times and the repeated hour."""
    line = "{0}|{0}|x|a|u|gpu|n|1|{1}|{2}|{3}|COMPLETED|0:0|gres/gpu=1|gres/gpu=1|gpu-{0}"
    day = "2026-10-25T"
    root, out = _import_tz(
        tmp_path, capsys, "Europe/Berlin",
        line.format("1", f"{day}01:00:00", f"{day}01:30:00", f"{day}03:30:00"),
        line.format("2", f"{day}02:40:00", f"{day}02:50:00", f"{day}02:10:00"),
        line.format("3", f"{day}02:05:00", f"{day}02:30:00", f"{day}02:45:00"),
        line.format("4", f"{day}02:50:00", f"{day}02:10:00", f"{day}02:05:00"))
    assert ("1 bad line(s); times without an offset read in Europe/Berlin; 2 line(s) with "
            "times in a repeated hour (DST end), read as the first occurrence, 1 of them "
            "with the second where the first put the line's times out of order;") in out, out
    assert (f"sacct.txt:5: Start '{day}02:10:00' is before Submit '{day}02:50:00', and no "
            "reading of the hour Europe/Berlin repeats puts the line's times in order: "
            f"Submit '{day}02:50:00', Start '{day}02:10:00', End '{day}02:05:00' occur "
            "twice there (the clocks go back from 03:00 to 02:00 on 2026-10-25)") in out, out
    got = _sql(root, "SELECT job_id, submitted_at, started_at, ended_at, "
                     "allocated_gpu_hours * 60 FROM attempts ORDER BY job_id")

    assert got.rows() == [
        ("1", _oct25("00:00:00") - timedelta(hours=1), _oct25("00:00:00") - timedelta(minutes=30),
         _oct25("02:30:00"), pytest.approx(180)),
        ("2", _oct25("00:40:00"), _oct25("00:50:00"), _oct25("01:10:00"), pytest.approx(20)),
        ("3", _oct25("00:05:00"), _oct25("00:30:00"), _oct25("00:45:00"), pytest.approx(15)),
    ]


def test_tz_a_requeued_jobs_attempts_in_a_repeated_hour_come_one_after_another(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Europe/Berlin on 2026-10-25 repeats 02:00–02:59. Job 7 ran from 01:40 to 02:50
    summer time (23:40–00:50 UTC), was requeued, submitted again at 02:10 and started
    at 02:20 winter time (01:10, 01:20 UTC) and ended at 03:30 (02:30 UTC). Each line
    read alone kept its own times in order with summer time, so the second attempt began
    at 00:20 UTC, 30 minutes before the first ended: the first was cut to 40 minutes,
    the second charged 130 (170 in all, 30 invented). The second line is now read in
    winter time, after the first attempt's end: 70 + 70 minutes."""
    line = "7|7|x|a|u|gpu|n|1|{0}|{1}|{2}|{3}|0:0|gres/gpu=1|gres/gpu=1|gpu-1"
    day = "2026-10-25T"
    root, out = _import_tz(
        tmp_path, capsys, "Europe/Berlin",
        line.format(f"{day}01:30:00", f"{day}01:40:00", f"{day}02:50:00", "REQUEUED"),
        line.format(f"{day}02:10:00", f"{day}02:20:00", f"{day}03:30:00", "COMPLETED"))
    assert "bad line" not in out, out
    assert ("2 line(s) with times in a repeated hour (DST end), read as the first "
            "occurrence, 1 of them with the second") in out, out
    got = _sql(root, "SELECT attempt, started_at, ended_at, allocated_gpu_hours * 60 "
                     "FROM attempts ORDER BY attempt")

    assert got.rows() == [
        (0, _oct25("00:00:00") - timedelta(minutes=20), _oct25("00:50:00"), pytest.approx(70)),
        (1, _oct25("01:20:00"), _oct25("02:30:00"), pytest.approx(70)),
    ]


def test_the_zone_times_are_read_in_is_said(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A site running the import where TZ=Europe/Berlin had 09:30 imported as 09:30 UTC
    with no word of UTC or --tz. The summary says the zone; without --tz, a $TZ other
    than UTC is warned about."""
    path = tmp_path / "sacct.txt"
    path.write_text(PROBE_HEADER + "\n" + _probe("1", "09:00:00", "09:30:00", "10:30:00")
                    + "\n")

    def run(*extra: str) -> tuple[str, str]:
        assert main(["import", "slurm-sacct", str(path), "--warehouse",
                     str(tmp_path / f"wh{len(extra)}"), "--quiet", *extra]) == 0
        got = capsys.readouterr()
        return got.out, got.err

    monkeypatch.setenv("TZ", "Europe/Berlin")
    out, err = run()
    assert "; times without an offset read as UTC (--tz to change);" in out, out
    assert err == ("gpuledger: warning: TZ is 'Europe/Berlin', but times without an "
                   "offset (in the exports and --until) are read as UTC, not as $TZ: pass "
                   "--tz Europe/Berlin if sacct printed them there\n")
    out, err = run("--tz", "Europe/Berlin")
    assert "; times without an offset read in Europe/Berlin;" in out and err == "", err
    for utc in (":UTC", "Etc/UTC", "UTC0", "/usr/share/zoneinfo/UTC"):
        monkeypatch.setenv("TZ", utc)
        out, err = run("--replace")
        assert "read as UTC (--tz to change)" in out and err == "", (utc, err)


def test_tz_a_time_that_does_not_exist_is_a_bad_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """02:00–02:59 on 2026-03-29 does not exist in Europe/Berlin, and 0001-01-01 00:00
    there (UTC+0:53 then) is before year 1 in UTC: those lines are left out with the
    reason, the other one (03:10 CEST = 01:10 UTC, 30 min) is imported."""
    line = "{0}|{0}|x|a|u|gpu|n|1|{1}|{2}|{3}|COMPLETED|0:0|gres/gpu=1|gres/gpu=1|gpu-1"
    root, out = _import_tz(
        tmp_path, capsys, "Europe/Berlin",
        line.format("3", "2026-03-29T01:50:00", "2026-03-29T02:10:00", "2026-03-29T03:40:00"),
        line.format("4", "2026-03-29T03:00:00", "2026-03-29T03:10:00", "2026-03-29T03:40:00"),
        line.format("5", "0001-01-01T00:00:00", "2026-03-29T03:10:00", "2026-03-29T03:40:00"))
    assert "2 bad line(s)" in out and "rejected" not in out, out
    assert "sacct.txt:4: Submit '0001-01-01T00:00:00' is out of range in UTC" in out, out
    assert ("sacct.txt:2: Start '2026-03-29T02:10:00' does not exist in time zone "
            "Europe/Berlin: the clocks jump from 02:00 to 03:00 on 2026-03-29") in out, out
    got = _sql(root, "SELECT job_id, started_at, allocated_gpu_hours FROM attempts")
    assert got.rows() == [("4", datetime(2026, 3, 29, 1, 10, tzinfo=UTC),
                           pytest.approx(0.5))]


def test_tz_an_until_the_zone_skips_or_repeats_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--until 2025-03-30T02:30:00`` in Europe/Berlin (clocks jump 02:00 → 03:00) was
    taken as 01:30 UTC, the same as 03:30, while a line with that time is a bad line;
    02:30 on 2025-10-26 (clocks go back 03:00 → 02:00) was taken as its first occurrence
    in silence. Both are refused in one line, nothing written; with its offset it goes."""
    line = "1|1|x|a|u|gpu|n|1|{0}|{0}|{1}|COMPLETED|0:0|gres/gpu=1|gres/gpu=1|gpu-1"
    path = tmp_path / "sacct.txt"
    path.write_text(PROBE_HEADER + "\n"
                    + line.format("2025-10-26T00:00:00", "2025-10-26T00:30:00") + "\n")
    root = tmp_path / "wh"

    def run(until: str) -> int:
        return main(["import", "slurm-sacct", str(path), "--warehouse", str(root),
                     "--quiet", "--tz", "Europe/Berlin", "--until", until])

    assert run("2025-03-30T02:30:00") == 2
    assert capsys.readouterr().err == (
        "gpuledger: error: --until 2025-03-30T02:30:00 does not exist in time zone "
        "Europe/Berlin: the clocks jump from 02:00 to 03:00 on 2025-03-30; give a time "
        "that exists, or one with its offset\n")
    assert run("2025-10-26T02:30:00") == 2
    assert capsys.readouterr().err == (
        "gpuledger: error: --until 2025-10-26T02:30:00 occurs twice in time zone "
        "Europe/Berlin: the clocks go back from 03:00 to 02:00 on 2025-10-26; give it "
        "with its offset: 2025-10-26T02:30:00+02:00 (the first, CEST) or "
        "2025-10-26T02:30:00+01:00 (the second, CET)\n")
    # before every event there can be (a probe: exit 0, every line into the job book)
    assert run("2000-01-01T00:00") == 2
    assert capsys.readouterr().err == (
        "gpuledger: error: --until 2000-01-01T00:00:00: before 2000-01-01 (no event is "
        "older; the export's --endtime)\n")
    assert not root.exists()
    assert run("2025-10-26T02:30:00+01:00") == 0
    assert "--until" not in capsys.readouterr().err


def test_an_attempt_followed_by_another_ends_at_its_end(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Slurm sets End to the requeue time and the next Submit after the epilog (job 1,
    5 s later) or, in a skewed record, before End (job 2): each attempt is charged its
    own End − Start (30 s), the next waits from End to its Start (10 s). Job 3 overlaps
    (End 10:07:00 after the next Start 10:06:40): the attempt ends at that Start (30 s)."""
    root, out = _import(
        tmp_path, capsys,
        _probe("1", "10:00:00", "10:00:10", "10:00:40", "REQUEUED", nodes="gpu-1"),
        _probe("1", "10:00:45", "10:00:50", "10:01:20", nodes="gpu-1"),
        _probe("2", "10:02:00", "10:02:10", "10:02:40", "REQUEUED", nodes="gpu-2"),
        _probe("2", "10:02:30", "10:02:50", "10:03:20", nodes="gpu-2"),
        _probe("3", "10:06:00", "10:06:10", "10:07:00", "PREEMPTED", nodes="gpu-3"),
        _probe("3", "10:06:30", "10:06:40", "10:07:20", nodes="gpu-3"))
    assert "rejected" not in out, out
    got = _sql(root, "SELECT job_id, attempt, ended_at, end_event, queue_wait_s, "
                     "allocated_gpu_hours * 3600 FROM attempts ORDER BY job_id, attempt")

    def at(hms: str) -> datetime:
        return datetime.fromisoformat(f"{T}{hms}").replace(tzinfo=UTC)

    assert got.rows() == [
        ("1", 0, at("10:00:40"), "requeued", 10, pytest.approx(30)),
        ("1", 1, at("10:01:20"), "finished", 10, pytest.approx(30)),
        ("2", 0, at("10:02:40"), "requeued", 10, pytest.approx(30)),
        ("2", 1, at("10:03:20"), "finished", 10, pytest.approx(30)),
        ("3", 0, at("10:06:40"), "preempted", 10, pytest.approx(30)),
        ("3", 1, at("10:07:20"), "finished", 0, pytest.approx(40)),
    ]
    # job 3's GPU: 30 s + 20 s in 10:06 (no second held twice), 20 s in 10:07
    got = _sql(root, "SELECT minute, alloc_fraction * 60 FROM gpu_minute "
                     "WHERE node = 'gpu-3' AND allocated ORDER BY minute")
    assert got.rows() == [(at("10:06:00"), pytest.approx(50)),
                          (at("10:07:00"), pytest.approx(20))]


def _named(job: str, name: str, start: str, end: str) -> str:
    return _probe(job, "00:00:00", start, end).replace(f"{job}|{job}|x|", f"{job}|{job}|{name}|")


def test_job_names_with_a_pipe_or_a_line_break_are_read_back_whole(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Found with a real slurmdbd: Slurm takes any job name, and ``sacct --parsable2``
    prints it as it is. A ``|`` split the line into more fields: the fields after the
    name moved along, and the import stopped at "Submit: '4294901759' is not a time" (the
    Priority). A line break split the record into two lines. Any user could stop the
    site's import. Now the record is read back whole; the jobs after it are as before."""
    root, out = _import(
        tmp_path, capsys,
        _named("801", "a|b", "00:10:00", "00:30:00"),
        _named("802", "new\nline", "00:10:00", "00:40:00"),
        _named("803", "both|\n|of them", "00:10:00", "00:50:00"),
        _named("804", "plain", "00:10:00", "01:00:00"))
    assert "3 line(s) whose job name held a '|' or a line break, read back whole" in out, out
    assert "bad line" not in out, out
    got = _sql(root, "SELECT job_id, allocated_gpu_hours FROM attempts ORDER BY job_id")
    assert got.rows() == [("801", pytest.approx(20 / 60)), ("802", pytest.approx(30 / 60)),
                          ("803", pytest.approx(40 / 60)), ("804", pytest.approx(50 / 60))]


def test_a_pipe_where_more_than_the_job_name_is_free_text_is_a_bad_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """With a Comment column too, which field held the ``|`` cannot be told: that line is
    left out with the reason, the others are imported."""
    path = tmp_path / "sacct.txt"
    path.write_text(PROBE_HEADER + "|Comment\n"
                    + _named("811", "a|b", "00:10:00", "00:30:00") + "|note\n"
                    + _probe("812", "00:00:00", "00:10:00", "00:30:00") + "|x|y\n"
                    + _probe("813", "00:00:00", "00:10:00", "00:30:00") + "|fine\n")
    assert main(["import", "slurm-sacct", str(path), "--warehouse", str(tmp_path / "wh"),
                 "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "2 bad line(s)" in out, out
    assert ("sacct.txt:2: 18 fields, the header has 17: a '|' in a free-text column "
            "(JobName, Comment)") in out, out
    assert _sql(tmp_path / "wh", "SELECT job_id FROM attempts").rows() == [("813",)]


def test_an_export_cut_inside_a_line_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The last line has fewer fields and nothing follows it: the export was cut short
    (sacct killed, a disk full). The import is refused whole, as before."""
    path = tmp_path / "sacct.txt"
    cut = _probe("821", "00:00:00", "00:10:00", "00:30:00").rsplit("|", 3)[0]
    path.write_text(PROBE_HEADER + "\n" + _probe("820", "00:00:00", "00:10:00", "00:30:00")
                    + "\n" + cut + "\n")
    assert main(["import", "slurm-sacct", str(path), "--warehouse", str(tmp_path / "wh"),
                 "--quiet"]) == 2
    assert "sacct.txt:3: 13 fields, the header has 16" in capsys.readouterr().err


@pytest.mark.parametrize("cut", [
    pytest.param(lambda line: line.split("|2026")[0] + "|" + f"{T}00:00:00",
                 id="after-submit"),
    pytest.param(lambda line: line.rsplit("|", 1)[0], id="last-field-missing"),
    pytest.param(lambda line: "822|822", id="before-the-job-name"),
])
def test_a_line_cut_short_inside_the_export_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], cut: Any) -> None:
    """Found by trying hostile exports: a line cut short in the middle of an export (a
    damaged file) was joined with the next job's line as if a line break were in its job
    name, and the import went on: job 822 got job 823's start, end, state and GPUs, and
    823 was gone. A short line followed by a record of its own, or one whose break comes
    before every free-text column, is refused now, naming the line; nothing is made."""
    path = tmp_path / "sacct.txt"
    path.write_text(PROBE_HEADER + "\n"
                    + _probe("820", "00:00:00", "00:10:00", "00:30:00") + "\n"
                    + cut(_probe("822", "00:00:00", "00:10:00", "00:30:00")) + "\n"
                    + _probe("823", "00:05:00", "00:20:00", "00:50:00", "CANCELLED") + "\n")
    assert main(["import", "slurm-sacct", str(path), "--warehouse", str(tmp_path / "wh"),
                 "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"gpuledger: error: {path}:3: "), err
    assert "the header has 16: a line cut short (line 4 is " in err, err
    assert not (tmp_path / "wh").exists()


def test_exports_joined_with_their_headers_are_read_under_each_header(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``cat day-1.txt day-2.txt``, each with its header, the second's columns in another
    order: the lines after the second header are read under it. Before, the header was
    read as a CPU-only job, and the lines after it by the first header's columns: their
    jobs, read as CPU-only, were left out in silence."""
    lines = [_probe("830", "00:00:00", "00:10:00", "00:30:00"),
             _probe("831", "00:00:00", "00:12:00", "00:40:00", tres="gres/gpu=2")]
    names = PROBE_HEADER.split("|")
    order = names[::-1]
    flipped = ["|".join(dict(zip(names, line.split("|"), strict=True))[c] for c in order)
               for line in lines]
    path = tmp_path / "joined.txt"
    path.write_text(f"{PROBE_HEADER}\n{lines[0]}\n{PROBE_HEADER}\n{lines[0]}\n"
                    f"{'|'.join(order)}\n{flipped[1]}\n{flipped[0]}\n")
    assert main(["import", "slurm-sacct", str(path), "--warehouse", str(tmp_path / "wh"),
                 "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "4 lines: 2 GPU jobs (2 attempts)" in out and "0 CPU-only jobs" in out, out
    got = _sql(tmp_path / "wh", "SELECT job_id, allocated_gpu_hours FROM attempts "
                                "ORDER BY job_id")
    assert got.rows() == [("830", pytest.approx(20 / 60)), ("831", pytest.approx(56 / 60))]
    # a header further down that misses a column is refused, naming its line
    path.write_text(f"{PROBE_HEADER}\n{lines[0]}\n{PROBE_HEADER.replace('|Submit', '')}\n")
    assert main(["import", "slurm-sacct", str(path), "--warehouse", str(tmp_path / "w2"),
                 "--quiet"]) == 2
    assert f"{path}:3: missing column(s) Submit in the header" in capsys.readouterr().err


def test_a_priority_out_of_range_or_a_quote_in_a_name(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A Priority past 64 bits stopped the import with a Python traceback (the events'
    column is 64-bit) after it had made the warehouse's folders: that line is a bad line
    now. sacct quotes nothing: a ``"`` in a job name is the name's (it swallowed the
    lines after it into one field, as CSV quoting)."""
    big = _probe("840", "00:00:00", "00:10:00", "00:30:00").replace("|n|1|", f"|n|{2**63}|")
    root, out = _import(tmp_path, capsys, big,
                        _named("841", 'say "hi', "00:10:00", "00:30:00"),
                        _probe("842", "00:00:00", "00:10:00", "00:40:00"))
    assert "1 bad line(s)" in out, out
    assert (f"sacct.txt:2: Priority '{2**63}' is out of range (a 64-bit whole number)"
            in out), out
    assert _sql(root, "SELECT job_id, allocated_gpu_hours FROM attempts ORDER BY job_id"
                ).rows() == [("841", pytest.approx(20 / 60)), ("842", pytest.approx(30 / 60))]


def test_a_line_break_in_a_job_name_of_the_first_column_is_read_back(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--format JobName,JobID,…``: a name broken after its first piece leaves a whole
    record's count of fields to the next line, which is the rest of it, not a record of
    its own (the check for lines cut short must not refuse it)."""
    names = PROBE_HEADER.split("|")
    order = ["JobName", *[c for c in names if c != "JobName"]]

    def line(job: str, name: str) -> str:
        fields = dict(zip(names, _probe(job, "00:00:00", "00:10:00", "00:30:00").split("|"),
                          strict=True))
        fields["JobName"] = name
        return "|".join(fields[c] for c in order)

    path = tmp_path / "sacct.txt"
    path.write_text("|".join(order) + "\n" + line("850", "two\nlines") + "\n"
                    + line("851", "plain") + "\n")
    assert main(["import", "slurm-sacct", str(path), "--warehouse", str(tmp_path / "wh"),
                 "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "1 line(s) whose job name held a '|' or a line break, read back whole" in out, out
    assert _sql(tmp_path / "wh", "SELECT job_id FROM attempts ORDER BY job_id").rows() == [
        ("850",), ("851",)]
