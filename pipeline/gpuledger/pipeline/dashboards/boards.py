"""The four boards: fleet overview, team, job, queues and fragmentation.

Live panels query Prometheus (metric names: docs/prometheus.md, recording rules in
alerts/); history panels query the warehouse's DuckDB catalog through the
``motherduck-duckdb-datasource`` plugin (views: docs/warehouse.md, sql/20_analyst.sql).

One drill chain on every board, as far as the board has the dimension: pool → team →
card type (→ queue → job). Each variable's query is filtered by the ones before it. The
fleet board's variables come from Prometheus (it works without the DuckDB plugin); the
team, queues and job boards' from the warehouse over the time range, so that a team that
holds no GPU now can still be chosen for its history.

Card type: fleet series and facts carry the physical card (``card_type``); job and
queue series carry the card the job asked for (``requested_card_type``, ``any`` when any
card of its pool will do), and so do the job-side tables (``card_type`` NULL). A job
that asked for any card counts under every card-type selection of its pool.

Every panel has a unit; SQL variables go into SQL through Grafana's ``sqlstring``
format only (quoted, quotes doubled).
"""

from __future__ import annotations

from grafana_foundation_sdk.builders import bargauge, stat, statetimeline, table, timeseries
from grafana_foundation_sdk.builders import dashboard as dash
from grafana_foundation_sdk.models import dashboard as dm

from gpuledger.pipeline.advisor.wiring import job_board_panel
from gpuledger.pipeline.dashboards.builders import (
    Board,
    Json,
    gradient_bars,
    link,
    links_on,
    prom,
    prom_variable,
    sql,
    sql_variable,
    stacked,
    transform,
    unit_of,
    wide,
)

FLEET, TEAM, JOB, QUEUES = "gpuledger-fleet", "gpuledger-team", "gpuledger-job", "gpuledger-queues"
UIDS = (FLEET, TEAM, JOB, QUEUES)

GPU_H = "suffix: GPU-h"  # GPU-hours (no such unit in Grafana)
GPUS = "suffix: GPUs"
JOBS = "suffix: jobs"

POOL_CARD = 'pool=~"$pool",card_type=~"$card_type"'
# allocation series: a team; free GPUs carry team "" and stay under every team selection
POOL_TEAM_CARD = 'pool=~"$pool",team=~"${team}|",card_type=~"$card_type"'
# job and queue series carry the card type the job asked for, "any" when any card of the
# pool will do: those count under every card-type selection
JOB_POOL_CARD = 'pool=~"$pool",requested_card_type=~"(${card_type})|any"'
IN_POOL = "pool IN (${pool:sqlstring})"
IN_POOL_CARD = f"{IN_POOL} AND card_type IN (${{card_type:sqlstring}})"
# job-side tables: card_type is what the job asked for, NULL for any card of the pool
JOB_IN_POOL_CARD = f"{IN_POOL} AND (card_type IS NULL OR card_type IN (${{card_type:sqlstring}}))"
IN_TEAM = "team IN (${team:sqlstring})"
IN_QUEUE = "queue IN (${queue:sqlstring})"
CHAIN = "&${pool:queryparam}&${team:queryparam}&${card_type:queryparam}"
TEAM_LINK = [link("Team board", TEAM,
                  "var-team=${__data.fields.team}&${pool:queryparam}&${card_type:queryparam}")]
JOB_LINK = [link("Job board", JOB, "var-job=${__data.fields.job_id}" + CHAIN)]


def _prom_vars() -> list[dash.QueryVariable]:
    """pool → team → card type, from Prometheus (the live fleet board)."""
    return [
        prom_variable("pool", "Pool", "label_values(gpuledger_available_gpus, pool)"),
        prom_variable("team", "Team", 'label_values(gpuledger_allocated_gpus{pool=~"$pool"}, '
                      "team)"),
        prom_variable("card_type", "Card type",
                      'label_values(gpuledger_gpus{pool=~"$pool",team=~"${team}|"}, card_type)'),
    ]


def _warehouse_vars(queue: bool = True) -> list[dash.QueryVariable]:
    """pool → team → card type (→ queue), from the warehouse over the time range."""
    hourly = "FROM gpu_hourly WHERE $__timeFilter(hour)"
    out = [
        sql_variable("pool", "Pool", f"SELECT DISTINCT pool {hourly} AND pool IS NOT NULL "
                     "ORDER BY 1"),
        sql_variable("team", "Team", f"SELECT DISTINCT team {hourly} AND {IN_POOL} "
                     "AND team IS NOT NULL ORDER BY 1"),
        sql_variable("card_type", "Card type", f"SELECT DISTINCT card_type {hourly} "
                     f"AND {IN_POOL} AND (team IS NULL OR {IN_TEAM}) AND card_type IS NOT NULL "
                     "ORDER BY 1"),
    ]
    if queue:
        out.append(sql_variable("queue", "Queue", f"SELECT DISTINCT queue {hourly} "
                                f"AND {IN_POOL_CARD} AND {IN_TEAM} AND queue IS NOT NULL "
                                "ORDER BY 1"))
    return out


def fleet() -> Board:
    b = Board(FLEET, "gpuledger · Fleet overview",
              "Capacity, GPU states, allocation vs use by pool, team and card type, "
              "fragmentation. Click a team to drill down.")
    b.variables = _prom_vars()
    sel = POOL_TEAM_CARD
    b.row("Now")
    stats = [
        ("Capacity (available GPUs)", f"sum(gpuledger_available_gpus{{{POOL_CARD}}})", GPUS),
        ("Allocated GPUs", f"sum(gpuledger_allocated_gpus{{{sel}}})", GPUS),
        ("Used (GPU-equivalents)", f"sum(gpuledger_used_gpus{{{sel}}})", GPUS),
        ("Allocation rate (all teams)", f"sum(gpuledger_allocated_gpus{{{POOL_CARD}}}) / "
         f"sum(gpuledger_available_gpus{{{POOL_CARD}}})", "percentunit"),
        ("Used of allocated", f"sum(gpuledger_used_gpus{{{sel}}}) / "
         f"sum(gpuledger_allocated_gpus{{{sel}}})", "percentunit"),
        ("Free GPUs", f"sum(gpuledger_free_gpus{{{POOL_CARD}}})", GPUS),
    ]
    for title, expr, unit in stats:
        b.add(stat.Panel().decimals(1), title, [prom(expr)], unit, w=4, h=4)
    b.add(stacked(timeseries.Panel()), "GPUs by state", [prom(
        f"sum by (state) (gpuledger_gpus{{{sel}}})", "{{state}}")], GPUS,
        description="free = no job; allocated_idle < 5 % active; allocated_inefficient "
        "< 30 %; unaccounted_use = busy without a job. With a team selected: its GPUs and "
        "the free ones.")
    b.add(wide(timeseries.Panel()), "Allocated vs used by pool, team and card type", [
        prom(f"sum by (pool, team, card_type) (gpuledger_allocated_gpus{{{sel}}})",
             "{{pool}} / {{team}} / {{card_type}} allocated"),
        prom(f"sum by (pool, team, card_type) (gpuledger_used_gpus{{{sel}}})",
             "{{pool}} / {{team}} / {{card_type}} used"),
    ], GPUS)
    b.add(gradient_bars(bargauge.Panel().min(0).max(1)),
          "Used of allocated by pool and card type", [prom(
              f"sum by (pool, card_type) (gpuledger_used_gpus{{{sel}}}) / "
              f"sum by (pool, card_type) (gpuledger_allocated_gpus{{{sel}}})",
              "{{pool}} / {{card_type}}", instant=True)], "percentunit")
    b.add(wide(timeseries.Panel().min(0).max(1)), "Fragmentation frag(k)", [prom(
        f'gpuledger_fragmentation_ratio{{{POOL_CARD},k=~"2|4|8|demand"}}',
        "{{pool}} / {{card_type}} k={{k}}")], "percentunit",
        description="Share of free GPUs that cannot host a k-GPU single-node job.")
    b.add(wide(timeseries.Panel()), "Free GPUs, largest free block, blocked demand", [
        prom(f"gpuledger_free_gpus{{{POOL_CARD}}}", "{{pool}} / {{card_type}} free"),
        prom(f"gpuledger_largest_free_block_gpus{{{POOL_CARD}}}",
             "{{pool}} / {{card_type}} largest block"),
        prom(f"gpuledger_blocked_demand_gpus{{{POOL_CARD}}}",
             "{{pool}} / {{card_type}} blocked GPUs"),
    ], GPUS)
    b.add(table.Panel().transformations([
        transform("merge"),
        transform("organize", {"excludeByName": {"Time": True},
                               "renameByName": {"Value #A": "allocated GPUs",
                                                "Value #B": "used GPUs"}}),
    ]).decimals(1).override_by_name(*links_on("team", TEAM_LINK)),
        "Teams now (click a team)", [
        prom(f'sum by (team) (gpuledger_allocated_gpus{{{sel},team!=""}})',
             instant=True, table_format=True),
        prom(f'sum by (team) (gpuledger_used_gpus{{{sel},team!=""}})',
             instant=True, table_format=True),
    ], GPUS)
    b.row("Processor")
    b.add(timeseries.Panel(), "Records in per second", [prom(
        "record_type:gpuledger_records:rate1m", "{{record_type}}")], "reqps", w=8)
    b.add(timeseries.Panel(), "Facts lag (wall clock − end of the latest closed minute)",
          [prom("time() - gpuledger_closed_until_timestamp_seconds", "lag")], "s", w=8)
    b.add(timeseries.Panel(), "Rejected and late records per second", [
        prom("sum(rate(gpuledger_rejected_records_total[$__rate_interval])) or vector(0)",
             "rejected (dead letters)"),
        prom("sum by (record_type) (rate(gpuledger_late_events_total[$__rate_interval]))",
             "{{record_type}} late"),
    ], "reqps", w=8)
    b.row("History (warehouse)")
    hist = f"$__timeFilter(hour) AND {IN_POOL_CARD} AND (team IS NULL OR {IN_TEAM})"
    b.add(timeseries.Panel(), "GPU-hours per hour: allocated, used, idle, inefficient, free",
          [sql(f"""SELECT hour AS time, sum(allocated_gpu_hours) AS allocated,
                   sum(used_gpu_hours) AS used, sum(allocated_idle_gpu_hours) AS idle,
                   sum(allocated_inefficient_gpu_hours) AS inefficient,
                   sum(free_gpu_hours) AS free
            FROM gpu_hourly WHERE {hist}
            GROUP BY 1 ORDER BY 1""", time_series=True)], GPU_H)
    b.add(table.Panel().decimals(1).override_by_name(*links_on("team", TEAM_LINK))
          .override_by_name("used_of_allocated", [unit_of("percentunit")]),
          "Where idle and inefficient GPU-hours come from (click a team)", [sql(
              f"""SELECT team, sum(allocated_idle_gpu_hours) AS idle_gpu_hours,
                   sum(allocated_inefficient_gpu_hours) AS inefficient_gpu_hours,
                   sum(allocated_gpu_hours) - sum(used_gpu_hours) AS waste_gpu_hours,
                   sum(used_gpu_hours) / nullif(sum(allocated_gpu_hours), 0)
                       AS used_of_allocated
            FROM gpu_hourly WHERE {hist} AND team IS NOT NULL
            GROUP BY team ORDER BY waste_gpu_hours DESC""")], GPU_H)
    b.add(table.Panel().decimals(1),
          "Idle and inefficient GPU-hours by job type and card type", [sql(
              f"""SELECT job_type, card_type, sum(allocated_idle_gpu_hours) AS idle_gpu_hours,
                   sum(allocated_inefficient_gpu_hours) AS inefficient_gpu_hours
            FROM gpu_hourly WHERE {hist} AND job_type IS NOT NULL
            GROUP BY ALL ORDER BY idle_gpu_hours + inefficient_gpu_hours DESC""")], GPU_H)
    b.add(timeseries.Panel().min(0).max(1),
          "Fragmentation over time (frag(8), demand-weighted)", [sql(
              f"""SELECT time_bucket(to_milliseconds($__interval_ms), minute) AS time,
                   pool || ' / ' || card_type AS pool_card,
                   avg(frag_8) AS frag_8, avg(frag_demand) AS frag_demand
            FROM frag_minute WHERE $__timeFilter(minute) AND {IN_POOL_CARD}
            GROUP BY ALL ORDER BY 1""", time_series=True)], "percentunit")
    return b



def team() -> Board:
    b = Board(TEAM, "gpuledger · Team",
              "One team: allocation vs use, waste, borrowing, top jobs. Click a job to "
              "drill down. Variables come from the warehouse: any team with history in the "
              "time range can be chosen, holding GPUs now or not.")
    b.variables = _warehouse_vars()
    sel = f'{POOL_CARD},team=~"$team",queue=~"$queue"'
    job_sel = f'{JOB_POOL_CARD},team=~"$team",queue=~"$queue"'
    b.row("Now")
    b.add(stat.Panel().decimals(1), "Allocated GPUs", [prom(
        f"sum(gpuledger_allocated_gpus{{{sel}}}) or vector(0)")], GPUS, w=6, h=4)
    b.add(stat.Panel().decimals(1), "Used of allocated", [prom(
        f"sum(gpuledger_used_gpus{{{sel}}}) / sum(gpuledger_allocated_gpus{{{sel}}})")],
        "percentunit", w=6, h=4)
    b.add(stat.Panel().decimals(1), "Wasted GPUs now (allocated − used)", [prom(
        f"sum(gpuledger_allocated_gpus{{{sel}}}) - sum(gpuledger_used_gpus{{{sel}}})")],
        GPUS, w=6, h=4)
    b.add(stat.Panel(), "Pending GPUs (any-card jobs included)", [prom(
        f"sum(gpuledger_queue_pending_gpus{{{job_sel}}}) or vector(0)")], GPUS, w=6, h=4)
    b.add(timeseries.Panel(), "Allocated vs used", [
        prom(f"sum by (team) (gpuledger_allocated_gpus{{{sel}}})", "{{team}} allocated"),
        prom(f"sum by (team) (gpuledger_used_gpus{{{sel}}})", "{{team}} used"),
    ], GPUS)
    b.add(stacked(timeseries.Panel()), "GPUs by state", [prom(
        f'sum by (state) (gpuledger_gpus{{{POOL_CARD},team=~"$team"}})', "{{state}}")], GPUS)
    b.add(table.Panel().transformations([transform("organize", {
        "excludeByName": {"Time": True, "__name__": True, "instance": True, "job": True},
        "renameByName": {"Value": "activity"}})])
        .override_by_name(*links_on("job_id", JOB_LINK)),
        "Running jobs (click a job)", [prom(
            f"gpuledger_job_activity_ratio{{{job_sel}}}", instant=True, table_format=True)],
        "percentunit", w=24)
    b.row("History (warehouse)")
    where = f"{IN_POOL_CARD} AND {IN_TEAM} AND {IN_QUEUE}"
    attempts = (f"{JOB_IN_POOL_CARD} AND {IN_TEAM} AND {IN_QUEUE} "
                "AND started_at <= $__timeTo() AND coalesce(ended_at, now()) >= $__timeFrom()")
    b.add(timeseries.Panel(), "GPU-hours per hour: allocated, used, idle, inefficient", [sql(
        f"""SELECT hour AS time, sum(allocated_gpu_hours) AS allocated,
                   sum(used_gpu_hours) AS used, sum(allocated_idle_gpu_hours) AS idle,
                   sum(allocated_inefficient_gpu_hours) AS inefficient
            FROM gpu_hourly WHERE $__timeFilter(hour) AND {where}
            GROUP BY 1 ORDER BY 1""", time_series=True)], GPU_H)
    b.add(table.Panel().decimals(1).override_by_name("borrowed_attempts", [unit_of(JOBS)])
          .override_by_name("reclaimed_attempts", [unit_of(JOBS)]),
          "Borrowing and reclaim (attempts in range)", [sql(
              f"""SELECT team, pool, sum(allocated_gpu_hours) AS allocated_gpu_hours,
                   coalesce(sum(allocated_gpu_hours) FILTER (WHERE borrowed), 0)
                       AS borrowed_gpu_hours,
                   count(*) FILTER (WHERE borrowed) AS borrowed_attempts,
                   count(*) FILTER (WHERE borrowed AND end_event = 'preempted')
                       AS reclaimed_attempts
            FROM attempts WHERE {attempts}
            GROUP BY ALL ORDER BY borrowed_gpu_hours DESC""")], GPU_H,
          description="Borrowed = started over the team's guaranteed quota; reclaimed = a "
          "borrowed attempt that ended preempted.")
    b.add(table.Panel().decimals(2).override_by_name(*links_on("job_id", JOB_LINK))
          .override_by_name("allocated_gpus", [unit_of(GPUS)])
          .override_by_name("utilisation_of_allocation", [unit_of("percentunit")]),
          "Top wasting jobs (click a job)", [sql(
              f"""SELECT job_id, attempt, queue, job_type, allocated_gpus, allocated_gpu_hours,
                   used_gpu_hours, waste_gpu_hours, utilisation_of_allocation, status
            FROM attempts WHERE {attempts} AND allocated_gpu_hours > 0
            ORDER BY waste_gpu_hours DESC LIMIT 20""")], GPU_H)
    b.add(table.Panel().decimals(2).override_by_name(*links_on("job_id", JOB_LINK))
          .override_by_name("peak_of_held", [unit_of("percentunit")])
          .override_by_name("allocated_gpu_hours", [unit_of(GPU_H)]),
          "Memory over-requests (peak < 25 % of held)", [sql(
              f"""SELECT job_id, attempt, "user", held_mib, peak_mib, peak_of_held,
                   allocated_gpu_hours
            FROM memory_requests WHERE {IN_POOL} AND {IN_TEAM} AND {IN_QUEUE}
              AND (requested_card_type IS NULL
                   OR requested_card_type IN (${{card_type:sqlstring}}))
              AND peak_of_held < 0.25
            ORDER BY allocated_gpu_hours DESC LIMIT 20""")], "mbytes")
    b.add(table.Panel().decimals(2).override_by_name(*links_on("job_id", JOB_LINK)),
          "Recommendations", [sql(
              f"""SELECT job_id, kind, gpu_hours, recommendation, evidence
            FROM recommendations WHERE {IN_TEAM} AND {IN_QUEUE} AND $__timeFilter(ended_at)
            ORDER BY gpu_hours DESC LIMIT 50""")], GPU_H, w=24)
    return b


def _job_vars() -> list[dash.QueryVariable]:
    window = "started_at <= $__timeTo() AND coalesce(ended_at, now()) >= $__timeFrom()"
    return [
        *_warehouse_vars(),
        sql_variable("job", "Job", f"""SELECT job_id FROM attempts
            WHERE {JOB_IN_POOL_CARD} AND {IN_TEAM} AND {IN_QUEUE} AND {window}
            GROUP BY job_id ORDER BY max(waste_gpu_hours) DESC NULLS LAST, job_id
            LIMIT 500""", multi=False),
    ]


def job() -> Board:
    b = Board(JOB, "gpuledger · Job",
              "One job: per-GPU activity and memory, state, attempts, recommendations.")
    b.variables = _job_vars()
    the_job = "job_id = ${job:sqlstring}"
    b.row("Attempts and advice (warehouse)")
    b.add(table.Panel().decimals(2)
          .override_by_name("queue_wait_s", [unit_of("s")])
          .override_by_name("allocated_gpus", [unit_of(GPUS)])
          .override_by_name("utilisation_of_allocation", [unit_of("percentunit")])
          .override_by_name("mem_peak_mib", [unit_of("mbytes")])
          .override_by_name("mem_held_mib", [unit_of("mbytes")]),
          "Attempts", [sql(
              f"""SELECT attempt, status, team, "user", queue, pool, card_type AS card_asked,
                  held_card_type AS card_held, allocated_gpus,
                  submitted_at, started_at, ended_at, end_event, queue_wait_s,
                  allocated_gpu_hours, used_gpu_hours, utilisation_of_allocation,
                  mem_peak_mib, mem_held_mib, memory_oversized, lost_gpu_hours
           FROM attempts WHERE {the_job} ORDER BY attempt""")], GPU_H, w=24, h=6)
    b.add(table.Panel().decimals(2), "Recommendations", [sql(
        f"""SELECT attempt, kind, gpu_hours, recommendation, evidence, diagnosis
           FROM recommendations WHERE {the_job} ORDER BY gpu_hours DESC""")], GPU_H, h=6)
    job_board_panel(b)
    b.add(table.Panel().decimals(2)
          .override_by_name("mean_activity", [unit_of("percentunit")])
          .override_by_name("mem_peak_mib", [unit_of("mbytes")])
          .override_by_name("mem_held_mib", [unit_of("mbytes")]),
          "Per GPU (ended attempts)", [sql(
              f"""SELECT attempt, node, gpu_index, card_type, mean_activity, mem_peak_mib,
                  mem_held_mib, allocated_gpu_hours, idle_gpu_hours, inefficient_gpu_hours
           FROM job_gpu WHERE {the_job} ORDER BY attempt, node, gpu_index""")], GPU_H, h=6)
    b.row("Timelines (warehouse, closed hours)")
    b.add(timeseries.Panel().min(0).max(1), "Activity per GPU", [sql(
        f"""SELECT minute AS time, node || '/' || gpu_index AS gpu, activity
           FROM gpu_minute WHERE {the_job} AND $__timeFilter(minute)
           ORDER BY 1""", time_series=True)], "percentunit")
    b.add(timeseries.Panel(), "Memory used per GPU", [sql(
        f"""SELECT minute AS time, node || '/' || gpu_index AS gpu,
                  mem_used_mib * 1048576 AS memory_used
           FROM gpu_minute WHERE {the_job} AND $__timeFilter(minute)
           ORDER BY 1""", time_series=True)], "bytes")
    b.add(statetimeline.Panel(), "State per GPU", [sql(
        f"""SELECT minute AS time, node || '/' || gpu_index AS gpu, state
           FROM gpu_minute WHERE {the_job} AND $__timeFilter(minute)
           ORDER BY 1""", time_series=True)], "string", w=24, h=6)
    b.add(timeseries.Panel(), "PCIe and NVLink traffic (data bottlenecks show here)", [sql(
        f"""SELECT minute AS time, sum(pcie_rx_bytes_s) AS pcie_rx,
                  sum(pcie_tx_bytes_s) AS pcie_tx, sum(nvlink_rx_bytes_s) AS nvlink_rx,
                  sum(nvlink_tx_bytes_s) AS nvlink_tx
           FROM gpu_minute WHERE {the_job} AND $__timeFilter(minute)
           GROUP BY 1 ORDER BY 1""", time_series=True)], "Bps", w=24)
    b.row("Live (running attempt)")
    jsel = 'job_id="$job"'
    b.add(timeseries.Panel().min(0).max(1), "Activity per GPU (live)", [prom(
        f"gpuledger_job_gpu_activity_ratio{{{jsel}}}", "{{node}}/{{gpu}} ({{card_type}})")],
        "percentunit")
    b.add(timeseries.Panel(), "Memory used per GPU (live)", [prom(
        f"gpuledger_job_gpu_memory_used_bytes{{{jsel}}}", "{{node}}/{{gpu}} ({{card_type}})")],
        "bytes")
    b.add(stat.Panel().decimals(1), "Wasted GPU-hours so far", [prom(
        f"gpuledger_job_wasted_gpu_seconds{{{jsel}}} / 3600")], GPU_H, w=6, h=4)
    b.add(stat.Panel().decimals(1), "Peak memory of held", [prom(
        f"gpuledger_job_memory_peak_bytes{{{jsel}}} / gpuledger_job_memory_held_bytes{{{jsel}}}"
    )], "percentunit", w=6, h=4)
    b.add(stat.Panel(), "Runtime", [prom(f"gpuledger_job_runtime_seconds{{{jsel}}}")],
          "s", w=6, h=4)
    b.add(stat.Panel(), "Allocated GPUs", [prom(f"gpuledger_job_allocated_gpus{{{jsel}}}")],
          GPUS, w=6, h=4)
    return b


def queues() -> Board:
    b = Board(QUEUES, "gpuledger · Queues and fragmentation",
              "Queue wait percentiles, pending and blocked demand (jobs that asked for any "
              "card counted under every card type of their pool), fragmentation.")
    b.variables = _warehouse_vars()
    sel = f'{JOB_POOL_CARD},team=~"$team",queue=~"$queue"'
    b.row("Now")
    b.add(timeseries.Panel(), "Pending jobs by queue", [prom(
        f"sum by (queue) (gpuledger_queue_pending_jobs{{{sel}}})", "{{queue}}")], JOBS, w=8)
    b.add(timeseries.Panel(), "Pending GPUs by queue", [prom(
        f"sum by (queue) (gpuledger_queue_pending_gpus{{{sel}}})", "{{queue}}")], GPUS, w=8)
    b.add(timeseries.Panel(), "Oldest pending job's wait", [prom(
        f"max by (queue) (gpuledger_queue_oldest_pending_seconds{{{sel}}})", "{{queue}}")],
        "s", w=8)
    b.add(wide(timeseries.Panel()), "Queue wait p50 / p95 (since the processor started)", [
        prom(f"histogram_quantile(0.5, sum by (queue, le) "
             f"(gpuledger_queue_wait_seconds_bucket{{{sel}}}))", "{{queue}} p50"),
        prom(f"histogram_quantile(0.95, sum by (queue, le) "
             f"(gpuledger_queue_wait_seconds_bucket{{{sel}}}))", "{{queue}} p95"),
    ], "s")
    b.add(wide(timeseries.Panel()), "Queue wait p50 / p95 over the last hour (all pools)", [
        prom('queue:gpuledger_queue_wait_seconds:p50_1h{queue=~"$queue"}', "{{queue}} p50"),
        prom('queue:gpuledger_queue_wait_seconds:p95_1h{queue=~"$queue"}', "{{queue}} p95"),
    ], "s", description="Recording rules of alerts/ (rate over 1 h of the queue-wait "
        "histogram, by queue only).")
    b.add(wide(timeseries.Panel()),
          "Blocked by fragmentation (jobs that fit in the free GPUs, on no node)",
          [prom(f"sum by (queue) (gpuledger_queue_blocked_gpus{{{sel}}})", "{{queue}} GPUs"),
           prom(f"sum by (pool, card_type) (gpuledger_blocked_demand_gpus{{{POOL_CARD}}})",
                "{{pool}} / {{card_type}} GPUs (fleet)")], GPUS)
    b.add(wide(timeseries.Panel().min(0).max(1)), "Fragmentation frag(k) by pool and card type",
          [prom(f'gpuledger_fragmentation_ratio{{{POOL_CARD},k=~"1|2|4|8|node|demand"}}',
                "{{pool}} / {{card_type}} k={{k}}")], "percentunit")
    b.add(table.Panel().transformations([transform("organize", {
        "excludeByName": {"Time": True}, "renameByName": {"Value": "pending jobs"}})]),
        "Pending jobs by queue, team and requested card type now", [prom(
            f"sum by (queue, team, pool, requested_card_type) "
            f"(gpuledger_queue_pending_jobs{{{sel}}})", instant=True, table_format=True)],
        JOBS)
    b.row("History (warehouse)")
    pending = f"$__timeFilter(minute) AND {JOB_IN_POOL_CARD} AND {IN_TEAM} AND {IN_QUEUE}"
    b.add(timeseries.Panel(), "Queue wait p90 by queue (by start time)", [sql(
        f"""SELECT time_bucket(to_milliseconds(greatest($__interval_ms, 3600000)), started_at)
                       AS time, queue, quantile_cont(queue_wait_s, 0.9) AS p90
            FROM attempts WHERE $__timeFilter(started_at) AND {JOB_IN_POOL_CARD}
              AND {IN_TEAM} AND {IN_QUEUE} AND queue_wait_s IS NOT NULL
            GROUP BY ALL ORDER BY 1""", time_series=True)], "s")
    b.add(timeseries.Panel(), "Pending GPUs by queue (any-card jobs included)", [sql(
        f"""SELECT time_bucket(to_milliseconds($__interval_ms), minute) AS time, queue,
                   avg(pending_gpus) AS pending_gpus
            FROM (SELECT minute, queue, sum(pending_gpus) AS pending_gpus FROM pending_minute
                  WHERE {pending} GROUP BY ALL)
            GROUP BY ALL ORDER BY 1""", time_series=True)], GPUS,
        description="Average over each interval of the GPUs requested by pending jobs; a "
        "job that asked for any card counts under every card type of its pool.")
    b.add(table.Panel().override_by_name(*links_on("job_id", JOB_LINK))
          .override_by_name("blocked_minutes", [unit_of("m")])
          .override_by_name("first_blocked", [unit_of("dateTimeAsIso")])
          .override_by_name("started_at", [unit_of("dateTimeAsIso")]),
          "Jobs blocked by fragmentation in range (click a job)", [sql(
              f"""SELECT job_id, attempt, team, queue, pool, card_type, gpus, blocked_minutes,
                   max_free_gpus, min_largest_free_block, first_blocked, started_at
            FROM blocked_jobs WHERE last_blocked >= $__timeFrom()
              AND first_blocked <= $__timeTo() AND {JOB_IN_POOL_CARD} AND {IN_TEAM}
              AND {IN_QUEUE}
            ORDER BY blocked_minutes DESC LIMIT 50""")], GPUS, w=24)
    b.add(table.Panel().decimals(0).override_by_name("attempts", [unit_of(JOBS)])
          .override_by_name("gpus", [unit_of(GPUS)]),
          "Queue wait by queue and GPU count (started in range)", [sql(
              f"""SELECT queue, gpus, count(*) AS attempts,
                   quantile_cont(queue_wait_s, 0.5) AS p50_s,
                   quantile_cont(queue_wait_s, 0.9) AS p90_s, max(queue_wait_s) AS max_s
            FROM attempts WHERE $__timeFilter(started_at) AND {JOB_IN_POOL_CARD}
              AND {IN_TEAM} AND {IN_QUEUE} AND queue_wait_s IS NOT NULL
            GROUP BY ALL ORDER BY queue, gpus""")], "s", w=24)
    return b


def board_links() -> list[dash.DashboardLink]:
    """Links on every board to the others (time range and variables kept)."""
    return [dash.DashboardLink("gpuledger boards").type(dm.DashboardLinkType.DASHBOARDS)
            .tags(["gpuledger"]).as_dropdown(True).keep_time(True).include_vars(True)]


def all_boards() -> dict[str, Json]:
    """Every board's JSON by uid."""
    return {b.uid: b.json(board_links()) for b in (fleet(), team(), job(), queues())}
