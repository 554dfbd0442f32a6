"""Sort Parquet parts into one Parquet object in bounded memory.

Compaction rewrites a closed day of hourly parts as one object sorted by its keys. Held
in memory, a day of ``gpu_minute`` (829,440 rows for 576 GPUs) and its sorted copy
tripled the processor's RSS once a day. Here no more than one part (read in slices)
and one bucket of rows are in memory at a time:

1. Sample the leading keys (the first two sort keys: every k-th row of each part, those
   columns alone) and cut the sorted sample into buckets of about ``bucket_rows`` rows.
   A bucket is a range of the sort order, known by its first value (its bound); rows
   with equal leading keys share a bucket. Any bounds give the same object: they only
   size the buckets.
2. Read each part once, in slices. A row's bucket is the number of bounds at or before
   its leading keys (one binary search per row); each slice's rows are appended to their
   buckets' files (an Arrow IPC stream per bucket, in a temporary folder: ``$TMPDIR``).
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
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

BUCKET_ROWS = 16_384
"""Rows per bucket, and per slice of a part read: a bucket of ``gpu_minute`` is ~4 MiB in
memory. Smaller buckets cost little more CPU now that a bucket is one file appended to
(bench/README.md, *Compaction's moment*); the row group being written (65,536 rows)
is then the largest thing held."""
SAMPLES_PER_BUCKET = 256
"""Rows sampled per bucket to place the buckets' bounds (``_bounds``)."""
MAX_BUCKETS = 256
"""At most this many buckets (their files are open while the parts are spilled): a larger
input gets larger buckets."""
DICTIONARY_SHARE = 0.05
"""A column is dictionary-encoded when its first row group has at most this many distinct
values per row (ids, states, flags); the noisy measurements are not."""


Part = bytes | Path
"""A Parquet file: its bytes, or a local file (a part fetched to disk stays out of memory)."""


def _source(part: Part) -> io.BytesIO | Path:
    return io.BytesIO(part) if isinstance(part, bytes) else part


def _schema(parts: Sequence[Part]) -> pl.Schema:
    """The parts' common schema, as ``pl.concat(how="vertical_relaxed")`` makes it."""
    empty = [pl.DataFrame(schema=pl.read_parquet_schema(_source(p))) for p in parts]
    return pl.concat(empty, how="vertical_relaxed").schema


Keep = Callable[[pl.LazyFrame], pl.LazyFrame]
"""Which rows of a part to take (a filter; it may join a small frame), applied to the
part's rows or to a slice of them."""


def _all(rows: pl.LazyFrame) -> pl.LazyFrame:
    return rows


def _rows(part: Part) -> int:
    return int(pl.scan_parquet(_source(part)).select(pl.len()).collect().item())


def _slices(part: Part, rows: int, size: int, schema: pl.Schema) -> list[pl.LazyFrame]:
    scan = pl.scan_parquet(_source(part))
    return [scan.slice(start, size).cast(schema, strict=True)
            for start in range(0, rows, size)]


def _keys(lead: list[str], schema: pl.Schema) -> list[pl.Expr]:
    """The leading keys as they are compared: a time as its integer, which orders alike
    (a group-by on integers holds a third of the memory a group-by on times does, and
    takes half the time: bench/README.md, *Compaction's memory, second pass*)."""
    return [pl.col(c).to_physical() if schema[c].is_temporal() else pl.col(c) for c in lead]


def _order(lead: list[str], schema: pl.Schema) -> pl.Expr:
    """The leading keys (``_keys``) as one struct that orders as the sort does, nulls last:
    each key comes after a flag that is true for a null."""
    return pl.struct(*[e for c, key in zip(lead, _keys(lead, schema), strict=True)
                       for e in (pl.col(c).is_null().alias(f"{c}_null"), key)])


def _bounds(parts: Sequence[Part], keeps: Sequence[Keep], lead: list[str],
            bucket_rows: int, schema: pl.Schema) -> pl.Series:
    """The first value of the leading keys (as ``_order``) of each bucket but the first,
    in sort order: every ``bucket_rows``-th row of the sort, estimated from a sample of
    ``SAMPLES_PER_BUCKET`` rows per bucket (every k-th row of each part). Any bounds
    give the same object; they only size the buckets, and a sample sizes them within a
    few per cent while holding 1/64 of the rows' keys at the default bucket size
    (counting every distinct key of a day held 70 MiB: bench/README.md, *Compaction's
    memory, second pass*). At most ``MAX_BUCKETS``."""
    every = max(bucket_rows // SAMPLES_PER_BUCKET, 1)
    keys = _keys(lead, schema)
    sample = pl.concat([keep(pl.scan_parquet(_source(p))).select(keys).gather_every(every)
                        .collect() for p, keep in zip(parts, keeps, strict=True)],
                       how="vertical_relaxed").sort(lead, nulls_last=True)
    step = max(bucket_rows // every, 1)
    return sample.select(_order(lead, sample.schema)).to_series() \
        .gather_every(step, offset=step).unique(maintain_order=True).head(MAX_BUCKETS - 1)


def _bucket_of(lead: list[str], bounds: pl.Series, schema: pl.Schema) -> pl.Expr:
    """A row's bucket: how many buckets' bounds its leading keys come at or after."""
    return pl.lit(bounds).search_sorted(_order(lead, schema), side="right").alias("_bucket")


class _RowGroups:
    """Sorted rows in; row groups of exactly ``size`` rows out (the last may be short),
    each written as soon as it is full: at most a row group and a bucket wait in memory.

    Rows wait as Arrow (each bucket made Arrow once, as it comes, and its Polars frame
    let go): a row group is then sliced from them without a copy, where waiting Polars
    rows were copied to Arrow whole at each write, and both were held.

    PyArrow writes them (Polars has no writer that appends row groups). PyArrow's
    default, a dictionary for every column, made a day of ``gpu_minute`` 6 % larger
    than Polars' writer does; with ``DICTIONARY_SHARE`` it is 0.6 % smaller."""

    def __init__(self, path: Path, schema: pl.Schema, size: int) -> None:
        self.path, self.size = path, size
        self.pending = pl.DataFrame(schema=schema).to_arrow()
        self.writer: pq.ParquetWriter | None = None
        self.rows = 0
        """Rows added so far."""

    def add(self, rows: pl.DataFrame) -> None:
        self.rows += rows.height
        # chunks side by side, not copied into one: PyArrow writes a row group of them
        self.pending = pa.concat_tables([self.pending, rows.to_arrow()]) \
            if self.pending.num_rows else rows.to_arrow()
        while self.pending.num_rows >= self.size:
            self._write(self.pending.slice(0, self.size))
            self.pending = self.pending.slice(self.size)

    def close(self) -> None:
        if self.pending.num_rows or self.writer is None:
            self._write(self.pending)
        assert self.writer is not None
        self.writer.close()

    def _write(self, table: pa.Table) -> None:
        if self.writer is None:
            rows = pl.from_arrow(table, rechunk=False)
            assert isinstance(rows, pl.DataFrame)
            limit = DICTIONARY_SHARE * rows.height
            dictionary = [c for c in rows.columns if rows[c].n_unique() <= limit]
            self.writer = pq.ParquetWriter(
                self.path, table.schema, compression="zstd", compression_level=3,
                use_dictionary=dictionary, write_statistics=True)
        self.writer.write_table(table, row_group_size=self.size)


def sorted_parquet(parts: Sequence[Part], sort_by: list[str], row_group_size: int,
                   bucket_rows: int = BUCKET_ROWS,
                   keep: Sequence[Keep | None] | None = None) -> tuple[bytes, int]:
    """The rows of ``parts`` (Parquet files), sorted by ``sort_by`` (nulls last, ties in
    the parts' order), as one Parquet object with row groups of ``row_group_size``;
    and its number of rows. ``keep``: per part, which of its rows to take (None: all)."""
    with tempfile.TemporaryDirectory(prefix="gpuledger-sort-") as tmp:
        out = Path(tmp) / "sorted.parquet"
        rows = sort_into(out, parts, sort_by, row_group_size, bucket_rows, keep)
        return out.read_bytes(), rows


def sort_into(out: Path, parts: Sequence[Part], sort_by: list[str], row_group_size: int,
              bucket_rows: int = BUCKET_ROWS,
              keep: Sequence[Keep | None] | None = None) -> int:
    """``sorted_parquet`` written to the file ``out`` (never held in memory whole); the
    number of rows. The spill goes beside ``out``, in a folder of its own."""
    keeps = [k or _all for k in (keep or [None] * len(parts))]
    schema = _schema(parts)
    sizes = [_rows(p) for p in parts]
    with tempfile.TemporaryDirectory(prefix="gpuledger-sort-", dir=out.parent) as tmp:
        writer = _RowGroups(out, schema, row_group_size)
        if sum(sizes) <= bucket_rows:  # in memory: a spill would only cost time
            frames = [k(pl.scan_parquet(_source(p)).cast(schema)).collect()
                      for p, k in zip(parts, keeps, strict=True)]
            if frames:
                writer.add(pl.concat(frames).sort(sort_by, nulls_last=True,
                                                  maintain_order=True))
        else:
            rows_per_bucket = max(bucket_rows, -(-sum(sizes) // MAX_BUCKETS))
            with _Spill(Path(tmp), schema) as spill:
                _spill(spill, parts, keeps, sizes, sort_by[:2], rows_per_bucket, schema)
                for rows in spill.buckets():
                    writer.add(rows.sort(sort_by, nulls_last=True, maintain_order=True))
                    del rows
        writer.close()
        return writer.rows


class _Spill:
    """Each bucket's rows in a file of its own (an Arrow IPC stream), appended slice by
    slice. A file per slice and bucket would cost a write and a read of its own each,
    and every hour of a day holds rows of nearly every bucket."""

    def __init__(self, tmp: Path, schema: pl.Schema) -> None:
        self.tmp = tmp
        self.schema = pl.DataFrame(schema=schema).to_arrow().schema
        self.files: dict[int, tuple[Path, pa.NativeFile, pa.ipc.RecordBatchStreamWriter]] = {}

    def add(self, rows: pl.DataFrame) -> None:
        """One slice's rows, with their bucket in ``_bucket``: put in bucket order (stable),
        made Arrow once, and written to each bucket's file as a slice of that."""
        rows = rows.sort("_bucket", maintain_order=True)
        runs = rows.select(pl.col("_bucket").value_counts(sort=False)).unnest("_bucket") \
            .sort("_bucket")
        table = rows.drop("_bucket").to_arrow()
        start = 0
        for number, count in runs.iter_rows():
            if number not in self.files:
                path = self.tmp / f"{number:08d}.arrow"
                sink = pa.OSFile(str(path), "wb")
                self.files[number] = (path, sink, pa.ipc.new_stream(sink, self.schema))
            self.files[number][2].write_table(table.slice(start, count))
            start += count

    def __enter__(self) -> _Spill:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the buckets' files (again: no harm)."""
        for _, sink, writer in self.files.values():
            if not sink.closed:
                writer.close()
                sink.close()

    def buckets(self) -> Iterator[pl.DataFrame]:
        """Each bucket's rows (in the slices' order), bucket after bucket in sort order;
        a bucket's file is gone once read."""
        self.close()
        for number in sorted(self.files):
            path = self.files[number][0]
            rows = pl.read_ipc_stream(path)
            path.unlink()
            yield rows


def _spill(spill: _Spill, parts: Sequence[Part], keeps: Sequence[Keep], sizes: list[int],
           lead: list[str], bucket_rows: int, schema: pl.Schema) -> None:
    """Each part's rows, spilled slice by slice to their buckets."""
    bucket = _bucket_of(lead, _bounds(parts, keeps, lead, bucket_rows, schema), schema)
    for part, keep, rows_in in zip(parts, keeps, sizes, strict=True):
        for lazy in _slices(part, rows_in, bucket_rows, schema):
            spill.add(keep(lazy).with_columns(bucket).collect())
