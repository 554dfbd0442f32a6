"""`gpuledger report`: terminal tables and the self-contained HTML report, opened in a
real headless Chromium."""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import polars as pl
import pytest
from sim_warehouse import build, table

from gpuledger.cli.main import main
from gpuledger.pipeline.analyst_report import html as report_html
from gpuledger.pipeline.analyst_report.answers import Answer, answer_all
from gpuledger.pipeline.analyst_report.sections import SECTIONS


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(tmp_path_factory.mktemp("report") / "wh")


@pytest.fixture(scope="module")
def answers(root: Path) -> list[Answer]:
    return answer_all(root)


def _chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    assert found, "chromium is missing: run scripts/setup.d/30-chromium.sh"
    return found


@dataclass
class Page:
    dom: str
    console: list[str]

    def attr(self, name: str) -> str | None:
        m = re.search(rf'<body[^>]*\b{name}="([^"]*)"', self.dom)
        return m.group(1) if m else None

    def script_errors(self) -> str:
        m = re.search(r'<div id="script-errors">(.*?)</div>', self.dom, re.S)
        assert m, "the page lost its error box"
        return m.group(1)


def open_in_chromium(path: Path, tmp: Path) -> Page:
    """Load a file in headless Chromium; the DOM after scripts ran, and every console
    message (an uncaught error is one)."""
    proc = subprocess.run(
        [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         f"--user-data-dir={tmp / 'chromium-profile'}", "--enable-logging=stderr", "--v=0",
         "--virtual-time-budget=5000", "--dump-dom", path.resolve().as_uri()],
        capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    console = [line for line in proc.stderr.splitlines() if ":CONSOLE" in line]
    return Page(proc.stdout, console)


def _charts(dom: str) -> dict[str, str]:
    """Each chart container's inner HTML by id."""
    return dict(re.findall(r'<div class="chart" id="(chart-\d+)">(.*?)</div></div>', dom, re.S))


def test_answers_match_the_facts(root: Path, answers: list[Answer]) -> None:
    by_key = {a.section.key: a for a in answers}
    assert [a.section.key for a in answers] == [s.key for s in SECTIONS]
    # allocation vs use per pool and card type, from the daily facts
    daily = table(root, "gpu_daily").group_by("pool", "card_type").agg(
        pl.col("allocated_gpu_hours").sum(), pl.col("used_gpu_hours").sum())
    a = by_key["allocation"]
    got = {r[0]: (r[a.columns.index("allocated")], r[a.columns.index("used")]) for r in a.rows}
    assert len(got) == daily.height > 0
    for pool, card, alloc, used in daily.iter_rows():
        assert got[f"{pool} / {card}"] == (pytest.approx(alloc, abs=0.051),
                                           pytest.approx(used, abs=0.051))
    # the top wasting attempt, from the attempt facts
    att = pl.concat([table(root, "job_attempts"), table(root, "running_attempts")],
                    how="diagonal_relaxed").filter(pl.col("allocated_gpu_hours") > 0).sort(
        ["waste_gpu_hours", "job_id"], descending=[True, False], nulls_last=True)
    assert by_key["top_jobs"].rows[0][0] == att["job_id"][0]
    assert len(by_key["top_jobs"].rows) == 10
    # preemption lost work per team, from the preemption facts
    pre = table(root, "preemptions").group_by("team").agg(pl.col("lost_gpu_hours").sum())
    p = by_key["preemption"]
    lost = {r[0]: r[p.columns.index("lost_gpu_hours")] for r in p.rows}
    assert lost == {t: pytest.approx(v, abs=0.006) for t, v in pre.iter_rows()}


def test_terminal_tables(root: Path, answers: list[Answer],
                         capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", "--warehouse", str(root), "--width", "220", "--top", "3"]) == 0
    out = capsys.readouterr().out
    for section in SECTIONS:
        assert section.title in out
    top = next(a for a in answers if a.section.key == "top_jobs")
    for row in top.rows[:3]:
        assert row[0] in out
    assert top.rows[3][0] not in out.split("Top wasting jobs")[1].split("Who over-requests")[0]


def test_html_renders_its_charts_in_chromium(root: Path, answers: list[Answer],
                                              tmp_path: Path) -> None:
    out = tmp_path / "report.html"
    assert main(["report", "--warehouse", str(root), "--html", str(out), "--quiet"]) == 0
    text = out.read_text(encoding="utf-8")
    # self-contained: no external scripts, styles, images or fonts
    assert not re.search(r'\b(src|href)\s*=', text)
    assert set(re.findall(r"https?://[^\s\"'<>)]+", text)) <= {"http://www.w3.org/2000/svg"}

    page = open_in_chromium(out, tmp_path)
    assert page.console == [], page.console
    assert page.script_errors() == ""
    expected = [a for a in answers if a.section.chart is not None and a.rows]
    assert len(expected) >= 6
    assert page.attr("data-charts-drawn") == page.attr("data-charts-expected") == \
        str(len(expected))
    charts = _charts(page.dom)
    assert len(charts) == len(expected)
    for inner in charts.values():
        assert "<svg" in inner and ("<rect" in inner or "<path" in inner)
    # the allocation chart: one bar per pool/card type and series
    alloc = next(a for a in answers if a.section.key == "allocation")
    idx = [a.section.key for a in answers].index("allocation")
    chart = alloc.section.chart
    assert chart is not None
    assert charts[f"chart-{idx}"].count('class="bar"') == len(alloc.rows) * len(chart.series)
    # the queue-wait-over-time chart: one line per queue
    qw = next(a for a in answers if a.section.key == "queue_wait_time")
    idx = [a.section.key for a in answers].index("queue_wait_time")
    assert charts[f"chart-{idx}"].count('class="series"') == len({r[1] for r in qw.rows})


def test_a_broken_script_is_caught(answers: list[Answer], tmp_path: Path,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The checks above can fail: a chart script that throws is reported."""
    monkeypatch.setattr(report_html, "_script", lambda: "drawEverything();")
    out = tmp_path / "broken.html"
    out.write_text(report_html.render_html(answers, "wh", datetime.now(UTC), "all"),
                   encoding="utf-8")
    page = open_in_chromium(out, tmp_path)
    assert any("drawEverything" in line for line in page.console)
    assert "drawEverything" in page.script_errors()
    assert page.attr("data-charts-drawn") is None


def test_cli_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", "--warehouse", str(tmp_path / "nope")]) == 2
    assert "not a gpuledger warehouse" in capsys.readouterr().err
    assert main(["report", "--warehouse", str(tmp_path), "--since", "2026-01-05T02:00Z",
                 "--until", "2026-01-05T01:00Z"]) == 2
    assert "--since must be before --until" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["report", "--top", "0"])


def test_window_narrows_the_waste_sections(root: Path, answers: list[Answer]) -> None:
    hourly = table(root, "gpu_hourly")
    t0 = hourly["hour"].min()
    t1 = t0.replace(hour=t0.hour + 1)  # type: ignore[union-attr]
    narrow = answer_all(root, since=t0, until=t1)  # type: ignore[arg-type]
    want = hourly.filter((pl.col("hour") >= t0) & (pl.col("hour") < t1)
                         & pl.col("team").is_not_null()).group_by("team").agg(
        pl.col("allocated_idle_gpu_hours").sum())
    got = {r[0]: r[1] for r in next(a for a in narrow if a.section.key == "waste_team").rows}
    assert got == {t: pytest.approx(v, abs=0.051) for t, v in want.iter_rows()}
