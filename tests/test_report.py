"""`gpuledger report`: terminal tables and the self-contained HTML report, opened in a
real headless Chromium (its layout measured in the page, a screenshot kept under the
test's tmp dir)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from sim_warehouse import SIM_HOURS, build, table

from gpuledger.cli.main import main
from gpuledger.pipeline import query
from gpuledger.pipeline.analyst_report import html as report_html
from gpuledger.pipeline.analyst_report.answers import Report, answer_all
from gpuledger.pipeline.analyst_report.numbers import number
from gpuledger.pipeline.analyst_report.sections import SECTIONS, Section

TOP = 10
WIDTH = 1280
JOB_TYPES = {"training", "fine-tune", "evaluation", "inference", "interactive"}


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(tmp_path_factory.mktemp("report") / "wh")


@pytest.fixture(scope="module")
def report(root: Path) -> Report:
    return answer_all(root)


def _answer(report: Report, key: str) -> Any:
    return next(a for a in report.answers if a.section.key == key)


def _chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    assert found, "chromium is missing: run scripts/setup.d/30-chromium.sh"
    return found


def _chromium_run(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--hide-scrollbars", f"--user-data-dir={tmp / 'chromium-profile'}",
         "--enable-logging=stderr", "--v=0", "--virtual-time-budget=5000", *args],
        capture_output=True, text=True, timeout=120, check=False)


# Measures the page after the charts are drawn: every SVG text's box against its SVG's
# box, the page's width against the window's, the labels of the time axes.
MEASURE = """<script>(function () {
  var out = {innerWidth: window.innerWidth, scrollWidth: document.documentElement.scrollWidth,
             height: document.documentElement.scrollHeight, svgs: []};
  document.querySelectorAll("svg.chart-svg").forEach(function (svg) {
    var b = svg.getBoundingClientRect(), texts = [], clipped = [];
    svg.querySelectorAll("text").forEach(function (t) {
      var r = t.getBoundingClientRect();
      texts.push({text: t.textContent, cls: t.getAttribute("class"),
                  tspans: Array.prototype.map.call(t.querySelectorAll("tspan"),
                                                   function (s) { return s.textContent; })});
      if (r.width === 0 || r.left < b.left - 0.5 || r.right > b.right + 0.5 ||
          r.top < b.top - 0.5 || r.bottom > b.bottom + 0.5) { clipped.push(t.textContent); }
    });
    out.svgs.push({chart: svg.parentNode.id, width: b.width, texts: texts, clipped: clipped,
                   lines: svg.querySelectorAll("path.series").length,
                   bars: svg.querySelectorAll("rect.bar").length,
                   barWidths: Array.prototype.map.call(svg.querySelectorAll("rect.bar"),
                     function (r) { return r.getBoundingClientRect().width; }),
                   titles: Array.prototype.map.call(svg.querySelectorAll("text > title"),
                     function (t) { return t.textContent; })});
  });
  var pre = document.createElement("pre");
  pre.id = "layout";
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
})();</script>"""


@dataclass
class Page:
    dom: str
    console: list[str]
    layout: dict[str, Any]

    def attr(self, name: str) -> str | None:
        m = re.search(rf'<body[^>]*\b{name}="([^"]*)"', self.dom)
        return m.group(1) if m else None

    def script_errors(self) -> str:
        m = re.search(r'<div id="script-errors">(.*?)</div>', self.dom, re.S)
        assert m, "the page lost its error box"
        return m.group(1)


def open_in_chromium(path: Path, tmp: Path) -> Page:
    """Load a copy of the page with the measuring script in headless Chromium at 1280 px
    wide; the DOM after the scripts ran, every console message, the measurements."""
    probe = tmp / f"probe-{path.name}"
    probe.write_text(path.read_text(encoding="utf-8").replace("</body>", MEASURE + "</body>"),
                     encoding="utf-8")
    proc = _chromium_run(tmp, f"--window-size={WIDTH},900", "--dump-dom", probe.as_uri())
    assert proc.returncode == 0, proc.stderr[-2000:]
    console = [line for line in proc.stderr.splitlines() if ":CONSOLE" in line]
    m = re.search(r'<pre id="layout">(.*?)</pre>', proc.stdout, re.S)
    layout = json.loads(m.group(1).replace("&amp;", "&").replace("&lt;", "<")
                        .replace("&gt;", ">")) if m else {}
    return Page(proc.stdout, console, layout)


def screenshot(path: Path, tmp: Path, height: int) -> Path:
    shot = tmp / "report.png"
    proc = _chromium_run(tmp, f"--window-size={WIDTH},{height}", f"--screenshot={shot}",
                         path.as_uri())
    assert proc.returncode == 0, proc.stderr[-2000:]
    return shot


class Tables(HTMLParser):
    """Every table of the page: (section id, in <details>, header texts, cell rows with
    each cell's class)."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: list[dict[str, Any]] = []
        self.section = ""
        self.details = 0
        self.head = False
        self.cell: list[str] | None = None
        self.cls = ""

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "section":
            self.section = a.get("id") or ""
        elif tag == "details":
            self.details += 1
        elif tag == "table":
            self.tables.append({"section": self.section, "folded": self.details > 0,
                                "head": [], "rows": []})
        elif tag == "thead":
            self.head = True
        elif tag == "tr" and not self.head:
            self.tables[-1]["rows"].append([])
        elif tag in ("td", "th"):
            self.cell, self.cls = [], a.get("class") or ""

    def handle_endtag(self, tag: str) -> None:
        if tag == "details":
            self.details -= 1
        elif tag == "thead":
            self.head = False
        elif tag in ("td", "th") and self.cell is not None:
            text = "".join(self.cell).strip()
            if tag == "th":
                self.tables[-1]["head"].append(text)
            else:
                self.tables[-1]["rows"][-1].append((text, self.cls))
            self.cell = None

    def handle_data(self, data: str) -> None:
        if self.cell is not None:
            self.cell.append(data)


def _tables(text: str) -> list[dict[str, Any]]:
    parser = Tables()
    parser.feed(text)
    return parser.tables


@pytest.fixture(scope="module")
def html_file(root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("html") / "report.html"
    assert main(["report", "--warehouse", str(root), "--html", str(out), "--quiet",
                 "--top", str(TOP)]) == 0
    return out


# --- what the report says ---------------------------------------------------------------


def test_answers_match_the_facts(root: Path, report: Report) -> None:
    assert [a.section.key for a in report.answers] == [s.key for s in SECTIONS]
    # allocation vs use per pool and card type, from the hourly facts
    hourly = table(root, "gpu_hourly").group_by("pool", "card_type").agg(
        pl.col("allocated_gpu_hours").sum(), pl.col("used_gpu_hours").sum())
    a = _answer(report, "allocation")
    got = {(r[1], r[2]): (r[a.columns.index("allocated")], r[a.columns.index("used")])
           for r in a.rows}
    assert len(got) == hourly.height > 0
    for pool, card, alloc, used in hourly.iter_rows():
        assert got[(pool, card)] == (pytest.approx(alloc), pytest.approx(used))
    # "Allocated of available" beside the available GPU-hours it divides by (capacity
    # less the unavailable hours), so that a reader can check it
    for row in (dict(zip(a.columns, r, strict=True)) for r in a.rows):
        assert row["available"] == pytest.approx(row["capacity"] - row["unavailable"])
        assert row["allocated_pct"] == pytest.approx(100 * row["allocated"] / row["available"])
    assert any(r[a.columns.index("unavailable")] > 0 for r in a.rows)
    # the top wasting attempt: observed − used GPU-hours, from the attempt facts
    every = pl.concat([table(root, "job_attempts"), table(root, "running_attempts")],
                      how="diagonal_relaxed")
    att = every.filter(pl.col("allocated_gpu_hours") > 0) \
        .with_columns(waste=pl.col("observed_gpu_hours") - pl.col("used_gpu_hours")) \
        .sort(["waste", "job_id"], descending=[True, False], nulls_last=True)
    top = _answer(report, "top_jobs")
    assert top.rows[0][0] == att["job_id"][0]
    assert top.rows[0][top.columns.index("waste")] == pytest.approx(att["waste"][0])
    # preemption lost work per team, from the preemption facts
    pre = table(root, "preemptions").group_by("team").agg(pl.col("lost_gpu_hours").sum())
    p = _answer(report, "preemption")
    assert {r[0]: r[p.columns.index("lost")] for r in p.rows} == \
        {t: pytest.approx(v) for t, v in pre.iter_rows()}
    # queue wait by GPU count, from the attempt facts
    w = _answer(report, "wait_gpus")
    started = every.filter(pl.col("queue_wait_s").is_not_null()).group_by("gpus").agg(
        pl.len().alias("n"), (pl.col("queue_wait_s").quantile(0.9, "linear") / 60).alias("p90"))
    assert {r[1]: (r[2], r[w.columns.index("p90_min")]) for r in w.rows} == \
        {g: (n, pytest.approx(p)) for g, n, p in started.iter_rows()}


def test_header_shows_the_real_window(root: Path, html_file: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    _, rows = query.run(root, "SELECT min(minute), max(minute) FROM gpu_minute")
    first = rows[0][0].astimezone(UTC)
    last = rows[0][1].astimezone(UTC) + timedelta(minutes=1)
    expected = (f"Data: {first:%Y-%m-%d %H:%M} – {last:%Y-%m-%d %H:%M} UTC "
                f"({SIM_HOURS:.0f} h)")
    text = html_file.read_text(encoding="utf-8")
    assert expected in text
    assert "window start" not in text and "– end" not in text
    assert main(["report", "--warehouse", str(root), "--width", "120"]) == 0
    assert expected in capsys.readouterr().out
    # a narrower window: the header says both
    since = first + timedelta(hours=1)
    assert main(["report", "--warehouse", str(root), "--since", since.isoformat(),
                 "--width", "120"]) == 0
    out = capsys.readouterr().out
    assert f"Data: {since:%Y-%m-%d %H:%M} – {last:%Y-%m-%d %H:%M} UTC (2 h)" in out


def test_terminal_fits_80_columns_and_keeps_job_ids_whole(
        root: Path, report: Report, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", "--warehouse", str(root), "--width", "80", "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= 80
    assert "…" not in out.replace("… and", "")               # nothing cut with an ellipsis
    for section in SECTIONS:
        assert section.title in out
    words = set(out.split())
    top = _answer(report, "top_jobs")
    for job_id in [r[0] for r in top.rows[:3]] + [r[0] for r in
                                                   _answer(report, "blocked_jobs").rows[:3]]:
        assert job_id in words, job_id                      # the whole id, as one word
    top_part = out.split("Top wasting jobs")[1].split("Why do big jobs wait")[0]
    assert top.rows[3][0] not in top_part.split()
    # every overflow line counts the rows left out ('… and more rows' did not)
    assert (f"… and {len(top.rows) - 3} more rows" if len(top.rows) < 100 else
            f"… and at least {len(top.rows) - 3} more rows") in top_part


def test_a_section_with_no_rows_says_so_in_one_line(
        root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A window after the data: each windowed section is its title and one line (the
    line sat in an empty table's first column, one word a line: 'no rows / in this /
    window')."""
    assert main(["report", "--warehouse", str(root), "--width", "80",
                 "--since", "2030-01-01"]) == 0
    lines = capsys.readouterr().out.splitlines()
    empty = [lines[k - 1] for k, line in enumerate(lines) if line == "  no rows in this window"]
    assert empty == [s.title for s in SECTIONS if s.key != "borrowing"]
    assert not {"in this", "window", "no rows"} & {line.strip() for line in lines}


def _pod_warehouse(tmp_path: Path, pods: str, nodes: str) -> Path:
    """A warehouse of a pod list alone (``gpuledger import pods``), from the two CSV
    files' text."""
    (tmp_path / "pods.csv").write_text(pods)
    (tmp_path / "nodes.csv").write_text(nodes)
    wh = tmp_path / "wh"
    assert main(["import", "pods", str(tmp_path / "pods.csv"), "--nodes",
                 str(tmp_path / "nodes.csv"), "--quiet", "--warehouse", str(wh)]) == 0
    return wh


def test_an_empty_section_names_a_window_only_when_one_was_asked_for(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A pod list alone (no telemetry, no preemption): its empty sections said "no rows
    in this window" with no window asked for. Now "no rows"; with --since, the sections
    that keep to the window say "in this window", and borrowing (all the data) does not."""
    wh = _pod_warehouse(
        tmp_path,
        "name,created,scheduled,deleted,gpus\n"
        "a,2026-01-05T00:00:00Z,2026-01-05T00:10:00Z,2026-01-05T01:10:00Z,2\n",
        "node,gpus,card_type,pool\nn1,4,H100,p\n")
    capsys.readouterr()
    assert main(["report", "--warehouse", str(wh), "--width", "100"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "  no rows" in lines
    assert not any("in this window" in line for line in lines)
    html_file = tmp_path / "r.html"
    assert main(["report", "--warehouse", str(wh), "--html", str(html_file)]) == 0
    page = html_file.read_text(encoding="utf-8")
    assert 'class="blank">no rows</td>' in page and "in this window" not in page
    capsys.readouterr()
    assert main(["report", "--warehouse", str(wh), "--width", "100",
                 "--since", "2026-01-05T00:00Z"]) == 0
    lines = capsys.readouterr().out.splitlines()
    empty = {lines[k - 1]: line.strip() for k, line in enumerate(lines)
             if line.startswith("  no rows")}
    windowed = {s.title for s in SECTIONS if s.windowed}
    assert empty and all(said == ("no rows in this window" if title in windowed
                                  else "no rows") for title, said in empty.items()), empty


def test_a_table_too_wide_for_whole_cells_wraps_words_and_never_cuts_one(
        root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """In 80 columns the what-if section (a row label of 37 characters) did not fit with
    whole cells, and rich cut its headers mid-word ("allocate" over "d", "(GPU-h" over
    ")"); its text cells now wrap at their spaces instead, and every header word and
    figure is whole."""
    from gpuledger.pipeline.advisor.wiring import whatif_section

    assert main(["report", "--warehouse", str(root), "--width", "80", "--whatif"]) == 0
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= 80
    part = out.split("What if: the same history under other policies")[1]
    words = set(part.split())
    assert {"allocated", "used", "wait", "p90", "(min)", "blocked", "lost",
            "(GPU-h)"} <= words
    section = whatif_section(root)
    for row in section.rows[:-1]:  # the last, the calibration error, wraps at spaces
        assert row[0] in words, row[0]
    assert {"calibration", "error", "(as-run", "−", "observed)"} <= words


def test_html_tables_read_right(report: Report, html_file: Path) -> None:
    tables = _tables(html_file.read_text(encoding="utf-8"))
    by_section = {s.key: s for s in SECTIONS}
    seen_sections = set()
    for t in tables:
        section: Section = by_section[t["section"]]
        seen_sections.add(section.key)
        assert t["head"] == [c.title for c in section.columns]
        # human headers: no snake_case; every measured quantity says its unit
        for c in section.columns:
            assert "_" not in c.title, c.title
            assert c.decimals in (None, 0) or c.unit, f"{section.key}.{c.name}: no unit"
        # long tables: the first TOP rows, the rest folded under <details>
        if not t["folded"]:
            assert len(t["rows"]) <= TOP, section.key
        for row in t["rows"]:
            assert len(row) == len(section.columns)
            for (text, cls), c in zip(row, section.columns, strict=True):
                assert text, f"{section.key}.{c.name}: an empty cell"   # explained instead
                if "blank" in cls:
                    assert text in (c.blank, c.blank_when and c.blank_when[1])
                elif c.decimals is not None and text not in ("no rows",
                                                             "no rows in this window"):
                    # one number format: thousands separators, the column's decimals
                    pattern = r"\d{1,3}(,\d{3})*" + (rf"\.\d{{{c.decimals}}}" if c.decimals
                                                     else "")
                    assert re.fullmatch(rf"(< |> -)?-?{pattern}", text), (c.name, text)
    assert seen_sections == {s.key for s in SECTIONS}
    # folded rows: every row the section read is in the page, once
    top = _answer(report, "top_jobs")
    top_tables = [t for t in tables if t["section"] == "top_jobs"]
    assert [len(t["rows"]) for t in top_tables] == [TOP, len(top.rows) - TOP]
    assert [t["folded"] for t in top_tables] == [False, True]


def test_numbers_are_rounded_once_with_honest_precision(report: Report,
                                                        html_file: Path) -> None:
    assert number(1.667, 1) == "1.7" and number(1018.06, 1) == "1,018.1"
    assert number(0.004, 1) == "< 0.1" and number(0.0, 1) == "0.0"
    assert number(1e-12, 2) == "0.00" and number(84.3, 1) == "84.3"
    # a half away from zero, as the value reads (a probe's 0.25 GPU-h showed as 0.2)
    assert [number(v, 1) for v in (0.25, 0.35, -0.25, 2.45)] == ["0.3", "0.4", "-0.3", "2.5"]
    assert number(2.675, 2) == "2.68" and number(0.5, 0) == "1"
    # a sum of facts rounded to 1e-9 (a probe: 7.7 in one table, 7.8 in another)
    assert number(7.749999999, 1) == number(7.75, 1) == "7.8"
    # the HTML shows the SQL's unrounded values rounded once: compare every numeric cell
    text = html_file.read_text(encoding="utf-8")
    tables = [t for t in _tables(text) if t["section"] == "waste_team"]
    a = _answer(report, "waste_team")
    cols = a.section.columns
    for row, raw in zip(tables[0]["rows"], a.rows, strict=False):
        for (cell, _), c in zip(row, cols, strict=True):
            value = raw[a.columns.index(c.name)]
            if c.decimals is not None and value is not None:
                assert cell == number(float(value), c.decimals)


def test_empty_cells_say_why(report: Report, html_file: Path) -> None:
    tables = {t["section"]: t for t in _tables(html_file.read_text(encoding="utf-8"))
              if not t["folded"]}
    top = _answer(report, "top_jobs")
    asked = top.section.columns[[c.name for c in top.section.columns].index("card_type")]
    any_rows = [r for r in top.rows[:TOP] if r[top.columns.index("card_type")] is None]
    assert any_rows, "the simulated cluster has any-card jobs"
    card_cells = [row[[c.name for c in top.section.columns].index("card_type")]
                  for row in tables["top_jobs"]["rows"]]
    assert card_cells.count((asked.blank, "blank")) == len(any_rows)
    blocked = _answer(report, "blocked_jobs")
    pending = [r for r in blocked.rows[:TOP] if r[blocked.columns.index("waited_min")] is None]
    waited = [row[-1] for row in tables["blocked_jobs"]["rows"]]
    assert waited.count(("still pending", "blank")) == len(pending)
    for key, t in tables.items():
        for row in t["rows"]:
            assert all(text for text, _ in row), key


def test_charts_draw_one_dimension_per_axis(report: Report, root: Path) -> None:
    for a in report.answers:
        payload = report_html.chart_payload(a, "c", report.window, TOP)
        chart = a.section.chart
        if payload is None or chart is None:
            continue
        if chart.kind == "bar":
            # the categories are the values of one column
            values = [str(r[a.chart_columns.index(chart.category)]) for r in a.chart_rows]
            assert payload["categories"] == values[:len(payload["categories"])]
            assert len(set(payload["categories"])) == len(payload["categories"])
    job_types = report_html.chart_payload(_answer(report, "waste_job_type"), "c",
                                          report.window, TOP)
    assert job_types is not None and set(job_types["categories"]) <= JOB_TYPES


# --- the page in a real browser ------------------------------------------------------------


def test_html_in_chromium(report: Report, html_file: Path, tmp_path: Path) -> None:
    text = html_file.read_text(encoding="utf-8")
    # self-contained: no external scripts, styles, images or fonts
    assert not re.search(r'\b(src|href)\s*=\s*"(?!#)', text)
    assert set(re.findall(r"https?://[^\s\"'<>)]+", text)) <= {"http://www.w3.org/2000/svg"}

    page = open_in_chromium(html_file, tmp_path)
    assert page.console == [], page.console
    assert page.script_errors() == ""
    expected = [a for a in report.answers
                if report_html.chart_payload(a, "c", report.window, TOP) is not None]
    assert len(expected) >= 8
    assert page.attr("data-charts-drawn") == page.attr("data-charts-expected") == \
        str(len(expected))
    layout = page.layout
    # no horizontal overflow at 1280 px
    assert layout["innerWidth"] == WIDTH
    assert layout["scrollWidth"] <= WIDTH
    svgs = {s["chart"]: s for s in layout["svgs"]}
    assert len(svgs) == len(expected)
    for s in svgs.values():
        # no label outside its chart: every text box inside the SVG's box
        assert s["clipped"] == [], (s["chart"], s["clipped"])
        assert s["texts"] and (s["bars"] or s["lines"])
    index = {a.section.key: i for i, a in enumerate(report.answers)}
    # one bar per pool · card type and state that anyone was in
    alloc = _answer(report, "allocation")
    payload = report_html.chart_payload(alloc, "c", report.window, TOP)
    assert payload is not None
    assert svgs[f"chart-{index['allocation']}"]["bars"] == \
        len(alloc.rows) * len(payload["series"])
    # time axes: whole half hours of UTC (3 hours of data), the axis says so, the last
    # tick inside the window
    for key, lines in (("frag_time", 3), ("blocked_time", len(alloc.rows))):
        s = svgs[f"chart-{index[key]}"]
        assert s["lines"] == lines
        ticks = [t["tspans"] for t in s["texts"] if t["tspans"]]
        assert len(ticks) >= 6
        for spans in ticks:
            assert re.fullmatch(r"\d\d:(00|30)", spans[0]), spans
        assert [t["text"] for t in s["texts"] if t["cls"] == "unit"][-1] == "time (UTC)"
        start = report.window.start
        assert start is not None and ticks[0][1] == f"{start:%b} {start.day}"
        hour, minute = (int(v) for v in ticks[-1][0].split(":"))
        end = report.window.end
        assert end is not None
        assert datetime(end.year, end.month, end.day, hour, minute, tzinfo=UTC) <= end

    shot = screenshot(html_file, tmp_path, int(layout["height"]))
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert shot.stat().st_size > 50_000


def test_the_old_layout_check_can_fail(report: Report, tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The measurements above catch a clipped label: a chart script that rotates its
    labels past the SVG's edge is found out."""
    script = report_html._script().replace(
        '"text-anchor": "end",\n                              "class": "label"',
        '"text-anchor": "end", transform: "rotate(-35 " + (M.left - 8) + " " + '
        '(y0 + rowH / 2 + 4) + ")",\n                              "class": "label"')
    assert script != report_html._script()
    monkeypatch.setattr(report_html, "_script", lambda: script)
    out = tmp_path / "rotated.html"
    out.write_text(report_html.render_html(report, "wh", datetime.now(UTC)),
                   encoding="utf-8")
    page = open_in_chromium(out, tmp_path)
    assert any(s["clipped"] for s in page.layout["svgs"])


def test_a_broken_script_is_caught(report: Report, tmp_path: Path,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The checks above can fail: a chart script that throws is reported."""
    monkeypatch.setattr(report_html, "_script", lambda: "drawEverything();")
    out = tmp_path / "broken.html"
    out.write_text(report_html.render_html(report, "wh", datetime.now(UTC)),
                   encoding="utf-8")
    page = open_in_chromium(out, tmp_path)
    assert any("drawEverything" in line for line in page.console)
    assert "drawEverything" in page.script_errors()
    assert page.attr("data-charts-drawn") is None


def test_cli_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", "--warehouse", str(tmp_path / "nope")]) == 2
    # a mistyped path said 'not a gpuledger warehouse (nothing published yet)', as an
    # empty folder does
    assert f"{tmp_path / 'nope'}: no such folder" in capsys.readouterr().err
    assert main(["report", "--warehouse", str(tmp_path)]) == 2
    assert "not a gpuledger warehouse (nothing published yet)" in capsys.readouterr().err
    assert main(["report", "--warehouse", str(tmp_path), "--since", "2026-01-05T02:00Z",
                 "--until", "2026-01-05T01:00Z"]) == 2
    assert "--since must be before --until" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["report", "--top", "0"])


def test_window_narrows_the_sections(root: Path, report: Report) -> None:
    hourly = table(root, "gpu_hourly")
    t0 = hourly["hour"].min()
    t1 = t0 + timedelta(hours=1)  # type: ignore[operator]
    narrow = answer_all(root, since=t0, until=t1)  # type: ignore[arg-type]
    want = hourly.filter((pl.col("hour") >= t0) & (pl.col("hour") < t1)
                         & pl.col("team").is_not_null()).group_by("team").agg(
        pl.col("allocated_idle_gpu_hours").sum())
    got = {r[0]: r[3] for r in _answer(narrow, "waste_team").rows}
    assert got == {t: pytest.approx(v) for t, v in want.iter_rows()}
    frag = table(root, "frag_minute").filter((pl.col("minute") >= t0) & (pl.col("minute") < t1))
    assert sum(r[3] for r in _answer(narrow, "blocked_time").rows) == \
        frag["blocked_jobs"].sum()
    assert narrow.window.start == t0 and narrow.window.end == t1
    # borrowing covers all the data whatever the window
    assert _answer(narrow, "borrowing").rows == [
        tuple(pytest.approx(v) if isinstance(v, float) else v for v in r)
        for r in _answer(report, "borrowing").rows]


def test_a_window_inside_hours_is_taken_as_whole_hours_and_says_so(root: Path,
                                                                    report: Report) -> None:
    """The GPU-hour facts are hourly: --since 00:30 --until 01:20 covers 00:00-02:00 in
    every section (before, the hourly sections silently covered 01:00-02:00)."""
    start = report.window.start
    assert start is not None
    narrow = answer_all(root, since=start + timedelta(minutes=30),
                        until=start + timedelta(minutes=80))
    assert (narrow.window.start, narrow.window.end) == (start, start + timedelta(hours=2))
    asked = narrow.window.asked()
    assert asked is not None and "taken as the whole hours" in asked
    whole = answer_all(root, since=start, until=start + timedelta(hours=2))
    assert _answer(narrow, "allocation").rows == [
        tuple(pytest.approx(v) if isinstance(v, float) else v for v in r)
        for r in _answer(whole, "allocation").rows]


def test_time_charts_stay_inside_the_window(root: Path, report: Report) -> None:
    """Data that ends inside a time bucket: the last bucket's point sits in the part of
    the bucket that is in the window, not past the end of the axis."""
    start = report.window.start
    assert start is not None
    narrow = answer_all(root, since=start, until=start + timedelta(minutes=78))
    ends_inside = replace(narrow.window, until=start + timedelta(minutes=78))
    assert narrow.window.bucket_minutes == ends_inside.bucket_minutes == 5
    for key in ("frag_time", "blocked_time"):
        payload = report_html.chart_payload(_answer(narrow, key), "c", ends_inside, TOP)
        assert payload is not None
        x0, x1 = payload["x0"], payload["x1"]
        assert x1 - x0 == 78 * 60_000
        points = [p[0] for s in payload["series"] for p in s["points"]]
        assert points and all(x0 <= x <= x1 for x in points)
        assert max(points) == x0 + 76.5 * 60_000            # the middle of 01:15-01:18


def test_time_charts_of_under_an_hour_draw_a_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """40 minutes of history: hourly buckets drew one dot per series. Buckets follow
    the data's span (5 minutes up to 3 hours, 15 up to 12, an hour up to 3 days, a day
    beyond)."""
    from gpuledger.pipeline.analyst_report.sections import bucket_minutes

    wh = _pod_warehouse(
        tmp_path,
        "name,created,scheduled,deleted,gpus\n"
        "a,2026-01-05T00:00:00Z,2026-01-05T00:05:00Z,2026-01-05T00:40:00Z,2\n",
        "node,gpus,card_type,pool\nn1,4,H100,p\n")
    report = answer_all(wh)
    assert report.window.bucket_minutes == 5
    payload = report_html.chart_payload(_answer(report, "frag_time"), "c", report.window, TOP)
    assert payload is not None and payload["bucket_minutes"] == 5
    for series in payload["series"]:
        xs = [p[0] for p in series["points"]]
        assert len(xs) >= 7 and xs == sorted(xs), series["name"]
        assert all(payload["x0"] <= x <= payload["x1"] for x in xs)
    assert [bucket_minutes(timedelta(hours=h)) for h in (0.5, 3, 3.5, 12, 13, 72, 73)] == \
        [5, 5, 15, 15, 60, 60, 1440]


def test_states_of_allocation_add_up_on_a_scheduler_only_history(tmp_path: Path) -> None:
    """A pod list without telemetry: allocated = no telemetry; idle stays 0, never
    negative (no-telemetry hours are a state of their own, not taken from idle)."""
    wh = _pod_warehouse(
        tmp_path,
        "name,created,scheduled,deleted,gpus\n"
        "a,2026-01-05T00:00:00Z,2026-01-05T00:10:00Z,2026-01-05T01:10:00Z,2\n",
        "node,gpus,card_type,pool\nn1,4,H100,p\n")
    a = _answer(answer_all(wh), "allocation")
    row = dict(zip(a.columns, a.rows[0], strict=True))
    assert row["allocated"] == pytest.approx(2.0) == row["no_telemetry"]
    assert row["idle"] == pytest.approx(0.0)
    assert row["busy"] + row["inefficient"] + row["idle"] + row["no_telemetry"] == \
        pytest.approx(row["allocated"])


def test_figures_and_header_words_stay_whole_when_words_fill_a_figure_s_column(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A scheduler-only history with a card type never allocated: "Used of allocated"
    holds words ("no telemetry", "nothing allocated"). In 80 columns rich squeezed that
    table: "telemet" over "ry", "14,379." over "1" (the openb trace). Now the words wrap
    at their spaces and every figure and header word is whole."""
    from gpuledger.pipeline.analyst_report.numbers import cell

    wh = _pod_warehouse(
        tmp_path,
        "name,created,scheduled,deleted,gpus,card_type\n"
        "a,2026-01-05T00:00:00Z,2026-01-05T00:10:00Z,2026-01-05T01:10:00Z,2,H100\n",
        "node,gpus,card_type,pool\nn1,8,H100,p\nn2,8,A10,p\n")
    capsys.readouterr()
    assert main(["report", "--warehouse", str(wh), "--width", "80"]) == 0
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= 80
    a = _answer(answer_all(wh), "allocation")
    part = out.split(a.section.title)[1].split("Also in the HTML report")[0]
    words = part.split()
    assert {"nothing", "no", "telemetry", "allocated", "available", "(GPU-h)", "(%)"} <= set(
        words)
    shown = [c for c in a.section.columns if c.terminal]
    figures = [cell(v, c, dict(zip(a.columns, r, strict=True)))
               for r in a.rows for c, v in ((c, r[a.columns.index(c.name)]) for c in shown)
               if c.numeric]
    assert any(f.startswith("nothing") for f in figures)
    for figure in figures:   # each whole, on one line: in order among the words
        if any(ch.isdigit() for ch in figure):
            assert figure.split() == words[words.index(figure.split()[-1])
                                           - len(figure.split()) + 1:
                                           words.index(figure.split()[-1]) + 1], figure


def test_names_that_look_like_markup_are_shown_as_they_are(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A team named '[/]' and a queue 'q[red]x' (from the scheduler, anyone's choice): the
    terminal report shows them as written (it crashed: rich read them as markup)."""
    out = _one_job_report(tmp_path, capsys, "j", team="[/]", queue="q[red]x")
    assert "[/]" in out.split() and "q[red]x" in out


def _one_job_report(tmp_path: Path, capsys: pytest.CaptureFixture[str], job_id: str,
                    **names: str) -> str:
    """The terminal report of a warehouse of one 30-minute job (``names``: its team,
    queue, ...) on one GPU."""
    from events import alloc, at, frames, inventory, job, series

    from gpuledger.pipeline.config import ProcessorConfig
    from gpuledger.pipeline.processor import Processor
    from gpuledger.pipeline.warehouse import Warehouse

    wh = tmp_path / "wh"
    recs = [inventory("n1", at(0), gpus=2), job("submitted", job_id, at(0), **names),
            job("started", job_id, at(0), allocation=alloc("n1", 0)),
            job("finished", job_id, at(30))]
    recs += series("n1", 0, at(0), 30, sm=0.01)
    proc = Processor(ProcessorConfig(), Warehouse(wh))
    proc.process(frames(recs), validated=True)
    proc.flush()
    assert main(["report", "--warehouse", str(wh), "--width", "200"]) == 0
    return capsys.readouterr().out


def test_control_characters_in_names_do_not_reach_the_terminal(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A job id and a team with an escape sequence, a newline, a C1 CSI and a line
    separator in them (Slurm job names and accounts are anyone's choice): the terminal
    report wrote them raw, so the terminal turned red and the row broke in two. They are
    escaped now, as `query`'s tables do."""
    evil = "j\x1b[31mRED\x1b[0m\nnext\u2028line\x9b2J"
    out = _one_job_report(tmp_path, capsys, evil, team="t\x1b]0;title\x07")
    for raw in ("\x1b", "\x9b", "\x07", "\u2028"):
        assert raw not in out
    assert "j\\x1b[31mRED\\x1b[0m\\nnext\\u2028line\\x9b2J" in out
    assert "t\\x1b]0;title\\x07" in out


def test_query_tables_escape_bidi_controls_as_the_report_does(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A job id with a right-to-left override (U+202E) read reversed in `gpuledger
    query`'s table ('1000015' as '5100001'), as it did in the report before the report
    escaped it; one helper escapes them for every terminal table now. CSV keeps the data
    as it is."""
    _one_job_report(tmp_path, capsys, "\u202e1000015")
    wh = str(tmp_path / "wh")
    assert main(["query", "--warehouse", wh, "SELECT job_id FROM job_attempts"]) == 0
    out = capsys.readouterr().out
    assert "\u202e" not in out and "\\u202e1000015" in out, out
    assert main(["query", "--warehouse", wh, "--format", "csv",
                 "SELECT job_id FROM job_attempts"]) == 0
    assert "\u202e1000015" in capsys.readouterr().out


def test_names_that_open_a_script_comment_still_let_the_charts_draw(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Found by trying hostile names: a team named '<!--<script>' (anyone's choice, from
    the scheduler) put the HTML parser into its escaped-script state: '</script>' no
    longer closed the charts' data, the chart script became part of it, and no chart
    drew, with no error on the page. The data's '<', '>' and '&' are JSON escapes now."""
    from events import alloc, at, frames, inventory, job, series

    from gpuledger.pipeline.config import ProcessorConfig
    from gpuledger.pipeline.processor import Processor
    from gpuledger.pipeline.warehouse import Warehouse

    wh = tmp_path / "wh"
    recs = [inventory("n1", at(0), gpus=2),
            job("submitted", "j", at(0), team="<!--<script>", queue="q</script>&amp;"),
            job("started", "j", at(0), allocation=alloc("n1", 0)), job("finished", "j", at(30)),
            job("submitted", "k", at(1), team="a&b>c", gpus=2),
            job("started", "k", at(5), allocation=alloc("n1", 0, 1)),
            job("finished", "k", at(20))]
    recs += series("n1", 0, at(0), 30, sm=0.01)
    proc = Processor(ProcessorConfig(), Warehouse(wh))
    proc.process(frames(recs), validated=True)
    proc.flush()
    out = tmp_path / "r.html"
    assert main(["report", "--warehouse", str(wh), "--html", str(out), "--quiet"]) == 0
    capsys.readouterr()
    text = out.read_text(encoding="utf-8")
    data = re.search(r'<script type="application/json"[^>]*>(.*?)</script>', text, re.S)
    assert data is not None and "<" not in data.group(1) and "&" not in data.group(1)
    assert "<!--<script>" in json.loads(data.group(1)).__repr__()
    page = open_in_chromium(out, tmp_path)
    assert page.script_errors() == "" and page.console == [], page.console
    assert page.attr("data-charts-expected") not in (None, "0")
    assert page.attr("data-charts-drawn") == page.attr("data-charts-expected")


def test_a_history_of_job_events_alone_says_its_span(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Found by reporting on job events without inventory (a scheduler feed alone): the
    header said "Data: no data in this window" above sections of queue waits that had
    rows. The span is the attempts' then."""
    from events import at, frames, job

    from gpuledger.pipeline.analyst_report.answers import answer_all
    from gpuledger.pipeline.config import ProcessorConfig
    from gpuledger.pipeline.processor import Processor
    from gpuledger.pipeline.warehouse import Warehouse

    wh = tmp_path / "wh"
    recs = [job("submitted", "j", at(0)), job("started", "j", at(5)),
            job("finished", "j", at(90))]
    proc = Processor(ProcessorConfig(), Warehouse(wh))
    proc.process(frames(recs), validated=True)
    proc.flush()
    report = answer_all(wh)
    assert (report.window.start, report.window.end) == (at(0), at(90))
    assert main(["report", "--warehouse", str(wh), "--width", "200"]) == 0
    out = capsys.readouterr().out
    assert "no data in this window" not in out, out
    assert "Data: 2026-01-05 10:00 – 2026-01-05 11:30 UTC (1.5 h)" in out, out


def test_html_to_stdout(root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                        capsys: pytest.CaptureFixture[str]) -> None:
    """``--html -`` wrote a file named '-'; it writes the page alone on stdout (as
    ``query -`` reads the SQL from stdin)."""
    monkeypatch.chdir(tmp_path)
    assert main(["report", "--warehouse", str(root), "--html", "-"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("<!DOCTYPE html>") and out.rstrip().endswith("</html>")
    assert not (tmp_path / "-").exists()


def test_the_pages_charts_do_not_carry_the_last_digits_of_parallel_sums() -> None:
    """DuckDB's parallel sums differ from run to run in their last digits, and the page
    differed with them (three runs of the demo's report, three pages). The charts' numbers
    keep 12 significant digits: the two sums below give one page."""
    from gpuledger.pipeline.analyst_report.html import _steady

    one = {"charts": [{"series": [15.454166665999997, 2.0, None, "x", float("inf")]}]}
    two = {"charts": [{"series": [15.454166665999999, 2.0, None, "x", float("inf")]}]}
    assert json.dumps(_steady(one)) == json.dumps(_steady(two))
    assert _steady(one)["charts"][0]["series"] == [15.454166666, 2.0, None, "x", float("inf")]


def _top_jobs_report(team: str, rows: int = 3) -> Report:
    """A report of the top wasting jobs alone, made up (no warehouse): ``rows`` jobs of
    the team ``team`` with figures of thousands."""
    from gpuledger.pipeline.analyst_report.answers import Answer, Window

    section = next(s for s in SECTIONS if s.key == "top_jobs")
    columns = ["job_id", "attempt", "job_label", "team", "job_type", "card_type",
               "held_card_type", "gpus", "allocated", "waste", "used_pct", "status"]
    data = [(f"10000{24 + k}", 0, f"10000{24 + k}", team, "training", None,
             "H100-SXM5-80GB", 8, 1282.34 + k, 1046.35 + k, 18.25, "finished")
            for k in range(rows)]
    start = datetime(2026, 1, 5, tzinfo=UTC)
    return Report(Window(start, start + timedelta(hours=6)),
                  [Answer(section, columns, data, columns, data)])


@pytest.mark.parametrize("width", [40, 60, 80])
def test_narrow_tables_keep_ids_and_figures_whole_and_name_what_they_leave_out(
        width: int) -> None:
    """At 40 and 60 columns rich cropped job ids ('1000024' as '100002') and split
    figures over lines ('1,282.' over '3'); a 500-character team at 80 columns left the
    figures one or two characters wide and dropped columns without naming them. Now the
    name gives way (shortened with '…'), ids and figures are whole on one line, and a
    column with no room is named under the table."""
    from io import StringIO

    from rich.console import Console

    from gpuledger.pipeline.analyst_report.numbers import cell
    from gpuledger.pipeline.analyst_report.terminal import print_report

    team = "team-with-a-very-long-name-" * 18 + "END"
    report = _top_jobs_report(team)
    out = StringIO()
    print_report(report, Console(file=out, width=width), top=TOP)
    text = out.getvalue()
    assert max(len(line) for line in text.splitlines()) <= width
    assert team not in text.replace("\n", "") and "team-wi" in text  # the name gave way
    table, _, rest = text.partition("Also in the HTML report: ")
    hidden = [t.strip() for t in rest.split(".\n")[0].replace("\n", " ").split(",")]
    words = table.split()
    a = report.answers[0]
    for c in a.section.columns:
        if not c.terminal:
            continue
        if c.title in hidden:
            continue
        for header_word in c.title.split():   # headers whole, never broken mid-word
            assert header_word in words, (c.title, header_word)
        for r in a.rows:
            value = cell(r[a.columns.index(c.name)], c)
            if c.numeric or c.key:
                assert value in words, (c.name, value)  # whole, on one line
    assert "1000024" in words
    if width == 80:  # a long name takes no figure's room
        assert not [c for c in a.section.columns if c.terminal and c.title in hidden]
    if width == 40:  # no room for the figures of three columns: named
        assert {"Allocated (GPU-h)", "Waste (GPU-h)", "Used of allocated (%)"} <= set(hidden)


def _waste_team_report(teams: list[str]) -> Report:
    """A report of the waste by team alone, made up (no warehouse)."""
    from gpuledger.pipeline.analyst_report.answers import Answer, Window

    section = next(s for s in SECTIONS if s.key == "waste_team")
    columns = ["team", "allocated", "used", "idle", "inefficient", "waste", "no_telemetry",
               "used_pct", "idle_share_pct"]
    data = [(team, 40.0 - k, 20.0, 5.0 + k, 10.0 - k, 15.0, 0.0, 50.0, 20.0)
            for k, team in enumerate(teams)]
    start = datetime(2026, 1, 5, tzinfo=UTC)
    return Report(Window(start, start + timedelta(hours=6)),
                  [Answer(section, columns, data, columns, data)])


def test_a_long_name_leaves_the_charts_and_tables_their_room(tmp_path: Path) -> None:
    """A 500-character team: the bar chart measured its label margin from the whole name
    and drew every bar 0 wide (its ticks piled up at the right), and its table grew to
    6,000 px. Now the chart's labels are shortened (the full name in their <title>) and
    the table's names wrap."""
    long = "team-with-a-very-long-name-" * 18 + "END"
    report = _waste_team_report(["llm-core", long, "vision"])
    page = tmp_path / "long.html"
    text = report_html.render_html(report, "wh", datetime(2026, 1, 6), TOP)
    page.write_text(text, encoding="utf-8")
    # in the table, the name is shortened (its cell wrapped to 30 lines), whole on hover
    cells = re.findall(r'<td class="t" title="([^"]*)"><bdi>([^<]*)</bdi></td>', text)
    assert cells and all(full == long for full, _ in cells)
    for _, shown in cells:
        assert len(shown) == report_html.NAME_LONGEST and shown.endswith("…")
        assert long.startswith(shown[:-1])
    assert re.findall(r'<td class="t"><bdi>(llm-core|vision)</bdi></td>', text)
    layout = open_in_chromium(page, tmp_path).layout
    assert layout["scrollWidth"] <= WIDTH
    (svg,) = layout["svgs"]
    assert svg["clipped"] == []
    assert svg["bars"] == 6 and min(svg["barWidths"]) > 20
    labels = [t["text"] for t in svg["texts"] if t["cls"] == "label"]
    assert labels[0] == "llm-core" and labels[2] == "vision"
    shown = labels[1][:labels[1].index("…") + 1]    # (textContent: the label, its title)
    assert len(shown) <= 32 and long.startswith(shown[:-1]) and labels[1] == shown + long
    assert long in svg["titles"]
    ticks = [t["text"] for t in svg["texts"] if t["cls"] == "tick"]
    assert len(ticks) >= 3


NARROW = """<script>(function () {
  var out = {innerWidth: window.innerWidth, scrollWidth: document.documentElement.scrollWidth,
             tables: [], svgs: []};
  document.querySelectorAll("table").forEach(function (t) {
    var box = t.parentNode;
    out.tables.push({scrolls: getComputedStyle(box).overflowX === "auto",
                     right: box.getBoundingClientRect().right});
  });
  document.querySelectorAll("svg.chart-svg").forEach(function (svg) {
    var r = svg.getBoundingClientRect(), vb = svg.viewBox.baseVal;
    out.svgs.push({scale: r.width / vb.width, height: r.height,
                   drawnHeight: r.width * vb.height / vb.width});
  });
  var pre = document.createElement("pre");
  pre.id = "layout";
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
})();</script>"""


def test_a_narrow_window_scrolls_the_tables_and_keeps_the_charts_readable(
        html_file: Path, tmp_path: Path) -> None:
    """At 400 px the tables overflowed the page with nothing to scroll them, and the
    charts, drawn 900 wide and shrunk, had 4-px text and empty bands above and below.
    Each table now scrolls in its own box, and charts are drawn at the width they have
    (at least 420: shrunk no more than a little), as tall as they are drawn."""
    probe = tmp_path / "narrow.html"
    probe.write_text(html_file.read_text(encoding="utf-8").replace("</body>",
                                                                   NARROW + "</body>"),
                     encoding="utf-8")
    proc = _chromium_run(tmp_path, "--window-size=400,900", "--dump-dom", probe.as_uri())
    m = re.search(r'<pre id="layout">(.*?)</pre>', proc.stdout, re.S)
    assert m, proc.stderr[-2000:]
    layout = json.loads(m.group(1))
    assert layout["scrollWidth"] <= layout["innerWidth"] <= 500  # (headless: 500 at least)
    assert layout["tables"] and all(t["scrolls"] and t["right"] <= layout["innerWidth"]
                                    for t in layout["tables"])
    assert layout["svgs"]
    for svg in layout["svgs"]:
        assert svg["scale"] >= 0.8                       # 11-px ticks stay 9 px or more
        assert abs(svg["height"] - svg["drawnHeight"]) < 2   # no empty bands


def test_the_data_span_rounds_half_up_as_every_number() -> None:
    """15 minutes of data read 'Data: … (0.2 h)': the span was rounded by binary
    formatting (half to even), the report's numbers by :func:`number` (half up)."""
    from gpuledger.pipeline.analyst_report.answers import Window

    start = datetime(2026, 1, 5, tzinfo=UTC)
    assert Window(start, start + timedelta(minutes=15)).text().endswith("(0.3 h)")
    assert Window(start, start + timedelta(minutes=45)).text().endswith("(0.8 h)")
    assert Window(start, start + timedelta(days=4, hours=3)).text().endswith("(4.1 days)")
    assert Window(start, start + timedelta(hours=6)).text().endswith("(6 h)")


def test_the_overflow_line_of_a_full_table_counts_the_rows_left_out() -> None:
    """A table that read its 100 rows said '… and more rows' with no count (the others:
    '… and 15 more rows'); it says how many at least now."""
    from io import StringIO

    from rich.console import Console

    from gpuledger.pipeline.analyst_report.terminal import print_report

    out = StringIO()
    print_report(_top_jobs_report("t", rows=100), Console(file=out, width=80), top=TOP)
    assert "… and at least 90 more rows: the HTML report folds up to 100" in out.getvalue()


def test_right_to_left_overrides_in_names_are_isolated_or_shown() -> None:
    """A job id and a team holding U+202E (right-to-left override) read reversed: in the
    terminal the id '‮1000015' showed as '5100001', in HTML the override ran on over the
    cells after it. The terminal shows the controls as escapes; HTML isolates each name
    and id in <bdi>."""
    from io import StringIO

    from rich.console import Console

    from gpuledger.pipeline.analyst_report.terminal import print_report

    report = _top_jobs_report("e\u202eLT\u2066x\u2069")
    a = report.answers[0]
    rows = [("\u202e" + r[0], *r[1:]) for r in a.rows]
    report = replace(report, answers=[replace(a, rows=rows)])
    out = StringIO()
    print_report(report, Console(file=out, width=120), top=TOP)
    text = out.getvalue()
    assert not {"\u202e", "\u2066", "\u2069"} & set(text)
    assert "\\u202e1000024" in text.split() and "e\\u202eLT\\u2066x\\u2069" in text.split()
    page = report_html.render_html(report, "wh", datetime(2026, 1, 6), TOP)
    assert "<td><bdi>\u202e1000024</bdi></td>" in page
    assert '<td class="t"><bdi>e\u202eLT\u2066x\u2069</bdi></td>' in page
