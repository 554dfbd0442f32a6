"""Why allocated GPUs sit idle or inefficient: a pattern for every such GPU-minute of an
attempt, as pure columnar functions over GPU-minute rows (the ``gpu_minute`` table's
columns), in an incremental form the streaming engine can call.

**Which minutes.** A job's GPU-minute is diagnosed when its state is ``allocated_idle`` or
``allocated_inefficient`` (activity below the efficiency threshold written in the row).

**Context.** Each GPU's series of minutes in the attempt is read in a centred window of
``±window_minutes`` (default 35): busy share (activity ≥ efficient), low share, the
median activity, the number of low runs (consecutive low minutes) and whether any run is
longer than ``stall_max_minutes`` (2). A minute is classified once the ``window_minutes``
after it have arrived (or the attempt has ended), so streaming and batch give the same
answer.

**Rules**, first match wins (``docs/diagnosis.md``; thresholds in :class:`DiagnosisConfig`):

1. ``unknown``: no telemetry in the minute, a GPU shared by several jobs, a minute the
   GPU was held for only part of (``occupied_share`` < 1: the attempt started or ended
   in it), or the attempt's first ``startup_minutes`` (3) — unless no process runs then
   (rule 2);
2. ``held_no_process``: no process on the GPU;
3. ``communication_bound``: two or more GPUs, ``sm_active`` reported, NVLink ≥ 100 GB/s
   or PCIe ≥ 16 GB/s (rx + tx);
4. ``memory_bound``: ``sm_active`` and ``dram_active`` reported, DRAM ≥ 0.4 and ≥ 2 × SM;
5. ``underfilled_inference``: an inference job;
6. ``checkpoint_stall``: a short low run (≤ 2 minutes), no longer run in the window, at
   least 2 and at most ``2·window / stall_min_gap_minutes + 1`` runs in the window (drops
   at least ~8 minutes apart), low share ≤ 0.2;
7. ``input_bound``: PCIe reported, links and DRAM quiet (below rules 3 and 4's
   thresholds) and either the
   window's median activity lies between the idle and efficient thresholds (steadily
   starved) or the window is bursty (busy share ≥ 0.2 and low share ≥ 0.1);
8. ``unknown``: anything else.

A pattern is never claimed from a field the card does not report: L40S and A10 nodes
report ``util.gpu`` only, so rules 3 and 4 (which need DCGM's ``sm_active`` and
``dram_active``) cannot fire there.

**Incremental form.** :func:`update` adds a batch of closed GPU-minute rows to a
:class:`DiagnosisState`; :func:`finish` classifies what is left of ended attempts and
returns their ``job_diagnosis`` rows. Memory per attempt is bounded: per GPU at most
``2·window_minutes + 4`` minute rows, per attempt at most 7 pattern rows, one row of
attributes and 24 hour-of-day rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import NamedTuple

import polars as pl

from gpuledger.pipeline.advisor.patterns import (
    CATALOGUE,
    CHECKPOINT,
    COMMUNICATION,
    INFERENCE,
    INPUT,
    MEMORY,
    NO_PROCESS,
    UNKNOWN,
)

__all__ = ["UNKNOWN", "DiagnosisConfig", "DiagnosisState", "diagnose", "dominant", "finish",
           "label_minutes", "peek", "update"]
from gpuledger.pipeline.columns import TIME_DTYPE

ATTEMPT = ["job_id", "attempt"]
SERIES = ["job_id", "attempt", "node", "gpu_index"]
DIAGNOSED_STATES = ("allocated_idle", "allocated_inefficient")

WINDOW_SCHEMA = pl.Schema({
    "job_id": pl.String(), "attempt": pl.Int64(), "node": pl.String(),
    "gpu_index": pl.Int64(), "minute": TIME_DTYPE, "act": pl.Float64(), "sm": pl.Float64(),
    "dram": pl.Float64(), "pcie": pl.Float64(), "nvl": pl.Float64(), "procs": pl.Int64(),
    "weight": pl.Float64(), "shared": pl.Boolean(), "partial": pl.Boolean(),
    "eligible": pl.Boolean(),
    "idle_thr": pl.Float64(), "eff_thr": pl.Float64(), "classified": pl.Boolean(),
})
META_SCHEMA = pl.Schema({
    "job_id": pl.String(), "attempt": pl.Int64(), "team": pl.String(), "queue": pl.String(),
    "job_type": pl.String(), "card_type": pl.String(), "first_minute": TIME_DTYPE,
    "last_minute": TIME_DTYPE, "gpus": pl.Int64(),
})
HOURLY_SCHEMA = pl.Schema({"job_id": pl.String(), "attempt": pl.Int64(), "hour": pl.Int8(),
                           "act_sum": pl.Float64(), "n": pl.Int64()})
SUMS = ("gpu_minutes", "act_sum", "act_n", "sm_sum", "sm_n", "dram_sum", "dram_n", "pcie_sum",
        "pcie_n", "nvl_sum", "nvl_n", "no_process")
TOTALS_SCHEMA = pl.Schema({
    "job_id": pl.String(), "attempt": pl.Int64(), "pattern": pl.String(),
    **{c: pl.Float64() for c in SUMS}, "first_minute": TIME_DTYPE, "last_minute": TIME_DTYPE,
})
JOB_DIAGNOSIS = pl.Schema({
    "job_id": pl.String(), "attempt": pl.Int64(), "team": pl.String(), "queue": pl.String(),
    "job_type": pl.String(), "card_type": pl.String(), "gpus": pl.Int64(),
    "pattern": pl.String(), "gpu_hours": pl.Float64(), "share": pl.Float64(),
    "mean_activity": pl.Float64(), "mean_sm_active": pl.Float64(),
    "mean_dram_active": pl.Float64(), "mean_pcie_bytes_s": pl.Float64(),
    "mean_nvlink_bytes_s": pl.Float64(), "no_process_minutes": pl.Float64(),
    "first_minute": TIME_DTYPE, "last_minute": TIME_DTYPE, "evidence": pl.String(),
    "remedy": pl.String(), "ended_at": TIME_DTYPE, "date": pl.Date(),
})


@dataclass(frozen=True)
class DiagnosisConfig:
    """Thresholds of the rules (module docstring); defaults as documented."""

    window_minutes: int = 35
    startup_minutes: int = 3
    nvlink_busy_bytes_s: float = 100e9
    pcie_busy_bytes_s: float = 16e9
    dram_high: float = 0.4
    dram_over_sm: float = 2.0
    stall_max_share: float = 0.2
    stall_min_gap_minutes: int = 8
    input_busy_share: float = 0.2
    input_low_share: float = 0.1
    idle_activity: float = 0.05  # used when a row carries no thresholds
    efficient_activity: float = 0.30


DEFAULT_CONFIG = DiagnosisConfig()


@dataclass
class DiagnosisState:
    """What :func:`update` keeps between batches (bounded per attempt)."""

    window: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=WINDOW_SCHEMA))
    meta: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=META_SCHEMA))
    hourly: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=HOURLY_SCHEMA))
    totals: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=TOTALS_SCHEMA))


class Finished(NamedTuple):
    """:func:`finish`'s result: the state without the ended attempts, and their rows."""

    state: DiagnosisState
    rows: pl.DataFrame


def _col(rows: pl.DataFrame, name: str, dtype: pl.DataType) -> pl.Expr:
    return pl.col(name).cast(dtype) if name in rows.columns else pl.lit(None, dtype)


def _sum2(rows: pl.DataFrame, a: str, b: str) -> pl.Expr:
    x, y = _col(rows, a, pl.Float64()), _col(rows, b, pl.Float64())
    return pl.when(x.is_null() & y.is_null()).then(None).otherwise(
        x.fill_null(0.0) + y.fill_null(0.0))


def prepare(rows: pl.DataFrame, cfg: DiagnosisConfig) -> pl.DataFrame:
    """GPU-minute rows (``gpu_minute`` columns) → the job rows' window features."""
    jobs = rows.filter(pl.col("job_id").is_not_null() & pl.col("attempt").is_not_null())
    state = pl.col("state").cast(pl.String)
    share = pl.col("alloc_fraction").cast(pl.Float64).fill_null(1.0)
    on_gpu = _col(jobs, "jobs_on_gpu", pl.Int64()).fill_null(1)
    seen = _col(jobs, "telemetry_samples", pl.Int64()).fill_null(1) > 0
    return jobs.select(
        "job_id", "attempt", "node", "gpu_index", pl.col("minute").cast(TIME_DTYPE),
        pl.when(seen).then(_col(jobs, "activity", pl.Float64())).alias("act"),
        _col(jobs, "sm_active", pl.Float64()).alias("sm"),
        _col(jobs, "dram_active", pl.Float64()).alias("dram"),
        _sum2(jobs, "pcie_rx_bytes_s", "pcie_tx_bytes_s").alias("pcie"),
        _sum2(jobs, "nvlink_rx_bytes_s", "nvlink_tx_bytes_s").alias("nvl"),
        _col(jobs, "processes", pl.Int64()).fill_null(0).alias("procs"),
        (share / on_gpu).alias("weight"), (on_gpu > 1).alias("shared"),
        (_col(jobs, "occupied_share", pl.Float64()).fill_null(1.0) < 1.0 - 1e-9)
        .alias("partial"),
        state.is_in(list(DIAGNOSED_STATES)).fill_null(False).alias("eligible"),
        _col(jobs, "idle_threshold", pl.Float64()).fill_null(cfg.idle_activity)
        .alias("idle_thr"),
        _col(jobs, "efficient_threshold", pl.Float64()).fill_null(cfg.efficient_activity)
        .alias("eff_thr"),
        pl.lit(False).alias("classified"),
        _col(jobs, "team", pl.String()).alias("team"),
        _col(jobs, "queue", pl.String()).alias("queue"),
        _col(jobs, "job_type", pl.String()).alias("job_type"),
        _col(jobs, "card_type", pl.String()).alias("card_type"),
    )


def _context(window: pl.DataFrame, cfg: DiagnosisConfig) -> pl.DataFrame:
    """Per row: the minute's own signals and its window's (module docstring)."""
    h = cfg.window_minutes
    # a minute held only in part says nothing about the job's rhythm
    act = pl.when(pl.col("partial")).then(None).otherwise(pl.col("act"))
    w = window.sort([*SERIES, "minute"]).with_columns(act.alias("act_ctx"))
    low = (pl.col("act_ctx") < pl.col("eff_thr")).fill_null(False)
    busy = (pl.col("act_ctx") >= pl.col("eff_thr")).fill_null(False)
    w = w.with_columns(low.alias("low"), busy.alias("busy"))

    def near(k: int) -> pl.Expr:
        """``low`` of the minute ``k`` minutes away (False when that minute is missing)."""
        same = pl.col("minute").shift(-k).over(SERIES) == (
            pl.col("minute") + pl.duration(minutes=k))
        return (same & pl.col("low").shift(-k).over(SERIES)).fill_null(False)

    p1, p2, n1, n2 = near(-1), near(-2), near(1), near(2)
    w = w.with_columns(
        (pl.col("low") & ~(p1 & p2) & ~(n1 & n2) & ~(p1 & n1)).alias("short"),
        (pl.col("low") & p1 & p2).alias("long_at"),
        (pl.col("low") & ~p1).alias("run_start"),
    )
    ctx = w.rolling(index_column="minute", period=f"{2 * h + 1}m", offset=f"-{h + 1}m",
                    group_by=SERIES).agg(
        pl.col("busy").filter(pl.col("act_ctx").is_not_null()).mean().alias("busy_share"),
        pl.col("low").filter(pl.col("act_ctx").is_not_null()).mean().alias("low_share"),
        pl.col("run_start").sum().alias("runs"),
        pl.col("long_at").any().alias("any_long"),
        pl.col("act_ctx").median().alias("median_act"),
    )
    return w.join(ctx, on=[*SERIES, "minute"], how="left")


def _rules(cfg: DiagnosisConfig) -> pl.Expr:
    """The pattern of a diagnosed minute, from :func:`_context`'s columns."""
    act, sm, dram = pl.col("act"), pl.col("sm"), pl.col("dram")
    nvl_busy = (pl.col("nvl") >= cfg.nvlink_busy_bytes_s).fill_null(False)
    pcie_busy = (pl.col("pcie") >= cfg.pcie_busy_bytes_s).fill_null(False)
    dram_high = (dram >= cfg.dram_high) & (dram >= cfg.dram_over_sm * sm)
    max_runs = (2 * cfg.window_minutes + 1) // cfg.stall_min_gap_minutes + 1
    idle, eff = pl.col("idle_thr"), pl.col("eff_thr")
    starting = (pl.col("minute") - pl.col("first_minute")) < pl.duration(
        minutes=cfg.startup_minutes)
    return (
        pl.when(act.is_null() | pl.col("shared") | pl.col("partial")).then(pl.lit(UNKNOWN))
        .when(pl.col("procs") == 0).then(pl.lit(NO_PROCESS))
        .when(starting).then(pl.lit(UNKNOWN))
        .when((pl.col("gpus") >= 2) & sm.is_not_null() & (nvl_busy | pcie_busy))
        .then(pl.lit(COMMUNICATION))
        .when(sm.is_not_null() & dram.is_not_null() & dram_high.fill_null(False))
        .then(pl.lit(MEMORY))
        .when(pl.col("job_type") == "inference").then(pl.lit(INFERENCE))
        .when(pl.col("short") & ~pl.col("any_long") & (pl.col("runs") >= 2)
              & (pl.col("runs") <= max_runs) & (pl.col("low_share") <= cfg.stall_max_share))
        .then(pl.lit(CHECKPOINT))
        .when(pl.col("pcie").is_not_null() & ~nvl_busy & ~pcie_busy
              & ~dram_high.fill_null(False)
              & (((pl.col("median_act") >= idle) & (pl.col("median_act") < eff))
                 | ((pl.col("busy_share") >= cfg.input_busy_share)
                    & (pl.col("low_share") >= cfg.input_low_share))))
        .then(pl.lit(INPUT))
        .otherwise(pl.lit(UNKNOWN))
    )


def _classify(window: pl.DataFrame, meta: pl.DataFrame, ready: pl.Expr,
              cfg: DiagnosisConfig) -> pl.DataFrame:
    """The ``ready`` diagnosed rows of ``window`` with their ``pattern``."""
    ctx = _context(window, cfg).join(meta.select(*ATTEMPT, "first_minute", "gpus", "job_type"),
                                     on=ATTEMPT, how="left")
    return ctx.filter(ready & pl.col("eligible") & ~pl.col("classified")).with_columns(
        _rules(cfg).alias("pattern"))


def _accumulate(totals: pl.DataFrame, done: pl.DataFrame) -> pl.DataFrame:
    if done.is_empty():
        return totals
    has = pl.col("act").is_not_null()
    add = done.group_by(*ATTEMPT, "pattern").agg(
        pl.col("weight").sum().alias("gpu_minutes"),
        pl.col("act").sum().alias("act_sum"), has.sum().cast(pl.Float64).alias("act_n"),
        pl.col("sm").sum().alias("sm_sum"),
        pl.col("sm").is_not_null().sum().cast(pl.Float64).alias("sm_n"),
        pl.col("dram").sum().alias("dram_sum"),
        pl.col("dram").is_not_null().sum().cast(pl.Float64).alias("dram_n"),
        pl.col("pcie").sum().alias("pcie_sum"),
        pl.col("pcie").is_not_null().sum().cast(pl.Float64).alias("pcie_n"),
        pl.col("nvl").sum().alias("nvl_sum"),
        pl.col("nvl").is_not_null().sum().cast(pl.Float64).alias("nvl_n"),
        (pl.col("procs") == 0).sum().cast(pl.Float64).alias("no_process"),
        pl.col("minute").min().alias("first_minute"), pl.col("minute").max().alias("last_minute"),
    ).select(list(TOTALS_SCHEMA)).cast(dict(TOTALS_SCHEMA))  # type: ignore[arg-type]
    return pl.concat([totals, add]).group_by(*ATTEMPT, "pattern").agg(
        *[pl.col(c).sum() for c in SUMS], pl.col("first_minute").min(),
        pl.col("last_minute").max()).select(list(TOTALS_SCHEMA))


def _mark(window: pl.DataFrame, done: pl.DataFrame) -> pl.DataFrame:
    keys = [*SERIES, "minute"]
    flagged = done.select(*keys).with_columns(pl.lit(True).alias("_done"))
    return window.join(flagged, on=keys, how="left").with_columns(
        (pl.col("classified") | pl.col("_done").fill_null(False)
         | ~pl.col("eligible")).alias("classified")).drop("_done")


def _merge_meta(meta: pl.DataFrame, new: pl.DataFrame) -> pl.DataFrame:
    """Per attempt: attributes, first and last minute, GPUs seen."""
    attrs = ("team", "queue", "job_type", "card_type")
    return pl.concat([meta, new.group_by(ATTEMPT).agg(
        *[pl.col(c).drop_nulls().first() for c in attrs],
        pl.col("minute").min().alias("first_minute"), pl.col("minute").max().alias("last_minute"),
        pl.struct("node", "gpu_index").n_unique().cast(pl.Int64).alias("gpus"),
    ).select(list(META_SCHEMA))]).group_by(ATTEMPT, maintain_order=True).agg(
        *[pl.col(c).drop_nulls().first() for c in attrs],
        pl.col("first_minute").min(), pl.col("last_minute").max(), pl.col("gpus").max(),
    ).select(list(META_SCHEMA))


def update(state: DiagnosisState, rows: pl.DataFrame,
           cfg: DiagnosisConfig = DEFAULT_CONFIG) -> DiagnosisState:
    """Add a batch of closed GPU-minute rows; classify the minutes whose window is
    complete; forget rows no later minute needs."""
    new = prepare(rows, cfg)
    if new.is_empty():
        return state
    meta = _merge_meta(state.meta, new)
    hourly = pl.concat([state.hourly, new.filter(pl.col("act").is_not_null()).group_by(
        *ATTEMPT, pl.col("minute").dt.hour().cast(pl.Int8).alias("hour")).agg(
        pl.col("act").sum().alias("act_sum"), pl.len().cast(pl.Int64).alias("n"))]).group_by(
        *ATTEMPT, "hour").agg(pl.col("act_sum").sum(), pl.col("n").sum())
    window = pl.concat([state.window, new.select(list(WINDOW_SCHEMA))]).unique(
        [*SERIES, "minute"], keep="first", maintain_order=True)
    window = window.with_columns(pl.col("minute").max().over(SERIES).alias("_latest"))
    h = pl.duration(minutes=cfg.window_minutes)
    done = _classify(window, meta, pl.col("minute") + h <= pl.col("_latest"), cfg)
    totals = _accumulate(state.totals, done)
    window = _mark(window, done)
    # keep what the unclassified minutes (and those still to come) need: 35 minutes before
    # them, and 3 more for the run features of the window's first minute
    open_from = pl.when(~pl.col("classified")).then(pl.col("minute")).min().over(SERIES)
    start = pl.min_horizontal(open_from.fill_null(pl.col("_latest") + pl.duration(minutes=1)),
                              pl.col("_latest") - h + pl.duration(minutes=1))
    keep = pl.col("minute") >= start - h - pl.duration(minutes=3)
    window = window.filter(keep).drop("_latest")
    return DiagnosisState(window, meta, hourly, totals)


def finish(state: DiagnosisState, ended: pl.DataFrame,
           cfg: DiagnosisConfig = DEFAULT_CONFIG) -> Finished:
    """Classify the rest of the ``ended`` attempts (``job_id``, ``attempt``, optionally
    ``ended_at``: null for an attempt still running) and return their ``job_diagnosis``
    rows; the state forgets them. Without an ``ended_at`` column, an attempt ends after
    its last minute seen."""
    keys = ended.select(pl.col("job_id").cast(pl.String), pl.col("attempt").cast(pl.Int64))
    mine = state.window.join(keys, on=ATTEMPT, how="semi")
    done = _classify(mine, state.meta, pl.lit(True), cfg)
    totals = _accumulate(state.totals.join(keys, on=ATTEMPT, how="semi"), done)
    meta = state.meta.join(keys, on=ATTEMPT, how="semi").with_columns(
        (pl.col("last_minute") + pl.duration(minutes=1)).alias("ended_at"))
    if "ended_at" in ended.columns:
        ends = keys.with_columns(ended["ended_at"].cast(TIME_DTYPE).alias("ended_at"))
        meta = meta.drop("ended_at").join(ends, on=ATTEMPT, how="left")
    rows = _rows(totals, meta, state.hourly.join(keys, on=ATTEMPT, how="semi"))
    rest = replace(
        state, window=state.window.join(keys, on=ATTEMPT, how="anti"),
        meta=state.meta.join(keys, on=ATTEMPT, how="anti"),
        hourly=state.hourly.join(keys, on=ATTEMPT, how="anti"),
        totals=state.totals.join(keys, on=ATTEMPT, how="anti"))
    return Finished(rest, rows)


def peek(state: DiagnosisState, keys: pl.DataFrame,
         cfg: DiagnosisConfig = DEFAULT_CONFIG) -> pl.DataFrame:
    """``job_diagnosis`` rows of running attempts so far (nothing is forgotten;
    ``ended_at`` null)."""
    running = keys.select(*ATTEMPT).with_columns(pl.lit(None, TIME_DTYPE).alias("ended_at"))
    return finish(state, running, cfg).rows


def diagnose(rows: pl.DataFrame, cfg: DiagnosisConfig = DEFAULT_CONFIG) -> pl.DataFrame:
    """Batch form: the ``job_diagnosis`` rows of every attempt in ``rows``."""
    state = update(DiagnosisState(), rows, cfg)
    return finish(state, state.meta.select(ATTEMPT), cfg).rows


def label_minutes(rows: pl.DataFrame, cfg: DiagnosisConfig = DEFAULT_CONFIG) -> pl.DataFrame:
    """Batch form, minute by minute: each diagnosed GPU-minute of ``rows`` with its
    ``pattern`` (``job_id``, ``attempt``, ``node``, ``gpu_index``, ``minute``, ``pattern``,
    ``shared``, ``weight``), for inspection and the confusion matrix (``bench/``)."""
    new = prepare(rows, cfg)
    meta = _merge_meta(pl.DataFrame(schema=META_SCHEMA), new)
    done = _classify(new.select(list(WINDOW_SCHEMA)), meta, pl.lit(True), cfg)
    return done.select(*SERIES, "minute", "pattern", "shared", "weight")


def _pct(expr: pl.Expr) -> pl.Expr:
    return (expr * 100).round(0).cast(pl.Int64).cast(pl.String) + pl.lit(" %")


def _gbs(expr: pl.Expr) -> pl.Expr:
    return (expr / 1e9).round(1).cast(pl.String) + pl.lit(" GB/s")


def _evidence() -> pl.Expr:
    p = pl.col("pattern")
    act, sm, dram = pl.col("mean_activity"), pl.col("mean_sm_active"), pl.col("mean_dram_active")
    pcie, nvl = pl.col("mean_pcie_bytes_s"), pl.col("mean_nvlink_bytes_s")
    minutes = pl.col("gpu_minutes").round(0).cast(pl.Int64).cast(pl.String)
    links = (pl.lit(", PCIe ") + _gbs(pcie).fill_null("n/a")
             + pl.when(nvl.is_not_null()).then(pl.lit(", NVLink ") + _gbs(nvl))
             .otherwise(pl.lit("")))
    return (
        pl.when(p == NO_PROCESS).then(
            pl.lit("no process on the GPU for ") + pl.col("no_process_minutes").round(0)
            .cast(pl.Int64).cast(pl.String) + pl.lit(" GPU-minutes"))
        .when(p == COMMUNICATION).then(
            pl.lit("SM active ") + _pct(sm) + pl.lit(" on ") + pl.col("gpus").cast(pl.String)
            + pl.lit(" GPUs while the links move data") + links)
        .when(p == MEMORY).then(
            pl.lit("DRAM active ") + _pct(dram) + pl.lit(" vs SM active ") + _pct(sm))
        .when(p == INFERENCE).then(
            pl.lit("activity ") + _pct(act) + pl.lit(" on an inference service")
            + pl.when(pl.col("hour_hi").is_not_null() & (pl.col("hour_hi") > pl.col("hour_lo")))
            .then(pl.lit("; hourly mean from ") + _pct(pl.col("hour_lo")) + pl.lit(" to ")
                  + _pct(pl.col("hour_hi"))).otherwise(pl.lit("")))
        .when(p == CHECKPOINT).then(
            minutes + pl.lit(" GPU-minutes in short drops (activity ") + _pct(act)
            + pl.lit(") between busy minutes"))
        .when(p == INPUT).then(
            pl.lit("activity ") + _pct(act) + pl.lit(" in bursts or starved") + links
            + pl.when(dram.is_not_null()).then(pl.lit(", DRAM ") + _pct(dram))
            .otherwise(pl.lit("")) + pl.lit(": links and memory quiet"))
        .otherwise(pl.lit("no pattern shown (activity ") + _pct(act).fill_null("n/a")
                   + pl.lit(")"))
    )


def _rows(totals: pl.DataFrame, meta: pl.DataFrame, hourly: pl.DataFrame) -> pl.DataFrame:
    if totals.is_empty():
        return pl.DataFrame(schema=JOB_DIAGNOSIS)
    hours = hourly.with_columns((pl.col("act_sum") / pl.col("n")).alias("m")).group_by(
        ATTEMPT).agg(pl.col("m").min().alias("hour_lo"), pl.col("m").max().alias("hour_hi"),
                     pl.len().alias("hours"))
    hours = hours.with_columns(pl.when(pl.col("hours") >= 6).then(pl.col("hour_lo"))
                               .alias("hour_lo"),
                               pl.when(pl.col("hours") >= 6).then(pl.col("hour_hi"))
                               .alias("hour_hi"))

    def mean(s: str, n: str) -> pl.Expr:
        return pl.when(pl.col(n) > 0).then(pl.col(s) / pl.col(n))

    remedy = {k: v.remedy for k, v in CATALOGUE.items()}
    out = totals.join(meta.drop("first_minute", "last_minute"), on=ATTEMPT, how="left").join(
        hours, on=ATTEMPT, how="left").with_columns(
        (pl.col("gpu_minutes") / 60.0).alias("gpu_hours"),
        (pl.col("gpu_minutes") / pl.col("gpu_minutes").sum().over(ATTEMPT)).alias("share"),
        mean("act_sum", "act_n").alias("mean_activity"),
        mean("sm_sum", "sm_n").alias("mean_sm_active"),
        mean("dram_sum", "dram_n").alias("mean_dram_active"),
        mean("pcie_sum", "pcie_n").alias("mean_pcie_bytes_s"),
        mean("nvl_sum", "nvl_n").alias("mean_nvlink_bytes_s"),
        pl.col("no_process").alias("no_process_minutes"),
        pl.col("pattern").replace_strict(remedy, return_dtype=pl.String).alias("remedy"),
    ).with_columns(_evidence().alias("evidence"), pl.coalesce(
        "ended_at", pl.col("last_minute") + pl.duration(minutes=1)).dt.date().alias("date"))
    return out.select(list(JOB_DIAGNOSIS)).cast(dict(JOB_DIAGNOSIS)).sort(  # type: ignore[arg-type]
        *ATTEMPT, "gpu_hours", descending=[False, False, True])


def dominant(diagnosis: pl.DataFrame) -> pl.DataFrame:
    """Per attempt, the pattern holding most of its idle and inefficient GPU-hours (a known
    pattern wins over ``unknown`` when it holds at least a quarter): ``job_id``,
    ``attempt``, ``pattern``, ``share``, ``evidence``, ``remedy``."""
    if diagnosis.is_empty():
        return diagnosis.select(*ATTEMPT, "pattern", "share", "evidence", "remedy")
    first = ((pl.col("pattern") != UNKNOWN) & (pl.col("share") >= 0.25)).not_()
    best = diagnosis.sort(*ATTEMPT, first, "gpu_hours", descending=[
        False, False, False, True]).unique(ATTEMPT, keep="first", maintain_order=True)
    return best.select(*ATTEMPT, "pattern", "share", "evidence", "remedy")
