"""History → the simulator's scheduler → a replayed schedule; and the schedule as run.

**Jobs from attempts.** The attempts of a job become one scheduler job:

- submitted at its first attempt's queue time (the window start for jobs already there);
- its *work* is what it did: the run time of its last attempt plus, for earlier attempts
  of a checkpointable job, the work up to their last checkpoint (what a resume keeps);
- it ends as it ended (finished, failed or cancelled by its user) once that work is
  done; a job cancelled while pending is cancelled at the same time after submission if
  it is still pending then; a job still running at the window end keeps running in the
  replay (``censored``); a job that never ran gets the median work of finished jobs of
  its queue and size (``imputed``);
- checkpoint interval: its attempts' (last checkpoint − start) / checkpoints, else the
  policy file's ``scheduler.checkpoint_minutes``;
- jobs running at the window start stay on their GPUs (``pinned``); outages seen in the
  history (drains, nodes down, unhealthy GPUs) happen at the same times;
- its activity per allocated GPU-hour is what it showed (used / allocated), so used
  GPU-hours follow the allocation; a job that never ran takes its queue's median.

The replayed schedule and the schedule as run (``as_run``) have the same shape
(:class:`Run`), so one function computes the answers of both (:mod:`.answers`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import numpy as np
import polars as pl

from gpuledger.pipeline.advisor.fragment import TaskMix
from gpuledger.pipeline.advisor.history import History
from gpuledger.pipeline.advisor.placement import placement
from gpuledger.pipeline.advisor.policy import Policy, PolicySet
from gpuledger.pipeline.columns import TIME_DTYPE
from gpuledger.pipeline.simulate.cluster import ClusterSpec, NodeGroup, Queue, Team
from gpuledger.pipeline.simulate.layout import Layout
from gpuledger.pipeline.simulate.scheduler import (
    DOWN,
    DRAIN,
    GPU_FAIL,
    REPAIR,
    UNDRAIN,
    UP,
    WHOLE,
    Rules,
    Scheduler,
    Segments,
    _checkpoints_before,
)
from gpuledger.pipeline.simulate.workload import Job

CENSORED_S = 10**9  # work of a job still running at the window end: beyond any window
NO_TEAM = "(none)"

ATTEMPT_SCHEMA = pl.Schema({
    "job_id": pl.String(), "attempt": pl.Int64(), "team": pl.String(), "queue": pl.String(),
    "pool": pl.String(), "card_type": pl.String(), "job_type": pl.String(),
    "gpus": pl.Int64(), "fraction": pl.Float64(), "priority": pl.Int64(),
    "queued_at": TIME_DTYPE, "started_at": TIME_DTYPE, "ended_at": TIME_DTYPE,
    "end_event": pl.String(), "borrowed": pl.Boolean(), "lost_gpu_hours": pl.Float64(),
    "activity": pl.Float64(),
})
ALLOC_SCHEMA = pl.Schema({
    "job_id": pl.String(), "attempt": pl.Int64(), "node": pl.String(),
    "gpu_index": pl.Int64(), "fraction": pl.Float64(), "start": TIME_DTYPE, "end": TIME_DTYPE,
})


@dataclass
class Run:
    """A schedule: attempts (with queue and run times) and the GPUs they held."""

    policy: str
    attempts: pl.DataFrame
    allocations: pl.DataFrame
    notes: list[str] = field(default_factory=list)


@dataclass
class ReplayInput:
    """The scheduler's view of a history (built once, replayed under each policy)."""

    history: History
    layout: Layout
    jobs: list[Job]
    activity: np.ndarray  # per job: activity per allocated GPU-hour
    pinned: dict[int, list[int]]
    quotas: dict[str, dict[str, int]]
    quota_source: str
    mixes: dict[str, TaskMix]
    skipped: int = 0  # attempts of jobs whose pool has no node
    imputed: int = 0
    censored: int = 0  # jobs running at the window end (an attempt started, not ended)
    # pinned jobs' recorded queue and start times: they started before the window, so
    # their wait is not the replay's answer
    pinned_at: dict[int, tuple[datetime, datetime]] = field(default_factory=dict)


def layout_of(nodes: pl.DataFrame) -> Layout:
    """A scheduler layout for the history's nodes (sorted by name)."""
    nodes = nodes.sort("node")
    names = tuple(nodes["node"].to_list())
    gpus = nodes["gpus"].cast(pl.Int64).to_numpy()
    first = np.concatenate([[0], np.cumsum(gpus)[:-1]]).astype(np.int64)
    gpu_node = np.repeat(np.arange(len(names), dtype=np.int64), gpus)
    total = int(gpus.sum())
    nvlink = nodes["nvlink"].fill_null(False).to_list()
    zeros = np.zeros(total)
    return Layout(
        node_names=names, node_group=np.zeros(len(names), dtype=np.int64),
        node_pool=tuple(nodes["pool"].to_list()), node_card=tuple(nodes["card_type"].to_list()),
        node_gpus=gpus, node_first_gpu=first, node_labels=tuple("{}" for _ in names),
        node_nvlink_domain=tuple(None for _ in names),
        node_topology=tuple("nvlink" if v else "pcie" for v in nvlink),
        gpu_node=gpu_node, gpu_local=np.arange(total, dtype=np.int64) - first[gpu_node],
        gpu_uuid=tuple(str(i) for i in range(total)), gpu_mem_mib=zeros, gpu_tdp_w=zeros,
        gpu_idle_w=zeros, gpu_max_clock=zeros, gpu_idle_clock=zeros,
        gpu_dcgm=np.zeros(total, dtype=bool), gpu_nvlink=np.repeat(np.array(nvlink, bool), gpus),
    )


def _seconds(col: str, start: datetime) -> pl.Expr:
    return (pl.col(col) - pl.lit(start).cast(TIME_DTYPE)).dt.total_seconds()


def _infer_quotas(h: History, pools: set[str]) -> dict[str, dict[str, int]]:
    """Per team and pool: the most GPUs its attempts held at once within quota."""
    a = h.attempts.filter(pl.col("started_at").is_not_null() & ~pl.col("borrowed").fill_null(True))
    if a.is_empty():
        return {}
    held = pl.col("gpus").fill_null(1).cast(pl.Float64)
    ev = pl.concat([
        a.select(pl.col("team").fill_null(NO_TEAM), "pool", pl.col("started_at").alias("t"),
                 held.alias("d")),
        a.select(pl.col("team").fill_null(NO_TEAM), "pool",
                 pl.col("ended_at").fill_null(pl.lit(h.end).cast(TIME_DTYPE)).alias("t"),
                 (-held).alias("d")),
    ]).sort("t", "d")
    peak = ev.with_columns(pl.col("d").cum_sum().over("team", "pool").alias("use")).group_by(
        "team", "pool").agg(pl.col("use").max())
    out: dict[str, dict[str, int]] = {}
    for team, pool, use in peak.iter_rows():
        if pool in pools:
            out.setdefault(team, {})[pool] = math.ceil(use - 1e-9)
    return out


def prepare(h: History, policies: PolicySet) -> ReplayInput:
    """Turn the history into scheduler jobs (module docstring)."""
    start = h.start
    layout = layout_of(h.nodes)
    pools = set(layout.node_pool)
    gpu_of = {(layout.node_names[int(layout.gpu_node[g])], int(layout.gpu_local[g])): g
              for g in range(layout.gpu_count)}
    a = h.attempts.with_columns(
        pl.col("team").fill_null(NO_TEAM), pl.col("priority").fill_null(0),
        pl.col("gpus").fill_null(1), pl.col("preemptible").fill_null(False),
        pl.col("checkpointable").fill_null(False),
        _seconds("queued_at", start).alias("q"), _seconds("started_at", start).alias("s"),
        _seconds("ended_at", start).alias("e"),
        _seconds("last_checkpoint_at", start).alias("c"),
    ).sort("job_id", "attempt")
    skipped = a.filter(~pl.col("pool").is_in(list(pools))).height
    a = a.filter(pl.col("pool").is_in(list(pools)))
    frac = h.allocations.group_by("job_id").agg(pl.col("fraction").max().alias("frac"))
    a = a.join(frac, on="job_id", how="left")
    ckpt_min = policies.checkpoint_minutes
    # per attempt: work kept (checkpointable, not the last attempt) and run time
    a = a.with_columns(
        (pl.col("e").fill_null(h.span_s) - pl.col("s").clip(0)).alias("run"),
        pl.when(pl.col("checkpoints").fill_null(0) > 0).then(
            (pl.col("c") - pl.col("s").clip(0)) / pl.col("checkpoints")).alias("ckpt"),
        pl.col("attempt").rank("ordinal", descending=True).over("job_id").alias("_rev"),
    )
    jobs_df = a.group_by("job_id", maintain_order=True).agg(
        pl.col("team", "user", "queue", "pool", "priority", "job_type", "gpus", "card_type",
               "preemptible", "checkpointable", "frac").first(),
        pl.col("q").first().clip(0).alias("submit"),
        pl.col("s").first().alias("first_start"),
        pl.col("end_event").last(), pl.col("s").last().alias("last_start"),
        pl.col("e").last().alias("last_end"),
        pl.when(pl.col("_rev") > 1).then(
            pl.when(pl.col("checkpointable")).then(
                (pl.col("c") - pl.col("s").clip(0)).clip(0)).otherwise(0.0)
        ).otherwise(0.0).fill_null(0.0).sum().alias("kept"),
        pl.col("run").last(), pl.col("ckpt").median(),
        pl.col("used_gpu_hours").sum().alias("used"),
        pl.col("allocated_gpu_hours").sum().alias("alloc"),
        # an attempt of it runs at the window end (started before, not ended by then)
        ((pl.col("s") < h.span_s) & (pl.col("e").fill_null(math.inf) > h.span_s)).any()
        .alias("at_end"),
    )
    finished = jobs_df.filter((pl.col("end_event") == "finished")
                              & pl.col("last_start").is_not_null())
    done = finished.with_columns((pl.col("kept") + pl.col("run")).alias("w"))
    med = {k: float(v) for k, v in done.group_by("queue", "gpus").agg(pl.col("w").median())
           .select(pl.concat_str("queue", "gpus", separator="|"), "w").iter_rows()}
    med_q = {k: float(v) for k, v in done.group_by("queue").agg(pl.col("w").median()).iter_rows()}
    med_all = float(done.select(pl.col("w").median().fill_null(3600.0)).item()) if (
        not done.is_empty()) else 3600.0
    act_df = jobs_df.with_columns(
        pl.when(pl.col("alloc") > 0).then(pl.col("used") / pl.col("alloc")).alias("act"))
    act_q = {k: float(v) for k, v in act_df.group_by("queue").agg(
        pl.col("act").median()).drop_nulls().iter_rows()}
    pinned_rows = a.filter((pl.col("attempt") == pl.col("attempt").min().over("job_id"))
                           & (pl.col("s") <= 0))
    pinned_ids = set(pinned_rows["job_id"].to_list())
    alloc_by_job: dict[tuple[str, int], list[int]] = {}
    for job_id, attempt, node, gpu_index in h.allocations.select(
            "job_id", "attempt", "node", "gpu_index").iter_rows():
        g = gpu_of.get((node, gpu_index))
        if g is not None:
            alloc_by_job.setdefault((job_id, attempt), []).append(g)
    first_attempt = dict(pinned_rows.select("job_id", "attempt").iter_rows())
    recorded = {r[0]: (r[1], r[2]) for r in pinned_rows.select(
        "job_id", pl.coalesce("queued_at", "started_at"), "started_at").iter_rows()}
    pinned_at: dict[int, tuple[datetime, datetime]] = {}
    jobs: list[Job] = []
    activity: list[float] = []
    pinned: dict[int, list[int]] = {}
    imputed = censored = 0
    tasks: dict[str, list[tuple[int, int]]] = {}
    for r in jobs_df.iter_rows(named=True):
        units = max(1, min(WHOLE, round((r["frac"] or 1.0) * WHOLE)))
        gpus = int(r["gpus"]) if units == WHOLE else 1
        ended = r["end_event"]
        started = r["last_start"] is not None
        patience: int | None = None
        work: int
        censored += bool(r["at_end"])
        if started and r["last_end"] is None:
            work, outcome = CENSORED_S, "finished"
        elif started:
            work = round(r["kept"] + r["run"])
            outcome = ended if ended in ("finished", "failed", "cancelled") else "finished"
        else:
            key = f"{r['queue']}|{r['gpus']}"
            work = round(med.get(key, med_q.get(r["queue"], med_all)))
            outcome = "finished"
            imputed += 1
            if ended == "cancelled" and r["last_end"] is not None:
                patience = max(1, round(r["last_end"] - r["submit"]))
        ckpt = 0
        if r["checkpointable"]:
            ckpt = round(r["ckpt"] if r["ckpt"] else ckpt_min * 60)
        i = len(jobs)
        jobs.append(Job(
            index=i, job_id=r["job_id"], workload="history", profile="history",
            team=r["team"], user=r["user"] or "", queue=r["queue"] or "", pool=r["pool"],
            priority=int(r["priority"]), job_type=r["job_type"] or "", gpus=gpus, units=units,
            card_type=r["card_type"], gpu_mem_mib=0.0, preemptible=bool(r["preemptible"]),
            checkpoint_s=max(0, ckpt), submit_s=round(r["submit"]), work_s=max(1, work),
            end_work_s=max(1, work), outcome=outcome, patience_s=patience, base_activity=0.0,
            mem_need_mib=0.0, period_s=0.0, phase_s=0.0, no_process_s=0))
        act = (r["used"] / r["alloc"]) if r["alloc"] else act_q.get(r["queue"], 0.0)
        activity.append(float(act or 0.0))
        if r["job_id"] in pinned_ids:
            held = alloc_by_job.get((r["job_id"], first_attempt[r["job_id"]]), [])
            if len(held) == gpus:
                pinned[i] = sorted(held)
                pinned_at[i] = recorded[r["job_id"]]
                jobs[i].submit_s = 0
        tasks.setdefault(r["pool"], []).append((gpus, units))
    quotas = {t: dict(p) for t, p in policies.quotas.items()}
    source = "policy file"
    if quotas:
        source += _unquoted(jobs, quotas)
    else:
        quotas = _infer_quotas(h, pools)
        source = "inferred from the history (most GPUs held within quota at once)"
    mixes = {pool: TaskMix.of(t, WHOLE) for pool, t in tasks.items()}
    return ReplayInput(h, layout, jobs, np.array(activity), pinned, quotas, source, mixes,
                       skipped, imputed, censored, pinned_at)


def _unquoted(jobs: list[Job], quotas: dict[str, dict[str, int]]) -> str:
    """What the policy file's quotas leave out, said in the notes: a team (or a team's
    pool) with jobs and no quota has quota 0 there (its jobs start on borrowed GPUs only,
    and never under ``quota: fixed``)."""
    teams = sorted({j.team for j in jobs} - set(quotas))
    pools: dict[str, set[str]] = {}
    for j in jobs:
        if j.team in quotas and j.pool not in quotas[j.team]:
            pools.setdefault(j.team, set()).add(j.pool)
    parts = [f"team(s) {', '.join(teams)}"] if teams else []
    parts += [f"team {t} in pool(s) {', '.join(sorted(p))}" for t, p in sorted(pools.items())]
    if not parts:
        return ""
    return (f"; none there, so 0 GPUs, for {'; '.join(parts)} (their jobs start on "
            "borrowed GPUs only, and under quota: fixed not at all)")


def _spec(inp: ReplayInput, policies: PolicySet) -> ClusterSpec:
    lay = inp.layout
    groups: dict[tuple[str, str, int], int] = {}
    for pool, card, n in zip(lay.node_pool, lay.node_card, lay.node_gpus.tolist(), strict=True):
        groups[(pool, card, n)] = groups.get((pool, card, n), 0) + 1
    node_groups = tuple(NodeGroup(f"g{i}", pool, card, count, n, 1.0)
                        for i, ((pool, card, n), count) in enumerate(sorted(groups.items())))
    teams = sorted({j.team for j in inp.jobs} | set(inp.quotas))
    return ClusterSpec(
        name="replay", node_groups=node_groups,
        teams=tuple(Team(t, 1, dict(inp.quotas.get(t, {}))) for t in teams),
        queues=tuple(Queue(q, p, 0) for q, p in sorted({(j.queue, j.pool) for j in inp.jobs})),
        workloads=(), warmup_hours=0.0, schedule_interval_s=policies.schedule_interval_s,
        reserve_after_minutes=policies.reserve_after_minutes)


def _moved(inp: ReplayInput, policy: Policy) -> tuple[list[Job], list[str]]:
    """The jobs with the policy's card pools applied (jobs that fit nowhere stay put)."""
    if not policy.card_pools:
        return inp.jobs, []
    lay = inp.layout
    notes: list[str] = []
    out: list[Job] = []
    stuck = 0
    for job in inp.jobs:
        target = policy.card_pools.get(job.job_type)
        if target is None:
            out.append(job)
            continue
        sizes = [int(n) for p, c, n in zip(lay.node_pool, lay.node_card, lay.node_gpus, strict=True)
                 if p == target.pool and target.card_type in (None, c)]
        if not sizes:
            raise ValueError(f"policies.{policy.name}.card_pools.{job.job_type}: no "
                             f"{target.card_type or 'GPU'} nodes in pool {target.pool!r}")
        # one node, or whole nodes of one size, as many as the pool has (the count was
        # not checked: 8-GPU jobs sent to a pool of two 2-GPU nodes never started, in
        # silence)
        fits = job.gpus <= max(sizes) or any(
            job.gpus % n == 0 and job.gpus // n <= sizes.count(n) for n in set(sizes))
        if not fits:
            stuck += 1
            out.append(job)
            continue
        moved = Job(**{**job.__dict__, "pool": target.pool, "card_type": target.card_type})
        out.append(moved)
    if stuck:
        notes.append(f"{stuck} job(s) fit no node of their new pool and stayed in their own")
    return out, notes


def replay(inp: ReplayInput, policy: Policy, policies: PolicySet) -> Run:
    """Run the scheduler over the history's jobs under ``policy``."""
    h = inp.history
    jobs, notes = _moved(inp, policy)
    rules = Rules(
        placement=placement(policy.placement, inp.mixes), borrow=policy.quota == "borrow",
        reclaim=policy.reclaim, preempt_priority=policy.preempt_priority,
        checkpointable_victims_only=policy.checkpointable_only, backfill=policy.backfill)
    sched = Scheduler(_spec(inp, policies), inp.layout, jobs, seed=0, start_s=0,
                      end_s=h.span_s, rules=rules, pinned=inp.pinned)
    _add_outages(sched, inp)
    result = sched.run()
    return _run_of(policy.name, inp, jobs, sched, result.segments, notes)


def _add_outages(sched: Scheduler, inp: ReplayInput) -> None:
    lay = inp.layout
    node_of = {n: i for i, n in enumerate(lay.node_names)}
    kinds = {"drain": (DRAIN, UNDRAIN), "down": (DOWN, UP), "gpu": (GPU_FAIL, REPAIR)}
    span = inp.history.span_s
    for node, gpu_index, kind, t0, t1 in inp.history.outages.with_columns(
            _seconds("start", inp.history.start).alias("start"),
            _seconds("end", inp.history.start).alias("end")).iter_rows():
        n = node_of.get(node)
        if n is None:
            continue
        begin, finish = kinds[kind]
        target = n if gpu_index is None else int(lay.node_first_gpu[n]) + int(gpu_index)
        sched.add_fault(max(0, int(t0)), begin, target)
        if t1 < span:
            sched.add_fault(int(t1), finish, target)


def _run_of(name: str, inp: ReplayInput, jobs: list[Job], sched: Scheduler,
            seg: Segments, notes: list[str]) -> Run:
    start = inp.history.start
    rows: list[dict[str, object]] = []
    open_row: dict[int, dict[str, object]] = {}
    queued: dict[int, int] = {}
    attempt: dict[int, int] = {}
    rowed: set[tuple[int, int]] = set()

    def at(t: int) -> datetime:
        return start + timedelta(seconds=t)

    def row(j: int, q: int) -> dict[str, object]:
        job = jobs[j]
        rowed.add((j, attempt.get(j, 0)))
        return {"job_id": job.job_id, "attempt": attempt.get(j, 0), "team": job.team,
                "queue": job.queue, "pool": job.pool, "card_type": job.card_type,
                "job_type": job.job_type, "gpus": job.gpus, "fraction": job.units / WHOLE,
                "priority": job.priority, "queued_at": at(q), "started_at": None,
                "ended_at": None, "end_event": None, "borrowed": None, "lost_gpu_hours": 0.0,
                "activity": float(inp.activity[j])}

    for e in sorted(sched.log, key=lambda e: (e.time_s, e.order)):
        j, t = e.job, e.time_s
        if e.event == "submitted":
            queued[j] = t
        elif e.event == "started":
            r = row(j, queued.get(j, t))
            r["started_at"], r["borrowed"] = at(t), bool(e.borrowed)
            if t == 0 and j in inp.pinned_at and attempt.get(j, 0) == 0:
                r["queued_at"], r["started_at"] = inp.pinned_at[j]
            r["_start"] = t
            open_row[j] = r
            rows.append(r)
        elif e.event == "preempted":
            r = open_row.pop(j)
            r["ended_at"], r["end_event"] = at(t), "preempted"
            job = jobs[j]
            s = int(r.pop("_start"))  # type: ignore[call-overload]
            kept = (_checkpoints_before(s, t, job.checkpoint_s) * job.checkpoint_s
                    if job.checkpoint_s else 0)
            r["lost_gpu_hours"] = job.gpus * job.units / WHOLE * (t - s - kept) / 3600.0
        elif e.event == "requeued":
            attempt[j] = attempt.get(j, 0) + 1
            queued[j] = t
        elif e.event in ("finished", "failed", "cancelled"):
            r_open = open_row.pop(j, None)
            if r_open is None:
                r_open = row(j, queued.get(j, t))
                rows.append(r_open)
            r_open["ended_at"], r_open["end_event"] = at(t), e.event
    for j, q in queued.items():
        if (j, attempt.get(j, 0)) not in rowed:
            rows.append(row(j, q))
    for r in rows:
        r.pop("_start", None)
    attempts = pl.DataFrame(rows, schema=ATTEMPT_SCHEMA, orient="row") if rows else (
        pl.DataFrame(schema=ATTEMPT_SCHEMA))
    lay = inp.layout
    keep = seg.job >= 0
    gpu = seg.gpu[keep]
    allocs = pl.DataFrame({
        "job_id": [jobs[int(j)].job_id for j in seg.job[keep]],
        "attempt": seg.attempt[keep] - 1,
        "node": [lay.node_names[int(lay.gpu_node[g])] for g in gpu],
        "gpu_index": lay.gpu_local[gpu],
        "fraction": seg.units[keep] / WHOLE,
        "start": seg.start_s[keep],
        "end": seg.end_s[keep],
    }).with_columns(
        *[(pl.lit(start).cast(TIME_DTYPE) + pl.duration(seconds=pl.col(c))).alias(c)
          for c in ("start", "end")]
    ).select(ALLOC_SCHEMA.names()).cast(dict(ALLOC_SCHEMA))  # type: ignore[arg-type]
    return Run(name, attempts.sort("job_id", "attempt"), allocs, notes)


def as_run(h: History) -> Run:
    """The schedule as the history recorded it (the identity replay)."""
    a = h.attempts
    end = pl.lit(h.end).cast(TIME_DTYPE)
    attempts = a.with_columns(
        pl.col("team").fill_null(NO_TEAM), pl.col("gpus").fill_null(1),
        pl.col("priority").fill_null(0),
        pl.when(pl.col("allocated_gpu_hours") > 0).then(
            pl.col("used_gpu_hours") / pl.col("allocated_gpu_hours")).otherwise(0.0)
        .alias("activity"),
        pl.col("lost_gpu_hours").fill_null(0.0),
    ).join(h.allocations.group_by("job_id", "attempt").agg(pl.col("fraction").max()),
           on=["job_id", "attempt"], how="left").with_columns(
        pl.col("fraction").fill_null(1.0))
    attempts = attempts.select(
        [pl.col(c).cast(t) for c, t in ATTEMPT_SCHEMA.items()]).sort("job_id", "attempt")
    allocs = h.allocations.join(
        attempts.select("job_id", "attempt", "started_at", "ended_at"),
        on=["job_id", "attempt"], how="inner",
    ).filter(pl.col("started_at").is_not_null()).select(
        "job_id", "attempt", "node", "gpu_index", "fraction",
        pl.col("started_at").alias("start"),
        pl.col("ended_at").fill_null(end).alias("end"),
    ).cast(dict(ALLOC_SCHEMA))  # type: ignore[arg-type]
    return Run("observed", attempts, allocs)
