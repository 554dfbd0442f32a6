"""`gpuledger alerts generate` given values that would make bad rules, and
`GPULEDGER_*__*` variables that would be ignored: each is refused with one line naming
the key or the variable, and writes nothing; what is accepted passes the real
`promtool check rules`, with each threshold as the processor's engine has it."""

from __future__ import annotations

import math
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from gpuledger.cli.main import main
from gpuledger.pipeline.alerts.prometheus_rules import ALERTS_FILE
from gpuledger.pipeline.config import AlertThresholds, ConfigError, ProcessorConfig, load_config


def promtool_check(folder: Path) -> None:
    binary = shutil.which("promtool")
    assert binary, "promtool missing: run scripts/setup.d/10-prometheus.sh"
    run = subprocess.run([binary, "check", "rules", str(folder / ALERTS_FILE)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr


def generate(tmp_path: Path, text: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(text)
    code = main(["alerts", "generate", "--config", str(cfg), "--out", str(tmp_path / "out")])
    return code, capsys.readouterr().err


@pytest.mark.parametrize(("text", "message"), [
    ("alerts:\n  low_util_window_s: 0\n", "alerts.low_util_window_s: must be > 0"),
    ("alerts:\n  waste_critical_gpu_hours: 1e306\n",
     "alerts.waste_critical_gpu_hours: at most 1,000,000 GPU-hours, got 1e+306"),
    ("alerts:\n  waste_warning_gpu_hours: 2e6\n  waste_critical_gpu_hours: 3e6\n",
     "alerts.waste_warning_gpu_hours: at most 1,000,000 GPU-hours"),
])
def test_values_that_make_bad_rules_are_refused(tmp_path: Path, text: str, message: str,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    code, err = generate(tmp_path, text, capsys)
    assert code == 2
    assert err == f"gpuledger: error: configuration: {message}" + err.partition(message)[2]
    assert err.count("\n") == 1
    assert not (tmp_path / "out").exists()


def test_the_edges_that_are_accepted_make_valid_rules(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = generate(tmp_path, "alerts:\n  low_util_window_s: 1\n"
                         "  waste_warning_gpu_hours: 1.2345678\n"
                         "  waste_critical_gpu_hours: 1000000\n"
                         "  low_util_activity: 0.1234567\n", capsys)
    assert code == 0, err
    promtool_check(tmp_path / "out")
    text = (tmp_path / "out" / ALERTS_FILE).read_text()
    assert "inf" not in text.replace("info", "")
    rules = yaml.safe_load(text)["groups"][0]["rules"]
    low = [r["expr"] for r in rules if r["alert"] == "GpuJobLowUtilisation"]
    # every digit of the thresholds, as the engine compares them (":g" made 4444.44 of
    # the warning's 4444.44408 GPU-seconds and 0.123457 of the activity)
    assert "[1s]) < 0.1234567\n" in low[0]
    assert "gpuledger_job_wasted_gpu_seconds < 4444.44408\n" in low[0]
    assert "gpuledger_job_wasted_gpu_seconds >= 4444.44408\n" in low[1]
    assert "gpuledger_job_wasted_gpu_seconds >= 3.6e+09\n" in low[2]


@pytest.mark.parametrize(("change", "message"), [
    ({"waste_warning_gpu_hours": math.nan}, "alerts.waste_warning_gpu_hours: expected a "
                                            "finite number, got nan"),
    ({"waste_critical_gpu_hours": math.inf}, "alerts.waste_critical_gpu_hours: expected a "
                                             "finite number, got inf"),
    ({"for_s": 0.5}, "alerts.for_s: expected whole seconds, got 0.5"),
    ({"low_util_window_s": math.nan}, "alerts.low_util_window_s: expected a finite number"),
])
def test_a_configuration_built_in_code_is_checked_too(change: dict[str, float],
                                                      message: str) -> None:
    config = ProcessorConfig(alerts=AlertThresholds(**change))  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="^" + message.replace(".", r"\.")):
        config.validate()


# --- environment overrides -------------------------------------------------------------------

@pytest.mark.parametrize(("var", "message"), [
    ("GPULEDGER_ALERT__LOW_UTIL_ACTIVITY",
     "GPULEDGER_ALERT__LOW_UTIL_ACTIVITY: unknown configuration section 'alert' (known: "
     "thresholds, windows, alerts, limits, warehouse;"),
    ("GPULEDGER_ALERTS__LOW_UTIL_ACTIVTY",
     "GPULEDGER_ALERTS__LOW_UTIL_ACTIVTY: unknown key 'low_util_activty' of section alerts "
     "(known: low_util_activity,"),
    ("GPULEDGER_ALERTS__", "GPULEDGER_ALERTS__: unknown key '' of section alerts"),
    ("GPULEDGER_ALERTS__FOR_S__X", "GPULEDGER_ALERTS__FOR_S__X: unknown key 'for_s__x'"),
    ("GPULEDGER_CARD_TIERS__A10", "GPULEDGER_CARD_TIERS__A10: unknown configuration section"),
    ("GPULEDGER_KAFKA__BOOTSTRAP", "GPULEDGER_KAFKA__BOOTSTRAP: unknown configuration "
                                   "section 'kafka'"),
])
def test_an_unknown_override_variable_is_refused(var: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(None, environ={var: "0.5"})
    assert str(caught.value).startswith(message), str(caught.value)


OTHER_VARIABLES = {
    "GPULEDGER_GRAFANA_TOKEN": "t", "GPULEDGER_GRAFANA_URL": "http://g:3000",
    "GPULEDGER_KAFKA_BOOTSTRAP": "k:9092", "GPULEDGER_KAFKA_SASL_PASSWORD": "p",
    "GPULEDGER_TEST_KAFKA_BOOTSTRAP": "k:9092", "GPULEDGER_WAREHOUSE": "wh",
    "GPULEDGER_S3_ADDRESSING": "path", "GPULEDGER_MALLOC_TUNING": "0",
    "GPULEDGER_OPENB_DIR": "/x", "GPULEDGER_AGENT__KAFKA__BOOTSTRAP": "k:9092",
    "GPULEDGER_AGENT__NODE": "n1"}
"""Every other GPULEDGER_* variable the code reads, and the agent's own
GPULEDGER_AGENT__* overrides: none is the processor's configuration."""


def test_the_cli_names_the_misspelt_variable_and_no_other(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    for var, value in {**OTHER_VARIABLES, "GPULEDGER_ALERTS__LOW_UTIL_ACTIVITY": "0.05"}.items():
        monkeypatch.setenv(var, value)
    assert main(["alerts", "generate", "--out", str(tmp_path / "ok")]) == 0
    assert "< 0.05\n" in (tmp_path / "ok" / ALERTS_FILE).read_text()
    capsys.readouterr()
    monkeypatch.setenv("GPULEDGER_ALERT__LOW_UTIL_ACTIVITY", "0.5")
    assert main(["alerts", "generate", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpuledger: error: configuration: "
                          "GPULEDGER_ALERT__LOW_UTIL_ACTIVITY: unknown configuration section")
    assert err.count("\n") == 1 and not (tmp_path / "out").exists()
