"""Frames to metric families: one sample per row, label columns as strings."""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from gpuledger.pipeline.terminal_fit import CONTROL_PATTERN

MIB = 1_048_576.0
UNKNOWN = "unknown"
ANY_CARD = "any"
"""``requested_card_type`` of a job that asked for no card type: any card of its pool."""
REQUESTED_CARD = "requested_card_type"


def label_exprs(labels: Sequence[str], empty: Sequence[str] = (),
                any_card: bool = False) -> list[pl.Expr]:
    """Label columns as strings; nulls become ``unknown`` (or ``""`` for ``empty``, and
    ``any`` for ``requested_card_type`` when ``any_card``), and so does an empty value
    where empty means something else (``team=""`` is a GPU no job holds, not a job
    whose team was given as ""). Control characters (C0, DEL, C1, the line and
    paragraph separators) become U+FFFD: they went raw into the exposition, and from
    there into alert notifications."""
    def fill(c: str) -> str:
        if c in empty:
            return ""
        return ANY_CARD if any_card and c == REQUESTED_CARD else UNKNOWN

    def label(c: str) -> pl.Expr:
        text = pl.col(c).cast(pl.String).str.replace_all(CONTROL_PATTERN, "\ufffd")
        if c not in empty:
            text = text.replace("", None)
        return text.fill_null(fill(c)).alias(c)

    return [label(c) for c in labels]



def gauge(name: str, doc: str, frame: pl.DataFrame, labels: Sequence[str],
          value: str | pl.Expr, empty: Sequence[str] = (),
          any_card: bool = False) -> GaugeMetricFamily:
    """A gauge with one sample per row of ``frame`` (rows whose value is null are left out)."""
    family = GaugeMetricFamily(name, doc, labels=list(labels))
    if frame.is_empty():
        return family
    expr = pl.col(value) if isinstance(value, str) else value
    rows = frame.select(*label_exprs(labels, empty, any_card),
                        expr.cast(pl.Float64).alias("_v")) \
        .filter(pl.col("_v").is_not_null())
    n = len(labels)
    for row in rows.iter_rows():
        family.add_metric(list(row[:n]), row[n])
    return family


def counter(name: str, doc: str, values: dict[str, int | float] | int | float,
            label: str | None = None) -> CounterMetricFamily:
    """A counter from a number or from ``{label value: number}``."""
    if label is None:
        assert not isinstance(values, dict)
        return CounterMetricFamily(name, doc, value=float(values))
    assert isinstance(values, dict)
    family = CounterMetricFamily(name, doc, labels=[label])
    for key, v in sorted(values.items()):
        family.add_metric([key], float(v))
    return family
