"""The Slurm bridge against a real single-node Slurm (munged, slurmctld, slurmd).

One scenario on a node with ``Gres=gpu:h100:8``: jobs of 1, 2, 3 and 8 GPUs and one more
of 2 that queues behind the 8; the 3-GPU job is cancelled while running, the 2-GPU job
is requeued and runs again; two 1-GPU jobs fail, one with ``exit 3``, one killed by
SIGKILL. Two bridges watch it through the CLI: one reads Slurm's
JSON, the other scontrol's text; the JSON one is killed (SIGKILL) mid-way and
restarted. Meanwhile the test samples Slurm's own view (squeue/scontrol) every few
hundred milliseconds. Then the bridge's events go through ``gpuledger ingest`` and the
facts are checked against what Slurm reported: queue wait per attempt = StartTime −
SubmitTime, the GPU indices per job = scontrol's GRES IDX, the node's free GPUs and
fragmentation per minute = 8 − Slurm's GresUsed at the minute's middle.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from slurm_cluster import GPUS, NODE, URGENT, SlurmCluster, missing_tools

from gpuledger.bridges.slurm_parse import parse_gres, parse_scontrol_jobs
from gpuledger.cli.main import main
from gpuledger.pipeline import query

if missing_tools() or os.geteuid() != 0:
    if os.environ.get("CI"):
        raise RuntimeError(f"the Slurm tests need {missing_tools()} and root "
                           "(scripts/setup.d/20-slurm.sh)")
    pytest.skip(f"no Slurm here ({', '.join(missing_tools()) or 'not root'})",
                allow_module_level=True)


@dataclass
class SlurmView:
    """What Slurm itself said, sampled during the scenario."""

    # job → {(restarts, submit, start)} seen while RUNNING
    attempts: dict[str, set[tuple[int, float, float]]] = field(default_factory=dict)
    # (job, restarts) → GPU indices from scontrol's GRES IDX
    indices: dict[tuple[str, int], tuple[int, ...]] = field(default_factory=dict)
    # (time, GPUs in use on the node per scontrol show node GresUsed)
    used: list[tuple[float, int]] = field(default_factory=list)
    final: dict[str, str] = field(default_factory=dict)


@dataclass
class Scenario:
    cluster: SlurmCluster
    view: SlurmView
    ids: dict[str, str]
    json_out: Path
    text_out: Path
    warehouse: Path
    kills: int


def _bridge(cluster: SlurmCluster, out: Path, state: Path, fmt: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "gpuledger.cli.main", "bridge", "slurm", "--out", str(out),
         "--state", str(state), "--format", fmt, "--interval", "0.3", "--quiet"],
        env=cluster.env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _sample(cluster: SlurmCluster, view: SlurmView) -> None:
    now = time.time()
    node = cluster.run("scontrol", "-o", "show", "node", "-d", NODE).stdout
    used = next((v for k, v in (kv.split("=", 1) for kv in node.split() if "=" in kv)
                 if k == "GresUsed"), "")
    view.used.append((now, len(parse_gres(used)[2])))
    for job in parse_scontrol_jobs(cluster.run("scontrol", "-o", "show", "job", "-d").stdout):
        view.final[job.job_id] = job.state
        if job.state == "RUNNING" and job.submit and job.start:
            view.attempts.setdefault(job.job_id, set()).add((job.restarts, job.submit,
                                                             job.start))
            view.indices[(job.job_id, job.restarts)] = tuple(sorted(i for _, i in
                                                                    job.allocation))


def _until(cluster: SlurmCluster, view: SlurmView, t_end: float) -> None:
    while time.time() < t_end:
        _sample(cluster, view)
        time.sleep(0.25)


@pytest.fixture(scope="module")
def scenario(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scenario]:
    root = tmp_path_factory.mktemp("slurm")
    cluster = SlurmCluster(root / "cluster")
    cluster.start()
    view = SlurmView()
    json_out, text_out = root / "json.jsonl", root / "text.jsonl"
    bridges = [_bridge(cluster, json_out, root / "json.state", "json"),
               _bridge(cluster, text_out, root / "text.state", "text")]
    try:
        # Start so that the next minute's middle (second 30) falls 20-45 s in, where a1
        # and b2 hold 3 GPUs and 5 are free and nothing changes for a few seconds.
        second = time.time() % 60
        if 10 <= second < 45:
            time.sleep(45 - second)
        t0 = time.time()
        ids = {"a1": cluster.sbatch(1, 50, "eval-a1"), "b2": cluster.sbatch(2, 35, "train-b2"),
               "c3": cluster.sbatch(3, 60, "train-c3"),
               "f3": cluster.sbatch(1, 4, "eval-f3", then="exit 3"),
               "k9": cluster.sbatch(1, 4, "eval-k9", then="kill -9 $$"),
               "d8": cluster.sbatch(8, 8, "train-d8"), "e2": cluster.sbatch(2, 5, "train-e2")}
        _until(cluster, view, t0 + 3)
        cluster.run("scancel", ids["c3"])                   # cancelled while running
        _until(cluster, view, t0 + 5)
        cluster.run("scontrol", "requeue", ids["b2"])       # requeued, runs again after
        # Slurm holds a requeued job until its old credential expires (BeginTime;
        # cred_expire=10 s in this cluster instead of the default 120 s)
        _until(cluster, view, t0 + 10)
        bridges[0].send_signal(signal.SIGKILL)              # bridge dies mid-way ...
        bridges[0].wait(10)
        _until(cluster, view, t0 + 25)                      # ... b2 restarts while it is down
        bridges[0] = _bridge(cluster, json_out, root / "json.state", "json")
        deadline = t0 + 150
        while time.time() < deadline:
            _sample(cluster, view)
            if all(view.final.get(j) in ("COMPLETED", "CANCELLED", "FAILED")
                   for j in ids.values()):
                break
            time.sleep(0.25)
        time.sleep(2.0)                                     # bridges see the last end
        for proc in bridges:
            proc.send_signal(signal.SIGTERM)
        for proc in bridges:
            assert proc.wait(20) == 0, proc.stderr.read().decode() if proc.stderr else ""
        warehouse = root / "warehouse"
        assert main(["ingest", str(json_out), "--warehouse", str(warehouse), "--quiet",
                     "--strict"]) == 0
        yield Scenario(cluster, view, ids, json_out, text_out, warehouse, kills=1)
    finally:
        for proc in bridges:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        cluster.stop()


def _records(path: Path, kind: str) -> list[dict[str, Any]]:
    return [r for r in (json.loads(line) for line in path.read_text().splitlines())
            if r["type"] == kind]


def _started_told(path: Path, job_id: str) -> int:
    """How many `started` the bridge has written for the job so far (whole lines only)."""
    if not path.exists():
        return 0
    lines = path.read_text().split("\n")[:-1]  # the last piece may be half written
    return sum(1 for r in map(json.loads, lines)
               if r["type"] == "job" and r["job_id"] == job_id and r["event"] == "started")


def _sql(warehouse: Path, sql: str) -> pl.DataFrame:
    cols, rows = query.run(warehouse, sql)
    return pl.DataFrame(rows, schema=cols, orient="row")


def test_slurm_itself_did_what_the_scenario_needs(scenario: Scenario) -> None:
    v, ids = scenario.view, scenario.ids
    assert v.final[ids["c3"]] == "CANCELLED"
    assert {r for r, _, _ in v.attempts[ids["b2"]]} == {0, 1}
    assert all(v.final[ids[k]] == "COMPLETED" for k in ("a1", "b2", "d8", "e2"))
    assert v.final[ids["f3"]] == v.final[ids["k9"]] == "FAILED"
    # the 8-GPU job and the job behind it really queued
    for key in ("d8", "e2"):
        ((_, submit, start),) = v.attempts[ids[key]]
        assert start - submit >= 10


def test_every_event_exactly_once_across_a_kill(scenario: Scenario) -> None:
    events = _records(scenario.json_out, "job")
    by_job: dict[str, list[str]] = {}
    for e in events:
        by_job.setdefault(e["job_id"], []).append(e["event"])
    ids = scenario.ids
    assert by_job == {
        ids["a1"]: ["submitted", "started", "finished"],
        ids["b2"]: ["submitted", "started", "requeued", "started", "finished"],
        ids["c3"]: ["submitted", "started", "cancelled"],
        ids["d8"]: ["submitted", "started", "finished"],
        ids["e2"]: ["submitted", "started", "finished"],
        ids["f3"]: ["submitted", "started", "failed"],
        ids["k9"]: ["submitted", "started", "failed"],
    }


def test_json_and_text_bridges_agree(scenario: Scenario) -> None:
    # same events, same times, same order per job (the order across jobs depends on
    # when each bridge polled: the JSON one was down for a while)
    def per_job(path: Path) -> dict[str, list[dict[str, Any]]]:
        out: dict[str, list[dict[str, Any]]] = {}
        for r in _records(path, "job"):
            out.setdefault(r["job_id"], []).append(r)
        return out

    assert per_job(scenario.json_out) == per_job(scenario.text_out)
    # exit codes read alike: squeue --json's raw wait status decoded as scontrol's exit:signal
    for path in (scenario.json_out, scenario.text_out):
        reasons = {r["job_id"]: r.get("reason") for r in _records(path, "job")
                   if r["event"] == "failed"}
        assert reasons == {scenario.ids["f3"]: "failed (exit code 3:0)",
                           scenario.ids["k9"]: "failed (exit code 0:9)"}
    inv_json = {(r["node"], r["card_type"], r["gpu_count"], r["pool"])
                for r in _records(scenario.json_out, "inventory")}
    inv_text = {(r["node"], r["card_type"], r["gpu_count"], r["pool"])
                for r in _records(scenario.text_out, "inventory")}
    assert inv_json == inv_text == {(NODE, "H100-SXM5-80GB", GPUS, "gpu")}


def test_started_events_carry_slurms_gres_idx(scenario: Scenario) -> None:
    v = scenario.view
    seen: dict[str, int] = {}
    for e in _records(scenario.json_out, "job"):
        if e["event"] != "started":
            continue
        attempt = seen.get(e["job_id"], 0)
        seen[e["job_id"]] = attempt + 1
        assert {a["node"] for a in e["allocation"]} == {NODE}
        assert tuple(sorted(a["gpu_index"] for a in e["allocation"])) == \
            v.indices[(e["job_id"], attempt)]
        ((_, _, start),) = [a for a in v.attempts[e["job_id"]] if a[0] == attempt]
        assert e["time"].startswith(time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(start)))


def test_queue_wait_per_attempt_is_slurms_start_minus_submit(scenario: Scenario) -> None:
    got = _sql(scenario.warehouse, "SELECT job_id, attempt, queue_wait_s, gpus FROM attempts "
                                   "WHERE started_at IS NOT NULL")
    expected = {(job, restarts): start - submit
                for job, seen in scenario.view.attempts.items()
                for restarts, submit, start in seen}
    assert {(j, a): w for j, a, w, _ in got.iter_rows()} == expected
    gpus = {j: g for j, _, _, g in got.iter_rows()}
    assert [gpus[scenario.ids[k]] for k in ("a1", "b2", "c3", "d8", "e2")] == [1, 2, 3, 8, 2]


def test_gpu_minutes_per_index_match_scontrol_idx(scenario: Scenario) -> None:
    got = _sql(scenario.warehouse, "SELECT job_id, attempt, node, gpu_index FROM job_gpu")
    by_attempt: dict[tuple[str, int], set[int]] = {}
    for job, attempt, node, index in got.iter_rows():
        assert node == NODE
        by_attempt.setdefault((job, attempt), set()).add(index)
    view = scenario.view.indices
    for key, indices in by_attempt.items():
        assert indices == set(view[key]), key
    # every attempt that covered a minute's middle appears
    assert {k for k in view if _covers_a_middle(scenario, k)} <= set(by_attempt)


def _covers_a_middle(scenario: Scenario, key: tuple[str, int]) -> bool:
    job, restarts = key
    ((_, _, start),) = [a for a in scenario.view.attempts[job] if a[0] == restarts]
    ends = [e for e in _records(scenario.json_out, "job")
            if e["job_id"] == job and e["event"] in ("requeued", "finished", "cancelled",
                                                     "failed")]
    end_s = datetime.fromisoformat(ends[restarts]["time"]).timestamp()
    first_middle = (start // 60) * 60 + 30
    middle = first_middle if first_middle >= start else first_middle + 60
    return middle < end_s


def test_free_gpus_and_fragmentation_match_slurms_gres_used(scenario: Scenario) -> None:
    frag = _sql(scenario.warehouse, "SELECT epoch(minute) AS m, free_gpus, frag_1, frag_2, "
                                    "frag_4, frag_8 FROM frag_minute ORDER BY m")
    checked, partial = 0, 0
    samples = scenario.view.used
    for m, free, f1, f2, f4, f8 in frag.iter_rows():
        middle = m + 30
        near = [(abs(t - middle), u) for t, u in samples if abs(t - middle) <= 1.5]
        if not near or len({u for _, u in near}) != 1:
            continue  # no sample at the middle, or an allocation changed right there
        slurm_free = GPUS - near[0][1]
        assert free == slurm_free, (m, free, slurm_free)
        for k, value in ((1, f1), (2, f2), (4, f4), (8, f8)):
            expected = 0.0 if slurm_free == 0 else 1 - k * (slurm_free // k) / slurm_free
            assert value == pytest.approx(expected)
        checked += 1
        partial += 0 < slurm_free < GPUS
    assert checked >= 1 and partial >= 1


def test_cli_refuses_a_bad_mapping(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "m.yaml"
    bad.write_text("teams:\n  accounts:\n    foo: 3\n")
    code = main(["bridge", "slurm", "--config", str(bad), "--out", str(tmp_path / "o"),
                 "--once"])
    assert code == 2
    assert "mapping.teams.accounts.foo: expected a string" in capsys.readouterr().err


def test_preemption_by_a_higher_tier_partition(scenario: Scenario, tmp_path: Path) -> None:
    """A job of the `urgent` partition (PriorityTier 2, PreemptMode=REQUEUE) preempts one
    of `gpu`. Slurm 22.05 shows this only as a requeue (the restart count goes up), so
    the bridge reports `requeued`, and the second attempt waits from Slurm's new
    SubmitTime."""
    cluster, view = scenario.cluster, SlurmView()
    out = tmp_path / "preempt.jsonl"
    proc = _bridge(cluster, out, tmp_path / "preempt.state", "json")
    try:
        low = cluster.sbatch(6, 120, "low-p")
        deadline = time.time() + 20
        while time.time() < deadline and view.final.get(low) != "RUNNING":
            _sample(cluster, view)
            time.sleep(0.2)
        urgent = cluster.sbatch(4, 3, "urgent-p", "-p", URGENT)
        deadline = time.time() + 60
        # the second attempt must run until both Slurm's view here and the bridge (polling
        # every 0.3 s) have seen it: one that ends between two polls gets no `started`,
        # by design
        while time.time() < deadline and not (
                any(a[0] == 1 for a in view.attempts.get(low, ()))
                and _started_told(out, low) >= 2):
            _sample(cluster, view)
            time.sleep(0.25)
        cluster.run("scancel", low)
        while time.time() < deadline and view.final.get(low) != "CANCELLED":
            _sample(cluster, view)
            time.sleep(0.25)
        time.sleep(1.5)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
    events = _records(out, "job")
    by_job: dict[str, list[str]] = {}
    for e in events:
        by_job.setdefault(e["job_id"], []).append(e["event"])
    assert by_job[low] == ["submitted", "started", "requeued", "started", "cancelled"]
    assert by_job[urgent] == ["submitted", "started", "finished"]
    ((_, submit, start),) = [a for a in view.attempts[low] if a[0] == 1]
    requeued = next(e for e in events if e["job_id"] == low and e["event"] == "requeued")
    restarted = [e for e in events if e["job_id"] == low and e["event"] == "started"][1]
    assert datetime.fromisoformat(requeued["time"]).timestamp() == submit
    assert datetime.fromisoformat(restarted["time"]).timestamp() == start
    assert sorted(a["gpu_index"] for a in restarted["allocation"]) == \
        list(view.indices[(low, 1)])


def _job_now(cluster: SlurmCluster, job_id: str) -> Any:
    (job,) = parse_scontrol_jobs(cluster.run("scontrol", "-o", "show", "job", "-d",
                                             job_id).stdout)
    return job


def _wait_for(cluster: SlurmCluster, job_id: str, ok: Any, what: str,
              timeout_s: float = 60) -> Any:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        job = _job_now(cluster, job_id)
        if ok(job):
            return job
        time.sleep(0.2)
    raise AssertionError(f"job {job_id} never {what}: {_job_now(cluster, job_id)}")


def _poll_once(cluster: SlurmCluster, out: Path, state: Path, fmt: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "gpuledger.cli.main", "bridge", "slurm", "--out", str(out),
         "--state", str(state), "--format", fmt, "--once", "--quiet"],
        env=cluster.env(), capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return done.stderr


def test_a_bridge_started_after_the_fact(scenario: Scenario, tmp_path: Path) -> None:
    """A bridge with a new state file, started after a job ended and after another was
    requeued: the ended job reads "not observed by the bridge (started before it ran)";
    the requeued one is `submitted` and `requeued` at its reset SubmitTime, so its
    earlier attempt counts. A third job, seen pending by the bridge, runs and is requeued
    between two polls: `requeued` too. JSON and text say the same, and after `gpuledger
    ingest` each requeued job has two attempts, the second waiting from the requeue."""
    cluster = scenario.cluster
    done = cluster.sbatch(1, 1, "done-x")
    _wait_for(cluster, done, lambda j: j.state == "COMPLETED", "completed")
    requeued = cluster.sbatch(2, 120, "req-r")
    _wait_for(cluster, requeued, lambda j: j.state == "RUNNING", "started")
    cluster.run("scontrol", "requeue", requeued)
    reset = _wait_for(cluster, requeued, lambda j: j.phase == "pending" and j.restarts == 1,
                      "requeued").submit
    held = cluster.sbatch(1, 120, "held-p", "--hold")
    outs = {fmt: tmp_path / f"{fmt}.jsonl" for fmt in ("json", "text")}

    def poll() -> list[str]:
        return [_poll_once(cluster, outs[f], tmp_path / f"{f}.state", f) for f in outs]

    logs = poll()                                   # the bridges' first poll
    assert all("had run before the first poll" in log for log in logs)
    cluster.run("scontrol", "release", held)        # runs, and is requeued between polls
    _wait_for(cluster, held, lambda j: j.state == "RUNNING", "started")
    cluster.run("scontrol", "requeue", held)
    held_reset = _wait_for(cluster, held, lambda j: j.phase == "pending" and j.restarts == 1,
                           "requeued").submit
    poll()
    starts = {j: _wait_for(cluster, j, lambda x: x.state == "RUNNING", "restarted").start
              for j in (requeued, held)}
    poll()
    cluster.run("scancel", requeued, held)
    for j in (requeued, held):
        _wait_for(cluster, j, lambda x: x.state == "CANCELLED", "cancelled")
    poll()

    def events(path: Path) -> dict[str, list[tuple[str, float, str | None]]]:
        by: dict[str, list[tuple[str, float, str | None]]] = {}
        for r in _records(path, "job"):
            if r["job_id"] in (done, requeued, held):
                by.setdefault(r["job_id"], []).append(
                    (r["event"], datetime.fromisoformat(r["time"]).timestamp(),
                     r.get("reason")))
        return by

    got = events(outs["json"])
    assert got == events(outs["text"])
    [_, (end, _, reason)] = got[done]
    assert (end, reason) == ("finished", "completed; not observed by the bridge (started "
                                         "before it ran)")
    assert [(e, t) for e, t, _ in got[requeued]] == [
        ("submitted", reset), ("requeued", reset), ("started", starts[requeued]),
        ("cancelled", got[requeued][-1][1])]
    assert "before the bridge's first poll (not observed)" in str(got[requeued][1][2])
    assert [(e, t) for e, t, _ in got[held]][:3] == [
        ("submitted", got[held][0][1]), ("requeued", held_reset), ("started", starts[held])]
    assert "ran between two polls (not observed)" in str(got[held][1][2])
    assert "ran" not in str(got[done][0][2])

    warehouse = tmp_path / "warehouse"
    assert main(["ingest", str(outs["json"]), "--warehouse", str(warehouse), "--quiet",
                 "--strict"]) == 0
    att = _sql(warehouse, f"SELECT job_id, attempt, end_event, started_at IS NULL AS unseen, "
                          f"queue_wait_s FROM attempts WHERE job_id IN ('{requeued}', "
                          f"'{held}') ORDER BY job_id, attempt")
    assert [(j, a, e, u) for j, a, e, u, _ in att.iter_rows()] == [
        (j, a, e, u) for j in sorted((requeued, held))
        for a, e, u in ((0, "requeued", True), (1, "cancelled", False))]
    waits = {j: w for j, a, _, _, w in att.iter_rows() if a == 1}
    assert waits == {requeued: starts[requeued] - reset, held: starts[held] - held_reset}


def test_a_job_name_that_looks_like_scontrols_fields(scenario: Scenario,
                                                     tmp_path: Path) -> None:
    """Slurm prints a job name as written: `sbatch -J 'x Account=rich-team UserId=boss(0)
    ... GRES=gpu:h100:4(IDX:4-7)'` puts those keys into `scontrol -o show job` (checked
    here). The text bridge leaves that job out, with a warning, instead of reading it as
    boss's job on GPUs 4-7; the JSON bridge reads the name as a name."""
    cluster = scenario.cluster
    name = ("x Account=rich-team UserId=boss(0) Partition=urgent Nodes=gpu-node-1 "
            "GRES=gpu:h100:4(IDX:4-7)")
    job_id = cluster.sbatch(1, 120, name, "--hold")
    try:
        line = cluster.run("scontrol", "-o", "show", "job", "-d", job_id).stdout
        assert f"JobName={name} UserId=" in line
        text_log = _poll_once(cluster, tmp_path / "text.jsonl", tmp_path / "text.state", "text")
        assert f"job {job_id} left out of this poll" in text_log
        assert [r for r in _records(tmp_path / "text.jsonl", "job")
                if r["job_id"] == job_id] == []
        _poll_once(cluster, tmp_path / "json.jsonl", tmp_path / "json.state", "json")
        (submitted,) = [r for r in _records(tmp_path / "json.jsonl", "job")
                        if r["job_id"] == job_id]
        assert (submitted["event"], submitted["user"], submitted["pool"]) == \
            ("submitted", "root", "gpu")
    finally:
        cluster.run("scancel", job_id, check=False)
