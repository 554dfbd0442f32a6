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
   whole would) and hand its rows, bucket after bucket, to one Parquet writer that
   writes each row group as soon as it is full.

The object holds the same rows in the same order as a sort of the whole in memory, in
the same row groups, whatever the bucket size. Inputs of at most ``bucket_rows`` rows
are sorted in memory: the spill would only cost time.
"""

from __future__ import annotations

import io
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq

BUCKET_ROWS = 65_536
"""Rows per bucket, and per slice of a part read: a bucket of ``gpu_minute`` is ~20 MiB
in memory."""
DICTIONARY_SHARE = 0.05
"""A column is dictionary-encoded when its first row group has at most this many distinct
values per row (ids, states, flags); the noisy measurements are not."""


def _schema(parts: Sequence[bytes]) -> pl.Schema:
    """The parts' common schema, as ``pl.concat(how="vertical_relaxed")`` makes it."""
    empty = [pl.DataFrame(schema=pl.read_parquet_schema(io.BytesIO(p))) for p in parts]
    return pl.concat(empty, how="vertical_relaxed").schema


Keep = Callable[[pl.LazyFrame], pl.LazyFrame]
"""Which rows of a part to take (a filter; it may join a small frame), applied to the
part's rows or to a slice of them."""


def _all(rows: pl.LazyFrame) -> pl.LazyFrame:
    return rows


def _rows(part: bytes) -> int:
    return int(pl.scan_parquet(io.BytesIO(part)).select(pl.len()).collect().item())


def _slices(part: bytes, rows: int, size: int, schema: pl.Schema) -> list[pl.LazyFrame]:
    scan = pl.scan_parquet(io.BytesIO(part))
    return [scan.slice(start, size).cast(schema, strict=True)
            for start in range(0, rows, size)]


def _buckets(parts: Sequence[bytes], keeps: Sequence[Keep], lead: list[str],
             bucket_rows: int) -> pl.DataFrame:
    """Each value of the leading keys with its bucket (``_bucket``), in sort order."""
    counts = pl.concat([keep(pl.scan_parquet(io.BytesIO(p))).select(lead).group_by(lead).len()
                        .collect() for p, keep in zip(parts, keeps, strict=True)],
                       how="vertical_relaxed")
    counts = counts.group_by(lead).agg(pl.col("len").sum()).sort(lead, nulls_last=True)
    before = pl.col("len").cum_sum() - pl.col("len")
    return counts.select(*lead, (before // bucket_rows).cast(pl.UInt32).alias("_bucket"))


class _RowGroups:
    """Sorted rows in; row groups of exactly ``size`` rows out (the last may be short),
    each written as soon as it is full: at most a row group and a bucket wait in memory.

    PyArrow writes them (Polars has no writer that appends row groups). PyArrow's
    default, a dictionary for every column, made a day of ``gpu_minute`` 6 % larger
    than Polars' writer does; with ``DICTIONARY_SHARE`` it is 0.6 % smaller."""

    def __init__(self, path: Path, schema: pl.Schema, size: int) -> None:
        self.path, self.schema, self.size = path, schema, size
        self.pending = pl.DataFrame(schema=schema)
        self.writer: pq.ParquetWriter | None = None
        self.rows = 0
        """Rows added so far."""

    def add(self, rows: pl.DataFrame) -> None:
        self.rows += rows.height
        self.pending = (pl.concat([self.pending, rows], rechunk=True) if self.pending.height
                        else rows)
        while self.pending.height >= self.size:
            self._write(self.pending.slice(0, self.size))
            self.pending = self.pending.slice(self.size)

    def close(self) -> None:
        if self.pending.height or self.writer is None:
            self._write(self.pending)
        assert self.writer is not None
        self.writer.close()

    def _write(self, rows: pl.DataFrame) -> None:
        table = rows.to_arrow()
        if self.writer is None:
            limit = DICTIONARY_SHARE * rows.height
            dictionary = [c for c in rows.columns if rows[c].n_unique() <= limit]
            self.writer = pq.ParquetWriter(
                self.path, table.schema, compression="zstd", compression_level=3,
                use_dictionary=dictionary, write_statistics=True)
        self.writer.write_table(table, row_group_size=self.size)


def sorted_parquet(parts: Sequence[bytes], sort_by: list[str], row_group_size: int,
                   bucket_rows: int = BUCKET_ROWS,
                   keep: Sequence[Keep | None] | None = None) -> tuple[bytes, int]:
    """The rows of ``parts`` (Parquet files), sorted by ``sort_by`` (nulls last, ties in
    the parts' order), as one Parquet object with row groups of ``row_group_size``;
    and its number of rows. ``keep``: per part, which of its rows to take (None: all)."""
    keeps = [k or _all for k in (keep or [None] * len(parts))]
    schema = _schema(parts)
    sizes = [_rows(p) for p in parts]
    with tempfile.TemporaryDirectory(prefix="gpuledger-sort-") as tmp_name:
        tmp = Path(tmp_name)
        out = _RowGroups(tmp / "sorted.parquet", schema, row_group_size)
        if sum(sizes) <= bucket_rows:  # in memory: a spill would only cost time
            frames = [k(pl.scan_parquet(io.BytesIO(p)).cast(schema)).collect()
                      for p, k in zip(parts, keeps, strict=True)]
            if frames:
                out.add(pl.concat(frames).sort(sort_by, nulls_last=True, maintain_order=True))
        else:
            for bucket in _spill(parts, keeps, sizes, sort_by[:2], bucket_rows, schema, tmp):
                rows = pl.concat([pl.read_ipc(f) for f in bucket])
                for f in bucket:
                    f.unlink()
                out.add(rows.sort(sort_by, nulls_last=True, maintain_order=True))
                del rows
        out.close()
        return out.path.read_bytes(), out.rows


def _spill(parts: Sequence[bytes], keeps: Sequence[Keep], sizes: list[int], lead: list[str],
           bucket_rows: int, schema: pl.Schema, tmp: Path) -> list[list[Path]]:
    """Each part's rows, spilled to their buckets; the spilled files of each bucket, in
    the buckets' order (and each bucket's in the parts' order)."""
    buckets = _buckets(parts, keeps, lead, bucket_rows)
    files: dict[int, list[Path]] = {}
    piece = 0
    for part, keep, rows_in in zip(parts, keeps, sizes, strict=True):
        for lazy in _slices(part, rows_in, bucket_rows, schema):
            frame = keep(lazy).collect().join(buckets, on=lead, how="left", nulls_equal=True,
                                              maintain_order="left")
            for (bucket,), rows in frame.partition_by(
                    "_bucket", as_dict=True, include_key=False).items():
                path = tmp / f"{bucket:08d}-{piece:08d}.arrow"
                rows.write_ipc(path)
                files.setdefault(int(bucket), []).append(path)
            piece += 1
    return [files[b] for b in sorted(files)]
