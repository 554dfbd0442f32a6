"""Where the advisor plugs into code other people own (``docs/diagnosis.md``, *Wiring*).

- :func:`with_cause`: the *column in recommendations*: each recommendation row gets its
  attempt's dominant pattern and remedy (``diagnosis``, ``diagnosis_remedy``);
- :func:`job_board_panel`: the *panel on the Job board*: a table of the job's
  ``job_diagnosis`` rows;
- :func:`whatif_answer`: the *section of* ``gpuledger report``: the what-if headline
  (:func:`.output.report_section`) as one of the report's answers, so its terminal and
  HTML renderers draw it; the hook in ``analyst_report/command.py``, after
  ``answer_all``: ``report.answers.append(whatif_answer(args.warehouse, args.since,
  args.until))`` (behind an opt-in flag: it replays, seconds per day of history).
  :func:`whatif_section` and :func:`.output.print_section` are the same without the
  report's types.

The *line in the alert evidence* is wired already (``alerts/engine.py``: a firing
low-utilisation alert carries ``likely_cause``, its evidence and remedy).
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import polars as pl
from grafana_foundation_sdk.builders import table

from gpuledger.pipeline.advisor.diagnosis import ATTEMPT, dominant
from gpuledger.pipeline.advisor.output import ReportSection, report_section
from gpuledger.pipeline.advisor.policy import DEFAULT, PolicySet
from gpuledger.pipeline.advisor.whatif import run_whatif
from gpuledger.pipeline.analyst_report.answers import Answer
from gpuledger.pipeline.analyst_report.sections import Chart, Column, Section
from gpuledger.pipeline.dashboards.builders import Board, sql, unit_of

JOB_PANEL_SQL = """SELECT attempt, pattern, gpu_hours, share, evidence, remedy
FROM job_diagnosis WHERE job_id = ${job:sqlstring} ORDER BY attempt, gpu_hours DESC"""


def with_cause(recommendations: pl.DataFrame, diagnosis: pl.DataFrame) -> pl.DataFrame:
    """``recommendations`` plus ``diagnosis`` (the attempt's dominant pattern) and
    ``diagnosis_remedy`` (null where the attempt has no diagnosis)."""
    top = dominant(diagnosis).select(*ATTEMPT, pl.col("pattern").alias("diagnosis"),
                                     pl.col("remedy").alias("diagnosis_remedy"))
    return recommendations.join(top, on=ATTEMPT, how="left")


def job_board_panel(board: Board) -> None:
    """Add the *Why idle or inefficient* table to the Job board (after Recommendations)."""
    board.add(table.Panel().decimals(2).override_by_name("share", [unit_of("percentunit")]),
              "Why idle or inefficient (diagnosis)", [sql(JOB_PANEL_SQL)], "suffix: GPU-h",
              w=24, h=6)


HEADLINE = (("policy", "policy", None, ""), ("allocated_gpu_h", "allocated", 1, "GPU-h"),
            ("used_gpu_h", "used", 1, "GPU-h"), ("wait_p90_min", "wait p90", 1, "min"),
            ("blocked_gpu_h", "blocked", 1, "GPU-h"), ("lost_gpu_h", "lost", 2, "GPU-h"))


def whatif_answer(warehouse: str | Path, since: datetime | None = None,
                  until: datetime | None = None, policies: PolicySet = DEFAULT,
                  step_minutes: int = 5) -> Answer:
    """The what-if section as an answer of ``gpuledger report`` (part *What to do*)."""
    sec = whatif_section(warehouse, since, until, policies, step_minutes)
    columns = tuple(Column(name, header, decimals, unit)
                    for name, header, decimals, unit in HEADLINE)
    section = Section(sec.key, "todo", sec.title, sec.question, "", columns,
                      Chart("bar", "policy", ("allocated_gpu_h", "used_gpu_h"), "GPU-h",
                            ("allocated", "used")))
    rows = list(sec.rows)
    plotted = [r for r in rows if not str(r[0]).startswith("calibration error")]
    return Answer(section, list(sec.columns), rows, list(sec.columns), plotted)


def whatif_section(warehouse: str | Path, since: datetime | None = None,
                   until: datetime | None = None, policies: PolicySet = DEFAULT,
                   step_minutes: int = 5) -> ReportSection:
    """The report's what-if section (every 5 minutes of grid by default, to stay quick;
    a shorter window, every minute of it)."""
    if since is not None and until is not None:
        step_minutes = max(1, min(step_minutes, int((until - since).total_seconds() // 60)))
    return report_section(run_whatif(warehouse, policies, None, since, until, step_minutes))
