"""Grafana's interpolation of a panel query, as far as the gpuledger boards use it.

For running a board's queries outside Grafana (tests, benchmarks): the DuckDB plugin's
SQL macros (``$__timeFilter(col)``, ``$__timeFrom()``, ``$__timeTo()``) and the global
``$__interval_ms`` / ``$__rate_interval``, and variables: ``${v:sqlstring}`` → ``'a','b'``;
``$v`` / ``${v}`` → the value, or a regex ``(a|b)`` of several (Prometheus). A single
value inside SQL quotes (``'${job}'``) is left unescaped, as SQL data sources do.
"""

from __future__ import annotations

import re
from datetime import datetime

Values = dict[str, list[str]]


def _regex_escape(v: str) -> str:
    return re.sub(r"([\\^$.|?*+()\[\]{}])", r"\\\1", v)


def interpolate(text: str, values: Values, t0: datetime, t1: datetime,
                interval_ms: int = 60_000) -> str:
    """``text`` with macros and variables expanded for the range ``[t0, t1]``."""
    start, end = t0.strftime("%Y-%m-%dT%H:%M:%SZ"), t1.strftime("%Y-%m-%dT%H:%M:%SZ")
    text = re.sub(r"\$__timeFilter\(([^)]+)\)",
                  lambda m: f"{m.group(1)} >= '{start}' AND {m.group(1)} <= '{end}'", text)
    text = text.replace("$__timeFrom()", f"'{start}'").replace("$__timeTo()", f"'{end}'")
    text = text.replace("$__interval_ms", str(interval_ms))
    text = text.replace("$__rate_interval", "1m")
    for name, vals in values.items():
        if len(vals) == 1:
            text = text.replace("'${" + name + "}'", "'" + vals[0].replace("'", "''") + "'")

    def var(name: str, fmt: str | None) -> str:
        vals = values[name]
        if fmt == "sqlstring":
            return ",".join("'" + v.replace("'", "''") + "'" for v in vals)
        if len(vals) == 1:
            return _regex_escape(vals[0])
        return "(" + "|".join(_regex_escape(v) for v in vals) + ")"

    text = re.sub(r"\$\{(\w+)(?::(\w+))?\}", lambda m: var(m.group(1), m.group(2)), text)
    return re.sub(r"\$(?!__)(\w+)", lambda m: var(m.group(1), None), text)
