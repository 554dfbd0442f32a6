"""The processor's native alert engine: alerts that need a job's history.

- **Sustained low utilisation** (``GpuJobLowUtilisation``): a running job, once it has
  run ``low_util_grace_s``, whose mean activity over the trailing ``low_util_window_s``
  is below ``low_util_activity``; it resolves only when that mean rises above
  ``low_util_resolve_activity`` (hysteresis) or the attempt ends. Severity by the
  GPU-hours wasted so far.
- **Memory over-sized** (``GpuJobMemoryOversized``): a job running longer than
  ``memory_oversized_runtime_s`` whose peak memory stays under
  ``thresholds.memory_oversized_ratio`` of the memory it holds per GPU.
- **Blocked by fragmentation** (``GpuJobBlockedByFragmentation``): a pending job
  blocked (fits in the free GPUs, on no node) for ``blocked_s`` without a break.

Evaluation is per closed minute, in event time, columnar: each followed processor
(shard) turns its closed GPU-minutes into per-(job, attempt, minute) partial sums; once
every followed processor has closed a minute, the partial sums are added up and the
rules run over them — rolling window sums per job, then a set/reset latch whose
transitions are the events. So a job's alert fires once (de-duplication key: alert,
job, attempt) and fires again only after it has resolved. Each event carries its
evidence (numbers, window) and a recommendation, and goes to every sink.

The engine needs the cluster-wide facts (``blocked_minute``) and, for jobs spanning
shards, every shard of the cluster in this process (one instance), as the default
service runs; with several instances, use the Prometheus rules (``alerts/``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import polars as pl

from gpuledger.pipeline.advisor import diagnosis as why
from gpuledger.pipeline.alerts import texts
from gpuledger.pipeline.alerts.model import Alert
from gpuledger.pipeline.alerts.sinks import AlertSink
from gpuledger.pipeline.columns import TIME_DTYPE
from gpuledger.pipeline.config import ProcessorConfig

if TYPE_CHECKING:
    from gpuledger.pipeline.processor import Processor

log = logging.getLogger("gpuledger.alerts")

K = ["job_id", "attempt"]
MINUTE = timedelta(minutes=1)
PARTIAL_SCHEMA = pl.Schema({
    "job_id": pl.String(), "attempt": pl.Int64(), "minute": TIME_DTYPE,
    "frac_total": pl.Float64(), "frac_obs": pl.Float64(), "act_sum": pl.Float64(),
    "mem_peak": pl.Float64(), "mem_held": pl.Float64(), "started_at": TIME_DTYPE})
CARRY_SCHEMA = pl.Schema({"job_id": pl.String(), "attempt": pl.Int64(),
                          "waste": pl.Float64(), "peak": pl.Float64(), "held": pl.Float64()})
LABEL_COLUMNS = ("team", "queue", "pool", "card_type", "job_type")


class _Follower:
    """The engine's listener on one processor: buffers a close step's facts."""

    def __init__(self, engine: AlertEngine) -> None:
        self.engine = engine
        self.gpu: list[pl.DataFrame] = []
        self.jobs: list[pl.DataFrame] = []
        self.blocked: list[pl.DataFrame] = []

    def facts(self, table: str, frame: pl.DataFrame) -> None:
        if table == "gpu_minute":
            self.gpu.append(frame)
        elif table == "job_gpu_minute":
            self.jobs.append(frame)
        elif table == "blocked_minute":
            self.blocked.append(frame)

    def closed(self, processor: Processor, until: datetime) -> None:
        gpu, self.gpu = self.gpu, []
        jobs, self.jobs = self.jobs, []
        blocked, self.blocked = self.blocked, []
        self.engine.remember(gpu, until)
        self.engine.step(processor, until, job_minutes(processor, jobs),
                         pl.concat(blocked, how="vertical_relaxed") if blocked else None)


def job_minutes(processor: Processor, job_parts: list[pl.DataFrame]) -> pl.DataFrame:
    """Per (job, attempt, minute) partial sums over this processor's job GPU-minutes
    (the engine's ``job_gpu_minute`` rows: each job's share of a GPU-minute, exact to the
    second, with the GPU's activity and memory)."""
    if not job_parts:
        return pl.DataFrame(schema=PARTIAL_SCHEMA)
    rows = pl.concat(job_parts, how="diagonal_relaxed")
    starts = processor.jobs.allocations().group_by(K).agg(pl.col("start").min())
    share, frac = pl.col("share"), pl.col("fraction")
    seen = (pl.col("telemetry_samples") > 0) & pl.col("activity").is_not_null()
    return rows.join(starts, on=K, how="left").group_by([*K, "minute"]).agg(
        share.sum().alias("frac_total"),
        share.filter(seen).sum().alias("frac_obs"),
        (share * pl.col("activity")).filter(seen).sum().alias("act_sum"),
        pl.col("mem_used_mib").filter(seen & (frac >= 1.0)).max().alias("mem_peak"),
        (pl.col("gpu_mem_total_mib") * frac).max().alias("mem_held"),
        pl.col("start").min().alias("started_at"),
    ).select(PARTIAL_SCHEMA.names()).cast(dict(PARTIAL_SCHEMA))  # type: ignore[arg-type]


def latch(frame: pl.DataFrame, event: str, seed: str) -> pl.DataFrame:
    """Set/reset latch per job over minutes: ``event`` True sets, False resets, null
    keeps; ``seed`` is the state before the first row. Adds ``state`` and ``prev``."""
    state = pl.col(event).forward_fill().over(K).fill_null(pl.col(seed))
    return frame.sort([*K, "minute"]).with_columns(state.alias("state")).with_columns(
        pl.col("state").shift(1).over(K).fill_null(pl.col(seed)).alias("prev"))


class AlertEngine:
    """History-aware alerts from the closed facts of one or more processors (shards)."""

    def __init__(self, config: ProcessorConfig, sinks: Sequence[AlertSink] = ()) -> None:
        self.config = config
        self.sinks = list(sinks)
        self.followed: dict[int, Processor] = {}
        self.partials: list[pl.DataFrame] = []
        self.blocked_rows: list[pl.DataFrame] = []
        self.evaluated_until: datetime | None = None
        self.history = pl.DataFrame(schema=PARTIAL_SCHEMA)
        self.carry = pl.DataFrame(schema=CARRY_SCHEMA)
        self.last_seen: dict[tuple[str, int], datetime] = {}
        self.blocked_since: dict[tuple[str, int], datetime] = {}
        self.firing: dict[tuple[str, str, int], Alert] = {}
        self.events = 0
        self.recent = pl.DataFrame()  # the last hour of jobs' GPU-minutes, for the cause

    def attach(self, processor: Processor) -> None:
        """Follow ``processor`` (each shard of a service, or the only processor)."""
        self.followed[id(processor)] = processor
        processor.listeners.append(_Follower(self))

    def remember(self, gpu_parts: list[pl.DataFrame], until: datetime) -> None:
        """Keep the last hour of job GPU-minutes: a firing low-utilisation alert names its
        likely cause from them (``advisor.diagnosis``)."""
        keep = [f.filter(pl.col("job_id").is_not_null()) for f in gpu_parts]
        frames = [f for f in (self.recent, *keep) if not f.is_empty()]
        if not frames:
            return
        since = pl.lit(until - timedelta(hours=1)).cast(TIME_DTYPE)
        self.recent = pl.concat(frames, how="diagonal_relaxed").filter(
            pl.col("minute") >= since)

    def _cause(self, job_id: str, attempt: int) -> dict[str, Any]:
        """Evidence of the attempt's likely cause of low activity (none when unknown)."""
        if self.recent.is_empty():
            return {}
        rows = self.recent.filter((pl.col("job_id") == job_id) & (pl.col("attempt") == attempt))
        top = why.dominant(why.diagnose(rows))
        if top.is_empty() or top["pattern"].item() == why.UNKNOWN:
            return {}
        r = top.row(0, named=True)
        return {"likely_cause": r["pattern"], "likely_cause_evidence": r["evidence"],
                "likely_cause_remedy": r["remedy"]}

    def detach(self, processor: Processor) -> None:
        self.followed.pop(id(processor), None)
        processor.listeners[:] = [x for x in processor.listeners
                                  if not (isinstance(x, _Follower) and x.engine is self)]

    # -- stepping ------------------------------------------------------------------------

    def step(self, processor: Processor, until: datetime, partial: pl.DataFrame,
             blocked: pl.DataFrame | None) -> None:
        if not partial.is_empty():
            self.partials.append(partial)
        if blocked is not None and not blocked.is_empty():
            self.blocked_rows.append(blocked)
        # a shard that has not seen telemetry yet (no nodes, or just started) holds
        # nothing back: it has no GPU-minutes to add
        closed = [p.closed_until for p in self.followed.values() if p.closed_until is not None]
        ready = min(closed, default=until)
        lo = self.evaluated_until
        if lo is None:
            firsts = [f.select(pl.col("minute").min()).item()
                      for f in (*self.partials, *self.blocked_rows)]
            lo = min(firsts, default=ready)
        if ready <= lo:
            return
        self._evaluate(processor, lo, ready)
        self.evaluated_until = ready

    def _take(self, parts: list[pl.DataFrame], hi: datetime) -> tuple[pl.DataFrame,
                                                                      list[pl.DataFrame]]:
        if not parts:
            return pl.DataFrame(), []
        both = pl.concat(parts, how="vertical_relaxed")
        cut = pl.col("minute") < pl.lit(hi).cast(TIME_DTYPE)
        rest = both.filter(~cut)
        return both.filter(cut), ([rest] if not rest.is_empty() else [])

    def _evaluate(self, processor: Processor, lo: datetime, hi: datetime) -> None:
        partial, self.partials = self._take(self.partials, hi)
        blocked, self.blocked_rows = self._take(self.blocked_rows, hi)
        jm = pl.DataFrame(schema=PARTIAL_SCHEMA)
        if not partial.is_empty():
            jm = partial.group_by([*K, "minute"]).agg(
                *[pl.col(c).sum() for c in ("frac_total", "frac_obs", "act_sum")],
                *[pl.col(c).max() for c in ("mem_peak", "mem_held")],
                pl.col("started_at").min()).select(PARTIAL_SCHEMA.names())
        labels = self._labels(processor)
        events: list[tuple[datetime, int, Alert]] = []
        for alert in (*self._low_util(jm, hi, labels), *self._memory(jm, labels),
                      *self._blocked(blocked, lo, hi, labels), *self._ended(jm, hi)):
            at = alert.ends_at or alert.starts_at
            events.append((at, 0 if alert.ends_at else 1, alert))
        events.sort(key=lambda e: (e[0], e[1], e[2].key))
        ordered = [a for _, _, a in events]
        self.events += len(ordered)
        active = list(self.firing.values())
        for sink in self.sinks:  # also without events: a webhook resends firing alerts
            sink.publish(ordered, active)

    def _labels(self, processor: Processor) -> dict[str, dict[str, str]]:
        attrs = processor.jobs.attributes()
        out: dict[str, dict[str, str]] = {}
        for row in attrs.select("job_id", *LABEL_COLUMNS).iter_rows(named=True):
            out[row["job_id"]] = {k: str(row[k]) for k in LABEL_COLUMNS if row[k] is not None}
        return out

    def _fire(self, alert: Alert) -> Alert:
        self.firing[alert.key] = alert
        return alert

    def _resolve(self, key: tuple[str, str, int], at: datetime, why: str,
                 evidence: dict[str, Any] | None = None) -> Alert | None:
        alert = self.firing.pop(key, None)
        return None if alert is None else alert.resolved(at, why, evidence)

    def _seed(self, name: str, frame: pl.DataFrame) -> pl.DataFrame:
        keys = [(j, a) for (n, j, a) in self.firing if n == name]
        seed = pl.DataFrame(keys, schema={"job_id": pl.String, "attempt": pl.Int64},
                            orient="row").with_columns(pl.lit(True).alias("seed"))
        return frame.join(seed, on=K, how="left").with_columns(pl.col("seed").fill_null(False))

    # -- low utilisation -------------------------------------------------------------------

    def _low_util(self, jm: pl.DataFrame, hi: datetime,
                  labels: dict[str, dict[str, str]]) -> list[Alert]:
        a = self.config.alerts
        if jm.is_empty():
            return []
        first_new = jm.select(pl.col("minute").min()).item()
        window = f"{a.low_util_window_s}s"
        hist = pl.concat([self.history, jm]).unique([*K, "minute"], keep="last").sort(
            [*K, "minute"])
        rolled = hist.with_columns(
            pl.col("act_sum").rolling_sum_by("minute", window).over(K).alias("roll_act"),
            pl.col("frac_obs").rolling_sum_by("minute", window).over(K).alias("roll_obs"),
            pl.col("minute").is_not_null().cast(pl.Int64).rolling_sum_by("minute", window)
            .over(K).alias("roll_n"),
        ).filter(pl.col("minute") >= pl.lit(first_new).cast(TIME_DTYPE))
        self.history = hist.filter(
            pl.col("minute") > pl.lit(hi - timedelta(seconds=a.low_util_window_s))
            .cast(TIME_DTYPE))
        rows = rolled.join(self.carry.select(*K, "waste"), on=K, how="left").sort(
            [*K, "minute"]).with_columns(
            (pl.col("waste").fill_null(0.0)
             + ((pl.col("frac_total") - pl.col("act_sum")) / 60.0).cum_sum().over(K))
            .alias("wasted"),
            ((pl.col("minute") + pl.duration(minutes=1) - pl.col("started_at"))
             .dt.total_milliseconds() / 1000.0).alias("runtime_s"),
            pl.when(pl.col("roll_obs") > 0).then(pl.col("roll_act") / pl.col("roll_obs"))
            .alias("mean"),
        )
        mean = pl.col("mean")
        event = (pl.when(mean.is_null()).then(None)
                 .when((pl.col("runtime_s") >= a.low_util_grace_s) & (mean < a.low_util_activity))
                 .then(True).when(mean > a.low_util_resolve_activity).then(False)
                 .otherwise(None))
        rows = latch(self._seed(texts.LOW_UTIL, rows.with_columns(event.alias("event"))),
                     "event", "seed")
        self._update_carry(rows, "wasted", "waste")
        out: list[Alert] = []
        for r in rows.filter(pl.col("state") != pl.col("prev")).iter_rows(named=True):
            key = (texts.LOW_UTIL, r["job_id"], r["attempt"])
            at = r["minute"] + MINUTE
            ev = {"mean_activity": round(r["mean"], 4),
                  "window_s": int(min(r["roll_n"] * 60, a.low_util_window_s)),
                  "runtime_s": r["runtime_s"], "allocated_gpus": r["frac_total"],
                  "wasted_gpu_hours": round(r["wasted"], 4),
                  "fire_below": a.low_util_activity,
                  "resolve_above": a.low_util_resolve_activity,
                  "grace_s": a.low_util_grace_s, "minute": r["minute"].isoformat()}
            if r["state"]:
                lab = labels.get(r["job_id"], {})
                ev.update(self._cause(r["job_id"], r["attempt"]))
                summary, desc, rec = texts.low_util(
                    self.config, texts.job_name(r["job_id"], r["attempt"], lab), ev)
                out.append(self._fire(Alert(
                    texts.LOW_UTIL, r["job_id"], r["attempt"],
                    texts.severity(self.config, r["wasted"]), at, summary, desc, rec, ev,
                    lab)))
            else:
                done = self._resolve(key, at, "recovered",
                                     {"resolved_mean_activity": round(r["mean"], 4)})
                if done is not None:
                    out.append(done)
        return out

    def _update_carry(self, rows: pl.DataFrame, col: str, into: str) -> None:
        last = rows.group_by(K).agg(pl.col(col).last().alias(into))
        carry = self.carry.join(last, on=K, how="full", coalesce=True, suffix="_new")
        self.carry = carry.with_columns(
            pl.coalesce(pl.col(f"{into}_new"), pl.col(into)).alias(into)
        ).drop(f"{into}_new").select(CARRY_SCHEMA.names())
        for job_id, attempt, minute in rows.group_by(K).agg(
                pl.col("minute").max()).iter_rows():
            self.last_seen[(job_id, attempt)] = minute

    # -- memory over-sized --------------------------------------------------------------------

    def _memory(self, jm: pl.DataFrame, labels: dict[str, dict[str, str]]) -> list[Alert]:
        a, t = self.config.alerts, self.config.thresholds
        if jm.is_empty():
            return []
        rows = jm.join(self.carry.select(*K, "peak", "held"), on=K, how="left").sort(
            [*K, "minute"]).with_columns(
            pl.max_horizontal(pl.col("mem_peak").cum_max().over(K).forward_fill().over(K),
                              pl.col("peak")).alias("peak_cum"),
            pl.max_horizontal(pl.col("mem_held").cum_max().over(K).forward_fill().over(K),
                              pl.col("held")).alias("held_cum"),
            ((pl.col("minute") + pl.duration(minutes=1) - pl.col("started_at"))
             .dt.total_milliseconds() / 1000.0).alias("runtime_s"),
        )
        cond = ((pl.col("runtime_s") > a.memory_oversized_runtime_s)
                & (pl.col("peak_cum") < t.memory_oversized_ratio * pl.col("held_cum")))
        event = pl.when(cond.is_null()).then(None).otherwise(cond)
        rows = latch(self._seed(texts.MEMORY, rows.with_columns(event.alias("event"))),
                     "event", "seed")
        self._update_carry(rows, "peak_cum", "peak")
        self._update_carry(rows, "held_cum", "held")
        out: list[Alert] = []
        for r in rows.filter(pl.col("state") != pl.col("prev")).iter_rows(named=True):
            at = r["minute"] + MINUTE
            ev = {"mem_peak_mib": r["peak_cum"], "mem_held_mib": r["held_cum"],
                  "mem_peak_ratio": round(r["peak_cum"] / r["held_cum"], 4),
                  "runtime_s": r["runtime_s"], "threshold": t.memory_oversized_ratio,
                  "min_runtime_s": a.memory_oversized_runtime_s}
            if r["state"]:
                lab = labels.get(r["job_id"], {})
                summary, desc, rec = texts.memory(
                    self.config, texts.job_name(r["job_id"], r["attempt"], lab), ev)
                out.append(self._fire(Alert(texts.MEMORY, r["job_id"], r["attempt"], "info",
                                            at, summary, desc, rec, ev, lab)))
            else:
                done = self._resolve((texts.MEMORY, r["job_id"], r["attempt"]), at,
                                     "recovered", {"resolved_mem_peak_mib": r["peak_cum"]})
                if done is not None:
                    out.append(done)
        return out

    # -- blocked by fragmentation -------------------------------------------------------------

    def _blocked(self, rows: pl.DataFrame, lo: datetime, hi: datetime,
                 labels: dict[str, dict[str, str]]) -> list[Alert]:
        limit = timedelta(seconds=self.config.alerts.blocked_s)
        out: list[Alert] = []
        runs = pl.DataFrame()
        if not rows.is_empty():
            gap = pl.col("minute") - pl.col("minute").shift(1).over(K)
            runs = rows.sort([*K, "minute"]).with_columns(
                (gap.is_null() | (gap != pl.duration(minutes=1))).cum_sum().over(K)
                .alias("run")).group_by([*K, "run"]).agg(
                pl.col("minute").min().alias("first"), pl.col("minute").max().alias("last"),
                *[pl.col(c).last() for c in ("team", "queue", "pool", "card_type", "gpus",
                                             "free_gpus", "largest_free_block")],
            ).sort("first", *K)
        seen_at_lo = set() if runs.is_empty() else set(
            runs.filter(pl.col("first") == pl.lit(lo).cast(TIME_DTYPE))
            .select(*K).iter_rows())
        for key in [k for k in self.blocked_since if k not in seen_at_lo]:
            del self.blocked_since[key]           # not blocked any more at ``lo``
            done = self._resolve((texts.BLOCKED, *key), lo, "unblocked")
            if done is not None:
                out.append(done)
        if runs.is_empty():
            return out
        end = hi - MINUTE
        for r in runs.iter_rows(named=True):
            key = (r["job_id"], r["attempt"])
            since = r["first"]
            if r["first"] == lo and key in self.blocked_since:
                since = self.blocked_since[key]
            fire_at = since + limit
            name_key = (texts.BLOCKED, *key)
            if name_key not in self.firing and r["last"] + MINUTE >= fire_at:
                lab = {**labels.get(r["job_id"], {}),
                       **{k: str(r[k]) for k in ("team", "queue", "pool", "card_type")
                          if r[k] is not None}}
                ev = {"gpus": r["gpus"], "free_gpus": r["free_gpus"],
                      "largest_free_block": r["largest_free_block"],
                      "blocked_since": since.isoformat(),
                      "blocked_s": (fire_at - since).total_seconds()}
                summary, desc, rec = texts.blocked(
                    self.config, texts.job_name(r["job_id"], r["attempt"], lab), ev)
                out.append(self._fire(Alert(texts.BLOCKED, r["job_id"], r["attempt"],
                                            "warning", fire_at, summary, desc, rec, ev, lab)))
            if r["last"] < end:                   # the run ended inside this range
                self.blocked_since.pop(key, None)
                done = self._resolve(name_key, r["last"] + MINUTE, "unblocked",
                                     {"blocked_until": (r["last"] + MINUTE).isoformat()})
                if done is not None:
                    out.append(done)
            else:
                self.blocked_since[key] = since
        return out

    # -- attempts that ended ------------------------------------------------------------------

    def _ended(self, jm: pl.DataFrame, hi: datetime) -> list[Alert]:
        """Resolve running-job alerts of attempts that hold no GPU in the last minute."""
        last = hi - MINUTE
        present = set() if jm.is_empty() else set(
            jm.filter(pl.col("minute") == pl.lit(last).cast(TIME_DTYPE))
            .select(*K).iter_rows())
        out: list[Alert] = []
        for name, job_id, attempt in list(self.firing):
            if name == texts.BLOCKED or (job_id, attempt) in present:
                continue
            seen = self.last_seen.get((job_id, attempt), last)
            done = self._resolve((name, job_id, attempt), seen + MINUTE, "job ended")
            if done is not None:
                out.append(done)
        gone = {k for k in self.last_seen if k not in present}
        for k in gone:
            if self.last_seen[k] < last - timedelta(seconds=self.config.alerts.low_util_window_s):
                del self.last_seen[k]
        if gone and not self.carry.is_empty():
            live = pl.DataFrame(list(present) or None, schema={"job_id": pl.String,
                                                               "attempt": pl.Int64},
                                orient="row")
            self.carry = self.carry.join(live, on=K, how="semi")
        return out
