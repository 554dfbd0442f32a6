-- Base views: one per fact table, over its Parquet files. {facts} is replaced by the
-- warehouse's facts folder when the catalog is built. Each table has an empty
-- _schema.parquet so the view exists (with its columns) before any rows are written.
CREATE OR REPLACE VIEW gpu_minute AS SELECT * FROM read_parquet('{facts}/gpu_minute/**/*.parquet', union_by_name = true, hive_partitioning = false);
CREATE OR REPLACE VIEW gpu_hourly AS SELECT * FROM read_parquet('{facts}/gpu_hourly/**/*.parquet', union_by_name = true, hive_partitioning = false);
CREATE OR REPLACE VIEW gpu_daily AS SELECT * FROM read_parquet('{facts}/gpu_daily/**/*.parquet', union_by_name = true, hive_partitioning = false);
CREATE OR REPLACE VIEW frag_minute AS SELECT * FROM read_parquet('{facts}/frag_minute/**/*.parquet', union_by_name = true, hive_partitioning = false);
CREATE OR REPLACE VIEW pending_minute AS SELECT * FROM read_parquet('{facts}/pending_minute/**/*.parquet', union_by_name = true, hive_partitioning = false);
CREATE OR REPLACE VIEW blocked_minute AS SELECT * FROM read_parquet('{facts}/blocked_minute/**/*.parquet', union_by_name = true, hive_partitioning = false);
CREATE OR REPLACE VIEW job_attempts AS SELECT * FROM read_parquet('{facts}/job_attempts/**/*.parquet', union_by_name = true, hive_partitioning = false);
CREATE OR REPLACE VIEW job_gpu AS SELECT * FROM read_parquet('{facts}/job_gpu/**/*.parquet', union_by_name = true, hive_partitioning = false);
CREATE OR REPLACE VIEW preemptions AS SELECT * FROM read_parquet('{facts}/preemptions/**/*.parquet', union_by_name = true, hive_partitioning = false);
CREATE OR REPLACE VIEW recommendations AS SELECT * FROM read_parquet('{facts}/recommendations/**/*.parquet', union_by_name = true, hive_partitioning = false);
CREATE OR REPLACE VIEW running_attempts AS SELECT * FROM read_parquet('{facts}/running_attempts/*.parquet', union_by_name = true, hive_partitioning = false);
CREATE OR REPLACE VIEW candidates AS SELECT * FROM read_parquet('{facts}/candidates/*.parquet', union_by_name = true, hive_partitioning = false);
CREATE OR REPLACE VIEW rejects AS SELECT * FROM read_parquet('{facts}/rejects/*.parquet', union_by_name = true, hive_partitioning = false);
