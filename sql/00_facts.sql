-- Base views: one per fact table, over the Parquet files that the newest published
-- generation names (docs/warehouse.md, "Generations"). {files:TABLE} is replaced by
-- the list of the table's files when the catalog is built, the table's empty
-- _schema.parquet first, so the view exists (with its columns) before any rows are
-- written; every file of a table has that schema.
-- gpu_minute: a row per GPU-minute; GPUs without telemetry keep spans of identical
-- minutes (gpu_span: minute, minutes), expanded here so both read the same way.
CREATE OR REPLACE VIEW gpu_minute AS SELECT * FROM read_parquet({files:gpu_minute}, hive_partitioning = false) UNION ALL BY NAME SELECT * EXCLUDE (minute, minutes), unnest(generate_series(minute, minute + (minutes - 1) * INTERVAL 1 MINUTE, INTERVAL 1 MINUTE)) AS minute FROM read_parquet({files:gpu_span}, hive_partitioning = false);
-- gpu_runs: the same GPU-minutes as stored, for readers that count minutes over long
-- histories without expanding them: a row per telemetry minute (minutes = 1) and a row per
-- span (minute: its first; minutes: how many).
CREATE OR REPLACE VIEW gpu_runs AS SELECT *, 1::BIGINT AS minutes FROM read_parquet({files:gpu_minute}, hive_partitioning = false) UNION ALL BY NAME SELECT * FROM read_parquet({files:gpu_span}, hive_partitioning = false);
-- Roll-ups: each telemetry partition's files hold its nodes' part of a row (partitions.py);
-- the view adds the parts up (one processor: one part per row, the same numbers).
CREATE OR REPLACE VIEW gpu_hourly AS SELECT hour, pool, card_type, team, queue, job_type, round(sum(gpu_hours), 9) AS gpu_hours, round(sum(allocated_gpu_hours), 9) AS allocated_gpu_hours, round(sum(used_gpu_hours), 9) AS used_gpu_hours, round(sum(free_gpu_hours), 9) AS free_gpu_hours, round(sum(allocated_idle_gpu_hours), 9) AS allocated_idle_gpu_hours, round(sum(allocated_inefficient_gpu_hours), 9) AS allocated_inefficient_gpu_hours, round(sum(allocated_busy_gpu_hours), 9) AS allocated_busy_gpu_hours, round(sum(unaccounted_use_gpu_hours), 9) AS unaccounted_use_gpu_hours, round(sum(unavailable_gpu_hours), 9) AS unavailable_gpu_hours, round(sum(no_telemetry_gpu_hours), 9) AS no_telemetry_gpu_hours, round(sum(occupied_gpu_hours), 9) AS occupied_gpu_hours, round(sum(job_gpu_hours), 9) AS job_gpu_hours, date FROM read_parquet({files:gpu_hourly}, hive_partitioning = false) GROUP BY hour, date, pool, card_type, team, queue, job_type;
CREATE OR REPLACE VIEW gpu_daily AS SELECT date, pool, card_type, team, queue, job_type, round(sum(gpu_hours), 9) AS gpu_hours, round(sum(allocated_gpu_hours), 9) AS allocated_gpu_hours, round(sum(used_gpu_hours), 9) AS used_gpu_hours, round(sum(free_gpu_hours), 9) AS free_gpu_hours, round(sum(allocated_idle_gpu_hours), 9) AS allocated_idle_gpu_hours, round(sum(allocated_inefficient_gpu_hours), 9) AS allocated_inefficient_gpu_hours, round(sum(allocated_busy_gpu_hours), 9) AS allocated_busy_gpu_hours, round(sum(unaccounted_use_gpu_hours), 9) AS unaccounted_use_gpu_hours, round(sum(unavailable_gpu_hours), 9) AS unavailable_gpu_hours, round(sum(no_telemetry_gpu_hours), 9) AS no_telemetry_gpu_hours, round(sum(occupied_gpu_hours), 9) AS occupied_gpu_hours, round(sum(job_gpu_hours), 9) AS job_gpu_hours FROM read_parquet({files:gpu_daily}, hive_partitioning = false) GROUP BY date, pool, card_type, team, queue, job_type;
CREATE OR REPLACE VIEW frag_minute AS SELECT * FROM read_parquet({files:frag_minute}, hive_partitioning = false);
CREATE OR REPLACE VIEW pending_minute AS SELECT * FROM read_parquet({files:pending_minute}, hive_partitioning = false);
CREATE OR REPLACE VIEW blocked_minute AS SELECT * FROM read_parquet({files:blocked_minute}, hive_partitioning = false);
CREATE OR REPLACE VIEW job_attempts AS SELECT * FROM read_parquet({files:job_attempts}, hive_partitioning = false);
CREATE OR REPLACE VIEW job_gpu AS SELECT * FROM read_parquet({files:job_gpu}, hive_partitioning = false);
CREATE OR REPLACE VIEW preemptions AS SELECT * FROM read_parquet({files:preemptions}, hive_partitioning = false);
CREATE OR REPLACE VIEW job_diagnosis AS SELECT * FROM read_parquet({files:job_diagnosis}, hive_partitioning = false);
-- Recommendations carry the attempt's likely cause of idle/inefficient GPU-time where
-- `gpuledger diagnose` has diagnosed it (docs/diagnosis.md): the pattern holding most of
-- those GPU-hours, a known one winning over 'unknown' when it holds a quarter or more.
CREATE OR REPLACE VIEW recommendations AS SELECT r.*, d.pattern AS diagnosis, d.remedy AS diagnosis_remedy FROM read_parquet({files:recommendations}, hive_partitioning = false) r LEFT JOIN (SELECT job_id, attempt, arg_max(pattern, (pattern <> 'unknown' AND share >= 0.25, gpu_hours)) AS pattern, arg_max(remedy, (pattern <> 'unknown' AND share >= 0.25, gpu_hours)) AS remedy FROM job_diagnosis GROUP BY job_id, attempt) d USING (job_id, attempt);
-- Snapshots are written when the processor stops or reaches the end of its input, ended
-- attempts as their minutes close: an attempt whose end is published is no longer
-- running, even if the newest snapshot is older than that end (a later run, or a
-- processor writing on, publishes the end first).
CREATE OR REPLACE VIEW running_attempts AS SELECT * FROM read_parquet({files:running_attempts}, hive_partitioning = false) AS r WHERE NOT EXISTS (SELECT 1 FROM job_attempts AS e WHERE e.job_id = r.job_id AND e.attempt = r.attempt);
CREATE OR REPLACE VIEW candidates AS SELECT * FROM read_parquet({files:candidates}, hive_partitioning = false);
CREATE OR REPLACE VIEW rejects AS SELECT * FROM read_parquet({files:rejects}, hive_partitioning = false);
-- Telemetry that came after its minute had closed (docs/metrics.md, "Late ..."): kept as
-- it came, not merged into the closed facts. Its columns come from the code (rows:),
-- as warehouses written before this view have no schema file for it.
CREATE OR REPLACE VIEW late_telemetry AS SELECT * FROM {rows:late_telemetry};
