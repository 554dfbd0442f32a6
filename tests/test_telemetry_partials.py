"""Telemetry partials: folding a batch's samples per GPU-minute and adding partials up.

A GPU-minute's telemetry must not depend on how its samples were split into batches:
any split, in any order, merges to the partials of all the samples at once.
"""

from __future__ import annotations

import pickle
from datetime import UTC, datetime, timedelta
from itertools import pairwise

import polars as pl
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from polars.testing import assert_frame_equal

from gpuledger.pipeline.facts import telemetry_minutes as tm

T0 = datetime(2026, 1, 5, tzinfo=UTC)


def _samples(times: list[int]) -> pl.DataFrame:
    """Prepared samples of two GPUs of one node at ``times`` (seconds after T0)."""
    n = len(times)
    return tm.prepare(pl.DataFrame({
        "time": [T0 + timedelta(seconds=t) for t in times],
        "node": ["n1"] * n, "agent": ["a1"] * n, "seq": list(range(n)),
        "gpu_index": [i % 2 for i in range(n)], "gpu_uuid": [None] * n,
        "card_type": ["H100"] * n, "mig_instance": [None] * n,
        **{c: [float(t % 97) for t in times] for c in (
            "util_gpu", "sm_active", "sm_occupancy", "tensor_active", "dram_active",
            "mem_used_mib", "mem_total_mib", "power_w", "temp_c", "sm_clock_mhz",
            "pcie_rx_bytes_s", "pcie_tx_bytes_s", "nvlink_rx_bytes_s", "nvlink_tx_bytes_s")},
        "xid_errors": [0] * n, "ecc_sbe": [t % 3 for t in times], "ecc_dbe": [0] * n,
        "healthy": [True] * n, "processes": [[]] * n,
    }, schema_overrides={"time": pl.Datetime("ms", "UTC"), "gpu_uuid": pl.String,
                         "mig_instance": pl.String,
                         "processes": pl.List(pl.Struct({"pid": pl.Int64,
                                                         "job_id": pl.String,
                                                         "used_mib": pl.Float64}))},
    )).with_columns(pl.lit(0, pl.Int64).alias("partition"))


def _ordered(frame: pl.DataFrame) -> pl.DataFrame:
    return frame.sort(tm.KEYS)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.integers(0, 600), min_size=1, max_size=60, unique=True),
       st.lists(st.integers(0, 59), max_size=5), st.randoms())
def test_any_split_of_the_samples_merges_to_the_same_partials(
        times: list[int], cuts: list[int], rnd: object) -> None:
    samples = _samples(times)
    whole = tm.partials(samples)
    # batches: contiguous runs, interleaved ones, in any order
    bounds = sorted({0, samples.height, *[c % (samples.height + 1) for c in cuts]})
    parts = [tm.partials(samples.slice(a, b - a)) for a, b in pairwise(bounds) if b > a]
    parts.append(tm.partials(samples.filter(pl.col("seq") % 7 == 3).head(0)))  # empty
    rnd.shuffle(parts)  # type: ignore[attr-defined]
    merged = tm.merge(parts)
    assert merged.height == whole.height
    assert_frame_equal(_ordered(merged), _ordered(whole), check_exact=False, rel_tol=1e-12)


def test_a_column_counts_only_its_readings_whether_or_not_the_batch_has_gaps() -> None:
    """A batch whose column has no nulls counts that column by its rows (no aggregation
    of its own); a batch with gaps counts the readings. Either way the GPU-minute's mean
    is over the readings there were, and batches of both kinds merge alike."""
    full = _samples([0, 10, 20, 30])  # GPU 0 at 0 and 20 s, GPU 1 at 10 and 30 s
    gappy = _samples([40, 50]).with_columns(  # GPU 0 at 40 s: no SM reading
        pl.when(pl.col("gpu_index") == 0).then(None).otherwise(pl.col("sm_active"))
        .alias("sm_active"))
    assert full["sm_active"].null_count() == 0 and gappy["sm_active"].null_count() == 1
    merged = tm.finish(tm.merge([tm.partials(full), tm.partials(gappy)])).sort("gpu_index")
    rows = merged.select("gpu_index", "telemetry_samples", "sm_active", "util_gpu").rows()
    # GPU 0: readings 0 and 20 (the 40 s sample has none); util over all three samples
    assert rows[0] == (0, 3, 10.0, 20.0)
    # GPU 1: 10, 30 and 50
    assert rows[1] == (1, 3, 30.0, 30.0)
    one = tm.finish(tm.partials(pl.concat([full, gappy]))).sort("gpu_index")
    assert_frame_equal(one.select(merged.columns), merged)


def test_batches_that_do_not_overlap_are_taken_as_they_are() -> None:
    first = tm.partials(_samples(list(range(0, 120, 10))))
    second = tm.partials(_samples(list(range(120, 240, 10))))
    merged = tm.merge([second, first])
    assert merged.height == first.height + second.height == 8
    assert_frame_equal(_ordered(merged), _ordered(pl.concat([first, second])))


def test_a_minute_split_between_two_batches_is_added_up() -> None:
    first = tm.partials(_samples([0, 10, 20, 30, 40, 50, 60, 70]))
    second = tm.partials(_samples([80, 90, 100, 110, 130]))
    merged = _ordered(tm.merge([first, second]))
    minute_1 = merged.filter(pl.col("minute_ms") == merged["minute_ms"].min() + 60_000)
    assert minute_1["n"].to_list() == [3, 3]  # (60, 80, 100) and (70, 90, 110)
    assert merged.height == 5  # minute 0: both GPUs; minute 2: GPU 0 (130)


def _of_node(node: str, times: list[int]) -> pl.DataFrame:
    return _samples(times).with_columns(pl.lit(node).alias("node"))


def test_repeats_are_found_across_batches_whichever_gpus_came_between() -> None:
    keys = tm.SampleKeys()
    a = _of_node("a", list(range(0, 60, 5)))
    b = _of_node("b", list(range(0, 60, 5)))
    assert keys.take_new(a) == (a, 0)
    assert keys.take_new(b)[1] == 0  # other GPUs, the same minute: no repeat
    again = pl.concat([a.slice(3, 4), _of_node("c", [7, 8])])
    fresh, repeats = keys.take_new(again)
    assert repeats == 4
    assert fresh["node"].to_list() == ["c", "c"]
    # a repeat inside one batch, and of what was taken before
    nine = _of_node("c", [9])
    fresh, repeats = keys.take_new(pl.concat([nine, nine, b.slice(0, 1)]))
    assert (fresh.height, repeats) == (1, 2)


def test_keys_from_a_checkpoint_still_find_repeats() -> None:
    keys = tm.SampleKeys()
    a = _of_node("a", list(range(0, 60, 5)))
    keys.take_new(a)
    keys.take_new(_of_node("c", [2]))  # the GPU index of the minute is built
    assert keys.gpus is not None and keys.covered
    restored = pickle.loads(pickle.dumps(keys))  # the index is not saved: rebuilt
    assert restored.gpus is None and not restored.covered
    assert restored.take_new(a.slice(0, 2))[1] == 2
    assert restored.take_new(_of_node("b", [1]))[1] == 0


def test_a_minute_is_looked_up_only_for_the_partitions_it_had_samples_of() -> None:
    keys = tm.SampleKeys()
    one = pl.lit(1, pl.Int64).alias("partition")
    a = _of_node("a", list(range(0, 60, 5)))
    b = _of_node("b", list(range(0, 60, 5))).with_columns(one)
    keys.take_new(a)
    assert keys.take_new(b) == (b, 0)
    assert keys.gpus is None  # partition 1 had no samples of the minute: nothing looked up
    fresh, repeats = keys.take_new(pl.concat([b.slice(0, 3), _of_node("c", [1]).with_columns(
        one)]))
    assert repeats == 3 and fresh["node"].to_list() == ["c"]
    assert keys.take_new(a.slice(5, 2))[1] == 2  # and partition 0's repeats still count


def test_split_gives_each_partition_its_own_keys() -> None:
    keys = tm.SampleKeys()
    for part, node in enumerate(["a", "b", "c"]):
        keys.take_new(_of_node(node, list(range(0, 120, 7))).with_columns(
            pl.lit(part % 2, pl.Int64).alias("partition")))
    split = keys.split()
    assert sorted(split) == [0, 1]
    for part, mine in split.items():
        want = keys.of_partition(part, keep=True)
        for attr in ("by_minute",):
            got_rows = {m: pl.concat(f).sort(pl.all()) for m, f in getattr(mine, attr).items()}
            want_rows = {m: pl.concat(f).sort(pl.all()) for m, f in getattr(want, attr).items()}
            assert got_rows.keys() == want_rows.keys()
            for m, rows in got_rows.items():
                assert rows.equals(want_rows[m])


def test_keys_of_an_older_checkpoint_are_split_by_partition_on_load() -> None:
    keys = tm.SampleKeys()
    mixed = pl.concat([_of_node("a", [1, 2]).with_columns(pl.lit(0, pl.Int64).alias("partition")),
                       _of_node("b", [1, 2]).with_columns(pl.lit(1, pl.Int64).alias("partition"))])
    keys.take_new(mixed)
    minute = next(iter(keys.by_minute))
    keys.by_minute[minute] = [pl.concat(keys.by_minute[minute])]  # one frame, two partitions
    restored = pickle.loads(pickle.dumps(keys))
    assert sorted(restored.split()) == [0, 1]
    assert sum(f.height for f in restored.of_partition(1, keep=True).by_minute[minute]) == 2
    assert restored.take_new(mixed)[1] == 4


def test_the_same_second_of_other_minutes_is_no_repeat() -> None:
    """Keys hold the time within the minute: 0:05 and 1:05 of one GPU in one batch, or in
    two, are two samples."""
    keys = tm.SampleKeys()
    a = _of_node("a", [5, 65, 125])
    assert a["gpu_index"].to_list() == [0, 1, 0]
    same_gpu = _of_node("a", [5, 125]).with_columns(pl.lit(0, pl.Int64).alias("gpu_index"))
    assert keys.take_new(same_gpu) == (same_gpu, 0)
    fresh, repeats = keys.take_new(_of_node("a", [65, 185]).with_columns(
        pl.lit(0, pl.Int64).alias("gpu_index")))
    assert (fresh.height, repeats) == (2, 0)
    assert keys.take_new(same_gpu)[1] == 2


def test_keys_are_12_bytes_a_sample_and_older_ones_are_converted_on_load() -> None:
    keys = tm.SampleKeys()
    a = _of_node("a", list(range(0, 60, 1)))
    keys.take_new(a)
    minute = next(iter(keys.by_minute))
    frame = keys.by_minute[minute][0]
    assert frame.schema == pl.Schema({"partition": pl.UInt16, "_g": pl.UInt64, "_t": pl.UInt16})
    assert frame.estimated_size() <= 12 * frame.height
    # as an older release held them: the absolute time and the partition in Int64
    old = frame.with_columns(pl.col("partition").cast(pl.Int64),
                             (pl.col("_t").cast(pl.Int64) + minute).alias("_t"))
    keys.by_minute[minute] = [old]
    restored = pickle.loads(pickle.dumps(keys))
    assert restored.by_minute[minute][0].equals(frame)
    assert restored.take_new(a.slice(10, 5))[1] == 5
