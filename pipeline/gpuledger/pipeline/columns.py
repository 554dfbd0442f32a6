"""Columnar (Polars) form of the event contract.

Derived from :mod:`gpuledger.contract.schema`, so that the JSON form and the columnar
form cannot drift. Batches on the bus are Polars DataFrames with exactly these columns,
in this order, one frame per record type.
"""

from __future__ import annotations

import functools

import polars as pl

from gpuledger.contract.schema import FIELDS, Field, RecordType

TIME_DTYPE = pl.Datetime("ms", "UTC")

PROCESS_DTYPE = pl.Struct({"pid": pl.Int64, "used_mib": pl.Float64, "job_id": pl.String})
ALLOCATION_DTYPE = pl.Struct(
    {"node": pl.String, "gpu_index": pl.Int64, "gpu_uuid": pl.String, "fraction": pl.Float64}
)

_KIND_DTYPES: dict[str, pl.DataType] = {
    "int": pl.Int64(),
    "float": pl.Float64(),
    "str": pl.String(),
    "bool": pl.Boolean(),
    "time": TIME_DTYPE,
    "processes": pl.List(PROCESS_DTYPE),
    "allocation": pl.List(ALLOCATION_DTYPE),
    "int_list": pl.List(pl.Int64),
    "json": pl.String(),
}


def dtype_of(field: Field) -> pl.DataType:
    """The Polars dtype that holds ``field``."""
    return _KIND_DTYPES[field.kind]


@functools.cache
def schema_of(record_type: RecordType) -> pl.Schema:
    """The Polars schema of one record type's frames (do not modify: it is shared)."""
    return pl.Schema({f.name: dtype_of(f) for f in FIELDS[record_type]})


def empty_frame(record_type: RecordType) -> pl.DataFrame:
    """A frame of ``record_type`` with no rows."""
    return pl.DataFrame(schema=schema_of(record_type))


def conform(frame: pl.DataFrame, record_type: RecordType) -> pl.DataFrame:
    """Select the contract's columns in order, adding missing optional ones as nulls.

    Columns must already hold values of the right kind; this only orders, casts
    losslessly and fills absent optional columns. Extra columns are dropped.
    """
    schema = schema_of(record_type)
    if frame.schema == schema:
        return frame  # already the contract's columns, in order (decoded once, shared)
    exprs = [
        (pl.col(name).cast(dtype) if name in frame.columns else pl.lit(None, dtype)).alias(name)
        for name, dtype in schema.items()
    ]
    return frame.select(exprs)
