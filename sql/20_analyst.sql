-- Analyst views and parameterised queries (DuckDB table macros) for the seed's questions.
-- Guide with examples: docs/analyst-guide.md. Every macro's parameters are named and have
-- defaults, so `FROM macro()` works and `FROM macro(since := TIMESTAMPTZ '2026-01-05')`
-- narrows it. Time windows are half-open: since <= t < until (NULL = unbounded).

-- Parameters out of range are an error that names them, never an empty or unbounded
-- answer (a NULL count used to return every row, a NULL bucket NULL buckets).
CREATE OR REPLACE MACRO bucket_interval(bucket) AS
CASE WHEN bucket IS NULL OR bucket::INTERVAL <= INTERVAL 0 SECOND
     THEN error('bucket must be a positive interval such as INTERVAL 1 HOUR, got '
                || coalesce(bucket::VARCHAR, 'NULL'))
     ELSE bucket::INTERVAL END;

-- 1. Where idle and inefficient GPU-hours come from -----------------------------------
-- One row per (dimension, value) for dimension in team, pool, card_type, job_type, queue,
-- over the hours in [since, until). `value` is '(none)' for GPU-hours without that
-- attribute (free GPUs have no team). share_of_idle / share_of_inefficient: the row's
-- part of the fleet's idle / inefficient GPU-hours in the window. Allocated GPU-hours
-- without telemetry are no_telemetry_gpu_hours, never idle or waste:
-- waste = allocated − used − no_telemetry (docs/metrics.md).
CREATE OR REPLACE MACRO waste_sources_between(since := NULL, until := NULL) AS TABLE
WITH h AS (
    SELECT * FROM gpu_hourly
    WHERE hour >= coalesce(since::TIMESTAMPTZ, '-infinity'::TIMESTAMPTZ)
      AND hour < coalesce(until::TIMESTAMPTZ, 'infinity'::TIMESTAMPTZ)
), g AS (
    SELECT CASE WHEN grouping(team) = 0 THEN 'team'
                WHEN grouping(pool) = 0 THEN 'pool'
                WHEN grouping(card_type) = 0 THEN 'card_type'
                WHEN grouping(job_type) = 0 THEN 'job_type'
                ELSE 'queue' END AS dimension,
           coalesce(team, pool, card_type, job_type, queue, '(none)') AS value,
           sum(gpu_hours) AS gpu_hours,
           sum(free_gpu_hours) AS free_gpu_hours,
           sum(allocated_gpu_hours) AS allocated_gpu_hours,
           sum(used_gpu_hours) AS used_gpu_hours,
           sum(no_telemetry_gpu_hours) AS no_telemetry_gpu_hours,
           sum(allocated_idle_gpu_hours) AS idle_gpu_hours,
           sum(allocated_inefficient_gpu_hours) AS inefficient_gpu_hours,
           sum(allocated_gpu_hours - used_gpu_hours - no_telemetry_gpu_hours)
               AS waste_gpu_hours,
           sum(unaccounted_use_gpu_hours) AS unaccounted_use_gpu_hours,
           sum(used_gpu_hours) / nullif(sum(allocated_gpu_hours - no_telemetry_gpu_hours), 0)
               AS utilisation_of_allocation
    FROM h
    GROUP BY GROUPING SETS ((team), (pool), (card_type), (job_type), (queue))
)
SELECT *,
       idle_gpu_hours / nullif(sum(idle_gpu_hours) OVER (PARTITION BY dimension), 0)
           AS share_of_idle,
       inefficient_gpu_hours
           / nullif(sum(inefficient_gpu_hours) OVER (PARTITION BY dimension), 0)
           AS share_of_inefficient
FROM g;

CREATE OR REPLACE VIEW waste_sources AS SELECT * FROM waste_sources_between();

-- The attempts that hold the most allocated-but-unused GPU-hours (running ones so far).
-- card_type is the card the job asked for (NULL: any card of its pool); held_card_type
-- the card it ran on.
CREATE OR REPLACE MACRO top_waste_jobs(n := 20, team_name := NULL) AS TABLE
SELECT job_id, attempt, team, "user", queue, pool, job_type, card_type, held_card_type,
       allocated_gpus, allocated_gpu_hours, used_gpu_hours, no_telemetry_gpu_hours,
       idle_gpu_hours, inefficient_gpu_hours, waste_gpu_hours, utilisation_of_allocation,
       status
FROM attempts
WHERE allocated_gpu_hours > 0 AND (team_name IS NULL OR team = team_name)
ORDER BY waste_gpu_hours DESC, job_id, attempt
LIMIT CASE WHEN n IS NULL OR n < 1 OR n <> trunc(n)
           THEN error('top_waste_jobs: n must be a whole number >= 1, got '
                      || coalesce(n::VARCHAR, 'NULL'))
           ELSE n END;

-- Attempts that held or waited for GPUs in [since, until): queued or started before
-- `until` and not ended before `since`. Running and pending ones have no end yet: they
-- are known up to the end of the facts (the last hour of gpu_hourly), not beyond. An
-- empty or inverted window holds none.
CREATE OR REPLACE MACRO attempts_between(since := NULL, until := NULL) AS TABLE
SELECT * FROM attempts
WHERE coalesce(ended_at, (SELECT max(hour) + INTERVAL 1 HOUR FROM gpu_hourly),
               'infinity'::TIMESTAMPTZ)
          > coalesce(since::TIMESTAMPTZ, '-infinity'::TIMESTAMPTZ)
  AND coalesce(started_at, queued_at, '-infinity'::TIMESTAMPTZ)
          < coalesce(until::TIMESTAMPTZ, 'infinity'::TIMESTAMPTZ)
  AND coalesce(since::TIMESTAMPTZ, '-infinity'::TIMESTAMPTZ)
          < coalesce(until::TIMESTAMPTZ, 'infinity'::TIMESTAMPTZ);

-- 2. Who over-requests memory -----------------------------------------------------------
-- One row per attempt that ran with memory observed: requested, held and peak memory per
-- GPU; peak_of_held = peak / held (over-sized below 0.25, docs/metrics.md).
CREATE OR REPLACE VIEW memory_requests AS
SELECT job_id, attempt, team, "user", queue, pool, job_type,
       card_type AS requested_card_type,
       allocated_gpus, allocated_gpu_hours,
       gpu_mem_mib AS requested_mib, mem_held_mib AS held_mib, mem_peak_mib AS peak_mib,
       mem_peak_mib / nullif(mem_held_mib, 0) AS peak_of_held,
       mem_peak_mib / nullif(gpu_mem_mib, 0) AS peak_of_requested,
       coalesce(gpu_mem_mib, mem_held_mib) - mem_peak_mib AS unused_mib,
       memory_oversized, status
FROM attempts
WHERE allocated_gpu_hours > 0 AND mem_peak_mib IS NOT NULL;

-- Per team and user: jobs whose peak stayed under max_peak_ratio of the memory they held,
-- and the GPU-hours those jobs held.
CREATE OR REPLACE MACRO memory_overrequesters(max_peak_ratio := 0.25) AS TABLE
SELECT team, "user",
       count(*) AS jobs,
       count(*) FILTER (WHERE peak_of_held < max_peak_ratio) AS oversized_jobs,
       count(*) FILTER (WHERE peak_of_held < max_peak_ratio) / count(*) AS oversized_share,
       coalesce(sum(allocated_gpu_hours) FILTER (WHERE peak_of_held < max_peak_ratio), 0)
           AS oversized_gpu_hours,
       median(peak_of_held) AS median_peak_of_held,
       sum(unused_mib * allocated_gpus) FILTER (WHERE peak_of_held < max_peak_ratio)
           AS unused_mib_held
FROM memory_requests
WHERE CASE WHEN max_peak_ratio IS NULL OR NOT (max_peak_ratio > 0 AND max_peak_ratio <= 1)
           THEN error('memory_overrequesters: max_peak_ratio must be in (0, 1], got '
                      || coalesce(max_peak_ratio::VARCHAR, 'NULL'))
           ELSE true END
GROUP BY team, "user";

CREATE OR REPLACE VIEW memory_overrequest_by_team AS
SELECT team, sum(jobs)::BIGINT AS jobs, sum(oversized_jobs)::BIGINT AS oversized_jobs,
       sum(oversized_jobs) / sum(jobs) AS oversized_share,
       sum(oversized_gpu_hours) AS oversized_gpu_hours
FROM memory_overrequesters() GROUP BY team;

-- Card mismatch: high-end GPU-hours held by attempts that would fit a lower tier.
CREATE OR REPLACE VIEW card_mismatch AS
SELECT team, pool, held_card_type, suggested_card_type, count(*) AS jobs,
       sum(mismatch_gpu_hours) AS mismatch_gpu_hours
FROM attempts
WHERE mismatch_gpu_hours > 0
GROUP BY ALL;

-- 3. Pending jobs blocked by fragmentation, and for how long --------------------------
-- One row per pending attempt that was ever blocked (its GPU count fit in the free GPUs
-- of its pool and card type, but on no node), over the minutes in [since, until).
-- blocked_minutes counts blocked minutes; started_at and queue_wait_s are NULL while it
-- still waits.
CREATE OR REPLACE MACRO blocked_jobs_between(since := NULL, until := NULL) AS TABLE
SELECT b.job_id, b.attempt, any_value(b.team) AS team, any_value(b.queue) AS queue,
       any_value(b.pool) AS pool, any_value(b.card_type) AS card_type,
       any_value(b.gpus) AS gpus, any_value(b.priority) AS priority,
       min(b.minute) AS first_blocked, max(b.minute) AS last_blocked,
       count(*) AS blocked_minutes,
       max(b.free_gpus) AS max_free_gpus, min(b.largest_free_block) AS min_largest_free_block,
       any_value(a.started_at) AS started_at, any_value(a.queue_wait_s) AS queue_wait_s
FROM blocked_minute b
LEFT JOIN attempts a USING (job_id, attempt)
WHERE b.minute >= coalesce(since::TIMESTAMPTZ, '-infinity'::TIMESTAMPTZ)
  AND b.minute < coalesce(until::TIMESTAMPTZ, 'infinity'::TIMESTAMPTZ)
GROUP BY b.job_id, b.attempt;

CREATE OR REPLACE VIEW blocked_jobs AS SELECT * FROM blocked_jobs_between();

CREATE OR REPLACE MACRO blocked_longer_than(minutes := 30) AS TABLE
SELECT * FROM blocked_jobs
WHERE blocked_minutes > CASE WHEN minutes IS NULL OR minutes < 0
                             THEN error('blocked_longer_than: minutes must be >= 0, got '
                                        || coalesce(minutes::VARCHAR, 'NULL'))
                             ELSE minutes END
ORDER BY blocked_minutes DESC, job_id, attempt;

-- Blocked demand per pool and card type and time bucket: mean blocked jobs and GPUs.
CREATE OR REPLACE MACRO blocked_demand_over_time(bucket := INTERVAL 1 HOUR) AS TABLE
SELECT time_bucket(bucket_interval(bucket), minute) AS bucket_start, pool, card_type,
       avg(blocked_jobs) AS mean_blocked_jobs, max(blocked_jobs) AS max_blocked_jobs,
       avg(blocked_gpus) AS mean_blocked_gpus, avg(free_gpus) AS mean_free_gpus,
       avg(frag_demand) AS mean_frag_demand
FROM frag_minute GROUP BY ALL;

-- 4. Queue wait by queue over time -------------------------------------------------------
-- Attempts that started, by queue and the time bucket of their start.
CREATE OR REPLACE MACRO queue_wait_over_time(bucket := INTERVAL 1 HOUR) AS TABLE
SELECT time_bucket(bucket_interval(bucket), started_at) AS bucket_start, queue,
       count(*) AS attempts,
       avg(queue_wait_s) AS mean_s,
       quantile_cont(queue_wait_s, 0.5) AS p50_s,
       quantile_cont(queue_wait_s, 0.9) AS p90_s,
       quantile_cont(queue_wait_s, 0.99) AS p99_s,
       max(queue_wait_s) AS max_s
FROM attempts WHERE queue_wait_s IS NOT NULL AND started_at IS NOT NULL
GROUP BY ALL;

-- Pending demand per queue over time (mean over the bucket's minutes).
-- Means are per minute of the bucket that the facts cover (a minute with nothing pending
-- counts as 0: pending_minute has rows only where something is pending).
CREATE OR REPLACE MACRO pending_over_time(bucket := INTERVAL 1 HOUR) AS TABLE
WITH per_minute AS (
    SELECT minute, queue, sum(pending_jobs)::BIGINT AS pending_jobs,
           sum(pending_gpus)::BIGINT AS pending_gpus, sum(blocked_jobs)::BIGINT AS blocked_jobs
    FROM pending_minute GROUP BY minute, queue
), covered AS (
    SELECT time_bucket(bucket_interval(bucket), minute) AS bucket_start, count(*) AS minutes
    FROM (SELECT minute FROM frag_minute UNION SELECT minute FROM pending_minute)
    GROUP BY 1
)
SELECT time_bucket(bucket_interval(bucket), p.minute) AS bucket_start, p.queue,
       sum(p.pending_jobs) / any_value(c.minutes) AS mean_pending_jobs,
       max(p.pending_jobs) AS max_pending_jobs,
       sum(p.pending_gpus) / any_value(c.minutes) AS mean_pending_gpus,
       max(p.pending_gpus) AS max_pending_gpus,
       sum(p.blocked_jobs) / any_value(c.minutes) AS mean_blocked_jobs
FROM per_minute p JOIN covered c ON c.bucket_start = time_bucket(bucket_interval(bucket), p.minute)
GROUP BY 1, 2;

-- Queue wait of the attempts that started in [since, until): by queue and GPU count
-- (level 'queue_gpus'), by GPU count alone ('gpus'), by team ('team'), by the card type
-- the attempt got ('card_type': held_card_type, the one asked for where none is known)
-- and over all ('all'), in one pass.
-- pNN_s interpolate between the two nearest waits (quantile_cont), pNN_nearest_s are
-- nearest-rank (quantile_disc), as in queue_wait (docs/metrics.md, "Percentiles").
CREATE OR REPLACE MACRO queue_wait_between(since := NULL, until := NULL) AS TABLE
SELECT CASE WHEN grouping(queue) = 0 THEN 'queue_gpus'
            WHEN grouping(gpus) = 0 THEN 'gpus'
            WHEN grouping(team) = 0 THEN 'team'
            WHEN grouping(card_type) = 0 THEN 'card_type' ELSE 'all' END AS level,
       queue, gpus, team, card_type, count(*) AS attempts,
       avg(queue_wait_s) AS mean_s,
       quantile_cont(queue_wait_s, 0.5) AS p50_s,
       quantile_cont(queue_wait_s, 0.9) AS p90_s,
       quantile_cont(queue_wait_s, 0.99) AS p99_s,
       quantile_disc(queue_wait_s, 0.5) AS p50_nearest_s,
       quantile_disc(queue_wait_s, 0.9) AS p90_nearest_s,
       quantile_disc(queue_wait_s, 0.99) AS p99_nearest_s,
       max(queue_wait_s) AS max_s
FROM (SELECT * REPLACE (coalesce(held_card_type, card_type) AS card_type) FROM attempts)
WHERE queue_wait_s IS NOT NULL
  AND started_at >= coalesce(since::TIMESTAMPTZ, '-infinity'::TIMESTAMPTZ)
  AND started_at < coalesce(until::TIMESTAMPTZ, 'infinity'::TIMESTAMPTZ)
GROUP BY GROUPING SETS ((queue, gpus), (gpus), (team), (card_type), ());

-- Do 8-GPU jobs wait longer? By queue and GPU count, by GPU count alone, and overall;
-- by team and by card type.
CREATE OR REPLACE VIEW queue_wait_by_size AS
SELECT * EXCLUDE (level, team, card_type) FROM queue_wait_between()
WHERE level = 'queue_gpus';

CREATE OR REPLACE VIEW queue_wait_by_gpus AS
SELECT * EXCLUDE (level, queue, team, card_type) FROM queue_wait_between()
WHERE level = 'gpus';

CREATE OR REPLACE VIEW queue_wait_by_team AS
SELECT * EXCLUDE (level, queue, gpus, card_type) FROM queue_wait_between()
WHERE level = 'team';

CREATE OR REPLACE VIEW queue_wait_by_card AS
SELECT * EXCLUDE (level, queue, gpus, team) FROM queue_wait_between()
WHERE level = 'card_type';

CREATE OR REPLACE VIEW queue_wait_overall AS
SELECT * EXCLUDE (level, queue, gpus, team, card_type) FROM queue_wait_between()
WHERE level = 'all';

-- 5. Preemption: lost work ---------------------------------------------------------------
-- Every preemption (an audit trail) with the requeue wait: the queue wait of the next
-- attempt of the same job, NULL while it has not started again.
CREATE OR REPLACE VIEW preemption_audit AS
SELECT p.time, p.job_id, p.attempt, p.team, p.queue, p.pool, p.card_type, p.priority,
       p.borrowed, p.checkpointable, p.allocated_gpus, p.started_at, p.last_checkpoint_at,
       p.lost_gpu_hours, p.requeued, p.reason,
       n.queue_wait_s AS requeue_wait_s
FROM preemptions p
LEFT JOIN attempts n ON n.job_id = p.job_id AND n.attempt = p.attempt + 1;

CREATE OR REPLACE MACRO preemption_lost_work(since := NULL, until := NULL) AS TABLE
SELECT team, queue, pool, borrowed, checkpointable,
       count(*) AS preemptions,
       sum(allocated_gpus) AS gpus_reclaimed,
       sum(lost_gpu_hours) AS lost_gpu_hours,
       count(*) FILTER (WHERE requeued) AS requeued,
       avg(requeue_wait_s) AS mean_requeue_wait_s
FROM preemption_audit
WHERE time >= coalesce(since::TIMESTAMPTZ, '-infinity'::TIMESTAMPTZ)
  AND time < coalesce(until::TIMESTAMPTZ, 'infinity'::TIMESTAMPTZ)
GROUP BY ALL;

-- 6. Borrowing and reclaim -----------------------------------------------------------------
-- Per team and pool: GPU-hours allocated over quota (borrowed attempts), how many borrowed
-- attempts were reclaimed (ended preempted) and the work those reclaims lost.
CREATE OR REPLACE VIEW borrowing_reclaim AS
WITH a AS (
    SELECT team, pool,
           sum(allocated_gpu_hours) AS allocated_gpu_hours,
           coalesce(sum(allocated_gpu_hours) FILTER (WHERE borrowed), 0) AS borrowed_gpu_hours,
           count(*) FILTER (WHERE borrowed AND started_at IS NOT NULL) AS borrowed_attempts,
           count(*) FILTER (WHERE borrowed AND end_event = 'preempted') AS reclaimed_attempts
    FROM attempts WHERE team IS NOT NULL GROUP BY team, pool
), p AS (
    SELECT team, pool, sum(lost_gpu_hours) AS reclaimed_lost_gpu_hours
    FROM preemptions WHERE borrowed GROUP BY team, pool
)
SELECT a.*, a.borrowed_gpu_hours / nullif(a.allocated_gpu_hours, 0) AS borrowed_share,
       coalesce(p.reclaimed_lost_gpu_hours, 0) AS reclaimed_lost_gpu_hours
FROM a LEFT JOIN p USING (team, pool);
