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
from gpuledger.pipeline.alerts.model import Alert
from gpuledger.pipeline.alerts.sinks import ListSink


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


def test_kafka_service_shards_give_the_embedded_alerts_and_metrics(tmp_path: Path,
                                                                   kafka: object) -> None:
    """The exporter and the alert engine follow every shard of `gpuledger process`; the
    shards together raise exactly the alerts of one processor on the embedded bus."""
    import uuid

    from prometheus_client.parser import text_string_to_metric_families as parse
    from test_simulate import SMALL

    from gpuledger.pipeline.config import ProcessorConfig
    from gpuledger.pipeline.demo import run_demo
    from gpuledger.pipeline.kafka.producer import KafkaSink
    from gpuledger.pipeline.kafka.service import KafkaProcessorService, ServiceOptions
    from gpuledger.pipeline.kafka.settings import KafkaSettings, Topics
    from gpuledger.pipeline.kafka.topics import create_topics
    from gpuledger.pipeline.ops import OpsSurface
    from gpuledger.pipeline.simulate import SimConfig, parse_cluster, simulate

    sim = SimConfig(hours=2.0, seed=5, sample_interval_s=60, cluster=parse_cluster(SMALL))
    config = ProcessorConfig()
    embedded = OpsSurface(config, "127.0.0.1:0", alerts=True)
    assert embedded.engine is not None
    embedded_events = ListSink()  # the surface itself only counts them
    embedded.engine.sinks.append(embedded_events)
    run_demo(sim, config, tmp_path / "embedded", on_processor=embedded.follow)

    settings = KafkaSettings(bootstrap=kafka.bootstrap,  # type: ignore[attr-defined]
                             topics=Topics().prefixed(f"o{uuid.uuid4().hex[:8]}."))
    create_topics(settings, telemetry_partitions=3)
    sink = KafkaSink(settings)
    for batch in simulate(sim):
        sink.publish_batch(batch)
    sink.close()
    service = KafkaProcessorService(settings, config, tmp_path / "kafka",
                                    ServiceOptions(group_id="ops", exit_when_idle_s=2.0))
    ops = OpsSurface(config, "127.0.0.1:0", None, settings)
    ops.follow_service(service)
    assert ops.engine is not None
    ops_events = ListSink()
    ops.engine.sinks.append(ops_events)
    try:
        service.run()
    finally:
        service.close()
    try:
        assert len(service.held) == 3

        def key(e: Alert) -> tuple[object, ...]:
            return (e.name, e.job_id, e.attempt, e.status, e.starts_at, e.ends_at)

        want = sorted(map(key, embedded_events.events), key=str)
        assert want, "the simulation should raise some alerts"
        assert sorted(map(key, ops_events.events), key=str) == want
        assert ops.tally.fired == embedded.tally.fired
        assert ops.kafka_sink is not None and ops.kafka_sink.sent == len(want)

        def gpus(surface: OpsSurface) -> float:
            assert surface.exporter is not None
            return sum(s.value for f in parse(surface.exporter.render().decode())
                       if f.name == "gpuledger_gpus" for s in f.samples)

        assert gpus(ops) == gpus(embedded) > 0

        def records(surface: OpsSurface) -> dict[str, float]:
            assert surface.exporter is not None
            return {s.labels["record_type"]: s.value
                    for f in parse(surface.exporter.render().decode())
                    if f.name == "gpuledger_records" for s in f.samples}

        # every shard reads all job and inventory events: counted once, not three times
        assert records(ops) == records(embedded)
    finally:
        ops.close()
        embedded.close()
