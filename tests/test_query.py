"""`gpuledger query` is read-only and answers from the catalog's views."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import Facts
from events import alloc, at, inventory, job, series

from gpuledger.cli.main import main
from gpuledger.pipeline import query


def _digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def warehouse(process: Callable[..., Facts]) -> Path:
    recs = [inventory("n1", at(0), gpus=2), job("submitted", "j", at(0), team="nlp"),
            job("started", "j", at(0), allocation=alloc("n1", 0)), job("finished", "j", at(5))]
    recs += series("n1", 0, at(0), 5, sm=0.5)
    return process(recs).root


def test_select_answers_from_views(warehouse: Path) -> None:
    columns, rows = query.run(warehouse, "SELECT team, allocated_gpu_hours FROM job_attempts")
    assert columns == ["team", "allocated_gpu_hours"]
    assert rows == [("nlp", pytest.approx(5 / 60))]


@pytest.mark.parametrize("sql", [
    "CREATE TABLE x AS SELECT 1",
    "DROP VIEW gpu_minute",
    "COPY (SELECT * FROM gpu_minute) TO '{root}/facts/gpu_minute/evil.parquet'",
    "ATTACH '{root}/other.duckdb' AS o",
    "INSERT INTO gpu_minute SELECT * FROM gpu_minute",
    "SET threads = 1",
    "SELECT 1; DROP VIEW gpu_minute",
    "INSTALL httpfs",
])
def test_writes_are_refused_and_nothing_changes(warehouse: Path, sql: str) -> None:
    before = _digest(warehouse)
    with pytest.raises(query.QueryError, match=r"only read-only queries|cannot parse"):
        query.run(warehouse, sql.format(root=warehouse))
    assert _digest(warehouse) == before


def test_cli_query_formats_and_errors(warehouse: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["query", "--warehouse", str(warehouse), "--format", "csv",
                 "SELECT job_id, end_event FROM job_attempts"]) == 0
    assert capsys.readouterr().out == "job_id,end_event\nj,finished\n"
    assert main(["query", "--warehouse", str(warehouse), "--format", "json",
                 "SELECT count(*) AS n FROM gpu_minute"]) == 0
    assert capsys.readouterr().out == '{"n": 10}\n'
    # JSON has no NaN or infinity: null; DECIMAL stays a number; a name twice is refused
    assert main(["query", "--warehouse", str(warehouse), "--format", "json",
                 "SELECT 1/0 AS inf, 'nan'::DOUBLE AS nan, 2.5 AS d"]) == 0
    assert capsys.readouterr().out == '{"inf": null, "nan": null, "d": 2.5}\n'
    # an INTERVAL is an ISO 8601 duration, a BLOB base64, a LIST or STRUCT value by value
    # (before: "2:59:00", "b'A'", and a timestamp in a list as "2026-01-01 00:00:00")
    assert main(["query", "--warehouse", str(warehouse), "--format", "json",
                 "SELECT TIMESTAMP '2026-01-01 02:59' - TIMESTAMP '2026-01-01' AS wait, "
                 "INTERVAL 1 DAY + INTERVAL 90 SECOND AS long, 'A'::BLOB AS raw, "
                 "[TIMESTAMP '2026-01-01 00:00'] AS at, {'d': 1.5::DECIMAL(4, 2)} AS s"]) == 0
    assert json.loads(capsys.readouterr().out) == {
        "wait": "PT2H59M", "long": "P1DT1M30S", "raw": "QQ==",
        "at": ["2026-01-01T00:00:00"], "s": {"d": 1.5}}
    assert main(["query", "--warehouse", str(warehouse), "--format", "json",
                 "SELECT 1 AS a, 2 AS a"]) == 2
    assert "column name(s) a appear more than once" in capsys.readouterr().err
    # a newline in a value stays on its row in the table
    assert main(["query", "--warehouse", str(warehouse),
                 "SELECT 'bob' || chr(10) || 'x' AS u, 1 AS n"]) == 0
    assert capsys.readouterr().out.splitlines()[2] == "bob\\nx  1"
    # floats in the table: past 1e15 no digits the double does not hold (before:
    # 123,456,789,012,345,667,584.0), a tiny value not as 0.000, inf and nan as such
    assert main(["query", "--warehouse", str(warehouse),
                 "SELECT 1.2345678901234567e20::DOUBLE AS big, -1e17::DOUBLE AS neg, "
                 "1e-20::DOUBLE AS tiny, 0.0::DOUBLE AS zero, 1234.56::DOUBLE AS k, "
                 "(0.1 + 0.2)::DOUBLE AS s, 'inf'::DOUBLE AS i, 'nan'::DOUBLE AS n"]) == 0
    assert capsys.readouterr().out.splitlines()[2].split() == [
        "1.23456789012346e+20", "-1e+17", "1e-20", "0.000", "1,234.6", "0.300", "inf",
        "nan"]
    assert main(["query", "--warehouse", str(warehouse), "DELETE FROM gpu_minute"]) == 2
    assert "only read-only" in capsys.readouterr().err
    assert main(["query", "--warehouse", str(warehouse / "nope"), "SELECT 1"]) == 2
    assert f"{warehouse / 'nope'}: no such folder" in capsys.readouterr().err


@pytest.mark.parametrize("fmt", ["table", "csv", "json"])
def test_infinities_blobs_and_nested_values_read_as_duckdb_writes_them(
        warehouse: Path, fmt: str, capsys: pytest.CaptureFixture[str]) -> None:
    """An infinite timestamp is ``infinity`` (it showed as 9999-12-31T23:59:59.999999, a
    real-looking instant), a BLOB in a table or csv as DuckDB writes it (it showed Python's
    ``b'\\x00'``), and a timestamp or BLOB inside a LIST or STRUCT likewise (it showed
    ``datetime.datetime(9999, …)``)."""
    assert main(["query", "--warehouse", str(warehouse), "--format", fmt,
                 "SELECT 'infinity'::TIMESTAMP AS up, '-infinity'::TIMESTAMPTZ AS down, "
                 "'\\x00\\xFFa\\x5C'::BLOB AS raw, "
                 "[{'t': 'infinity'::TIMESTAMP, 'd': DATE '2026-01-02'}] AS nest"]) == 0
    out = capsys.readouterr().out
    if fmt == "json":
        assert json.loads(out) == {"up": "infinity", "down": "-infinity", "raw": "AP9hXA==",
                                   "nest": [{"t": "infinity", "d": "2026-01-02"}]}
        return
    row = out.splitlines()[2 if fmt == "table" else 1]
    assert "infinity" in row and "-infinity" in row and "9999" not in row
    assert "\\x00\\xFFa\\x5C" in row and "b'" not in row
    assert "{'t': 'infinity', 'd': '2026-01-02'}" in row and "datetime" not in row


def test_the_time_limit_covers_the_output(monkeypatch: pytest.MonkeyPatch) -> None:
    """A result that takes longer to print than the limit is stopped with one line, in
    every format (before, --timeout 3 printed 207,000 rows for 11 s)."""
    rows = [(i, f"n{i}") for i in range(50)]
    monkeypatch.setattr(query, "RENDER_CHUNK", 10)
    passed = time.monotonic() - 1
    for fmt in ("table", "csv", "json"):
        with pytest.raises(query.QueryError, match="took longer than 3 s"):
            query.render(["i", "s"], rows, fmt, passed, 3.0)
        assert query.render(["i", "s"], rows, fmt, time.monotonic() + 60, 60.0)


def test_a_table_of_wide_characters_stays_in_line(warehouse: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """A CJK character takes two terminal cells: padded by its count of characters, a
    column of team names in Chinese pushed the next column out of line; a newline in a
    column's name broke the header."""
    from rich.cells import cell_len

    assert main(["query", "--warehouse", str(warehouse),
                 "SELECT * FROM (VALUES ('训练组', 1), ('llm-core', 22), ('视觉', 3)) "
                 "t(\"团队\", \"gpu\nh\")"]) == 0
    lines = capsys.readouterr().out.splitlines()[:5]
    assert lines[0].startswith("团队") and "gpu\\nh" in lines[0]
    assert len({cell_len(line) for line in lines}) == 1, lines
    assert [line[-2:].strip() for line in lines[2:]] == ["1", "22", "3"]
