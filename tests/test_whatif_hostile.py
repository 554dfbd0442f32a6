"""``gpuledger whatif`` against hostile input: a step that changed the observed numbers,
names that rich took for markup, policy files naming what the warehouse does not have,
misleading counts and messages, sub-minute bounds.

One simulated warehouse (the built-in cluster, 3 hours, 60-second samples) serves them;
each check is against its facts (``blocked_minute``, ``frag_minute``, ``gpu_hourly``,
``preemptions``, ``attempts``).
"""

from __future__ import annotations

import os
import re
from datetime import UTC, datetime, timedelta
from importlib import resources
from pathlib import Path

import polars as pl
import pytest
import yaml

from gpuledger.cli.main import main
from gpuledger.pipeline import query
from gpuledger.pipeline.advisor.answers import FRAGS
from gpuledger.pipeline.advisor.history import HistoryError, load_history
from gpuledger.pipeline.advisor.policy import PolicySet, load_policies, parse_policies
from gpuledger.pipeline.advisor.whatif import run_whatif
from gpuledger.pipeline.config import ProcessorConfig
from gpuledger.pipeline.demo import run_demo
from gpuledger.pipeline.simulate import SimConfig
from gpuledger.pipeline.simulate.cluster import parse_cluster

START = datetime(2026, 1, 5, tzinfo=UTC)
HOURS = 3
WINDOW_MIN = HOURS * 60


@pytest.fixture(scope="module")
def wh(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("whatif") / "wh"
    run_demo(SimConfig(start=START, hours=HOURS, seed=7, sample_interval_s=60),
             ProcessorConfig(), root)
    return root


def _baseline_only() -> PolicySet:
    return parse_policies({"policies": [{"name": "as-run"}]})


def _facts(root: Path) -> dict[str, dict[str, object]]:
    """What the facts say of the window (the whole warehouse)."""
    _, usage = query.run(root, "SELECT pool, sum(gpu_hours - unavailable_gpu_hours), "
                               "sum(allocated_gpu_hours), sum(used_gpu_hours) FROM gpu_hourly "
                               "GROUP BY pool ORDER BY pool")
    _, blocked = query.run(root, "SELECT pool, sum(gpus) / 60 FROM blocked_minute GROUP BY pool")
    _, teams = query.run(root, "SELECT coalesce(team, '(none)'), sum(gpus) / 60 "
                               "FROM blocked_minute GROUP BY ALL")
    means = ", ".join(f"avg({k})" for k in FRAGS)
    _, frag = query.run(root, f"SELECT pool || ' / ' || card_type, {means} FROM frag_minute "
                              "GROUP BY ALL")
    _, lost = query.run(root, "SELECT sum(lost_gpu_hours) FROM preemptions")
    return {"usage": {r[0]: r[1:] for r in usage}, "blocked": dict(blocked),
            "team_blocked": dict(teams), "frag": {r[0]: r[1:] for r in frag},
            "lost": {"all": lost[0][0]}}


@pytest.mark.parametrize("step", [7, 30, 60, 179, 180])
def test_the_observed_column_is_the_facts_whatever_the_step(wh: Path, step: int) -> None:
    """--step samples the replays' frag(k) and blocked demand only: the observed column
    equals the facts at every step, and the replays' GPU-hours and lost work (from the
    exact allocations and every minute's outages) do not move with it."""
    facts = _facts(wh)
    assert sum(facts["blocked"].values()) > 1  # type: ignore[arg-type]
    w = run_whatif(wh, _baseline_only(), step_minutes=step)
    assert w.step_minutes == step
    cal = w.calibration

    def observed(answer: str) -> dict[str, float]:
        return dict(cal.filter(pl.col("answer") == answer).select("key", "observed").rows())

    alloc, used = observed("allocated GPU-hours"), observed("used GPU-hours")
    for pool, (available, allocated, use) in facts["usage"].items():  # type: ignore[union-attr]
        assert alloc[pool] == pytest.approx(allocated, rel=1e-6), pool
        assert used[pool] == pytest.approx(use, rel=1e-6), pool
        got = w.observed.usage.filter(pl.col("pool") == pool)["available_gpu_hours"].item()
        assert got == pytest.approx(available, rel=1e-6), pool
    assert observed("blocked GPU-hours") == pytest.approx(facts["blocked"])
    team_blocked = observed("team blocked GPU-hours")
    for team, hours in facts["team_blocked"].items():  # type: ignore[union-attr]
        assert team_blocked[team] == pytest.approx(hours), team
    for i, k in enumerate(FRAGS):
        mine = observed(f"mean frag({k.removeprefix('frag_')})")
        for key, means in facts["frag"].items():  # type: ignore[union-attr]
            assert mine[key] == pytest.approx(means[i], abs=1e-9), (k, key)
    assert observed("lost GPU-hours") == pytest.approx(facts["lost"])
    # the replay's GPU-hours and lost work are the step's business no more
    a, b = w.replays[0], run_whatif(wh, _baseline_only(), step_minutes=1).replays[0]
    assert a.usage.equals(b.usage)
    assert a.lost.equals(b.lost)
    assert a.teams.select("team", "allocated_gpu_hours", "used_gpu_hours").equals(
        b.teams.select("team", "allocated_gpu_hours", "used_gpu_hours"))


def test_the_grid_starts_at_the_window_start(wh: Path) -> None:
    since = START + timedelta(minutes=7)
    h = load_history(wh, since, None, 30)
    minutes = h.grid["minute"].unique().sort()
    assert minutes[0] == since
    assert all((m - since) % timedelta(minutes=30) == timedelta(0) for m in minutes)
    assert len(minutes) == -(-(WINDOW_MIN - 7) // 30)


def test_a_step_longer_than_the_window_is_refused(
        wh: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for step in (WINDOW_MIN + 1, 100000):
        assert main(["whatif", "--warehouse", str(wh), "--quiet", "--policy", "as-run",
                     "--step", str(step)]) == 2
        assert capsys.readouterr().err.strip() == (
            f"gpuledger: error: --step {step}: longer than the window (180 minutes, "
            "2026-01-05 00:00 – 2026-01-05 03:00 UTC)")
    with pytest.raises(SystemExit):
        main(["whatif", "--warehouse", str(wh), "--step", "1" + "0" * 30])
    assert "--step must be at most" in capsys.readouterr().err


def test_sub_minute_bounds_are_refused(wh: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The facts are per minute: 02:59:30 and 02:59 once gave the same header and
    different answers; a bound with seconds is refused, naming the option."""
    assert main(["whatif", "--warehouse", str(wh), "--quiet", "--policy", "as-run",
                 "--since", "2026-01-05T02:59:30Z"]) == 2
    assert capsys.readouterr().err.strip() == (
        "gpuledger: error: --since 2026-01-05T02:59:30Z: not on a whole minute (the "
        "GPU-minute facts are per minute); give 2026-01-05T02:59Z or 2026-01-05T03:00Z")
    assert main(["whatif", "--warehouse", str(wh), "--quiet", "--policy", "as-run",
                 "--until", "2026-01-05T00:00:01Z"]) == 2
    assert "--until 2026-01-05T00:00:01Z: not on a whole minute" in capsys.readouterr().err
    assert main(["whatif", "--warehouse", str(wh), "--quiet", "--policy", "as-run",
                 "--since", "2026-01-05T02:59Z", "--width", "200"]) == 0
    assert "2026-01-05 02:59 – 2026-01-05 03:00 UTC" in capsys.readouterr().out


def test_jobs_running_at_the_end_are_counted_at_the_window_end(wh: Path) -> None:
    until = START + timedelta(minutes=60)
    w = run_whatif(wh, _baseline_only(), until=until)
    note = w.notes[0]
    found = re.search(r"(\d+) still running at the end", note)
    assert found is not None, note
    at = f"TIMESTAMPTZ '{until.isoformat()}'"
    _, rows = query.run(wh, f"SELECT count(DISTINCT job_id) FROM attempts "
                            f"WHERE started_at < {at} AND coalesce(ended_at, 'infinity') > {at}")
    assert int(found.group(1)) == rows[0][0]
    _, never = query.run(wh, "SELECT count(*) FROM attempts WHERE started_at IS NOT NULL "
                             "AND ended_at IS NULL")
    assert rows[0][0] != never[0][0]  # the count that was printed before


def _policy_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "policies.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(("text", "message"), [
    ("quotas: {nosuchteam: {train: 10}}\npolicies: [{name: fgd, placement: fgd}]\n",
     ":1: quotas.nosuchteam: no team 'nosuchteam' in the warehouse (teams: llm-core, "
     "platform, recsys, research-lab, speech, vision)"),
    ("quotas:\n  llm-core: {trian: 5}\npolicies: [{name: fgd}]\n",
     ":2: quotas.llm-core.trian: no pool 'trian' in the warehouse (pools: dev, infer, train)"),
    ("policies:\n  - name: a\n    card_pools: {interactiv: {pool: dev}}\n",
     ":3: policies[0].card_pools.interactiv: no job type 'interactiv' in the warehouse (job "
     "types: evaluation, fine-tune, inference, interactive, training)"),
    ("policies:\n  - name: a\n  - name: b\n    card_pools:\n"
     "      interactive: {pool: nopool}\n",
     ":5: policies[1].card_pools.interactive.pool: no pool 'nopool' in the warehouse "
     "(pools: dev, infer, train)"),
    ("policies:\n  - name: a\n    card_pools:\n      interactive: {pool: dev, card_type: Z9}\n",
     ":4: policies[0].card_pools.interactive.card_type: no card type 'Z9' in pool 'dev' "
     "(card types there: A10-24GB)"),
    # found by trying names: a policy named 'observed' showed its replay as the observed
    # figures, 'within' turned the calibration's flags into numbers, 'key' stopped the
    # run with a traceback after the whole replay
    *[(f"policies:\n  - name: as-run\n  - {{name: {name}, placement: worst-fit}}\n",
       f":3: policies[1].name: '{name}' names one of the comparison's own columns (answer, "
       "baseline, error, key, observed, within): choose another")
      for name in ("observed", "within", "error", "key", "answer", "baseline")],
    # past a float's range, or past the scheduler's 64-bit seconds: a traceback
    (f"scheduler:\n  interval_s: 1{'0' * 400}\npolicies: [{{name: a}}]\n",
     ":2: scheduler.interval_s: must be a finite number"),
    ("scheduler:\n  checkpoint_minutes: 1.0e+300\npolicies: [{name: a}]\n",
     ":2: scheduler.checkpoint_minutes: must be <= 1,000,000"),
])
def test_a_policy_file_naming_what_is_not_there_is_refused(
        wh: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str,
        message: str) -> None:
    path = _policy_file(tmp_path, text)
    assert main(["whatif", "--warehouse", str(wh), "--quiet", "--policies", str(path)]) == 2
    assert capsys.readouterr().err.strip() == f"gpuledger: error: {path}{message}"


def test_teams_without_a_quota_are_named(wh: Path, tmp_path: Path) -> None:
    path = _policy_file(tmp_path, "quotas:\n  llm-core: {train: 176}\n"
                                  "policies: [{name: fixed, quota: fixed}]\n")
    w = run_whatif(wh, load_policies(path))
    note = next(n for n in w.notes if n.startswith("team quotas"))
    assert ("none there, so 0 GPUs, for team(s) platform, recsys, research-lab, speech, "
            "vision; team llm-core in pool(s) dev, infer") in note


def test_names_are_printed_as_they_are_never_as_markup(
        wh: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _policy_file(tmp_path, 'policies:\n  - {name: "[/]", placement: fgd}\n'
                                  '  - {name: "[bold red]evil[/bold red]", quota: fixed}\n'
                                  '  - {name: ":smile:", backfill: false}\n')
    assert main(["whatif", "--warehouse", str(wh), "--quiet", "--policies", str(path),
                 "--width", "250", "--until", "2026-01-05T01:00Z"]) == 0
    out = capsys.readouterr().out
    for name in ("[/]", "[bold red]evil[/bold red]", ":smile:"):
        assert name in out


def test_names_from_the_warehouse_are_printed_as_they_are(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A cluster whose team is called ``[/]`` and queue ``q[red]x``."""
    text = resources.files("gpuledger.pipeline.simulate").joinpath(
        "default_cluster.yaml").read_text()
    text = re.sub(r"\bplatform\b", '"[/]"', text)
    text = text.replace("{name: serving,", '{name: "q[red]x",').replace(
        "queue: serving\n", 'queue: "q[red]x"\n')
    cluster = parse_cluster(yaml.safe_load(text))
    assert "[/]" in {t.name for t in cluster.teams}
    root = tmp_path / "marked"
    run_demo(SimConfig(start=START, hours=1, seed=7, sample_interval_s=60, cluster=cluster),
             ProcessorConfig(), root)
    assert main(["whatif", "--warehouse", str(root), "--quiet", "--policy", "as-run",
                 "--width", "200"]) == 0
    out = capsys.readouterr().out
    keys = {line.split()[0] for line in out.splitlines() if line.strip()}
    assert "[/]" in keys and "q[red]x" in keys  # a row's key, printed as written


def test_a_file_is_not_a_warehouse_folder(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    afile = tmp_path / "afile"
    afile.write_text("x")
    assert main(["whatif", "--warehouse", str(afile), "--quiet"]) == 2
    assert capsys.readouterr().err.strip() == \
        f"gpuledger: error: {afile}: a file, not a warehouse folder"


def test_a_folder_it_may_not_read_is_said(wh: Path, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """A facts folder the user may not enter (the tests run as root: the check is made
    to refuse it) is named, not taken for "no files found"."""
    folder = wh / "facts" / "gpu_minute"
    real = os.access
    monkeypatch.setattr(os, "access",
                        lambda p, mode: Path(p) != folder and real(p, mode))
    assert main(["whatif", "--warehouse", str(wh), "--quiet"]) == 2
    assert capsys.readouterr().err.strip() == (
        f"gpuledger: error: {folder}: permission denied (the warehouse cannot be read)")
    with pytest.raises(HistoryError, match="permission denied"):
        load_history(wh)
