"""Telemetry samples → one row per GPU-minute, folded in as batches arrive.

Samples are not kept until their minute closes: each batch is folded at once into
*partials* per (minute, node, GPU) — sums and counts for the means, maxima, minima
(:func:`partials`) — that add up across batches (:func:`merge`) and become the
GPU-minute's telemetry when the minute closes (:func:`finish`). Memory follows the open
GPU-minutes, not the samples: an hour of a 9,216-GPU fleet at 1 s is 33 M samples but
553 k partial rows.

- **Duplicates** (same node, GPU, MIG instance and time) count once, within a batch and
  across batches: each open minute keeps the keys of the samples it has taken
  (:class:`SampleKeys`: the sample's time and a 64-bit hash of node, GPU and MIG
  instance); a sample whose key is there already is a repeat (counted, not folded in).
  Two distinct GPUs would have to hash alike (a chance of about 10⁻¹⁹ per pair) and
  report at the same millisecond for a sample to be taken for a repeat.
- **MIG instances** of one GPU are first summed (memory, processes) and averaged
  (activity) per sample time, so a MIG-partitioned GPU is still one GPU-minute (the
  instances of one time must come in one batch: an agent sends them in one message).
- **Job memory** on shared GPUs: the memory of each attributed job's processes, per
  sample time, maximum per minute (:func:`job_memory`); a job holding a whole GPU is
  charged the GPU's memory used instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import polars as pl

from gpuledger.pipeline import engines
from gpuledger.pipeline.facts.gpu_state import sample_activity
from gpuledger.pipeline.facts.minutes import minute_of

TELEMETRY_KEEP = [
    "time", "node", "agent", "seq", "gpu_index", "gpu_uuid", "card_type", "mig_instance",
    "util_gpu", "sm_active", "sm_occupancy", "tensor_active", "dram_active",
    "mem_used_mib", "mem_total_mib", "power_w", "temp_c", "sm_clock_mhz",
    "pcie_rx_bytes_s", "pcie_tx_bytes_s", "nvlink_rx_bytes_s", "nvlink_tx_bytes_s",
    "xid_errors", "ecc_sbe", "ecc_dbe", "healthy", "processes",
]
_MEANS = ["activity", "util_gpu", "sm_active", "sm_occupancy", "tensor_active", "dram_active",
          "power_w", "sm_clock_mhz", "pcie_rx_bytes_s", "pcie_tx_bytes_s",
          "nvlink_rx_bytes_s", "nvlink_tx_bytes_s"]
_READ_MAX = ["mem_used_mib", "mem_total_mib", "temp_c"]
_MAX = [*_READ_MAX, "unhealthy_sample", "n_proc", "n_unattributed"]
_SUM = ["xid_errors", "ecc_sbe", "ecc_dbe"]
READING_DTYPE = pl.Float32()
"""The type of a GPU-minute's telemetry readings (the means, and ``_READ_MAX``) from the
minute's close on: 24 bits of mantissa, 7 significant digits (a relative error under
6·10⁻⁸; 128 bytes/s of a 1 GB/s PCIe rate), finer than what the counters measure, at 4
bytes a value instead of 8 (``gpu_minute`` 21 % smaller; the states are decided from the
stored value: ``gpu_state.TOLERANCE``)."""
KEYS = ["minute_ms", "node", "gpu_index"]
PARTIAL_COLUMNS = [*KEYS, "partition", "n", "agent", "card_type", "seq_min", "seq_max",
                   *[f"s_{c}" for c in _MEANS], *[f"c_{c}" for c in _MEANS], *_MAX, *_SUM]
"""The columns of a batch's partials, in order."""
SAMPLE_KEY = ["node", "gpu_index", "mig_instance", "time"]


def prepare(telemetry: pl.DataFrame) -> pl.DataFrame:
    """Keep the columns facts need and add ``minute``, ``minute_ms`` and per-sample
    ``activity``, process counts and health."""
    return telemetry.select(TELEMETRY_KEEP).with_columns(
        minute_of(pl.col("time")).alias("minute"),
        sample_activity().alias("activity"),
        pl.col("processes").list.len().fill_null(0).alias("n_proc"),
        pl.col("processes").list.eval(pl.element().struct.field("job_id").is_null()).list.sum()
        .fill_null(0).alias("n_unattributed"),
        (
            (pl.col("healthy") == False)  # noqa: E712 - null-aware comparison
            | (pl.col("xid_errors") > 0)
            | (pl.col("ecc_dbe") > 0)
        ).fill_null(False).alias("unhealthy_sample"),
    ).with_columns((pl.col("minute").cast(pl.Int64)).alias("minute_ms"))


def _gpu_key() -> pl.Expr:
    """64 bits naming (node, GPU, MIG instance); with the sample's time (exact) it names
    the sample."""
    return (pl.col("node").hash(11) ^ pl.col("mig_instance").hash(13)
            ^ (pl.col("gpu_index").cast(pl.UInt64) * 0x9E3779B97F4A7C15))


@dataclass
class SampleKeys:
    """The keys of the samples taken into each open minute (to drop repeats).

    ``by_minute``: per minute, frames of (partition, GPU key, time), one per batch and
    partition that had samples of it. ``gpus``: a cache of the GPUs of each minute's
    frames, brought up to date when a later batch brings samples of that minute again.
    A batch is checked against the GPUs first, and only in the minutes where an earlier
    batch brought samples of the same partition: samples of GPUs no earlier batch had in
    that minute cannot repeat one (through Kafka, a poll brings other nodes' messages for
    the minutes already open, and only the rare repeat is looked up among the keys); a
    history read in order touches a minute again only where one batch ended and the next
    began. Keeping each partition's keys in frames of their own lets a checkpoint take a
    partition's keys without copying them."""

    by_minute: dict[int, list[pl.DataFrame]] = field(default_factory=dict)
    """Per minute (ms), frames of (``partition`` UInt16, ``_g`` the GPU key, ``_t`` the
    sample's ms within the minute, UInt16): 12 bytes a sample. Caught-up history holds an
    hour of them (``windows.catchup_close_minutes``): 33 M samples for 9,216 GPUs at 1 s."""
    gpus: pl.DataFrame | None = None
    """A cache: (``minute_ms``, ``_g``) of the GPUs of the minutes' first frames (a GPU
    may be named more than once), ``covered`` saying how many frames of each minute it
    holds; brought up to date, for all the minutes a batch touches again, in one pass."""
    covered: dict[int, int] = field(default_factory=dict)

    def __getstate__(self) -> dict[str, object]:
        return {"by_minute": self.by_minute}  # the cache is rebuilt when needed

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)
        self.gpus, self.covered = None, {}
        # a checkpoint of an older release may hold several partitions in one frame, and
        # absolute times in Int64; the frames of newer ones are kept as they are (no copy)
        self.by_minute = {m: [_compact(part, m) for f in frames
                              for part in ([f] if f["partition"].n_unique() <= 1
                                           else f.partition_by("partition"))]
                          for m, frames in self.by_minute.items()}

    def _gpus(self, minutes: list[int]) -> pl.DataFrame:
        """(``minute_ms``, ``_g``) of the GPUs the frames of ``minutes`` hold (the cache
        brought up to date)."""
        stale = [(m, f) for m in minutes for f in self.by_minute[m][self.covered.get(m, 0):]]
        if stale:  # one concatenation, no operation per frame
            minute = pl.Series("minute_ms", np.repeat([m for m, _ in stale],
                                                      [f.height for _, f in stale]),
                               dtype=pl.Int64)
            # each minute's GPUs made unique on the one column (2x cheaper than a
            # two-column unique of the pairs)
            new = pl.concat([f for _, f in stale]).select(minute, "_g").group_by(
                "minute_ms").agg(pl.col("_g").unique()).explode("_g")
            self.gpus = new if self.gpus is None else pl.concat([self.gpus, new])
            for m in minutes:
                self.covered[m] = len(self.by_minute[m])
        assert self.gpus is not None
        return self.gpus.filter(pl.col("minute_ms").is_in(minutes))

    def take_new(self, samples: pl.DataFrame) -> tuple[pl.DataFrame, int]:
        """``samples`` less repeats of each other and of samples taken before; the
        number dropped. The new ones' keys are remembered. (Only the keys are joined: the
        samples are copied only when some are dropped.)"""
        keys = samples.select(
            "minute_ms", pl.col("partition").cast(pl.UInt16), _gpu_key().alias("_g"),
            (pl.col("time").cast(pl.Int64) - pl.col("minute_ms")).cast(pl.UInt16).alias("_t"))
        keep: pl.Series | None = None
        # one 64-bit mix of the key: no repeat among them means no repeat of the key
        mix = pl.col("_g") ^ pl.col("_t").hash(5) ^ pl.col("minute_ms").hash(7)
        if keys.select(mix.n_unique()).item() < keys.height:
            # of samples that repeat a key, the one with the least hash of its values
            # is kept, whatever their order (the first read was: two samples of one GPU
            # and second that disagree gave facts that hung on the input's order)
            values = samples.select(pl.struct(pl.all()).hash(11).alias("_v"))
            kept = pl.concat([keys, values], how="horizontal").with_row_index("_i").sort(
                "minute_ms", "_g", "_t", "_v", maintain_order=True).filter(
                pl.struct("minute_ms", "_g", "_t").is_first_distinct())["_i"]
            keep = pl.Series(values=[False] * keys.height, dtype=pl.Boolean).scatter(
                kept, True)
        # a GPU is in one partition: only the minutes where an earlier batch brought
        # samples of the same partition can hold a repeat (through Kafka, a poll often
        # brings other partitions' samples of the minutes already open). The pairs as one
        # column (:func:`_minute_partition`) are made unique 6x cheaper than as two.
        parts: dict[int, set[int]] = {}
        for key in keys.select(_minute_partition().unique()).to_series().to_list():
            m, p = divmod(key, _PARTITIONS)
            parts.setdefault(m, set()).add(p)
        minutes = [m for m, ps in parts.items() if m in self.by_minute
                   and not ps.isdisjoint(_partition_of(f) for f in self.by_minute[m])]
        if minutes:
            again = keys.with_row_index("_i").join(
                self._gpus(minutes), on=["minute_ms", "_g"], how="semi")
            if not again.is_empty():
                seen = [f.with_columns(pl.lit(m, pl.Int64).alias("minute_ms"))
                        for m in again["minute_ms"].unique().to_list()
                        for f in self.by_minute.get(m, ())]
                old = pl.concat(seen).select("minute_ms", "_g", "_t")
                repeat = again.join(old, on=["minute_ms", "_g", "_t"], how="semi")["_i"]
                if repeat.len():
                    mask = pl.Series(values=[True] * keys.height, dtype=pl.Boolean).scatter(
                        repeat, False)
                    keep = mask if keep is None else (keep & mask)
        if keep is not None and not keep.all():
            keys = keys.filter(keep)
            taken = samples.filter(keep)
        else:
            taken = samples
        self._remember(keys)
        return taken, samples.height - taken.height

    def _remember(self, keys: pl.DataFrame) -> None:
        """File ``keys`` by minute and partition; each frame keeps its partition column.
        Samples of one partition in time order (a history, the embedded bus) are cut
        into slices of the one frame, without a copy (6× cheaper than a split)."""
        minute = keys["minute_ms"]
        if minute.is_sorted() and keys["partition"].n_unique() == 1:
            body = keys.select("partition", "_g", "_t")
            start = 0
            for length, at in minute.rle().struct.unnest().iter_rows():
                self.by_minute.setdefault(at, []).append(body.slice(start, length))
                start += length
            return
        # split by the pair as one column, which the split drops: 1.6x cheaper than a
        # split by the two columns
        for (key,), rows in keys.select(_minute_partition().alias("_k"), "partition", "_g",
                                        "_t").partition_by(
                "_k", as_dict=True, include_key=False).items():
            assert isinstance(key, int)
            self.by_minute.setdefault(key // _PARTITIONS, []).append(rows)

    def forget_before(self, minute_ms: int) -> None:
        self.by_minute = {m: v for m, v in self.by_minute.items() if m >= minute_ms}
        self.covered = {m: n for m, n in self.covered.items() if m >= minute_ms}
        if self.gpus is not None:
            self.gpus = self.gpus.filter(pl.col("minute_ms") >= minute_ms)

    def of_partition(self, partition: int, keep: bool) -> SampleKeys:
        """This set's keys of one partition (``keep``), or of all the others (each frame
        holds one partition's keys: nothing is copied)."""
        out: dict[int, list[pl.DataFrame]] = {}
        for minute, frames in self.by_minute.items():
            kept = [f for f in frames if (_partition_of(f) == partition) == keep]
            if kept:
                out[minute] = kept
        return SampleKeys(out)

    def split(self) -> dict[int, SampleKeys]:
        """The keys of each partition (the frames shared, not copied)."""
        out: dict[int, SampleKeys] = {}
        for minute, frames in self.by_minute.items():
            for frame in frames:
                out.setdefault(_partition_of(frame), SampleKeys()).by_minute.setdefault(
                    minute, []).append(frame)
        return out

    def add(self, other: SampleKeys) -> None:
        """Take ``other``'s keys too (appended: the cache still names a prefix)."""
        for minute, frames in other.by_minute.items():
            self.by_minute.setdefault(minute, []).extend(frames)


_PARTITIONS = 1 << 16
"""Partitions of sample keys are 16 bits (``UInt16``)."""


def _minute_partition() -> pl.Expr:
    """A sample key's (minute, partition) as one integer: ``minute_ms`` × 2¹⁶ +
    partition (``divmod`` by :data:`_PARTITIONS` gives them back)."""
    return pl.col("minute_ms") * _PARTITIONS + pl.col("partition").cast(pl.Int64)


def _compact(keys: pl.DataFrame, minute_ms: int) -> pl.DataFrame:
    """A frame of sample keys as this release holds them (an older one held the partition
    and the sample's absolute time in Int64: 24 bytes a sample instead of 12)."""
    if keys.schema["_t"] == pl.UInt16 and keys.schema["partition"] == pl.UInt16:
        return keys
    t = pl.col("_t")
    return keys.select(
        pl.col("partition").cast(pl.UInt16), "_g",
        (t if keys.schema["_t"] == pl.UInt16 else t - minute_ms).cast(pl.UInt16).alias("_t"))


def _partition_of(keys: pl.DataFrame) -> int:
    """The partition of a frame of sample keys (each holds one partition's)."""
    part = keys["partition"][0]
    assert isinstance(part, int)
    return part


def _merge_mig(samples: pl.DataFrame) -> pl.DataFrame:
    """One row per GPU and sample time from the rows of its MIG instances."""
    return samples.group_by(["minute_ms", "minute", "node", "gpu_index", "partition", "time"]
                            ).agg(
        pl.col("card_type").first(),
        pl.col("seq").max(),
        pl.col("agent").first(),
        *[pl.col(c).mean() for c in _MEANS],
        pl.col("mem_used_mib").sum(),
        pl.col("mem_total_mib").max(),
        pl.col("temp_c").max(),
        pl.col("xid_errors").sum(),
        pl.col("ecc_sbe").sum(),
        pl.col("ecc_dbe").sum(),
        pl.col("unhealthy_sample").max(),
        pl.col("n_proc").sum(),
        pl.col("n_unattributed").sum(),
    ).with_columns(pl.lit(None, pl.String).alias("mig_instance"))


def partials(samples: pl.DataFrame) -> pl.DataFrame:
    """A batch of (de-duplicated, prepared) samples folded per GPU-minute."""
    if samples.select(pl.col("mig_instance").is_not_null().any()).item():
        samples = _merge_mig(samples)
    # a column with no nulls in the batch counts every sample of a GPU-minute: its count
    # is the row count, not an aggregation of its own
    gaps = {c for c in _MEANS if samples[c].null_count()}
    counts = [pl.col(c).count().cast(pl.Int64).alias(f"c_{c}") for c in _MEANS if c in gaps]
    return engines.kept_frame(samples.lazy().group_by(KEYS).agg(
        pl.col("partition").first(),
        pl.len().cast(pl.Int64).alias("n"),
        pl.col("agent").first(),
        pl.col("card_type").first(),
        pl.col("seq").min().alias("seq_min"),
        pl.col("seq").max().alias("seq_max"),
        *[pl.col(c).sum().alias(f"s_{c}") for c in _MEANS],
        *counts,
        *[pl.col(c).max() for c in _MAX],
        *[pl.col(c).sum() for c in _SUM],
    ).with_columns(pl.col("n").alias(f"c_{c}") for c in _MEANS if c not in gaps
                   ).select(PARTIAL_COLUMNS))


def merge(parts: list[pl.DataFrame]) -> pl.DataFrame:
    """Partials of the same GPU-minutes added up. Batches overlap in a few minutes at
    most (where one ended and the next began): only the rows of minutes in more than one
    part are grouped, the others are taken as they are."""
    parts = [p for p in parts if not p.is_empty()] or parts[:1]
    if len(parts) == 1:
        return parts[0]
    ranges = sorted(p.select(pl.col("minute_ms").min().alias("lo"),
                             pl.col("minute_ms").max().alias("hi")).row(0)
                    for p in parts)
    shared: list[int] = []  # the minutes some earlier part reaches too
    reach = ranges[0][1]
    for lo, hi in ranges[1:]:
        if lo <= reach:
            shared += [lo, min(hi, reach)]
        reach = max(reach, hi)
    both = pl.concat(parts, how="vertical_relaxed", rechunk=False)
    if not shared:
        return both
    lo, hi = min(shared), max(shared)
    overlap = pl.col("minute_ms").is_between(lo, hi)
    return pl.concat([both.filter(~overlap), _added(both.filter(overlap))],
                     how="vertical_relaxed")


def _added(both: pl.DataFrame) -> pl.DataFrame:
    return engines.kept_frame(both.lazy().group_by(KEYS).agg(
        pl.col("partition").first(),
        pl.col("n").sum(),
        pl.col("agent").drop_nulls().first(),
        pl.col("card_type").drop_nulls().first(),
        pl.col("seq_min").min(),
        pl.col("seq_max").max(),
        *[pl.col(f"s_{c}").sum() for c in _MEANS],
        *[pl.col(f"c_{c}").sum() for c in _MEANS],
        *[pl.col(c).max() for c in _MAX],
        *[pl.col(c).sum() for c in _SUM],
    ))


def finish(merged: pl.DataFrame) -> pl.DataFrame:
    """Each GPU-minute's telemetry: means over its samples, maxima, sums, sample count
    (the readings as :data:`READING_DTYPE`)."""
    return merged.select(
        *KEYS, "partition",
        pl.col("n").alias("telemetry_samples"),
        pl.col("agent").fill_null(pl.col("node")).alias("agent"),
        "seq_min", "seq_max",
        pl.col("card_type").alias("telemetry_card_type"),
        *[pl.when(pl.col(f"c_{c}") > 0).then(pl.col(f"s_{c}") / pl.col(f"c_{c}"))
          .cast(READING_DTYPE).alias(c) for c in _MEANS],
        *[pl.col(c).cast(READING_DTYPE) for c in _READ_MAX],
        *_SUM,
        pl.col("unhealthy_sample").alias("telemetry_unhealthy"),
        pl.col("n_proc").alias("processes"),
        pl.col("n_unattributed").alias("unattributed_processes"),
    )


def job_memory(samples: pl.DataFrame) -> pl.DataFrame:
    """Peak memory of each attributed job's processes per (minute, node, GPU, job):
    per sample time the job's processes add up, then the highest over the minute.
    Partials of the same key merge by their maximum. (Read from every sample with an
    attributed process, whatever the job book knows when it arrives: a job's start may
    be read after its samples.)"""
    cand = samples.lazy().select(
        *KEYS, "partition", "time", "n_proc", "n_unattributed", "processes",
    ).filter(pl.col("n_proc") > pl.col("n_unattributed"))
    first = pl.col("processes").list.first().struct
    single = cand.filter(pl.col("n_proc") == 1).select(
        *KEYS, "partition", first.field("job_id"), first.field("used_mib"))
    several = (
        cand.filter(pl.col("n_proc") > 1)
        .select(*KEYS, "partition", "time", "processes")
        .explode("processes")
        .unnest("processes")
        .filter(pl.col("job_id").is_not_null())
        .group_by([*KEYS, "partition", "time", "job_id"])
        .agg(pl.col("used_mib").sum())
        .select(*KEYS, "partition", "job_id", "used_mib")
    )
    # one plan: the list column is not copied by each step
    return engines.kept_frame(pl.concat([single, several]).group_by([*KEYS, "job_id"]).agg(
        pl.col("partition").first(), pl.col("used_mib").max().alias("job_mem_mib")))


def merge_memory(parts: list[pl.DataFrame]) -> pl.DataFrame:
    both = pl.concat(parts, how="vertical_relaxed", rechunk=False)
    if len(parts) == 1:
        return both
    return both.group_by([*KEYS, "job_id"]).agg(pl.col("partition").first(),
                                                 pl.col("job_mem_mib").max())


def sequence_gaps(gpu_minutes: pl.DataFrame) -> pl.DataFrame:
    """Per partition and agent: lowest and highest sequence number and samples received
    (distinct: repeats were dropped before)."""
    return gpu_minutes.group_by(["partition", "agent"]).agg(
        pl.col("seq_min").min(),
        pl.col("seq_max").max(),
        pl.col("telemetry_samples").sum().alias("seq_count"),
    )
