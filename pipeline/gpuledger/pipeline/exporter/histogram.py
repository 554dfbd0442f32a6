"""A cumulative histogram with labels, fed whole frames at a time (columnar)."""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl
from prometheus_client.utils import floatToGoString


class Histogram:
    """Bucket counts per label set; :meth:`observe` adds a frame of observations."""

    def __init__(self, labels: Sequence[str], buckets: Sequence[float]) -> None:
        self.labels = list(labels)
        self.buckets = sorted(buckets)
        self._state = pl.DataFrame(schema={
            **{name: pl.String() for name in self.labels},
            **{f"le_{i}": pl.Int64() for i in range(len(self.buckets))},
            "count": pl.Int64(), "sum": pl.Float64()})

    def observe(self, frame: pl.DataFrame, value: str) -> None:
        """Add the non-null values of column ``value``, grouped by the label columns."""
        obs = frame.filter(pl.col(value).is_not_null())
        if obs.is_empty():
            return
        v = pl.col(value)
        inc = obs.group_by(self.labels).agg(
            *[(v <= b).sum().cast(pl.Int64).alias(f"le_{i}") for i, b in enumerate(self.buckets)],
            pl.len().cast(pl.Int64).alias("count"),
            v.sum().cast(pl.Float64).alias("sum"),
        )
        both = pl.concat([self._state, inc.select(self._state.columns)])
        self._state = both.group_by(self.labels).agg(
            pl.exclude(self.labels).sum()).sort(self.labels)

    def rows(self) -> list[tuple[list[str], list[tuple[str, float]], float]]:
        """``(label values, [(le, cumulative count)...,("+Inf", count)], sum)`` per label set."""
        out = []
        les = [str(floatToGoString(b)) for b in self.buckets]  # type: ignore[no-untyped-call]
        for row in self._state.iter_rows():
            labels = [str(x) for x in row[:len(self.labels)]]
            counts = row[len(self.labels):len(self.labels) + len(les)]
            total, total_sum = row[-2], row[-1]
            buckets = [(le, float(c)) for le, c in zip(les, counts, strict=True)]
            buckets.append(("+Inf", float(total)))
            out.append((labels, buckets, float(total_sum)))
        return out
