"""Tests for the cluster simulator (gpuledger.pipeline.simulate)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import polars as pl
import pytest
import yaml

from gpuledger.contract.schema import RECORD_TYPES
from gpuledger.pipeline.columns import conform, schema_of
from gpuledger.pipeline.simulate import (
    ClusterSpec,
    SimConfig,
    describe,
    load_cluster,
    parse_cluster,
    plan,
    simulate,
    write_jsonl,
)

START = datetime(2026, 1, 5, tzinfo=UTC)

SMALL = {
    "name": "small",
    "warmup_hours": 3,
    "reserve_after_minutes": 60,
    "node_groups": [
        {
            "name": "h100",
            "pool": "train",
            "card_type": "H100-SXM5-80GB",
            "nodes": 8,
            "gpus_per_node": 8,
            "gpu_mem_mib": 81559,
            "topology": "nvlink",
            "dcgm": True,
            "tdp_w": 700,
            "idle_w": 70,
            "max_sm_clock_mhz": 1980,
        },
        {
            "name": "l40s",
            "pool": "infer",
            "card_type": "L40S-48GB",
            "nodes": 4,
            "gpus_per_node": 4,
            "gpu_mem_mib": 46068,
            "tdp_w": 350,
            "idle_w": 35,
        },
        {
            "name": "a10",
            "pool": "dev",
            "card_type": "A10-24GB",
            "nodes": 4,
            "gpus_per_node": 2,
            "gpu_mem_mib": 23028,
            "tdp_w": 150,
            "idle_w": 20,
        },
    ],
    "teams": [
        {"name": "core", "users": 4, "quota": {"train": 32, "infer": 8, "dev": 2}},
        {"name": "vision", "users": 3, "quota": {"train": 16, "infer": 4, "dev": 2}},
        {"name": "lab", "users": 3, "quota": {"train": 8, "dev": 2}},
    ],
    "queues": [
        {"name": "prod", "pool": "train", "priority": 100},
        {"name": "research", "pool": "train", "priority": 50},
        {"name": "batch", "pool": "train", "priority": 10, "preemptible": True},
        {"name": "serving", "pool": "infer", "priority": 90},
        {"name": "interactive", "pool": "dev", "priority": 70},
    ],
    "workloads": [
        {
            "name": "train",
            "profile": "training",
            "job_type": "training",
            "queue": "prod",
            "teams": ["core"],
            "arrivals_per_hour": 2,
            "gpus": {8: 2, 16: 1},
            "duration_minutes": {"median": 60},
            "checkpoint_minutes": 10,
        },
        {
            "name": "loader",
            "profile": "dataloader_bound",
            "job_type": "training",
            "queue": "research",
            "teams": ["vision"],
            "arrivals_per_hour": 2,
            "gpus": {2: 1, 4: 1},
            "duration_minutes": {"median": 60},
            "checkpoint_minutes": 15,
        },
        {
            "name": "eval",
            "profile": "evaluation",
            "job_type": "evaluation",
            "queue": "research",
            "arrivals_per_hour": 3,
            "gpus": {1: 1},
            "duration_minutes": {"median": 20},
            "fail_prob": 0.2,
        },
        {
            "name": "big-mem",
            "profile": "oversized",
            "job_type": "training",
            "queue": "research",
            "teams": ["lab"],
            "arrivals_per_hour": 1,
            "gpus": {1: 1, 2: 1},
            "duration_minutes": {"median": 60},
        },
        {
            "name": "batch",
            "profile": "training",
            "job_type": "training",
            "queue": "batch",
            "teams": ["lab", "vision"],
            "arrivals_per_hour": 4,
            "gpus": {4: 1, 8: 1},
            "duration_minutes": {"median": 90},
            "checkpoint_minutes": 10,
        },
        {
            "name": "nb-h100",
            "profile": "notebook",
            "job_type": "interactive",
            "queue": "research",
            "teams": ["vision", "lab"],
            "arrivals_per_hour": 1,
            "gpus": {1: 1},
            "duration_minutes": {"median": 90},
            "no_process_share": 0.5,
            "cancel_prob": 0.3,
        },
        {
            "name": "serve",
            "profile": "inference",
            "job_type": "inference",
            "queue": "serving",
            "initial_jobs": 4,
            "arrivals_per_hour": 0.5,
            "gpus": {1: 1, 2: 1},
            "fraction": 0.5,
            "fraction_share": 0.5,
            "duration_minutes": {"median": 600},
        },
        {
            "name": "notebook",
            "profile": "notebook",
            "job_type": "interactive",
            "queue": "interactive",
            "arrivals_per_hour": 3,
            "gpus": {1: 1},
            "fraction": 0.5,
            "fraction_share": 0.5,
            "duration_minutes": {"median": 60},
            "no_process_share": 0.5,
            "pending_patience_minutes": 20,
        },
    ],
    "faults": {
        "drains": 1,
        "drain_minutes": 30,
        "gpu_failures": 1,
        "repair_minutes": 60,
        "node_downs": 1,
        "down_minutes": 20,
    },
    "outside_processes": [{"pool": "dev", "minutes": 30, "activity": 0.4}],
}


@dataclass
class Run:
    """A simulated run: batches, concatenated frames and the plan behind them."""

    config: SimConfig
    batches: list[dict[str, pl.DataFrame]]
    telemetry: pl.DataFrame
    inventory: pl.DataFrame
    job: pl.DataFrame
    profiles: pl.DataFrame  # job_id -> profile (ground truth of the generator)


def _run(config: SimConfig) -> Run:
    batches = list(simulate(config))
    p = plan(config)
    profiles = pl.DataFrame(
        {"job_id": [j.job_id for j in p.jobs], "profile": [j.profile for j in p.jobs]}
    )
    telemetry, inventory, job = (pl.concat([b[t] for b in batches]) for t in RECORD_TYPES)
    return Run(config, batches, telemetry, inventory, job, profiles)


@pytest.fixture(scope="module")
def spec(tmp_path_factory: pytest.TempPathFactory) -> ClusterSpec:
    path = tmp_path_factory.mktemp("cluster") / "small.yaml"
    path.write_text(yaml.safe_dump(SMALL), encoding="utf-8")
    return load_cluster(path)


@pytest.fixture(scope="module")
def run(spec: ClusterSpec) -> Run:
    return _run(SimConfig(hours=3, seed=7, cluster=spec))


@pytest.fixture(scope="module")
def attempts(run: Run) -> pl.DataFrame:
    """One row per attempt and allocated GPU: job_id, node, gpu_uuid, fraction, start, end."""
    job = run.job
    end = datetime(2100, 1, 1, tzinfo=UTC)
    rows = []
    open_: dict[str, tuple[datetime, list[dict[str, object]]]] = {}
    for e in job.select("event", "job_id", "time", "allocation").iter_rows(named=True):
        if e["event"] == "started":
            assert e["job_id"] not in open_, "started twice without ending"
            open_[e["job_id"]] = (e["time"], e["allocation"])
        elif e["event"] in ("preempted", "finished", "failed", "cancelled"):
            began = open_.pop(e["job_id"], None)
            if began is not None:
                rows += [(e["job_id"], began[0], e["time"], a) for a in began[1]]
    rows += [(j, t0, end, a) for j, (t0, alloc) in open_.items() for a in alloc]
    return pl.DataFrame(
        {
            "job_id": [r[0] for r in rows],
            "start": [r[1] for r in rows],
            "end": [r[2] for r in rows],
            "node": [r[3]["node"] for r in rows],
            "gpu_index": [r[3]["gpu_index"] for r in rows],
            "gpu_uuid": [r[3]["gpu_uuid"] for r in rows],
            "fraction": [r[3]["fraction"] for r in rows],
        }
    ).with_columns(pl.col("start", "end").cast(pl.Datetime("ms", "UTC")))


def _activity(frame: pl.DataFrame) -> pl.DataFrame:
    return frame.with_columns(act=pl.coalesce("sm_active", pl.col("util_gpu") / 100.0))


# --- cluster spec -------------------------------------------------------------------


def test_default_cluster_is_big_and_mixed() -> None:
    spec = load_cluster(None)
    assert spec.total_gpus >= 512
    by = spec.gpus_by_pool_card()
    assert len({pool for pool, _ in by}) >= 3
    assert len({card for _, card in by}) >= 4
    assert {q.name for q in spec.queues} >= {"prod", "research", "batch", "serving"}
    assert len(spec.teams) >= 5


def test_invalid_specs_name_the_bad_key() -> None:
    def broken(path: str, value: object) -> dict[str, Any]:
        doc: dict[str, Any] = json.loads(json.dumps(SMALL))
        target: Any = doc
        keys = path.split(".")
        for key in keys[:-1]:
            target = target[int(key)] if key.isdigit() else target[key]
        target[keys[-1]] = value
        return doc

    with pytest.raises(ValueError, match=r"cluster\.teams\[2\]\.quota\.train: must be >= 0"):
        parse_cluster(broken("teams.2.quota.train", -1))
    with pytest.raises(ValueError, match=r"cluster\.workloads\[0\]\.queue: unknown queue"):
        parse_cluster(broken("workloads.0.queue", "nope"))
    with pytest.raises(ValueError, match=r"cluster\.node_groups\[1\]\.colour: unknown key"):
        parse_cluster(broken("node_groups.1.colour", "red"))
    with pytest.raises(ValueError, match=r"cluster\.workloads\[0\]\.gpus\.12: .*fits no node"):
        parse_cluster(broken("workloads.0.gpus", {"12": 1}))
    with pytest.raises(ValueError, match=r"cluster\.queues\[0\]\.pool: unknown pool"):
        parse_cluster(broken("queues.0.pool", "gpu-heaven"))
    for nan_or_inf in (float("nan"), float("inf")):
        with pytest.raises(ValueError, match=r"cluster\.workloads\[0\]\.arrivals_per_hour: "
                           "must be a finite number"):
            parse_cluster(broken("workloads.0.arrivals_per_hour", nan_or_inf))
    # finite but far too large: an overflow (a traceback), a 44 TiB array, a run for ever
    with pytest.raises(ValueError, match=r"cluster\.warmup_hours: must be <= 168"):
        parse_cluster(broken("warmup_hours", 1e12))
    with pytest.raises(ValueError, match=r"cluster\.workloads\[0\]\.arrivals_per_hour: "
                       "must be <= 10,000"):
        parse_cluster(broken("workloads.0.arrivals_per_hour", 1e12))
    with pytest.raises(ValueError, match=r"cluster\.workloads\[0\]\.duration_minutes"
                       r"\.sigma: must be <= 10"):
        parse_cluster(broken("workloads.0.duration_minutes.sigma", 1e12))
    # found by trying sizes: nodes, queued jobs, a priority or a checkpoint interval
    # without a bound ate memory until the machine ran out, or overflowed (a traceback);
    # a card over the processor's power limit had its telemetry rejected in silence
    for key, value, said in [
            ("node_groups.0.nodes", 100_000_000, r"node_groups\[0\]\.nodes: must be <= 100,000"),
            ("node_groups.0.nodes", 20_000, r"node_groups: 16\d,\d\d\d GPUs in all: the "
             r"simulator takes at most 100,000"),
            ("workloads.0.initial_jobs", 10**9, r"initial_jobs: must be <= 100,000"),
            ("queues.0.priority", 10**23, r"priority: must be <= 2,147,483,647"),
            ("workloads.0.checkpoint_minutes", 1e300,
             r"checkpoint_minutes: must be <= 525,600"),
            ("workloads.0.arrivals_per_hour", 10**400, "must be a finite number"),
            ("workloads.0.gpus.8", float("inf"), r"weight must be at most 1,000,000"),
            ("node_groups.0.tdp_w", 5000, r"tdp_w: must be <= 2,000")]:
        with pytest.raises(ValueError, match=said):
            parse_cluster(broken(key, value))


# --- output shape -------------------------------------------------------------------


def test_frames_have_the_exact_contract_schema(run: Run) -> None:
    assert len(run.batches) == 18  # 3 h in 10-minute chunks
    for i, batch in enumerate(run.batches):
        assert set(batch) == set(RECORD_TYPES)
        lo = START + timedelta(minutes=10 * i)
        for record_type, frame in batch.items():
            assert frame.schema == schema_of(record_type), record_type  # type: ignore[arg-type]
            assert frame.equals(conform(frame, record_type))  # type: ignore[arg-type]
            assert frame["time"].is_sorted()
            if frame.height:
                assert frame["time"].min() >= lo  # type: ignore[operator]
                assert frame["time"].max() < lo + timedelta(minutes=10)  # type: ignore[operator]
                assert (frame["v"] == 1).all() and (frame["type"] == record_type).all()


def test_one_telemetry_row_per_gpu_and_sample(run: Run, spec: ClusterSpec) -> None:
    first = run.telemetry.filter(pl.col("time") == START)
    assert first.height == spec.total_gpus
    assert first.select("node", "gpu_index").is_unique().all()
    assert run.telemetry.height <= spec.total_gpus * 3 * 360


def test_same_seed_same_bytes_other_seed_differs(spec: ClusterSpec) -> None:
    config = SimConfig(hours=0.5, seed=11, cluster=spec)
    a, b = list(simulate(config)), list(simulate(config))
    for x, y in zip(a, b, strict=True):
        for t in RECORD_TYPES:
            assert x[t].equals(y[t])
            assert x[t].write_ipc(None).getvalue() == y[t].write_ipc(None).getvalue()
    c = list(simulate(SimConfig(hours=0.5, seed=12, cluster=spec)))
    assert not a[0]["telemetry"].equals(c[0]["telemetry"])
    assert not pl.concat([x["job"] for x in a]).equals(pl.concat([x["job"] for x in c]))


def test_seq_counts_every_row_of_a_node(run: Run) -> None:
    steps = (
        run.telemetry.select("node", "seq")
        .group_by("node", maintain_order=True)
        .agg(first=pl.col("seq").first(), diffs=pl.col("seq").diff().drop_nulls().unique())
    )
    assert (steps["first"] == 0).all()
    assert all(d == [1] for d in steps["diffs"].to_list())


def test_dcgm_fields_only_on_dcgm_cards(run: Run) -> None:
    tel = run.telemetry
    h100 = tel.filter(pl.col("card_type") == "H100-SXM5-80GB")
    others = tel.filter(pl.col("card_type") != "H100-SXM5-80GB")
    assert h100["sm_active"].null_count() == 0 and h100["tensor_active"].null_count() == 0
    assert others["sm_active"].null_count() == others.height
    assert others["util_gpu"].null_count() == 0
    assert others["nvlink_rx_bytes_s"].null_count() == others.height
    assert (tel["mem_total_mib"] > 0).all()


# --- scheduler invariants -----------------------------------------------------------


def test_no_gpu_is_over_allocated(attempts: pl.DataFrame) -> None:
    starts = attempts.select("gpu_uuid", pl.col("start").alias("t")).unique()
    live = starts.join(attempts, on="gpu_uuid").filter(
        (pl.col("start") <= pl.col("t")) & (pl.col("end") > pl.col("t"))
    )
    load = live.group_by("gpu_uuid", "t").agg(pl.col("fraction").sum())
    assert load["fraction"].max() <= 1.0  # type: ignore[operator]


def test_allocations_only_on_schedulable_healthy_gpus(run: Run, attempts: pl.DataFrame) -> None:
    inv = run.inventory.select("node", "time", "schedulable", "health", "unhealthy_gpus")
    starts = attempts.sort("start")
    state = starts.join_asof(
        inv.sort("time"),
        left_on="start",
        right_on="time",
        by="node",
        strategy="backward",
        check_sortedness=False,
    )
    assert state["schedulable"].null_count() == 0
    assert state["schedulable"].all()
    assert (state["health"] != "down").all()
    assert not any(
        g in bad for g, bad in zip(state["gpu_index"], state["unhealthy_gpus"], strict=True)
    )
    # and nothing keeps running on a node once it is drained, down or has a bad GPU
    closed = inv.filter(~pl.col("schedulable") | (pl.col("health") != "ok"))
    assert closed.height >= 3
    clash = attempts.join(closed, on="node").filter(
        (pl.col("start") <= pl.col("time"))
        & (pl.col("end") > pl.col("time"))
        & (~pl.col("schedulable") | pl.col("unhealthy_gpus").list.contains(pl.col("gpu_index")))
    )
    assert clash.is_empty()


def test_every_started_job_was_submitted_first(run: Run) -> None:
    seen: set[str] = set()
    for event, job_id in run.job.select("event", "job_id").iter_rows():
        if event == "submitted":
            assert job_id not in seen
            seen.add(job_id)
        else:
            assert job_id in seen, (event, job_id)
    at_start = run.job.filter(pl.col("time") == START)
    assert at_start.filter(pl.col("event") == "started").height > 0


def test_preempted_checkpointable_jobs_are_requeued(run: Run) -> None:
    job = run.job.with_row_index("i")
    preempted = job.filter(pl.col("event") == "preempted")
    assert preempted.height > 0
    assert preempted["reason"].null_count() == 0
    for row in preempted.iter_rows(named=True):
        nxt = job.filter((pl.col("job_id") == row["job_id"]) & (pl.col("i") > row["i"])).head(1)
        if row["checkpointable"]:
            assert nxt["event"].to_list() == ["requeued"]
            assert nxt["time"].to_list() == [row["time"]]
    requeued = set(job.filter(pl.col("event") == "requeued")["job_id"])
    restarted = job.filter(pl.col("job_id").is_in(requeued) & (pl.col("event") == "started"))
    assert restarted.group_by("job_id").len()["len"].max() >= 2  # type: ignore[operator]
    assert job.filter(pl.col("event") == "checkpointed").height > 0


def test_borrowed_exactly_when_over_quota(run: Run, spec: ClusterSpec) -> None:
    quota = {(t.name, p): q for t in spec.teams for p, q in t.quota.items()}
    usage: dict[tuple[str, str], float] = {}
    held: dict[str, tuple[tuple[str, str], float]] = {}
    borrowed = 0
    for e in run.job.iter_rows(named=True):
        key = (e["team"], e["pool"])
        if e["event"] == "started":
            demand = sum(a["fraction"] for a in e["allocation"])
            before = usage.get(key, 0.0)
            if e["time"] > START:  # attempts already running at the start are replayed
                assert e["borrowed"] == (before + demand > quota.get(key, 0)), e["job_id"]
            borrowed += bool(e["borrowed"])
            usage[key] = before + demand
            held[e["job_id"]] = (key, demand)
        elif e["event"] in ("preempted", "finished", "failed", "cancelled") and e["job_id"] in held:
            k, demand = held.pop(e["job_id"])
            usage[k] -= demand
    assert borrowed > 0


def test_queues_form(run: Run) -> None:
    job = run.job.filter(pl.col("event").is_in(["submitted", "requeued", "started"]))
    waits = (
        job.with_columns(
            queued=pl.when(pl.col("event") != "started")
            .then(pl.col("time"))
            .forward_fill()
            .over("job_id")
        )
        .filter(pl.col("event") == "started")
        .select(wait=(pl.col("time") - pl.col("queued")).dt.total_seconds())
    )["wait"]
    assert (waits >= 0).all()
    assert (waits > 0).sum() > 10
    assert (waits > 600).sum() > 0


def test_some_allocations_are_fractional(run: Run) -> None:
    started = (
        run.job.filter(pl.col("event") == "started").explode("allocation").unnest("allocation")
    )
    shared = started.filter(pl.col("fraction") < 1)
    assert shared.height > 0
    assert set(shared["job_type"]) <= {"inference", "interactive"}
    assert (started.filter(pl.col("gpus") > 8)["node"].n_unique()) >= 2  # multi-node gangs


def test_drain_and_repair_show_in_inventory(run: Run, spec: ClusterSpec) -> None:
    inv = run.inventory
    assert inv.filter(pl.col("time") == START).height == sum(g.nodes for g in spec.node_groups)
    drained = inv.filter(~pl.col("schedulable") & (pl.col("health") == "ok"))
    assert drained.height >= 1
    node = drained["node"][0]
    later = inv.filter((pl.col("node") == node) & (pl.col("time") > drained["time"][0]))
    assert later["schedulable"].to_list()[:1] == [True]
    degraded = inv.filter(pl.col("health") == "degraded")
    assert degraded["unhealthy_gpus"].list.len().min() == 1
    labels = json.loads(inv["labels"][0])
    assert isinstance(labels, dict) and all(isinstance(v, str) for v in labels.values())


def test_unhealthy_and_down_show_in_telemetry(run: Run) -> None:
    tel = run.telemetry
    bad = tel.filter(~pl.col("healthy"))
    assert bad.height > 0 and bad["xid_errors"].sum() == 1
    down = run.inventory.filter(pl.col("health") == "down")
    assert down.height == 1
    back = run.inventory.filter(
        (pl.col("node") == down["node"][0]) & (pl.col("time") > down["time"][0])
    )["time"].min()
    silent = tel.filter(
        (pl.col("node") == down["node"][0])
        & (pl.col("time") >= down["time"][0])
        & (pl.col("time") < back)
    )
    assert silent.is_empty()


# --- telemetry semantics ------------------------------------------------------------


@pytest.fixture(scope="module")
def samples(run: Run, attempts: pl.DataFrame) -> pl.DataFrame:
    """Telemetry rows with activity and the allocation (if any) of their GPU."""
    tel = _activity(run.telemetry).select(
        "time", "node", "gpu_uuid", "act", "processes", "mem_used_mib", "mem_total_mib"
    )
    alloc = tel.join(attempts, on="gpu_uuid").filter(
        (pl.col("start") <= pl.col("time")) & (pl.col("end") > pl.col("time"))
    )
    return tel.join(
        alloc.group_by("gpu_uuid", "time").agg(
            pl.col("job_id").alias("alloc_jobs"), pl.col("fraction").sum()
        ),
        on=["gpu_uuid", "time"],
        how="left",
    )


def test_processes_are_attributed_to_the_allocated_job(samples: pl.DataFrame) -> None:
    procs = samples.explode("processes").unnest("processes")
    attributed = procs.filter(pl.col("job_id").is_not_null())
    assert attributed.height > 0
    assert attributed.select(pl.col("alloc_jobs").list.contains(pl.col("job_id")).all()).item()


def test_unscheduled_process_on_a_free_gpu(samples: pl.DataFrame) -> None:
    procs = samples.explode("processes").unnest("processes")
    outside = procs.filter(pl.col("pid").is_not_null() & pl.col("job_id").is_null())
    assert outside.height > 0
    assert outside["fraction"].null_count() == outside.height  # the GPU is not allocated
    assert outside["act"].mean() > 0.2  # type: ignore[operator]


def test_allocated_gpus_sometimes_have_no_process(samples: pl.DataFrame) -> None:
    allocated = samples.filter(pl.col("fraction").is_not_null())
    empty = allocated.filter(pl.col("processes").list.len() == 0)
    assert empty.height > 0
    assert empty["act"].max() <= 0.01  # type: ignore[operator]
    free = samples.filter(pl.col("fraction").is_null() & (pl.col("processes").list.len() == 0))
    assert free["act"].max() <= 0.02  # type: ignore[operator]
    assert free["mem_used_mib"].max() < 64  # type: ignore[operator]


def test_activity_follows_the_workload_profile(run: Run) -> None:
    rows = (
        _activity(run.telemetry)
        .filter(pl.col("processes").list.len() == 1)
        .select("act", "mem_used_mib", "mem_total_mib", pl.col("processes").list.first())
        .unnest("processes")
        .join(run.profiles, on="job_id")
    )
    means = dict(rows.group_by("profile").agg(pl.col("act").mean()).iter_rows())
    assert means["training"] > 0.7
    assert 0.15 < means["dataloader_bound"] < 0.5
    assert means["notebook"] < 0.05
    peak = rows.filter(pl.col("profile") == "oversized").select(
        (pl.col("mem_used_mib") / pl.col("mem_total_mib")).max()
    )
    assert peak.item() < 0.25


# --- files and the default cluster --------------------------------------------------


def test_write_jsonl(spec: ClusterSpec, tmp_path: Path) -> None:
    config = SimConfig(hours=0.25, seed=3, cluster=spec)
    counts = write_jsonl(simulate(config), tmp_path)
    batches = list(simulate(config))
    for t in RECORD_TYPES:
        lines = (tmp_path / f"{t}.jsonl").read_text().splitlines()
        assert len(lines) == counts[t] == sum(b[t].height for b in batches)
    tel = json.loads((tmp_path / "telemetry.jsonl").read_text().splitlines()[0])
    assert tel["time"] == "2026-01-05T00:00:00.000Z"
    assert isinstance(tel["processes"], list)
    inv = json.loads((tmp_path / "inventory.jsonl").read_text().splitlines()[0])
    assert isinstance(inv["labels"], dict) and inv["type"] == "inventory"


def test_default_config_first_chunk() -> None:
    config = SimConfig(hours=10 / 60)
    summary = describe(config)
    assert summary.total_gpus >= 512 and summary.batches == 1
    (batch,) = list(simulate(config))
    tel = batch["telemetry"]
    assert tel.height == summary.telemetry_rows
    assert tel.height > 0.95 * summary.total_gpus * 60  # a node may go down meanwhile
    running = batch["job"].filter(pl.col("event") == "started")["allocation"].list.len().sum()
    assert running > 0.6 * summary.total_gpus  # warmed up: the cluster is busy at once


def test_skipped_searches_change_no_decision(spec: ClusterSpec,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The scheduler skips a preemption or reservation search that already failed for the
    same job shape since the state last changed (it made long plans super-linear). The
    plan must be the one that full searches give, event for event."""
    from gpuledger.pipeline.simulate import scheduler

    class Remembering(set[tuple[object, ...]]):
        hits = 0

        def __contains__(self, shape: object) -> bool:
            found = super().__contains__(shape)
            Remembering.hits += found
            return found

    class Forgetful(set[tuple[object, ...]]):
        def __contains__(self, shape: object) -> bool:
            return False

    original = scheduler.Scheduler.__init__
    plans = {}
    for memo in (Remembering, Forgetful):
        def init(self: scheduler.Scheduler, *args: Any, memo: type = memo, **kw: Any) -> None:
            original(self, *args, **kw)
            self._no_room = memo()

        monkeypatch.setattr(scheduler.Scheduler, "__init__", init)
        plans[memo] = plan(SimConfig(hours=24, cluster=spec)).schedule
    assert Remembering.hits > 1000  # the saturated queue repeats shapes: searches skipped
    full, skipping = plans[Forgetful], plans[Remembering]
    assert skipping.events == full.events and len(full.events) > 100
    assert skipping.inventory == full.inventory
