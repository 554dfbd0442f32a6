"""The report as one self-contained HTML file: tables in HTML, charts drawn in the
browser as inline SVG by ``charts.js`` (inlined; no library, no network)."""

from __future__ import annotations

import html
import json
from datetime import UTC, date, datetime
from importlib import resources
from typing import Any

from gpuledger.pipeline.analyst_report.answers import Answer
from gpuledger.pipeline.analyst_report.terminal import cell

CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:1000px;color:#222}
h1{font-size:1.6em} h2{font-size:1.2em;margin-top:2em;border-bottom:1px solid #ddd}
p.q{color:#555;margin:.2em 0 .8em} table{border-collapse:collapse;margin:.5em 0 1em}
th,td{padding:3px 8px;border-bottom:1px solid #eee;text-align:left}
td.n{text-align:right;font-variant-numeric:tabular-nums} th{background:#f5f5f5}
.chart-svg .grid{stroke:#e6e6e6} .chart-svg .tick{font-size:11px;fill:#555}
.chart-svg .unit{font-size:11px;fill:#333} .legend span{margin-right:1em;font-size:12px}
.legend i{display:inline-block;width:10px;height:10px;margin-right:4px}
#script-errors{color:#b00020;white-space:pre-wrap}
"""

# Catches errors of the chart script (and shows them) so that a broken page says so.
ERROR_HOOK = """window.addEventListener("error", function (e) {
  var box = document.getElementById("script-errors");
  box.textContent += "script error: " + e.message + "\\n";
});"""


def _chart_payload(a: Answer, chart_id: str) -> dict[str, Any] | None:
    chart = a.section.chart
    if chart is None or not a.rows:
        return None
    col = {name: i for i, name in enumerate(a.columns)}
    base: dict[str, Any] = {"id": chart_id, "kind": chart.kind, "title": a.section.title,
                            "unit": chart.unit}
    if chart.kind == "line":
        assert chart.group is not None
        groups: dict[str, list[list[float]]] = {}
        for r in a.rows:
            t, v = r[col[chart.x]], r[col[chart.series[0]]]
            if t is None or v is None:
                continue
            stamp = t if isinstance(t, datetime) else datetime.combine(t, datetime.min.time())
            if stamp.tzinfo is None:
                stamp = stamp.replace(tzinfo=UTC)
            groups.setdefault(str(r[col[chart.group]]), []).append(
                [stamp.timestamp() * 1000.0, float(v)])
        return {**base, "series": [{"name": k, "points": p} for k, p in groups.items()]}
    return {**base, "stacked": chart.stacked,
            "categories": [str(r[col[chart.x]]) for r in a.rows],
            "series": [{"name": s, "values": [float(r[col[s]] or 0.0) for r in a.rows]}
                       for s in chart.series]}


def _table(a: Answer) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in a.columns)
    body = []
    for r in a.rows:
        tds = []
        for v in r:
            numeric = isinstance(v, int | float) and not isinstance(v, bool)
            tds.append(f'<td{" class=n" if numeric else ""}>{html.escape(cell(v))}</td>')
        body.append(f"<tr>{''.join(tds)}</tr>")
    if not a.rows:
        body.append(f'<tr><td colspan="{len(a.columns)}">(none)</td></tr>')
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _script() -> str:
    return (resources.files("gpuledger.pipeline.analyst_report") / "charts.js").read_text(
        encoding="utf-8")


def render_html(answers: list[Answer], warehouse: str, generated: datetime | date,
                window: str) -> str:
    """The whole report as one HTML document."""
    charts: list[dict[str, Any]] = []
    parts: list[str] = []
    for i, a in enumerate(answers):
        parts.append(f'<section id="{html.escape(a.section.key)}">'
                     f"<h2>{html.escape(a.section.title)}</h2>"
                     f'<p class="q">{html.escape(a.section.question)}</p>')
        payload = _chart_payload(a, f"chart-{i}")
        if payload is not None:
            charts.append(payload)
            parts.append(f'<div class="chart" id="chart-{i}"></div>')
        parts.append(_table(a) + "</section>")
    data = json.dumps({"charts": charts}, separators=(",", ":")).replace("</", "<\\/")
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        "<title>gpuledger report</title>"
        f"<style>{CSS}</style><script>{ERROR_HOOK}</script></head>"
        f'<body data-charts-expected="{len(charts)}">'
        "<h1>gpuledger report: where the GPUs go</h1>"
        f'<p class="q">Warehouse {html.escape(warehouse)}; window {html.escape(window)}; '
        f"generated {html.escape(generated.isoformat())}.</p>"
        '<noscript><p>Charts need JavaScript; the tables below hold every number.</p>'
        "</noscript><div id=\"script-errors\"></div>"
        + "".join(parts)
        + f'<script type="application/json" id="report-data">{data}</script>'
        f"<script>{_script()}</script></body></html>\n"
    )
