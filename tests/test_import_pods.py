"""``gpuledger import pods``: a CSV pod list through the processor; expected numbers are
computed here from the CSV the test writes (queue wait per pod, GPUs allocated per
minute), placement and what could not be placed."""

from __future__ import annotations

import csv
import random
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from events import held_per_minute

from gpuledger.cli.main import main
from gpuledger.pipeline import query
from gpuledger.pipeline.config import Limits
from gpuledger.pipeline.importers.pods import PodsImportError, load_pods, parse_columns

T0 = datetime(2026, 1, 5, 8, 0, tzinfo=UTC)
# the export names its columns its own way; the test maps them with --columns
COLUMNS = {"name": "pod", "created": "creationTimestamp", "scheduled": "startTime",
           "deleted": "deletionTimestamp", "gpus": "gpu", "node": "nodeName",
           "gpu_indices": "gpuIDs", "namespace": "ns", "status": "phase"}


def _time(t: datetime | None, rng: random.Random) -> str:
    """ISO with Z, ISO without offset (UTC), or epoch seconds, at random."""
    if t is None:
        return ""
    form = rng.randrange(3)
    if form == 0:
        return t.strftime("%Y-%m-%dT%H:%M:%SZ")
    if form == 1:
        return t.strftime("%Y-%m-%dT%H:%M:%S")
    return str(int(t.timestamp()))


def _write(folder: Path, seed: int = 11) -> tuple[Path, Path, list[dict[str, Any]]]:
    rng = random.Random(seed)
    pods: list[dict[str, Any]] = []
    for n in range(60):
        created = T0 + timedelta(seconds=rng.randrange(0, 3 * 3600))
        scheduled = created + timedelta(seconds=rng.randrange(0, 1800)) \
            if rng.random() > 0.1 else None
        deleted = (scheduled or created) + timedelta(seconds=rng.randrange(120, 3000))
        pods.append({"pod": f"job-{n:03d}", "created": created, "scheduled": scheduled,
                     "deleted": deleted, "gpu": rng.choice([1, 1, 2, 4, 0.5]),
                     "node": "", "ids": "", "ns": rng.choice(["vision", "nlp"]),
                     "phase": rng.choice(["Succeeded", "Failed"])})
    # pinned pods: node and indices given (one after the other on pinned-1)
    for n in range(4):
        start = T0 + timedelta(minutes=20 + 30 * n)
        pods.append({"pod": f"pinned-{n}", "created": start - timedelta(minutes=3),
                     "scheduled": start, "deleted": start + timedelta(minutes=25),
                     "gpu": 2, "node": "pinned-1", "ids": f"{2 * n};{2 * n + 1}", "ns": "nlp",
                     "phase": "Succeeded"})
    # a node but no indices; and one that no node can hold
    pods.append({"pod": "on-node", "created": T0, "scheduled": T0 + timedelta(minutes=5),
                 "deleted": T0 + timedelta(minutes=50), "gpu": 4, "node": "gpu-2", "ids": "",
                 "ns": "vision", "phase": "Succeeded"})
    pods.append({"pod": "too-big", "created": T0 + timedelta(minutes=1),
                 "scheduled": T0 + timedelta(minutes=2), "deleted": T0 + timedelta(minutes=9),
                 "gpu": 16, "node": "", "ids": "", "ns": "nlp", "phase": "Failed"})
    path = folder / "pods.csv"
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["pod", "ns", "creationTimestamp", "startTime", "deletionTimestamp",
                    "gpu", "nodeName", "gpuIDs", "phase"])
        for p in pods:
            w.writerow([p["pod"], p["ns"], _time(p["created"], rng),
                        _time(p["scheduled"], rng), _time(p["deleted"], rng), p["gpu"],
                        p["node"], p["ids"], p["phase"]])
        w.writerow(["cpu-only", "nlp", _time(T0, rng), "", "", 0, "", "", ""])
        w.writerow(["broken", "nlp", "yesterday", "", "", 1, "", "", ""])
    nodes = folder / "nodes.csv"
    nodes.write_text("node,gpus,card_type,pool\n"
                     + "".join(f"gpu-{i},8,h100,train\n" for i in range(1, 9))
                     + "pinned-1,8,h100,train\n")
    return path, nodes, pods


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    folder = tmp_path_factory.mktemp("pods")
    path, nodes, pods = _write(folder)
    columns = ",".join(f"{k}={v}" for k, v in COLUMNS.items())
    code = main(["import", "pods", str(path), "--columns", columns, "--nodes", str(nodes),
                 "--quiet", "--warehouse", str(folder / "wh")])
    assert code == 0
    return folder / "wh", pods


def test_queue_wait_per_pod_is_start_minus_creation(imported: Any) -> None:
    warehouse, pods = imported
    expected = {p["pod"]: (p["scheduled"] - p["created"]).total_seconds()
                for p in pods if p["scheduled"] is not None and p["gpu"] <= 8}
    _, rows = query.run(warehouse, "SELECT job_id, queue_wait_s FROM attempts "
                                   "WHERE started_at IS NOT NULL")
    assert dict(rows) == expected
    _, rows = query.run(warehouse, "SELECT job_id, end_event FROM attempts WHERE started_at "
                                   "IS NULL AND ended_at IS NOT NULL")
    never = {p["pod"] for p in pods if p["scheduled"] is None}
    assert dict(rows) == {**dict.fromkeys(never, "cancelled"), "too-big": "failed"}


def test_allocated_gpus_over_time(imported: Any) -> None:
    warehouse, pods = imported
    placed = [p for p in pods if p["scheduled"] is not None and p["gpu"] <= 8]
    # each minute holds the seconds each pod held it (docs/metrics.md)
    expected = held_per_minute((p["scheduled"], p["deleted"], p["gpu"]) for p in placed)
    _, rows = query.run(warehouse, "SELECT minute, sum(alloc_fraction) FROM gpu_minute "
                                   "WHERE allocated GROUP BY minute")
    got = {m.astimezone(UTC): g for m, g in rows}
    assert set(got) == set(expected)
    for m, g in expected.items():
        assert got[m] == pytest.approx(g), m


def test_placement_keeps_given_indices_and_nodes(imported: Any) -> None:
    warehouse, pods = imported
    _, rows = query.run(warehouse, "SELECT job_id, node, gpu_index FROM job_gpu "
                                   "WHERE job_id LIKE 'pinned-%' OR job_id = 'on-node'")
    got: dict[str, set[tuple[str, int]]] = {}
    for job, node, index in rows:
        got.setdefault(job, set()).add((node, index))
    for p in pods:
        if p["ids"]:
            assert got[p["pod"]] == {(p["node"], int(i)) for i in p["ids"].split(";")}
    assert {n for n, _ in got["on-node"]} == {"gpu-2"} and len(got["on-node"]) == 4


def test_report_of_what_was_not_imported(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    path, nodes, pods = _write(tmp_path)
    result = load_pods(path, columns=parse_columns(",".join(f"{k}={v}" for k, v in
                                                           COLUMNS.items())),
                       nodes_csv=nodes)
    assert result.unplaced == [p["pod"] for p in pods if p["gpu"] > 8]
    assert result.cpu_only == 1 and result.rows == len(pods) + 2
    assert [row for row, _ in result.bad_rows] == [len(pods) + 3]  # header is row 1
    assert "created" in result.bad_rows[0][1]
    code = main(["import", "pods", str(path), "--columns",
                 ",".join(f"{k}={v}" for k, v in COLUMNS.items()), "--nodes", str(nodes),
                 "--quiet", "--warehouse", str(tmp_path / "wh")])
    assert code == 0
    out = capsys.readouterr().out
    assert "1 could not be placed (e.g. too-big)" in out and "1 bad row(s)" in out
    assert f"pods.csv:{len(pods) + 3}: created" in out


def test_column_mapping_from_a_file_and_errors_that_name_the_field(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path, nodes, _ = _write(tmp_path)
    mapping = tmp_path / "m.yaml"
    mapping.write_text(yaml.safe_dump({"columns": COLUMNS,
                                       "mapping": {"teams": {"namespaces": {"nlp": "lang"}}}}))
    assert main(["import", "pods", str(path), "--mapping", str(mapping), "--nodes", str(nodes),
                 "--quiet", "--warehouse", str(tmp_path / "wh")]) == 0
    _, rows = query.run(tmp_path / "wh", "SELECT DISTINCT team FROM attempts ORDER BY team")
    assert [r[0] for r in rows] == ["lang", "vision"]
    assert main(["import", "pods", str(path), "--columns", "nmae=pod", "--quiet",
                 "--warehouse", str(tmp_path / "w2")]) == 2
    assert "unknown field 'nmae'" in capsys.readouterr().err
    assert main(["import", "pods", str(path), "--quiet", "--warehouse",
                 str(tmp_path / "w3")]) == 2
    assert "no column 'name' for the required field name" in capsys.readouterr().err
    bad = tmp_path / "bad.yaml"
    bad.write_text("columns:\n  gpus: 3\n")
    assert main(["import", "pods", str(path), "--mapping", str(bad), "--quiet"]) == 2
    assert "columns.gpus: expected a column name" in capsys.readouterr().err


def test_without_a_node_list_inventory_comes_from_the_placements(tmp_path: Path) -> None:
    path = tmp_path / "p.csv"
    path.write_text("name,created,scheduled,deleted,gpus,node,gpu_indices\n"
                    "a,1767600000,1767600060,1767603600,2,n1,\"3,5\"\n"
                    "b,2026-01-05T08:00:00Z,2026-01-05T08:10:00Z,,1,n2,0\n")
    result = load_pods(path)
    inv = {r["node"]: r["gpu_count"] for r in result.frames["inventory"].iter_rows(named=True)}
    assert inv == {"n1": 6, "n2": 1}
    events = result.frames["job"].select("job_id", "event").rows()
    assert ("b", "finished") not in events and ("a", "finished") in events
    with pytest.raises(PodsImportError, match="need --nodes"):
        other = tmp_path / "q.csv"
        other.write_text("name,created,scheduled,gpus\nx,1767600000,1767600060,1\n")
        load_pods(other)


NODES_CSV = "node,gpus,card_type,pool\nn1,2,H100,p\nn2,4,H100,p\n"


def _gpu_hours(warehouse: Path) -> dict[str, float]:
    _, rows = query.run(warehouse, "SELECT job_id, allocated_gpu_hours FROM attempts")
    return dict(rows)


def test_a_time_before_2000_is_a_bad_row_not_the_inventory_time(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nodes = tmp_path / "nodes.csv"
    nodes.write_text(NODES_CSV)
    path = tmp_path / "ep.csv"
    path.write_text("name,created,scheduled,deleted,gpus\n"
                    "a,2026-01-05T00:00:00Z,2026-01-05T00:10:00Z,2026-01-05T01:10:00Z,1\n"
                    "z,0,,,1\n"
                    "y,-1,2026-01-05T00:10:00Z,2026-01-05T00:20:00Z,1\n")
    assert main(["import", "pods", str(path), "--nodes", str(nodes), "--quiet",
                 "--warehouse", str(tmp_path / "wh")]) == 0
    out = capsys.readouterr().out
    assert "2 bad row(s)" in out and "rejected" not in out, out
    assert f"{path}:3: created: '0' is before 2000-01-01" in out
    assert f"{path}:4: created: '-1' is before 2000-01-01" in out
    assert _gpu_hours(tmp_path / "wh") == {"a": pytest.approx(1.0)}


def test_given_indices_are_checked(tmp_path: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    nodes = tmp_path / "nodes.csv"
    nodes.write_text(NODES_CSV)
    path = tmp_path / "g.csv"
    span = "2026-01-05T00:00:00Z,2026-01-05T00:10:00Z,2026-01-05T01:10:00Z"
    path.write_text("name,created,scheduled,deleted,gpus,node,gpu_indices\n"
                    f"twice,{span},2,n1,\"0,0\"\n"
                    f"beyond,{span},1,n1,[5]\n"
                    f"ok,{span},2,n1,\"[0, 1]\"\n"
                    f"elsewhere,{span},1,n9,0\n")
    assert main(["import", "pods", str(path), "--nodes", str(nodes), "--quiet",
                 "--warehouse", str(tmp_path / "wh")]) == 0
    out = capsys.readouterr().out
    assert "3 bad row(s)" in out, out
    assert f"{path}:2: gpu_indices: GPU 0 is listed twice" in out
    assert f"{path}:5: node: 'n9' is not in --nodes" in out
    assert f"{path}:3: gpu_indices: GPU 5 is not on node n1 (2 GPUs in --nodes)" in out
    assert _gpu_hours(tmp_path / "wh") == {"ok": pytest.approx(2.0)}


@pytest.mark.parametrize(("text", "error"), [
    ("name,created,gpus,gpus\nh,2026-01-05T00:00:00Z,1,2\n",
     "q.csv:1: column 'gpus' appears twice in the header"),
    ("name,created,gpus\nh,2026-01-05T00:00:00Z,1\nh,2026-01-05T00:00:00Z,1\n",
     "q.csv:3: pod 'h' appears twice (first on line 2)"),
    ("", "q.csv: empty file"),
    # a '"' left open swallowed every row after it into one field, in silence (pods
    # b and c vanished; the row named was the file's last)
    ('name,created,gpus\na,2026-01-05T00:00:00Z,1\n"b,2026-01-05T00:00:00Z,1\n'
     'c,2026-01-05T00:00:00Z,1\n', "q.csv:3: a field runs over 2 lines (to line 4): a "
     "'\"' without its closing '\"'"),
])
def test_files_refused_whole_say_why(text: str, error: str, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "q.csv"
    path.write_text(text)
    assert main(["import", "pods", str(path), "--quiet",
                 "--warehouse", str(tmp_path / "wh")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and error in err, err


SPAN = "2026-01-05T10:00:00Z,2026-01-05T10:00:00Z,2026-01-05T10:01:00Z"  # one minute


def test_a_share_of_several_gpus_is_a_bad_row(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """gpu_milli < 1000 is a share of one GPU (as in openb): with gpus 2 it was placed as
    half of one GPU (30 GPU-s for a minute); now the row is reported and skipped."""
    nodes = tmp_path / "nodes.csv"
    nodes.write_text("node,gpus\nn1,4\n")
    path = tmp_path / "s.csv"
    path.write_text("name,created,scheduled,deleted,gpus,gpu_milli\n"
                    f"two-halves,{SPAN},2,500\n"
                    f"half,{SPAN},1,500\n"
                    f"two,{SPAN},2,1000\n"
                    f"half-again,{SPAN},0.5,500\n"
                    f"two-shares,{SPAN},0.5,250\n")
    assert main(["import", "pods", str(path), "--nodes", str(nodes), "--quiet",
                 "--warehouse", str(tmp_path / "wh")]) == 0
    out = capsys.readouterr().out
    assert "5 rows, 3 imported" in out and "2 bad row(s)" in out and "rejected" not in out
    assert (f"{path}:2: gpu_milli: '500' with gpus '2': only one-GPU pods share a GPU "
            "(gpu_milli < 1000)") in out
    assert f"{path}:6: gpu_milli: '250' with gpus '0.5': two different shares" in out
    assert _gpu_hours(tmp_path / "wh") == {"half": pytest.approx(30 / 3600),
                                           "two": pytest.approx(120 / 3600),
                                           "half-again": pytest.approx(30 / 3600)}
    _, rows = query.run(tmp_path / "wh", "SELECT job_id, count(*) FROM job_gpu GROUP BY 1")
    assert dict(rows) == {"half": 1, "two": 2, "half-again": 1}


PODS_ON_N1 = ("name,created,scheduled,deleted,gpus\n"
              "a,2026-01-05T10:00:00Z,2026-01-05T10:00:10Z,2026-01-05T10:02:10Z,1\n")


@pytest.mark.parametrize(("nodes", "error"), [
    ("n1,2,A100,p,-5\n",
     "nodes.csv:2: node 'n1': field 'gpu_mem_mib': -5.0 is below the minimum 0"),
    ("n1,2,A100,p,2000000\n",
     "nodes.csv:2: node 'n1': field 'gpu_mem_mib': 2000000.0 is above the physical limit "
     "1048576 MiB (limits.memory_max_mib)"),
    ("n1,2,A100,p,nan\n", "nodes.csv:2: node 'n1': field 'gpu_mem_mib': NaN is not a number"),
    ("n1,2,A100,p,80GB\n", "nodes.csv:2: gpu_mem_mib: '80GB' is not a number"),
    ("n1,2,A100,p,81559\nn2,2,A100,p,81559\nn1,4,A100,p,81559\n",
     "nodes.csv:4: node 'n1' appears twice (first on line 2)"),
], ids=["negative-memory", "memory-above-limit", "nan-memory", "memory-not-a-number",
        "node-twice"])
def test_a_node_row_validation_would_reject_refuses_the_file(
        nodes: str, error: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A --nodes row is checked as its inventory record will be: before, a memory the
    contract refuses passed here, the inventory record was rejected later and every pod on
    the node was charged nothing (exit 0); a node listed twice took its last row."""
    (tmp_path / "nodes.csv").write_text("node,gpus,card_type,pool,gpu_mem_mib\n" + nodes)
    path = tmp_path / "p.csv"
    path.write_text(PODS_ON_N1)
    assert main(["import", "pods", str(path), "--nodes", str(tmp_path / "nodes.csv"),
                 "--quiet", "--warehouse", str(tmp_path / "wh")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and error in err, err
    assert not (tmp_path / "wh").exists()


def test_node_rows_are_checked_with_the_limits_given(tmp_path: Path) -> None:
    nodes = tmp_path / "nodes.csv"
    nodes.write_text("node,gpus,card_type,pool,gpu_mem_mib\nn1,2,A100,p,2000000\n")
    path = tmp_path / "p.csv"
    path.write_text(PODS_ON_N1)
    with pytest.raises(PodsImportError, match="above the physical limit"):
        load_pods(path, nodes_csv=nodes)
    wide = load_pods(path, nodes_csv=nodes, limits=Limits(memory_max_mib=4_000_000))
    assert wide.frames["inventory"]["gpu_mem_mib"].to_list() == [2_000_000]
    assert wide.imported == 1 and not wide.bad_rows


def test_a_time_after_the_import_is_a_bad_row(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """A deletion years ahead was counted as still running (its end event was rejected
    by validation): now the row is reported, as validation would judge it."""
    nodes = tmp_path / "nodes.csv"
    nodes.write_text(NODES_CSV)
    path = tmp_path / "f.csv"
    path.write_text("name,created,scheduled,deleted,gpus\n"
                    "a,2026-01-05T00:00:00Z,2026-01-05T00:10:00Z,2026-01-05T01:10:00Z,1\n"
                    "later,2026-01-05T00:00:00Z,2026-01-05T00:10:00Z,2099-01-01T00:00:00Z,1\n")
    assert main(["import", "pods", str(path), "--nodes", str(nodes), "--quiet",
                 "--warehouse", str(tmp_path / "wh")]) == 0
    out = capsys.readouterr().out
    assert "1 bad row(s)" in out and "rejected" not in out, out
    assert (f"{path}:3: deleted: '2099-01-01T00:00:00Z' is more than 3600 s after the time "
            "of the import") in out
    assert _gpu_hours(tmp_path / "wh") == {"a": pytest.approx(1.0)}
    # the bound is validation's: up to max_future_s (3600 s) past the time of the import
    now = datetime(2026, 1, 5, 0, 5, tzinfo=UTC)  # 65 minutes before a's deletion
    assert [r for r, _ in load_pods(path, nodes_csv=nodes, now=now).bad_rows] == [2, 3]
    assert load_pods(path, nodes_csv=nodes, now=now + timedelta(minutes=10)).bad_rows == [
        (3, "deleted: '2099-01-01T00:00:00Z' is more than 3600 s after the time of the "
            "import (2026-01-05T00:15:00Z)")]


def test_a_date_that_does_not_exist_is_named(tmp_path: Path) -> None:
    """'2026-02-29T10:00:00Z' was "neither ISO 8601 nor epoch seconds": it is ISO 8601,
    of a day 2026 does not have. The bad row says so."""
    path = tmp_path / "p.csv"
    path.write_text("name,created,scheduled,deleted,gpus\n"
                    "feb29,2026-02-29T10:00:00Z,,,1\n"
                    "apr31,2026-01-05T10:00:00Z,2026-04-31T10:00:00,,1\n"
                    "words,yesterday,,,1\n")
    now = datetime(2026, 6, 1, tzinfo=UTC)
    assert load_pods(path, now=now).bad_rows == [
        (2, "created: '2026-02-29T10:00:00Z' is not a date: 2026 has no February 29 (not "
            "a leap year)"),
        (3, "scheduled: '2026-04-31T10:00:00' is not a date: April 2026 has 30 days, not "
            "31"),
        (4, "created: 'yesterday' is neither ISO 8601 nor epoch seconds")]


def test_a_pod_list_without_pods_changes_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A pod list of a header alone (an export that failed half-way), or of bad and
    CPU-only rows, was imported: its run's end wrote the latest state as of an input with
    no pod, so a pending pod an earlier import had left vanished from ``attempts``. Now it
    is "nothing to import" and the warehouse is left as it was, byte for byte (a new
    warehouse is not even made)."""
    nodes = tmp_path / "nodes.csv"
    nodes.write_text(NODES_CSV)
    pods = tmp_path / "pods.csv"
    pods.write_text("name,created,scheduled,deleted,gpus,node\n"
                    "ran,2026-01-05T08:00:00Z,2026-01-05T08:01:00Z,2026-01-05T09:00:00Z,2,n1\n"
                    "waits,2026-01-05T08:00:00Z,,,64,\n")
    wh = tmp_path / "wh"
    assert main(["import", "pods", str(pods), "--nodes", str(nodes), "--warehouse", str(wh),
                 "--quiet"]) == 0
    _, rows = query.run(wh, "SELECT job_id FROM attempts ORDER BY job_id")
    assert [r[0] for r in rows] == ["ran", "waits"]
    before = {p.relative_to(wh): p.read_bytes() for p in wh.rglob("*") if p.is_file()}
    capsys.readouterr()
    header = tmp_path / "header.csv"
    header.write_text("name,created,scheduled,deleted,gpus,node\n")
    junk = tmp_path / "junk.csv"
    junk.write_text("name,created,gpus\nx,not a time,1\ncpu,2026-01-05T10:00:00Z,0\n")
    for empty in (header, junk):
        assert main(["import", "pods", str(empty), "--nodes", str(nodes), "--warehouse",
                     str(wh), "--quiet"]) == 0
        err = capsys.readouterr().err
        assert f"nothing to import: {empty} has no pod to import" in err, err
        assert f"{wh}/ is left as it was" in err
        after = {p.relative_to(wh): p.read_bytes() for p in wh.rglob("*") if p.is_file()}
        assert after == before
    _, rows = query.run(wh, "SELECT job_id FROM attempts ORDER BY job_id")
    assert [r[0] for r in rows] == ["ran", "waits"]
    fresh = tmp_path / "fresh"
    assert main(["import", "pods", str(header), "--nodes", str(nodes), "--warehouse",
                 str(fresh), "--quiet"]) == 0
    assert not fresh.exists()


def test_rows_with_more_fields_unknown_nodes_and_bad_numbers_are_bad_rows(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Found by trying hostile lists: a row with a ',' in an unquoted field was imported
    with its fields moved along (pod 'moved' on an invented node 'b'); a node --nodes
    does not name was a bad row with GPU indices but a pod "could not be placed", ended
    failed, without them; a priority past 64 bits stopped the import with a traceback;
    a number that does not read did not name its column. Each is a bad row now, named."""
    nodes = tmp_path / "nodes.csv"
    nodes.write_text(NODES_CSV)
    path = tmp_path / "p.csv"
    span = "2026-01-05T00:00:00Z,2026-01-05T00:10:00Z,2026-01-05T01:10:00Z"
    path.write_text("name,created,scheduled,deleted,gpus,namespace,node,priority\n"
                    f"ok,{span},1,team-a,n1,5\n"
                    f"moved,{span},1,team-a,b,n1,5\n"
                    f"nowhere,{span},1,team-a,n9,5\n"
                    f"big,{span},1,team-a,n1,{2**63}\n"
                    f"words,{span},two,team-a,n1,5\n"
                    f"half,{span},1,team-a,n1,1.5\n")
    assert main(["import", "pods", str(path), "--nodes", str(nodes), "--quiet",
                 "--warehouse", str(tmp_path / "wh")]) == 0
    out = capsys.readouterr().out
    assert "5 bad row(s); 0 could not be placed" in out, out
    for line in [f"{path}:3: 9 fields, the header has 8: a ',' in a field not quoted?",
                 f"{path}:4: node: 'n9' is not in --nodes",
                 f"{path}:5: priority: '{2**63}' is out of range (a 64-bit whole number)",
                 f"{path}:6: gpus: 'two' is not a number",
                 f"{path}:7: priority: '1.5' is not a whole number"]:
        assert line in out, out
    assert _gpu_hours(tmp_path / "wh") == {"ok": pytest.approx(1.0)}
    # a quoted field with a line break in it (a free-text column) is a field, not a '"'
    # left open: the record has the header's count of fields
    path.write_text("name,created,scheduled,deleted,gpus,namespace,node,priority\n"
                    f'ok,{span},1,"team\na",n1,5\n')
    assert main(["import", "pods", str(path), "--nodes", str(nodes), "--quiet",
                 "--warehouse", str(tmp_path / "w3")]) == 0
    assert "0 bad row(s)" in capsys.readouterr().out
    # in the node list, such a row refuses the file
    nodes.write_text(NODES_CSV + "n3,2,H100,p,extra\n")
    assert main(["import", "pods", str(path), "--nodes", str(nodes), "--quiet",
                 "--warehouse", str(tmp_path / "w2")]) == 2
    assert (f"{nodes}:4: 5 fields, the header has 4" in capsys.readouterr().err)


def test_a_pod_years_before_the_others_only_updates_the_books(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A probe imported sixteen pods, one created in 2024: the import walked the two
    years between minute by minute, past 300 s, hundreds of files. Now the facts begin
    31 days before the bulk (as an ingest's early records), a warning says so, and the
    pod still running from 2024 is charged from there."""
    nodes = tmp_path / "nodes.csv"
    nodes.write_text(NODES_CSV)
    path = tmp_path / "old.csv"
    rows = ["name,created,scheduled,deleted,gpus",
            "ancient,2024-02-29T10:00:00Z,2024-02-29T10:00:00Z,2026-01-05T02:00:00Z,1"]
    rows += [f"p{i},2026-01-05T00:{i:02d}:00Z,2026-01-05T00:{i + 1:02d}:00Z,"
             f"2026-01-05T01:{i:02d}:00Z,1" for i in range(5)]  # 5 GPUs beside it
    path.write_text("\n".join(rows) + "\n")
    wh = tmp_path / "wh"
    assert main(["import", "pods", str(path), "--nodes", str(nodes), "--quiet",
                 "--warehouse", str(wh)]) == 0
    said = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    begin = datetime(2025, 12, 5, 0, 0, tzinfo=UTC)   # the first quartile − 31 days
    assert any("4 record(s) come up to 675.6 days before the bulk of the import" in m and
               "the facts begin at 2025-12-05 00:00 UTC" in m for m in said), said
    hours = _gpu_hours(wh)
    held = (datetime(2026, 1, 5, 2, tzinfo=UTC) - begin).total_seconds() / 3600
    assert hours["ancient"] == pytest.approx(held)
    assert [hours[f"p{i}"] for i in range(5)] == [pytest.approx(59 / 60)] * 5, hours
    _, first = query.run(wh, "SELECT min(minute) FROM gpu_minute")
    assert first[0][0] == begin
    days = {d.name for d in wh.rglob("date=*")}
    assert min(days) == "date=2025-12-05", sorted(days)[:3]   # nothing of the two years
