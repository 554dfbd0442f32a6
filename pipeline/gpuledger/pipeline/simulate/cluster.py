"""Cluster specification for the simulator: hardware, teams, queues and workload mix.

A :class:`ClusterSpec` is read from YAML (``load_cluster``). The packaged default
(``default_cluster.yaml``) describes a 576-GPU cluster with three pools. Every key is
validated and an error names the offending key, e.g.
``ValueError("cluster.teams[2].quota.train: must be >= 0")``.

Model vocabulary:

- A *node group* is a set of identical nodes (same pool, card type, GPUs per node,
  interconnect). Nodes are named ``{group}-{nnn}``.
- A *team* owns a guaranteed *quota* (whole GPUs) per pool; it may borrow idle capacity
  above its quota, and borrowed jobs can be reclaimed.
- A *queue* targets one pool and has a priority; jobs of a *preemptible* queue may be
  preempted by higher-priority jobs that are within their team's quota.
- A *workload* is a stream of similar jobs (arrival rate, sizes, durations) with one
  telemetry *profile* (see :data:`PROFILES`).
"""

from __future__ import annotations

import importlib.resources
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpuledger.contract.schema import JOB_TYPES
from gpuledger.pipeline.config import Limits
from gpuledger.yaml_file import YamlFileError, read_yaml

PROFILES = (
    "training",  # healthy training: high activity, dips at checkpoints
    "finetune",  # fine-tune: like training, somewhat lower activity
    "dataloader_bound",  # input-bound training: saw-tooth activity, low mean
    "notebook",  # interactive notebook holding GPUs while mostly idle
    "evaluation",  # evaluation: bursts of work separated by loading gaps
    "inference",  # serving: daily load curve with reserved headroom
    "oversized",  # requests much memory and uses under a quarter of it
    "memory_bound",  # DRAM busy, SMs mostly waiting (small batches)
    "comm_bound",  # multi-GPU job waiting on NVLink/PCIe transfers
)
TOPOLOGIES = ("nvlink", "pcie")
FRACTION_STEP = 0.25  # fractional GPUs are allocated in quarters


@dataclass(frozen=True)
class NodeGroup:
    """Identical nodes of one pool and card type."""

    name: str
    pool: str
    card_type: str
    nodes: int
    gpus_per_node: int
    gpu_mem_mib: float
    topology: str = "pcie"
    dcgm: bool = False  # reports DCGM profiling fields (sm_active, ...)
    tdp_w: float = 300.0
    idle_w: float = 30.0
    max_sm_clock_mhz: float = 1500.0
    idle_sm_clock_mhz: float = 210.0
    labels: Mapping[str, str] = field(default_factory=dict)

    @property
    def gpus(self) -> int:
        """GPUs in the whole group."""
        return self.nodes * self.gpus_per_node


@dataclass(frozen=True)
class Team:
    """A team with a guaranteed quota of whole GPUs per pool."""

    name: str
    users: int
    quota: Mapping[str, int]


@dataclass(frozen=True)
class Queue:
    """A scheduler queue: one pool, one priority."""

    name: str
    pool: str
    priority: int
    preemptible: bool = False


@dataclass(frozen=True)
class Duration:
    """Log-normal run time in minutes, clipped to [minimum, maximum]."""

    median: float
    sigma: float = 0.5
    minimum: float = 1.0
    maximum: float = 7 * 24 * 60.0


@dataclass(frozen=True)
class Workload:
    """A stream of similar jobs."""

    name: str
    profile: str
    job_type: str
    queue: str
    teams: tuple[str, ...]
    arrivals_per_hour: float
    gpus: Mapping[int, float]  # GPU count -> relative weight
    duration: Duration
    initial_jobs: int = 0  # jobs submitted at the very beginning of the warm-up
    diurnal: bool = False  # arrivals follow the working day
    fraction: float = 1.0  # share of one GPU (gpus must be 1 when < 1)
    fraction_share: float = 0.0  # probability that a 1-GPU job uses ``fraction`` (else whole)
    card_type: str | None = None  # None: any card of the pool
    checkpoint_minutes: float | None = None  # None: not checkpointable
    fail_prob: float = 0.0
    cancel_prob: float = 0.0  # cancelled by the user while running
    pending_patience_minutes: float | None = None  # mean patience before cancelling
    no_process_share: float = 0.0  # jobs whose process list stays empty for a while

    @property
    def checkpointable(self) -> bool:
        """Whether jobs of this workload write checkpoints they can resume from."""
        return self.checkpoint_minutes is not None


@dataclass(frozen=True)
class Faults:
    """Operational incidents placed at random times in the emitted span."""

    drains: int = 0
    drain_minutes: float = 60.0
    gpu_failures: int = 0
    repair_minutes: float = 180.0
    node_downs: int = 0
    down_minutes: float = 30.0


@dataclass(frozen=True)
class OutsideProcess:
    """A process started on an unallocated GPU behind the scheduler's back."""

    pool: str
    minutes: float
    activity: float = 0.5


@dataclass(frozen=True)
class ClusterSpec:
    """Everything the simulator needs to know about the cluster."""

    name: str
    node_groups: tuple[NodeGroup, ...]
    teams: tuple[Team, ...]
    queues: tuple[Queue, ...]
    workloads: tuple[Workload, ...]
    faults: Faults = Faults()
    outside_processes: tuple[OutsideProcess, ...] = ()
    warmup_hours: float = 6.0
    schedule_interval_s: int = 15
    reserve_after_minutes: float = 120.0

    @property
    def total_gpus(self) -> int:
        """GPUs in the cluster."""
        return sum(g.gpus for g in self.node_groups)

    @property
    def pools(self) -> tuple[str, ...]:
        """Pool names in order of first appearance."""
        return tuple(dict.fromkeys(g.pool for g in self.node_groups))

    def gpus_by_pool_card(self) -> dict[tuple[str, str], int]:
        """GPU count per (pool, card type)."""
        out: dict[tuple[str, str], int] = {}
        for g in self.node_groups:
            out[(g.pool, g.card_type)] = out.get((g.pool, g.card_type), 0) + g.gpus
        return out

    def queue(self, name: str) -> Queue:
        """The queue called ``name``."""
        return next(q for q in self.queues if q.name == name)


class ClusterSpecError(ValueError):
    """A cluster spec that cannot be read or is not valid: the file and the reason."""


def load_cluster(path: Path | None = None) -> ClusterSpec:
    """Read and validate a cluster spec from YAML; ``None`` loads the packaged default.

    A file that cannot be read (missing, a directory, not UTF-8), is not YAML, or breaks
    a rule raises :class:`ClusterSpecError` naming the file and, where known, the key or
    the line."""
    if path is None:
        text = (
            importlib.resources.files("gpuledger.pipeline.simulate")
            .joinpath("default_cluster.yaml")
            .read_text(encoding="utf-8")
        )
        return parse_cluster(yaml.safe_load(text))
    try:
        raw = read_yaml(path)
    except YamlFileError as exc:
        raise ClusterSpecError(str(exc)) from None
    try:
        return parse_cluster(raw)
    except ValueError as exc:
        raise ClusterSpecError(f"{path}: {exc}") from None


# --- validation helpers -------------------------------------------------------------


def _fail(where: str, message: str) -> ValueError:
    return ValueError(f"{where}: {message}")


def _mapping(value: object, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise _fail(where, "must be a mapping")
    return value


def _seq(value: object, where: str, *, non_empty: bool = False) -> list[Any]:
    if not isinstance(value, list):
        raise _fail(where, "must be a list")
    if non_empty and not value:
        raise _fail(where, "must not be empty")
    return value


def _check_keys(obj: Mapping[str, Any], where: str, allowed: set[str]) -> None:
    for key in obj:
        if key not in allowed:
            raise _fail(f"{where}.{key}", "unknown key")


def _get(obj: Mapping[str, Any], key: str, where: str) -> object:
    if key not in obj or obj[key] is None:
        raise _fail(f"{where}.{key}", "is required")
    return obj[key]


def _str(obj: Mapping[str, Any], key: str, where: str, default: str | None = None) -> str:
    if default is not None and obj.get(key) is None:
        return default
    value = _get(obj, key, where)
    if not isinstance(value, str) or not value:
        raise _fail(f"{where}.{key}", "must be a non-empty string")
    return value


def _bool(obj: Mapping[str, Any], key: str, where: str, default: bool) -> bool:
    value = obj.get(key, default)
    if not isinstance(value, bool):
        raise _fail(f"{where}.{key}", "must be true or false")
    return value


def _num(
    obj: Mapping[str, Any],
    key: str,
    where: str,
    default: float | None = None,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    positive: bool = False,
) -> float:
    value = obj.get(key, default) if default is not None else _get(obj, key, where)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _fail(f"{where}.{key}", "must be a number")
    try:
        finite = math.isfinite(value)
    except OverflowError:  # an integer past a float's range (400 digits)
        finite = False
    if not finite:
        raise _fail(f"{where}.{key}", "must be a finite number")
    return _bounded(float(value), f"{where}.{key}", minimum, maximum, positive)


def _bounded(
    value: float, where: str, minimum: float | None, maximum: float | None, positive: bool
) -> float:
    if positive and value <= 0:
        raise _fail(where, "must be > 0")
    if minimum is not None and value < minimum:
        raise _fail(where, f"must be >= {_shown(minimum)}")
    if maximum is not None and value > maximum:
        raise _fail(where, f"must be <= {_shown(maximum)}")
    return value


def _shown(bound: float) -> str:
    """A bound as a reader writes it: 2,147,483,647 (not 2.14748e+09), 0.5."""
    return f"{int(bound):,}" if float(bound).is_integer() else f"{bound:g}"


def _int(
    obj: Mapping[str, Any],
    key: str,
    where: str,
    default: int | None = None,
    *,
    minimum: int | None = None,
    maximum: int | None = None,
) -> int:
    value = obj.get(key, default) if default is not None else _get(obj, key, where)
    if isinstance(value, bool) or not isinstance(value, int):
        raise _fail(f"{where}.{key}", "must be an integer")
    _bounded(value, f"{where}.{key}", minimum, maximum, False)
    return value


def _optional_num(
    obj: Mapping[str, Any], key: str, where: str, *, positive: bool = False,
    maximum: float | None = None,
) -> float | None:
    if obj.get(key) is None:
        return None
    return _num(obj, key, where, positive=positive, maximum=maximum)


def _unique(names: list[str], where: str, what: str) -> None:
    seen: set[str] = set()
    for i, name in enumerate(names):
        if name in seen:
            raise _fail(f"{where}[{i}].name", f"duplicate {what} {name!r}")
        seen.add(name)


# --- parsing ----------------------------------------------------------------------


def parse_cluster(raw: object) -> ClusterSpec:
    """Validate a decoded YAML document and build the :class:`ClusterSpec`."""
    root = "cluster"
    doc = _mapping(raw, root)
    _check_keys(
        doc,
        root,
        {
            "name",
            "node_groups",
            "teams",
            "queues",
            "workloads",
            "faults",
            "outside_processes",
            "warmup_hours",
            "schedule_interval_s",
            "reserve_after_minutes",
        },
    )
    groups = tuple(
        _node_group(item, f"{root}.node_groups[{i}]")
        for i, item in enumerate(
            _seq(doc.get("node_groups"), f"{root}.node_groups", non_empty=True)
        )
    )
    _unique([g.name for g in groups], f"{root}.node_groups", "node group")
    total = sum(g.nodes * g.gpus_per_node for g in groups)
    if total > MAX_CLUSTER_GPUS:
        raise _fail(f"{root}.node_groups", f"{total:,} GPUs in all: the simulator takes at "
                    f"most {MAX_CLUSTER_GPUS:,}")
    pools = {g.pool for g in groups}
    gpn: dict[tuple[str, str], int] = {}
    for i, g in enumerate(groups):
        known = gpn.setdefault((g.pool, g.card_type), g.gpus_per_node)
        if known != g.gpus_per_node:
            raise _fail(
                f"{root}.node_groups[{i}].gpus_per_node",
                f"all {g.card_type} nodes of pool {g.pool!r} must have {known} GPUs",
            )
    teams = tuple(
        _team(item, f"{root}.teams[{i}]", pools)
        for i, item in enumerate(_seq(doc.get("teams"), f"{root}.teams", non_empty=True))
    )
    _unique([t.name for t in teams], f"{root}.teams", "team")
    queues = tuple(
        _queue(item, f"{root}.queues[{i}]", pools)
        for i, item in enumerate(_seq(doc.get("queues"), f"{root}.queues", non_empty=True))
    )
    _unique([q.name for q in queues], f"{root}.queues", "queue")
    workloads = tuple(
        _workload(item, f"{root}.workloads[{i}]", groups, teams, queues)
        for i, item in enumerate(_seq(doc.get("workloads"), f"{root}.workloads", non_empty=True))
    )
    _unique([w.name for w in workloads], f"{root}.workloads", "workload")
    faults = _faults(doc.get("faults") or {}, f"{root}.faults")
    node_count = sum(g.nodes for g in groups)
    incidents = faults.drains + faults.gpu_failures + faults.node_downs
    if incidents > node_count:
        raise _fail(f"{root}.faults", f"{incidents} incidents need as many nodes ({node_count})")
    outside = tuple(
        _outside(item, f"{root}.outside_processes[{i}]", pools)
        for i, item in enumerate(
            _seq(doc.get("outside_processes") or [], f"{root}.outside_processes")
        )
    )
    return ClusterSpec(
        name=_str(doc, "name", root, default="cluster"),
        node_groups=groups,
        teams=teams,
        queues=queues,
        workloads=workloads,
        faults=faults,
        outside_processes=outside,
        # bounded: 10¹² hours overflowed a timedelta (a traceback), 10⁵ ran for ever
        warmup_hours=_num(doc, "warmup_hours", root, 6.0, minimum=0, maximum=MAX_WARMUP_HOURS),
        schedule_interval_s=_int(doc, "schedule_interval_s", root, 15, minimum=1,
                                 maximum=86_400),
        reserve_after_minutes=_num(doc, "reserve_after_minutes", root, 120.0, minimum=0,
                                   maximum=MAX_MINUTES),
    )


def _node_group(raw: object, where: str) -> NodeGroup:
    obj = _mapping(raw, where)
    _check_keys(
        obj,
        where,
        {
            "name",
            "pool",
            "card_type",
            "nodes",
            "gpus_per_node",
            "gpu_mem_mib",
            "topology",
            "dcgm",
            "tdp_w",
            "idle_w",
            "max_sm_clock_mhz",
            "idle_sm_clock_mhz",
            "labels",
        },
    )
    topology = _str(obj, "topology", where, default="pcie")
    if topology not in TOPOLOGIES:
        raise _fail(f"{where}.topology", f"must be one of {', '.join(TOPOLOGIES)}")
    labels = _mapping(obj.get("labels") or {}, f"{where}.labels")
    for key, value in labels.items():
        if not isinstance(value, str):
            raise _fail(f"{where}.labels.{key}", "must be a string")
    # the processor rejects a sample above Limits.power_max_w: a card drawing more would
    # have its telemetry left out (the demo's H100s read "used 0.1" GPU-hours)
    tdp = _num(obj, "tdp_w", where, 300.0, positive=True, maximum=Limits().power_max_w)
    idle = _num(obj, "idle_w", where, 30.0, minimum=0)
    if idle >= tdp:
        raise _fail(f"{where}.idle_w", "must be below tdp_w")
    return NodeGroup(
        name=_str(obj, "name", where),
        pool=_str(obj, "pool", where),
        card_type=_str(obj, "card_type", where),
        nodes=_int(obj, "nodes", where, minimum=1, maximum=MAX_NODES),
        gpus_per_node=_int(obj, "gpus_per_node", where, minimum=1, maximum=1024),
        gpu_mem_mib=_num(obj, "gpu_mem_mib", where, positive=True,
                         maximum=Limits().memory_max_mib),
        topology=topology,
        dcgm=_bool(obj, "dcgm", where, False),
        tdp_w=tdp,
        idle_w=idle,
        max_sm_clock_mhz=_num(obj, "max_sm_clock_mhz", where, 1500.0, positive=True),
        idle_sm_clock_mhz=_num(obj, "idle_sm_clock_mhz", where, 210.0, positive=True),
        labels={str(k): v for k, v in labels.items()},
    )


def _team(raw: object, where: str, pools: set[str]) -> Team:
    obj = _mapping(raw, where)
    _check_keys(obj, where, {"name", "users", "quota"})
    quota_raw = _mapping(obj.get("quota") or {}, f"{where}.quota")
    quota: dict[str, int] = {}
    for pool in quota_raw:
        if pool not in pools:
            raise _fail(f"{where}.quota.{pool}", "unknown pool")
        quota[str(pool)] = _int(quota_raw, pool, f"{where}.quota", minimum=0,
                                maximum=MAX_CLUSTER_GPUS)
    return Team(
        name=_str(obj, "name", where),
        users=_int(obj, "users", where, 5, minimum=1, maximum=MAX_COUNT),
        quota=quota,
    )


def _queue(raw: object, where: str, pools: set[str]) -> Queue:
    obj = _mapping(raw, where)
    _check_keys(obj, where, {"name", "pool", "priority", "preemptible"})
    pool = _str(obj, "pool", where)
    if pool not in pools:
        raise _fail(f"{where}.pool", f"unknown pool {pool!r}")
    return Queue(
        name=_str(obj, "name", where),
        pool=pool,
        priority=_int(obj, "priority", where, minimum=-(2**31), maximum=2**31 - 1),
        preemptible=_bool(obj, "preemptible", where, False),
    )


def _workload(
    raw: object,
    where: str,
    groups: tuple[NodeGroup, ...],
    teams: tuple[Team, ...],
    queues: tuple[Queue, ...],
) -> Workload:
    obj = _mapping(raw, where)
    _check_keys(
        obj,
        where,
        {
            "name",
            "profile",
            "job_type",
            "queue",
            "teams",
            "arrivals_per_hour",
            "initial_jobs",
            "diurnal",
            "gpus",
            "fraction",
            "fraction_share",
            "card_type",
            "duration_minutes",
            "checkpoint_minutes",
            "fail_prob",
            "cancel_prob",
            "pending_patience_minutes",
            "no_process_share",
        },
    )
    profile = _str(obj, "profile", where)
    if profile not in PROFILES:
        raise _fail(f"{where}.profile", f"must be one of {', '.join(PROFILES)}")
    job_type = _str(obj, "job_type", where)
    if job_type not in JOB_TYPES:
        raise _fail(f"{where}.job_type", f"must be one of {', '.join(JOB_TYPES)}")
    queue_name = _str(obj, "queue", where)
    queue = next((q for q in queues if q.name == queue_name), None)
    if queue is None:
        raise _fail(f"{where}.queue", f"unknown queue {queue_name!r}")
    team_names = {t.name for t in teams}
    raw_teams = _seq(obj.get("teams") or sorted(team_names), f"{where}.teams", non_empty=True)
    for i, name in enumerate(raw_teams):
        if name not in team_names:
            raise _fail(f"{where}.teams[{i}]", f"unknown team {name!r}")
    card = obj.get("card_type")
    in_pool = [g for g in groups if g.pool == queue.pool]
    if card is not None:
        if not isinstance(card, str):
            raise _fail(f"{where}.card_type", "must be a string or null")
        in_pool = [g for g in in_pool if g.card_type == card]
        if not in_pool:
            raise _fail(f"{where}.card_type", f"no {card} nodes in pool {queue.pool!r}")
    gpus = _gpu_weights(obj.get("gpus"), f"{where}.gpus", in_pool)
    fraction = _num(obj, "fraction", where, 1.0, minimum=FRACTION_STEP, maximum=1.0)
    if abs(fraction / FRACTION_STEP - round(fraction / FRACTION_STEP)) > 1e-9:
        raise _fail(f"{where}.fraction", f"must be a multiple of {FRACTION_STEP}")
    if fraction < 1.0 and 1 not in gpus:
        raise _fail(
            f"{where}.fraction", "only single-GPU jobs can be fractional; add gpus: {1: ...}"
        )
    duration = _duration(obj.get("duration_minutes"), f"{where}.duration_minutes")
    return Workload(
        name=_str(obj, "name", where),
        profile=profile,
        job_type=job_type,
        queue=queue_name,
        teams=tuple(str(t) for t in raw_teams),
        # 10¹² asked numpy for a 44 TiB array
        arrivals_per_hour=_num(obj, "arrivals_per_hour", where, minimum=0,
                               maximum=MAX_ARRIVALS_PER_HOUR),
        gpus=gpus,
        duration=duration,
        initial_jobs=_int(obj, "initial_jobs", where, 0, minimum=0, maximum=MAX_COUNT),
        diurnal=_bool(obj, "diurnal", where, False),
        fraction=fraction,
        fraction_share=_num(
            obj, "fraction_share", where, 1.0 if fraction < 1 else 0.0, minimum=0, maximum=1
        ),
        card_type=card,
        checkpoint_minutes=_optional_num(obj, "checkpoint_minutes", where, positive=True,
                                         maximum=MAX_MINUTES),
        fail_prob=_num(obj, "fail_prob", where, 0.0, minimum=0, maximum=1),
        cancel_prob=_num(obj, "cancel_prob", where, 0.0, minimum=0, maximum=1),
        pending_patience_minutes=_optional_num(
            obj, "pending_patience_minutes", where, positive=True
        ),
        no_process_share=_num(obj, "no_process_share", where, 0.0, minimum=0, maximum=1),
    )


def _gpu_weights(raw: object, where: str, groups: list[NodeGroup]) -> dict[int, float]:
    obj = _mapping(raw, where)
    if not obj:
        raise _fail(where, "must not be empty")
    out: dict[int, float] = {}
    for key, weight in obj.items():
        size = int(key) if isinstance(key, int | str) and str(key).isdigit() else -1
        if size < 1:
            raise _fail(f"{where}.{key}", "GPU count must be an integer >= 1")
        if isinstance(weight, bool) or not isinstance(weight, int | float) or weight <= 0:
            raise _fail(f"{where}.{key}", "weight must be a number > 0")
        if not weight <= MAX_WEIGHT:  # (.inf, or two of 1e308: their sum is not finite)
            raise _fail(f"{where}.{key}", f"weight must be at most {_shown(MAX_WEIGHT)} (weights "
                        "are relative)")
        if not any(_fits_group(size, g) for g in groups):
            raise _fail(f"{where}.{key}", f"a {size}-GPU job fits no node group of its pool")
        out[size] = float(weight)
    return out


def _fits_group(size: int, group: NodeGroup) -> bool:
    """Single-node jobs fit one node; multi-node jobs take whole nodes."""
    n = group.gpus_per_node
    return size <= n or (size % n == 0 and size // n <= group.nodes)


MAX_NODES = 100_000
"""The most nodes of a node group; and :data:`MAX_CLUSTER_GPUS` GPUs in all. Without a
bound, ``nodes: 100000000`` took memory at 400 MB/s until the machine ran out."""
MAX_CLUSTER_GPUS = 100_000
"""The most GPUs a simulated cluster has (ten times the 9,216 of the benchmarks'
largest)."""
MAX_COUNT = 100_000
"""The most users of a team, jobs queued at the start of a workload, and faults of a kind
(``initial_jobs: 1000000000`` took memory until the machine ran out)."""
MAX_MINUTES = 525_600.0
"""The longest time in minutes a spec may give (a year): checkpoint interval, drains,
repairs (``checkpoint_minutes: 1e300`` overflowed a 64-bit integer, a traceback)."""
MAX_WEIGHT = 1e6
"""The largest relative weight of a job size (``.inf`` made the probabilities NaN)."""
MAX_WARMUP_HOURS = 168.0
"""The longest warm-up a cluster spec may ask for (a week: the queue fills in hours)."""
MAX_ARRIVALS_PER_HOUR = 10_000.0
"""The most jobs a workload may submit per hour (about 3 a second; the default cluster's
busiest workload submits 8; at 10,000 the 6-hour warm-up alone takes 80 s)."""
MAX_SIGMA = 10.0
"""The widest log-normal spread of a duration (``sigma``; 0.5–0.7 in the default
cluster; durations are clipped to their ``min`` and ``max`` anyway)."""


def _duration(raw: object, where: str) -> Duration:
    obj = _mapping(raw, where)
    _check_keys(obj, where, {"median", "sigma", "min", "max"})
    median = _num(obj, "median", where, positive=True)
    minimum = _num(obj, "min", where, min(1.0, median), positive=True)
    maximum = _num(obj, "max", where, max(7 * 24 * 60.0, median), positive=True)
    if not minimum <= median <= maximum:
        raise _fail(where, "need min <= median <= max")
    return Duration(
        median=median,
        # the log-normal's spread: 10¹² overflowed exp() (a traceback)
        sigma=_num(obj, "sigma", where, 0.5, minimum=0, maximum=MAX_SIGMA),
        minimum=minimum,
        maximum=maximum,
    )


def _faults(raw: object, where: str) -> Faults:
    obj = _mapping(raw, where)
    _check_keys(
        obj,
        where,
        {"drains", "drain_minutes", "gpu_failures", "repair_minutes", "node_downs", "down_minutes"},
    )
    return Faults(
        drains=_int(obj, "drains", where, 0, minimum=0, maximum=MAX_COUNT),
        drain_minutes=_num(obj, "drain_minutes", where, 60.0, positive=True,
                           maximum=MAX_MINUTES),
        gpu_failures=_int(obj, "gpu_failures", where, 0, minimum=0, maximum=MAX_COUNT),
        repair_minutes=_num(obj, "repair_minutes", where, 180.0, positive=True,
                            maximum=MAX_MINUTES),
        node_downs=_int(obj, "node_downs", where, 0, minimum=0, maximum=MAX_COUNT),
        down_minutes=_num(obj, "down_minutes", where, 30.0, positive=True,
                          maximum=MAX_MINUTES),
    )


def _outside(raw: object, where: str, pools: set[str]) -> OutsideProcess:
    obj = _mapping(raw, where)
    _check_keys(obj, where, {"pool", "minutes", "activity"})
    pool = _str(obj, "pool", where)
    if pool not in pools:
        raise _fail(f"{where}.pool", f"unknown pool {pool!r}")
    return OutsideProcess(
        pool=pool,
        minutes=_num(obj, "minutes", where, positive=True),
        activity=_num(obj, "activity", where, 0.5, minimum=0, maximum=1),
    )
