"""The report's sections: a question, the SQL that answers it, and how to chart it.

The SQL reads the analyst views and macros of ``sql/20_analyst.sql`` (and the measures
of ``sql/10_measures.sql``); ``{since}`` / ``{until}`` become SQL literals (or NULL) and
``{top}`` the row limit.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True)
class Chart:
    """How to draw a section: ``bar`` (one group of bars per category row, one bar per
    series column; ``stacked`` piles them) or ``line`` (x = a time column, one line per
    value of ``group``, y = ``series[0]``)."""

    kind: str
    x: str
    series: tuple[str, ...]
    unit: str
    stacked: bool = False
    group: str | None = None


@dataclass(frozen=True)
class Section:
    key: str
    title: str
    question: str
    sql: str
    chart: Chart | None = None


SECTIONS: tuple[Section, ...] = (
    Section(
        "allocation", "Allocation vs use by pool and card type",
        "Allocated 95 % can hide used 30 %: how much of what is allocated is used?",
        """SELECT pool || ' / ' || card_type AS pool_card,
                  round(available_gpu_hours, 1) AS available,
                  round(allocated_gpu_hours, 1) AS allocated, round(used_gpu_hours, 1) AS used,
                  round(free_gpu_hours, 1) AS free,
                  round(100 * allocation_rate, 1) AS alloc_pct,
                  round(100 * utilisation_of_allocation, 1) AS used_of_alloc_pct
           FROM utilisation_by_pool ORDER BY pool, card_type""",
        Chart("bar", "pool_card", ("allocated", "used", "free"), "GPU-hours"),
    ),
    Section(
        "waste_team", "Idle and inefficient GPU-hours by team",
        "Where do idle (allocated, < 5 % active) and inefficient (< 30 %) GPU-hours come "
        "from? Idle is fixed by releasing and back-filling, inefficient by tuning the job.",
        """SELECT value AS team, round(idle_gpu_hours, 1) AS idle,
                  round(inefficient_gpu_hours, 1) AS inefficient,
                  round(waste_gpu_hours, 1) AS waste,
                  round(100 * share_of_idle, 1) AS idle_share_pct,
                  round(100 * utilisation_of_allocation, 1) AS used_of_alloc_pct
           FROM waste_sources_between(since := {since}, until := {until})
           WHERE dimension = 'team' AND value <> '(none)' ORDER BY waste DESC""",
        Chart("bar", "team", ("idle", "inefficient"), "GPU-hours", stacked=True),
    ),
    Section(
        "waste_job_type", "Idle and inefficient GPU-hours by job type and card type",
        "Which kinds of work and which cards hold the unused GPU-hours?",
        """SELECT dimension, value, round(idle_gpu_hours, 1) AS idle,
                  round(inefficient_gpu_hours, 1) AS inefficient, round(waste_gpu_hours, 1) AS waste
           FROM waste_sources_between(since := {since}, until := {until})
           WHERE dimension IN ('job_type', 'card_type') AND value <> '(none)'
           ORDER BY dimension, waste DESC""",
        Chart("bar", "value", ("idle", "inefficient"), "GPU-hours", stacked=True),
    ),
    Section(
        "top_jobs", "Top wasting jobs",
        "Which attempts hold the most allocated-but-unused GPU-hours?",
        """SELECT job_id, attempt, team, job_type, card_type, allocated_gpus AS gpus,
                  round(allocated_gpu_hours, 1) AS allocated, round(used_gpu_hours, 1) AS used,
                  round(waste_gpu_hours, 1) AS waste,
                  round(100 * utilisation_of_allocation, 1) AS used_of_alloc_pct, status
           FROM top_waste_jobs(n := {top})""",
    ),
    Section(
        "memory", "Who over-requests memory",
        "Jobs whose peak GPU memory stayed under 25 % of the memory they held, by team.",
        """SELECT team, jobs, oversized_jobs, round(100 * oversized_share, 1) AS oversized_pct,
                  round(oversized_gpu_hours, 1) AS oversized_gpu_hours
           FROM memory_overrequest_by_team ORDER BY oversized_gpu_hours DESC""",
        Chart("bar", "team", ("oversized_gpu_hours",), "GPU-hours"),
    ),
    Section(
        "blocked", "Pending jobs blocked by fragmentation",
        "Jobs that fitted in the free GPUs of their pool but on no single node, and for "
        "how long.",
        """SELECT job_id, attempt, team, queue, pool, card_type, gpus, blocked_minutes,
                  max_free_gpus, min_largest_free_block AS largest_block,
                  round(queue_wait_s / 60, 1) AS waited_min
           FROM blocked_jobs ORDER BY blocked_minutes DESC, job_id LIMIT {top}""",
    ),
    Section(
        "blocked_time", "Blocked demand over time",
        "Mean pending jobs blocked by fragmentation per hour, by pool and card type.",
        """SELECT bucket_start, pool || ' / ' || card_type AS pool_card,
                  round(mean_blocked_jobs, 2) AS blocked_jobs,
                  round(mean_frag_demand, 3) AS frag_demand
           FROM blocked_demand_over_time(bucket := INTERVAL 1 HOUR)
           ORDER BY bucket_start, pool_card""",
        Chart("line", "bucket_start", ("blocked_jobs",), "jobs", group="pool_card"),
    ),
    Section(
        "queue_wait", "Queue wait by queue",
        "How long does each queue wait before its jobs start (minutes)?",
        """SELECT queue, pool, attempts, round(p50_s / 60, 1) AS p50_min,
                  round(p90_s / 60, 1) AS p90_min, round(p99_s / 60, 1) AS p99_min,
                  round(max_s / 60, 1) AS max_min
           FROM queue_wait ORDER BY queue, pool""",
    ),
    Section(
        "queue_wait_time", "Queue wait over time (p90, minutes)",
        "The 90th percentile of queue wait per queue, by hour of start.",
        """SELECT bucket_start, queue, round(p90_s / 60, 2) AS p90_min, attempts
           FROM queue_wait_over_time(bucket := INTERVAL 1 HOUR) ORDER BY bucket_start, queue""",
        Chart("line", "bucket_start", ("p90_min",), "minutes", group="queue"),
    ),
    Section(
        "preemption", "Preemption: lost work",
        "The cost of a preemption is the work since the last checkpoint: who lost what?",
        """SELECT team, sum(preemptions) AS preemptions,
                  sum(preemptions) FILTER (WHERE borrowed) AS of_borrowed,
                  sum(preemptions) FILTER (WHERE NOT checkpointable) AS without_checkpoint,
                  round(sum(lost_gpu_hours), 2) AS lost_gpu_hours,
                  round(avg(mean_requeue_wait_s) / 60, 1) AS requeue_wait_min
           FROM preemption_lost_work(since := {since}, until := {until})
           GROUP BY team ORDER BY lost_gpu_hours DESC""",
        Chart("bar", "team", ("lost_gpu_hours",), "GPU-hours"),
    ),
    Section(
        "borrowing", "Borrowing and reclaim",
        "GPU-hours used over quota (borrowed), how many borrowed attempts were reclaimed "
        "and the work the reclaims lost.",
        """SELECT team, round(sum(allocated_gpu_hours), 1) AS allocated,
                  round(sum(borrowed_gpu_hours), 1) AS borrowed,
                  sum(borrowed_attempts) AS borrowed_attempts,
                  sum(reclaimed_attempts) AS reclaimed,
                  round(sum(reclaimed_lost_gpu_hours), 2) AS reclaim_lost_gpu_hours
           FROM borrowing_reclaim GROUP BY team ORDER BY borrowed DESC""",
        Chart("bar", "team", ("allocated", "borrowed"), "GPU-hours"),
    ),
    Section(
        "recommendations", "Recommendations",
        "What could each team win, by kind of recommendation (GPU-hours at stake)?",
        """SELECT team, kind, jobs, round(gpu_hours, 1) AS gpu_hours
           FROM team_recommendations ORDER BY gpu_hours DESC LIMIT {top}""",
    ),
)


def _literal(when: datetime | None) -> str:
    return "NULL" if when is None else f"TIMESTAMPTZ '{when.isoformat()}'"


def render_sql(section: Section, since: datetime | None, until: datetime | None,
               top: int) -> str:
    """The section's SQL with its parameters filled in."""
    return section.sql.format(since=_literal(since), until=_literal(until), top=int(top))
