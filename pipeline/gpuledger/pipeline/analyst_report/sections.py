"""The report's sections: a question, the SQL that answers it, its columns and its chart.

The SQL reads the views and macros of ``sql/10_measures.sql`` and ``sql/20_analyst.sql``
and returns raw values: no rounding in SQL, so that every number is formatted once, by
its column (:mod:`gpuledger.pipeline.analyst_report.numbers`). Placeholders:
``{since}`` / ``{until}`` become SQL time literals (or NULL), ``{limit}`` the most rows
a section reads, ``{bucket_minutes}`` the minutes of a time bucket of the charts, and
``WINDOW(column)`` the half-open window test on a time column.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta


@dataclass(frozen=True)
class Column:
    """One column of a section's table.

    ``decimals`` is None for text, 0 for counts; ``unit`` goes into the header;
    ``blank`` is what an empty (NULL) cell shows, and says why it is empty (``blank_when``:
    another reason, used when the named column of the row is zero or empty); ``key``
    columns (job ids) are never cut; ``terminal=False`` leaves the column out of the
    80-column terminal table (the HTML report has every column), ``sparse`` leaves it out
    there only when every value is zero or empty.
    """

    name: str
    header: str
    decimals: int | None = None
    unit: str = ""
    blank: str = "–"
    blank_when: tuple[str, str] | None = None
    key: bool = False
    terminal: bool = True
    sparse: bool = False

    @property
    def numeric(self) -> bool:
        return self.decimals is not None

    @property
    def title(self) -> str:
        return f"{self.header} ({self.unit})" if self.unit else self.header


@dataclass(frozen=True)
class Chart:
    """How to draw a section's rows.

    ``bar``: horizontal bars, one row of bars per value of ``category`` (one dimension),
    one bar per ``series`` column (``stacked`` piles them). ``line``: x = the time column
    ``category`` (buckets of ``{bucket_minutes}`` minutes, drawn at the bucket's middle), one
    line per value of ``group``, y = ``series[0]``. ``labels`` name the series in the
    legend.
    """

    kind: str
    category: str
    series: tuple[str, ...]
    unit: str
    labels: tuple[str, ...] = ()
    stacked: bool = False
    group: str | None = None
    sql: str | None = None
    """The chart's own SQL when it draws other rows than the table's."""


@dataclass(frozen=True)
class Section:
    key: str
    part: str
    """The seed's question the section belongs to (sections of one part share a heading)."""
    title: str
    question: str
    sql: str
    columns: tuple[Column, ...]
    chart: Chart | None = None
    notes: tuple[str, ...] = ()
    windowed: bool = True
    """False: the section covers all the data, whatever --since/--until say."""


GPU_H = "GPU-h"
SMALL_NODES = "nodes too small"
NOTHING_ALLOCATED = ("allocated", "nothing allocated")

CHART_BUCKETS: tuple[tuple[timedelta, int], ...] = (
    (timedelta(hours=3), 5), (timedelta(hours=12), 15), (timedelta(days=3), 60))
"""The time charts' bucket, in minutes, for data spanning up to each length; a day
beyond the last (under an hour of data, hourly buckets drew a single dot)."""
BUCKETS = ("5 minutes up to 3 hours of data, 15 up to 12 hours, an hour up to 3 days, a day "
           "beyond")


def bucket_minutes(span: timedelta | None) -> int:
    """The time charts' bucket, in minutes, for data spanning ``span``
    (:data:`CHART_BUCKETS`)."""
    if span is None:
        return 60
    return next((minutes for most, minutes in CHART_BUCKETS if span <= most), 1440)


PARTS = {
    "where": "Where do the GPUs go?",
    "waste": "Who wastes GPU-hours?",
    "wait": "Why do big jobs wait?",
    "memory": "Where is memory over-asked?",
    "preemption": "What did preemption cost?",
    "todo": "What to do",
}

RECOMMENDATION_NAMES = {
    "right_size_card": "run on a smaller card type",
    "right_size_memory": "ask for less GPU memory",
    "reduce_gpus": "ask for fewer GPUs",
    "improve_efficiency": "make the job more efficient",
    "release_idle": "release idle interactive GPUs",
    "preemption_candidate": "reclaim first when work waits",
    "backfill_candidate": "start now as back-fill",
}

_KIND_NAME = "CASE kind " + " ".join(
    f"WHEN '{k}' THEN '{v}'" for k, v in RECOMMENDATION_NAMES.items()) + " ELSE kind END"

SECTIONS: tuple[Section, ...] = (
    Section(
        "allocation", "where", "Allocation vs use by pool and card type",
        "Allocated 95 % can hide used 30 %: each pool's GPU-hours by state, and how much "
        "of what was allocated was used.",
        """SELECT pool || ' · ' || card_type AS gpu_group, pool, card_type,
                  sum(gpu_hours) AS capacity,
                  sum(gpu_hours - unavailable_gpu_hours) AS available,
                  sum(allocated_gpu_hours) AS allocated, sum(used_gpu_hours) AS used,
                  sum(allocated_busy_gpu_hours) AS busy,
                  sum(allocated_inefficient_gpu_hours) AS inefficient,
                  sum(allocated_idle_gpu_hours) AS idle,
                  sum(no_telemetry_gpu_hours) AS no_telemetry,
                  sum(free_gpu_hours) AS free,
                  sum(unaccounted_use_gpu_hours) AS unaccounted,
                  sum(unavailable_gpu_hours) AS unavailable,
                  100 * sum(allocated_gpu_hours) / nullif(available, 0) AS allocated_pct,
                  100 * sum(used_gpu_hours)
                      / nullif(sum(allocated_gpu_hours - no_telemetry_gpu_hours), 0) AS used_pct
           FROM gpu_hourly WHERE WINDOW(hour)
           GROUP BY pool, card_type ORDER BY pool, card_type""",
        (Column("pool", "Pool"), Column("card_type", "Card type"),
         Column("capacity", "Capacity", 1, GPU_H, terminal=False),
         Column("available", "Available", 1, GPU_H, terminal=False),
         Column("allocated", "Allocated", 1, GPU_H), Column("used", "Used", 1, GPU_H),
         Column("no_telemetry", "No telemetry", 1, GPU_H, sparse=True),
         Column("free", "Free", 1, GPU_H),
         Column("allocated_pct", "Allocated of available", 1, "%"),
         Column("used_pct", "Used of allocated", 1, "%", blank="no telemetry",
                blank_when=NOTHING_ALLOCATED)),
        Chart("bar", "gpu_group",
              ("busy", "inefficient", "idle", "no_telemetry", "free", "unaccounted",
               "unavailable"), "GPU-hours",
              labels=("allocated, busy (≥ 30 %)", "allocated, inefficient (5–30 %)",
                      "allocated, idle (< 5 %)", "allocated, no telemetry", "free",
                      "in use outside the scheduler", "unavailable"),
              stacked=True),
        notes=("Used of allocated counts only the allocated GPU-hours that telemetry "
               "observed; “no telemetry” there means none was (scheduler-only history): "
               "use is unknown, not zero, and never counted as waste.",),
    ),
    Section(
        "waste_team", "waste", "Idle and inefficient GPU-hours by team",
        "Idle (allocated, < 5 % active) is fixed by releasing GPUs and back-filling; "
        "inefficient (5–30 %) by fixing the job. Waste = allocated − used over the hours "
        "telemetry observed.",
        """SELECT value AS team, allocated_gpu_hours AS allocated, used_gpu_hours AS used,
                  idle_gpu_hours AS idle, inefficient_gpu_hours AS inefficient,
                  waste_gpu_hours AS waste, no_telemetry_gpu_hours AS no_telemetry,
                  100 * utilisation_of_allocation AS used_pct,
                  100 * share_of_idle AS idle_share_pct
           FROM waste_sources_between(since := {since}, until := {until})
           WHERE dimension = 'team' AND value <> '(none)'
           ORDER BY waste DESC, team""",
        (Column("team", "Team"), Column("allocated", "Allocated", 1, GPU_H),
         Column("idle", "Idle", 1, GPU_H), Column("inefficient", "Inefficient", 1, GPU_H),
         Column("waste", "Waste", 1, GPU_H),
         Column("no_telemetry", "No telemetry", 1, GPU_H, sparse=True),
         Column("used_pct", "Used of allocated", 1, "%", blank="no telemetry",
                blank_when=NOTHING_ALLOCATED),
         Column("idle_share_pct", "Share of fleet idle", 1, "%", terminal=False)),
        Chart("bar", "team", ("idle", "inefficient"), "GPU-hours",
              labels=("idle (< 5 % active)", "inefficient (5–30 %)"), stacked=True),
    ),
    Section(
        "waste_job_type", "waste", "Idle and inefficient GPU-hours by job type",
        "Which kinds of work hold the unused GPU-hours?",
        """SELECT value AS job_type, allocated_gpu_hours AS allocated,
                  idle_gpu_hours AS idle, inefficient_gpu_hours AS inefficient,
                  waste_gpu_hours AS waste, 100 * utilisation_of_allocation AS used_pct
           FROM waste_sources_between(since := {since}, until := {until})
           WHERE dimension = 'job_type' AND value <> '(none)'
           ORDER BY waste DESC, job_type""",
        (Column("job_type", "Job type"), Column("allocated", "Allocated", 1, GPU_H),
         Column("idle", "Idle", 1, GPU_H), Column("inefficient", "Inefficient", 1, GPU_H),
         Column("waste", "Waste", 1, GPU_H),
         Column("used_pct", "Used of allocated", 1, "%", blank="no telemetry",
                blank_when=NOTHING_ALLOCATED)),
        Chart("bar", "job_type", ("idle", "inefficient"), "GPU-hours",
              labels=("idle (< 5 % active)", "inefficient (5–30 %)"), stacked=True),
    ),
    Section(
        "top_jobs", "waste", "Top wasting jobs",
        "Which attempts held the most allocated-but-unused GPU-hours (running ones so far)?",
        """SELECT job_id, attempt,
                  job_id || CASE WHEN attempt > 0 THEN ' (attempt ' || attempt || ')'
                                 ELSE '' END AS job_label,
                  team, job_type, card_type, held_card_type,
                  allocated_gpus AS gpus, allocated_gpu_hours AS allocated,
                  waste_gpu_hours AS waste, 100 * utilisation_of_allocation AS used_pct,
                  status
           FROM attempts_between(since := {since}, until := {until})
           WHERE allocated_gpu_hours > 0
           ORDER BY waste_gpu_hours DESC NULLS LAST, job_id, attempt LIMIT {limit}""",
        (Column("job_id", "Job", key=True), Column("attempt", "Attempt", 0, terminal=False),
         Column("team", "Team"), Column("job_type", "Job type", terminal=False),
         Column("card_type", "Card asked", blank="any", terminal=False),
         Column("held_card_type", "Card held", blank="not observed"),
         Column("gpus", "GPUs", 0), Column("allocated", "Allocated", 1, GPU_H),
         Column("waste", "Waste", 1, GPU_H, blank="no telemetry"),
         Column("used_pct", "Used of allocated", 1, "%", blank="no telemetry"),
         Column("status", "Status", terminal=False)),
        Chart("bar", "job_label", ("waste",), "GPU-hours", labels=("waste",)),
        notes=("Card asked “any”: the job accepted any card type of its pool; Card held "
               "is the card it ran on.",),
    ),
    Section(
        "frag_time", "wait", "Fragmentation over time",
        "The share of free GPUs that cannot host a k-GPU single-node job (means per time "
        f"bucket: {BUCKETS}; over the pools whose nodes have at least k GPUs): "
        "8 GPUs can be free while no "
        "8-GPU job can start.",
        """SELECT pool, card_type, max(node_size) AS node_size,
                  avg(free_gpus) AS mean_free,
                  CASE WHEN max(node_size) >= 2 THEN 100 * avg(frag_2) END AS frag_2,
                  CASE WHEN max(node_size) >= 4 THEN 100 * avg(frag_4) END AS frag_4,
                  CASE WHEN max(node_size) >= 8 THEN 100 * avg(frag_8) END AS frag_8,
                  100 * avg(frag_node) AS frag_node,
                  sum(blocked_jobs) AS blocked_minutes
           FROM frag_minute WHERE WINDOW(minute)
           GROUP BY pool, card_type ORDER BY pool, card_type""",
        (Column("pool", "Pool"), Column("card_type", "Card type"),
         Column("node_size", "Node size", 0, "GPUs", terminal=False),
         Column("mean_free", "Free", 1, "GPUs, mean"),
         Column("frag_2", "frag(2)", 1, "%", blank=SMALL_NODES),
         Column("frag_4", "frag(4)", 1, "%", blank=SMALL_NODES),
         Column("frag_8", "frag(8)", 1, "%", blank=SMALL_NODES),
         Column("frag_node", "frag(node)", 1, "%", terminal=False),
         Column("blocked_minutes", "Blocked", 0, "job-min")),
        Chart("line", "bucket_start", ("frag",), "% of free GPUs", group="k",
              sql="""WITH m AS (SELECT * FROM frag_minute WHERE WINDOW(minute)),
                          k AS (SELECT unnest([2, 4, 8]) AS k)
                     SELECT time_bucket(INTERVAL {bucket_minutes} MINUTE, minute)
                              AS bucket_start,
                            'frag(' || k || ')' AS k,
                            100 * sum(free_gpus * CASE k WHEN 2 THEN frag_2 WHEN 4 THEN frag_4
                                                   ELSE frag_8 END)
                                / nullif(sum(free_gpus), 0) AS frag
                     FROM m, k WHERE node_size >= k
                     GROUP BY ALL HAVING sum(free_gpus) > 0 ORDER BY k, bucket_start"""),
        notes=("frag(k) = 1 − Σ k·⌊f/k⌋ / F over the nodes' free GPUs f (F = Σ f); "
               "frag(node) uses each node's own size (docs/metrics.md); “nodes too "
               "small”: no node of the pool has k GPUs, so no k-GPU job fits on one. Blocked: "
               "minutes × pending jobs that fitted in the free GPUs but on no node.",),
    ),
    Section(
        "wait_gpus", "wait", "Queue wait by job size",
        "Do bigger jobs wait longer? Queue wait of the attempts that started, by GPUs "
        "asked.",
        """SELECT gpus || CASE WHEN gpus = 1 THEN ' GPU' ELSE ' GPUs' END AS size, gpus,
                  attempts, mean_s / 60 AS mean_min, p50_s / 60 AS p50_min,
                  p90_s / 60 AS p90_min, max_s / 60 AS max_min
           FROM queue_wait_between(since := {since}, until := {until})
           WHERE level = 'gpus' ORDER BY gpus""",
        (Column("gpus", "GPUs", 0), Column("attempts", "Attempts", 0),
         Column("mean_min", "Mean", 1, "min"), Column("p50_min", "p50", 1, "min"),
         Column("p90_min", "p90", 1, "min"), Column("max_min", "Max", 1, "min")),
        Chart("bar", "size", ("p50_min", "p90_min"), "minutes", labels=("p50", "p90")),
        notes=("Percentiles interpolate between the two nearest waits (quantile_cont); "
               "queue_wait_by_gpus has nearest-rank ones beside them.",),
    ),
    Section(
        "wait_queue_size", "wait", "Queue wait by queue and job size",
        "The queues and sizes that wait longest (highest p90 first).",
        """SELECT queue, gpus, attempts, mean_s / 60 AS mean_min, p50_s / 60 AS p50_min,
                  p90_s / 60 AS p90_min, max_s / 60 AS max_min
           FROM queue_wait_between(since := {since}, until := {until})
           WHERE level = 'queue_gpus' ORDER BY p90_s DESC, queue, gpus""",
        (Column("queue", "Queue"), Column("gpus", "GPUs", 0),
         Column("attempts", "Attempts", 0), Column("mean_min", "Mean", 1, "min"),
         Column("p50_min", "p50", 1, "min"), Column("p90_min", "p90", 1, "min"),
         Column("max_min", "Max", 1, "min")),
    ),
    Section(
        "blocked_time", "wait", "Blocked demand over time",
        "Pending jobs that fitted in their pool's free GPUs but on no single node "
        f"(means per time bucket: {BUCKETS}).",
        """SELECT pool || ' · ' || card_type AS gpu_group, pool, card_type,
                  sum(blocked_jobs) AS blocked_minutes, max(blocked_jobs) AS max_blocked,
                  avg(blocked_gpus) AS mean_blocked_gpus
           FROM frag_minute WHERE WINDOW(minute)
           GROUP BY pool, card_type ORDER BY blocked_minutes DESC, pool, card_type""",
        (Column("pool", "Pool"), Column("card_type", "Card type"),
         Column("blocked_minutes", "Blocked", 0, "job-min"),
         Column("max_blocked", "Most blocked at once", 0, "jobs"),
         Column("mean_blocked_gpus", "Blocked GPUs", 1, "mean")),
        Chart("line", "bucket_start", ("blocked_jobs",), "jobs", group="gpu_group",
              sql="""SELECT time_bucket(INTERVAL {bucket_minutes} MINUTE, minute)
                                   AS bucket_start,
                            pool || ' · ' || card_type AS gpu_group,
                            avg(blocked_jobs) AS blocked_jobs
                     FROM frag_minute WHERE WINDOW(minute)
                     GROUP BY ALL ORDER BY gpu_group, bucket_start"""),
    ),
    Section(
        "blocked_jobs", "wait", "Jobs blocked by fragmentation",
        "Which pending jobs fitted in the free GPUs of their pool but on no node, and for "
        "how long?",
        """SELECT job_id, attempt, team, queue, pool, card_type, gpus, blocked_minutes,
                  max_free_gpus, min_largest_free_block, queue_wait_s / 60 AS waited_min
           FROM blocked_jobs_between(since := {since}, until := {until})
           ORDER BY blocked_minutes DESC, job_id, attempt LIMIT {limit}""",
        (Column("job_id", "Job", key=True), Column("attempt", "Attempt", 0, terminal=False),
         Column("team", "Team", terminal=False), Column("queue", "Queue"),
         Column("pool", "Pool", terminal=False),
         Column("card_type", "Card asked", blank="any", terminal=False),
         Column("gpus", "GPUs", 0), Column("blocked_minutes", "Blocked", 0, "min"),
         Column("max_free_gpus", "Most free in pool", 0, "GPUs"),
         Column("min_largest_free_block", "Largest free block", 0, "GPUs"),
         Column("waited_min", "Waited", 1, "min", blank="still pending")),
        notes=("Waited “still pending”: the job had not started when the data ends. "
               "Card asked “any”: any card type of its pool.",),
    ),
    Section(
        "memory", "memory", "Who over-requests memory",
        "Attempts whose peak GPU memory stayed under 25 % of the memory they held, by "
        "team, and the GPU-hours they held.",
        """SELECT team, count(*) AS attempts,
                  count(*) FILTER (WHERE mem_peak_mib < 0.25 * mem_held_mib) AS oversized,
                  100 * count(*) FILTER (WHERE mem_peak_mib < 0.25 * mem_held_mib)
                      / count(*) AS oversized_pct,
                  coalesce(sum(allocated_gpu_hours)
                           FILTER (WHERE mem_peak_mib < 0.25 * mem_held_mib), 0)
                      AS oversized_gpu_hours
           FROM attempts_between(since := {since}, until := {until})
           WHERE allocated_gpu_hours > 0 AND mem_peak_mib IS NOT NULL AND team IS NOT NULL
           GROUP BY team ORDER BY oversized_gpu_hours DESC, team""",
        (Column("team", "Team"), Column("attempts", "Attempts measured", 0),
         Column("oversized", "Over-sized", 0, "attempts"),
         Column("oversized_pct", "Over-sized share", 1, "%"),
         Column("oversized_gpu_hours", "Held by over-sized", 1, GPU_H)),
        Chart("bar", "team", ("oversized_gpu_hours",), "GPU-hours",
              labels=("held by over-sized attempts",)),
        notes=("Attempts measured: those that ran with GPU memory observed.",),
    ),
    Section(
        "preemption", "preemption", "Preemption: lost work",
        "The cost of a preemption is the work since the last checkpoint, × its GPUs: who "
        "lost what?",
        """SELECT p.team, count(*) AS preemptions,
                  count(*) FILTER (WHERE p.borrowed) AS of_borrowed,
                  count(*) FILTER (WHERE p.last_checkpoint_at IS NULL)
                      AS without_checkpoint,
                  sum(p.lost_gpu_hours) AS lost,
                  avg(p.requeue_wait_s) / 60 AS requeue_wait_min,
                  count(*) FILTER (WHERE n.status = 'pending') AS awaiting_restart
           FROM (SELECT * FROM preemption_audit WHERE WINDOW(time)) p
           LEFT JOIN attempts n ON n.job_id = p.job_id AND n.attempt = p.attempt + 1
           GROUP BY p.team ORDER BY lost DESC, p.team""",
        (Column("team", "Team"), Column("preemptions", "Preemptions", 0),
         Column("of_borrowed", "On borrowed GPUs", 0),
         Column("without_checkpoint", "Without checkpoint", 0),
         Column("lost", "Lost work", 2, GPU_H),
         Column("requeue_wait_min", "Requeue wait", 1, "min, mean",
                blank="not restarted yet",
                blank_when=("awaiting_restart", "never restarted"))),
        Chart("bar", "team", ("lost",), "GPU-hours", labels=("lost work",)),
        notes=("Without checkpoint: preemptions with no checkpoint in the attempt before "
               "them (they lost all of its work), whether the job could checkpoint or not.",
               "Requeue wait: the queue wait of the next attempt; when none has started, "
               "“not restarted yet” while a requeued attempt is pending, “never "
               "restarted” when none is (not requeued, or its next attempt ended "
               "before it started).",),
    ),
    Section(
        "borrowing", "preemption", "Borrowing and reclaim",
        "GPU-hours used over quota (borrowed), how many borrowed attempts were reclaimed, "
        "and the work the reclaims lost.",
        """SELECT team, sum(allocated_gpu_hours) AS allocated,
                  sum(borrowed_gpu_hours) AS borrowed,
                  sum(borrowed_attempts) AS borrowed_attempts,
                  sum(reclaimed_attempts) AS reclaimed,
                  sum(reclaimed_lost_gpu_hours) AS reclaim_lost
           FROM borrowing_reclaim GROUP BY team ORDER BY borrowed DESC, team""",
        (Column("team", "Team"), Column("allocated", "Allocated", 1, GPU_H),
         Column("borrowed", "Borrowed", 1, GPU_H),
         Column("borrowed_attempts", "Borrowed attempts", 0),
         Column("reclaimed", "Reclaimed", 0, "attempts"),
         Column("reclaim_lost", "Lost by reclaims", 2, GPU_H)),
        Chart("bar", "team", ("allocated", "borrowed"), "GPU-hours",
              labels=("allocated", "of it borrowed")),
        windowed=False,
    ),
    Section(
        "recommendations", "todo", "Recommendations",
        "What could each team win, by kind of recommendation (GPU-hours at stake in "
        "finished attempts)?",
        f"""SELECT team, {_KIND_NAME} AS action, count(*) AS jobs, sum(gpu_hours) AS gpu_hours
           FROM recommendations WHERE WINDOW(ended_at)
           GROUP BY team, kind ORDER BY gpu_hours DESC, team, action""",
        (Column("team", "Team"), Column("action", "Recommendation"),
         Column("jobs", "Attempts", 0), Column("gpu_hours", "At stake", 1, GPU_H)),
        Chart("bar", "action", ("gpu_hours",), "GPU-hours", labels=("at stake",),
              sql=f"""SELECT {_KIND_NAME} AS action, sum(gpu_hours) AS gpu_hours
                      FROM recommendations WHERE WINDOW(ended_at)
                      GROUP BY kind ORDER BY gpu_hours DESC"""),
        notes=("Each attempt's evidence and advice: SELECT * FROM recommendations "
               "(docs/analyst-guide.md).",),
    ),
)

_WINDOW = re.compile(r"WINDOW\((\w+)\)")


def _literal(when: datetime | None) -> str:
    return "NULL" if when is None else f"TIMESTAMPTZ '{when.isoformat()}'"


def fill(sql: str, since: datetime | None, until: datetime | None, limit: int,
         bucket_minutes: int = 60) -> str:
    """SQL with the window, the row limit and the time bucket filled in."""
    lo, hi = _literal(since), _literal(until)

    def window(m: re.Match[str]) -> str:
        col = m.group(1)
        return (f"({col} >= coalesce({lo}, '-infinity'::TIMESTAMPTZ) "
                f"AND {col} < coalesce({hi}, 'infinity'::TIMESTAMPTZ))")

    return _WINDOW.sub(window, sql).format(since=lo, until=hi, limit=int(limit),
                                           bucket_minutes=int(bucket_minutes))


def render_sql(section: Section, since: datetime | None, until: datetime | None,
               limit: int) -> str:
    """A section's table SQL with its parameters filled in."""
    return fill(section.sql, since, until, limit)
