"""Grafana boards: generated JSON matches the code, is structurally sound (a unit on every
panel, one drill chain, SQL variables only through the sqlstring format), and every
panel's query runs on the real targets — DuckDB SQL on a simulated warehouse's catalog,
opened read-only under the data source's own lock-down init SQL, PromQL on a real
Prometheus that scraped the exporter of a processor fed by the simulator — and returns
data. Every SQL panel given a hostile variable value returns the rows of that literal
value and no more; every demand panel agrees with the pending_minute facts to the
GPU-minute, any-card jobs included. Plus `gpuledger dashboards push` against a
recording HTTP server."""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import duckdb
import pytest
import yaml
from prometheus_server import PrometheusServer, prometheus  # noqa: F401
from sim_warehouse import SIM_HOURS, build

from gpuledger.cli.main import main
from gpuledger.pipeline.config import ProcessorConfig
from gpuledger.pipeline.dashboards.boards import JOB, UIDS, all_boards
from gpuledger.pipeline.dashboards.builders import DATASOURCES, variable_query
from gpuledger.pipeline.dashboards.files import load_boards, repo_dashboards_dir, stale_boards
from gpuledger.pipeline.dashboards.interpolate import interpolate
from gpuledger.pipeline.exporter import Exporter
from gpuledger.pipeline.processor import Processor
from gpuledger.pipeline.simulate import SimConfig, simulate
from gpuledger.pipeline.warehouse import Warehouse

REPO = Path(__file__).resolve().parents[1]
BOARDS = all_boards()
GRAFANA_GLOBALS = {"__interval_ms", "__interval", "__rate_interval", "__timeFilter",
                   "__timeFrom", "__timeTo", "__url_time_range", "__data", "__range"}
VAR_REF = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)")
HOSTILE = "x' OR '1'='1"
DATASOURCE_FILE = REPO / "dashboards/provisioning/datasources/gpuledger.yml"


def panels(board: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in board["panels"] if p["type"] != "row"]


def targets(kind: str) -> Iterator[tuple[str, dict[str, Any], dict[str, Any]]]:
    for uid, board in BOARDS.items():
        for p in panels(board):
            for t in p["targets"]:
                if t["datasource"]["type"] == kind:
                    yield uid, p, t


def query_text(t: dict[str, Any]) -> str:
    return str(t.get("rawSql") or t.get("expr"))


def referenced(text: str) -> set[str]:
    return {a or b for a, b in VAR_REF.findall(text)} - GRAFANA_GLOBALS


# --- structure ----------------------------------------------------------------------------

def test_committed_boards_match_the_code() -> None:
    assert stale_boards(repo_dashboards_dir()) == []
    assert set(load_boards(repo_dashboards_dir())) == set(UIDS)


def test_cli_generate_check(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["dashboards", "generate", "--dir", str(tmp_path)]) == 0
    assert main(["dashboards", "generate", "--check", "--dir", str(tmp_path)]) == 0
    board = json.loads((tmp_path / f"{JOB}.json").read_text())
    board["title"] = "edited by hand"
    (tmp_path / f"{JOB}.json").write_text(json.dumps(board))
    assert main(["dashboards", "generate", "--check", "--dir", str(tmp_path)]) == 2
    assert JOB in capsys.readouterr().err
    a_file = tmp_path / "f"
    a_file.write_text("x")
    assert main(["dashboards", "generate", "--dir", str(a_file)]) == 2
    assert capsys.readouterr().err.strip() == f"gpuledger: error: --dir {a_file}: not a folder"
    assert main(["dashboards", "generate", "--dir", str(a_file / "sub")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"cannot write the boards into {a_file / 'sub'}" in err


@pytest.mark.parametrize("uid", UIDS)
def test_board_structure(uid: str) -> None:
    board = BOARDS[uid]
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    # grid positions: inside the 24-column grid, no two panels overlap
    cells: set[tuple[int, int]] = set()
    for p in board["panels"]:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["w"] > 0 and g["h"] > 0 and g["x"] + g["w"] <= 24, p["title"]
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"])
                for y in range(g["y"], g["y"] + g["h"])}
        assert not cells & mine, f"{p['title']} overlaps another panel"
        cells |= mine
    # data sources: every uid is provisioned, with the right type
    provisioned = yaml.safe_load(
        (REPO / "dashboards/provisioning/datasources/gpuledger.yml").read_text())
    types = {d["uid"]: d["type"] for d in provisioned["datasources"]}
    for p in panels(board):
        for ds in [p["datasource"], *[t["datasource"] for t in p["targets"]]]:
            assert types.get(ds["uid"]) == ds["type"] == DATASOURCES[ds["uid"]]["type"]
        assert p["targets"], p["title"]
    for v in board["templating"]["list"]:
        assert types.get(v["datasource"]["uid"]) == v["datasource"]["type"]
    # every variable used exists, and a variable uses only the ones defined before it
    names = [v["name"] for v in board["templating"]["list"]]
    assert len(names) == len(set(names))
    for i, v in enumerate(board["templating"]["list"]):
        assert referenced(variable_query(v)) <= set(names[:i]), v["name"]
    for p in panels(board):
        texts = [query_text(t) for t in p["targets"]] + [p["title"]]
        texts += [json.dumps(p["fieldConfig"]), json.dumps(p.get("options", {}))]
        for text in texts:
            assert referenced(text) <= set(names), (p["title"], referenced(text) - set(names))
    # one chain on every board: pool → team → card type (→ queue → job), in that order
    chain = [n for n in ("pool", "team", "card_type", "queue", "job") if n in names]
    assert names == chain and chain[:3] == ["pool", "team", "card_type"]
    for prev, cur in itertools.pairwise(chain):
        assert prev in referenced(variable_query(board["templating"]["list"][names.index(cur)]))
    # a unit on every panel
    for p in panels(board):
        assert p["fieldConfig"]["defaults"].get("unit"), f"{p['title']}: no unit"
    # SQL takes variables only through Grafana's quoting format (sqlstring)
    for p in panels(board):
        for t in p["targets"]:
            if "rawSql" in t:
                raw = {a or b for a, b in VAR_REF.findall(t["rawSql"].replace(
                    ":sqlstring}", ""))} - GRAFANA_GLOBALS
                assert not raw, (p["title"], raw)
    for v in board["templating"]["list"]:
        if v["datasource"]["type"] != "prometheus":
            q = variable_query(v).replace(":sqlstring}", "")
            assert not {a or b for a, b in VAR_REF.findall(q)} - GRAFANA_GLOBALS, v["name"]


def _links(board: dict[str, Any]) -> Iterator[str]:
    for p in panels(board):
        for o in p["fieldConfig"]["overrides"]:
            for prop in o["properties"]:
                if prop["id"] == "links":
                    for lk in prop["value"]:
                        yield lk["url"]


def test_links_resolve_to_boards() -> None:
    seen: dict[str, set[str]] = {}
    for uid, board in BOARDS.items():
        for url in _links(board):
            m = re.match(r"/d/([\w-]+)\?(.*)", url)
            assert m, url
            assert m.group(1) in BOARDS, url
            seen.setdefault(uid, set()).add(m.group(1))
            target = BOARDS[m.group(1)]
            for var in re.findall(r"var-(\w+)=", m.group(2)):
                assert var in [v["name"] for v in target["templating"]["list"]], url
        for lk in board["links"]:
            assert lk["type"] == "dashboards" and lk["tags"] == ["gpuledger"]
            assert all("gpuledger" in b["tags"] for b in BOARDS.values())
    # drill-down: fleet → team → job, queues → job
    assert "gpuledger-team" in seen["gpuledger-fleet"]
    assert "gpuledger-job" in seen["gpuledger-team"]
    assert "gpuledger-job" in seen["gpuledger-queues"]


# --- DuckDB panels on a simulated warehouse ------------------------------------------------

@pytest.fixture(scope="module")
def warehouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(tmp_path_factory.mktemp("boards") / "wh")


def connect(warehouse: Path) -> duckdb.DuckDBPyConnection:
    """The catalog as Grafana's DuckDB data source opens it: read-only, then the
    provisioned init SQL (its warehouse path made this test's) — the lock-down."""
    duck = next(d for d in yaml.safe_load(DATASOURCE_FILE.read_text())["datasources"]
                if d["uid"] == "gpuledger-duckdb")
    folder = str(Path(duck["jsonData"]["path"]).parent) + "/"
    con = duckdb.connect(str(warehouse / Path(duck["jsonData"]["path"]).name),
                         read_only=duck["jsonData"]["readOnly"])
    con.execute(duck["jsonData"]["initSql"].replace(f"'{folder}'", f"'{warehouse}/'"))
    return con


def test_the_data_source_lock_down_holds(warehouse: Path) -> None:
    """Under the data source's init SQL: the facts read, nothing else does, and no
    statement can undo it."""
    con = connect(warehouse)
    try:
        assert con.execute("SELECT count(*) FROM gpu_minute").fetchone() != (0,)
        for statement in ("SELECT * FROM read_csv('/etc/passwd')",
                          "SELECT * FROM read_parquet('http://127.0.0.1:9/x.parquet')",
                          "ATTACH '/tmp/gpuledger-grafana.duckdb' AS x",
                          "COPY (SELECT 1) TO '/tmp/gpuledger-grafana.csv'",
                          "INSTALL httpfs", "LOAD httpfs",
                          "SET enable_external_access = true", "RESET lock_configuration",
                          "SET allowed_directories = ['/']", "SET memory_limit = '100GB'",
                          "CREATE TABLE t AS SELECT 1", "SELECT * FROM glob('/etc/*')"):
            with pytest.raises(duckdb.Error):
                con.execute(statement)
        assert not Path("/tmp/gpuledger-grafana.csv").exists()
    finally:
        con.close()


def _window(con: duckdb.DuckDBPyConnection) -> tuple[datetime, datetime]:
    t0, t1 = con.execute("SELECT min(minute), max(minute) FROM gpu_minute").fetchall()[0]
    return t0, t1 + timedelta(minutes=1)


def resolve_sql_variables(board: dict[str, Any], con: duckdb.DuckDBPyConnection,
                          t0: datetime, t1: datetime) -> dict[str, list[str]]:
    values: dict[str, list[str]] = {}
    for v in board["templating"]["list"]:
        text = interpolate(variable_query(v), values, t0, t1)
        options = [str(r[0]) for r in con.execute(text).fetchall()]
        assert options, f"variable {v['name']} has no values: {text}"
        values[v["name"]] = options if v["multi"] else options[:1]
    return values


def _prom_values_from_warehouse(con: duckdb.DuckDBPyConnection) -> dict[str, list[str]]:
    """Values for Prometheus variables in SQL panels of mixed boards: the warehouse's."""
    def col(c: str) -> list[str]:
        return [str(r[0]) for r in con.execute(
            f"SELECT DISTINCT {c} FROM gpu_hourly WHERE {c} IS NOT NULL").fetchall()]
    return {n: col(n) for n in ("pool", "card_type", "team", "queue")}


def board_values(board: dict[str, Any], con: duckdb.DuckDBPyConnection, t0: datetime,
                 t1: datetime) -> dict[str, list[str]]:
    """Every variable's values (All), as Grafana would resolve them on this warehouse."""
    if all(v["datasource"]["type"] != "prometheus" for v in board["templating"]["list"]):
        values = resolve_sql_variables(board, con, t0, t1)
    else:
        values = _prom_values_from_warehouse(con)
    if "job" in values:
        # a job whose attempt ended (its per-GPU and recommendation rows are written
        # when it ends), taken from the variable's own options
        options = resolve_sql_variables({"templating": {"list": [
            {**v, "multi": True} if v["name"] == "job" else v
            for v in board["templating"]["list"]]}}, con, t0, t1)["job"]
        ended = {r[0] for r in con.execute("SELECT job_id FROM recommendations").fetchall()}
        values["job"] = [next(j for j in options if j in ended)]
    return values


@pytest.mark.parametrize("uid", UIDS)
def test_every_sql_panel_returns_rows(uid: str, warehouse: Path) -> None:
    board = BOARDS[uid]
    con = connect(warehouse)
    try:
        t0, t1 = _window(con)
        values = board_values(board, con, t0, t1)
        ran = 0
        for p in panels(board):
            for t in p["targets"]:
                if "rawSql" not in t:
                    continue
                text = interpolate(t["rawSql"], values, t0, t1)
                cur = con.execute(text)
                rows = cur.fetchall()
                columns = [d[0] for d in cur.description or []]
                assert rows, f"{p['title']}: no rows\n{text}"
                if t["format"] == "time_series":
                    assert columns[0] == "time", p["title"]
                for url in [u for o in p["fieldConfig"]["overrides"] for prop in o["properties"]
                            if prop["id"] == "links" for u in [x["url"] for x in prop["value"]]]:
                    for f in re.findall(r"__data\.fields\.(\w+)", url):
                        assert f in columns, (p["title"], f)
                ran += 1
        assert ran > 0 or uid == "never"
    finally:
        con.close()


def test_job_board_follows_the_chain(warehouse: Path) -> None:
    """The job variable lists only jobs of the chosen team and queue."""
    board = BOARDS[JOB]
    con = connect(warehouse)
    try:
        t0, t1 = _window(con)
        values = resolve_sql_variables(board, con, t0, t1)
        team, queue = con.execute(
            "SELECT team, queue FROM attempts WHERE started_at IS NOT NULL "
            "GROUP BY ALL ORDER BY count(*) DESC, team, queue LIMIT 1").fetchall()[0]
        assert team in values["team"] and queue in values["queue"]
        narrowed = {**values, "team": [team], "queue": [queue]}
        job_var = board["templating"]["list"][-1]
        jobs = [r[0] for r in con.execute(interpolate(variable_query(job_var), narrowed, t0,
                                                  t1)).fetchall()]
        assert jobs
        owners = con.execute(f"SELECT DISTINCT team, queue FROM attempts WHERE job_id IN "
                         f"({','.join(repr(j) for j in jobs)})").fetchall()
        assert owners == [(team, queue)]
        everyone = con.execute(interpolate(variable_query(job_var), values, t0, t1)).fetchall()
        assert len(everyone) > len(jobs)
    finally:
        con.close()


def _rows(rows: list[tuple[Any, ...]]) -> list[str]:
    """Rows compared as a set: ties may come in any order, and float sums may differ in
    the last bits with DuckDB's parallel aggregation."""
    return sorted(repr(tuple(round(v, 6) if isinstance(v, float) else v for v in r))
                  for r in rows)


@pytest.mark.parametrize("uid", UIDS)
def test_sql_panels_take_a_hostile_value_as_one_literal(uid: str, warehouse: Path) -> None:
    """Each SQL panel and SQL variable, with each variable in turn set to a hostile value,
    interpolated as Grafana does: it returns exactly the rows of that literal value (here
    the same as for any value that does not exist), no more, and no error."""
    board = BOARDS[uid]
    con = connect(warehouse)
    try:
        t0, t1 = _window(con)
        values = board_values(board, con, t0, t1)
        queries = [(p["title"], t["rawSql"]) for p in panels(board) for t in p["targets"]
                   if "rawSql" in t]
        queries += [(f"variable {v['name']}", variable_query(v))
                    for v in board["templating"]["list"]
                    if v["datasource"]["type"] != "prometheus"]
        checked = 0
        for title, text in queries:
            for name in sorted(referenced(text) & set(values)):
                hostile = interpolate(text, {**values, name: [HOSTILE]}, t0, t1)
                assert "'x'' OR ''1''=''1'" in hostile, (title, name)  # one quoted literal
                got = _rows(con.execute(hostile).fetchall())
                absent = interpolate(text, {**values, name: ["no such value"]}, t0, t1)
                assert got == _rows(con.execute(absent).fetchall()), (title, name)
                checked += 1
        assert checked >= len(queries)
    finally:
        con.close()


def test_demand_panels_agree_with_pending_minute(warehouse: Path) -> None:
    """Every SQL demand panel (pending_minute), summed over its one-minute buckets, is the
    pending GPU-minutes of the facts: all of them with every variable at All, and for each
    card type the jobs that asked for it plus those that asked for any card."""
    con = connect(warehouse)
    try:
        t0, t1 = _window(con)
        in_range = f"minute >= '{t0.isoformat()}' AND minute < '{t1.isoformat()}'"
        any_card = con.execute(f"SELECT sum(pending_gpus) FROM pending_minute WHERE {in_range} "
                               "AND card_type IS NULL").fetchone()
        assert any_card and any_card[0] > 0  # the simulated cluster has any-card demand
        demand = [(uid, p, t) for uid, board in BOARDS.items() for p in panels(board)
                  for t in p["targets"] if "pending_minute" in t.get("rawSql", "")]
        assert demand
        for uid, p, t in demand:
            values = resolve_sql_variables(BOARDS[uid], con, t0, t1)
            cards = values["card_type"]
            for selection in [cards, *[[c] for c in cards]]:
                text = interpolate(t["rawSql"], {**values, "card_type": selection}, t0, t1,
                                   interval_ms=60_000)
                cur = con.execute(text)
                rows = cur.fetchall()
                col = [d[0] for d in cur.description or []].index("pending_gpus")
                got = sum(r[col] for r in rows)
                listed = ",".join(f"'{c}'" for c in selection)
                want = con.execute(f"SELECT coalesce(sum(pending_gpus), 0) FROM pending_minute "
                                   f"WHERE {in_range} AND (card_type IS NULL OR card_type IN "
                                   f"({listed}))").fetchone()
                assert want is not None
                assert got == pytest.approx(want[0]), (uid, p["title"], selection)
    finally:
        con.close()


# --- PromQL: parses (promtool), and returns data from a real Prometheus --------------------

def test_every_promql_parses_with_promtool(tmp_path: Path) -> None:
    values = {"pool": ["train", "infer"], "card_type": ["H100-SXM5-80GB", "A100-SXM4-80GB"],
              "team": ["llm-core"], "queue": ["prod"], "job": ["1000001"]}
    t0 = t1 = datetime(2026, 1, 5, tzinfo=UTC)
    exprs = [interpolate(query_text(t), values, t0, t1) for _, _, t in targets("prometheus")]
    rules = {"groups": [{"name": "boards", "rules": [
        {"record": f"board:check_{i}", "expr": e} for i, e in enumerate(exprs)]}]}
    path = tmp_path / "boards.yml"
    path.write_text(yaml.safe_dump(rules))
    proc = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True,
                          text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"{len(exprs)} rules found" in proc.stdout


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[
        Callable[[Callable[..., PrometheusServer]], PrometheusServer]]:
    """A processor with its exporter, fed most of a simulated run; the test starts
    Prometheus on it and feeds the rest while Prometheus scrapes."""
    root = tmp_path_factory.mktemp("live") / "wh"
    proc = Processor(ProcessorConfig(), Warehouse(root))
    exporter = Exporter(proc.config)
    exporter.attach(proc)
    port = exporter.start("127.0.0.1", 0)
    batches = list(simulate(SimConfig(hours=SIM_HOURS, seed=7, sample_interval_s=30)))
    cut = len(batches) // 3
    for batch in batches[:cut]:
        proc.process(batch)

    def start(factory: Callable[..., PrometheusServer]) -> PrometheusServer:
        server = factory(targets=[f"127.0.0.1:{port}"],
                         rule_files=sorted((REPO / "alerts").glob("gpuledger-*.yml")))
        server.wait_for("up == 1")
        for batch in batches[cut:]:
            proc.process(batch)
            time.sleep(0.5)
        time.sleep(1.5)
        return server

    yield start
    exporter.stop()


def resolve_prom_variables(board: dict[str, Any], server: PrometheusServer
                           ) -> dict[str, list[str]]:
    values: dict[str, list[str]] = {}
    for v in board["templating"]["list"]:
        m = re.fullmatch(r"label_values\((.*), (\w+)\)", variable_query(v))
        assert m, variable_query(v)
        selector = interpolate(m.group(1), values, datetime.now(UTC), datetime.now(UTC))
        options = sorted(x for x in server.api(f"label/{m.group(2)}/values",
                                               **{"match[]": selector}) if x)
        assert options, f"variable {v['name']}: no values for {selector}"
        values[v["name"]] = options if v["multi"] else options[:1]
    return values


def test_every_prometheus_panel_returns_data(
        live: Callable[[Callable[..., PrometheusServer]], PrometheusServer],
        prometheus: Callable[..., PrometheusServer], warehouse: Path) -> None:  # noqa: F811
    server = live(prometheus)
    end = time.time()
    start = end - 60
    con = connect(warehouse)
    try:
        wh_values = _prom_values_from_warehouse(con)
    finally:
        con.close()
    checked = 0
    for uid, board in BOARDS.items():
        if any(v["datasource"]["type"] == "prometheus" for v in board["templating"]["list"]):
            values = resolve_prom_variables(board, server)
        else:  # the job board's variables come from the warehouse: pick a running job
            running = server.api("label/job_id/values", **{"match[]": "gpuledger_job_info"})
            values = {**wh_values, "job": sorted(running)[:1]}
        for p in panels(board):
            for t in p["targets"]:
                if "expr" not in t:
                    continue
                expr = interpolate(t["expr"], values, datetime.now(UTC), datetime.now(UTC))
                if t["instant"]:
                    result = server.query(expr)
                else:
                    result = server.api("query_range", query=expr, start=start, end=end,
                                        step=1)["result"]
                assert result, f"{uid} / {p['title']}: no data for {expr}"
                wanted = set(re.findall(r"\{\{(\w+)\}\}", t.get("legendFormat", "")))
                for url in [x["url"] for o in p["fieldConfig"]["overrides"]
                            for prop in o["properties"] if prop["id"] == "links"
                            for x in prop["value"]]:
                    wanted |= set(re.findall(r"__data\.fields\.(\w+)", url))
                for series in result:
                    assert wanted <= set(series["metric"]), (p["title"], series["metric"])
                checked += 1
    assert checked == sum(1 for _ in targets("prometheus"))


# --- push ------------------------------------------------------------------------------------

class _Recorder(BaseHTTPRequestHandler):
    calls: ClassVar[list[tuple[str, str, dict[str, str], Any]]] = []
    folder_exists = False
    status = 200

    def _reply(self, code: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _record(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else None
        type(self).calls.append((self.command, self.path, dict(self.headers), body))
        return body

    def do_GET(self) -> None:
        self._record()
        if type(self).status != 200:
            self._reply(type(self).status, {"message": "invalid API key"})
        elif self.path == "/api/folders/gpuledger" and type(self).folder_exists:
            self._reply(200, {"uid": "gpuledger", "title": "gpuledger"})
        else:
            self._reply(404, {"message": "folder not found"})

    def do_POST(self) -> None:
        body = self._record()
        if self.path == "/api/folders":
            type(self).folder_exists = True
            self._reply(200, {"uid": body["uid"], "title": body["title"]})
        else:
            uid = body["dashboard"]["uid"]
            self._reply(200, {"status": "success", "uid": uid, "version": 3,
                              "url": f"/d/{uid}/x"})

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def grafana() -> Iterator[str]:
    _Recorder.calls, _Recorder.folder_exists, _Recorder.status = [], False, 200
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_push_creates_the_folder_and_every_board(grafana: str, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    secret = "glsa_not-a-real-token-7f3a"
    monkeypatch.setenv("GPULEDGER_GRAFANA_TOKEN", secret)
    assert main(["dashboards", "push", "--url", grafana]) == 0
    out = capsys.readouterr()
    assert secret not in out.out + out.err
    calls = _Recorder.calls
    assert [(c[0], c[1]) for c in calls[:2]] == [("GET", "/api/folders/gpuledger"),
                                                ("POST", "/api/folders")]
    posts = [c for c in calls if c[1] == "/api/dashboards/db"]
    assert sorted(c[3]["dashboard"]["uid"] for c in posts) == sorted(UIDS)
    committed = load_boards(repo_dashboards_dir())
    for method, _path, headers, _body in calls:
        assert headers.get("Authorization") == f"Bearer {secret}", method
    for *_, body in posts:
        assert body["overwrite"] is True and body["folderUid"] == "gpuledger"
        want = {k: v for k, v in committed[body["dashboard"]["uid"]].items()
                if k not in ("id", "version")}
        assert body["dashboard"] == want
    # again: the folder exists now, so it is not created twice
    _Recorder.calls = []
    assert main(["dashboards", "push", "--url", grafana]) == 0
    assert [c[1] for c in _Recorder.calls].count("/api/folders") == 0


def test_push_errors_never_show_the_token(grafana: str, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("GPULEDGER_GRAFANA_TOKEN", raising=False)
    monkeypatch.delenv("GRAFANA_TOKEN", raising=False)
    assert main(["dashboards", "push", "--url", grafana]) == 2
    assert "GPULEDGER_GRAFANA_TOKEN" in capsys.readouterr().err
    secret = "glsa_wrong-token-91b2"
    monkeypatch.setenv("GRAFANA_TOKEN", secret)
    _Recorder.status = 401
    assert main(["dashboards", "push", "--url", grafana]) == 2
    err = capsys.readouterr().err
    assert "401" in err and secret not in err
    assert main(["dashboards", "push", "--url", "http://127.0.0.1:9"]) == 2
    assert secret not in capsys.readouterr().err


def test_interpolation_as_grafana_does_it() -> None:
    t0, t1 = datetime(2026, 1, 5, tzinfo=UTC), datetime(2026, 1, 5, 3, tzinfo=UTC)
    text = ("x IN (${v:sqlstring}) AND l=~\"$v\" AND j = '${j}' AND k=\"${j}\" "
            "AND $__timeFilter(t) AND u < $__timeTo() AND $__interval_ms > 0")
    assert interpolate(text, {"v": ["a", "b.c"], "j": ["o'k"]}, t0, t1, 30_000) == (
        "x IN ('a','b.c') AND l=~\"(a|b\\.c)\" AND j = 'o''k' AND k=\"o'k\" "
        "AND t >= '2026-01-05T00:00:00Z' AND t <= '2026-01-05T03:00:00Z' "
        "AND u < '2026-01-05T03:00:00Z' AND 30000 > 0")


def test_generate_script_check_writes_nothing_and_refuses_other_arguments(
        tmp_path: Path) -> None:
    """`python dashboards/generate.py --check` ignored its arguments and rewrote the
    files. --check writes nothing and exits 2 naming a board that differs (as `gpuledger
    dashboards generate --check`); another argument is refused; with none it writes the
    boards."""
    import shutil
    import sys

    repo = Path(__file__).resolve().parents[1]
    script = tmp_path / "generate.py"
    shutil.copy(repo / "dashboards" / "generate.py", script)

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, str(script), *args], capture_output=True,
                              text=True, timeout=120)
    assert run("--bogus").returncode == 2
    assert not list(tmp_path.glob("*.json"))
    wrote = run()
    assert wrote.returncode == 0, wrote.stderr
    assert {p.stem for p in tmp_path.glob("*.json")} == set(UIDS)
    assert run("--check").returncode == 0
    board = tmp_path / f"{UIDS[0]}.json"
    board.write_text("{}", encoding="utf-8")
    checked = run("--check")
    assert checked.returncode == 2 and str(board) in checked.stdout, checked.stdout
    assert board.read_text(encoding="utf-8") == "{}"   # not rewritten
