"""Processor configuration: thresholds, windows, alerts, physical limits and card tiers.

Configuration is data: a YAML file (all keys optional) overridden by environment
variables ``GPULEDGER_<SECTION>__<KEY>`` (for example
``GPULEDGER_THRESHOLDS__IDLE_ACTIVITY=0.03``). Everything is validated at start; an
error names the bad key. The thresholds are recorded in the facts they produce.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from gpuledger.yaml_file import YamlFileError, read_yaml


class ConfigError(ValueError):
    """A configuration value is missing, of the wrong type or out of range."""


@dataclass(frozen=True)
class Thresholds:
    """Activity and memory thresholds that classify GPU-minutes and jobs."""

    idle_activity: float = 0.05
    """Allocated GPU-minutes with activity below this are ``allocated_idle``."""
    efficient_activity: float = 0.30
    """Allocated GPU-minutes with activity below this (and not idle) are inefficient."""
    memory_oversized_ratio: float = 0.25
    """A job is memory over-sized when its peak stays under this share of held memory."""
    lower_tier_memory_headroom: float = 0.9
    """A job fits a lower card when its peak memory is under this share of that card's."""
    lower_tier_max_activity: float = 0.8
    """... and its activity, scaled by relative speed, stays under this on that card."""
    reduce_gpus_idle_share: float = 0.25
    """Recommend fewer GPUs when at least this share of a job's GPUs were idle."""


@dataclass(frozen=True)
class Windows:
    """Event-time windowing."""

    allowed_lateness_s: int = 120
    """A minute closes once the newest event time is this far past the minute's end."""
    node_stall_s: int = 300
    """The newest event time is the oldest among nodes that sent telemetry within this
    long of the newest sample: a node whose samples come in later than the others' (a
    replay, a slow agent, a partition read behind) holds the windows open; a node silent
    this long no longer does."""
    max_future_s: int = 3600
    """Events further than this ahead of the wall clock are rejected."""
    max_ahead_s: int = 600
    """Telemetry further than this ahead of the fleet (the 90th percentile of the nodes'
    newest sample times) is rejected while the processor is caught up with its input:
    one node with a clock running ahead cannot fabricate minutes for everyone. (For
    ``gpuledger ingest`` it bounds events after the input's own time range.)"""
    max_behind_s: int = 86_400
    """The first events a processor sees set where it starts; events further than this
    behind the median of that first batch do not (they are late: kept and counted), so
    one record from a wrong year cannot make a processor walk the years between."""
    ended_job_memory_s: int = 86_400
    """How long an ended job is remembered to make duplicate events harmless."""
    handover_retention_s: int = 3600
    """Scheduler and inventory history kept this long behind the closed minutes, so that a
    telemetry partition handed over from an instance that is behind this one (a
    rebalance) can still be closed from where that instance stopped."""
    catchup_close_minutes: int = 60
    """Catching up (the Kafka service with input waiting, and what it read more than
    this many minutes older than the wall clock: a restart after an outage, a replay),
    minutes close in steps: up to the last multiple of this many minutes of the day
    they passed (60: whole hours; 0: no steps), and a node read up to this far behind
    the others still holds the windows (not only ``node_stall_s``) ..."""
    catchup_close_interval_s: float = 2.0
    """... or all of them once this long has passed since the last close. Caught up, a
    minute closes as soon as the watermark passes it. A close pass has a fixed cost
    however many minutes it closes, so larger steps make catching up faster; the
    samples of one step are held in memory."""


WINDOW_SECONDS_MAX = 3653 * 86_400
"""The longest time a ``windows`` or ``warehouse`` setting in seconds may hold: ten years
(a history imported with ``max_behind_s`` of a year fits many times over)."""
ALERT_SECONDS_MAX = 366 * 86_400
"""The longest alert duration (a ``for`` or window a Prometheus rule holds)."""


@dataclass(frozen=True)
class AlertThresholds:
    """Alert thresholds: the processor's alert engine and the generated Prometheus rules
    (``gpuledger alerts generate``) both read these, so there is one definition."""

    low_util_activity: float = 0.10
    """A running job fires when its trailing mean activity is below this ..."""
    low_util_resolve_activity: float = 0.15
    """... and resolves only once it is above this (hysteresis)."""
    low_util_grace_s: int = 900
    """No low-utilisation alert before a job has run this long."""
    low_util_window_s: int = 1800
    """The trailing window of the mean activity."""
    waste_warning_gpu_hours: float = 1.0
    """Severity grows with wasted GPU-hours: below this ``info``, from it ``warning`` ..."""
    waste_critical_gpu_hours: float = 8.0
    """... from this ``critical``."""
    idle_gpu_s: int = 1800
    """An allocated GPU with no process and no activity for this long."""
    memory_oversized_runtime_s: int = 3600
    """Memory over-sized alerts only for jobs that have run this long (the ratio is
    ``thresholds.memory_oversized_ratio``)."""
    blocked_s: int = 1800
    """A pending job blocked by fragmentation for this long."""
    queue_wait_objective_s: int = 3600
    """Queue-wait objective per queue ..."""
    queue_wait_quantile: float = 0.95
    """... for this quantile of the waits of the trailing hour."""
    agent_silent_s: int = 300
    """A healthy node with no telemetry for this long."""
    processor_lag_s: int = 600
    """The processor's closed minutes this far behind the wall clock."""
    for_s: int = 300
    """Prometheus rules whose threshold is not itself a duration (low utilisation, memory,
    queue wait, processor lag) must hold this long before firing (``for``)."""
    keep_firing_s: int = 300
    """Prometheus rules keep firing this long after the condition clears (``keep_firing_for``)."""
    absent_s: int = 600
    """A component Prometheus has no target for at all (``absent(up{job=…})``), or one
    whose target went away, this long."""
    processor_job: str = "gpuledger"
    """Prometheus ``job`` of the processor's ``/metrics`` (``--metrics-address``) ..."""
    agent_job: str = "gpuledger-agent"
    """... of the node agents' (``metrics.listen``) ..."""
    bridge_job: str = "gpuledger-bridge"
    """... and of the scheduler bridges' (``--metrics-address``). Empty: that component
    is not scraped, and has no down/absent rules."""


@dataclass(frozen=True)
class Limits:
    """Physical bounds of a record (``validate``): a value outside them is impossible on a
    real GPU, so the record is rejected with a reason and counted, never kept. They are
    wider than any shipping card; a site with unusual hardware may widen them."""

    power_max_w: float = 2000.0
    """``power_w`` above this (the largest GPUs draw about 1,200 W)."""
    temp_min_c: float = -40.0
    """``temp_c`` below this ..."""
    temp_max_c: float = 150.0
    """... or above this."""
    clock_max_mhz: float = 5000.0
    """``sm_clock_mhz`` above this."""
    memory_max_mib: float = 1_048_576.0
    """Memory of one GPU above this (1 TiB): ``mem_used_mib``, ``mem_total_mib``, a
    process's ``used_mib``, an inventory's or a job's ``gpu_mem_mib``."""
    memory_margin: float = 0.05
    """``mem_used_mib`` (and the sum of the processes' ``used_mib``) may exceed
    ``mem_total_mib`` of the same sample by this share, no more."""
    byte_rate_max: float = 1e13
    """PCIe/NVLink ``*_bytes_s`` above this (10 TB/s)."""


@dataclass(frozen=True)
class WarehouseOptions:
    """How the warehouse is written and published (docs/warehouse.md)."""

    url: str = ""
    """The warehouse: a folder or ``s3://bucket/prefix`` (``--warehouse`` wins; empty:
    ``./warehouse``)."""
    state: str = ""
    """Where ``gpuledger process`` keeps its checkpoints: a folder or ``s3://`` URL
    shared by the group's instances (empty: ``<warehouse>/state``)."""
    retain_s: float = 3600.0
    """Objects a commit replaces are deleted this long after (readers that took the
    previous generation finish their queries)."""
    compact: bool = True
    """Compact closed days into one object per table, day and partition."""
    compact_after_s: int = 3600
    """... once the processor has closed this long past the day's end."""
    compact_bucket_rows: int = 16_384
    """Compaction sorts a day in buckets of about this many rows, spilled to ``$TMPDIR``
    (``external_sort.py``); a day of at most this many rows is sorted in memory. Larger
    buckets: less CPU, more memory (bench/README.md, *Memory, bounded compaction*)."""
    compact_worker: bool = True
    """Compaction's sorts run in a child process started for each round of compaction
    and ended with it (``sort_worker.py``): the processor's memory stays that of its
    state. false: they run in the processor itself."""
    catalog_interval_s: float = 30.0
    """``catalog.duckdb`` is rebuilt at most this often while processing (and at every
    stop and end of input)."""
    snapshot_interval_s: float = 30.0
    """The Kafka service refreshes the snapshots of running attempts and candidates at
    most this often, in the generation of the close step that writes them (and at every
    stop): readers see the jobs that run now, not those of the last stop. A history
    (ingest, import) writes them at its end."""


@dataclass(frozen=True)
class CardTier:
    """A card type's place in the hierarchy used by card-mismatch and right-sizing."""

    memory_mib: float
    relative_speed: float


DEFAULT_CARD_TIERS: dict[str, CardTier] = {
    "H100-SXM5-80GB": CardTier(81_559, 1.0),
    "A100-SXM4-80GB": CardTier(81_920, 0.55),
    "L40S-48GB": CardTier(46_068, 0.35),
    "A10-24GB": CardTier(23_028, 0.15),
}


@dataclass(frozen=True)
class ProcessorConfig:
    """Everything the processor needs to turn events into facts."""

    thresholds: Thresholds = field(default_factory=Thresholds)
    windows: Windows = field(default_factory=Windows)
    card_tiers: dict[str, CardTier] = field(default_factory=lambda: dict(DEFAULT_CARD_TIERS))
    alerts: AlertThresholds = field(default_factory=AlertThresholds)
    limits: Limits = field(default_factory=Limits)
    warehouse: WarehouseOptions = field(default_factory=WarehouseOptions)
    cluster_facts: bool = True
    """Compute cluster-wide facts (fragmentation, pending, queue wait). Exactly one
    processor instance of a consumer group has this on."""

    def validate(self) -> ProcessorConfig:
        """Check ranges; raise :class:`ConfigError` naming the bad key."""
        t = self.thresholds
        for name in ("idle_activity", "efficient_activity", "memory_oversized_ratio",
                     "lower_tier_memory_headroom", "lower_tier_max_activity",
                     "reduce_gpus_idle_share"):
            value = getattr(t, name)
            if not 0.0 <= value <= 1.0:
                raise ConfigError(f"thresholds.{name}: {value} must be between 0 and 1")
        if t.idle_activity > t.efficient_activity:
            raise ConfigError(
                "thresholds.idle_activity: must not exceed thresholds.efficient_activity "
                f"({t.idle_activity} > {t.efficient_activity})"
            )
        a = self.alerts
        for name in ("low_util_activity", "low_util_resolve_activity", "queue_wait_quantile"):
            if not 0.0 <= getattr(a, name) <= 1.0:
                raise ConfigError(f"alerts.{name}: {getattr(a, name)} must be between 0 and 1")
        for f in fields(a):
            value = getattr(a, f.name)
            if isinstance(value, str):
                if not re.fullmatch(r"[A-Za-z0-9_.:-]*", value):
                    raise ConfigError(f"alerts.{f.name}: {value!r} is not a Prometheus job "
                                      "name (letters, digits, _ . : -)")
            elif not math.isfinite(value):
                raise ConfigError(f"alerts.{f.name}: expected a finite number, got {value}")
            elif value < 0:
                raise ConfigError(f"alerts.{f.name}: must be >= 0")
            elif f.name.endswith("_s") and value > ALERT_SECONDS_MAX:
                raise ConfigError(f"alerts.{f.name}: at most {ALERT_SECONDS_MAX:,} s (366 "
                                  f"days), got {value}")
            elif f.name.endswith("_s") and value != int(value):
                # the rules' durations are whole seconds: 0.5 would be written as 0s
                raise ConfigError(f"alerts.{f.name}: expected whole seconds, got {value}")
        if not a.low_util_window_s > 0:
            # a range of [0s] is no PromQL (promtool: "duration must be greater than 0")
            raise ConfigError("alerts.low_util_window_s: must be > 0 (the trailing window "
                              "of the mean activity)")
        waste_max = 1_000_000.0  # GPU-hours, more than any one job wastes; 1e306 made the
        # rules' GPU-seconds threshold inf, a rule that can never fire
        for name in ("waste_warning_gpu_hours", "waste_critical_gpu_hours"):
            if getattr(a, name) > waste_max:
                raise ConfigError(f"alerts.{name}: at most {waste_max:,.0f} GPU-hours, got "
                                  f"{getattr(a, name):g}")
        if a.low_util_activity > a.low_util_resolve_activity:
            raise ConfigError("alerts.low_util_activity: must not exceed "
                              "alerts.low_util_resolve_activity")
        if a.waste_warning_gpu_hours > a.waste_critical_gpu_hours:
            raise ConfigError("alerts.waste_warning_gpu_hours: must not exceed "
                              "alerts.waste_critical_gpu_hours "
                              f"({a.waste_warning_gpu_hours} > {a.waste_critical_gpu_hours})")
        w = self.windows
        for section, names in (
                ("windows", ("allowed_lateness_s", "node_stall_s", "max_future_s",
                             "max_ahead_s", "max_behind_s", "ended_job_memory_s",
                             "handover_retention_s", "catchup_close_minutes",
                             "catchup_close_interval_s")),
                ("warehouse", ("retain_s", "compact_after_s", "catalog_interval_s",
                               "snapshot_interval_s"))):
            for name in names:
                value = getattr(getattr(self, section), name)
                if value < 0:
                    raise ConfigError(f"{section}.{name}: must be >= 0")
                # 10¹⁸ s overflowed a timedelta: a traceback out of every command
                if name.endswith("_s") and value > WINDOW_SECONDS_MAX:
                    raise ConfigError(f"{section}.{name}: at most {WINDOW_SECONDS_MAX:,} s "
                                      f"(ten years), got {value:g}")
        if self.warehouse.compact_bucket_rows < 1_000:
            raise ConfigError("warehouse.compact_bucket_rows: must be >= 1000 (a spill of "
                              "smaller buckets costs far more than it saves)")
        for name in ("url", "state"):
            value = getattr(self.warehouse, name)
            if value:
                from gpuledger.pipeline.location import StoreError, check_location

                try:
                    check_location(value)
                except StoreError as exc:
                    raise ConfigError(f"warehouse.{name}: {exc}") from None
        if w.catchup_close_minutes > 1440:
            raise ConfigError("windows.catchup_close_minutes: must be <= 1440 (a day)")
        lim = self.limits
        for f in fields(lim):
            value = getattr(lim, f.name)
            if f.name not in ("temp_min_c", "memory_margin") and not value > 0:
                raise ConfigError(f"limits.{f.name}: must be > 0")
        if not 0 <= lim.memory_margin <= 1:
            raise ConfigError(f"limits.memory_margin: {lim.memory_margin} must be between "
                              "0 and 1")
        if not lim.temp_min_c < lim.temp_max_c:
            raise ConfigError("limits.temp_min_c: must be below limits.temp_max_c "
                              f"({lim.temp_min_c} >= {lim.temp_max_c})")
        for card, tier in self.card_tiers.items():
            if tier.memory_mib <= 0:
                raise ConfigError(f"card_tiers.{card}.memory_mib: must be > 0")
            if tier.relative_speed <= 0:
                raise ConfigError(f"card_tiers.{card}.relative_speed: must be > 0")
        return self


def _coerce(path: str, value: Any, default: Any) -> Any:
    """Convert ``value`` to the type of ``default`` or raise naming ``path``."""
    if isinstance(default, str):
        if value is None or isinstance(value, dict | list):
            return "" if value is None else _fail_text(path, value)
        return str(value)
    if isinstance(default, bool):
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "1", "yes", "false", "0", "no"):
            return value.lower() in ("true", "1", "yes")
        raise ConfigError(f"{path}: expected true or false, got {value!r}")
    if isinstance(default, int | float):
        if isinstance(value, bool):
            raise ConfigError(f"{path}: expected a number, got {value!r}")
        try:
            number = float(value)  # '1e3' too (YAML 1.1 reads it as text)
        except OverflowError:  # an integer past a float's range (400 digits)
            number = math.inf
        except (TypeError, ValueError):
            raise ConfigError(f"{path}: expected a number, got {value!r}") from None
        if not math.isfinite(number):
            shown = repr(value)
            if len(shown) > 40:
                shown = f"{shown[:20]}… (a number of {len(shown)} digits)"
            raise ConfigError(f"{path}: expected a finite number, got {shown}")
        if isinstance(default, float):
            return number
        if not number.is_integer():  # int(90.5) would be 90: a different threshold
            raise ConfigError(f"{path}: expected a whole number, got {value!r}")
        return int(value) if isinstance(value, int) else int(number)
    if isinstance(default, str) and not isinstance(value, str):
        raise ConfigError(f"{path}: expected text, got {value!r}")
    return value


def _fail_text(path: str, value: Any) -> str:
    raise ConfigError(f"{path}: expected text, got {value!r}")


def _section(name: str, cls: Any, raw: Any) -> Any:
    if raw is None:
        return cls()
    if not isinstance(raw, dict):
        raise ConfigError(f"{name}: expected a mapping, got {type(raw).__name__}")
    known = {f.name: f for f in fields(cls)}
    default = cls()
    values: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in known:
            raise ConfigError(f"{name}.{key}: unknown key (known: {', '.join(known)})")
        values[key] = _coerce(f"{name}.{key}", value, getattr(default, key))
    return replace(default, **values)


def _card_tiers(raw: Any) -> dict[str, CardTier]:
    if raw is None:
        return dict(DEFAULT_CARD_TIERS)
    if not isinstance(raw, dict):
        raise ConfigError(
            "card_tiers: expected a mapping of card type to {memory_mib, relative_speed}")
    tiers: dict[str, CardTier] = {}
    for card, spec in raw.items():
        if not isinstance(spec, dict):
            raise ConfigError(f"card_tiers.{card}: expected a mapping")
        for key in spec:
            if key not in ("memory_mib", "relative_speed"):
                raise ConfigError(f"card_tiers.{card}.{key}: unknown key")
        for key in ("memory_mib", "relative_speed"):
            if key not in spec:
                raise ConfigError(f"card_tiers.{card}.{key}: required")
        tiers[str(card)] = CardTier(
            _coerce(f"card_tiers.{card}.memory_mib", spec["memory_mib"], 1.0),
            _coerce(f"card_tiers.{card}.relative_speed", spec["relative_speed"], 1.0),
        )
    return tiers


ENV_PREFIX = "GPULEDGER_"


def _env_overrides(raw: dict[str, Any], environ: dict[str, str]) -> dict[str, Any]:
    """Fold ``GPULEDGER_SECTION__KEY`` variables into ``raw``.

    Only the double-underscore form is configuration: ``GPULEDGER_GRAFANA_TOKEN``,
    ``GPULEDGER_KAFKA_*``, ``GPULEDGER_WAREHOUSE`` and the like are other settings, and
    ``GPULEDGER_AGENT__*`` is the node agent's configuration. Any other
    ``GPULEDGER_X__Y`` whose section or key is unknown is refused, naming the variable:
    a misspelt override must not be ignored in silence."""
    sections: dict[str, Any] = {"thresholds": Thresholds, "windows": Windows,
                                "alerts": AlertThresholds, "limits": Limits,
                                "warehouse": WarehouseOptions}
    merged: dict[str, Any] = {k: (dict(v) if isinstance(v, dict) else v) for k, v in raw.items()}
    for var, value in sorted(environ.items()):
        if not var.startswith(ENV_PREFIX) or "__" not in var:
            continue
        section, _, key = var[len(ENV_PREFIX):].lower().partition("__")
        if section == "agent":  # GPULEDGER_AGENT__*: agents/gpuledger/agent/config.py
            continue
        if section not in sections:
            raise ConfigError(f"{var}: unknown configuration section {section!r} (known: "
                              f"{', '.join(sections)}; the form is GPULEDGER_SECTION__KEY)")
        known = [f.name for f in fields(sections[section])]
        if key not in known:
            raise ConfigError(f"{var}: unknown key {key!r} of section {section} (known: "
                              f"{', '.join(known)})")
        merged.setdefault(section, {})
        if not isinstance(merged[section], dict):
            raise ConfigError(f"{section}: expected a mapping")
        merged[section][key] = value
    return merged


def load_config(path: Path | None = None, environ: dict[str, str] | None = None) -> ProcessorConfig:
    """Read ``path`` (YAML; optional), apply environment overrides, validate."""
    raw: Any = {}
    if path is not None:
        try:
            raw = read_yaml(path) or {}
        except YamlFileError as exc:
            raise ConfigError(str(exc)) from None
        if not isinstance(raw, dict):
            raise ConfigError(f"{path}: expected a mapping at the top level")
    for key in raw:
        if key not in ("thresholds", "windows", "alerts", "limits", "warehouse", "card_tiers",
                       "cluster_facts"):
            raise ConfigError(
                f"{key}: unknown key (known: thresholds, windows, alerts, limits, warehouse, "
                "card_tiers, cluster_facts)"
            )
    raw = _env_overrides(raw, dict(os.environ) if environ is None else environ)
    config = ProcessorConfig(
        thresholds=_section("thresholds", Thresholds, raw.get("thresholds")),
        windows=_section("windows", Windows, raw.get("windows")),
        alerts=_section("alerts", AlertThresholds, raw.get("alerts")),
        limits=_section("limits", Limits, raw.get("limits")),
        warehouse=_section("warehouse", WarehouseOptions, raw.get("warehouse")),
        card_tiers=_card_tiers(raw.get("card_tiers")),
        cluster_facts=_coerce("cluster_facts", raw.get("cluster_facts", True), True),
    )
    return config.validate()
