"""Scheduler names → the contract's job and node attributes, shared by every bridge.

One YAML file (``docs/mapping.md``) says how a scheduler's own names become gpuledger's
``team``, ``pool``, ``queue``, ``priority``, ``job_type``, ``preemptible`` and card type:

* Slurm: account → team, partition → pool, partition and/or QOS → queue,
  QOS → priority, GRES type (``h100``) → card type (``H100-SXM5-80GB``);
* Kubernetes/Kueue: namespace or a label → team, a node label → pool,
  LocalQueue → queue, labels → job type, the GPU product label → card type.

Every section and key is optional; without a file the mapping is the identity (the
scheduler's names are used as they are) plus a built-in table of common GRES type
names. The file is validated when it is loaded; an error names the bad key, e.g.
``mapping.teams.accounts.foo: expected a string, got 3``.

Pure Python (PyYAML only): the bridges are as lean as the node agent.
"""

from __future__ import annotations

import fnmatch
import logging
import math
from collections.abc import Mapping as AbstractMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuledger.contract.schema import JOB_TYPES
from gpuledger.yaml_file import YamlFileError, read_yaml


class MappingError(ValueError):
    """The mapping file is malformed; the message names the bad key."""


# GRES / device-plugin names seen in the wild → gpuledger card types, with memory per GPU.
DEFAULT_CARD_TYPES: dict[str, str] = {
    "h100": "H100-SXM5-80GB",
    "h100-sxm5-80gb": "H100-SXM5-80GB",
    "nvidia-h100-80gb-hbm3": "H100-SXM5-80GB",
    "a100": "A100-SXM4-80GB",
    "a100-sxm4-80gb": "A100-SXM4-80GB",
    "nvidia-a100-sxm4-80gb": "A100-SXM4-80GB",
    "l40s": "L40S-48GB",
    "nvidia-l40s": "L40S-48GB",
    "a10": "A10-24GB",
    "nvidia-a10": "A10-24GB",
}
DEFAULT_CARD_MEMORY_MIB: dict[str, float] = {
    "H100-SXM5-80GB": 81_559.0,
    "A100-SXM4-80GB": 81_920.0,
    "L40S-48GB": 46_068.0,
    "A10-24GB": 23_028.0,
}
GUESSED_CARD_NAMES: dict[str, str] = {
    "a100": "A100s come with 40 or 80 GB, SXM4 or PCIe",
    "h100": "H100s come as SXM5 80 GB, PCIe 80 GB or NVL 94 GB",
}
"""Family names the built-in table reads as one model: said once (a warning) when used,
since the card's memory follows from it."""
MAPPING_KEYS = ("teams", "pools", "queues", "priorities", "job_types", "card_types",
                "preemptible")
QUEUE_SOURCES = ("partition", "qos", "partition/qos")
_RULE_KEYS = ("type", "name", "qos", "partition", "account", "namespace", "queue", "labels")


@dataclass(frozen=True)
class JobTypeRule:
    """``type`` applies when every given pattern matches (shell-style globs)."""

    type: str
    name: str | None = None
    qos: str | None = None
    partition: str | None = None
    account: str | None = None
    namespace: str | None = None
    queue: str | None = None
    labels: dict[str, str] = field(default_factory=dict)

    def matches(self, facts: AbstractMapping[str, str | None],
                labels: AbstractMapping[str, str]) -> bool:
        for key in ("name", "qos", "partition", "account", "namespace", "queue"):
            pattern = getattr(self, key)
            if pattern is None:
                continue
            value = facts.get(key)
            if value is None or not fnmatch.fnmatchcase(value, pattern):
                return False
        for key, pattern in self.labels.items():
            value = labels.get(key)
            if value is None or not fnmatch.fnmatchcase(value, pattern):
                return False
        return True


@dataclass(frozen=True)
class Mapping:
    """How scheduler names become contract attributes. ``Mapping()`` is the identity."""

    team_accounts: dict[str, str] = field(default_factory=dict)
    team_namespaces: dict[str, str] = field(default_factory=dict)
    team_label: str | None = None
    team_default: str | None = None
    pool_partitions: dict[str, str] = field(default_factory=dict)
    pool_node_label: str | None = None
    pool_default: str | None = None
    queue_source: str = "partition"
    queue_names: dict[str, str] = field(default_factory=dict)
    priority_qos: dict[str, int] = field(default_factory=dict)
    priority_default: int | None = None
    job_type_rules: tuple[JobTypeRule, ...] = ()
    job_type_default: str | None = None
    card_types: dict[str, str] = field(default_factory=lambda: dict(DEFAULT_CARD_TYPES))
    card_memory_mib: dict[str, float] = field(
        default_factory=lambda: dict(DEFAULT_CARD_MEMORY_MIB))
    preemptible_qos: tuple[str, ...] = ()
    preemptible_label: str | None = None
    _guesses_said: set[str] = field(default_factory=set, init=False, compare=False,
                                    repr=False)

    # -- jobs ------------------------------------------------------------------------

    def team(self, account: str | None = None, namespace: str | None = None,
             labels: AbstractMapping[str, str] | None = None) -> str | None:
        """Team of a job: the team label, else the mapped account/namespace, else as is."""
        if self.team_label and labels and labels.get(self.team_label):
            return labels[self.team_label]
        if account:
            return self.team_accounts.get(account, account)
        if namespace:
            return self.team_namespaces.get(namespace, namespace)
        return self.team_default

    def pool(self, partition: str | None = None,
             node_labels: AbstractMapping[str, str] | None = None) -> str | None:
        """Pool of a node or job: the pool node label, else the mapped partition."""
        if self.pool_node_label and node_labels and node_labels.get(self.pool_node_label):
            return node_labels[self.pool_node_label]
        if partition:
            first = partition.split(",")[0]
            return self.pool_partitions.get(first, first)
        return self.pool_default

    def queue(self, partition: str | None = None, qos: str | None = None,
              local_queue: str | None = None) -> str | None:
        """Queue: a Kueue LocalQueue, else partition, QOS or ``partition/qos``."""
        if local_queue:
            raw: str | None = local_queue
        elif self.queue_source == "qos":
            raw = qos or (partition.split(",")[0] if partition else None)
        elif self.queue_source == "partition/qos" and partition and qos:
            raw = f"{partition.split(',')[0]}/{qos}"
        else:
            raw = partition.split(",")[0] if partition else qos
        if raw is None:
            return None
        return self.queue_names.get(raw, raw)

    def priority(self, qos: str | None = None, native: int | None = None) -> int | None:
        """Priority: the QOS's mapped value, else the default, else the scheduler's own."""
        if qos and qos in self.priority_qos:
            return self.priority_qos[qos]
        if self.priority_default is not None:
            return self.priority_default
        return native

    def job_type(self, name: str | None = None, qos: str | None = None,
                 partition: str | None = None, account: str | None = None,
                 namespace: str | None = None, queue: str | None = None,
                 labels: AbstractMapping[str, str] | None = None) -> str | None:
        """Job type from the first matching rule, else the default (null: unknown)."""
        facts = {"name": name, "qos": qos, "partition": partition, "account": account,
                 "namespace": namespace, "queue": queue}
        for rule in self.job_type_rules:
            if rule.matches(facts, labels or {}):
                return rule.type
        return self.job_type_default

    def preemptible(self, qos: str | None = None,
                    labels: AbstractMapping[str, str] | None = None) -> bool | None:
        """True for listed QOSes or a true preemptible label; null when nothing is said."""
        if self.preemptible_label and labels and self.preemptible_label in labels:
            return labels[self.preemptible_label].lower() in ("true", "1", "yes")
        if not self.preemptible_qos:
            return None
        return qos in self.preemptible_qos if qos else False

    # -- cards -----------------------------------------------------------------------

    def card_type(self, name: str | None) -> str | None:
        """Card type of a GRES type / product label (case-insensitive), else as is."""
        if not name:
            return None
        if name in self.card_types:
            return self.card_types[name]
        key = name.lower()
        card = self.card_types.get(key, name)
        if (key in GUESSED_CARD_NAMES and card == DEFAULT_CARD_TYPES[key]
                and key not in self._guesses_said):
            self._guesses_said.add(key)
            memory = self.card_memory(card)
            logging.getLogger("gpuledger.mapping").warning(
                "card type %r read as %s%s by the built-in table, but %s: if yours are "
                "another model, name it in the mapping (card_types.names: {%s: ...}, "
                "docs/mapping.md)", name, card,
                f" ({memory:,.0f} MiB)" if memory else "", GUESSED_CARD_NAMES[key], key)
        return card

    def card_memory(self, card_type: str | None) -> float | None:
        """Memory per GPU of a card type, MiB (null when unknown)."""
        return self.card_memory_mib.get(card_type) if card_type else None


# -- loading -------------------------------------------------------------------------


def _mapping_of(path: str, raw: Any, known: tuple[str, ...] | None = None) -> dict[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise MappingError(f"{path}: expected a mapping, got {type(raw).__name__}")
    for key in raw:
        if not isinstance(key, str):
            raise MappingError(f"{path}.{key}: keys must be strings")
        if known is not None and key not in known:
            raise MappingError(f"{path}.{key}: unknown key (known: {', '.join(known)})")
    return raw


def _string(path: str, value: Any) -> str:
    if not isinstance(value, str):
        raise MappingError(f"{path}: expected a string, got {value!r}")
    if not value:
        raise MappingError(f"{path}: must not be empty")
    return value


def _opt_string(path: str, value: Any) -> str | None:
    return None if value is None else _string(path, value)


def _string_map(path: str, raw: Any) -> dict[str, str]:
    return {str(k): _string(f"{path}.{k}", v) for k, v in _mapping_of(path, raw).items()}


PRIORITY_MIN, PRIORITY_MAX = -(2**63), 2**63 - 1
"""A priority is a 64-bit integer (what the event contract's decoder stores)."""
MEMORY_MIB_MAX = 1_048_576.0
"""The most memory per GPU, MiB: the processor's default ``limits.memory_max_mib`` (a record
above it would be rejected at ingest)."""


def _int(path: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise MappingError(f"{path}: expected an integer, got {value!r}")
    if not PRIORITY_MIN <= value <= PRIORITY_MAX:
        raise MappingError(f"{path}: {value} does not fit a 64-bit integer "
                           f"({PRIORITY_MIN}..{PRIORITY_MAX})")
    return value


def _rules(path: str, raw: Any) -> tuple[JobTypeRule, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise MappingError(f"{path}: expected a list of rules, got {type(raw).__name__}")
    rules: list[JobTypeRule] = []
    for i, item in enumerate(raw):
        where = f"{path}[{i}]"
        entry = _mapping_of(where, item, _RULE_KEYS)
        if "type" not in entry:
            raise MappingError(f"{where}.type: required (one of {', '.join(JOB_TYPES)})")
        kind = _string(f"{where}.type", entry["type"])
        if kind not in JOB_TYPES:
            raise MappingError(f"{where}.type: {kind!r} is not one of {', '.join(JOB_TYPES)}")
        patterns = {k: _string(f"{where}.{k}", entry[k]) for k in _RULE_KEYS[1:-1] if k in entry}
        labels = _string_map(f"{where}.labels", entry.get("labels"))
        if not patterns and not labels:
            raise MappingError(f"{where}: a rule needs at least one of "
                               f"{', '.join(_RULE_KEYS[1:])}")
        rules.append(JobTypeRule(type=kind, labels=labels, **patterns))
    return tuple(rules)


def parse_mapping(raw: Any, where: str = "mapping") -> Mapping:
    """Build a :class:`Mapping` from parsed YAML; raise :class:`MappingError` naming the key."""
    top = _mapping_of(where, raw, MAPPING_KEYS)
    teams = _mapping_of(f"{where}.teams", top.get("teams"),
                        ("accounts", "namespaces", "label", "default"))
    pools = _mapping_of(f"{where}.pools", top.get("pools"),
                        ("partitions", "node_label", "default"))
    queues = _mapping_of(f"{where}.queues", top.get("queues"), ("slurm", "names"))
    prios = _mapping_of(f"{where}.priorities", top.get("priorities"), ("qos", "default"))
    types = _mapping_of(f"{where}.job_types", top.get("job_types"), ("rules", "default"))
    cards = _mapping_of(f"{where}.card_types", top.get("card_types"), ("names", "memory_mib"))
    preempt = _mapping_of(f"{where}.preemptible", top.get("preemptible"), ("qos", "label"))

    source = queues.get("slurm", "partition")
    if source not in QUEUE_SOURCES:
        raise MappingError(f"{where}.queues.slurm: {source!r} is not one of "
                           f"{', '.join(QUEUE_SOURCES)}")
    prio_qos = {str(k): _int(f"{where}.priorities.qos.{k}", v)
                for k, v in _mapping_of(f"{where}.priorities.qos", prios.get("qos")).items()}
    default_prio = prios.get("default")
    if default_prio is not None:
        default_prio = _int(f"{where}.priorities.default", default_prio)
    default_type = _opt_string(f"{where}.job_types.default", types.get("default"))
    if default_type is not None and default_type not in JOB_TYPES:
        raise MappingError(f"{where}.job_types.default: {default_type!r} is not one of "
                           f"{', '.join(JOB_TYPES)}")
    card_names = dict(DEFAULT_CARD_TYPES)
    card_names.update({k.lower(): v for k, v in
                       _string_map(f"{where}.card_types.names", cards.get("names")).items()})
    memory = dict(DEFAULT_CARD_MEMORY_MIB)
    for key, value in _mapping_of(f"{where}.card_types.memory_mib",
                                  cards.get("memory_mib")).items():
        if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0 \
                or math.isinf(value):
            raise MappingError(f"{where}.card_types.memory_mib.{key}: expected a number > 0, "
                               f"got {value!r}")
        if value > MEMORY_MIB_MAX:
            raise MappingError(f"{where}.card_types.memory_mib.{key}: at most "
                               f"{MEMORY_MIB_MAX:,.0f} MiB (1 TiB), got {value!r}")
        memory[str(key)] = float(value)
    raw_qos = preempt.get("qos")
    if raw_qos is None:
        preempt_qos: tuple[str, ...] = ()
    elif isinstance(raw_qos, list):
        preempt_qos = tuple(_string(f"{where}.preemptible.qos[{i}]", q)
                            for i, q in enumerate(raw_qos))
    else:
        raise MappingError(f"{where}.preemptible.qos: expected a list of QOS names, "
                           f"got {raw_qos!r}")
    return Mapping(
        team_accounts=_string_map(f"{where}.teams.accounts", teams.get("accounts")),
        team_namespaces=_string_map(f"{where}.teams.namespaces", teams.get("namespaces")),
        team_label=_opt_string(f"{where}.teams.label", teams.get("label")),
        team_default=_opt_string(f"{where}.teams.default", teams.get("default")),
        pool_partitions=_string_map(f"{where}.pools.partitions", pools.get("partitions")),
        pool_node_label=_opt_string(f"{where}.pools.node_label", pools.get("node_label")),
        pool_default=_opt_string(f"{where}.pools.default", pools.get("default")),
        queue_source=source,
        queue_names=_string_map(f"{where}.queues.names", queues.get("names")),
        priority_qos=prio_qos,
        priority_default=default_prio,
        job_type_rules=_rules(f"{where}.job_types.rules", types.get("rules")),
        job_type_default=default_type,
        card_types=card_names,
        card_memory_mib=memory,
        preemptible_qos=preempt_qos,
        preemptible_label=_opt_string(f"{where}.preemptible.label", preempt.get("label")),
    )


def load_mapping(path: Path | None) -> Mapping:
    """Load and validate a mapping file; ``None`` gives the identity mapping.

    A file may hold the mapping at its top level or under a ``mapping:`` key (so that it
    can share a file with a bridge's other settings).
    """
    if path is None:
        return Mapping()
    try:
        raw = read_yaml(path)
    except YamlFileError as exc:
        raise MappingError(str(exc)) from None
    if isinstance(raw, dict) and "mapping" in raw:
        beside = sorted(str(k) for k in raw if k in MAPPING_KEYS)
        if beside:
            raise MappingError(f"{path}: {beside[0]}: a mapping key beside `mapping:` "
                               "(move it under `mapping:`)")
        raw = raw["mapping"]
    return parse_mapping(raw)
