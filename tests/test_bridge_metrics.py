"""A bridge's /metrics (``--metrics-address``): what Prometheus needs to see it down or
gone (GpuledgerBridgeDown/Absent), over a real socket."""

from __future__ import annotations

from pathlib import Path

import pytest
from http_client import get
from prometheus_client.parser import text_string_to_metric_families

from gpuledger.bridges.metrics import serve
from gpuledger.cli.main import main


def test_metrics_follow_the_counters_and_parse_as_prometheus_text() -> None:
    counts = {"polls": 3, "failed_polls": 1, "records": 40}
    server = serve("127.0.0.1:0", "slurm", lambda: dict(counts))
    try:
        counts["polls"] = 4
        status, text = get(server.port, "/metrics")
        assert status == 200
        values = {(s.name, tuple(sorted(s.labels.items()))): s.value
                  for fam in text_string_to_metric_families(text) for s in fam.samples}
        assert values[("gpuledger_bridge_info", (("scheduler", "slurm"),))] == 1
        assert values[("gpuledger_bridge_polls_total", ())] == 4
        assert values[("gpuledger_bridge_failed_polls_total", ())] == 1
        assert values[("gpuledger_bridge_records_total", ())] == 40
        assert get(server.port, "/healthz")[0] == 200
        assert get(server.port, "/")[0] == 404
    finally:
        server.close()


def test_a_bad_metrics_address_is_a_one_line_error(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bridge", "slurm", "--out", str(tmp_path / "out.jsonl"), "--state",
                 str(tmp_path / "state"), "--once", "--metrics-address", "nowhere"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--metrics-address: 'nowhere': expected HOST:PORT" in err
