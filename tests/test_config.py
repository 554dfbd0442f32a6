"""Processor configuration: defaults, file, environment, and errors naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuledger.pipeline.config import ConfigError, load_config


def test_defaults_match_design() -> None:
    c = load_config(None, environ={})
    assert c.thresholds.idle_activity == 0.05
    assert c.thresholds.efficient_activity == 0.30
    assert c.thresholds.memory_oversized_ratio == 0.25


def test_limits_from_the_file_and_the_environment(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("limits:\n  power_max_w: 3000\n  temp_max_c: 120\n")
    c = load_config(f, environ={"GPULEDGER_LIMITS__MEMORY_MARGIN": "0.1"})
    assert (c.limits.power_max_w, c.limits.temp_max_c, c.limits.memory_margin) == (
        3000.0, 120.0, 0.1)
    assert c.limits.clock_max_mhz == load_config(None, environ={}).limits.clock_max_mhz == 5000


def test_file_then_environment_override(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("thresholds:\n  idle_activity: 0.02\nwindows:\n  allowed_lateness_s: 60\n")
    c = load_config(f, environ={"GPULEDGER_THRESHOLDS__IDLE_ACTIVITY": "0.03"})
    assert c.thresholds.idle_activity == 0.03
    assert c.windows.allowed_lateness_s == 60


@pytest.mark.parametrize(("text", "env", "message"), [
    ("thresholds:\n  idle_activty: 0.1\n", {}, "thresholds.idle_activty: unknown key"),
    # an integer past a float's range: OverflowError, a traceback (found by trying)
    (f"windows:\n  max_behind_s: 1{'0' * 400}\n", {},
     "windows.max_behind_s: expected a finite number, got 10000000000000000000… "),
    ("thresholds:\n  idle_activity: lots\n", {}, "thresholds.idle_activity: expected a number"),
    ("thresholds:\n  idle_activity: 0.5\n", {}, "thresholds.idle_activity: must not exceed"),
    ("windows:\n  allowed_lateness_s: -1\n", {}, "windows.allowed_lateness_s: must be >= 0"),
    ("colour: blue\n", {}, "colour: unknown key"),
    ("card_tiers:\n  X:\n    memory_mib: 0\n    relative_speed: 1\n", {},
     "card_tiers.X.memory_mib: must be > 0"),
    ("", {"GPULEDGER_THRESHOLDS__EFFICIENT_ACTIVITY": "2"},
     "thresholds.efficient_activity: 2.0 must be between 0 and 1"),
    ("- a\n", {}, "expected a mapping at the top level"),
    ("limits:\n  power_max_w: 0\n", {}, "limits.power_max_w: must be > 0"),
    ("limits:\n  temp_min_c: 90\n  temp_max_c: 80\n", {}, "limits.temp_min_c: must be below"),
    ("", {"GPULEDGER_LIMITS__MEMORY_MARGIN": "3"}, "limits.memory_margin: 3.0 must be between"),
    ("", {"GPULEDGER_LIMITS__CLOCK_MAX_MHZ": "nan"},
     "limits.clock_max_mhz: expected a finite number, got 'nan'"),
    ("thresholds:\n  idle_activity: .nan\n", {},
     "thresholds.idle_activity: expected a finite number, got nan"),
    ("windows:\n  allowed_lateness_s: .inf\n", {},
     "windows.allowed_lateness_s: expected a finite number, got inf"),
    ("", {"GPULEDGER_THRESHOLDS__EFFICIENT_ACTIVITY": "-inf"},
     "thresholds.efficient_activity: expected a finite number, got '-inf'"),
    ("warehouse:\n  compact_bucket_rows: .inf\n", {},
     "warehouse.compact_bucket_rows: expected a finite number, got inf"),
    ("alerts:\n  waste_warning_gpu_hours: 10\n  waste_critical_gpu_hours: 1\n", {},
     "alerts.waste_warning_gpu_hours: must not exceed alerts.waste_critical_gpu_hours"),
    ("alerts:\n  idle_gpu_s: 90.5\n", {}, "alerts.idle_gpu_s: expected a whole number, got 90.5"),
    ("alerts:\n  for_s: 99999999999999999999999\n", {},
     "alerts.for_s: at most 31,622,400 s"),
    # finite but beyond a timedelta: an OverflowError traceback out of every command
    ("windows:\n  max_future_s: 1000000000000000000\n", {},
     "windows.max_future_s: at most 315,619,200 s"),
    ("", {"GPULEDGER_WAREHOUSE__COMPACT_AFTER_S": "1e18"},
     "warehouse.compact_after_s: at most 315,619,200 s"),
    ("limits:\n  watts: 5\n", {}, "limits.watts: unknown key"),
    ("warehouse:\n  compact_bucket_rows: 10\n", {},
     "warehouse.compact_bucket_rows: must be >= 1000"),
])
def test_errors_name_the_bad_key(tmp_path: Path, text: str, env: dict[str, str],
                                 message: str) -> None:
    f = tmp_path / "c.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        load_config(f, environ=env)


def test_numbers_written_as_1e3_are_numbers(tmp_path: Path) -> None:
    """YAML 1.1 reads 1e3 (no dot, no sign) as text: it is still the number 1000."""
    f = tmp_path / "c.yaml"
    f.write_text("alerts:\n  for_s: 1e3\nthresholds:\n  idle_activity: 5e-2\n")
    config = load_config(f, environ={})
    assert config.alerts.for_s == 1000 and isinstance(config.alerts.for_s, int)
    assert config.thresholds.idle_activity == 0.05


def test_ten_years_is_the_longest_window(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("windows:\n  max_behind_s: 315619200\n  ended_job_memory_s: 315619200\n")
    assert load_config(f).windows.max_behind_s == 315_619_200
