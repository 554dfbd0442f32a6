"""Deterministic job generation: arrivals, sizes, durations and telemetry parameters.

Every workload of the :class:`~.cluster.ClusterSpec` is an independent arrival process
drawn from its own ``numpy`` generator (seeded by the simulation seed and the workload's
position), so the job list depends only on the seed and the spec:

- *Arrivals* are Poisson with ``arrivals_per_hour``; ``diurnal`` workloads are thinned
  with a working-day curve (busy 07:00–19:00 UTC, average rate unchanged);
  ``initial_jobs`` are submitted in the first minute of the warm-up (long-running
  services already deployed).
- *Size* is drawn from the ``gpus`` weights; a share ``fraction_share`` of single-GPU
  jobs asks for a fraction of one GPU instead.
- *Work* (run time without interruptions) is log-normal around ``median`` minutes.
- *Outcome*: a job fails (``fail_prob``) or is cancelled by its user
  (``cancel_prob``) after a uniform share of its work, else it finishes. Pending jobs
  lose patience after an exponential time (``pending_patience_minutes``).

Each job also carries the parameters of its telemetry profile (base activity, memory
need, saw-tooth period, phase); :mod:`.telemetry` turns them into samples.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from gpuledger.pipeline.simulate.cluster import ClusterSpec, Workload

MIB_PER_GIB = 1024.0
DAY_S = 86_400


@dataclass
class Job:
    """One job as submitted, with its hidden ground truth (work, outcome, profile)."""

    index: int
    job_id: str
    workload: str
    profile: str
    team: str
    user: str
    queue: str
    pool: str
    priority: int
    job_type: str
    gpus: int
    units: int  # quarters of a GPU per allocated GPU (4 = whole GPU)
    card_type: str | None
    gpu_mem_mib: float  # requested per GPU
    preemptible: bool
    checkpoint_s: int  # 0 = not checkpointable
    submit_s: int  # seconds since the simulation origin (start of warm-up)
    work_s: int  # run time needed to finish
    end_work_s: int  # work done when the job ends (< work_s when it fails or is cancelled)
    outcome: str  # "finished" | "failed" | "cancelled"
    patience_s: int | None  # pending time after which the user cancels
    # telemetry profile parameters
    base_activity: float
    mem_need_mib: float  # memory used per GPU in steady state
    period_s: float
    phase_s: float
    no_process_s: int  # process list empty for this long after each start

    @property
    def checkpointable(self) -> bool:
        """Whether the job writes checkpoints it can resume from."""
        return self.checkpoint_s > 0

    @property
    def fraction(self) -> float:
        """Share of each allocated GPU."""
        return self.units / 4.0

    @property
    def demand_units(self) -> int:
        """GPU quarters the job holds while running."""
        return self.gpus * self.units


# Per profile: (base activity range, memory-use share range, period range in seconds).
PROFILE_PARAMS: dict[str, tuple[tuple[float, float], tuple[float, float], tuple[float, float]]] = {
    "training": ((0.86, 0.95), (0.70, 0.95), (0.0, 0.0)),
    "finetune": ((0.72, 0.86), (0.50, 0.90), (0.0, 0.0)),
    "dataloader_bound": ((0.50, 0.65), (0.35, 0.70), (60.0, 150.0)),
    "notebook": ((0.30, 0.60), (0.08, 0.40), (0.0, 0.0)),
    "evaluation": ((0.70, 0.90), (0.30, 0.70), (300.0, 900.0)),
    "inference": ((0.45, 0.65), (0.45, 0.70), (0.0, 0.0)),
    "oversized": ((0.35, 0.60), (0.05, 0.18), (0.0, 0.0)),
    "memory_bound": ((0.15, 0.25), (0.50, 0.90), (0.0, 0.0)),
    "comm_bound": ((0.15, 0.25), (0.50, 0.90), (0.0, 0.0)),
}


def diurnal_factor(hour_of_day: np.ndarray) -> np.ndarray:
    """Working-day arrival curve, averaging 1 over a day (peak ~2.4 at 13:00 UTC)."""
    bump = np.clip(np.sin(np.pi * (hour_of_day - 7.0) / 12.0), 0.0, None)
    raw = 0.25 + 1.5 * bump
    mean = 0.25 + 1.5 * (12.0 / 24.0) * (2.0 / np.pi)
    return np.asarray(raw / mean, dtype=np.float64)


def generate_jobs(spec: ClusterSpec, *, seed: int, span_s: int, origin_day_s: int) -> list[Job]:
    """All jobs submitted in ``[0, span_s)`` seconds after the origin, sorted by submit time.

    ``origin_day_s`` is the origin's second of the (UTC) day, for diurnal workloads.
    Job ids are numbered in submit order, like a real scheduler's.
    """
    drafts: list[tuple[int, int, int, Job]] = []
    for w_index, workload in enumerate(spec.workloads):
        rng = np.random.default_rng([seed, 1, w_index])
        times = _arrivals(workload, rng, span_s, origin_day_s)
        for n, submit in enumerate(times.tolist()):
            job = _draw_job(spec, workload, rng, int(submit))
            drafts.append((int(submit), w_index, n, job))
    drafts.sort(key=lambda d: (d[0], d[1], d[2]))
    jobs: list[Job] = []
    for i, (_, _, _, job) in enumerate(drafts):
        job.index = i
        job.job_id = str(1_000_000 + i)
        jobs.append(job)
    return jobs


def _arrivals(
    workload: Workload, rng: np.random.Generator, span_s: int, origin_day_s: int
) -> np.ndarray:
    initial = np.sort(rng.integers(0, 60, size=workload.initial_jobs))
    rate_s = workload.arrivals_per_hour / 3600.0
    peak = 2.5 if workload.diurnal else 1.0
    count = int(rng.poisson(rate_s * peak * span_s))
    times = np.sort(rng.uniform(0.0, span_s, size=count))
    if workload.diurnal:
        hours = ((times + origin_day_s) % DAY_S) / 3600.0
        keep = rng.uniform(0.0, peak, size=count) < diurnal_factor(hours)
        times = times[keep]
    return np.concatenate([initial, np.floor(times).astype(np.int64)])


def _draw_job(spec: ClusterSpec, workload: Workload, rng: np.random.Generator, submit: int) -> Job:
    queue = spec.queue(workload.queue)
    team_name = workload.teams[int(rng.integers(len(workload.teams)))]
    team = next(t for t in spec.teams if t.name == team_name)
    user = f"{team.name}-u{int(rng.integers(team.users)):02d}"
    sizes = np.array(sorted(workload.gpus), dtype=np.int64)
    weights = np.array([workload.gpus[int(s)] for s in sizes], dtype=np.float64)
    gpus = int(rng.choice(sizes, p=weights / weights.sum()))
    units = 4
    if workload.fraction < 1.0 and gpus == 1 and rng.random() < workload.fraction_share:
        units = round(workload.fraction * 4)
    d = workload.duration
    minutes = float(
        np.clip(d.median * math.exp(d.sigma * rng.standard_normal()), d.minimum, d.maximum)
    )
    work_s = max(60, round(minutes * 60))
    u = rng.random()
    if u < workload.fail_prob:
        outcome = "failed"
    elif u < workload.fail_prob + workload.cancel_prob:
        outcome = "cancelled"
    else:
        outcome = "finished"
    end_share = rng.uniform(0.02, 0.95) if outcome != "finished" else 1.0
    end_work_s = max(30, round(work_s * end_share))
    patience: int | None = None
    if workload.pending_patience_minutes is not None:
        patience = max(60, round(rng.exponential(workload.pending_patience_minutes * 60)))
    (a_lo, a_hi), (m_lo, m_hi), (p_lo, p_hi) = PROFILE_PARAMS[workload.profile]
    base = float(rng.uniform(a_lo, a_hi))
    mem_share = float(rng.uniform(m_lo, m_hi))
    period = float(rng.uniform(p_lo, p_hi)) if p_hi > 0 else 0.0
    phase = float(rng.uniform(0.0, 3600.0))
    no_process_s = 0
    if rng.random() < workload.no_process_share:
        no_process_s = round(rng.uniform(10.0, 120.0) * 60)
    cards = [
        g
        for g in spec.node_groups
        if g.pool == queue.pool and workload.card_type in (None, g.card_type)
    ]
    share_mib = min(g.gpu_mem_mib for g in cards) * units / 4.0
    mem_need = share_mib * mem_share
    if workload.profile == "oversized":
        request = share_mib
    else:
        wanted = mem_need * rng.uniform(1.15, 1.6)
        request = min(share_mib, math.ceil(wanted / MIB_PER_GIB) * MIB_PER_GIB)
    return Job(
        index=-1,
        job_id="",
        workload=workload.name,
        profile=workload.profile,
        team=team.name,
        user=user,
        queue=queue.name,
        pool=queue.pool,
        priority=queue.priority,
        job_type=workload.job_type,
        gpus=gpus,
        units=units,
        card_type=workload.card_type,
        gpu_mem_mib=float(request),
        preemptible=queue.preemptible,
        checkpoint_s=round(workload.checkpoint_minutes * 60) if workload.checkpoint_minutes else 0,
        submit_s=submit,
        work_s=work_s,
        end_work_s=min(end_work_s, work_s),
        outcome=outcome,
        patience_s=patience,
        base_activity=base,
        mem_need_mib=float(mem_need),
        period_s=period,
        phase_s=phase,
        no_process_s=no_process_s,
    )
