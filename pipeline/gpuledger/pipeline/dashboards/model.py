"""Small builders for Grafana's dashboard JSON model (schemaVersion 39+).

Panels get their ids and grid positions from :class:`Board` in the order they are
added, so a board is written top to bottom as a list of rows and panels.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

PROMETHEUS_UID = "gpuledger-prometheus"
DUCKDB_UID = "gpuledger-duckdb"
PROM: dict[str, str] = {"type": "prometheus", "uid": PROMETHEUS_UID}
DUCK: dict[str, str] = {"type": "motherduck-duckdb-datasource", "uid": DUCKDB_UID}
DATASOURCES: dict[str, dict[str, str]] = {PROMETHEUS_UID: PROM, DUCKDB_UID: DUCK}
TAG = "gpuledger"
GRID_WIDTH = 24

Json = dict[str, Any]


def prom(expr: str, legend: str = "", instant: bool = False, table: bool = False) -> Json:
    """A Prometheus target."""
    t: Json = {"datasource": PROM, "expr": expr, "legendFormat": legend or "__auto",
               "range": not instant, "instant": instant, "editorMode": "code"}
    if table:
        t["format"] = "table"
    return t


def sql(raw: str, time_series: bool = False) -> Json:
    """A DuckDB (motherduck-duckdb-datasource) target with raw SQL."""
    return {"datasource": DUCK, "rawSql": " ".join(raw.split()), "rawQuery": True,
            "editorMode": "code", "format": "time_series" if time_series else "table"}


def link(title: str, uid: str, params: str) -> Json:
    """A data link to another board; ``params`` is the query string after ``?``."""
    return {"title": title, "url": f"/d/{uid}?{params}&${{__url_time_range}}"}


def field_links(name: str, links: list[Json]) -> Json:
    """A field override that puts data links on one column."""
    return {"matcher": {"id": "byName", "options": name},
            "properties": [{"id": "links", "value": links}]}


@dataclass
class Board:
    uid: str
    title: str
    description: str
    panels: list[Json] = field(default_factory=list)
    variables: list[Json] = field(default_factory=list)
    _x: int = 0
    _y: int = 0
    _row_h: int = 0

    def row(self, title: str) -> None:
        self._newline()
        self.panels.append({"type": "row", "title": title, "collapsed": False, "panels": [],
                            "id": len(self.panels) + 1,
                            "gridPos": {"h": 1, "w": GRID_WIDTH, "x": 0, "y": self._y}})
        self._y += 1

    def _newline(self) -> None:
        if self._x:
            self._y += self._row_h
            self._x, self._row_h = 0, 0

    def add(self, kind: str, title: str, targets: list[Json], w: int = 12, h: int = 8,
            unit: str | None = None, description: str = "", stacked: bool = False,
            overrides: list[Json] | None = None, options: Json | None = None,
            transformations: list[Json] | None = None, decimals: int | None = None,
            minimum: float | None = None, maximum: float | None = None) -> Json:
        if self._x + w > GRID_WIDTH:
            self._newline()
        datasource = targets[0]["datasource"]
        for i, t in enumerate(targets):
            t["refId"] = chr(ord("A") + i)
        defaults: Json = {}
        if unit:
            defaults["unit"] = unit
        if decimals is not None:
            defaults["decimals"] = decimals
        if minimum is not None:
            defaults["min"] = minimum
        if maximum is not None:
            defaults["max"] = maximum
        if stacked:
            defaults["custom"] = {"stacking": {"mode": "normal", "group": "A"},
                                  "fillOpacity": 60, "lineWidth": 1}
        panel: Json = {
            "id": len(self.panels) + 1, "type": kind, "title": title,
            "description": description, "datasource": datasource, "targets": targets,
            "gridPos": {"h": h, "w": w, "x": self._x, "y": self._y},
            "fieldConfig": {"defaults": defaults, "overrides": overrides or []},
            "options": options or {},
        }
        if transformations:
            panel["transformations"] = transformations
        self.panels.append(panel)
        self._x += w
        self._row_h = max(self._row_h, h)
        return panel

    def json(self, links: list[Json]) -> Json:
        return {
            "uid": self.uid, "title": self.title, "description": self.description,
            "tags": [TAG], "editable": True, "schemaVersion": 39, "version": 1,
            "time": {"from": "now-24h", "to": "now"}, "refresh": "1m",
            "timezone": "utc", "graphTooltip": 1,
            "annotations": {"list": []},
            "links": links,
            "templating": {"list": self.variables},
            "panels": self.panels,
        }


def prom_variable(name: str, label: str, query: str, multi: bool = True) -> Json:
    """A Prometheus query variable (``label_values(...)``), refreshed on time change."""
    return {"name": name, "label": label, "type": "query", "datasource": PROM,
            "definition": query,
            "query": {"qryType": 1, "query": query,
                      "refId": "PrometheusVariableQueryEditor-VariableQuery"},
            "refresh": 2, "multi": multi, "includeAll": multi, "sort": 1,
            "current": {}, "options": [], "regex": "", "hide": 0}


def sql_variable(name: str, label: str, query: str, multi: bool = True) -> Json:
    """A DuckDB query variable (first column = value), refreshed on time change."""
    q = " ".join(query.split())
    return {"name": name, "label": label, "type": "query", "datasource": DUCK,
            "definition": q, "query": q, "refresh": 2, "multi": multi, "includeAll": multi,
            "sort": 0, "current": {}, "options": [], "regex": "", "hide": 0}
