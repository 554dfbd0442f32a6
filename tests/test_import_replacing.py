"""An import, or a first ingest, processes its input on its own: the facts of the hours it
covers become its own. Where a warehouse already holds facts in those hours that it did
not write, that replaced them silently: a three-line sacct file imported into a
warehouse holding an ingested telemetry history took half of that history's GPU-minutes
with it (69,120 rows to 34,806), exit status 0. Such a run is now refused in one line and
changes nothing; ``--replace`` (imports) and ``--afresh`` (ingest) do it anyway; the same
import run again, or run again after it was killed, goes. The demo, whose facts are
simulated, writes only into an empty warehouse or one a demo wrote."""

from __future__ import annotations

import shutil
from datetime import UTC, datetime
from pathlib import Path

import pytest
from fact_views import VIEWS, views
from polars.testing import assert_frame_equal
from test_import_slurm_sacct import HEADER, ROWS
from test_simulate import SMALL

from gpuledger.cli.main import main
from gpuledger.pipeline import query
from gpuledger.pipeline.config import ProcessorConfig
from gpuledger.pipeline.ingest import IMPORTS, ingest
from gpuledger.pipeline.simulate import SimConfig, parse_cluster, simulate, write_jsonl

REFUSED = "the warehouse already holds facts in the hours this input covers"


@pytest.fixture(scope="module")
def telemetry(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two ingested hours of telemetry over the sacct file's hours (10:00 to 12:00)."""
    root = tmp_path_factory.mktemp("telemetry")
    sim = SimConfig(hours=2, seed=5, sample_interval_s=60, cluster=parse_cluster(SMALL),
                    start=datetime(2026, 1, 5, 10, tzinfo=UTC))
    write_jsonl(simulate(sim), root / "events")
    ingest(sorted((root / "events").glob("*.jsonl")), root / "wh", ProcessorConfig())
    return root


@pytest.fixture(scope="module")
def sacct(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("sacct") / "sacct.txt"
    path.write_text(HEADER + "\n" + "\n".join(ROWS) + "\n")
    return path


def _samples(wh: Path) -> int:
    return int(query.run(wh, "SELECT sum(telemetry_samples) FROM gpu_minute")[1][0][0])


def _import(sacct: Path, wh: Path, *extra: str) -> int:
    return main(["import", "slurm-sacct", str(sacct), "--warehouse", str(wh), "--quiet",
                 *extra])


def test_an_import_over_ingested_hours_is_refused_and_changes_nothing(
        telemetry: Path, sacct: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    wh = tmp_path / "wh"
    shutil.copytree(telemetry / "wh", wh)
    before = views(wh)
    assert _samples(wh) > 0
    assert _import(sacct, wh) == 2
    err = capsys.readouterr().err
    assert REFUSED in err and "pass --replace to replace them" in err
    assert err.count("\n") == 1
    after = views(wh)
    for name in VIEWS:
        assert_frame_equal(after[name], before[name])
    assert not (wh / IMPORTS).exists()
    # --replace: the hours become the import's (scheduler-only: no telemetry)
    assert _import(sacct, wh, "--replace") == 0
    assert _samples(wh) < sum(before["gpu_minute"]["telemetry_samples"].fill_null(0))


def test_the_same_import_again_goes_and_another_file_over_its_hours_does_not(
        sacct: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    wh = tmp_path / "wh"
    assert _import(sacct, wh) == 0
    once = views(wh)
    assert _import(sacct, wh) == 0        # a re-run (or a run after a killed one)
    again = views(wh)
    for name in VIEWS:
        assert_frame_equal(again[name], once[name])
    other = tmp_path / "other.txt"
    # one job of the same hours, and the jobs still running or waiting (sacct prints
    # them in any window that goes on from the history)
    still = [r for r in ROWS if r.startswith(("103|", "104|"))]
    other.write_text(HEADER + "\n" + "\n".join([ROWS[0], *still]) + "\n")
    capsys.readouterr()
    # it goes on from the history the first import left, which holds those jobs already:
    # nothing to write
    assert _import(other, wh) == 0
    assert "it is unchanged" in capsys.readouterr().out
    changed = _with_job(ROWS[0], "999")
    other.write_text(HEADER + "\n" + "\n".join([changed, *still])  # a job the history
                     + "\n")                                       # does not hold
    assert _import(other, wh) == 2
    err = capsys.readouterr().err
    assert "1 job(s) in these exports have events before 2026-01-05 11:21 UTC" in err, err
    for name in VIEWS:
        assert_frame_equal(views(wh)[name], once[name])


def _with_job(line: str, job_id: str) -> str:
    return "|".join([job_id, job_id, *line.split("|")[2:]])


def test_a_first_ingest_over_imported_hours_is_refused_unless_afresh(
        telemetry: Path, sacct: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    wh = tmp_path / "wh"
    assert _import(sacct, wh) == 0
    attempts = views(wh)["job_attempts"].height
    files = [str(p) for p in sorted((telemetry / "events").glob("*.jsonl"))]
    capsys.readouterr()
    assert main(["ingest", *files, "--warehouse", str(wh), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert REFUSED in err and "no ingest wrote" in err and "--afresh" in err
    assert views(wh)["job_attempts"].height == attempts
    assert main(["ingest", *files, "--warehouse", str(wh), "--quiet", "--afresh"]) == 0
    assert _samples(wh) > 0


def test_the_demo_writes_only_where_a_demo_wrote_or_nothing_is(
        telemetry: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The demo's simulated facts went into a warehouse of ingested history beside it
    (another day), exit status 0. Refused now, nothing written; a demo again into its
    own warehouse goes."""
    wh = tmp_path / "wh"
    shutil.copytree(telemetry / "wh", wh)
    before = views(wh)
    assert main(["demo", "--hours", "0.25", "--warehouse", str(wh), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "holds facts the demo did not write" in err and err.count("\n") == 1
    after = views(wh)
    for name in VIEWS:
        assert_frame_equal(after[name], before[name])
    own = tmp_path / "demo"
    for seed in ("7", "8"):
        assert main(["demo", "--hours", "0.25", "--seed", seed, "--warehouse", str(own),
                     "--quiet"]) == 0
    capsys.readouterr()


def test_a_demo_again_replaces_the_earlier_demo_whole(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A 0.5 h demo into the warehouse of a 1 h demo replaced only the half hour it
    simulated: the first run's other half hour and its ended jobs stayed, and the
    summary the demo printed added them up. Now the second warehouse is the same as a
    fresh one's."""
    import yaml

    again, fresh, spec = tmp_path / "again", tmp_path / "fresh", tmp_path / "small.yaml"
    spec.write_text(yaml.safe_dump(SMALL))
    base = ["demo", "--cluster", str(spec), "--hours", "0.5"]
    assert main([*base[:-1], "1", "--warehouse", str(again), "--quiet"]) == 0
    capsys.readouterr()
    assert main([*base, "--seed", "99", "--warehouse", str(again)]) == 0
    said = capsys.readouterr()
    assert f"replacing the earlier demo's warehouse in {again} (" in said.err
    assert main([*base, "--seed", "99", "--warehouse", str(fresh), "--quiet"]) == 0
    assert said.out.split("\n", 1)[1].replace(str(again), "W") == \
        capsys.readouterr().out.split("\n", 1)[1].replace(str(fresh), "W")
    replaced, alone = views(again), views(fresh)
    for name in VIEWS:
        assert_frame_equal(replaced[name], alone[name])


def test_real_facts_are_not_written_into_a_demos_warehouse(
        telemetry: Path, sacct: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The other way round, found by trying the defaults (the demo, ingest and the
    imports all write ./warehouse): a demo's warehouse took another day's ingest, sacct
    export or pod list beside its simulated cluster, exit status 0. Each is refused now,
    in one line, before anything is written; so is the Kafka service (before it reaches
    any broker)."""
    own = tmp_path / "demo"
    assert main(["demo", "--hours", "0.25", "--warehouse", str(own), "--quiet"]) == 0
    capsys.readouterr()
    before = views(own)
    pods = tmp_path / "pods.csv"
    pods.write_text("name,created,scheduled,deleted,gpus,node\n"
                    "p,2026-01-07T00:00:00Z,2026-01-07T00:01:00Z,2026-01-07T01:00:00Z,1,n1\n")
    files = [str(p) for p in sorted((telemetry / "events").glob("*.jsonl"))]
    for command in (["ingest", *files], ["import", "slurm-sacct", str(sacct)],
                    ["import", "pods", str(pods)],
                    ["process", "--kafka", "127.0.0.1:1", "--exit-when-idle", "1"]):
        assert main([*command, "--warehouse", str(own), "--quiet"]) == 2, command
        err = capsys.readouterr().err
        assert err == (f"gpuledger: error: {own}: is a demo's warehouse (a simulated "
                       "cluster's facts; state/demo.json): real facts would go in beside "
                       "them. Give this input a warehouse of its own (--warehouse PATH), or "
                       "delete the demo's first\n"), (command, err)
    after = views(own)
    for name in VIEWS:
        assert_frame_equal(after[name], before[name])
