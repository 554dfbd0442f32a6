"""The openb trace through the importer and the processor equals a direct computation
from its CSV files (queue wait per pod, allocated GPUs over time)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import polars as pl
import pytest
from openb_trace import openb_trace

from gpuledger.cli.main import main
from gpuledger.pipeline import query
from gpuledger.pipeline.config import load_config
from gpuledger.pipeline.importers.openb import OpenbImportError, load_openb
from gpuledger.pipeline.ingest import import_history
from gpuledger.pipeline.processor import Processor
from gpuledger.pipeline.warehouse import Warehouse

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
    code: int | str | None
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
    # found by trying damaged traces: times that differ past the sixth digit were shown
    # alike (2.75808e+06 before 2.75808e+06); a row cut short said "None is missing"; a
    # row with a field too many named no line
    ("b,1,1,1,1000,,LS,Running,2758084.5,2900000,2758084",
     ":3: scheduled_time 2758084 is before creation_time 2758084.5"),
    ("b,1,1,1,1000,,LS,Running", ":3: column creation_time is missing"),
    ("b,1,1,1,1000,,LS,Running,100,500,200,extra", ":3: 12 fields, the header has 11"),
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


HEADER = ("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
          "creation_time,deletion_time,scheduled_time\n")


def _trace(tmp_path: Path, nodes: str, *pods: str) -> tuple[Path, Path]:
    """A node list of ``nodes`` lines and a pod list of ``pods`` rows."""
    node_csv, pod_csv = tmp_path / "nodes.csv", tmp_path / "pods.csv"
    node_csv.write_text("sn,cpu_milli,memory_mib,gpu,model\n" + nodes)
    pod_csv.write_text(HEADER + "".join(f"{row}\n" for row in pods))
    return node_csv, pod_csv


def _import(nodes: Path, pods: Path, root: Path, *extra: str) -> int:
    return main(["import", "openb", "--nodes", str(nodes), "--pods", str(pods), *extra,
                 "--quiet", "--warehouse", str(root)])


def test_a_window_that_cuts_attempts_says_so_and_keeps_its_minutes_whole(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Pods alive at the window start keep their own submission and start (the processor
    begins its minutes at the window's start): one warning line names them, since their
    job_attempts GPU-hours count from there; the window's minute facts are exact, and
    their queue waits are their own (200 s and 50 s; 100 and 0 before)."""
    nodes, pods = _trace(tmp_path, "node-a,64000,262144,4,V100M16\n",
                         "i,1000,1024,1,1000,,LS,Running,3500,4000,3700",   # pending at 1 h
                         "r,1000,1024,1,1000,,LS,Running,3000,4200,3050",   # running at 1 h
                         "n,1000,1024,1,1000,,LS,Running,3660,3900,3720")   # inside
    with caplog.at_level("WARNING", logger="gpuledger.pipeline.importers.openb"):
        assert _import(nodes, pods, tmp_path / "wh", "--from-hours", "1", "--hours", "1") == 0
    said = [r.getMessage() for r in caplog.records
            if r.name == "gpuledger.pipeline.importers.openb"]
    assert len(said) == 1 and "\n" not in said[0], said
    assert said[0].startswith("openb: 2 pod(s) began before the window's start at 1 h "
                              "(e.g. i, r): they keep their own queue wait and start, but "
                              "job_attempts counts their GPU-hours from there only and "
                              "does not add an earlier window's part of them"), said
    assert load_openb(nodes, pods, window_from_s=3600, window_to_s=7200).began_before \
        == ["i", "r"]
    # minutes: i 3700-4000 (300 s), r 3600-4200 (600 s), n 3720-3900 (180 s)
    _, rows = query.run(tmp_path / "wh", "SELECT round(sum(alloc_fraction) * 60, 6), "
                                         "min(minute) FROM gpu_minute WHERE allocated")
    assert rows[0][0] == pytest.approx(1080.0)
    assert (rows[0][1].hour, rows[0][1].minute) == (1, 0)
    _, rows = query.run(tmp_path / "wh", "SELECT job_id, queue_wait_s FROM job_attempts "
                                         "ORDER BY job_id")
    assert rows == [("i", 200.0), ("n", 60.0), ("r", 50.0)]
    caplog.clear()
    with caplog.at_level("WARNING", logger="gpuledger.pipeline.importers.openb"):
        assert _import(nodes, pods, tmp_path / "whole") == 0  # no window: nothing cut
    assert not [r for r in caplog.records if r.name == "gpuledger.pipeline.importers.openb"]


@pytest.mark.parametrize(("window", "says"), [
    (["--from-hours", "1.0125", "--hours", "0.9725"],
     "the window starts 1.0125 h (3,645 s) after the trace's start, inside a minute: "
     "--from-hours and --hours must give whole minutes (multiples of 1/60 h)"),
    (["--from-hours", "1", "--hours", "0.9725"],
     "the window ends 1.9725 h (7,101 s) after the trace's start, inside a minute"),
])
def test_a_window_bound_inside_a_minute_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], window: list[str],
        says: str) -> None:
    nodes, pods = _trace(tmp_path, "node-a,64000,262144,2,V100M16\n",
                         "c,1000,1024,1,250,,BE,Failed,0,7300,10")
    assert _import(nodes, pods, tmp_path / "wh", *window) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err and "Traceback" not in err, err
    assert not (tmp_path / "wh").exists()


def test_a_window_on_whole_minutes_keeps_every_gpu_minute(tmp_path: Path) -> None:
    """1.05 h = 01:03 and 0.95 h later = 02:00 (decimal hours a hair off a minute are
    that minute): 57 minutes of 4 GPUs, a quarter of one allocated."""
    nodes, pods = _trace(tmp_path, "node-a,64000,262144,2,V100M16\n"
                                   "node-b,64000,262144,2,V100M16\n",
                         "c,1000,1024,1,250,,BE,Failed,0,7300,10")
    assert _import(nodes, pods, tmp_path / "wh", "--from-hours", "1.05",
                   "--hours", "0.95") == 0
    _, rows = query.run(tmp_path / "wh", "SELECT round(sum(gpu_hours) * 60, 6), "
                                         "round(sum(allocated_gpu_hours) * 60, 6) "
                                         "FROM gpu_hourly")
    assert rows == [(228.0, 14.25)]
    imported = load_openb(nodes, pods, window_from_s=0.0166667 * 3600, window_to_s=3600)
    assert imported.frames["inventory"]["time"][0].minute == 1


def test_a_pod_name_listed_twice_refuses_the_trace(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nodes, pods = _trace(tmp_path, "node-a,64000,262144,2,V100M16\n",
                         "x,1,1,1,1000,,LS,Running,0,100,10",
                         "y,1,1,0,0,,LS,Running,0,100,10",
                         "x,1,1,1,1000,,LS,Running,0,200,20")
    assert _import(nodes, pods, tmp_path / "wh") == 2
    err = capsys.readouterr().err
    assert err == (f"gpuledger: error: {pods}:4: pod 'x' appears twice (first on line 2); "
                   "names must be unique\n")
    assert not (tmp_path / "wh").exists()


@pytest.mark.parametrize(("start", "span"), [
    ("1990-01-01T00:00Z", "from 1990-01-01 00:00 to 1990-01-01 00:03 UTC"),
    ("1999-12-31T23:59Z", "from 1999-12-31 23:59 to 2000-01-01 00:02 UTC"),
    ("2099-01-01T00:00Z", "from 2099-01-01 00:00 to 2099-01-01 00:03 UTC"),
])
def test_a_start_whose_events_would_all_be_rejected_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], start: str, span: str) -> None:
    nodes, pods = _trace(tmp_path, "node-a,64000,262144,2,V100M16\n",
                         "x,1,1,1,1000,,LS,Running,0,100,10",
                         "y,1,1,1,1000,,LS,Running,0,200,20")
    assert _import(nodes, pods, tmp_path / "wh", "--start", start) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert f"the start {start} (--start) puts the imported events {span}: event times " \
           "must lie from 2000-01-01 to an hour after now (" in err, err
    assert not (tmp_path / "wh").exists()


def test_the_start_may_put_the_last_event_up_to_an_hour_after_now(tmp_path: Path) -> None:
    nodes, pods = _tiny_trace(tmp_path)          # its last pod ends 2.5 h after the start
    start = datetime(2026, 1, 1, tzinfo=UTC)
    load_openb(nodes, pods, start=start, now=start + timedelta(hours=1.5))
    with pytest.raises(OpenbImportError, match="to 2026-01-01 02:30 UTC: .* an hour after "
                                               r"now \(2026-01-01 02:29 UTC\)"):
        load_openb(nodes, pods, start=start, now=start + timedelta(hours=1.49))
    # a window ending before the trace does ends the events there
    load_openb(nodes, pods, start=start, window_from_s=0, window_to_s=3600,
               now=start)


def test_real_times_keep_the_queue_wait_of_pods_alive_at_the_window_start(
        tmp_path: Path) -> None:
    """``real_times``: the pods alive at the window's start are submitted and started at
    their own times, and a processor told to begin at the window's start keeps their
    real queue wait and start while the window's minutes stay as they are."""
    nodes, pods = _trace(tmp_path, "node-a,64000,262144,2,V100M16\n",
                         "i,1000,1024,1,1000,,LS,Running,3500,4000,3700",   # pending at 1 h
                         "r,1000,1024,1,1000,,LS,Running,3000,4200,3050")   # running at 1 h
    imported = load_openb(nodes, pods, window_from_s=3600, window_to_s=7200,
                          real_times=True)
    start = datetime(2026, 1, 1, 1, tzinfo=UTC)
    assert imported.window_start == start
    config = load_config(None)
    processor = Processor(config, Warehouse(tmp_path / "wh", options=config.warehouse))
    assert imported.window_start is not None
    processor.begin_at(imported.window_start)
    assert import_history(processor, imported.frames, None, imported.window_end) == 0
    _, rows = query.run(tmp_path / "wh", "SELECT job_id, started_at, queue_wait_s, "
                                         "round(allocated_gpu_hours * 3600, 3) "
                                         "FROM job_attempts ORDER BY 1")
    assert rows == [("i", start + timedelta(seconds=100), 200.0, 300.0),
                    ("r", start - timedelta(seconds=550), 50.0, 600.0)]  # r: 3600-4200
    _, rows = query.run(tmp_path / "wh", "SELECT min(minute), round(sum(alloc_fraction) * 60, "
                                         "6) FROM gpu_minute WHERE allocated")
    assert rows == [(start, 900.0)]


def test_a_pod_list_without_gpu_pods_changes_nothing_unless_windowed(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A pod list of a header alone (or of CPU pods only): without a window there is no
    time to import, and nothing is written (it made a warehouse of empty tables); with
    one, the window's free GPUs are its facts."""
    nodes, _pods = _tiny_trace(tmp_path)
    header = tmp_path / "header.csv"
    header.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
                      "creation_time,deletion_time,scheduled_time\n"
                      "cpu,4000,16384,0,0,,LS,Running,100,900,200\n")
    wh = tmp_path / "wh"
    assert main(["import", "openb", "--nodes", str(nodes), "--pods", str(header),
                 "--warehouse", str(wh), "--quiet"]) == 0
    err = capsys.readouterr().err
    assert f"nothing to import: {header} has no GPU pod (1 pods, 1 CPU-only)" in err, err
    assert not wh.exists()
    assert main(["import", "openb", "--nodes", str(nodes), "--pods", str(header),
                 "--hours", "1", "--warehouse", str(wh), "--quiet"]) == 0
    _, rows = query.run(wh, "SELECT sum(minutes), count(DISTINCT gpu_index) FROM gpu_runs")
    assert rows == [(8 * 60, 8)]


def test_blank_lines_are_no_rows(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Found by trying an edited trace: a blank line refused the whole trace ("column
    name: None is missing"). Blank lines are passed over; the lines of the rows after
    them are still named."""
    nodes, pods = _tiny_trace(tmp_path)
    pods.write_text(pods.read_text().splitlines()[0] + "\n"
                    "a,4000,16384,1,1000,,LS,Running,100,900,200\n\n\n"
                    "b,1,1,1,1000,,LS,Running,100,50,200\n")
    assert main(["import", "openb", "--nodes", str(nodes), "--pods", str(pods),
                 "--quiet", "--warehouse", str(tmp_path / "wh")]) == 2
    assert (f"{pods}:5: deletion_time 50 is before creation_time 100"
            in capsys.readouterr().err)
    pods.write_text(pods.read_text().replace("100,50,200", "100,500,200") + "\n\n")
    assert main(["import", "openb", "--nodes", str(nodes), "--pods", str(pods),
                 "--quiet", "--warehouse", str(tmp_path / "wh")]) == 0
    assert "2 pods" in capsys.readouterr().out
