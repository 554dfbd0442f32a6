"""The what-if policy file: named policies to replay, team quotas, calibration tolerance.

Example (``docs/whatif.md`` documents every key)::

    baseline: as-run            # the policy closest to what the cluster ran
    quotas:                     # whole GPUs per team and pool (default: inferred)
      llm-core: {train: 176, infer: 32}
    policies:
      - name: as-run            # best fit, borrowing, reclaim, preemption, back-fill
      - name: fgd
        placement: fgd
      - name: fixed-quota
        quota: fixed
      - name: no-backfill
        backfill: false
      - name: no-preemption
        preemption: {priority: false, reclaim: false}
      - name: notebooks-on-a10
        card_pools: {interactive: {pool: dev}}

Errors name the key and, for a file, its line: ``policies.yaml:7: policies[1].placement:
must be one of best-fit, worst-fit, fgd, topology``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from gpuledger.yaml_file import YamlFileError, parse_yaml, read_text

PLACEMENTS = ("best-fit", "worst-fit", "fgd", "topology")
QUOTA_MODES = ("borrow", "fixed")
BASELINE = "as-run"
RESERVED_NAMES = frozenset({"answer", "key", "observed", "baseline", "error", "within"})
"""Names a policy may not have: the comparison's own columns, beside which each policy is
a column (and ``observed`` a schedule in ``--json``). A policy named ``observed`` showed
its replay as the observed figures, one named ``within`` turned the calibration's flags
into numbers; ``key`` stopped the run with a traceback after the whole replay."""


class PolicyError(ValueError):
    """The policy file is invalid; the message names the key (and line)."""


@dataclass(frozen=True)
class CardPool:
    """Where the jobs of one job type go: a pool, and optionally one card type in it."""

    pool: str
    card_type: str | None = None


@dataclass(frozen=True)
class Policy:
    """One named policy; the defaults are the scheduler model's (best fit, borrowing,
    reclaim, priority preemption, back-fill)."""

    name: str
    placement: str = "best-fit"
    quota: str = "borrow"
    backfill: bool = True
    preempt_priority: bool = True
    reclaim: bool = True
    checkpointable_only: bool = False
    card_pools: Mapping[str, CardPool] = field(default_factory=dict)
    description: str = ""
    key: str = field(default="", compare=False)
    """Where it is in the policy file (``policies[2]``); "" when built in."""


@dataclass(frozen=True)
class Tolerance:
    """How close the baseline replay must come to the observed history."""

    queue_wait_relative: float = 0.25
    queue_wait_minutes: float = 5.0
    gpu_hours_relative: float = 0.05


@dataclass(frozen=True)
class PolicySet:
    """The policies to replay, the baseline among them, quotas and tolerance."""

    policies: tuple[Policy, ...]
    baseline: str = BASELINE
    quotas: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    tolerance: Tolerance = Tolerance()
    schedule_interval_s: int = 15
    reserve_after_minutes: float = 120.0
    checkpoint_minutes: float = 30.0
    origin: str = ""
    """The policy file it was read from ("" for the built-in set or a parsed document)."""
    lines: Mapping[str, int] = field(default_factory=dict, compare=False)
    """Dotted key → its line in ``origin``."""

    def get(self, name: str) -> Policy:
        """The policy called ``name``."""
        return next(p for p in self.policies if p.name == name)

    def error(self, key: str, message: str) -> PolicyError:
        """``message`` about ``key``, with the file and line where there is one."""
        if not self.origin:
            return _fail(key, message)
        line = _line(self.lines, key)
        return PolicyError(f"{self.origin}:{line}: {key}: {message}" if line
                           else f"{self.origin}: {key}: {message}")

    def check_names(self, known: Mapping[str, set[str]]) -> None:
        """Refuse (PolicyError naming the key) a team, pool, job type or card type the
        warehouse does not have (``known``: ``History.known``): a misspelt name would
        otherwise match nothing and change nothing, silently."""
        for team, pools in self.quotas.items():
            if team not in known.get("team", set()):
                raise self.error(f"quotas.{team}", f"no team {team!r} in the warehouse "
                                 f"({_listed('teams', known.get('team', set()))})")
            for pool in pools:
                if pool not in known.get("pool", set()):
                    raise self.error(f"quotas.{team}.{pool}", f"no pool {pool!r} in the "
                                     f"warehouse ({_listed('pools', known.get('pool', set()))})")
        for i, policy in enumerate(self.policies):
            for job_type, target in policy.card_pools.items():
                where = f"{policy.key or f'policies[{i}]'}.card_pools.{job_type}"
                if job_type not in known.get("job_type", set()):
                    raise self.error(where, f"no job type {job_type!r} in the warehouse "
                                     f"({_listed('job types', known.get('job_type', set()))})")
                if target.pool not in known.get("pool", set()):
                    raise self.error(f"{where}.pool", f"no pool {target.pool!r} in the "
                                     f"warehouse ({_listed('pools', known.get('pool', set()))})")
                cards = {c.split("/", 1)[1] for c in known.get("card_type", set())
                         if c.startswith(f"{target.pool}/")}
                if target.card_type is not None and target.card_type not in cards:
                    raise self.error(f"{where}.card_type", f"no card type "
                                     f"{target.card_type!r} in pool {target.pool!r} "
                                     f"({_listed('card types there', cards)})")


def _listed(what: str, names: set[str], most: int = 12) -> str:
    """``what: a, b, c`` (the first ``most``), or that there are none."""
    if not names:
        return f"it has no {what}"
    shown = sorted(names)
    more = f", … ({len(shown) - most} more)" if len(shown) > most else ""
    return f"{what}: {', '.join(shown[:most])}{more}"


def _line(lines: Mapping[str, int], path: str) -> int | None:
    """The line of the dotted key ``path``, or of the nearest key above it."""
    while path:
        if path in lines:
            return lines[path]
        cut = max(path.rfind("."), path.rfind("["))
        path = path[:cut] if cut > 0 else ""
    return None


DEFAULT = PolicySet(policies=(
    Policy(BASELINE, description="best fit, borrowing with reclaim, preemption, back-fill"),
    Policy("worst-fit", placement="worst-fit", description="spread jobs over nodes"),
    Policy("fgd", placement="fgd", description="fragmentation gradient descent (ATC '23)"),
    Policy("fixed-quota", quota="fixed", description="no borrowing above quota"),
    Policy("no-backfill", backfill=False, description="strict priority order"),
    Policy("no-preemption", preempt_priority=False, reclaim=False,
           description="no preemption, no reclaim"),
))


class _Lines:
    """Line numbers of the keys of a YAML document, by dotted path."""

    def __init__(self, text: str) -> None:
        self.lines: dict[str, int] = {}
        try:
            node = yaml.compose(text)
        except yaml.YAMLError:
            return
        if node is not None:
            self._walk(node, "")

    def _walk(self, node: yaml.Node, path: str) -> None:
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                sub = f"{path}.{key.value}" if path else str(key.value)
                self.lines[sub] = key.start_mark.line + 1
                self._walk(value, sub)
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                sub = f"{path}[{i}]"
                self.lines[sub] = item.start_mark.line + 1
                self._walk(item, sub)

    def line(self, path: str) -> int | None:
        return _line(self.lines, path)


def load_policies(path: Path | None) -> PolicySet:
    """Read and validate a policy file; ``None`` gives the built-in set (:data:`DEFAULT`)."""
    if path is None:
        return DEFAULT
    try:
        text = read_text(Path(path))
        raw = parse_yaml(text, path)
    except YamlFileError as exc:
        raise PolicyError(str(exc)) from None
    lines = _Lines(text)
    try:
        parsed = parse_policies(raw)
    except PolicyError as exc:
        key = str(exc).split(":", 1)[0]
        line = lines.line(key)
        raise PolicyError(f"{path}:{line}: {exc}" if line else f"{path}: {exc}") from None
    return replace(parsed, origin=str(path), lines=lines.lines)


def _fail(where: str, message: str) -> PolicyError:
    return PolicyError(f"{where}: {message}")


def _mapping(value: object, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise _fail(where, "must be a mapping")
    return value


def _keys(obj: Mapping[str, Any], where: str, allowed: set[str]) -> None:
    for key in obj:
        if key not in allowed:
            known = ", ".join(sorted(allowed))
            raise _fail(f"{where}.{key}" if where else str(key), f"unknown key (known: {known})")


def _bool(obj: Mapping[str, Any], key: str, where: str, default: bool) -> bool:
    value = obj.get(key, default)
    if not isinstance(value, bool):
        raise _fail(f"{where}.{key}", "must be true or false")
    return value


def _number(obj: Mapping[str, Any], key: str, where: str, default: float,
            minimum: float = 0.0, maximum: float = 1e6) -> float:
    """A number in [``minimum``, ``maximum``]: the scheduler's figures are 64-bit
    integers of seconds (``checkpoint_minutes: 1e300`` overflowed one, a traceback)."""
    value = obj.get(key, default)
    name = f"{where}.{key}" if where else key
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _fail(name, "must be a number")
    try:
        finite = math.isfinite(value)
    except OverflowError:  # an integer past a float's range
        finite = False
    if not finite:
        raise _fail(name, "must be a finite number")
    if value < minimum:
        raise _fail(name, f"must be >= {minimum:g}")
    if value > maximum:
        raise _fail(name, f"must be <= {maximum:,.0f}")
    return float(value)


def _choice(obj: Mapping[str, Any], key: str, where: str, choices: tuple[str, ...],
            default: str) -> str:
    value = obj.get(key, default)
    if value not in choices:
        raise _fail(f"{where}.{key}", f"must be one of {', '.join(choices)}")
    return str(value)


def _text(value: object, where: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise _fail(where, "must be a non-empty string")
    return value


def parse_policies(raw: object) -> PolicySet:
    """Validate a decoded policy document."""
    doc = _mapping(raw if raw is not None else {}, "policy file")
    _keys(doc, "", {"policies", "baseline", "quotas", "tolerance", "scheduler"})
    items = doc.get("policies")
    if not isinstance(items, list) or not items:
        raise _fail("policies", "must be a non-empty list")
    policies = [_policy(item, f"policies[{i}]") for i, item in enumerate(items)]
    seen: set[str] = set()
    for i, p in enumerate(policies):
        if p.name in seen:
            raise _fail(f"policies[{i}].name", f"duplicate policy {p.name!r}")
        if p.name in RESERVED_NAMES:
            raise _fail(f"policies[{i}].name", f"{p.name!r} names one of the comparison's "
                        f"own columns ({', '.join(sorted(RESERVED_NAMES))}): choose another")
        seen.add(p.name)
    baseline = doc.get("baseline", BASELINE)
    if baseline == BASELINE and BASELINE not in seen:
        policies.insert(0, Policy(BASELINE, description="the scheduler model's defaults"))
    elif not isinstance(baseline, str) or baseline not in seen:
        raise _fail("baseline", f"must name one of the policies ({', '.join(sorted(seen))})")
    quotas: dict[str, dict[str, int]] = {}
    for team, pools in _mapping(doc.get("quotas") or {}, "quotas").items():
        where = f"quotas.{team}"
        quotas[str(team)] = {}
        for pool, gpus in _mapping(pools, where).items():
            if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 0:
                raise _fail(f"{where}.{pool}", "must be a whole number of GPUs >= 0")
            quotas[str(team)][str(pool)] = gpus
    tol = _mapping(doc.get("tolerance") or {}, "tolerance")
    _keys(tol, "tolerance", {"queue_wait_relative", "queue_wait_minutes", "gpu_hours_relative"})
    d = Tolerance()
    tolerance = Tolerance(
        _number(tol, "queue_wait_relative", "tolerance", d.queue_wait_relative),
        _number(tol, "queue_wait_minutes", "tolerance", d.queue_wait_minutes),
        _number(tol, "gpu_hours_relative", "tolerance", d.gpu_hours_relative),
    )
    sched = _mapping(doc.get("scheduler") or {}, "scheduler")
    _keys(sched, "scheduler", {"interval_s", "reserve_after_minutes", "checkpoint_minutes"})
    interval = _number(sched, "interval_s", "scheduler", 15, minimum=1, maximum=86_400)
    if interval != int(interval):
        raise _fail("scheduler.interval_s", "must be a whole number of seconds")
    return PolicySet(
        policies=tuple(policies), baseline=str(baseline), quotas=quotas, tolerance=tolerance,
        schedule_interval_s=int(interval),
        reserve_after_minutes=_number(sched, "reserve_after_minutes", "scheduler", 120.0),
        checkpoint_minutes=_number(sched, "checkpoint_minutes", "scheduler", 30.0,
                                   minimum=1.0),
    )


def _policy(raw: object, where: str) -> Policy:
    obj = _mapping(raw, where)
    _keys(obj, where, {"name", "placement", "quota", "backfill", "preemption", "card_pools",
                       "description"})
    name = _text(obj.get("name"), f"{where}.name")
    pre = _mapping(obj.get("preemption") or {}, f"{where}.preemption")
    _keys(pre, f"{where}.preemption", {"priority", "reclaim", "checkpointable_only"})
    pools: dict[str, CardPool] = {}
    for job_type, target in _mapping(obj.get("card_pools") or {}, f"{where}.card_pools").items():
        at = f"{where}.card_pools.{job_type}"
        t = _mapping(target, at)
        _keys(t, at, {"pool", "card_type"})
        card = t.get("card_type")
        pools[str(job_type)] = CardPool(_text(t.get("pool"), f"{at}.pool"),
                                        None if card is None else _text(card, f"{at}.card_type"))
    return Policy(
        name=name,
        placement=_choice(obj, "placement", where, PLACEMENTS, "best-fit"),
        quota=_choice(obj, "quota", where, QUOTA_MODES, "borrow"),
        backfill=_bool(obj, "backfill", where, True),
        preempt_priority=_bool(pre, "priority", f"{where}.preemption", True),
        reclaim=_bool(pre, "reclaim", f"{where}.preemption", True),
        checkpointable_only=_bool(pre, "checkpointable_only", f"{where}.preemption", False),
        card_pools=pools,
        description=str(obj.get("description") or ""),
        key=where,
    )
