"""Sort Parquet parts into one Parquet object in bounded memory.

Compaction rewrites a closed day of hourly parts as one object sorted by its keys. Held
in memory, a day of ``gpu_minute`` (829,440 rows for 576 GPUs) and its sorted copy
tripled the processor's RSS once a day. Here no more than one part (read in slices)
and one bucket of rows are in memory at a time:

1. Count the rows of each value of the leading keys (the first two sort keys), reading
   those columns alone. In sort order, the values are cut into buckets of about
   ``bucket_rows`` rows; rows with equal leading keys share a bucket, so buckets are
   ranges of the sort order.
2. Read each part once, in slices, and spill each slice's rows to their buckets
   (Arrow IPC files in a temporary folder: ``$TMPDIR``).
3. Sort each bucket alone (stable: ties keep the order of the parts, as a sort of the
   whole would) and spill it again.
4. Stream the sorted buckets, in order, into one Parquet writer.

The object holds the same rows in the same order as a sort of the whole in memory,
written with the same settings (``parquet_bytes``). Inputs of at most ``bucket_rows``
rows are sorted in memory: the spill would only cost time.
"""

from __future__ import annotations

import io
import tempfile
from collections.abc import Sequence
from pathlib import Path

import polars as pl

BUCKET_ROWS = 65_536
"""Rows per bucket, and per slice of a part read: a bucket of ``gpu_minute`` is ~20 MiB
in memory."""


def _schema(parts: Sequence[bytes]) -> pl.Schema:
    """The parts' common schema, as ``pl.concat(how="vertical_relaxed")`` makes it."""
    empty = [pl.DataFrame(schema=pl.read_parquet_schema(io.BytesIO(p))) for p in parts]
    return pl.concat(empty, how="vertical_relaxed").schema


def _rows(part: bytes) -> int:
    return int(pl.scan_parquet(io.BytesIO(part)).select(pl.len()).collect().item())


def _slices(part: bytes, rows: int, size: int, schema: pl.Schema) -> list[pl.LazyFrame]:
    scan = pl.scan_parquet(io.BytesIO(part))
    return [scan.slice(start, size).cast(schema, strict=True)
            for start in range(0, rows, size)]


def _buckets(parts: Sequence[bytes], lead: list[str], bucket_rows: int) -> pl.DataFrame:
    """Each value of the leading keys with its bucket (``_bucket``), in sort order."""
    counts = pl.concat([pl.read_parquet(io.BytesIO(p), columns=lead).group_by(lead).len()
                        for p in parts], how="vertical_relaxed")
    counts = counts.group_by(lead).agg(pl.col("len").sum()).sort(lead, nulls_last=True)
    before = pl.col("len").cum_sum() - pl.col("len")
    return counts.select(*lead, (before // bucket_rows).cast(pl.UInt32).alias("_bucket"))


def sorted_parquet(parts: Sequence[bytes], sort_by: list[str], row_group_size: int,
                   bucket_rows: int = BUCKET_ROWS) -> tuple[bytes, int]:
    """The rows of ``parts`` (Parquet files), sorted by ``sort_by`` (nulls last, ties in
    the parts' order), as one Parquet object with row groups of ``row_group_size``;
    and its number of rows."""
    from gpuledger.pipeline.warehouse import parquet_bytes  # one writer's settings

    schema = _schema(parts)
    sizes = [_rows(p) for p in parts]
    total = sum(sizes)
    if total <= bucket_rows:
        frames = [pl.read_parquet(io.BytesIO(p)).cast(schema) for p in parts]
        rows = pl.concat(frames) if frames else pl.DataFrame(schema=schema)
        rows = rows.sort(sort_by, nulls_last=True, maintain_order=True)
        return parquet_bytes(rows, row_group_size), total
    lead = sort_by[:2]
    buckets = _buckets(parts, lead, bucket_rows)
    with tempfile.TemporaryDirectory(prefix="gpuledger-sort-") as tmp_name:
        tmp = Path(tmp_name)
        piece = 0
        for part, rows_in in zip(parts, sizes, strict=True):
            for lazy in _slices(part, rows_in, bucket_rows, schema):
                frame = lazy.collect().join(buckets, on=lead, how="left", nulls_equal=True,
                                            maintain_order="left")
                for (bucket,), rows in frame.partition_by(
                        "_bucket", as_dict=True, include_key=False).items():
                    rows.write_ipc(tmp / f"{bucket:08d}-{piece:08d}.arrow")
                piece += 1
        del buckets
        spilled = sorted(tmp.glob("*-*.arrow"))
        names: list[Path] = []
        for bucket in sorted({p.name.split("-")[0] for p in spilled}):
            files = [p for p in spilled if p.name.startswith(f"{bucket}-")]
            rows = pl.concat([pl.read_ipc(f) for f in files])
            for f in files:
                f.unlink()
            names.append(tmp / f"sorted-{bucket}.arrow")
            rows.sort(sort_by, nulls_last=True, maintain_order=True).write_ipc(names[-1])
            del rows
        sink = io.BytesIO()
        pl.concat([pl.scan_ipc(n) for n in names]).sink_parquet(
            sink, compression="zstd", statistics=True, row_group_size=row_group_size)
    return sink.getvalue(), total
