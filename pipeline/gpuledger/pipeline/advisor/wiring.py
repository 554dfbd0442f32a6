"""Where the advisor plugs into code other people own (``docs/diagnosis.md``, *Wiring*).

- :func:`with_cause`: the *column in recommendations*: each recommendation row gets its
  attempt's dominant pattern and remedy (``diagnosis``, ``diagnosis_remedy``);
- :func:`job_board_panel`: the *panel on the Job board*: a table of the job's
  ``job_diagnosis`` rows;
- :func:`whatif_section`: the *section of* ``gpuledger report``: the what-if headline
  (:func:`.output.report_section`), rendered by :func:`.output.print_section`.

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


def whatif_section(warehouse: Path, since: datetime | None = None,
                   until: datetime | None = None, policies: PolicySet = DEFAULT,
                   step_minutes: int = 5) -> ReportSection:
    """The report's what-if section (every 5 minutes of grid by default, to stay quick)."""
    return report_section(run_whatif(warehouse, policies, None, since, until, step_minutes))
