"""The openb trace through the importer and the processor equals a direct computation
from its CSV files (queue wait per pod, allocated GPUs over time)."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from openb_trace import openb_trace

from gpuledger.cli.main import main
from gpuledger.pipeline import query
from gpuledger.pipeline.importers.openb import load_openb

NODES, PODS, PUBLISHED = openb_trace()   # the published trace, else one in its format
FROM_H, HOURS = 3552.0, 2.0          # a busy stretch of day 148
LO, HI = FROM_H * 3600, (FROM_H + HOURS) * 3600

@pytest.fixture(scope="module")
def warehouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("openb")
    code = main(["import", "openb", "--nodes", str(NODES), "--pods", str(PODS),
                 "--from-hours", str(FROM_H), "--hours", str(HOURS), "--quiet",
                 "--warehouse", str(root)])
    assert code == 0
    return root


def _pods() -> pl.DataFrame:
    return pl.read_csv(PODS).filter(pl.col("num_gpu") > 0)


def test_queue_wait_per_pod_is_scheduled_minus_creation(warehouse: Path) -> None:
    direct = _pods().filter(
        (pl.col("creation_time") >= LO) & (pl.col("creation_time") < HI)
        & pl.col("scheduled_time").is_not_null() & (pl.col("scheduled_time") < HI)
    ).select(pl.col("name").alias("job_id"),
             (pl.col("scheduled_time") - pl.col("creation_time")).cast(pl.Float64)
             .alias("wait"))
    assert direct.height > 20
    cols, rows = query.run(warehouse, "SELECT job_id, queue_wait_s FROM attempts "
                                      "WHERE queue_wait_s IS NOT NULL")
    got = pl.DataFrame(rows, schema=cols, orient="row")
    joined = direct.join(got, on="job_id", how="left")
    assert joined["queue_wait_s"].null_count() == 0
    assert (joined["queue_wait_s"] == joined["wait"]).all()
    # and the percentiles per queue, as the queue_wait view computes them
    ids = ", ".join(f"'{j}'" for j in direct["job_id"])
    _, rows = query.run(warehouse, "SELECT queue, quantile_cont(queue_wait_s, 0.5), "
                                   "quantile_cont(queue_wait_s, 0.9) FROM attempts "
                                   f"WHERE job_id IN ({ids}) GROUP BY queue")
    qos = _pods().select(pl.col("name").alias("job_id"), "qos")
    by_queue = direct.join(qos, on="job_id").group_by("qos").agg(
        pl.col("wait").quantile(0.5, "linear").alias("p50"),
        pl.col("wait").quantile(0.9, "linear").alias("p90"))
    expected = {q: [a, b] for q, a, b in by_queue.iter_rows()}
    got_q = {q: [a, b] for q, a, b in rows}
    assert set(got_q) == set(expected) and len(expected) >= 2
    for q, values in expected.items():
        assert got_q[q] == pytest.approx(values)


def test_allocated_gpus_over_time_match_the_trace(warehouse: Path) -> None:
    minutes = pl.DataFrame({"m": pl.int_range(int(LO // 60), int(HI // 60), eager=True)})
    # a pod holds num_gpu × gpu_milli/1000 GPUs from scheduled to deletion (from the window
    # start if it was running then), each minute for the seconds it overlaps it
    # (docs/metrics.md: exact to the second)
    pods = _pods().filter(pl.col("scheduled_time").is_not_null()).select(
        pl.max_horizontal(pl.col("scheduled_time"), pl.lit(LO)).alias("s"),
        pl.col("deletion_time").alias("e"),
        (pl.col("num_gpu") * pl.col("gpu_milli") / 1000).alias("g"))
    overlap = (pl.min_horizontal(pl.col("e"), pl.col("m") * 60 + 60)
               - pl.max_horizontal(pl.col("s"), pl.col("m") * 60)).clip(0, None)
    direct = minutes.join(pods, how="cross").with_columns(overlap.alias("o")).filter(
        pl.col("o") > 0).group_by("m").agg((pl.col("g") * pl.col("o") / 60).sum().alias("g")
                                          ).sort("m")
    cols, rows = query.run(warehouse, "SELECT minute, sum(alloc_fraction) AS g FROM gpu_minute "
                                      "WHERE allocated GROUP BY minute ORDER BY minute")
    got = pl.DataFrame(rows, schema=cols, orient="row")
    assert got.height == direct.height == int(HOURS * 60)
    assert got["g"].to_list() == pytest.approx(direct["g"].to_list())


def test_every_pod_is_placed_and_cpu_pods_are_skipped() -> None:
    imported = load_openb(NODES, PODS, window_from_s=LO, window_to_s=HI)
    assert imported.unplaced == []
    assert imported.pods_cpu_only == pl.read_csv(PODS).filter(pl.col("num_gpu") == 0).height
    inv = imported.frames["inventory"]
    assert inv.height == pl.read_csv(NODES).filter(pl.col("gpu") > 0).height
    assert inv["gpu_count"].sum() == pl.read_csv(NODES)["gpu"].sum()


def test_a_pod_scheduled_after_the_window_is_pending_at_its_end(tmp_path: Path) -> None:
    """Created inside the window, scheduled after it: submitted, neither started nor
    reported unplaced (it was taken for a pod the importer could not place)."""
    nodes = tmp_path / "nodes.csv"
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\nn0,96000,786432,8,A100\n")
    pods = tmp_path / "pods.csv"
    pods.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
                    "creation_time,deletion_time,scheduled_time\n"
                    "inside,4000,16384,1,1000,,LS,Running,100,900,200\n"
                    "late,4000,16384,1,1000,,LS,Running,3000,9000,4000\n")
    imported = load_openb(nodes, pods, window_from_s=0, window_to_s=3600)
    assert imported.unplaced == []
    events = imported.frames["job"].select("job_id", "event").rows()
    assert ("late", "submitted") in events
    assert [e for j, e in events if j == "late"] == ["submitted"]
    assert [e for j, e in events if j == "inside"] == ["submitted", "started", "finished"]


def _tiny_trace(tmp_path: Path) -> tuple[Path, Path]:
    """One 8-GPU node; its last pod ends 9,000 s (2.5 h) after the trace's start."""
    nodes = tmp_path / "nodes.csv"
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\nn0,96000,786432,8,A100\n")
    pods = tmp_path / "pods.csv"
    pods.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
                    "creation_time,deletion_time,scheduled_time\n"
                    "a,4000,16384,1,1000,,LS,Running,100,900,200\n"
                    "b,4000,16384,2,1000,,LS,Running,3000,9000,4000\n")
    return nodes, pods


@pytest.mark.parametrize(("window", "says"), [
    (["--from-hours", "-1"], "--from-hours must be >= 0, got -1"),
    (["--from-hours", "nan"], "--from-hours must be a finite number, got 'nan'"),
    (["--from-hours", "1e12"], "at or after its end: its last GPU pod ends 2.5 h after"),
    (["--from-hours", "2.5"], "at or after its end: its last GPU pod ends 2.5 h after"),
])
def test_a_window_outside_the_trace_is_refused_with_its_length(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], window: list[str],
        says: str) -> None:
    nodes, pods = _tiny_trace(tmp_path)
    args = ["import", "openb", "--nodes", str(nodes), "--pods", str(pods), *window,
            "--quiet", "--warehouse", str(tmp_path / "wh")]
    try:
        code = main(args)
    except SystemExit as usage:  # argparse refuses the value itself
        code = usage.code
    assert code == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err, err
    assert not (tmp_path / "wh").exists()


def test_a_window_past_the_traces_end_ends_where_the_trace_does(tmp_path: Path) -> None:
    nodes, pods = _tiny_trace(tmp_path)
    for hours, root in (("1e12", tmp_path / "long"), (None, tmp_path / "whole")):
        assert main(["import", "openb", "--nodes", str(nodes), "--pods", str(pods),
                     "--from-hours", "0.5", *(["--hours", hours] if hours else []),
                     "--quiet", "--warehouse", str(root)]) == 0
    sql = "SELECT min(minute), max(minute), count(*), sum(alloc_fraction) FROM gpu_minute"
    assert query.run(tmp_path / "long", sql)[1] == query.run(tmp_path / "whole", sql)[1]
    last = query.run(tmp_path / "long", "SELECT max(minute) FROM gpu_minute")[1][0][0]
    assert last.hour == 2 and last.minute == 29          # 9,000 s: the minute before 2:30


def test_the_trace_shares_gpus_only_in_one_gpu_pods() -> None:
    """Why a share with num_gpu > 1 is refused as damage: the trace never has one."""
    pods = pl.read_csv(PODS)
    gpu = pods.filter(pl.col("num_gpu") > 0)
    assert gpu.filter(pl.col("gpu_milli") < 1000)["num_gpu"].unique().to_list() == [1]
    assert gpu["gpu_milli"].min() >= 1  # type: ignore[operator]
    load_openb(NODES, PODS, window_from_s=LO, window_to_s=HI)  # passes every rule


@pytest.mark.parametrize(("row", "error"), [
    ("b,1,1,1,1000,,LS,Running,100,50,200",
     ":3: deletion_time 50 is before creation_time 100"),
    ("b,1,1,1,1000,,LS,Running,100,500,50",
     ":3: scheduled_time 50 is before creation_time 100"),
    ("b,1,1,1,1000,,LS,Running,100,500,600",
     ":3: scheduled_time 600 is after deletion_time 500"),
    ("b,1,1,1,0,,LS,Running,100,500,200",
     ":3: gpu_milli 0 with num_gpu 1: a GPU pod uses 1-1000 thousandths"),
    ("b,1,1,2,500,,LS,Running,100,500,200",
     ":3: gpu_milli 500 with num_gpu 2: only one-GPU pods share a GPU"),
])
def test_a_damaged_pod_row_refuses_the_trace(row: str, error: str, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    nodes, pods = _tiny_trace(tmp_path)
    pods.write_text(pods.read_text().splitlines()[0] + "\n"
                    "a,4000,16384,1,1000,,LS,Running,100,900,200\n" + row + "\n")
    assert main(["import", "openb", "--nodes", str(nodes), "--pods", str(pods),
                 "--quiet", "--warehouse", str(tmp_path / "wh")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{pods}{error}" in err, err
    assert not (tmp_path / "wh").exists()
