"""The boards' building blocks, on Grafana's typed builders (``grafana-foundation-sdk``).

Panels, queries, variables and links are the SDK's builders, generated from Grafana's
own schema; what it has no builder for is here: the DuckDB data source's query (the
``motherduck-duckdb-datasource`` plugin is not in the SDK: :class:`DuckQuery` is a small
``Dataquery`` of our own) and the grid layout (the SDK places panels left to right but
lets a wide panel run past the 24th column). :class:`Board` adds panels top to bottom,
numbers them and places them; :meth:`Board.json` is the dashboard JSON model.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Self

from grafana_foundation_sdk.builders import bargauge, stat, statetimeline, table, timeseries
from grafana_foundation_sdk.builders import common as common_b
from grafana_foundation_sdk.builders import dashboard as dash
from grafana_foundation_sdk.builders import prometheus as prom_b
from grafana_foundation_sdk.cog import builder as cogbuilder
from grafana_foundation_sdk.cog import variants as cogvariants
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common as cm
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models import prometheus as prom_m

PROMETHEUS_UID = "gpuledger-prometheus"
DUCKDB_UID = "gpuledger-duckdb"
PROM_TYPE, DUCK_TYPE = "prometheus", "motherduck-duckdb-datasource"
DATASOURCES: dict[str, dict[str, str]] = {
    PROMETHEUS_UID: {"type": PROM_TYPE, "uid": PROMETHEUS_UID},
    DUCKDB_UID: {"type": DUCK_TYPE, "uid": DUCKDB_UID},
}
PROM_REF = dm.DataSourceRef(type_val=PROM_TYPE, uid=PROMETHEUS_UID)
DUCK_REF = dm.DataSourceRef(type_val=DUCK_TYPE, uid=DUCKDB_UID)
TAG = "gpuledger"
GRID_WIDTH = 24

Json = dict[str, Any]
Query = cogbuilder.Builder[cogvariants.Dataquery]
PanelBuilder = (timeseries.Panel | stat.Panel | table.Panel | bargauge.Panel
                | statetimeline.Panel)


class DuckQueryModel(cogvariants.Dataquery):
    """A query of the DuckDB data source plugin: raw SQL, as a table or time series."""

    def __init__(self, raw_sql: str, time_series: bool) -> None:
        self.raw_sql = raw_sql
        self.time_series = time_series
        self.ref_id = ""

    def to_json(self) -> dict[str, object]:
        return {"datasource": DATASOURCES[DUCKDB_UID], "refId": self.ref_id,
                "rawSql": self.raw_sql, "rawQuery": True, "editorMode": "code",
                "format": "time_series" if self.time_series else "table"}


class DuckQuery(cogbuilder.Builder[DuckQueryModel]):
    """Builder of :class:`DuckQueryModel` (the SDK has none for this plugin)."""

    def __init__(self, raw_sql: str, time_series: bool = False) -> None:
        self._internal = DuckQueryModel(" ".join(raw_sql.split()), time_series)

    def ref_id(self, ref_id: str) -> Self:
        self._internal.ref_id = ref_id
        return self

    def build(self) -> DuckQueryModel:
        return self._internal


def prom(expr: str, legend: str = "", instant: bool = False,
         table_format: bool = False) -> prom_b.Dataquery:
    """A Prometheus query."""
    q = prom_b.Dataquery().expr(expr).legend_format(legend or "__auto") \
        .editor_mode(prom_m.QueryEditorMode.CODE).datasource(PROM_REF)
    q = q.instant() if instant else q.range()
    if table_format:
        q = q.format(prom_m.PromQueryFormat.TABLE)
    return q


def sql(raw: str, time_series: bool = False) -> DuckQuery:
    """A DuckDB query (raw SQL)."""
    return DuckQuery(raw, time_series)


def link(title: str, uid: str, params: str) -> dash.DashboardLink:
    """A data link to another board; ``params`` is the query string after ``?``."""
    return dash.DashboardLink(title).url(f"/d/{uid}?{params}&${{__url_time_range}}")


def links_on(name: str, links: list[dash.DashboardLink]) -> tuple[str, list[dm.DynamicConfigValue]]:
    """A field override (column ``name``) that puts data links on it."""
    return name, [dm.DynamicConfigValue(id_val="links", value=[lk.build() for lk in links])]


def unit_of(unit: str) -> dm.DynamicConfigValue:
    """A field override property: this column's unit."""
    return dm.DynamicConfigValue(id_val="unit", value=unit)


def transform(kind: str, options: Json | None = None) -> dm.DataTransformerConfig:
    return dm.DataTransformerConfig(id_val=kind, options=options or {})


def wide(panel: timeseries.Panel) -> timeseries.Panel:
    """Legend as a table on the right with the last value; tooltip of all series."""
    return panel.legend(common_b.VizLegendOptions().show_legend(True)
                        .display_mode(cm.LegendDisplayMode.TABLE)
                        .placement(cm.LegendPlacement.RIGHT).calcs(["lastNotNull"])) \
        .tooltip(common_b.VizTooltipOptions().mode(cm.TooltipDisplayMode.MULTI)
                 .sort(cm.SortOrder.DESCENDING))


def stacked(panel: timeseries.Panel) -> timeseries.Panel:
    return panel.stacking(common_b.StackingConfig().mode(cm.StackingMode.NORMAL).group("A")) \
        .fill_opacity(60).line_width(1)


def gradient_bars(panel: bargauge.Panel) -> bargauge.Panel:
    return panel.display_mode(cm.BarGaugeDisplayMode.GRADIENT) \
        .orientation(cm.VizOrientation.HORIZONTAL)


@dataclass
class Board:
    """A dashboard written top to bottom: rows, and panels placed left to right."""

    uid: str
    title: str
    description: str
    variables: list[dash.QueryVariable] = field(default_factory=list)
    _items: list[tuple[str, Any]] = field(default_factory=list)
    _next_id: int = 1
    _x: int = 0
    _y: int = 0
    _row_h: int = 0

    def row(self, title: str) -> None:
        self._newline()
        row = dash.Row(title).id(self._take_id()).grid_pos(
            dm.GridPos(h=1, w=GRID_WIDTH, x=0, y=self._y))
        self._items.append(("row", row))
        self._y += 1

    def _newline(self) -> None:
        if self._x:
            self._y += self._row_h
            self._x, self._row_h = 0, 0

    def _take_id(self) -> int:
        self._next_id += 1
        return self._next_id - 1

    def add(self, panel: PanelBuilder, title: str, targets: list[Query], unit: str,
            w: int = 12, h: int = 8, description: str = "") -> None:
        """Place ``panel`` with ``targets`` (refIds A, B, …) and a ``unit`` (required)."""
        if self._x + w > GRID_WIDTH:
            self._newline()
        first = targets[0].build()
        ref = DUCK_REF if isinstance(first, DuckQueryModel) else PROM_REF
        for i, t in enumerate(targets):
            t.ref_id(chr(ord("A") + i))  # type: ignore[attr-defined]
        panel.id(self._take_id()).title(title).description(description).datasource(ref) \
            .targets(targets).unit(unit) \
            .grid_pos(dm.GridPos(h=h, w=w, x=self._x, y=self._y))
        self._items.append(("panel", panel))
        self._x += w
        self._row_h = max(self._row_h, h)

    def json(self, links: list[dash.DashboardLink]) -> Json:
        b = dash.Dashboard(self.title).uid(self.uid).description(self.description) \
            .tags([TAG]).editable().time("now-24h", "now").refresh("1m").timezone("utc") \
            .tooltip(dm.DashboardCursorSync.CROSSHAIR).version(1).links(list(links)) \
            .variables(list(self.variables))
        board = b.build()
        board.panels = [item.build() for _, item in self._items]
        out: Json = json.loads(json.dumps(board, cls=JSONEncoder))
        out["schemaVersion"] = 39
        return out


def prom_variable(name: str, label: str, query: str, multi: bool = True) -> dash.QueryVariable:
    """A Prometheus query variable (``label_values(...)``), refreshed on time change."""
    return dash.QueryVariable(name).label(label).datasource(PROM_REF).query(
        {"qryType": 1, "query": query, "refId": "PrometheusVariableQueryEditor-VariableQuery"}
    ).refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED).multi(multi).include_all(multi) \
        .sort(dm.VariableSort.ALPHABETICAL_ASC)


def sql_variable(name: str, label: str, query: str, multi: bool = True) -> dash.QueryVariable:
    """A DuckDB query variable (first column = value), refreshed on time change."""
    return dash.QueryVariable(name).label(label).datasource(DUCK_REF) \
        .query(" ".join(query.split())).refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED) \
        .multi(multi).include_all(multi).sort(dm.VariableSort.DISABLED)


def variable_query(variable: Json) -> str:
    """The query text of a variable in the board JSON (Prometheus or DuckDB)."""
    q = variable["query"]
    return str(q["query"] if isinstance(q, dict) else q)
