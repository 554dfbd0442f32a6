"""``gpuledger demo --metrics-address --alert-webhook``: the ops surface on the command
line (a real process, a real HTTP scrape, a real webhook receiver)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families
from prometheus_server import free_port
from test_alert_engine import Receiver

from gpuledger.cli.main import main


def test_demo_serves_metrics_and_posts_alerts(tmp_path: Path) -> None:
    receiver = Receiver()
    port = free_port()
    cmd = [sys.executable, "-m", "gpuledger.cli.main", "demo", "--hours", "2", "--interval",
           "60", "--seed", "3", "--warehouse", str(tmp_path / "wh"), "--quiet",
           "--metrics-address", f"127.0.0.1:{port}", "--alert-webhook", receiver.url]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        assert proc.stderr is not None
        lines: list[str] = []
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            line = proc.stderr.readline()
            lines.append(line)
            if "until interrupted" in line or proc.poll() is not None:
                break
        assert any("until interrupted" in x for x in lines), lines
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            text = r.read().decode()
        names = {f.name for f in text_string_to_metric_families(text)}
        assert {"gpuledger_gpus", "gpuledger_allocated_gpus", "gpuledger_fragmentation_ratio",
                "gpuledger_queue_wait_seconds", "gpuledger_records"} <= names
        minute = [line for line in text.splitlines()
                  if line.startswith("gpuledger_facts_minute_timestamp_seconds ")]
        assert minute and float(minute[0].split()[1]) > 0
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
        assert proc.returncode == 0
        summary = [x for x in out.splitlines() if x.startswith("alerts: ")]
        assert summary, out
        fired = int(summary[0].split()[1])
        assert fired > 0
        posted = [a for _, _, body in receiver.posts for a in body if "endsAt" not in a]
        assert len({(a["labels"]["alertname"], a["labels"]["job_id"]) for a in posted}) == fired
    finally:
        if proc.poll() is None:
            proc.kill()
        receiver.close()


def test_bad_metrics_address_and_kafka_demo_are_usage_errors(capsys: object) -> None:
    assert main(["demo", "--metrics-address", "nowhere", "--hours", "0.1"]) == 2
    assert main(["demo", "--metrics-address", "127.0.0.1:0", "--kafka", "127.0.0.1:9",
                 "--hours", "0.1"]) == 2
