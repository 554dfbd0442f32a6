"""`gpuledger feed`: pacing on the wall clock, and a real broker receiving what the
simulator produced, processed into the same facts as the embedded bus."""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path

import pytest
from kafka_broker import Broker
from kafka_fixtures import kafka  # noqa: F401

from gpuledger.cli.main import main
from gpuledger.pipeline.config import ProcessorConfig
from gpuledger.pipeline.kafka.service import KafkaProcessorService, ServiceOptions
from gpuledger.pipeline.kafka.settings import KafkaSettings, Topics
from gpuledger.pipeline.livefeed.pacing import feed


def test_batches_are_published_when_their_minute_has_passed() -> None:
    stamps: list[float] = []
    t0 = time.monotonic()
    n = feed(range(4), lambda _b: stamps.append(time.monotonic() - t0), chunk_s=60.0,
             speed=600.0)  # one simulated minute every 0.1 s
    assert n == 4
    for i, t in enumerate(stamps):
        assert t >= (i + 1) * 0.1 - 1e-3
    assert stamps[-1] < 0.4 + 0.3


def test_stop_is_honoured_while_waiting() -> None:
    flag = threading.Event()
    threading.Timer(0.3, flag.set).start()
    t0 = time.monotonic()
    n = feed(range(100), lambda _b: None, chunk_s=60.0, speed=60.0, stop=flag.is_set)
    assert n == 0
    assert time.monotonic() - t0 < 0.8


def test_bad_pace_is_refused() -> None:
    with pytest.raises(ValueError, match="must be > 0"):
        feed([], lambda _b: None, chunk_s=60.0, speed=0.0)


def test_feed_reaches_the_processor_through_kafka(kafka: Broker, tmp_path: Path,  # noqa: F811
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    prefix = f"f{uuid.uuid4().hex[:8]}."
    # 6 simulated minutes at 360x: about one second
    assert main(["feed", "--kafka", kafka.bootstrap, "--topic-prefix", prefix, "--hours", "0.1",
                 "--speed", "360", "--interval", "30", "--quiet"]) == 0
    assert "published 6 minute batches" in capsys.readouterr().out
    settings = KafkaSettings(bootstrap=kafka.bootstrap, topics=Topics().prefixed(prefix))
    service = KafkaProcessorService(settings, ProcessorConfig(), tmp_path / "wh",
                                    ServiceOptions(group_id="feed-test", exit_when_idle_s=2.0,
                                                   checkpoint_interval_s=1.0))
    try:
        service.run()
    finally:
        service.close()
    counts = service.counters().records_in
    # the built-in cluster: 576 GPUs, one sample per 30 s, for 6 minutes
    assert counts["telemetry"] == 576 * 12
    assert counts["inventory"] > 0 and counts["job"] > 0


def test_feed_cli_errors(capsys: pytest.CaptureFixture[str],
                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPULEDGER_KAFKA_BOOTSTRAP", raising=False)
    assert main(["feed"]) == 2
    assert "GPULEDGER_KAFKA_BOOTSTRAP" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["feed", "--kafka", "x:1", "--speed", "0"])
