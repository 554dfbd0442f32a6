"""Validation of contract records in columnar form.

:func:`validate` checks a whole frame of one record type with Polars expressions (no
per-row Python) and splits it into the valid rows, conformed to
:func:`gpuledger.pipeline.columns.schema_of`, and the rejects (:data:`REJECT_SCHEMA`),
each with a reason that names the field and the value, e.g.::

    field 'util_gpu': 140.0 is above the maximum 100
    field 'node': required but missing
    field 'event': 'exploded' is not one of submitted, started, ...
    field 'time': 2031-01-01T00:00:00Z is more than 3600 s in the future
    field 'mem_used_mib': NaN is not a number

A row with several problems is rejected once, with all of its reasons joined by ``"; "``
in field order. The rules (see ``docs/events.md``):

* envelope: ``v`` must be the contract version this processor reads
  (:data:`~gpuledger.contract.schema.CONTRACT_VERSION`); ``type`` must be the frame's
  record type; ``time`` must be a valid RFC 3339 time (when given as text), not before
  ``min_time`` and at most ``max_future_s`` seconds after ``now``;
* required fields must be present and non-null; required text fields must be non-empty;
* numbers within the field's inclusive ``minimum``/``maximum``; NaN and ±inf are
  rejected in every float field (also inside ``processes`` and ``allocation``);
* text fields with ``choices`` must hold one of them;
* ``processes`` entries need a ``pid`` >= 0; ``used_mib``, when given, is finite and >= 0;
* ``allocation`` entries need a non-empty ``node``, a ``gpu_index`` >= 0 and a
  ``fraction`` in (0, 1]; a null ``fraction`` means a whole GPU and becomes 1.0 in the
  valid frame; a ``started`` job event must carry a non-empty allocation, which lists a
  whole GPU once (shares of one GPU, a pod's MIG instances, may be listed apart);
* ``int_list`` entries (``unhealthy_gpus``) are non-null, >= 0 and below ``gpu_count``;
* physical limits (:class:`~gpuledger.pipeline.config.Limits`, the configuration's
  ``limits`` section; within the contract's own ranges): power, temperature, SM clock,
  memory per GPU (``mem_used_mib``, ``mem_total_mib``, a process's ``used_mib``, an
  inventory's or a job's ``gpu_mem_mib``), PCIe/NVLink byte rates; ``mem_used_mib`` and
  the processes' ``used_mib`` added up at most ``mem_total_mib`` of the same sample
  × (1 + ``memory_margin``) when both are present. Checks against a node's inventory
  (GPU index, card memory) need the processor's state and are made there;
* ``json`` fields (``labels``) must hold the text of a JSON object of strings. This one
  check parses each *distinct* value once with orjson (labels repeat across the rows of a
  node, so this is cheap), the only Python-level loop in this module.

Columns may arrive in compatible dtypes (any integer or float width for numbers, a
naive or zoned Datetime or RFC 3339 text for ``time``); a value that cannot be read
losslessly as its field's kind (1.5 for an integer, a string column for a number) is
rejected with a reason instead of raising.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import orjson
import polars as pl
import pyarrow as pa

from gpuledger.contract.schema import CONTRACT_VERSION, FIELDS, Field, RecordType
from gpuledger.pipeline.columns import TIME_DTYPE, conform, dtype_of, schema_of
from gpuledger.pipeline.config import Limits

__all__ = [
    "MIN_TIME",
    "REJECT_SCHEMA",
    "RFC3339_PATTERN",
    "Checked",
    "check",
    "concat_rejects",
    "empty_rejects",
    "format_time",
    "parse_rfc3339",
    "render_rows",
    "validate",
]

REJECT_SCHEMA = pl.Schema(
    {
        "record_type": pl.String(),  # the record type claimed by the row; null if unknown
        "source": pl.String(),  # where the row came from (file, topic/partition, ...)
        "line": pl.Int64(),  # 1-based line number in the source; null if not from a file
        "reason": pl.String(),  # every problem found, joined by "; "
        "raw": pl.String(),  # the original line, or a JSON rendering of the row
    }
)
"""Schema of the reject (dead-letter) frames produced by validation and decoding."""

DEFAULT_LIMITS = Limits()
"""The physical bounds used when ``validate``/``check`` are given none."""

MIN_TIME = datetime(2000, 1, 1, tzinfo=UTC)
"""Default lower bound for event times: anything earlier is a broken clock."""

RFC3339_PATTERN = (
    r"^[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])[Tt]"
    r"([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]+)?"
    r"([Zz]|[+-]([01][0-9]|2[0-3]):[0-5][0-9])$"
)
"""RFC 3339 ``date-time`` (section 5.6): ``T``/``Z`` in either case, fraction of any
length (truncated to milliseconds), an offset is required; leap seconds (``:60``) and
space separators are not accepted."""

_TIME_FORMAT = "%Y-%m-%dT%H:%M:%S%.f%#z"
_MAX_VALUE_CHARS = 120

_INTEGER_DTYPES = (
    pl.Int8,
    pl.Int16,
    pl.Int32,
    pl.Int64,
    pl.UInt8,
    pl.UInt16,
    pl.UInt32,
    pl.UInt64,
)
_FLOAT_DTYPES = (pl.Float32, pl.Float64)
_TEXT_DTYPES = (pl.String, pl.Categorical, pl.Enum)

_KIND_WORDS = {
    "int": "an integer",
    "float": "a number",
    "str": "text",
    "bool": "a boolean",
    "time": "a time",
    "processes": "a list of processes",
    "allocation": "an allocation list",
    "int_list": "a list of integers",
    "json": "JSON text",
}


def empty_rejects() -> pl.DataFrame:
    """A reject frame with no rows."""
    return pl.DataFrame(schema=REJECT_SCHEMA)


def parse_rfc3339(strings: pl.Series) -> pl.Series:
    """Parse RFC 3339 text into ``Datetime("ms", "UTC")``; invalid or null text gives null.

    Columnar: a regex gate (:data:`RFC3339_PATTERN`) first, then Arrow's ISO 8601 cast
    (about 20x faster than Polars' ``str.to_datetime``); only if Arrow refuses a value
    that passed the gate (an impossible calendar date such as February 30, lower-case
    ``t``/``z``) is the whole column parsed with Polars, which then nulls those values.
    Both parsers give identical results on the values they both accept.
    """
    name = strings.name
    gated = (
        strings.cast(pl.String)
        .to_frame("s")
        .select(pl.when(pl.col("s").str.contains(RFC3339_PATTERN)).then(pl.col("s")))
        .to_series()
    )
    arrow = gated.to_arrow()
    parsed: pa.Array | None
    try:
        parsed = arrow.cast(pa.timestamp("ms", "UTC"))
    except pa.ArrowException:
        try:  # more than 3 fractional digits: parse at ns, truncate to ms
            parsed = arrow.cast(pa.timestamp("ns", "UTC")).cast(
                pa.timestamp("ms", "UTC"), safe=False
            )
        except pa.ArrowException:
            parsed = None
    if parsed is not None:
        out = pl.Series(name, parsed)
        if out.dtype == TIME_DTYPE:
            return out
    return (
        gated.str.to_uppercase()
        .str.to_datetime(_TIME_FORMAT, time_unit="ms", time_zone="UTC", strict=False)
        .cast(TIME_DTYPE)
        .alias(name)
    )


SHOWN_MS = 8_000_000_000_000_000
"""Times are written as dates within this many ms of 1970 (about ±253,000 years: the
calendar's range); beyond it, which only raw Arrow input can hold, as the number."""


def _raw_ms(expr: pl.Expr) -> pl.Expr:
    return expr.cast(pl.Int64).cast(pl.String) + pl.lit(" ms since 1970-01-01")


def _showable(expr: pl.Expr) -> pl.Expr:
    """``expr`` where a date can be written for it, else null (formatting a time beyond
    the calendar's range panicked)."""
    return pl.when(expr.cast(pl.Int64).is_between(-SHOWN_MS, SHOWN_MS)).then(expr)


def format_time(expr: pl.Expr) -> pl.Expr:
    """Render a ``Datetime("ms", "UTC")`` expression as contract text,
    ``2026-01-05T00:00:10.000Z`` (a time beyond the calendar's range as its number)."""
    return pl.coalesce(
        _showable(expr).dt.convert_time_zone("UTC").dt.strftime("%Y-%m-%dT%H:%M:%S%.3fZ"),
        _raw_ms(expr))


def _short_time(expr: pl.Expr) -> pl.Expr:
    """A time for reasons: milliseconds only when non-zero."""
    shown = _showable(expr)
    return pl.coalesce(
        pl.when(shown.dt.millisecond() == 0)
        .then(shown.dt.strftime("%Y-%m-%dT%H:%M:%SZ"))
        .otherwise(shown.dt.strftime("%Y-%m-%dT%H:%M:%S%.3fZ")),
        _raw_ms(expr))


def _fmt_number(x: float) -> str:
    """``100`` for 100.0, ``0.5`` for 0.5."""
    return str(int(x)) if float(x).is_integer() else repr(float(x))


def _quoted(expr: pl.Expr) -> pl.Expr:
    """Text value for a reason: single-quoted, long values shortened."""
    text = expr.cast(pl.String)
    short = (
        pl.when(text.str.len_chars() > _MAX_VALUE_CHARS)
        .then(pl.concat_str([text.str.slice(0, _MAX_VALUE_CHARS), pl.lit("...")]))
        .otherwise(text)
    )
    return pl.concat_str([pl.lit("'"), short, pl.lit("'")])


def _num(expr: pl.Expr) -> pl.Expr:
    """Numeric value for a reason (Polars' rendering: 140.0, NaN, inf, -inf, 5)."""
    return expr.cast(pl.String)


def _msg(*parts: str | pl.Expr) -> pl.Expr:
    """Concatenate literal text and expressions into one reason."""
    return pl.concat_str([pl.lit(p) if isinstance(p, str) else p for p in parts])


@dataclass(frozen=True)
class _Check:
    """One rule: ``cond`` is true where a row breaks it (null counts as not broken);
    ``reason`` renders the problem and is evaluated only on rows that break it."""

    cond: pl.Expr
    reason: pl.Expr
    screen: pl.Expr | None = None
    """A scalar that is true when ``cond`` may hold on some row (default ``cond.any()``);
    when no rule's screen holds, no per-row flags are built."""
    screen_entries: str | None = None
    """When set, ``screen`` reads this list column flattened to its entries."""


@dataclass
class _Prepared:
    """A frame brought to the contract's dtypes, with helper columns for the checks.

    ``checks`` holds, per field, the rules about values that could not be read (they go
    first in that field's reasons); ``present`` holds, per field whose source value may
    be non-null although the contract column is null, an expression that is true where
    the source had a value (so that such rows are not also called "missing").
    """

    frame: pl.DataFrame
    checks: dict[str, list[_Check]]
    present: dict[str, pl.Expr]


def _cast_problem(name: str, src: pl.DataType, field: Field) -> str | None:
    """Why a whole column of dtype ``src`` cannot hold ``field``; None when castable."""
    kind = field.kind
    if src == pl.Null:
        return None
    ok: bool
    if kind in ("int", "float"):
        ok = isinstance(src, _INTEGER_DTYPES + _FLOAT_DTYPES)
    elif kind in ("str", "json"):
        ok = isinstance(src, _TEXT_DTYPES)
    elif kind == "bool":
        ok = isinstance(src, pl.Boolean)
    elif kind == "time":
        ok = isinstance(src, pl.Datetime | pl.String)
    else:  # nested kinds: lists
        ok = isinstance(src, pl.List | pl.Array)
    if ok:
        return None
    return f"field '{name}': a column of {src} cannot be read as {_KIND_WORDS[kind]}"


def _prepare(frame: pl.DataFrame, record_type: RecordType) -> _Prepared:
    """Cast each contract column to its dtype, recording rows whose value did not survive."""
    columns: list[pl.Series] = []
    checks: dict[str, list[_Check]] = {}
    present: dict[str, pl.Expr] = {}
    n = frame.height
    for field in FIELDS[record_type]:
        name = field.name
        target = dtype_of(field)
        if name not in frame.columns:
            columns.append(pl.Series(name, [None] * n, dtype=target))
            continue
        src_series = frame.get_column(name)
        src = src_series.dtype
        if src == target:
            columns.append(src_series)
            continue
        problem = _cast_problem(name, src, field)
        casted: pl.Series | None = None
        if problem is None:
            if field.kind == "time" and src == pl.String:
                columns.append(parse_rfc3339(src_series).alias(name))
                raw_name = f"__raw_{name}"
                columns.append(src_series.alias(raw_name))
                present[name] = pl.col(raw_name).is_not_null()
                checks[name] = [
                    _Check(
                        pl.col(raw_name).is_not_null() & pl.col(name).is_null(),
                        _msg(
                            f"field '{name}': ",
                            _quoted(pl.col(raw_name)),
                            " is not an RFC 3339 time",
                        ),
                    )
                ]
                continue
            try:
                if field.kind == "time":  # a Datetime: naive ones are taken as UTC
                    zoned = (
                        src_series.dt.replace_time_zone("UTC")
                        if getattr(src, "time_zone", None) is None
                        else src_series.dt.convert_time_zone("UTC")
                    )
                    casted = zoned.cast(target)
                else:
                    casted = src_series.cast(target, strict=False)
            except (pl.exceptions.PolarsError, TypeError, ValueError) as exc:
                problem = f"field '{name}': a column of {src} cannot be read as " + (
                    f"{_KIND_WORDS[field.kind]} ({type(exc).__name__})"
                )
        if casted is None:
            columns.append(pl.Series(name, [None] * n, dtype=target))
            flag = f"__present_{name}"
            columns.append(src_series.is_not_null().alias(flag))
            present[name] = pl.col(flag)
            checks[name] = [_Check(pl.col(flag), pl.lit(problem))]
            continue
        lost = src_series.is_not_null() & casted.is_null()
        if field.kind == "int" and isinstance(src, _FLOAT_DTYPES):
            lost = lost | (casted.cast(pl.Float64) != src_series.cast(pl.Float64)).fill_null(False)
        columns.append(casted.alias(name))
        if lost.any():
            flag = f"__lost_{name}"
            orig = f"__orig_{name}"
            columns.append(lost.alias(flag))
            try:
                shown = src_series.cast(pl.String, strict=False)
            except pl.exceptions.PolarsError:
                shown = pl.Series(orig, ["value"] * n, dtype=pl.String)
            columns.append(shown.alias(orig))
            present[name] = pl.col(name).is_not_null() | pl.col(flag)
            checks[name] = [
                _Check(
                    pl.col(flag),
                    _msg(
                        f"field '{name}': ",
                        pl.col(orig),
                        f" cannot be read as {_KIND_WORDS[field.kind]}",
                    ),
                )
            ]
    return _Prepared(pl.DataFrame(columns), checks, present)


def _numeric_checks(name: str, col: pl.Expr, field: Field) -> list[_Check]:
    """Finite (floats) and inclusive bounds.

    Screens: a NaN or an infinity makes the column's sum non-finite; without one, the
    column's minimum and maximum decide the bounds (Polars' min/max skip NaN).
    """
    checks: list[_Check] = []
    finite: pl.Expr | None = None
    if field.kind == "float":
        not_finite_sum = ~col.sum().is_finite()
        checks.append(_Check(col.is_nan(), pl.lit(f"field '{name}': NaN is not a number"),
                             not_finite_sum))
        checks.append(
            _Check(col.is_infinite(), _msg(f"field '{name}': ", _num(col), " is not finite"),
                   not_finite_sum)
        )
        finite = col.is_finite()
    if field.minimum is not None:
        cond = col < field.minimum
        checks.append(
            _Check(
                cond if finite is None else cond & finite,
                _msg(
                    f"field '{name}': ",
                    _num(col),
                    f" is below the minimum {_fmt_number(field.minimum)}",
                ),
                (col.min() < field.minimum).fill_null(False),
            )
        )
    if field.maximum is not None:
        cond = col > field.maximum
        checks.append(
            _Check(
                cond if finite is None else cond & finite,
                _msg(
                    f"field '{name}': ",
                    _num(col),
                    f" is above the maximum {_fmt_number(field.maximum)}",
                ),
                (col.max() > field.maximum).fill_null(False),
            )
        )
    return checks


def _first(col: pl.Expr, value: pl.Expr, bad: pl.Expr) -> pl.Expr:
    """The first ``value`` among a list column's entries where ``bad`` holds."""
    return col.list.eval(value.filter(bad)).list.first()


def _entry_checks(name: str, col: pl.Expr, nested: list[tuple[str, str, str]]) -> list[_Check]:
    """Checks on the entries of a list-of-struct column.

    ``nested`` lists (subfield, rule, word) with rule one of ``required`` (non-null),
    ``nonempty`` (non-null, non-empty text), ``nonneg`` (>= 0), ``finite`` (not NaN/inf),
    ``fraction`` (in (0, 1]).
    """
    el = pl.element()
    # screens read the entries of every row as one column: a rule holds on some row's
    # entry exactly when it holds on some entry of the flattened column
    flat = pl.col(name)

    def screen(rule: Callable[[pl.Expr], pl.Expr]) -> pl.Expr:
        return rule(flat).any()

    checks = [
        _Check(
            col.list.eval(el.is_null()).list.any(),
            pl.lit(f"field '{name}': an entry is null"),
            screen(lambda e: e.is_null()),
        )
    ]
    for sub, rule, _word in nested:
        v = el.struct.field(sub)

        def field_of(e: pl.Expr, sub: str = sub) -> pl.Expr:
            return e.struct.field(sub)

        if rule == "required":
            checks.append(
                _Check(
                    col.list.eval(el.is_not_null() & v.is_null()).list.any(),
                    pl.lit(f"field '{name}': an entry has no {sub}"),
                    screen(lambda e: e.is_not_null() & field_of(e).is_null()),
                )
            )
        elif rule == "nonempty":
            checks.append(
                _Check(
                    col.list.eval(el.is_not_null() & (v.is_null() | (v == ""))).list.any(),
                    pl.lit(f"field '{name}': an entry has no {sub}"),
                    screen(lambda e: e.is_not_null()
                           & (field_of(e).is_null() | (field_of(e) == ""))),
                )
            )
        elif rule == "nonneg":
            float_word = _word == "float"

            def negative(e: pl.Expr, float_word: bool = float_word) -> pl.Expr:
                bad = field_of(e) < 0
                return bad & field_of(e).is_finite() if float_word else bad

            bad = negative(el)
            checks.append(
                _Check(
                    col.list.eval(bad).list.any(),
                    _msg(f"field '{name}': {sub} ", _num(_first(col, v, bad)), " is negative"),
                    screen(negative),
                )
            )
        elif rule == "finite":
            checks.append(
                _Check(
                    col.list.eval(v.is_nan()).list.any(),
                    pl.lit(f"field '{name}': {sub} NaN is not a number"),
                    screen(lambda e: field_of(e).is_nan()),
                )
            )
            checks.append(
                _Check(
                    col.list.eval(v.is_infinite()).list.any(),
                    _msg(
                        f"field '{name}': {sub} ",
                        _num(_first(col, v, v.is_infinite())),
                        " is not finite",
                    ),
                    screen(lambda e: field_of(e).is_infinite()),
                )
            )
        elif rule == "fraction":
            bad = v.is_finite() & ((v <= 0) | (v > 1))
            checks.append(
                _Check(
                    col.list.eval(bad).list.any(),
                    _msg(
                        f"field '{name}': {sub} ",
                        _num(_first(col, v, bad)),
                        " is not in (0, 1]",
                    ),
                    screen(lambda e: field_of(e).is_finite()
                           & ((field_of(e) <= 0) | (field_of(e) > 1))),
                )
            )
    return [dataclasses.replace(c, screen_entries=name) for c in checks]


def _json_object_of_strings(text: str) -> bool:
    """Whether ``text`` is a JSON object whose values are all strings."""
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        return False
    return isinstance(value, dict) and all(isinstance(v, str) for v in value.values())


@functools.cache
def _static_checks(record_type: RecordType, name: str) -> tuple[_Check, ...]:
    """The rules of one field that depend on nothing but the contract (cached)."""
    field = next(f for f in FIELDS[record_type] if f.name == name)
    names = {f.name for f in FIELDS[record_type]}
    col = pl.col(name)
    checks: list[_Check] = []
    if field.required and field.kind == "str":
        checks.append(_Check(col == "", pl.lit(f"field '{name}': required but empty")))
    if name == "v":
        checks.append(
            _Check(
                col != CONTRACT_VERSION,
                _msg(
                    "field 'v': unsupported contract version ",
                    _num(col),
                    f" (this processor reads v={CONTRACT_VERSION})",
                ),
            )
        )
    elif name == "type":
        checks.append(
            _Check(
                col != record_type,
                _msg(
                    "field 'type': ",
                    _quoted(col),
                    f" does not match the record type '{record_type}'",
                ),
            )
        )
    elif field.kind in ("int", "float"):
        checks.extend(_numeric_checks(name, col, field))
    elif field.kind == "str" and field.choices:
        checks.append(
            _Check(
                ~col.is_in(list(field.choices)),
                _msg(
                    f"field '{name}': ",
                    _quoted(col),
                    f" is not one of {', '.join(field.choices)}",
                ),
            )
        )
    elif field.kind == "processes":
        checks.extend(
            _entry_checks(
                name,
                col,
                [
                    ("pid", "required", "int"),
                    ("pid", "nonneg", "int"),
                    ("used_mib", "finite", "float"),
                    ("used_mib", "nonneg", "float"),
                ],
            )
        )
    elif field.kind == "allocation":
        checks.extend(
            _entry_checks(
                name,
                col,
                [
                    ("node", "nonempty", "str"),
                    ("gpu_index", "required", "int"),
                    ("gpu_index", "nonneg", "int"),
                    ("fraction", "finite", "float"),
                    ("fraction", "fraction", "float"),
                ],
            )
        )
    elif field.kind == "int_list":
        el = pl.element()
        checks.append(
            _Check(
                col.list.eval(el.is_null()).list.any(),
                pl.lit(f"field '{name}': an entry is null"),
            )
        )
        checks.append(
            _Check(
                col.list.eval(el < 0).list.any(),
                _msg(f"field '{name}': ", _num(_first(col, el, el < 0)), " is negative"),
            )
        )
        if name == "unhealthy_gpus" and "gpu_count" in names:
            checks.append(
                _Check(
                    col.list.max() >= pl.col("gpu_count"),
                    _msg(
                        f"field '{name}': ",
                        _num(col.list.max()),
                        " is not below gpu_count ",
                        _num(pl.col("gpu_count")),
                    ),
                )
            )
    return tuple(checks)


@functools.cache
def _row_checks(record_type: RecordType) -> tuple[_Check, ...]:
    """Rules across fields, checked even when a column holds no values at all."""
    if record_type != "job":
        return ()
    allocation = pl.col("allocation")
    return (
        _Check(
            (pl.col("event") == "started") & (allocation.is_null() | (allocation.list.len() == 0)),
            pl.lit("field 'allocation': a 'started' event needs a non-empty allocation"),
        ),
        _Check(  # a whole GPU twice was charged twice (120 GPU-s for a 60 s hold); shares
            # of one GPU may be listed apart (a pod's MIG instances: 3/7 and 2/7)
            allocation.list.eval(
                pl.struct(pl.element().struct.field("node"),
                          pl.element().struct.field("gpu_index")).is_duplicated()
                & (pl.element().struct.field("fraction").fill_null(1.0) >= 1.0)
            ).list.any().fill_null(False),
            pl.lit("field 'allocation': a GPU (node, gpu_index) is listed twice, once as a "
                   "whole GPU"),
        ),
    )


def _above(name: str, limit: float, key: str, unit: str, field: Field) -> _Check:
    """``name`` above a physical limit (finite values within the contract's own bounds:
    NaN, infinities and values out of the contract's range have their own reasons)."""
    col = pl.col(name)
    within = col <= field.maximum if field.maximum is not None else pl.lit(True)
    return _Check(
        col.is_finite() & within & (col > limit),
        _msg(f"field '{name}': ", _num(col),
             f" is above the physical limit {_fmt_number(limit)}{unit} (limits.{key})"),
        (col.max() > limit).fill_null(False),
    )


def _below(name: str, limit: float, key: str, unit: str, field: Field) -> _Check:
    col = pl.col(name)
    within = col >= field.minimum if field.minimum is not None else pl.lit(True)
    return _Check(
        col.is_finite() & within & (col < limit),
        _msg(f"field '{name}': ", _num(col),
             f" is below the physical limit {_fmt_number(limit)}{unit} (limits.{key})"),
        (col.min() < limit).fill_null(False),
    )


_BYTE_RATES = ("pcie_rx_bytes_s", "pcie_tx_bytes_s", "nvlink_rx_bytes_s", "nvlink_tx_bytes_s")


@functools.cache
def _limit_checks(record_type: RecordType, name: str, limits: Limits) -> tuple[_Check, ...]:
    """Physical bounds of one field (:class:`~gpuledger.pipeline.config.Limits`)."""
    mem = ("memory_max_mib", limits.memory_max_mib, " MiB")
    if record_type == "telemetry":
        bounds: dict[str, list[tuple[str, str, float, str]]] = {
            "power_w": [("max", "power_max_w", limits.power_max_w, " W")],
            "temp_c": [("min", "temp_min_c", limits.temp_min_c, " °C"),
                       ("max", "temp_max_c", limits.temp_max_c, " °C")],
            "sm_clock_mhz": [("max", "clock_max_mhz", limits.clock_max_mhz, " MHz")],
            "mem_used_mib": [("max", *mem)],
            "mem_total_mib": [("max", *mem)],
            **{rate: [("max", "byte_rate_max", limits.byte_rate_max, " bytes/s")]
               for rate in _BYTE_RATES},
        }
    else:  # inventory: memory per GPU; job: memory requested per GPU
        bounds = {"gpu_mem_mib": [("max", *mem)]}
    field = next(f for f in FIELDS[record_type] if f.name == name)
    checks = [(_above if side == "max" else _below)(name, limit, key, unit, field)
              for side, key, limit, unit in bounds.get(name, [])]
    if record_type == "telemetry" and name == "processes":
        el = pl.element()
        used = el.struct.field("used_mib")
        bad = used.is_finite() & (used > limits.memory_max_mib)
        checks.append(
            _Check(
                pl.col(name).list.eval(bad).list.any(),
                _msg(f"field '{name}': used_mib ", _num(_first(pl.col(name), used, bad)),
                     f" is above the physical limit {_fmt_number(limits.memory_max_mib)} MiB "
                     "(limits.memory_max_mib)"),
                (pl.col(name).struct.field("used_mib") > limits.memory_max_mib).any(),
                screen_entries=name,
            )
        )
    return tuple(checks)


@functools.cache
def _memory_checks(limits: Limits) -> tuple[tuple[str, _Check], ...]:
    """Memory used (by the GPU, by its processes together) against the sample's own
    ``mem_total_mib``, with ``limits.memory_margin``; (the field they need, the rule)."""
    total = pl.col("mem_total_mib")
    ceiling = total * (1 + limits.memory_margin)
    margin = f"{limits.memory_margin * 100:g} %"
    used = pl.col("mem_used_mib")
    processes = pl.col("processes").list.eval(pl.element().struct.field("used_mib")).list.sum()
    return (
        ("mem_used_mib", _Check(
            used.is_finite() & total.is_finite() & (used > ceiling),
            _msg("field 'mem_used_mib': ", _num(used), " is more than mem_total_mib ",
                 _num(total), f" (+{margin}, limits.memory_margin)"),
        )),
        ("processes", _Check(
            total.is_finite() & processes.is_finite() & (processes > ceiling),
            _msg("field 'processes': used_mib adds up to ", _num(processes),
                 ", more than mem_total_mib ", _num(total),
                 f" (+{margin}, limits.memory_margin)"),
        )),
    )


def _time_checks(name: str, now: datetime, max_future_s: float, min_time: datetime) -> list[_Check]:
    """Not too far in the future, not before ``min_time``."""
    col = pl.col(name)
    horizon = pl.lit(now + timedelta(seconds=max_future_s)).cast(TIME_DTYPE)
    floor = pl.lit(min_time).cast(TIME_DTYPE)
    return [
        _Check(
            col > horizon,
            _msg(
                f"field '{name}': ",
                _short_time(col),
                f" is more than {_fmt_number(max_future_s)} s in the future",
            ),
            (col.max() > horizon).fill_null(False),
        ),
        _Check(
            col < floor,
            _msg(f"field '{name}': ", _short_time(col), " is before ", _short_time(floor)),
            (col.min() < floor).fill_null(False),
        ),
    ]


def _json_checks(name: str, values: pl.Series) -> list[_Check]:
    """JSON text must be an object of strings; each distinct value is parsed once."""
    distinct = values.drop_nulls().unique()
    bad_values = [t for t in distinct.to_list() if not _json_object_of_strings(t)]
    if not bad_values:
        return []
    return [
        _Check(
            pl.col(name).is_in(bad_values),
            _msg(f"field '{name}': ", _quoted(pl.col(name)), " is not a JSON object of strings"),
        )
    ]


def _checks_for(
    prepared: _Prepared,
    record_type: RecordType,
    now: datetime,
    max_future_s: float,
    min_time: datetime,
    limits: Limits,
) -> list[_Check]:
    """Every rule of ``record_type``'s contract, in field order.

    Value rules are skipped for columns without a single value (sparse job events carry
    many all-null columns); "required but missing" and row rules always apply.
    """
    frame = prepared.frame
    empty = {
        name
        for name, nulls in zip(frame.columns, frame.null_count().row(0), strict=True)
        if nulls == frame.height
    }
    checks: list[_Check] = []
    for field in FIELDS[record_type]:
        name = field.name
        checks.extend(prepared.checks.get(name, ()))
        if field.required:
            present = prepared.present.get(name)
            missing = ~present if present is not None else pl.col(name).is_null()
            checks.append(_Check(missing, pl.lit(f"field '{name}': required but missing")))
        if name in empty:
            continue
        if field.kind == "time":
            checks.extend(_time_checks(name, now, max_future_s, min_time))
        elif field.kind == "json":
            checks.extend(_json_checks(name, frame.get_column(name)))
        else:
            checks.extend(_static_checks(record_type, name))
            checks.extend(_limit_checks(record_type, name, limits))
    checks.extend(_row_checks(record_type))
    if record_type == "telemetry" and "mem_total_mib" not in empty:
        checks.extend(c for name, c in _memory_checks(limits) if name not in empty)
    return checks


@dataclass
class Checked:
    """Outcome of :func:`check`: the valid rows and the rejected rows with reasons."""

    valid: pl.DataFrame
    """Valid rows, exactly ``schema_of(record_type)``."""
    rejected_index: pl.Series
    """Row positions (UInt32) of the rejected rows in the input frame, ascending."""
    reasons: pl.Series
    """One reason per rejected row (String), aligned with ``rejected_index``."""
    rejected: pl.DataFrame
    """The rejected rows in contract dtypes (times that did not parse are null)."""


def check(
    frame: pl.DataFrame,
    record_type: RecordType,
    *,
    now: datetime | None = None,
    max_future_s: float = 3600,
    min_time: datetime = MIN_TIME,
    limits: Limits | None = None,
) -> Checked:
    """Validate ``frame`` and return positions and reasons (the engine of :func:`validate`).

    ``limits``: the physical bounds (default :class:`~gpuledger.pipeline.config.Limits`,
    the configuration's ``limits`` section)."""
    if record_type not in FIELDS:
        raise ValueError(f"unknown record type {record_type!r}")
    now = _aware(now if now is not None else datetime.now(UTC))
    min_time = _aware(min_time)
    prepared = _prepare(frame, record_type)
    checks = _checks_for(prepared, record_type, now, max_future_s, min_time,
                         limits if limits is not None else DEFAULT_LIMITS)
    p = prepared.frame
    schema = schema_of(record_type)
    names = list(schema.names())
    # Fast path: one row of scalars says whether any rule may break on any row; only
    # then are the per-row flags built.
    if p.height >= _SCREEN_MIN_ROWS and not _may_break(p, checks):
        return Checked(
            valid=_finish(p.select(names), record_type),
            rejected_index=pl.Series("index", [], dtype=pl.UInt32),
            reasons=pl.Series("reason", [], dtype=pl.String),
            rejected=pl.DataFrame(schema=schema),
        )
    # One boolean column per rule (much cheaper for Polars to plan than one wide OR).
    flags = p.select([c.cond.alias(f"__flag{i}") for i, c in enumerate(checks)])
    bad_mask = flags.select(pl.any_horizontal(pl.all()).fill_null(False)).to_series()
    if not bad_mask.any():
        return Checked(
            valid=_finish(p.select(names), record_type),
            rejected_index=pl.Series("index", [], dtype=pl.UInt32),
            reasons=pl.Series("reason", [], dtype=pl.String),
            rejected=pl.DataFrame(schema=schema),
        )
    bad_rows = p.filter(bad_mask)
    reasons = (
        bad_rows.hstack(flags.filter(bad_mask))
        .select(
            pl.concat_str(
                [pl.when(pl.col(f"__flag{i}")).then(c.reason) for i, c in enumerate(checks)],
                separator="; ",
                ignore_nulls=True,
            ).alias("reason")
        )
        .to_series()
    )
    return Checked(
        valid=_finish(p.filter(~bad_mask).select(names), record_type),
        rejected_index=bad_mask.arg_true().cast(pl.UInt32).alias("index"),
        reasons=reasons,
        rejected=bad_rows,
    )


_SCREEN_MIN_ROWS = 4096
"""Below this many rows, building the per-row flags directly is as cheap as screening."""


def _may_break(frame: pl.DataFrame, checks: list[_Check]) -> bool:
    """Whether some rule may break on some row, from one row of scalars per source."""
    by_source: dict[str | None, list[pl.Expr]] = {}
    for i, c in enumerate(checks):
        screen = c.cond.any() if c.screen is None else c.screen
        by_source.setdefault(c.screen_entries, []).append(screen.alias(f"__screen{i}"))
    for entries, screens in by_source.items():
        source = frame if entries is None else frame.select(
            pl.col(entries).explode(empty_as_null=False, keep_nulls=False))
        if any(v is True for v in source.select(screens).row(0)):
            return True
    return False


def _finish(valid: pl.DataFrame, record_type: RecordType) -> pl.DataFrame:
    """Fill defaults in valid rows (allocation fraction null -> 1.0) and conform."""
    for field in FIELDS[record_type]:
        if field.kind == "allocation":
            valid = valid.with_columns(
                pl.col(field.name).list.eval(
                    pl.element().struct.with_fields(pl.field("fraction").fill_null(1.0))
                )
            )
    return conform(valid, record_type)


def _aware(moment: datetime) -> datetime:
    """Naive datetimes are taken as UTC."""
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def render_rows(rows: pl.DataFrame, record_type: RecordType) -> pl.Series:
    """A compact JSON rendering of each row (for rejects that have no original line).

    Time becomes contract text (or the original text when it did not parse); NaN and
    infinities render as null, because JSON has no spelling for them.
    """
    exprs: list[pl.Expr] = []
    for field in FIELDS[record_type]:
        name = field.name
        if name not in rows.columns:
            continue
        if field.kind == "time" and rows.schema[name] == TIME_DTYPE:
            shown = format_time(pl.col(name))
            raw_name = f"__raw_{name}"
            if raw_name in rows.columns:
                shown = pl.coalesce(shown, pl.col(raw_name))
            exprs.append(shown.alias(name))
        else:
            exprs.append(pl.col(name))
    if not exprs or rows.height == 0:
        return pl.Series("raw", ["{}"] * rows.height, dtype=pl.String)
    return rows.select(pl.struct(exprs).struct.json_encode().alias("raw")).to_series()


def validate(
    frame: pl.DataFrame,
    record_type: RecordType,
    *,
    now: datetime | None = None,
    max_future_s: float = 3600,
    min_time: datetime = MIN_TIME,
    source: str = "",
    line: pl.Series | None = None,
    raw: pl.Series | None = None,
    limits: Limits | None = None,
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Split ``frame`` (rows of ``record_type``) into valid rows and rejects.

    Returns ``(valid, rejects)``: ``valid`` has exactly ``schema_of(record_type)`` and the
    valid rows in input order; ``rejects`` has :data:`REJECT_SCHEMA`, one row per rejected
    input row in input order. ``now`` defaults to the wall clock (naive datetimes are
    taken as UTC). ``line`` (Int64, one per row) gives the rejects' line numbers (null
    otherwise); ``raw`` (String, one per row) gives their raw text, else each rejected
    row is rendered as JSON. ``limits``: the physical bounds (default: the configuration's
    defaults, :class:`~gpuledger.pipeline.config.Limits`).
    """
    for extra, label in ((line, "line"), (raw, "raw")):
        if extra is not None and extra.len() != frame.height:
            raise ValueError(f"{label} has {extra.len()} values for {frame.height} rows")
    result = check(frame, record_type, now=now, max_future_s=max_future_s, min_time=min_time,
                   limits=limits)
    idx = result.rejected_index
    n_bad = idx.len()
    if line is not None:
        lines = line.cast(pl.Int64).gather(idx)
    else:
        lines = pl.Series("line", [None] * n_bad, dtype=pl.Int64)
    if raw is not None:
        raws = raw.cast(pl.String).gather(idx)
    else:
        raws = render_rows(result.rejected, record_type)
    rejects = pl.DataFrame(
        {
            "record_type": pl.Series([record_type] * n_bad, dtype=pl.String),
            "source": pl.Series([source] * n_bad, dtype=pl.String),
            "line": lines.alias("line"),
            "reason": result.reasons,
            "raw": raws.alias("raw"),
        },
        schema=REJECT_SCHEMA,
    )
    return result.valid, rejects


def concat_rejects(parts: Sequence[pl.DataFrame]) -> pl.DataFrame:
    """Concatenate reject frames (any number, possibly none)."""
    frames = [p for p in parts if p.height]
    return pl.concat(frames) if frames else empty_rejects()
