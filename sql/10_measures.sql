-- The core measures of DESIGN.md as views. Definitions: docs/metrics.md.

-- Every attempt, finished or still running / pending (running ones carry usage so far).
-- Usage counts only what telemetry observed (docs/metrics.md, "No telemetry is not
-- waste"): no_telemetry_gpu_hours = allocated − observed GPU-hours; waste = observed −
-- used (= allocated − used − no_telemetry); idle and inefficient are observed hours;
-- utilisation is used / observed.
CREATE OR REPLACE VIEW attempts AS
WITH a AS (
    SELECT *, 'ended' AS status FROM job_attempts
    UNION ALL BY NAME
    SELECT *, CASE WHEN started_at IS NULL THEN 'pending' ELSE 'running' END AS status
    FROM running_attempts
)
SELECT job_id, attempt, team, "user", queue, pool, priority, job_type, gpus, card_type,
       gpu_mem_mib, preemptible, checkpointable, borrowed, submitted_at, queued_at,
       started_at, ended_at, end_event, queue_wait_s, allocated_gpus, nodes,
       last_checkpoint_at, checkpoints, lost_gpu_hours, allocated_gpu_hours,
       job_gpu_hours, used_gpu_hours, idle_gpu_hours, inefficient_gpu_hours,
       observed_gpu_hours, coalesce(no_telemetry_gpu_hours, 0) AS no_telemetry_gpu_hours,
       waste_gpu_hours, utilisation_of_allocation,
       mem_peak_mib, mem_held_mib, memory_oversized, held_card_type, suggested_card_type,
       mismatch_gpu_hours, status
FROM a;

-- Allocation vs use, idle vs inefficient, by any dimension of gpu_daily. Allocated
-- GPU-hours without telemetry (scheduler-only history: openb, sacct, pod imports) are
-- their own state (no_telemetry), never idle or waste; utilisation is used / observed
-- allocated. Allocated = GPU shares; occupied = time a GPU had any job; job_gpu_hours =
-- pods × GPUs (docs/metrics.md, "Three measures of allocation").
CREATE OR REPLACE VIEW utilisation_by_pool AS
SELECT pool, card_type,
       sum(gpu_hours) AS gpu_hours,
       sum(gpu_hours - unavailable_gpu_hours) AS available_gpu_hours,
       sum(allocated_gpu_hours) AS allocated_gpu_hours,
       sum(occupied_gpu_hours) AS occupied_gpu_hours,
       sum(job_gpu_hours) AS job_gpu_hours,
       sum(used_gpu_hours) AS used_gpu_hours,
       sum(no_telemetry_gpu_hours) AS no_telemetry_gpu_hours,
       sum(allocated_idle_gpu_hours) AS idle_gpu_hours,
       sum(allocated_inefficient_gpu_hours) AS inefficient_gpu_hours,
       sum(free_gpu_hours) AS free_gpu_hours,
       sum(unaccounted_use_gpu_hours) AS unaccounted_gpu_hours,
       sum(allocated_gpu_hours) / nullif(sum(gpu_hours - unavailable_gpu_hours), 0) AS allocation_rate,
       sum(used_gpu_hours)
           / nullif(sum(allocated_gpu_hours - no_telemetry_gpu_hours), 0)
           AS utilisation_of_allocation
FROM gpu_daily GROUP BY ALL;

CREATE OR REPLACE VIEW utilisation_by_team AS
SELECT team, pool,
       sum(allocated_gpu_hours) AS allocated_gpu_hours,
       sum(used_gpu_hours) AS used_gpu_hours,
       sum(no_telemetry_gpu_hours) AS no_telemetry_gpu_hours,
       sum(allocated_idle_gpu_hours) AS idle_gpu_hours,
       sum(allocated_inefficient_gpu_hours) AS inefficient_gpu_hours,
       sum(allocated_gpu_hours - used_gpu_hours - no_telemetry_gpu_hours) AS waste_gpu_hours,
       sum(used_gpu_hours)
           / nullif(sum(allocated_gpu_hours - no_telemetry_gpu_hours), 0)
           AS utilisation_of_allocation
FROM gpu_daily WHERE team IS NOT NULL GROUP BY ALL;

-- Queue wait percentiles per queue (attempts that started). pNN_s interpolate between
-- the two nearest waits (quantile_cont: Polars' and numpy's "linear", PostgreSQL's
-- percentile_cont); pNN_nearest_s are nearest-rank (quantile_disc: the ⌈q·n⌉-th smallest
-- wait, always a wait that happened), for comparing with tools that report those.
-- docs/metrics.md, "Percentiles".
CREATE OR REPLACE VIEW queue_wait AS
SELECT queue, pool, count(*) AS attempts,
       avg(queue_wait_s) AS mean_s,
       quantile_cont(queue_wait_s, 0.5) AS p50_s,
       quantile_cont(queue_wait_s, 0.9) AS p90_s,
       quantile_cont(queue_wait_s, 0.99) AS p99_s,
       quantile_disc(queue_wait_s, 0.5) AS p50_nearest_s,
       quantile_disc(queue_wait_s, 0.9) AS p90_nearest_s,
       quantile_disc(queue_wait_s, 0.99) AS p99_nearest_s,
       max(queue_wait_s) AS max_s
FROM attempts WHERE queue_wait_s IS NOT NULL GROUP BY ALL;

-- Peak and p95 GPU memory per job and GPU (p95 over the GPU's minutes), from the minutes
-- the job held the GPU alone: a GPU-minute shared by jobs names one of them (the largest
-- share) and its memory is all of theirs (job_gpu.mem_peak_mib has a shared GPU's
-- per-job peak, from the job's own processes).
CREATE OR REPLACE VIEW job_gpu_memory AS
SELECT job_id, attempt, node, gpu_index, any_value(card_type) AS card_type,
       max(mem_used_mib) AS mem_peak_mib,
       quantile_cont(mem_used_mib, 0.95) AS mem_p95_mib,
       max(mem_total_mib) AS mem_total_mib
FROM gpu_minute WHERE job_id IS NOT NULL AND jobs_on_gpu = 1 GROUP BY ALL;

-- Borrowing and reclaim per team.
CREATE OR REPLACE VIEW borrowing AS
SELECT team,
       sum(CASE WHEN borrowed THEN allocated_gpu_hours ELSE 0 END) AS borrowed_gpu_hours,
       count(*) FILTER (WHERE borrowed) AS borrowed_attempts,
       count(*) FILTER (WHERE borrowed AND end_event = 'preempted') AS reclaimed_attempts
FROM attempts GROUP BY ALL;

-- Preemption cost per team and queue.
CREATE OR REPLACE VIEW preemption_cost AS
SELECT team, queue, count(*) AS preemptions, sum(lost_gpu_hours) AS lost_gpu_hours,
       count(*) FILTER (WHERE requeued) AS requeued
FROM preemptions GROUP BY ALL;

-- Fragmentation per pool and card type (time averages).
CREATE OR REPLACE VIEW fragmentation AS
SELECT pool, card_type, avg(free_gpus) AS mean_free_gpus,
       avg(frag_1) AS frag_1, avg(frag_2) AS frag_2, avg(frag_4) AS frag_4,
       avg(frag_8) AS frag_8, avg(frag_node) AS frag_node, avg(frag_demand) AS frag_demand,
       sum(blocked_jobs) AS blocked_job_minutes, max(pending_gpus) AS max_pending_gpus
FROM frag_minute GROUP BY ALL;

-- Team-level recommendations: what each team could win, by kind.
CREATE OR REPLACE VIEW team_recommendations AS
SELECT team, kind, count(*) AS jobs, sum(gpu_hours) AS gpu_hours
FROM recommendations GROUP BY ALL;
