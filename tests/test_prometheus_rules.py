"""The Prometheus rule files: generated from the configuration, valid, unit-tested."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from gpuledger.cli.main import main
from gpuledger.pipeline.alerts.prometheus_rules import (
    ALERTS_FILE,
    RECORDING_FILE,
    duration,
    generate,
)
from gpuledger.pipeline.config import ConfigError, ProcessorConfig, load_config

ALERTS = Path(__file__).parent.parent / "alerts"
DESIGN_ALERTS = {"GpuJobLowUtilisation", "GpuAllocatedIdle", "GpuJobMemoryOversized",
                 "GpuJobBlockedByFragmentation", "QueueWaitObjectiveBreached",
                 "GpuledgerAgentSilent", "GpuledgerProcessorLag"}


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("promtool")
    assert binary, "promtool missing: run scripts/setup.d/10-prometheus.sh"
    return subprocess.run([binary, *args], capture_output=True, text=True, timeout=120)


def test_committed_rule_files_are_what_the_configuration_generates() -> None:
    for name, text in generate(ProcessorConfig()).items():
        assert (ALERTS / name).read_text() == text, f"{name}: run gpuledger alerts generate"


def test_thresholds_come_from_the_configuration(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("alerts:\n  low_util_activity: 0.07\n  blocked_s: 2700\n"
                   "thresholds:\n  memory_oversized_ratio: 0.4\n")
    monkeypatch.setenv("GPULEDGER_ALERTS__KEEP_FIRING_S", "120")
    config = load_config(cfg)
    assert main(["alerts", "generate", "--config", str(cfg), "--out", str(tmp_path)]) == 0
    rules = yaml.safe_load((tmp_path / ALERTS_FILE).read_text())["groups"][0]["rules"]
    by = {}
    for r in rules:
        by.setdefault(r["alert"], r)
    assert f"< {config.alerts.low_util_activity:g}\n" in by["GpuJobLowUtilisation"]["expr"]
    assert by["GpuJobBlockedByFragmentation"]["for"] == duration(2700) == "45m"
    assert "< 0.4\n" in by["GpuJobMemoryOversized"]["expr"]
    assert by["GpuAllocatedIdle"]["keep_firing_for"] == "2m"
    # the CLI's check: the files match this configuration, and no other
    assert main(["alerts", "check", "--config", str(cfg), "--out", str(tmp_path)]) == 0
    monkeypatch.delenv("GPULEDGER_ALERTS__KEEP_FIRING_S")
    assert main(["alerts", "check", "--config", str(cfg), "--out", str(tmp_path)]) == 1
    assert main(["alerts", "check", "--out", str(tmp_path)]) == 1
    assert main(["alerts", "check", "--out", str(ALERTS)]) == 0
    assert promtool("check", "rules", str(tmp_path / ALERTS_FILE)).returncode == 0


def test_every_design_alert_has_a_rule_with_evidence_and_a_recommendation() -> None:
    rules = yaml.safe_load((ALERTS / ALERTS_FILE).read_text())["groups"][0]["rules"]
    assert {r["alert"] for r in rules} >= DESIGN_ALERTS
    for r in rules:
        assert {"summary", "description", "recommendation"} <= set(r["annotations"]), r["alert"]
        assert "keep_firing_for" in r and "severity" in r["labels"]
    tested = "".join(p.read_text() for p in (ALERTS / "tests").glob("*.test.yml"))
    for name in {r["alert"] for r in rules}:
        assert f"alertname: {name}" in tested, f"{name} has no promtool unit test"


def test_promtool_check_rules() -> None:
    done = promtool("check", "rules", str(ALERTS / ALERTS_FILE), str(ALERTS / RECORDING_FILE))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_promtool_unit_tests_fire_and_resolve() -> None:
    files = sorted(str(p) for p in (ALERTS / "tests").glob("*.test.yml"))
    assert len(files) >= 3
    done = promtool("test", "rules", *files)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("SUCCESS") == len(files)


def test_promtool_unit_tests_can_fail(tmp_path: Path) -> None:
    """The unit tests depend on the thresholds: with the firing threshold at 5 % instead
    of 10 %, the low-utilisation test's expectations no longer hold."""
    config = replace(ProcessorConfig(), alerts=replace(ProcessorConfig().alerts,
                                                        low_util_activity=0.04))
    for name, text in generate(config).items():
        (tmp_path / name).write_text(text)
    (tmp_path / "tests").mkdir()
    shutil.copy(ALERTS / "tests" / "low-utilisation.test.yml", tmp_path / "tests")
    done = promtool("test", "rules", str(tmp_path / "tests" / "low-utilisation.test.yml"))
    assert done.returncode != 0


DEATH_ALERTS = {f"Gpuledger{c}{k}" for c in ("Processor", "Agent", "Bridge")
                for k in ("Down", "Absent", "Vanished")}


def test_death_rules_follow_the_configured_jobs(tmp_path: Path) -> None:
    rules = yaml.safe_load((ALERTS / ALERTS_FILE).read_text())["groups"][0]["rules"]
    assert {r["alert"] for r in rules} >= DEATH_ALERTS
    cfg = tmp_path / "c.yaml"
    cfg.write_text("alerts:\n  processor_job: gl-proc\n  bridge_job: ''\n  absent_s: 1200\n")
    config = load_config(cfg, environ={"GPULEDGER_ALERTS__AGENT_JOB": "node-agents"})
    by = {r["alert"]: r for r in yaml.safe_load(generate(config)[ALERTS_FILE])["groups"][0]
          ["rules"]}
    assert by["GpuledgerProcessorDown"]["expr"] == 'up{job="gl-proc"} == 0\n'
    assert by["GpuledgerAgentAbsent"]["expr"] == 'absent(up{job="node-agents"})\n'
    assert by["GpuledgerAgentVanished"]["for"] == "20m"
    assert not any(name.startswith("GpuledgerBridge") for name in by)   # not deployed
    with pytest.raises(ConfigError, match=r"alerts\.agent_job"):
        load_config(cfg, environ={"GPULEDGER_ALERTS__AGENT_JOB": 'x"} or vector(1)'})


def test_an_output_that_cannot_be_written_or_is_missing_is_said_in_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a_file = tmp_path / "f"
    a_file.write_text("x")
    assert main(["alerts", "generate", "--out", str(a_file)]) == 2
    assert capsys.readouterr().err.strip() == f"gpuledger: error: --out {a_file}: not a folder"
    assert main(["alerts", "generate", "--out", str(a_file / "sub")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"cannot write the rule files into {a_file / 'sub'}" in err
    assert main(["alerts", "check", "--out", str(tmp_path / "none")]) == 1
    out = capsys.readouterr().out
    assert out.count("missing; run gpuledger alerts generate") == 2, out
    assert a_file.read_text() == "x"
