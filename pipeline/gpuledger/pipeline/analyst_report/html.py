"""The report as one self-contained HTML file: tables in HTML, charts drawn in the
browser as inline SVG by ``charts.js`` (inlined; no library, no network)."""

from __future__ import annotations

import html
import json
import math
from datetime import UTC, date, datetime, timedelta
from importlib import resources
from typing import Any

from gpuledger.pipeline.analyst_report.answers import MAX_ROWS, Answer, Report, Window, no_rows
from gpuledger.pipeline.analyst_report.numbers import cell, shorten, when
from gpuledger.pipeline.analyst_report.sections import PARTS, Column

CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:1000px;padding:0 16px;
color:#222}
h1{font-size:1.6em;margin-bottom:.2em} h2{font-size:1.35em;margin-top:2.2em;
border-bottom:2px solid #ccc} h3{font-size:1.1em;margin:1.6em 0 .2em}
p.meta{color:#444;margin:.2em 0} p.q{color:#555;margin:.2em 0 .8em} p.note{color:#666;
font-size:12.5px;margin:.3em 0} nav a{margin-right:1em;white-space:nowrap}
table{border-collapse:collapse;margin:.5em 0 .6em;font-size:13px}
th,td{padding:3px 8px;border-bottom:1px solid #eee;text-align:left;vertical-align:bottom}
th{background:#f5f5f5;font-weight:600} th.n{text-align:right} th .u{white-space:nowrap}
td{white-space:nowrap} td.n{text-align:right;font-variant-numeric:tabular-nums}
td.t{white-space:normal;overflow-wrap:anywhere;min-width:6em;max-width:20em}
td.blank{color:#777;font-style:italic} details{margin:0 0 1em} summary{cursor:pointer;
color:#335}
.scroll{overflow-x:auto} .chart{overflow-x:auto}
.chart-svg{display:block;max-width:100%;height:auto} .chart-svg .grid{stroke:#e6e6e6}
.chart-svg .axis{stroke:#999} .chart-svg .tick{font-size:11px;fill:#555}
.chart-svg .label{font-size:12px;fill:#333} .chart-svg .unit{font-size:11px;fill:#333}
.legend{margin:.2em 0 .4em} .legend span{margin-right:1em;font-size:12px;
display:inline-block;overflow-wrap:anywhere}
.chart-svg .label,.legend span{unicode-bidi:isolate}
.legend i{display:inline-block;width:10px;height:10px;margin-right:4px}
#script-errors{color:#b00020;white-space:pre-wrap}
"""

# Catches errors of the chart script (and shows them) so that a broken page says so.
ERROR_HOOK = """window.addEventListener("error", function (e) {
  var box = document.getElementById("script-errors");
  box.textContent += "script error: " + e.message + "\\n";
});"""

# Colours of the GPU states, the same in every chart; other series use the palette.
STATE_COLOURS = {"busy": "#59a14f", "inefficient": "#f28e2b", "idle": "#e15759",
                 "no_telemetry": "#bab0ac", "free": "#a0cbe8", "unaccounted": "#b07aa1",
                 "unavailable": "#79706e"}


def _ms(t: datetime | date) -> float:
    stamp = t if isinstance(t, datetime) else datetime.combine(t, datetime.min.time())
    stamp = stamp.astimezone(UTC) if stamp.tzinfo else stamp.replace(tzinfo=UTC)
    return stamp.timestamp() * 1000.0


def chart_payload(a: Answer, chart_id: str, window: Window, top: int) -> dict[str, Any] | None:
    """What ``charts.js`` needs to draw a section's chart (None: nothing to draw)."""
    chart = a.section.chart
    if chart is None or not a.chart_rows:
        return None
    col = {name: i for i, name in enumerate(a.chart_columns)}
    decimals = next((c.decimals for c in a.section.columns
                     if c.name in chart.series and c.decimals is not None), 1)
    base: dict[str, Any] = {"id": chart_id, "kind": chart.kind, "title": a.section.title,
                            "unit": chart.unit, "decimals": decimals}
    if chart.kind == "line":
        assert chart.group is not None
        if window.start is None or window.end is None:
            return None
        x0, x1 = _ms(window.start), _ms(window.end)
        bucket = timedelta(minutes=window.bucket_minutes).total_seconds() * 1000
        groups: dict[str, list[list[float]]] = {}
        for r in a.chart_rows:
            t, v = r[col[chart.category]], r[col[chart.series[0]]]
            if t is None or v is None or _ms(t) >= x1:
                continue
            # at the middle of the part of the bucket inside the window
            middle = (max(_ms(t), x0) + min(_ms(t) + bucket, x1)) / 2
            groups.setdefault(str(r[col[chart.group]]), []).append([middle, float(v)])
        if not groups:
            return None
        return {**base, "x0": x0, "x1": x1,
                "bucket_minutes": window.bucket_minutes,
                "series": [{"name": k, "points": p} for k, p in groups.items()]}
    rows = a.chart_rows if chart.sql is not None else a.chart_rows[:top]
    labels = chart.labels or chart.series
    series = []
    for name, label in zip(chart.series, labels, strict=True):
        values = [float(r[col[name]] or 0.0) for r in rows]
        if len(chart.series) > 1 and not any(values):
            continue  # a state nobody was in: no empty legend entry
        entry: dict[str, Any] = {"name": label, "values": values}
        if name in STATE_COLOURS:  # a GPU state has one colour in every chart
            entry["colour"] = STATE_COLOURS[name]
        series.append(entry)
    if not any(any(s["values"]) for s in series):
        return None  # all zero (waste of scheduler-only history): no empty chart
    return {**base, "stacked": chart.stacked,
            "categories": [str(r[col[chart.category]]) for r in rows], "series": series}


NAME_LONGEST = 60
"""A name in a table longer than this is shortened with an ellipsis (the whole name in
the cell's title): at most about three lines of its 20-em column."""


def _rows_html(a: Answer, rows: list[tuple[Any, ...]]) -> str:
    columns = a.section.columns
    index = [a.columns.index(c.name) for c in columns]
    out = []
    for r in rows:
        tds = []
        named = dict(zip(a.columns, r, strict=True))
        for i, c in zip(index, columns, strict=True):
            # names (not ids, not figures) wrap: a 500-character team made tables 6,000 px
            name = not c.numeric and not c.key and r[i] is not None
            classes = [k for k, on in (("n", c.numeric), ("t", name), ("blank", r[i] is None))
                       if on]
            attr = f' class="{" ".join(classes)}"' if classes else ""
            full = cell(r[i], c, named)
            shown = shorten(full, NAME_LONGEST) if name else full
            if shown != full:  # the whole name on hover (a 500-character team's cell
                attr += f' title="{html.escape(full)}"'  # was 30 lines tall)
            text = html.escape(shown)
            if not c.numeric and r[i] is not None:  # each name and id isolated: one with
                text = f"<bdi>{text}</bdi>"  # a right-to-left override read reversed
            tds.append(f"<td{attr}>{text}</td>")
        out.append(f"<tr>{''.join(tds)}</tr>")
    return "".join(out)


def _header_cell(c: Column) -> str:
    """The header; its unit never breaks across lines ("GPU-" / "h")."""
    if not c.unit:
        return html.escape(c.header)
    return f'{html.escape(c.header)} <span class="u">({html.escape(c.unit)})</span>'


def _table(a: Answer, top: int, empty: str) -> str:
    columns = a.section.columns
    head = "".join(f'<th{" class=n" if c.numeric else ""}>{_header_cell(c)}</th>'
                   for c in columns)
    thead = f"<thead><tr>{head}</tr></thead>"
    if not a.rows:
        return (f'<div class="scroll"><table>{thead}<tbody><tr><td colspan="{len(columns)}"'
                f' class="blank">{html.escape(empty)}</td></tr></tbody></table></div>')
    # each table scrolls sideways in its own box: at 400 px they overflowed the page
    text = (f'<div class="scroll"><table>{thead}<tbody>{_rows_html(a, a.rows[:top])}'
            "</tbody></table></div>")
    rest = a.rows[top:]
    if rest:
        more = f"{len(rest):,} more rows"
        if len(a.rows) >= MAX_ROWS:
            more += f" (the first {MAX_ROWS:,} in all; the views of sql/20_analyst.sql have " \
                    "every one)"
        text += (f"<details><summary>{html.escape(more)}</summary><div class=\"scroll\">"
                 f"<table>{thead}<tbody>{_rows_html(a, rest)}</tbody></table></div>"
                 "</details>")
    return text


def _script() -> str:
    return (resources.files("gpuledger.pipeline.analyst_report") / "charts.js").read_text(
        encoding="utf-8")


def _header(report: Report, warehouse: str, generated: datetime | date) -> str:
    w = report.window
    lines = [f"Data: {w.text()}."]
    asked = w.asked()
    if asked is not None:
        lines.append(asked)
    lines.append(f"Warehouse {warehouse}; generated {when(generated)} UTC. Times are UTC.")
    meta = "".join(f'<p class="meta">{html.escape(x)}</p>' for x in lines)
    nav = "".join(f'<a href="#part-{k}">{html.escape(v)}</a>' for k, v in PARTS.items())
    return f"<h1>gpuledger report: where the GPUs go</h1>{meta}<nav>{nav}</nav>"


CHART_DIGITS = 12
"""Significant digits of the charts' numbers: DuckDB's parallel sums differ from run to
run in the last digits (15.454166665999997 or …999), and the page differed with them
(three runs, three pages); a chart draws no closer than this."""


def _steady(value: Any) -> Any:
    """``value`` with every float to :data:`CHART_DIGITS` significant digits."""
    if isinstance(value, float):
        return float(f"{value:.{CHART_DIGITS}g}") if math.isfinite(value) else value
    if isinstance(value, dict):
        return {k: _steady(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_steady(v) for v in value]
    return value


def render_html(report: Report, warehouse: str, generated: datetime | date,
                top: int = 10) -> str:
    """The whole report as one HTML document."""
    charts: list[dict[str, Any]] = []
    parts: list[str] = []
    part = None
    for i, a in enumerate(report.answers):
        s = a.section
        if s.part != part:
            part = s.part
            parts.append(f'<h2 id="part-{part}">{html.escape(PARTS[part])}</h2>')
        parts.append(f'<section id="{html.escape(s.key)}"><h3>{html.escape(s.title)}</h3>'
                     f'<p class="q">{html.escape(s.question)}</p>')
        payload = chart_payload(a, f"chart-{i}", report.window, top)
        if payload is not None:
            charts.append(payload)
            parts.append(f'<div class="chart" id="chart-{i}"></div>')
        parts.append(_table(a, top, no_rows(s, report.window)))
        parts.extend(f'<p class="note">{html.escape(n)}</p>' for n in s.notes)
        parts.append("</section>")
    # '<', '>' and '&' as JSON escapes: with '</' alone escaped, a name holding
    # '<!--<script' put the HTML parser in a state where '</script>' did not end the
    # element, and no chart drew
    data = json.dumps({"charts": _steady(charts)}, separators=(",", ":")).replace(
        "<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
        "<title>gpuledger report</title>"
        f"<style>{CSS}</style><script>{ERROR_HOOK}</script></head>"
        f'<body data-charts-expected="{len(charts)}">'
        + _header(report, warehouse, generated)
        + '<noscript><p>Charts need JavaScript; the tables below hold every number.</p>'
        "</noscript><div id=\"script-errors\"></div>"
        + "".join(parts)
        + f'<script type="application/json" id="report-data">{data}</script>'
        f"<script>{_script()}</script></body></html>\n"
    )
