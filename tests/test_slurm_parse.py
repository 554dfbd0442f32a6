"""Parsing Slurm's output: real Slurm 22.05 captures (tests/fixtures/slurm/, taken from
the test cluster of tests/slurm_cluster.py) and the grammars of GRES, TRES and host lists."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuledger.bridges.mapping import Mapping
from gpuledger.bridges.output import FileSink
from gpuledger.bridges.slurm import SlurmBridge, SlurmSource
from gpuledger.bridges.slurm_events import SlurmTracker
from gpuledger.bridges.slurm_parse import (
    SlurmParseError,
    exit_code_text,
    expand_hostlist,
    expand_indices,
    parse_gres,
    parse_scontrol_jobs,
    parse_scontrol_nodes,
    parse_sinfo_json,
    parse_squeue_json,
    parse_tres_gpus,
)

FIX = Path(__file__).parent / "fixtures" / "slurm"


@pytest.mark.parametrize(("text", "expected"), [
    ("gpu:h100:2(IDX:1-2)", ("h100", 2, [1, 2])),
    ("gpu:h100:8(S:0-1)", ("h100", 8, [])),
    ("gpu:h100:3(IDX:0,2,5)", ("h100", 3, [0, 2, 5])),
    ("gres:gpu:h100:1", ("h100", 1, [])),
    ("gres/gpu:a100=4", ("a100", 4, [])),
    ("gpu:4", (None, 4, [])),
    ("gpu:h100:0(IDX:N/A)", ("h100", 0, [])),
    ("nic:1,gpu:a100:2(IDX:0-1)", ("a100", 2, [0, 1])),
    ("(null)", (None, 0, [])),
    ("", (None, 0, [])),
])
def test_gres(text: str, expected: tuple[object, ...]) -> None:
    assert parse_gres(text) == expected


@pytest.mark.parametrize("text", ["gres/gpu=1.5", "gres/gpu:h100=1.5", "gpu:h100:-1",
                                  "gres:gpu:1e3", "nic:1,gpu:a100:.5(IDX:0)", "gpu:+2"])
def test_a_gpu_count_that_is_not_a_whole_number_is_refused(text: str) -> None:
    # read as no GPUs before: a job asking for gres/gpu=1.5 showed as a CPU-only job
    with pytest.raises(SlurmParseError, match="is not a whole number"):
        parse_gres(text)


@pytest.mark.parametrize("text", ["gpu:h100", "gres/gpu", "gpu:h100:2(IDX:1-2)",
                                  "gres/gpu:a100_3g.20gb=1", "nic:1.5"])
def test_gpu_items_without_a_numeric_count_are_not_refused(text: str) -> None:
    parse_gres(text)


def test_tres_total_is_not_double_counted() -> None:
    assert parse_tres_gpus("billing=2,cpu=2,gres/gpu:h100=2,gres/gpu=2,mem=8G,node=1") == \
        ("h100", 2)
    assert parse_tres_gpus("cpu=2,gres/gpu:a100=1,gres/gpu:h100=2") == ("a100", 3)
    assert parse_tres_gpus("cpu=16,mem=64G") == (None, 0)
    assert parse_tres_gpus("") == (None, 0)


def test_hostlists_and_indices() -> None:
    assert expand_hostlist("gpu-[01-03,7],login1") == ["gpu-01", "gpu-02", "gpu-03", "gpu-7",
                                                      "login1"]
    assert expand_hostlist("None assigned") == []
    assert expand_indices("0-2,5") == [0, 1, 2, 5]
    assert expand_indices("N/A") == []


@pytest.fixture
def utc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The captures were taken with TZ=UTC: scontrol's text times are local times."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


@pytest.mark.usefixtures("utc")
def test_json_and_text_of_the_same_moment_agree() -> None:
    from_json = {j.job_id: j for j in parse_squeue_json((FIX / "squeue.json").read_text())}
    from_text = {j.job_id: j for j in parse_scontrol_jobs(
        (FIX / "scontrol_jobs.txt").read_text())}
    assert set(from_json) == set(from_text) == {"1", "2", "3", "4", "5"}
    for job_id, job in from_json.items():
        # the exit code too: JSON's raw wait status 15 reads 0:15, as scontrol says
        assert job.__dict__ == from_text[job_id].__dict__
    assert from_json["1"].exit_code == "0:15"
    running = from_json["2"]
    assert (running.state, running.gpus, running.gpu_type, running.allocation) == \
        ("RUNNING", 2, "h100", (("gpu-node-1", 1), ("gpu-node-1", 2)))
    assert running.start is not None and running.end is None
    pending = from_json["4"]
    assert (pending.phase, pending.gpus, pending.reason, pending.start) == \
        ("pending", 8, "Resources", None)
    assert from_json["1"].state == "CANCELLED" and from_json["1"].phase == "ended"
    assert from_json["3"].state == "COMPLETED" and from_json["3"].end is not None


def test_nodes_from_sinfo_json_and_scontrol_text_agree() -> None:
    (a,) = parse_sinfo_json((FIX / "sinfo.json").read_text())
    (b,) = parse_scontrol_nodes((FIX / "scontrol_nodes.txt").read_text())
    assert a == b
    assert (a.name, a.state, a.partitions, a.gpu_type, a.gpus) == \
        ("gpu-node-1", "mixed", ("gpu",), "h100", 8)


def test_newer_json_shapes() -> None:
    """Slurm 23.02+ writes states as lists and numbers as {set, number} objects."""
    doc = {"jobs": [{
        "job_id": 9, "job_state": ["RUNNING"], "name": "x", "user_name": "ana",
        "partition": "gpu", "priority": {"set": True, "number": 7},
        "submit_time": {"set": True, "number": 1_767_000_000},
        "start_time": {"set": True, "number": 1_767_000_060},
        "end_time": {"set": True, "number": 1_767_003_600},
        "restart_cnt": 0, "nodes": "n[1-2]", "tres_per_node": "gres/gpu:h100:2",
        "gres_detail": ["gpu:h100:2(IDX:0-1)", "gpu:h100:2(IDX:4-5)"]}]}
    (job,) = parse_squeue_json(json.dumps(doc))
    assert (job.state, job.priority, job.submit, job.start, job.end, job.gpus) == \
        ("RUNNING", 7, 1_767_000_000.0, 1_767_000_060.0, None, 4)
    assert job.allocation == (("n1", 0), ("n1", 1), ("n2", 4), ("n2", 5))
    nodes = {"nodes": [{"name": "n1", "state": ["IDLE", "DRAIN"], "gres": "gpu:h100:8",
                        "gres_drained": "gpu:h100:1(IDX:3)", "partitions": ["gpu"]}]}
    (node,) = parse_sinfo_json(json.dumps(nodes))
    assert (node.state, node.flags, node.gres_drained) == ("idle", ("DRAIN",), (3,))


def test_a_pending_multi_node_job_counts_gpus_on_every_node() -> None:
    doc = {"jobs": [{"job_id": 11, "job_state": "PENDING", "nodes": "", "node_count": 2,
                     "tres_per_node": "gres:gpu:h100:8", "submit_time": 1_767_000_000}]}
    (job,) = parse_squeue_json(json.dumps(doc))
    assert (job.gpus, job.allocation) == (16, ())
    text = ("JobId=11 JobName=big UserId=ana(1000) Priority=5 Account=ml QOS=normal "
            "JobState=PENDING Reason=Resources Restarts=0 SubmitTime=2026-01-05T10:00:00 "
            "StartTime=Unknown EndTime=Unknown Partition=gpu NodeList=(null) NumNodes=2-2 "
            "TresPerNode=gres:gpu:h100:8\n")
    (job,) = parse_scontrol_jobs(text)
    assert (job.gpus, job.account, job.user, job.start) == (16, "ml", "ana", None)


def test_garbage_is_refused() -> None:
    with pytest.raises(SlurmParseError, match="not JSON"):
        parse_squeue_json("squeue: error: Invalid user")
    with pytest.raises(SlurmParseError, match="no 'jobs' list"):
        parse_squeue_json("{}")


@pytest.mark.parametrize(("raw", "text"), [
    (768, "3:0"),            # exit 3: the raw wait status squeue --json gives (22.05)
    (9, "0:9"),              # killed by SIGKILL
    (15, "0:15"),            # SIGTERM (scancel)
    (139, "0:11"),           # SIGSEGV with a core dump (the 0x80 flag is not the signal)
    (0, "0:0"),
    (65280, "255:0"),
    (4294967294, None),      # NO_VAL: not set
    (None, None),
    ({"set": True, "infinite": False, "number": 768}, "3:0"),
    # Slurm >= 23.02: an object
    ({"status": ["EXITED"], "return_code": {"set": True, "infinite": False, "number": 3},
      "signal": {"id": {"set": False, "infinite": False, "number": 0}, "name": ""}}, "3:0"),
    ({"status": ["SIGNALED"], "return_code": {"set": True, "infinite": False, "number": 0},
      "signal": {"id": {"set": True, "infinite": False, "number": 9}, "name": "KILL"}}, "0:9"),
    # sacct --json of 22.05
    ({"status": "FAILED", "return_code": 3}, "3:0"),
    ({"status": "SIGNALED", "return_code": 0, "signal": {"signal_id": 9, "name": "KILL"}},
     "0:9"),
])
def test_json_exit_codes_read_as_exit_and_signal(raw: object, text: str | None) -> None:
    assert exit_code_text(raw) == text


# -- hostile input -----------------------------------------------------------------------
# tests/fixtures/slurm/hostile_*: real Slurm 22.05 captures (the test cluster of
# tests/slurm_cluster.py) of jobs whose name, --chdir, --comment and -o path hold text
# that looks like scontrol's fields, and of a node drained with a health check's reason
# "NHC: gpu count=4 State=IDLE Gres=gpu:h100:8 GresDrain=N/A". scontrol prints them as
# written: job 1 is `sbatch -J 'x Account=rich-team UserId=boss(0) Partition=urgent
# Nodes=gpu-node-1 GRES=gpu:h100:4(IDX:4-7)'`; job 4 is named 'lr=0.1 bs=32'.

RUNNING_LINE = (
    "JobId=10 JobName={name} UserId=mallory(1001) GroupId=mallory(1001) MCS_label=N/A "
    "Priority=100 Nice=0 Account=poor-team QOS=normal JobState=RUNNING Reason=None "
    "Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0 "
    "DerivedExitCode=0:0 RunTime=00:00:04 TimeLimit=UNLIMITED TimeMin=N/A "
    "SubmitTime=2026-11-29T17:52:19 EligibleTime=2026-11-29T17:52:19 "
    "AccrueTime=2026-11-29T17:52:19 StartTime=2026-11-29T17:52:21 EndTime=Unknown "
    "Deadline=N/A SuspendTime=None SecsPreSuspend=0 LastSchedEval=2026-11-29T17:52:21 "
    "Scheduler=Main Partition=gpu AllocNode:Sid=localhost:18474 ReqNodeList=(null) "
    "ExcNodeList=(null) NodeList=gpu-node-1 BatchHost=gpu-node-1 NumNodes=1 NumCPUs=1 "
    "NumTasks=1 CPUs/Task=1 ReqB:S:C:T=0:0:*:* TRES=cpu=1,node=1,billing=1 Socks/Node=* "
    "NtasksPerN:B:S:C=0:0:*:* CoreSpec=* JOB_GRES=gpu:h100:1   Nodes=gpu-node-1 CPU_IDs=1 "
    "Mem=0 GRES=gpu:h100:1(IDX:3) MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode=0 "
    "Features=(null) DelayBoot=00:00:00 OverSubscribe=OK Contiguous=0 Licenses=(null) "
    "Network=(null) Command=(null) WorkDir={workdir} StdErr=/dev/null StdIn=/dev/null "
    "StdOut=/dev/null Power= TresPerNode=gres:gpu:h100:1 \n")


def _line(name: str = "train", workdir: str = "/tmp") -> str:
    return RUNNING_LINE.format(name=name, workdir=workdir)


@pytest.mark.usefixtures("utc")
def test_the_text_fixture_still_reads_field_by_field() -> None:
    jobs = {j.job_id: j for j in parse_scontrol_jobs((FIX / "scontrol_jobs.txt").read_text())}
    assert [(j.name, j.user, j.partition, j.state, j.gpus, j.allocation)
            for j in jobs.values()] == [
        ("eval-a1", "root", "gpu", "CANCELLED", 1, ()),
        ("train-b2", "root", "gpu", "RUNNING", 2, (("gpu-node-1", 1), ("gpu-node-1", 2))),
        ("short-c3", "root", "gpu", "COMPLETED", 3, ()),
        ("train-d8", "root", "gpu", "PENDING", 8, ()),
        ("train-e2", "root", "gpu", "PENDING", 2, ())]
    assert jobs["2"].submit == 1_795_974_739.0 and jobs["1"].exit_code == "0:15"


def test_a_job_name_cannot_set_the_jobs_fields_or_claim_gpus() -> None:
    """D2: before, this name made the job boss's, charged to rich-team in urgent, on GPUs
    4-7 (the first value of a key won, and the name's Nodes=/GRES= read as detail)."""
    name = ("x Account=rich-team UserId=boss(0) Partition=urgent Nodes=gpu-node-1 "
            "GRES=gpu:h100:4(IDX:4-7)")
    with pytest.raises(SlurmParseError, match="job 10: UserId= comes after Account="):
        parse_scontrol_jobs(_line(name))
    refused: dict[str, str] = {}
    assert parse_scontrol_jobs(_line(name), refused) == []
    assert list(refused) == ["10"]
    # the same name with an honest job next to it: that one is read, whole
    refused = {}
    (honest,) = parse_scontrol_jobs(_line(name) + _line("ok").replace("JobId=10", "JobId=11"),
                                    refused)
    assert (honest.job_id, honest.user, honest.account, honest.allocation) == \
        ("11", "mallory", "poor-team", (("gpu-node-1", 3),))
    assert list(refused) == ["10"]


def test_detail_keys_in_a_name_or_a_path_are_not_an_allocation() -> None:
    fake = "Nodes=gpu-node-1 GRES=gpu:h100:4(IDX:4-7)"
    (job,) = parse_scontrol_jobs(_line(f"x {fake}"))
    assert job.name == f"x {fake}"
    assert (job.user, job.account, job.gpus, job.allocation) == \
        ("mallory", "poor-team", 1, (("gpu-node-1", 3),))
    (job,) = parse_scontrol_jobs(_line(workdir=f"/tmp/w {fake}"))
    assert job.allocation == (("gpu-node-1", 3),)


@pytest.mark.usefixtures("utc")
def test_real_hostile_job_lines_are_left_out_and_the_rest_is_read() -> None:
    text = (FIX / "hostile_scontrol_jobs.txt").read_text()
    with pytest.raises(SlurmParseError):
        parse_scontrol_jobs(text)
    refused: dict[str, str] = {}
    (job,) = parse_scontrol_jobs(text, refused)
    # 1: JobName, 2: --chdir (a second TresPerNode), 3: --comment, 5: -o path
    assert sorted(refused) == ["1", "2", "3", "5"]
    assert "appears twice" in refused["2"] and "comes after" in refused["1"]
    assert (job.job_id, job.name, job.user, job.account, job.partition, job.gpus) == \
        ("4", "lr=0.1 bs=32", "root", None, "gpu", 1)


def test_a_node_reason_cannot_set_the_nodes_state() -> None:
    """D8: before, Reason=... State=IDLE (a health check's text) replaced State=DOWN+DRAIN."""
    (node,) = parse_scontrol_nodes((FIX / "hostile_scontrol_nodes.txt").read_text())
    assert (node.state, node.flags, node.gpus, node.partitions) == \
        ("idle", ("DRAIN",), 8, ("gpu", "urgent"))
    assert node.reason == ("NHC: gpu count=4 State=IDLE Gres=gpu:h100:8 GresDrain=N/A "
                           "[root@2026-12-05T07:46:02]")
    down = (FIX / "scontrol_nodes.txt").read_text().replace("State=MIXED", "State=DOWN+DRAIN") \
        .rstrip() + " Reason=NHC: gpu count=4 State=IDLE Gres=gpu:h100:4 [root@x]\n"
    (node,) = parse_scontrol_nodes(down)
    assert (node.state, node.flags, node.gpus) == ("down", ("DRAIN",), 8)
    assert node.reason == "NHC: gpu count=4 State=IDLE Gres=gpu:h100:4 [root@x]"


def _squeue(**changes: object) -> str:
    doc = json.loads((FIX / "squeue.json").read_text())
    doc["jobs"][1].update(changes)
    return json.dumps(doc)


@pytest.mark.parametrize(("text", "message"), [
    ('{"jobs": [null]}', "job #0 is not an object"),
    ('{"jobs": [1, 2]}', "job #0 is not an object"),
    (_squeue(submit_time="yesterday"), "job 2: submit_time: 'yesterday' is not a time"),
    (_squeue(start_time=1e300), "job 2: start_time: 1e\\+300 is not a time"),
    (_squeue(end_time=float("inf")), "job 2: end_time: inf is not a time"),
    (_squeue(job_id=None), "a job without a valid job_id"),
    (_squeue(job_id="abc"), "a job without a valid job_id"),
    (_squeue(job_id=0), "a job without a valid job_id"),
    (_squeue(user_name=["x"]), "job 2: user_name: expected text, got list"),
    (_squeue(name={"a": 1}), "job 2: name: expected text, got dict"),
    (_squeue(job_state={"x": 1}), "job 2: job_state: expected a state name"),
    (_squeue(gres_detail="gpu:h100:2(IDX:1-2)"), "gres_detail: expected a list"),
    (_squeue(gres_detail=["gpu:h100:3(IDX:1,1,2)"]), "lists a GPU twice"),
    (_squeue(restart_cnt=-5), "restart_cnt -5 is negative"),
    (_squeue(job_id=1), "job 1 is listed twice"),
    ('{"jobs": [], "errors": [{"error": "Unable to contact slurm controller", "errno": 1}]}',
     "Slurm reported 1 error\\(s\\): Unable to contact slurm controller"),
    ('{"jobs": [], "errors": ["zero bytes were transmitted"]}', "zero bytes"),
])
def test_a_malformed_squeue_answer_is_refused_with_one_reason(text: str, message: str) -> None:
    """D5: before, these raised AttributeError/ValueError/OverflowError, made a job "None"
    or a user "['x']", or (errors) read as every job gone."""
    with pytest.raises(SlurmParseError, match=message):
        parse_squeue_json(text)


@pytest.mark.parametrize(("text", "message"), [
    ('{"nodes": [null]}', "node #0 is not an object with a name"),
    ('{"nodes": [{"name": "n1", "partitions": "gpu"}]}', "partitions: expected a list"),
    ('{"nodes": [], "errors": [{"error": "boom"}]}', "Slurm reported 1 error"),
])
def test_a_malformed_sinfo_answer_is_refused(text: str, message: str) -> None:
    with pytest.raises(SlurmParseError, match=message):
        parse_sinfo_json(text)


def test_every_bracket_group_of_a_hostlist_is_expanded() -> None:
    """D13: before, rack[1-2]-node[01-02] gave rack1-node[01-02], rack2-node[01-02]."""
    assert expand_hostlist("rack[1-2]-node[01-02]") == [
        "rack1-node01", "rack1-node02", "rack2-node01", "rack2-node02"]
    assert expand_hostlist("a[1,3]b[7],c") == ["a1b7", "a3b7", "c"]
    for bad in ("gpu-[1-3", "gpu-1]", "gpu-[x]", "gpu-[]", "a[1-1000]b[1-1000]"):
        with pytest.raises(SlurmParseError, match="hostlist"):
            expand_hostlist(bad)


# -- the bridge: an answer it cannot read changes nothing ------------------------------


def _bridge(tmp_path: Path, answers: dict[str, str], fmt: str) -> SlurmBridge:
    def runner(argv: list[str]) -> str:
        return answers[argv[0] if argv[0] != "scontrol" else f"scontrol {argv[3]}"]

    return SlurmBridge(SlurmSource(fmt=fmt, runner=runner), SlurmTracker(Mapping()),
                       FileSink(tmp_path / "out.jsonl"), tmp_path / "state")


def _events(tmp_path: Path) -> list[tuple[str, str]]:
    lines = (tmp_path / "out.jsonl").read_text().splitlines()
    return [(r["job_id"], r["event"]) for r in map(json.loads, lines) if r["type"] == "job"]


def test_an_unreadable_or_error_answer_fails_the_poll_and_changes_nothing(
        tmp_path: Path) -> None:
    answers = {"squeue": (FIX / "squeue.json").read_text(),
               "sinfo": (FIX / "sinfo.json").read_text()}
    bridge = _bridge(tmp_path, answers, "json")
    assert bridge.poll(now=2_000_000_000) is not None
    before = (tmp_path / "out.jsonl").read_text(), (tmp_path / "state").read_text()
    assert ("2", "started") in _events(tmp_path)
    for bad in ('{"jobs": [null]}', _squeue(submit_time="yesterday"),
                '{"jobs": [], "errors": [{"error": "Unable to contact slurm controller"}]}'):
        answers["squeue"] = bad
        assert bridge.poll(now=2_000_000_010) is None  # no traceback, no event
    assert bridge.totals.failed_polls == 3
    assert ((tmp_path / "out.jsonl").read_text(), (tmp_path / "state").read_text()) == before


@pytest.mark.usefixtures("utc")
def test_a_job_whose_line_turns_unreadable_is_not_taken_for_gone(tmp_path: Path) -> None:
    """A job renamed to look like scontrol's fields (scontrol update JobName=...) is left
    out while it reads so: no event for it, and no 'left squeue' cancel either."""
    answers = {"scontrol job": _line("ok"),
               "scontrol node": (FIX / "scontrol_nodes.txt").read_text()}
    bridge = _bridge(tmp_path, answers, "text")
    bridge.poll(now=2_000_000_000)
    assert _events(tmp_path) == [("10", "submitted"), ("10", "started")]
    answers["scontrol job"] = _line("x UserId=boss(0) Account=rich-team")
    stats = bridge.poll(now=2_000_000_010)
    assert stats is not None and stats.vanished == 0
    assert bridge.source.refused and "10" in bridge.tracker.jobs
    answers["scontrol job"] = _line("ok")
    bridge.poll(now=2_000_000_020)
    assert _events(tmp_path) == [("10", "submitted"), ("10", "started")]
