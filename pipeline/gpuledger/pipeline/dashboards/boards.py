"""The four boards: fleet overview, team, job, queues and fragmentation.

Live panels query Prometheus (metric names: docs/prometheus.md, recording rules in
alerts/); history panels query the warehouse's DuckDB catalog through the
``motherduck-duckdb-datasource`` plugin (views: docs/warehouse.md, sql/20_analyst.sql).
Variables chain pool → card type → team → queue → job; table cells link fleet → team →
job, and queues → job.
"""

from __future__ import annotations

from gpuledger.pipeline.dashboards.model import (
    Board,
    Json,
    field_links,
    link,
    prom,
    prom_variable,
    sql,
    sql_variable,
)

FLEET, TEAM, JOB, QUEUES = "gpuledger-fleet", "gpuledger-team", "gpuledger-job", "gpuledger-queues"
UIDS = (FLEET, TEAM, JOB, QUEUES)

POOL_CARD = 'pool=~"$pool",card_type=~"$card_type"'
# job and queue series carry the card type the job asked for, "unknown" when any card of
# the pool will do: keep those under every card-type selection
JOB_POOL_CARD = 'pool=~"$pool",card_type=~"(${card_type})|unknown"'
IN_POOL_CARD = "pool IN (${pool:sqlstring}) AND card_type IN (${card_type:sqlstring})"
# jobs that asked for no card type (any card of the pool) have card_type NULL
JOB_IN_POOL_CARD = ("pool IN (${pool:sqlstring}) "
                    "AND (card_type IS NULL OR card_type IN (${card_type:sqlstring}))")
TEAM_LINK = [link("Team board", TEAM,
                  "var-team=${__data.fields.team}&${pool:queryparam}&${card_type:queryparam}")]
JOB_LINK = [link("Job board", JOB,
                 "var-job=${__data.fields.job_id}&${pool:queryparam}&${card_type:queryparam}")]
WIDE = {"tooltip": {"mode": "multi", "sort": "desc"},
        "legend": {"displayMode": "table", "placement": "right", "calcs": ["lastNotNull"]}}


def _pool_card_vars(source: str = "prometheus") -> list[Json]:
    if source == "prometheus":
        return [
            prom_variable("pool", "Pool", "label_values(gpuledger_available_gpus, pool)"),
            prom_variable("card_type", "Card type",
                          'label_values(gpuledger_available_gpus{pool=~"$pool"}, card_type)'),
        ]
    return [
        sql_variable("pool", "Pool", "SELECT DISTINCT pool FROM gpu_hourly "
                     "WHERE $__timeFilter(hour) AND pool IS NOT NULL ORDER BY 1"),
        sql_variable("card_type", "Card type", "SELECT DISTINCT card_type FROM gpu_hourly "
                     "WHERE $__timeFilter(hour) AND pool IN (${pool:sqlstring}) "
                     "AND card_type IS NOT NULL ORDER BY 1"),
    ]


def fleet() -> Board:
    b = Board(FLEET, "gpuledger · Fleet overview",
              "Capacity, GPU states, allocation vs use by pool and card type, "
              "fragmentation. Click a team to drill down.")
    b.variables = _pool_card_vars()
    b.row("Now")
    stats = [
        ("Capacity (available GPUs)", f"sum(gpuledger_available_gpus{{{POOL_CARD}}})", "none"),
        ("Allocated GPUs", f"sum(gpuledger_allocated_gpus{{{POOL_CARD}}})", "none"),
        ("Used (GPU-equivalents)", f"sum(gpuledger_used_gpus{{{POOL_CARD}}})", "none"),
        ("Allocation rate", f"sum(gpuledger_allocated_gpus{{{POOL_CARD}}}) / "
         f"sum(gpuledger_available_gpus{{{POOL_CARD}}})", "percentunit"),
        ("Used of allocated", f"sum(gpuledger_used_gpus{{{POOL_CARD}}}) / "
         f"sum(gpuledger_allocated_gpus{{{POOL_CARD}}})", "percentunit"),
        ("Free GPUs", f"sum(gpuledger_free_gpus{{{POOL_CARD}}})", "none"),
    ]
    for title, expr, unit in stats:
        b.add("stat", title, [prom(expr)], w=4, h=4, unit=unit, decimals=1)
    b.add("timeseries", "GPUs by state", [prom(
        f"sum by (state) (gpuledger_gpus{{{POOL_CARD}}})", "{{state}}")], unit="none",
        stacked=True, description="free = no job; allocated_idle < 5 % active; "
        "allocated_inefficient < 30 %; unaccounted_use = busy without a job.")
    b.add("timeseries", "Allocated vs used by pool and card type", [
        prom(f"sum by (pool, card_type) (gpuledger_allocated_gpus{{{POOL_CARD}}})",
             "{{pool}} / {{card_type}} allocated"),
        prom(f"sum by (pool, card_type) (gpuledger_used_gpus{{{POOL_CARD}}})",
             "{{pool}} / {{card_type}} used"),
    ], unit="none", options=WIDE)
    b.add("bargauge", "Used of allocated by pool and card type", [prom(
        f"sum by (pool, card_type) (gpuledger_used_gpus{{{POOL_CARD}}}) / "
        f"sum by (pool, card_type) (gpuledger_allocated_gpus{{{POOL_CARD}}})",
        "{{pool}} / {{card_type}}", instant=True)], unit="percentunit", minimum=0, maximum=1,
        options={"displayMode": "gradient", "orientation": "horizontal"})
    b.add("timeseries", "Fragmentation frag(k)", [prom(
        f'gpuledger_fragmentation_ratio{{{POOL_CARD},k=~"2|4|8|demand"}}',
        "{{pool}} / {{card_type}} k={{k}}")], unit="percentunit", minimum=0, maximum=1,
        description="Share of free GPUs that cannot host a k-GPU single-node job.",
        options=WIDE)
    b.add("timeseries", "Free GPUs, largest free block, blocked demand", [
        prom(f"gpuledger_free_gpus{{{POOL_CARD}}}", "{{pool}} / {{card_type}} free"),
        prom(f"gpuledger_largest_free_block_gpus{{{POOL_CARD}}}",
             "{{pool}} / {{card_type}} largest block"),
        prom(f"gpuledger_blocked_demand_gpus{{{POOL_CARD}}}",
             "{{pool}} / {{card_type}} blocked GPUs"),
    ], unit="none", options=WIDE)
    b.add("table", "Teams now (click a team)", [
        prom(f'sum by (team) (gpuledger_allocated_gpus{{{POOL_CARD},team!=""}})',
             instant=True, table=True),
        prom(f'sum by (team) (gpuledger_used_gpus{{{POOL_CARD},team!=""}})',
             instant=True, table=True),
    ], transformations=[
        {"id": "merge", "options": {}},
        {"id": "organize", "options": {"excludeByName": {"Time": True},
                                       "renameByName": {"Value #A": "allocated GPUs",
                                                        "Value #B": "used GPUs"}}},
    ], overrides=[field_links("team", TEAM_LINK)])
    b.row("Processor")
    b.add("timeseries", "Records in per second", [prom(
        "record_type:gpuledger_records:rate1m", "{{record_type}}")], w=8, unit="ops")
    b.add("timeseries", "Facts lag (wall clock − end of the latest closed minute)", [prom(
        "time() - gpuledger_closed_until_timestamp_seconds", "lag")], w=8, unit="s")
    b.add("timeseries", "Rejected and late records per second", [
        prom("sum(rate(gpuledger_rejected_records_total[$__rate_interval])) or vector(0)",
             "rejected (dead letters)"),
        prom("sum by (record_type) (rate(gpuledger_late_events_total[$__rate_interval]))",
             "{{record_type}} late"),
    ], w=8, unit="ops")
    b.row("History (warehouse)")
    b.add("timeseries", "Allocated, used, idle and inefficient GPU-hours per hour", [sql(
        f"""SELECT hour AS time, sum(allocated_gpu_hours) AS allocated,
                   sum(used_gpu_hours) AS used, sum(allocated_idle_gpu_hours) AS idle,
                   sum(allocated_inefficient_gpu_hours) AS inefficient,
                   sum(free_gpu_hours) AS free
            FROM gpu_hourly WHERE $__timeFilter(hour) AND {IN_POOL_CARD}
            GROUP BY 1 ORDER BY 1""", time_series=True)], unit="none")
    b.add("table", "Where idle and inefficient GPU-hours come from (click a team)", [sql(
        f"""SELECT team, sum(allocated_idle_gpu_hours) AS idle_gpu_hours,
                   sum(allocated_inefficient_gpu_hours) AS inefficient_gpu_hours,
                   sum(allocated_gpu_hours) - sum(used_gpu_hours) AS waste_gpu_hours,
                   sum(used_gpu_hours) / nullif(sum(allocated_gpu_hours), 0)
                       AS used_of_allocated
            FROM gpu_hourly WHERE $__timeFilter(hour) AND {IN_POOL_CARD}
              AND team IS NOT NULL
            GROUP BY team ORDER BY waste_gpu_hours DESC""")],
        decimals=1, overrides=[field_links("team", TEAM_LINK)])
    b.add("table", "Idle and inefficient GPU-hours by job type and card type", [sql(
        f"""SELECT job_type, card_type, sum(allocated_idle_gpu_hours) AS idle_gpu_hours,
                   sum(allocated_inefficient_gpu_hours) AS inefficient_gpu_hours
            FROM gpu_hourly WHERE $__timeFilter(hour) AND {IN_POOL_CARD}
              AND job_type IS NOT NULL
            GROUP BY ALL ORDER BY idle_gpu_hours + inefficient_gpu_hours DESC""")],
        decimals=1)
    b.add("timeseries", "Fragmentation over time (frag(8), demand-weighted)", [sql(
        f"""SELECT time_bucket(to_milliseconds($__interval_ms), minute) AS time,
                   pool || ' / ' || card_type AS pool_card,
                   avg(frag_8) AS frag_8, avg(frag_demand) AS frag_demand
            FROM frag_minute WHERE $__timeFilter(minute) AND {IN_POOL_CARD}
            GROUP BY ALL ORDER BY 1""", time_series=True)], unit="percentunit")
    return b


def _team_vars() -> list[Json]:
    return [
        *_pool_card_vars(),
        prom_variable("team", "Team", 'label_values(gpuledger_allocated_gpus'
                      f'{{{POOL_CARD},team!=""}}, team)'),
        prom_variable("queue", "Queue", 'label_values(gpuledger_allocated_gpus'
                      f'{{{POOL_CARD},team=~"$team"}}, queue)'),
    ]


def team() -> Board:
    b = Board(TEAM, "gpuledger · Team",
              "One team: allocation vs use, waste, borrowing, top jobs. Click a job to "
              "drill down.")
    b.variables = _team_vars()
    sel = f'{POOL_CARD},team=~"$team",queue=~"$queue"'
    job_sel = f'{JOB_POOL_CARD},team=~"$team",queue=~"$queue"'
    b.row("Now")
    b.add("stat", "Allocated GPUs", [prom(f"sum(gpuledger_allocated_gpus{{{sel}}})")],
          w=6, h=4, decimals=1)
    b.add("stat", "Used of allocated", [prom(
        f"sum(gpuledger_used_gpus{{{sel}}}) / sum(gpuledger_allocated_gpus{{{sel}}})")],
        w=6, h=4, unit="percentunit", decimals=1)
    b.add("stat", "Wasted GPUs now (allocated − used)", [prom(
        f"sum(gpuledger_allocated_gpus{{{sel}}}) - sum(gpuledger_used_gpus{{{sel}}})")],
        w=6, h=4, decimals=1)
    b.add("stat", "Pending GPUs", [prom(
        f"sum(gpuledger_queue_pending_gpus{{{job_sel}}}) or vector(0)")], w=6, h=4)
    b.add("timeseries", "Allocated vs used", [
        prom(f"sum by (team) (gpuledger_allocated_gpus{{{sel}}})", "{{team}} allocated"),
        prom(f"sum by (team) (gpuledger_used_gpus{{{sel}}})", "{{team}} used"),
    ], unit="none")
    b.add("timeseries", "GPUs by state", [prom(
        f'sum by (state) (gpuledger_gpus{{{POOL_CARD},team=~"$team"}})', "{{state}}")],
        stacked=True, unit="none")
    b.add("table", "Running jobs (click a job)", [prom(
        f"gpuledger_job_activity_ratio{{{job_sel}}}", instant=True, table=True)],
        w=24, transformations=[{"id": "organize", "options": {
            "excludeByName": {"Time": True, "__name__": True, "instance": True, "job": True},
            "renameByName": {"Value": "activity"}}}],
        overrides=[field_links("job_id", JOB_LINK)])
    b.row("History (warehouse)")
    team_in = "team IN (${team:sqlstring})"
    b.add("timeseries", "GPU-hours per hour: allocated, used, idle, inefficient", [sql(
        f"""SELECT hour AS time, sum(allocated_gpu_hours) AS allocated,
                   sum(used_gpu_hours) AS used, sum(allocated_idle_gpu_hours) AS idle,
                   sum(allocated_inefficient_gpu_hours) AS inefficient
            FROM gpu_hourly WHERE $__timeFilter(hour) AND {IN_POOL_CARD} AND {team_in}
              AND queue IN (${{queue:sqlstring}})
            GROUP BY 1 ORDER BY 1""", time_series=True)])
    b.add("table", "Borrowing and reclaim (attempts in range)", [sql(
        f"""SELECT team, pool, sum(allocated_gpu_hours) AS allocated_gpu_hours,
                   coalesce(sum(allocated_gpu_hours) FILTER (WHERE borrowed), 0)
                       AS borrowed_gpu_hours,
                   count(*) FILTER (WHERE borrowed) AS borrowed_attempts,
                   count(*) FILTER (WHERE borrowed AND end_event = 'preempted')
                       AS reclaimed_attempts
            FROM attempts WHERE {team_in} AND pool IN (${{pool:sqlstring}})
              AND started_at <= $__timeTo() AND coalesce(ended_at, now()) >= $__timeFrom()
            GROUP BY ALL ORDER BY borrowed_gpu_hours DESC""")], decimals=1,
        description="Borrowed = started over the team's guaranteed quota; reclaimed = a "
        "borrowed attempt that ended preempted.")
    b.add("table", "Top wasting jobs (click a job)", [sql(
        f"""SELECT job_id, attempt, queue, job_type, allocated_gpus, allocated_gpu_hours,
                   used_gpu_hours, waste_gpu_hours, utilisation_of_allocation, status
            FROM attempts WHERE {team_in} AND pool IN (${{pool:sqlstring}})
              AND queue IN (${{queue:sqlstring}}) AND allocated_gpu_hours > 0
              AND started_at <= $__timeTo() AND coalesce(ended_at, now()) >= $__timeFrom()
            ORDER BY waste_gpu_hours DESC LIMIT 20""")], decimals=2,
        overrides=[field_links("job_id", JOB_LINK)])
    b.add("table", "Memory over-requests (peak < 25 % of held)", [sql(
        f"""SELECT job_id, attempt, "user", held_mib, peak_mib, peak_of_held,
                   allocated_gpu_hours
            FROM memory_requests WHERE {team_in} AND pool IN (${{pool:sqlstring}})
              AND peak_of_held < 0.25
            ORDER BY allocated_gpu_hours DESC LIMIT 20""")], decimals=2,
        overrides=[field_links("job_id", JOB_LINK)])
    b.add("table", "Recommendations", [sql(
        f"""SELECT job_id, kind, gpu_hours, recommendation, evidence
            FROM recommendations WHERE {team_in} AND $__timeFilter(ended_at)
            ORDER BY gpu_hours DESC LIMIT 50""")], w=24, decimals=2,
        overrides=[field_links("job_id", JOB_LINK)])
    return b


def _job_vars() -> list[Json]:
    window = "started_at <= $__timeTo() AND coalesce(ended_at, now()) >= $__timeFrom()"
    return [
        *_pool_card_vars("duckdb"),
        sql_variable("team", "Team", f"""SELECT DISTINCT team FROM gpu_hourly
            WHERE $__timeFilter(hour) AND {IN_POOL_CARD} AND team IS NOT NULL ORDER BY 1"""),
        sql_variable("queue", "Queue", f"""SELECT DISTINCT queue FROM gpu_hourly
            WHERE $__timeFilter(hour) AND {IN_POOL_CARD} AND team IN (${{team:sqlstring}})
              AND queue IS NOT NULL ORDER BY 1"""),
        sql_variable("job", "Job", f"""SELECT job_id FROM attempts
            WHERE {JOB_IN_POOL_CARD} AND team IN (${{team:sqlstring}})
              AND queue IN (${{queue:sqlstring}})
              AND {window}
            GROUP BY job_id ORDER BY max(waste_gpu_hours) DESC NULLS LAST, job_id
            LIMIT 500""", multi=False),
    ]


def job() -> Board:
    b = Board(JOB, "gpuledger · Job",
              "One job: per-GPU activity and memory, state, attempts, recommendations.")
    b.variables = _job_vars()
    b.row("Attempts and advice (warehouse)")
    b.add("table", "Attempts", [sql(
        """SELECT attempt, status, team, "user", queue, pool, card_type, allocated_gpus,
                  submitted_at, started_at, ended_at, end_event, queue_wait_s,
                  allocated_gpu_hours, used_gpu_hours, utilisation_of_allocation,
                  mem_peak_mib, mem_held_mib, memory_oversized, lost_gpu_hours
           FROM attempts WHERE job_id = '${job}' ORDER BY attempt""")], w=24, h=6,
        decimals=2)
    b.add("table", "Recommendations", [sql(
        """SELECT attempt, kind, gpu_hours, recommendation, evidence
           FROM recommendations WHERE job_id = '${job}' ORDER BY gpu_hours DESC""")],
        h=6, decimals=2)
    b.add("table", "Per GPU (ended attempts)", [sql(
        """SELECT attempt, node, gpu_index, card_type, mean_activity, mem_peak_mib,
                  mem_held_mib, allocated_gpu_hours, idle_gpu_hours, inefficient_gpu_hours
           FROM job_gpu WHERE job_id = '${job}' ORDER BY attempt, node, gpu_index""")],
        h=6, decimals=2)
    b.row("Timelines (warehouse, closed hours)")
    b.add("timeseries", "Activity per GPU", [sql(
        """SELECT minute AS time, node || '/' || gpu_index AS gpu, activity
           FROM gpu_minute WHERE job_id = '${job}' AND $__timeFilter(minute)
           ORDER BY 1""", time_series=True)], unit="percentunit", minimum=0, maximum=1)
    b.add("timeseries", "Memory used per GPU", [sql(
        """SELECT minute AS time, node || '/' || gpu_index AS gpu,
                  mem_used_mib * 1048576 AS memory_used
           FROM gpu_minute WHERE job_id = '${job}' AND $__timeFilter(minute)
           ORDER BY 1""", time_series=True)], unit="bytes")
    b.add("state-timeline", "State per GPU", [sql(
        """SELECT minute AS time, node || '/' || gpu_index AS gpu, state
           FROM gpu_minute WHERE job_id = '${job}' AND $__timeFilter(minute)
           ORDER BY 1""", time_series=True)], w=24, h=6)
    b.add("timeseries", "PCIe and NVLink traffic (data bottlenecks show here)", [sql(
        """SELECT minute AS time, sum(pcie_rx_bytes_s) AS pcie_rx, sum(pcie_tx_bytes_s) AS pcie_tx,
                  sum(nvlink_rx_bytes_s) AS nvlink_rx, sum(nvlink_tx_bytes_s) AS nvlink_tx
           FROM gpu_minute WHERE job_id = '${job}' AND $__timeFilter(minute)
           GROUP BY 1 ORDER BY 1""", time_series=True)], w=24, unit="Bps")
    b.row("Live (running attempt)")
    jsel = 'job_id="$job"'
    b.add("timeseries", "Activity per GPU (live)", [prom(
        f"gpuledger_job_gpu_activity_ratio{{{jsel}}}", "{{node}}/{{gpu}}")],
        unit="percentunit", minimum=0, maximum=1)
    b.add("timeseries", "Memory used per GPU (live)", [prom(
        f"gpuledger_job_gpu_memory_used_bytes{{{jsel}}}", "{{node}}/{{gpu}}")], unit="bytes")
    b.add("stat", "Wasted GPU-hours so far", [prom(
        f"gpuledger_job_wasted_gpu_hours{{{jsel}}}")], w=6, h=4, decimals=1)
    b.add("stat", "Peak memory of held", [prom(
        f"gpuledger_job_memory_peak_bytes{{{jsel}}} / gpuledger_job_memory_held_bytes{{{jsel}}}"
    )], w=6, h=4, unit="percentunit", decimals=1)
    b.add("stat", "Runtime", [prom(f"gpuledger_job_runtime_seconds{{{jsel}}}")],
          w=6, h=4, unit="s")
    b.add("stat", "Allocated GPUs", [prom(f"gpuledger_job_allocated_gpus{{{jsel}}}")],
          w=6, h=4)
    return b


def queues() -> Board:
    b = Board(QUEUES, "gpuledger · Queues and fragmentation",
              "Queue wait percentiles, pending and blocked demand, fragmentation.")
    b.variables = [*_pool_card_vars(), prom_variable(
        "queue", "Queue", f"label_values(gpuledger_allocated_gpus{{{POOL_CARD}}}, queue)")]
    sel = f'{JOB_POOL_CARD},queue=~"$queue"'
    b.row("Now")
    b.add("timeseries", "Pending jobs by queue", [prom(
        f"sum by (queue) (gpuledger_queue_pending_jobs{{{sel}}})", "{{queue}}")], w=8)
    b.add("timeseries", "Pending GPUs by queue", [prom(
        f"sum by (queue) (gpuledger_queue_pending_gpus{{{sel}}})", "{{queue}}")], w=8)
    b.add("timeseries", "Oldest pending job's wait", [prom(
        f"max by (queue) (gpuledger_queue_oldest_pending_seconds{{{sel}}})", "{{queue}}")],
        w=8, unit="s")
    b.add("timeseries", "Queue wait p50 / p95 (since the processor started)", [
        prom(f"histogram_quantile(0.5, sum by (queue, le) "
             f"(gpuledger_queue_wait_seconds_bucket{{{sel}}}))", "{{queue}} p50"),
        prom(f"histogram_quantile(0.95, sum by (queue, le) "
             f"(gpuledger_queue_wait_seconds_bucket{{{sel}}}))", "{{queue}} p95"),
    ], unit="s", options=WIDE)
    b.add("timeseries", "Queue wait p50 / p95 over the last hour (all pools)", [
        prom('queue:gpuledger_queue_wait_seconds:p50_1h{queue=~"$queue"}', "{{queue}} p50"),
        prom('queue:gpuledger_queue_wait_seconds:p95_1h{queue=~"$queue"}', "{{queue}} p95"),
    ], unit="s", options=WIDE, description="Recording rules of alerts/ (rate over 1 h of "
        "the queue-wait histogram, by queue only).")
    b.add("timeseries", "Blocked by fragmentation (jobs that fit in the free GPUs, on no node)",
          [prom(f"sum by (queue) (gpuledger_queue_blocked_jobs{{{sel}}})", "{{queue}} jobs"),
           prom(f"sum by (pool, card_type) (gpuledger_blocked_demand_gpus{{{POOL_CARD}}})",
                "{{pool}} / {{card_type}} GPUs")], options=WIDE)
    b.add("timeseries", "Fragmentation frag(k) by pool and card type", [prom(
        f'gpuledger_fragmentation_ratio{{{POOL_CARD},k=~"1|2|4|8|node|demand"}}',
        "{{pool}} / {{card_type}} k={{k}}")], unit="percentunit", minimum=0, maximum=1,
        options=WIDE)
    b.add("table", "Pending jobs by queue, team and card type now", [prom(
        f"sum by (queue, team, pool, card_type) (gpuledger_queue_pending_jobs{{{sel}}})",
        instant=True, table=True)],
        transformations=[{"id": "organize", "options": {
            "excludeByName": {"Time": True}, "renameByName": {"Value": "pending jobs"}}}])
    b.row("History (warehouse)")
    q_in = "queue IN (${queue:sqlstring})"
    b.add("timeseries", "Queue wait p90 by queue (minutes, by start time)", [sql(
        f"""SELECT time_bucket(to_milliseconds(greatest($__interval_ms, 3600000)), started_at)
                       AS time, queue, quantile_cont(queue_wait_s, 0.9) / 60 AS p90_min
            FROM attempts WHERE $__timeFilter(started_at) AND {q_in}
              AND pool IN (${{pool:sqlstring}}) AND queue_wait_s IS NOT NULL
            GROUP BY ALL ORDER BY 1""", time_series=True)], unit="m")
    b.add("timeseries", "Pending GPUs by queue", [sql(
        f"""SELECT time_bucket(to_milliseconds($__interval_ms), minute) AS time, queue,
                   avg(pending_gpus) AS pending_gpus
            FROM (SELECT minute, queue, sum(pending_gpus) AS pending_gpus FROM pending_minute
                  WHERE $__timeFilter(minute) AND {q_in} AND {IN_POOL_CARD}
                  GROUP BY ALL)
            GROUP BY ALL ORDER BY 1""", time_series=True)])
    b.add("table", "Jobs blocked by fragmentation in range (click a job)", [sql(
        f"""SELECT job_id, attempt, team, queue, pool, card_type, gpus, blocked_minutes,
                   max_free_gpus, min_largest_free_block, first_blocked, started_at
            FROM blocked_jobs WHERE last_blocked >= $__timeFrom()
              AND first_blocked <= $__timeTo() AND {q_in} AND {JOB_IN_POOL_CARD}
            ORDER BY blocked_minutes DESC LIMIT 50""")], w=24,
        overrides=[field_links("job_id", JOB_LINK)])
    b.add("table", "Queue wait by queue and GPU count (started in range)", [sql(
        f"""SELECT queue, gpus, count(*) AS attempts,
                   quantile_cont(queue_wait_s, 0.5) AS p50_s,
                   quantile_cont(queue_wait_s, 0.9) AS p90_s, max(queue_wait_s) AS max_s
            FROM attempts WHERE $__timeFilter(started_at) AND {q_in}
              AND queue_wait_s IS NOT NULL
            GROUP BY ALL ORDER BY queue, gpus""")], w=24, decimals=0)
    return b


def board_links() -> list[Json]:
    """Links on every board to the others (time range and variables kept)."""
    return [{"title": "gpuledger boards", "type": "dashboards", "tags": ["gpuledger"],
             "asDropdown": True, "keepTime": True, "includeVars": True}]


def all_boards() -> dict[str, Json]:
    """Every board's JSON by uid."""
    return {b.uid: b.json(board_links()) for b in (fleet(), team(), job(), queues())}
