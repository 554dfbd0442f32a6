"""The report's preemption table: what its cells say when a preempted job never restarted."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import Facts
from events import alloc, at, inventory, job

from gpuledger.cli.main import main


@pytest.fixture
def preempted(process: Callable[..., Facts]) -> Path:
    """Team gone: g1 preempted then cancelled, g2 preempted then finished (neither
    requeued), g3 requeued then cancelled while pending. Team waits: w1 requeued and
    still pending when the data ends (10:30). Team back: b1 checkpointed, preempted,
    requeued, started again 5 minutes later."""
    sub = {"gpus": 1, "preemptible": True}
    recs: list[dict[str, Any]] = [inventory("n1", at(0), gpus=8)]
    for k, (job_id, team) in enumerate((("g1", "gone"), ("g2", "gone"), ("g3", "gone"),
                                        ("w1", "waits"), ("b1", "back"))):
        recs += [job("submitted", job_id, at(0), team=team, **sub),
                 job("started", job_id, at(0), allocation=alloc("n1", k))]
    recs += [job("preempted", "g1", at(10)), job("cancelled", "g1", at(11)),
             job("preempted", "g2", at(10)), job("finished", "g2", at(11)),
             job("preempted", "g3", at(10)), job("requeued", "g3", at(10)),
             job("cancelled", "g3", at(15)),
             job("preempted", "w1", at(10)), job("requeued", "w1", at(10)),
             job("checkpointed", "b1", at(5)), job("preempted", "b1", at(10)),
             job("requeued", "b1", at(10)),
             job("started", "b1", at(15), allocation=alloc("n1", 5)),
             job("submitted", "tick", at(30), gpus=1, team="other")]
    return process(recs).root


def _preemption_rows(root: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, str]:
    assert main(["report", "--warehouse", str(root), "--width", "200"]) == 0
    out = capsys.readouterr().out
    section = out[out.index("Preemption: lost work"):out.index("Borrowing and reclaim")]
    return {line.split()[0]: line for line in section.splitlines()
            if line.strip() and line.split()[0] in ("gone", "waits", "back")}


def test_requeue_wait_says_never_restarted_when_no_restart_can_come(
        preempted: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = _preemption_rows(preempted, capsys)
    assert rows["gone"].rstrip().endswith("never restarted")      # said: not restarted yet
    assert rows["waits"].rstrip().endswith("not restarted yet")   # w1 may still start
    assert rows["back"].split()[-1] == "5.0"                       # b1 waited 10:10–10:15


def test_without_checkpoint_counts_preemptions_that_had_no_checkpoint(
        preempted: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Every job here is checkpointable: the column counted checkpointable = false (0
    everywhere); g1–g3 and w1 were preempted with no checkpoint in their attempt, b1
    after one."""
    rows = _preemption_rows(preempted, capsys)
    # Preemptions, On borrowed GPUs, Without checkpoint
    assert rows["gone"].split()[1:4] == ["3", "0", "3"]
    assert rows["waits"].split()[1:4] == ["1", "0", "1"]
    assert rows["back"].split()[1:4] == ["1", "0", "0"]
