"""The `gpuledger` command, run as a user would (in-process for speed, and once as a
real subprocess through the installed console script)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from events import at, inventory, iso, job, jsonl
from test_simulate import SMALL

from gpuledger.cli.main import main


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("cluster") / "small.yaml"
    path.write_text(yaml.safe_dump(SMALL))
    return path


def test_help_explains_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    for command in ("demo", "simulate", "ingest", "query"):
        assert command in out
    with pytest.raises(SystemExit):
        main(["ingest", "--help"])
    assert "file:line" in capsys.readouterr().out.replace("(file:line: reason)", "file:line")
    # import names every format it has, at the top level and in its own help (both
    # said "openb" alone)
    with pytest.raises(SystemExit):
        main(["import", "--help"])
    own = " ".join(capsys.readouterr().out.split())
    assert all(f in own for f in ("Formats: slurm-sacct", "pods (", "openb ("))
    assert "Slurm sacct, pod lists, the openb trace" in " ".join(out.split())


def test_demo_prints_the_summary(cluster: Path, tmp_path: Path,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["demo", "--cluster", str(cluster), "--hours", "1", "--quiet",
                 "--warehouse", str(tmp_path / "wh")])
    assert code == 0
    out = capsys.readouterr().out
    for title in ("Allocation vs use by pool", "Allocation vs use by team",
                  "Top 10 wasting jobs", "Queue wait by queue", "Fragmentation"):
        assert title in out
    assert "processed" in out and "GPU samples" in out
    assert (tmp_path / "wh" / "catalog.duckdb").exists()
    # each wasting job names the card it held (it showed the card asked for: blank for
    # a job that asked for any card of its pool, 259 of 289 attempts in a 2-hour demo)
    top = out.split("== Top 10 wasting jobs")[1].split("\n\n")[0].splitlines()
    assert "card held" in top[1] and len(top) == 2 + 1 + 10 + 1
    assert all(re.search(r"\s[A-Z]\w*\d\S*-\d+GB\s", row) for row in top[3:-1]), top


def test_simulate_then_ingest_with_bad_lines(cluster: Path, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "events"
    assert main(["simulate", "--cluster", str(cluster), "--hours", "0.5", "--quiet",
                 "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "telemetry.jsonl" in printed and "job.jsonl" in printed
    lines = (out / "job.jsonl").read_text().splitlines()
    assert all(json.loads(line)["type"] == "job" for line in lines)
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join([
        json.dumps({"v": 1, "type": "job", "time": iso(at(0)), "event": "exploded",
                    "job_id": "x"}),
        "{not json",
        json.dumps({"v": 1, "type": "inventory", "time": iso(at(0)), "node": "n",
                    "pool": "p", "card_type": "c", "gpu_count": -1, "gpu_mem_mib": 1.0,
                    "schedulable": True, "health": "ok"}),
    ]) + "\n")
    files = [str(p) for p in sorted(out.glob("*.jsonl"))]
    wh = tmp_path / "wh"
    assert main(["ingest", *files, str(bad), "--quiet", "--warehouse", str(wh)]) == 0
    captured = capsys.readouterr()
    assert "3 bad line(s)" in captured.out
    # where it closed: half an hour, so the hour is not whole yet
    # (the last sample at 00:29:50: a piece starting inside that minute goes on from 00:29)
    closed = re.search(r"closed up to (\S+ \d\d:\d\d) UTC: the next piece goes on from "
                       r"there, or from 00:29 if it starts inside the last minute \(the hour "
                       r"from (\d\d):00 is not whole yet", captured.err)
    assert closed is not None, captured.err
    assert f"{bad}:1:" in captured.err and "'exploded'" in captured.err
    assert f"{bad}:2:" in captured.err
    assert f"{bad}:3:" in captured.err and "gpu_count" in captured.err
    assert main(["query", "--warehouse", str(wh), "--format", "csv",
                 "SELECT line FROM rejects ORDER BY line"]) == 0
    assert capsys.readouterr().out == "line\n1\n2\n3\n"
    assert main(["ingest", str(bad), "--strict", "--quiet",
                 "--warehouse", str(tmp_path / "strict")]) == 1


def test_user_errors_are_short_and_exit_2(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ingest", str(tmp_path / "missing.jsonl"), "--quiet"]) == 2
    assert "missing.jsonl: no such file" in capsys.readouterr().err
    cfg = tmp_path / "c.yaml"
    cfg.write_text("thresholds:\n  idle: 0.1\n")
    good = tmp_path / "ok.jsonl"
    good.write_text(json.dumps({**inventory("n", at(0)), "time": iso(at(0))}) + "\n")
    assert main(["ingest", str(good), "--config", str(cfg), "--quiet",
                 "--warehouse", str(tmp_path / "w")]) == 2
    assert "thresholds.idle: unknown key" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        main(["demo", "--hours", "-1"])
    assert exit_.value.code == 2
    assert "--hours must be > 0" in capsys.readouterr().err


def test_console_script_runs_as_a_process(tmp_path: Path) -> None:
    exe = Path(sys.executable).with_name("gpuledger")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "gpuledger.cli.main"]
    done = subprocess.run([*cmd, "query", "--warehouse", str(tmp_path), "SELECT 1"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "not a gpuledger warehouse" in done.stderr


def test_the_poll_bound_defaults_to_the_service_and_refuses_nonsense(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from gpuledger.cli.main import MAX_POLL_SAMPLES, build_parser
    from gpuledger.pipeline.kafka.service import ServiceOptions

    assert ServiceOptions().max_poll_samples == MAX_POLL_SAMPLES
    args = build_parser().parse_args(["process", "--kafka", "h:1"])
    assert args.max_poll_samples == MAX_POLL_SAMPLES
    monkeypatch.setenv("GPULEDGER_KAFKA_MAX_POLL_SAMPLES", "250000")
    assert build_parser().parse_args(["process", "--kafka", "h:1"]).max_poll_samples == 250_000
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["process", "--kafka", "h:1", "--max-poll-samples", "0"])
    assert exit_.value.code == 2
    assert "--max-poll-samples must be > 0" in capsys.readouterr().err


@pytest.mark.parametrize(("command", "value", "says"), [
    ("demo", "nan", "--hours must be a finite number, got 'nan'"),
    ("demo", "inf", "--hours must be a finite number, got 'inf'"),
    ("demo", "8785", "--hours must be at most 8,784, got 8785"),
    ("simulate", "1e12", "--hours must be at most 8,784, got 1e12"),
    ("feed", "nan", "--hours must be a finite number"),
])
def test_a_span_that_is_no_number_or_too_long_is_refused_before_anything_is_written(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str, value: str,
        says: str) -> None:
    out = ["--out", str(tmp_path / "out")] if command == "simulate" else \
        ["--kafka", "127.0.0.1:1"] if command == "feed" else \
        ["--warehouse", str(tmp_path / "out")]
    with pytest.raises(SystemExit) as exit_:
        main([command, "--hours", value, *out])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err, err
    assert not (tmp_path / "out").exists()


def test_a_time_limit_may_be_inf_but_not_nan(capsys: pytest.CaptureFixture[str]) -> None:
    from gpuledger.cli.arguments import time_limit

    assert time_limit("--timeout")("inf") == float("inf")
    with pytest.raises(SystemExit):
        main(["query", "--timeout", "nan", "SELECT 1"])
    assert "--timeout must be a number of seconds, got 'nan'" in capsys.readouterr().err


@pytest.mark.parametrize(("content", "says"), [
    (None, "no such file"),
    ("dir", "is a directory, not a file"),
    (b"pools: [\n", "not valid YAML at line 2, column 1"),
    (b"\xef\xff\xfe", "not UTF-8 text (byte 0)"),
    (b"pools: 5\n", "cluster.pools: unknown key"),
])
def test_a_cluster_spec_that_cannot_be_used_is_one_line_naming_the_file(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes | str | None,
        says: str) -> None:
    spec = tmp_path / "cluster.yaml"
    if content == "dir":
        spec.mkdir()
    elif isinstance(content, bytes):
        spec.write_bytes(content)
    for command, out in (("demo", "--warehouse"), ("simulate", "--out")):
        assert main([command, "--cluster", str(spec), "--hours", "1",
                     out, str(tmp_path / "out")]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"--cluster: {spec}: {says}" in err, err
        assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("args", "says"), [
    (["demo", "--seed", "-1"], "--seed must be >= 0, got -1"),
    (["ingest", "x.jsonl", "--show-rejects", "-1"], "--show-rejects must be >= 0, got -1"),
    (["report", "--width", "0"], "--width must be > 0, got 0"),
    (["report", "--width", "5"], "--width must be at least 40 columns, got 5"),
    # no ceiling: 10^8 ran past 200 s, padding the rules to the width
    (["report", "--width", "100000000"], "--width must be at most 10,000, got 100000000"),
    (["whatif", "--width", "20000"], "--width must be at most 10,000, got 20000"),
    # it said "cannot write s3:/wh1/r.html: No such file or directory"
    (["report", "--html", "s3://wh1/r.html"],
     "--html writes a local file, got a URL (s3://wh1/r.html)"),
    (["whatif", "--width", "39"], "--width must be at least 40 columns, got 39"),
])
def test_counts_seeds_and_widths_out_of_range_are_usage_errors(
        args: list[str], says: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(args)
    assert exit_.value.code == 2
    assert says in capsys.readouterr().err


def test_show_rejects_zero_lists_none_and_says_how_many(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"v": 1}\n{"v": 1}\n')
    assert main(["ingest", str(bad), "--show-rejects", "0", "--quiet",
                 "--warehouse", str(tmp_path / "w")]) == 0
    err = capsys.readouterr().err
    assert "bad.jsonl:1:" not in err and "... and 2 more (--show-rejects N to see them)" in err
    assert "nothing to ingest: no valid record in the input (2 bad line(s))" in err
    assert not (tmp_path / "w").exists()          # nothing was written


@pytest.mark.parametrize(("args", "says"), [
    (["--kafka", "broker:99999"], "bootstrap 'broker:99999': port 99999 is not 1-65535"),
    (["--topic-prefix", "team a."], "topic prefix 'team a.': Kafka topic names hold only"),
    (["--topic-prefix", "x" * 240], "the topic names would be 266 characters, Kafka allows 249"),
    (["--metrics-address", "nowhere"], "--metrics-address: 'nowhere': expected HOST:PORT"),
])
def test_the_service_refuses_bad_settings_before_it_waits_for_a_broker(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str],
        says: str) -> None:
    started = time.monotonic()
    code = main(["process", "--kafka", "127.0.0.1:9", *args, "--exit-when-idle", "1",
                 "--warehouse", str(tmp_path / "w")])
    assert code == 2 and time.monotonic() - started < 10   # no broker at 127.0.0.1:9
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err, err


@pytest.mark.parametrize(("args", "says"), [
    (["--group", ""], "--group '': not a name a file can have"),
    (["--instance-id", " "], "--instance-id ' ': not a name a file can have"),
    # they name a checkpoint folder and file: never a path out of the state folder
    (["--group", "../../etc"], "--group '../../etc': not a name a file can have: 1 to 249 "
     "printable characters, no '/' or '\\', not '.' or '..' (it names the group's "
     "checkpoint folder, <state>/<group>/)"),
    (["--group", ".."], "--group '..': not a name a file can have"),
    (["--group", "a\nb"], "--group 'a\\nb': not a name a file can have"),
    (["--instance-id", "a/b"], "--instance-id 'a/b': not a name a file can have: 1 to 249 "
     "printable characters, no '/' or '\\', not '.' or '..' (it names its checkpoint, "
     "global-<instance>.checkpoint)"),
    (["--session-timeout-ms", "99999999999"],
     "--session-timeout-ms must be at most 2,147,483,647, got 99999999999"),
])
def test_the_services_options_out_of_range_are_usage_errors(
        capsys: pytest.CaptureFixture[str], args: list[str], says: str) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["process", "--kafka", "127.0.0.1:9", *args])
    assert exit_.value.code == 2
    assert says in capsys.readouterr().err


@pytest.mark.parametrize(("url", "says"), [
    ("foo", "expected an http:// or https:// URL"),
    ("file:///etc/passwd", "expected an http:// or https:// URL"),
    ("http://[::1", "Invalid IPv6 URL"),
    ("http://:9/x", "no host in the URL"),
])
def test_an_alert_webhook_that_is_no_http_url_is_refused_at_start(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], url: str, says: str) -> None:
    """(It was a ValueError traceback at the first alert, minutes into the run; file://
    was read and counted as posted.)"""
    assert main(["demo", "--hours", "0.2", "--quiet", "--alert-webhook", url,
                 "--warehouse", str(tmp_path / "wh")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--alert-webhook: {url!r}: {says}" in err, err
    assert not (tmp_path / "wh").exists()


def test_a_refused_ops_option_leaves_an_earlier_demo_as_it_was(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The options are checked before an earlier demo's warehouse is cleared (it was
    deleted first, then the run refused)."""
    wh = tmp_path / "wh"
    assert main(["demo", "--hours", "0.2", "--quiet", "--warehouse", str(wh)]) == 0
    before = sorted(p.relative_to(wh) for p in wh.rglob("*"))
    capsys.readouterr()
    for bad in (["--alert-webhook", "foo"], ["--metrics-address", "nowhere:port"]):
        assert main(["demo", "--hours", "0.2", "--quiet", "--warehouse", str(wh), *bad]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and bad[0] in err and "replacing" not in err, err
        assert sorted(p.relative_to(wh) for p in wh.rglob("*")) == before


def test_an_alert_webhook_refused_for_its_credentials_does_not_show_them(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = "http://alice:S3cretPW@127.0.0.1:1/api/v2/alerts"
    assert main(["demo", "--hours", "0.2", "--quiet", "--alert-webhook", url,
                 "--warehouse", str(tmp_path / "wh")]) == 2
    err = capsys.readouterr().err
    assert "credentials in the URL are not supported" in err and "***@127.0.0.1" in err
    assert "S3cretPW" not in err and "alice" not in err


@pytest.mark.parametrize(("args", "says"), [
    (["demo", "--start", "2099-01-01T00:00Z", "--hours", "1"],
     "ends at 2099-01-01T01:00Z, more than 3600 s after now"),
    (["demo", "--start", "2000-01-01T00:00Z", "--hours", "1"],
     "would begin before 2000-01-01, and events before then are rejected"),
    (["demo", "--start", "0001-01-01T00:00Z", "--hours", "1"],  # was an OverflowError
     "--start 0001-01-01T00:00Z: the simulation (with its 6 h warm-up) would begin"),
    (["simulate", "--start", "9999-12-31T23:00Z", "--hours", "2"],
     "the simulation would go past the year 9999"),
    (["simulate", "--start", "2099-01-01T00:00Z", "--hours", "0.05", "--interval", "60"],
     "ends at 2099-01-01T00:03Z, more than 3600 s after now: the processor rejects"),
    (["demo", "--hours", "0.1", "--topic-prefix", "zz"], "it needs --kafka"),
])
def test_a_simulation_the_processor_would_reject_is_refused_up_front(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], says: str
) -> None:
    """(A demo starting in the future rejected every sample, 207,730 rejects, and then
    ended in a traceback: nothing to diagnose; --start before 2000 the same; simulate
    wrote '+10000-01-01' times, and from the future events that ingest then rejected, all
    2,136 of them; --topic-prefix without --kafka was ignored.)"""
    out = tmp_path / "out"
    where = ["--warehouse", str(out)] if args[0] == "demo" else ["--out", str(out)]
    assert main([*args, *where, "--quiet"]) == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1, err
    assert not out.exists()


def test_records_dated_before_the_facts_begin_are_said_early_not_late(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """(A probe: two submissions dated 26 years before the bulk of the input, which only
    update the books, were printed as "late: 0 telemetry samples (kept in late_telemetry),
    2 job events".) Counted apart, as early; the processor's late counts leave them out."""
    recs = [inventory("n1", at(-400 * 24 * 60), gpus=2),
            job("submitted", "old", at(-2 * 365 * 24 * 60)), inventory("n1", at(0), gpus=2)]
    recs += [job("submitted", f"s{i}", at(i / 10)) for i in range(200)]
    path = tmp_path / "history.jsonl"
    path.write_bytes(jsonl(recs))
    assert main(["ingest", "--quiet", "--warehouse", str(tmp_path / "wh"), str(path)]) == 0
    err = capsys.readouterr().err
    # the facts begin 31 days before the first quartile of the event times (10:04)
    assert ("early: 1 job event and 1 inventory record dated before 2025-12-05 10:04 UTC, "
            "where the facts begin (far before the bulk of the input): they only updated the "
            "books") in err, err
    assert "late:" not in err, err


def test_simulate_into_a_file_says_so(tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    a_file = tmp_path / "f"
    a_file.write_text("x")
    assert main(["simulate", "--out", str(a_file), "--hours", "0.05", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert f"--out {a_file}: File exists (a file is there: --out names a folder)" in err
    assert a_file.read_text() == "x"


def test_compact_of_a_wrong_path_says_so_and_makes_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["compact", "--warehouse", "nowhere"]) == 2
    assert "nothing published here" in capsys.readouterr().err
    a_file = tmp_path / "afile"
    a_file.write_text("x")
    assert main(["compact", "--warehouse", str(a_file)]) == 2
    assert f"{a_file}: a file, not a warehouse folder" in capsys.readouterr().err
    assert main(["compact", "--warehouse", "s3:/typo"]) == 2      # not s3://: a local path
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]   # nothing was made


def test_the_demo_summary_counts_the_alerts_a_failing_webhook_gave_up(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An Alertmanager answering 500: the run's end waits at most 10 s for the queue, and
    the summary line itself says what was given up (it said 0 while close() gave them up
    after it)."""
    import re
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Failing(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(500)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Failing)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/api/v2/alerts"
        started = time.monotonic()
        assert main(["demo", "--hours", "2", "--quiet", "--alert-webhook", url,
                     "--warehouse", str(tmp_path / "wh")]) == 0
        took = time.monotonic() - started
    finally:
        server.shutdown()
        server.server_close()
    out = capsys.readouterr().out
    fired = re.search(r"alerts: (\d+) fired", out)
    hook = re.search(r"webhook: (\d+) event\(s\) delivered in (\d+) POST\(s\), (\d+) failed "
                     r"POST\(s\), (\d+) event\(s\) given up", out)
    assert fired and hook, out
    delivered, posts, failed, given_up = (int(g) for g in hook.groups())
    assert delivered == posts == 0 and failed >= 1 and given_up >= int(fired.group(1)) > 0
    assert took < 60


def test_the_demo_summary_shows_numbers_as_rounded_and_a_closed_pipe_is_quiet(
        tmp_path: Path) -> None:
    """The summary's first table is rounded to one decimal and shows one (it showed
    '26.000' for 26.0); `gpuledger demo | head` ends with status 0 and no traceback (a
    BrokenPipeError traceback)."""
    cmd = [sys.executable, "-m", "gpuledger.cli.main", "demo", "--hours", "0.3", "--quiet",
           "--warehouse", str(tmp_path / "wh")]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    first = done.stdout.split("== Allocation vs use by pool and card type")[1].split("==")[0]
    rows = [line.split() for line in first.splitlines()[3:] if line and line[0] != "("]
    assert rows and all(re.fullmatch(r"-?[\d,]+\.\d", cell) for row in rows for cell in row[2:])
    head = subprocess.Popen([*cmd[:-1], str(tmp_path / "wh2")], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert head.stdout is not None and head.stdout.readline()
    head.stdout.close()
    assert head.wait(timeout=300) == 0
    assert head.stderr is not None and "Traceback" not in head.stderr.read()


def test_kafka_client_errors_are_logged_in_one_line() -> None:
    """kafka-python logs a connection lost in a broker's outage with its traceback, at
    ERROR, though the service recovers by itself: the line says the exception instead."""
    import logging

    from gpuledger.cli.log_setup import client_errors_in_one_line

    try:
        raise ConnectionResetError(104, "Connection reset by peer")
    except ConnectionResetError:
        exc_info = sys.exc_info()
    record = logging.LogRecord("kafka.conn", logging.ERROR, __file__, 1,
                               "Error receiving network data from %s", ("node 1",), exc_info)
    assert client_errors_in_one_line(record)
    text = logging.Formatter("%(levelname)s %(name)s: %(message)s").format(record)
    assert text == ("ERROR kafka.conn: Error receiving network data from node 1 "
                    "(ConnectionResetError: [Errno 104] Connection reset by peer)")
    ours = logging.LogRecord("gpuledger.kafka.service", logging.ERROR, __file__, 1, "x",
                             None, exc_info)
    assert client_errors_in_one_line(ours) and ours.exc_info is exc_info


def test_the_kafka_library_logs_warnings_unless_asked(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """kafka-python's INFO lines (184 of a service instance's 194 in a two-minute run)
    are off by default; GPULEDGER_KAFKA_CLIENT_LOG turns them on, and a bad value is
    refused naming the variable."""
    import logging

    from gpuledger.cli.errors import CliError
    from gpuledger.cli.log_setup import configure

    library = logging.getLogger("kafka")
    monkeypatch.setattr(library, "level", library.level)
    configure(logging.INFO, {})
    assert library.level == logging.WARNING
    configure(logging.INFO, {"GPULEDGER_KAFKA_CLIENT_LOG": "debug"})
    assert library.level == logging.DEBUG
    with pytest.raises(CliError, match="GPULEDGER_KAFKA_CLIENT_LOG: 'loud' is not one of"):
        configure(logging.INFO, {"GPULEDGER_KAFKA_CLIENT_LOG": "loud"})


def test_a_short_step_of_the_kafka_network_loop_is_not_said() -> None:
    """kafka-python warns of a network-loop step over 0.1 s; the service's rebalance
    callback (a checkpoint loaded) is one at every handover: said from 5 s on."""
    import logging

    from gpuledger.cli.log_setup import short_steps_unsaid

    def step(seconds: float) -> logging.LogRecord:
        text = (f"Task <kafka.net.selector.Task object at 0x7f> ran for {seconds:.3f}s "
                "(>0.100s threshold). It is blocking the event loop -- likely a tight sync "
                "loop inside a coroutine. Other pollers will time out.")
        return logging.LogRecord("kafka.net.selector", logging.WARNING, __file__, 1, text,
                                 None, None)

    library = logging.getLogger("kafka")
    level = library.level
    try:
        library.setLevel(logging.WARNING)
        assert not short_steps_unsaid(step(0.522))
        assert short_steps_unsaid(step(7.5))
        other = logging.LogRecord("kafka.net.selector", logging.WARNING, __file__, 1,
                                  "Task %s left RUNNING after step", ("t",), None)
        assert short_steps_unsaid(other)
        library.setLevel(logging.INFO)   # the library's lines asked for: all of them
        assert short_steps_unsaid(step(0.522))
    finally:
        library.setLevel(level)


def test_the_kafka_library_lines_that_repeat_are_said_once_a_minute() -> None:
    """A broker away makes kafka-python say the same lines at each retry (319 in a node
    agent's first minute of an outage): alike lines (numbers aside) once per 60 s, the
    next one counting those not said; other lines, and ours, all."""
    import logging

    from gpuledger.cli.log_setup import ClientRepeats

    now = [0.0]
    repeats = ClientRepeats(clock=lambda: now[0])

    def line(name: str, text: str, *args: object) -> logging.LogRecord:
        return logging.LogRecord(name, logging.WARNING, __file__, 1, text, args, None)

    library = logging.getLogger("kafka")
    level = library.level
    try:
        library.setLevel(logging.WARNING)
        said = []
        for i in range(130):          # a retry every half second for 65 s
            now[0] = i * 0.5
            for record in (line("kafka.net.manager", "waiting %.2f secs", 0.1 + i / 100),
                           line("gpuledger.agent.sender", "delivery failed")):
                if repeats.filter(record):
                    said.append((now[0], record.name, record.getMessage()))
        ours = [s for s in said if s[1].startswith("gpuledger")]
        theirs = [s for s in said if s[1].startswith("kafka")]
        assert len(ours) == 130
        assert theirs == [(0.0, "kafka.net.manager", "waiting 0.10 secs"),
                          (60.0, "kafka.net.manager",
                           "waiting 1.30 secs (and 119 more like it in the last 60 s)")]
        assert repeats.filter(line("kafka.net.manager", "something else"))
        library.setLevel(logging.DEBUG)   # the library's lines asked for: all of them
        assert repeats.filter(line("kafka.net.manager", "waiting %.2f secs", 9.0))
    finally:
        library.setLevel(level)


def test_the_kafka_library_lines_are_held_back_while_it_connects() -> None:
    """What the client logs while the service first connects is held back (a WARNING
    and two ERRORs each try), and its first line is the reason the error gives."""
    import logging

    from gpuledger.pipeline.kafka.client import first_reason, held_back_client_lines

    seen: list[str] = []

    class Seen(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    root, library = logging.getLogger(), logging.getLogger("kafka")
    handler, level = Seen(), library.level
    root.addHandler(handler)
    library.setLevel(logging.WARNING)
    try:
        with held_back_client_lines() as held:
            logging.getLogger("kafka.net.manager").error("Connection failed: %s", "refused")
            logging.getLogger("kafka.net.manager").info("Attempting bootstrap")
            logging.getLogger("gpuledger.kafka.service").warning("ours")
        logging.getLogger("kafka.net.manager").warning("after")
        assert held == ["Connection failed: refused"]
        assert first_reason(held) == "first: Connection failed: refused"
        assert seen == ["ours", "after"]
        library.setLevel(logging.INFO)   # asked for: printed as they come
        with held_back_client_lines() as held:
            logging.getLogger("kafka.net.manager").warning("shown")
        assert held == [] and seen[-1] == "shown" and first_reason(held) == ""
    finally:
        root.removeHandler(handler)
        library.setLevel(level)


def test_group_and_instance_ids_kafka_allows_stay_allowed() -> None:
    """Ids in use keep working: only a path (or no name) is refused."""
    from gpuledger.cli.arguments import file_name_part

    parse = file_name_part("--group", "the group's checkpoint folder")
    for text in ("gpuledger-processor", "team:gpu ledger", "prod.eu_1", "h100-node-7.example",
                 "é" * 10, "x" * 249):
        assert parse(text) == text


def test_sql_typed_without_quotes_is_told_to_be_quoted(
        capsys: pytest.CaptureFixture[str]) -> None:
    """`gpuledger query select * from gpu_minute` left argparse saying 'unrecognized
    arguments' under the top level's usage; the query command now says it, with the
    fix."""
    with pytest.raises(SystemExit) as ended:
        main(["query", "select", "count(*)", "from", "gpu_minute"])
    assert ended.value.code == 2
    err = capsys.readouterr().err
    assert "usage: gpuledger query" in err
    assert ("gpuledger query: error: unrecognized arguments: count(*) from gpu_minute; "
            "the SQL is one argument: quote it") in err
    with pytest.raises(SystemExit):  # another command's stray word: its own usage
        main(["demo", "--hours", "1", "extra"])
    err = capsys.readouterr().err
    assert "usage: gpuledger demo" in err
    assert err.rstrip().endswith("gpuledger demo: error: unrecognized arguments: extra")


def test_every_reader_takes_the_warehouse_from_the_environment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """docs/configuration.md: a command that reads or writes a warehouse falls back to
    GPULEDGER_WAREHOUSE__URL. ``whatif`` and ``diagnose`` did not (they read
    ./warehouse: "not a gpuledger warehouse")."""
    wh = tmp_path / "wh"
    assert main(["demo", "--hours", "0.5", "--interval", "60", "--warehouse", str(wh),
                 "--quiet"]) == 0
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    monkeypatch.setenv("GPULEDGER_WAREHOUSE__URL", str(wh))
    capsys.readouterr()
    for command in (["query", "SELECT count(*) AS n FROM attempts"], ["report"],
                    ["whatif", "--policy", "fgd", "--quiet"], ["diagnose", "--dry-run"],
                    ["compact", "--force"]):
        assert main(command) == 0, (command, capsys.readouterr().err)
        out, err = capsys.readouterr()
        assert "not a gpuledger warehouse" not in err and out, (command, err)
    assert list(elsewhere.iterdir()) == []


def test_an_interrupted_simulate_leaves_the_last_runs_files(tmp_path: Path) -> None:
    """Found by interrupting a run: ``simulate`` opened its three files for writing
    first, so a run stopped part way (Ctrl-C, a bad spec found while simulating) left them
    empty, the run before's lines gone. They are written beside and renamed at the end."""
    import signal

    out = tmp_path / "out"
    assert main(["simulate", "--out", str(out), "--hours", "0.05", "--quiet"]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert sorted(before) == ["inventory.jsonl", "job.jsonl", "telemetry.jsonl"]
    assert all(before.values())
    proc = subprocess.Popen([sys.executable, "-m", "gpuledger.cli.main", "simulate", "--out",
                             str(out), "--hours", "48", "--quiet"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not any(p.name.startswith(".") for p in out.iterdir()):  # writing has begun
        assert time.monotonic() < deadline and proc.poll() is None, proc.stderr
        time.sleep(0.05)
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and err.endswith("gpuledger: interrupted\n"), err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


@pytest.mark.parametrize("name", ["w[1]", "w?x", "w*"])
def test_a_location_duckdb_would_read_as_a_pattern_is_refused(
        name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Found by naming a warehouse 'w[1]' beside another 'w1': DuckDB reads the file
    lists of the views as patterns, and the query read the other warehouse's files (a
    permission error stopped it there; with no such sibling, none). Such a location is
    refused before anything is made, for the writers as for the readers."""
    where = tmp_path / name
    for command in (["demo", "--hours", "0.1", "--quiet"],
                    ["query", "SELECT 1"], [ "import", "pods", str(tmp_path / "p.csv")]):
        (tmp_path / "p.csv").write_text("name,created,gpus\np,2026-01-05T00:00:00Z,1\n")
        assert main([*command, "--warehouse", str(where)]) == 2, command
        err = capsys.readouterr().err
        assert err.endswith(": the location holds '*', '?' or '[': DuckDB reads such names as "
                            "patterns, so the facts written there could not be read back (a "
                            "query read another warehouse's files, or none); use a location "
                            "without them\n"), err
        assert not where.exists()
    assert main(["query", "--warehouse", "s3://bucket/w[1]", "SELECT 1"]) == 2
    assert "s3://bucket/w[1]: the location holds" in capsys.readouterr().err


CONTROL_WHY = ("a warehouse location cannot hold control characters (a newline, a tab, "
               "…: the views over its facts could not be built); use one without them\n")


@pytest.mark.parametrize("name", ["r_nl\nwh", "tab\there", "del\x7f", "cr\r"])
def test_a_location_with_a_control_character_is_refused_by_every_command(
        name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Found with `ingest --warehouse $'r_nl\\nwh'`: the facts were written, then building
    the views failed with a traceback (duckdb ParserException), exit 1, and no reader
    could read that warehouse. Refused in one line now, before anything is made, by the
    writers and the readers alike, saying only that (it told of facts written and an
    ingest's traceback, though nothing had been written)."""
    where = tmp_path / name
    (tmp_path / "p.csv").write_text("name,created,gpus\np,2026-01-05T00:00:00Z,1\n")
    (tmp_path / "j.jsonl").write_text("")
    for command in (["ingest", str(tmp_path / "j.jsonl")],
                    ["demo", "--hours", "0.1", "--quiet"],
                    ["import", "pods", str(tmp_path / "p.csv")],
                    ["query", "SELECT 1"], ["report"], ["compact", "--quiet"],
                    ["diagnose", "--quiet"]):
        assert main([*command, "--warehouse", str(where)]) == 2, command
        err = capsys.readouterr().err
        assert err == f"gpuledger: error: {str(where)!r}: {CONTROL_WHY}", (command, err)
        assert not where.exists()
    # an S3 prefix too: urlsplit drops tabs and newlines, which named another prefix
    assert main(["query", "--warehouse", "s3://key:secret@bucket/a\nb", "SELECT 1"]) == 2
    assert capsys.readouterr().err == f"gpuledger: error: 's3://bucket/a\\nb': {CONTROL_WHY}"


@pytest.mark.parametrize(("location", "said"), [
    ("s3://wh//b", "an empty part in the prefix ('//')"),
    ("s3://wh/a/../a", "'.' and '..' are not folders in an S3 prefix"),
    ("s3://wh/./z", "'.' and '..' are not folders in an S3 prefix"),
    ("s3://WH/c", "bucket names are lower case (S3 has no bucket 'WH'); write s3://wh/c"),
])
def test_s3_locations_s3_cannot_hold_are_refused_before_anything(
        location: str, said: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Found on a real S3 server: '//' gave a traceback from ingest, demo and the
    imports (ArrowInvalid: empty path component); '.' and '..' were normalised away
    and the request's signature refused, which read as wrong credentials; an upper-case
    bucket was lower-cased in silence, into another bucket. Refused at once now, before
    any request."""
    (tmp_path / "j.jsonl").write_text("")
    for command in (["ingest", str(tmp_path / "j.jsonl")], ["query", "SELECT 1"],
                    ["demo", "--hours", "0.1", "--quiet"]):
        assert main([*command, "--warehouse", location]) == 2, command
        err = capsys.readouterr().err
        assert said in err and err.count("\n") == 1, err


_LOAD_INTERRUPTED = """
import importlib.abc, sys
class Interrupt(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "gpuledger.cli.main":
            raise KeyboardInterrupt   # Ctrl-C while the command's modules load
        return None
sys.meta_path.insert(0, Interrupt())
from gpuledger.cli.entry import main
sys.exit(main())
"""


def test_ctrl_c_while_the_command_loads_is_one_line() -> None:
    """The console script is gpuledger.cli.entry: a Ctrl-C while the command's modules
    load is one line and exit 130 (with the script pointing at gpuledger.cli.main, the
    interrupt came in the middle of the import, outside main's guard: a traceback)."""
    import tomllib

    project = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    assert project["project"]["scripts"]["gpuledger"] == "gpuledger.cli.entry:main"
    proc = subprocess.run([sys.executable, "-c", _LOAD_INTERRUPTED], capture_output=True,
                          text=True, timeout=60)
    assert (proc.returncode, proc.stderr) == (130, "gpuledger: interrupted\n")


@pytest.mark.parametrize(("env", "said"), [
    ({"AWS_ENDPOINT_URL": "127.0.0.1:39123"},
     "AWS_ENDPOINT_URL: give the scheme, http:// or https://, got '127.0.0.1:39123'"),
    ({"AWS_ENDPOINT_URL": "http://127.0.0.1:39123/sub/path"},
     "AWS_ENDPOINT_URL: a path, query or fragment after the host is not served"),
    ({"AWS_ENDPOINT_URL": "http://127.0.0.1:39123", "AWS_REGION": "us\neast-1"},
     "AWS_REGION: not a region name, got 'us\\neast-1' (such as us-east-1)"),
])
def test_s3_settings_that_cannot_be_right_are_said_before_any_request(
        env: dict[str, str], said: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Found on a real S3 server: an endpoint without a scheme was taken for https (an
    SSL error against a plain-http server), a path after the host was dropped in
    silence, and a region with a newline read as 'A region must be set'."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "a")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "b")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert main(["query", "--warehouse", "s3://bucket/wh", "SELECT 1"]) == 2
    err = capsys.readouterr().err
    assert said in err and err.count("\n") == 1, err


def test_a_long_s3_error_is_cut_at_a_word() -> None:
    """The S3 SDK's long errors were cut mid-word ('…; Deta')."""
    from gpuledger.pipeline.store import _cut

    text = ("When getting information for key 'p' in bucket 'b': AWS Error "
            "NETWORK_CONNECTION during HeadObject operation: curlCode: 6; Details: more")
    assert _cut(text, 500) == text
    assert _cut(text, 100) == ("When getting information for key 'p' in bucket 'b': AWS "
                               "Error NETWORK_CONNECTION during HeadObject…")
    assert len(_cut("x" * 300, 240)) == 240
