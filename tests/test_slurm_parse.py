"""Parsing Slurm's output: real Slurm 22.05 captures (tests/fixtures/slurm/, taken from
the test cluster of tests/slurm_cluster.py) and the grammars of GRES, TRES and host lists."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

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
