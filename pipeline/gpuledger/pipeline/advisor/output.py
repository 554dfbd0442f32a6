"""What-if results: one comparison frame, shown as terminal tables, JSON, or a report section.

The comparison has one row per answer and key (:func:`.calibration.long_form`): the
observed value (the schedule as run), the baseline replay, the baseline's calibration
error (baseline − observed, and whether it is within tolerance), then each other policy.
Read a policy's effect as its difference from the *baseline*, give or take the error.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from datetime import datetime
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

import polars as pl
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from gpuledger.pipeline.advisor.answers import Answers
from gpuledger.pipeline.advisor.calibration import key_order, long_form
from gpuledger.pipeline.advisor.policy import PolicySet
from gpuledger.pipeline.terminal_fit import fitted, header, printable

ORDER = ("queue wait p50 (min)", "queue wait p90 (min)", "queue wait p99 (min)",
         "queue wait p90 by size (min)", "blocked GPU-hours", "allocated GPU-hours",
         "used GPU-hours", "lost GPU-hours", "mean frag(1)", "mean frag(2)", "mean frag(4)",
         "mean frag(8)", "team mean queue wait (min)", "team allocated GPU-hours",
         "team blocked GPU-hours", "team lost GPU-hours")


@dataclass
class WhatIf:
    """Everything ``gpuledger whatif`` reports."""

    warehouse: str
    start: datetime
    end: datetime
    step_minutes: int
    policies: PolicySet
    observed: Answers
    replays: list[Answers]
    calibration: pl.DataFrame
    notes: list[str] = field(default_factory=list)
    weakened: list[str] = field(default_factory=list)

    def comparison(self) -> pl.DataFrame:
        """One row per answer and key: observed, baseline, error, within, each policy."""
        out = self.calibration.select("answer", "key", "observed", "baseline", "error",
                                      "within")
        for a in self.replays:
            if a.policy == self.policies.baseline:
                continue
            out = out.join(long_form(a).rename({"value": a.policy}), on=["answer", "key"],
                           how="left").with_columns(
                pl.when(pl.col("answer").str.contains("GPU-hours"))
                .then(pl.col(a.policy).fill_null(0.0)).otherwise(pl.col(a.policy))
                .alias(a.policy))
        rank = {name: i for i, name in enumerate(ORDER)}
        return out.with_columns(
            pl.col("answer").replace_strict(rank, default=len(ORDER)).alias("_rank")
        ).sort("_rank", key_order(), "key", nulls_last=True).drop("_rank")


def _num(v: Any, digits: int = 1, sign: str = "") -> str:
    """``v`` with ``digits`` decimals, rounded as the report's SQL rounds (``sql_round``);
    ``sign="+"`` shows the sign of a positive value too."""
    if v is None:
        return ""
    rounded = sql_round(float(v), digits) + 0.0   # + 0.0: a -0.0 is shown as 0.0
    return format(rounded, f"{sign},.{digits}f")


def print_whatif(w: WhatIf, console: Console) -> None:
    """The comparison as one rich table per answer, with the notes first. Every name
    from the warehouse or the policy file (the path, policies, pools, teams, queues) is
    printed as text, never read as markup."""
    hours = (w.end - w.start).total_seconds() / 3600
    base = w.policies.baseline
    cal = w.calibration
    console.print(Text.assemble(
        ("What if", "bold"), f" — {w.warehouse}, {w.start:%Y-%m-%d %H:%M} – "
        f"{w.end:%Y-%m-%d %H:%M} UTC ({hours:.1f} h, grid every {w.step_minutes} min). "
        "Baseline: ", (base, "bold"), "."))
    console.print(Text(
        f"Calibration: the baseline replay is within tolerance for "
        f"{int(cal['within'].sum())} of {cal.height - cal['within'].null_count()} "
        f"answers with both sides observed (error = {base} − observed, shown beside every "
        "answer)."))
    for line in w.notes:
        console.print(Text(f"  note: {line}"))
    for line in w.weakened:
        console.print(Text.assemble("  ", ("weakened", "yellow"), f": {line}"))
    comp = w.comparison()
    others = [a.policy for a in w.replays if a.policy != base]
    for (answer,), rows in comp.group_by("answer", maintain_order=True):
        digits = 3 if str(answer).startswith("mean frag") else 1
        titles = ["key", "observed", base, "calib. error", *others]
        body: list[list[str]] = []
        for r in rows.iter_rows(named=True):
            mark = "✓" if r["within"] else "✗"
            cells = [printable(str(r["key"])), _num(r["observed"], digits),
                     _num(r["baseline"], digits),
                     "" if r["error"] is None else f"{_num(r['error'], digits, '+')} {mark}"]
            for name in others:
                v = r[name]
                cells.append("" if v is None else _num(v, digits) if r["baseline"] is None
                             else f"{_num(v, digits)} ({_num(v - r['baseline'], digits, '+')})")
            body.append(cells)

        def build(widths: list[int] | None, title: str = str(answer),
                  titles: list[str] = titles, body: list[list[str]] = body) -> Table:
            # a narrow terminal (or a pipe: 80 columns) wraps cells at their spaces and
            # never cuts them: rich's "(+43.…" lost the figure
            table = Table(title=Text(title), title_justify="left", box=box.SIMPLE_HEAD,
                          show_edge=False, padding=(0, 1 if widths is None else 0))
            for k, name in enumerate(titles):
                width = None if widths is None else widths[k]
                table.add_column(Text(header(name, width, hyphens=True)), width=width,
                                 justify="left" if k == 0 else "right", overflow="fold")
            for cells in body:  # data (a team named '[/]'): never read as markup
                table.add_row(*(Text(c) for c in cells))
            return table

        table = fitted(build, titles, body, console, cells_wrap=True, hyphens=True)
        console.print(table)


def _plain(v: Any) -> Any:
    if isinstance(v, datetime):
        return v.isoformat()
    return v


def to_json(w: WhatIf) -> str:
    """The whole result as one JSON document."""
    def rows(frame: pl.DataFrame) -> list[dict[str, Any]]:
        return [{k: _plain(v) for k, v in r.items()} for r in frame.iter_rows(named=True)]

    doc = {
        "warehouse": w.warehouse,
        "window": {"start": w.start.isoformat(), "end": w.end.isoformat(),
                   "step_minutes": w.step_minutes},
        "baseline": w.policies.baseline,
        "policies": [{"name": p.name, "description": p.description, "placement": p.placement,
                      "quota": p.quota, "backfill": p.backfill,
                      "preemption": {"priority": p.preempt_priority, "reclaim": p.reclaim,
                                     "checkpointable_only": p.checkpointable_only},
                      "card_pools": {k: {"pool": v.pool, "card_type": v.card_type}
                                     for k, v in p.card_pools.items()}}
                     for p in w.policies.policies],
        "notes": w.notes,
        "weakened": w.weakened,
        "calibration": rows(w.calibration),
        "answers": rows(w.comparison()),
        "frag_hourly": {a.policy: rows(a.frag_hourly) for a in [w.observed, *w.replays]},
        "teams": {a.policy: rows(a.teams) for a in [w.observed, *w.replays]},
    }
    return json.dumps(doc, indent=1, default=str) + "\n"


@dataclass(frozen=True)
class ReportSection:
    """The what-if section of ``gpuledger report``: one row per schedule."""

    key: str
    title: str
    question: str
    columns: list[str]
    rows: list[tuple[Any, ...]]


def sql_round(x: float, digits: int) -> float:
    """``x`` rounded as DuckDB's ``round(x, digits)`` rounds a DOUBLE: the binary value
    itself (0.35 is 0.34999…) to ``digits`` decimals, halves away from zero. The report's
    other sections are rounded in SQL; Python's ``round`` takes halves to even (0.25 →
    0.2 where DuckDB gives 0.3), so the same value read differently in two sections."""
    if not math.isfinite(x):
        return x
    return float(Decimal(x).quantize(Decimal(1).scaleb(-digits), rounding=ROUND_HALF_UP))


def report_section(w: WhatIf) -> ReportSection:
    """Headline numbers per policy (and the observed row, and the calibration error)."""
    def headline(label: str, a: Answers) -> tuple[Any, ...]:
        use = a.usage.filter(pl.col("pool") == "all")
        wait = a.wait.filter(pl.col("by") == "all")
        return (label,
                sql_round(float(use["allocated_gpu_hours"].sum()), 1),
                sql_round(float(use["used_gpu_hours"].sum()), 1),
                sql_round(float(wait["p90_min"].sum()), 1) if wait.height else None,
                sql_round(float(a.blocked["blocked_gpu_hours"].sum()), 1),
                sql_round(float(a.lost["lost_gpu_hours"].sum()), 2))

    base = w.policies.baseline
    err = {r["answer"] + "|" + r["key"]: r["error"] for r in w.calibration.iter_rows(named=True)}
    wait_err = err.get("queue wait p90 (min)|all")
    rows = [headline("observed", w.observed)]
    rows += [headline(a.policy, a) for a in w.replays]
    rows.append((f"calibration error ({base} − observed)",
                 sql_round(err.get("allocated GPU-hours|all", 0.0), 1),
                 sql_round(err.get("used GPU-hours|all", 0.0), 1),
                 None if wait_err is None else sql_round(wait_err, 1),
                 sql_round(sum(v for k, v in err.items()
                               if k.startswith("blocked GPU-hours|")), 1),
                 sql_round(err.get("lost GPU-hours|all", 0.0), 2)))
    return ReportSection(
        "whatif", "What if: the same history under other policies",
        "Replaying the cluster's own jobs through the scheduler model: what would each "
        "policy have allocated, made wait, blocked and lost? Read each policy against "
        f"the baseline ({base}), give or take its calibration error.",
        ["policy", "allocated_gpu_h", "used_gpu_h", "wait_p90_min", "blocked_gpu_h",
         "lost_gpu_h"], rows)


def print_section(section: ReportSection, console: Console) -> None:
    """The report section as one rich table (``gpuledger report``'s terminal style)."""
    body = [["" if v is None else (f"{v:,}" if isinstance(v, float) else printable(str(v)))
             for v in r] for r in section.rows]

    def build(widths: list[int] | None) -> Table:
        table = Table(title=Text(section.title), caption=Text(section.question),
                      title_justify="left", caption_justify="left")
        for i, name in enumerate(section.columns):
            width = None if widths is None else widths[i]
            table.add_column(Text(header(name, width, hyphens=True)), width=width,
                             justify="left" if i == 0 else "right", overflow="fold")
        for cells in body:
            table.add_row(*(Text(c) for c in cells))
        return table

    console.print(fitted(build, list(section.columns), body, console, cells_wrap=True,
                         hyphens=True))
