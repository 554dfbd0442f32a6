"""The analyst views on hand-computed cases (docs/metrics.md): allocated GPU-hours
without telemetry are their own column and never waste, and the percentile conventions
(interpolated and nearest-rank) of the queue-wait views."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from conftest import Facts
from events import alloc, at, inventory, job, series

from gpuledger.cli.main import main
from gpuledger.pipeline import query


def _one(root: Path, sql: str) -> dict[str, Any]:
    columns, rows = query.run(root, sql)
    assert len(rows) == 1, rows
    return dict(zip(columns, rows[0], strict=True))


@pytest.fixture
def mixed(process: Callable[..., Facts]) -> Path:
    """One 8-GPU node, 10:00-10:40. Job `sched` (team vision) holds GPUs 0-3 from 10:00
    to 10:30 and no telemetry ever comes from them (scheduler-only history); job `seen`
    (team vision) holds GPUs 4-5 for the same 30 minutes at 50 % activity:

    allocated = 4 × 0.5 + 2 × 0.5 = 3.0 GPU-h; no telemetry = 2.0; used = 2 × 0.5 × 0.5
    = 0.5; waste = 3.0 − 0.5 − 2.0 = 0.5 (not 2.5); idle = 0 (not 2.0); used of the
    observed allocation = 0.5 / 1.0 = 50 % (not 16.7 %)."""
    recs: list[dict[str, Any]] = [inventory("n1", at(0), gpus=8)]
    for job_id, gpus in (("sched", (0, 1, 2, 3)), ("seen", (4, 5))):
        recs += [job("submitted", job_id, at(0), gpus=len(gpus)),
                 job("started", job_id, at(0), allocation=alloc("n1", *gpus)),
                 job("finished", job_id, at(30))]
    for gpu in (4, 5):
        recs += series("n1", gpu, at(0), 30, every_s=30, seq0=gpu * 1000, util=50.0,
                       jobs=["seen"])
    for gpu in (6, 7):  # free GPUs report too, so the watermark moves past 10:30
        recs += series("n1", gpu, at(0), 40, every_s=30, seq0=gpu * 1000, util=0.0)
    return process(recs).root


def test_no_telemetry_is_its_own_column_never_waste(mixed: Path) -> None:
    team = _one(mixed, "SELECT * FROM utilisation_by_team")
    assert team["allocated_gpu_hours"] == pytest.approx(3.0)
    assert team["no_telemetry_gpu_hours"] == pytest.approx(2.0)
    assert team["used_gpu_hours"] == pytest.approx(0.5)
    assert team["waste_gpu_hours"] == pytest.approx(0.5)
    assert team["idle_gpu_hours"] == pytest.approx(0.0)
    assert team["utilisation_of_allocation"] == pytest.approx(0.5)
    pool = _one(mixed, "SELECT * FROM utilisation_by_pool")
    assert (pool["no_telemetry_gpu_hours"], pool["idle_gpu_hours"],
            pool["utilisation_of_allocation"]) == (pytest.approx(2.0), pytest.approx(0.0),
                                                   pytest.approx(0.5))
    waste = _one(mixed, "SELECT * FROM waste_sources WHERE dimension = 'team' "
                        "AND value = 'vision'")
    assert (waste["no_telemetry_gpu_hours"], waste["waste_gpu_hours"],
            waste["idle_gpu_hours"]) == (pytest.approx(2.0), pytest.approx(0.5),
                                         pytest.approx(0.0))


def test_attempts_without_telemetry_waste_nothing(mixed: Path) -> None:
    sched = _one(mixed, "SELECT * FROM attempts WHERE job_id = 'sched'")
    assert sched["allocated_gpu_hours"] == pytest.approx(2.0)
    assert sched["no_telemetry_gpu_hours"] == pytest.approx(2.0)
    assert sched["waste_gpu_hours"] == pytest.approx(0.0)
    assert sched["idle_gpu_hours"] == pytest.approx(0.0)
    assert sched["utilisation_of_allocation"] is None            # unknown, not 0 %
    seen = _one(mixed, "SELECT * FROM attempts WHERE job_id = 'seen'")
    assert (seen["no_telemetry_gpu_hours"], seen["waste_gpu_hours"],
            seen["utilisation_of_allocation"]) == (pytest.approx(0.0), pytest.approx(0.5),
                                                   pytest.approx(0.5))
    top = _one(mixed, "SELECT job_id FROM top_waste_jobs(n := 1)")
    assert top["job_id"] == "seen"


def test_the_report_shows_no_telemetry_apart(mixed: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", "--warehouse", str(mixed), "--width", "200"]) == 0
    out = capsys.readouterr().out
    team = next(line for line in out.splitlines() if line.strip().startswith("vision"))
    # Allocated, Idle, Inefficient, Waste, No telemetry, Used of allocated (%), share
    assert team.split()[1:7] == ["3.0", "0.0", "0.0", "0.5", "2.0", "50.0"]
    sched = next(line for line in out.splitlines() if line.strip().startswith("sched"))
    assert "no telemetry" in sched


@pytest.fixture
def waits(process: Callable[..., Facts]) -> Path:
    """1-GPU attempts that waited 10, 20, 30, 40 and 100 s; 2-GPU ones (of any card type)
    60 and 120 s."""
    recs: list[dict[str, Any]] = [inventory("n1", at(0), gpus=8)]
    cases = [(1, 10), (1, 20), (1, 30), (1, 40), (1, 100), (2, 60), (2, 120)]
    for k, (gpus, wait) in enumerate(cases):
        job_id = f"j{k}"
        any_card = {"card_type": None} if gpus == 2 else {}   # any card of the pool
        recs += [job("submitted", job_id, at(0), gpus=gpus, **any_card),
                 job("started", job_id, at(0) + timedelta(seconds=wait),
                     allocation=alloc("n1", *range(gpus))),
                 job("finished", job_id, at(5))]
    recs.append(job("checkpointed", "j0", at(1)))
    return process(recs).root


def test_percentiles_interpolated_and_nearest_rank(waits: Path) -> None:
    one = _one(waits, "SELECT * FROM queue_wait_by_gpus WHERE gpus = 1")
    # n = 5, sorted 10 20 30 40 100. Interpolated: p at position (n − 1)·q.
    assert one["attempts"] == 5 and one["mean_s"] == pytest.approx(40.0)
    assert one["p50_s"] == pytest.approx(30.0)                   # position 2
    assert one["p90_s"] == pytest.approx(40 + 0.6 * 60)          # position 3.6: 76
    assert one["p99_s"] == pytest.approx(40 + 0.96 * 60)         # position 3.96: 97.6
    # Nearest-rank: the ⌈q·n⌉-th smallest.
    assert one["p50_nearest_s"] == 30                            # ⌈2.5⌉ = 3rd
    assert one["p90_nearest_s"] == 100                           # ⌈4.5⌉ = 5th
    assert one["p99_nearest_s"] == 100
    two = _one(waits, "SELECT * FROM queue_wait_by_gpus WHERE gpus = 2")
    assert (two["mean_s"], two["p50_s"], two["p50_nearest_s"]) == \
        (pytest.approx(90.0), pytest.approx(90.0), 60)          # ⌈1⌉ = 1st
    overall = _one(waits, "SELECT * FROM queue_wait_overall")
    assert overall["attempts"] == 7
    assert overall["mean_s"] == pytest.approx(380 / 7)
    # 10 20 30 40 60 100 120: position 6 · 0.9 = 5.4 → 100 + 0.4 · 20; ⌈6.3⌉ = 7th
    assert overall["p90_s"] == pytest.approx(108.0)
    assert overall["p90_nearest_s"] == 120
    by_size = _one(waits, "SELECT * FROM queue_wait_by_size WHERE gpus = 2")
    assert (by_size["queue"], by_size["p90_s"], by_size["p90_nearest_s"]) == \
        ("research", pytest.approx(114.0), 120)
    # the 2-GPU jobs asked for no card type: grouped by the one they got
    card = _one(waits, "SELECT * FROM queue_wait_by_card")
    assert (card["card_type"], card["attempts"], card["p90_nearest_s"]) == \
        ("H100-SXM5-80GB", 7, 120)
    queue = _one(waits, "SELECT * FROM queue_wait")
    assert (queue["mean_s"], queue["p90_s"], queue["p90_nearest_s"]) == \
        (pytest.approx(380 / 7), pytest.approx(108.0), 120)
