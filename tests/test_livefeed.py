"""`gpuledger feed`: pacing on the wall clock, and a real broker receiving what the
simulator produced, processed into the same facts as the embedded bus."""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import polars as pl
import pytest
from kafka_broker import Broker
from kafka_fixtures import kafka, topic_values  # noqa: F401

from gpuledger.cli.main import main
from gpuledger.contract.schema import JOB_END_EVENTS
from gpuledger.pipeline.config import ProcessorConfig
from gpuledger.pipeline.kafka.service import KafkaProcessorService, ServiceOptions
from gpuledger.pipeline.kafka.settings import KafkaSettings, Topics
from gpuledger.pipeline.livefeed import episodes as episodes_module
from gpuledger.pipeline.livefeed.command import simulated_start
from gpuledger.pipeline.livefeed.episodes import Minute, episodes
from gpuledger.pipeline.livefeed.pacing import feed
from gpuledger.pipeline.processor import Processor
from gpuledger.pipeline.simulate import SimConfig
from gpuledger.pipeline.warehouse import Warehouse


def test_pacing_starts_at_the_first_batch() -> None:
    """The first batch goes out at once (planning came before it), batch i i·chunk/speed
    later: a slow first batch does not turn into a burst of the next ones."""
    stamps: list[float] = []

    def slow_start() -> Iterator[int]:
        time.sleep(0.3)  # planning
        yield from range(4)

    t0 = time.monotonic()
    n = feed(slow_start(), lambda _b: stamps.append(time.monotonic() - t0), chunk_s=60.0,
             speed=600.0)  # one simulated minute every 0.1 s
    assert n == 4
    first = stamps[0]
    assert first >= 0.3
    for i, t in enumerate(stamps):
        assert t >= first + i * 0.1 - 1e-3
    assert [b - a for a, b in itertools.pairwise(stamps)] == pytest.approx([0.1] * 3, abs=0.08)


def test_a_batch_waits_for_the_wall_clock_to_pass_its_minutes() -> None:
    """At any speed, a batch is published only once the wall clock has passed its end."""
    wall = [1000.0]
    mono = [0.0]
    log: list[tuple[int, float]] = []

    def sleep(s: float) -> None:
        wall[0] += s
        mono[0] += s

    ends = [1000.0 + 60 * (i + 1) for i in range(5)]  # minute i ends then
    n = feed(range(5), lambda b: log.append((b, wall[0])), chunk_s=60.0, speed=30.0,
             clock=lambda: mono[0], sleep=sleep, not_before=lambda b: ends[b],
             wall=lambda: wall[0])
    assert n == 5
    for b, at in log:
        assert at >= ends[b]  # never ahead of the wall clock
        assert at == pytest.approx(ends[b], abs=0.3)  # and no later than needed


@pytest.mark.parametrize(("hours", "speed"), [(168.0, 30.0), (0.1, 360.0), (24.0, 1.0),
                                             (2.0, 0.5)])
def test_the_simulated_clock_never_passes_the_wall_clock(hours: float, speed: float) -> None:
    """With the start `gpuledger feed` picks, every minute's end has passed on the wall
    clock when pacing alone would publish it: nothing is ahead, nothing has to wait."""
    now = datetime(2026, 3, 1, 12, 34, 56, tzinfo=UTC)
    start = simulated_start(now, hours, speed)
    assert start.second == 0 and start.microsecond == 0 and start < now
    minutes = round(hours * 60)
    for i in range(minutes):
        end = start + timedelta(minutes=i + 1)
        paced = now + timedelta(seconds=i * 60 / speed)
        assert end <= paced, (i, end, paced)
    if speed > 1:  # and it ends close to the wall clock, not needlessly far back
        last = start + timedelta(minutes=minutes)
        assert now + timedelta(seconds=(minutes - 1) * 60 / speed) - last < timedelta(minutes=2)


def test_episodes_are_planned_one_day_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """A week is not planned before its first minute: only the day before (for the
    history the first minute carries) and the first day are."""
    planned: list[SimConfig] = []
    real = episodes_module.simulate

    def spy(config: SimConfig, **kw: int) -> Iterator[dict[str, pl.DataFrame]]:
        planned.append(config)
        return real(config, **kw)

    monkeypatch.setattr(episodes_module, "simulate", spy)
    start = datetime(2026, 1, 5, tzinfo=UTC)
    it = episodes(SimConfig(start=start, hours=168, chunk_minutes=1, sample_interval_s=60))
    first = next(it)
    assert [(c.start, c.hours) for c in planned] == [(start - timedelta(days=1), 24.0),
                                                    (start, 24.0)]
    assert first.end == start + timedelta(minutes=1)
    assert first.batch["inventory"].height > 0


def test_episodes_follow_each_other_with_new_ids_and_end_open_jobs(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Three short episodes: job ids never collide, every job open at an episode's end is
    cancelled at the next one's start before its jobs start, and the processor takes the
    whole stream without a reject or an out-of-order event."""
    monkeypatch.setattr(episodes_module, "EPISODE_HOURS", 0.25)
    start = datetime(2026, 1, 5, tzinfo=UTC)
    sim = SimConfig(start=start, hours=0.75, chunk_minutes=1, sample_interval_s=60)
    minutes = list(episodes(sim))
    assert len(minutes) == 45
    assert [m.end for m in minutes] == [start + timedelta(minutes=i + 1) for i in range(45)]
    jobs = pl.concat([m.batch["job"] for m in minutes])
    assert jobs["time"].is_sorted()
    k0 = episodes_module.episode_of(start)
    episode = (jobs["job_id"].cast(pl.Int64) // episodes_module.JOB_ID_STEP) - 1 - k0
    edges = [start + timedelta(minutes=15 * k) for k in range(3)]
    for k in range(3):
        mine = jobs.filter(episode == k)
        assert mine.height > 0
        assert mine["time"].min() >= edges[k]  # type: ignore[operator]
    for k in (1, 2):
        closing = jobs.filter(pl.col("reason") == episodes_module.END_REASON)
        closing = closing.filter(pl.col("time") == edges[k])
        earlier = jobs.filter(episode == k - 1)
        last = earlier.group_by("job_id", maintain_order=True).last()
        assert last.filter(~pl.col("event").is_in(list(JOB_END_EVENTS))).height == 0
        assert closing.height > 0 and set(closing["event"]) == {"cancelled"}
        # the closing events come first in the next episode's first minute
        first_minute = minutes[15 * k].batch["job"]
        assert first_minute.head(closing.height)["reason"].to_list() == \
            [episodes_module.END_REASON] * closing.height
    telemetry_ids = pl.concat([m.batch["telemetry"] for m in minutes[30:]]).select(
        pl.col("processes").list.eval(pl.element().struct.field("job_id")).explode()
    ).drop_nulls()["processes"]
    assert telemetry_ids.len() > 0
    assert (telemetry_ids.cast(pl.Int64) >= (k0 + 3) * episodes_module.JOB_ID_STEP).all()
    proc = Processor(ProcessorConfig(), Warehouse(tmp_path / "wh"))
    for m in minutes:
        proc.process(m.batch)
    proc.flush()
    c = proc.counters
    assert c.rejected == {} and c.out_of_order_job_events == 0 and c.late_job_events == 0
    assert c.records_in["job"] == jobs.height


def _open_jobs_after(minutes: list[Minute], tmp: Path) -> tuple[set[str], Processor]:
    proc = Processor(ProcessorConfig(), Warehouse(tmp))
    for m in minutes:
        proc.process(m.batch)
    proc.flush()
    return {i for i, j in proc.jobs.jobs.items() if j.status != "ended"}, proc


def test_a_restarted_feed_goes_on_with_the_same_timeline(monkeypatch: pytest.MonkeyPatch,
                                                         tmp_path: Path) -> None:
    """compose restarts the feed: the new run continues the timeline of the one before
    (no job id of it reused for another job), and its first minute ends the jobs that
    ended while no feed ran, so none is left running for ever: the processor rejects
    nothing and holds the jobs open that an uninterrupted feed leaves open."""
    monkeypatch.setattr(episodes_module, "EPISODE_HOURS", 0.25)
    t = datetime(2026, 1, 5, 0, 5, tzinfo=UTC)

    def run(start: datetime, minutes: int) -> list[Minute]:
        return list(episodes(SimConfig(start=start, hours=minutes / 60, chunk_minutes=1,
                                       sample_interval_s=60)))

    before = run(t, 7)  # stopped at 00:12; down over an episode's end (00:15)
    after = run(t + timedelta(minutes=17), 18)  # 00:22 to 00:40, over the next one's
    whole = run(t, 35)
    assert after[0].replayed > 0
    # the same minutes, the same records (sequence numbers too), but the history
    for a, w in zip(after, whole[17:], strict=True):
        assert a.end == w.end
        assert a.batch["telemetry"].equals(w.batch["telemetry"])
        assert a.batch["job"].tail(w.batch["job"].height).equals(w.batch["job"])
    expected, _ = _open_jobs_after(whole, tmp_path / "whole")
    assert expected
    got, proc = _open_jobs_after(before + after, tmp_path / "restarted")
    c = proc.counters
    assert c.rejected == {} and c.out_of_order_job_events == 0
    assert c.duplicate_job_events > 0  # what the first run had sent, sent again
    assert got == expected
    # a first run (the processor never saw the timeline) takes its history as well
    fresh, proc = _open_jobs_after(after, tmp_path / "fresh")
    assert proc.counters.rejected == {} and proc.counters.out_of_order_job_events == 0
    assert fresh == expected


def test_stop_is_honoured_while_waiting() -> None:
    flag = threading.Event()
    threading.Timer(0.3, flag.set).start()
    t0 = time.monotonic()
    n = feed(range(100), lambda _b: None, chunk_s=60.0, speed=60.0, stop=flag.is_set)
    assert n == 1  # the first at once, then a minute's wait, cut short
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
    # the built-in cluster: 576 GPUs, one sample per 30 s, for 6 minutes (the timeline
    # is the time of day's: a node may be down in them)
    assert 576 * 10 <= counts["telemetry"] <= 576 * 12
    assert counts["inventory"] > 0 and counts["job"] > 0


def test_feed_cli_errors(capsys: pytest.CaptureFixture[str],
                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPULEDGER_KAFKA_BOOTSTRAP", raising=False)
    assert main(["feed"]) == 2
    assert "GPULEDGER_KAFKA_BOOTSTRAP" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["feed", "--kafka", "x:1", "--speed", "0"])


def test_feed_waits_through_a_broker_outage_and_loses_no_minute(
        kafka: Broker, monkeypatch: pytest.MonkeyPatch,  # noqa: F811
        capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> None:
    """The broker is down for longer than the producer's delivery timeout: kafka-python
    expired the queued minutes, and the feed went on without them and said nothing (two
    minutes and four job events lost in a probe's 170 s outage). Now the producer keeps
    them: the feed says the outage once and its end once, and every minute arrives."""
    import pyarrow as pa

    from gpuledger.pipeline.livefeed import command

    if not kafka.managed:
        pytest.skip("broker from GPULEDGER_TEST_KAFKA_BOOTSTRAP: not ours to stop")
    # the old default (2 min) scaled down: 3 s would expire what the outage holds
    monkeypatch.setattr(command, "PRODUCER_OPTIONS", {
        **command.PRODUCER_OPTIONS, "request_timeout_ms": 1000,
        "reconnect_backoff_max_ms": 300, "linger_ms": 0})
    monkeypatch.setattr(command, "UNCONFIRMED_S", 1.0)
    prefix = f"o{uuid.uuid4().hex[:8]}."
    # 20 simulated minutes at 120x: one every 0.5 s
    args = ["feed", "--kafka", kafka.bootstrap, "--topic-prefix", prefix, "--hours",
            str(20 / 60), "--speed", "120", "--interval", "60"]

    # the broker is started again from this thread: the death signal setpriv ties to the
    # thread that starts it would stop it as the thread ends (the fixture stops it)
    import kafka_broker
    monkeypatch.setattr(kafka_broker, "_pdeathsig_prefix", list)

    def outage() -> None:
        time.sleep(3.0)
        kafka.stop_process()
        try:
            time.sleep(8.0)
        finally:
            kafka.start_again(timeout_s=90)

    thread = threading.Thread(target=outage)
    thread.start()
    try:
        assert main(args) == 0
    finally:
        thread.join(timeout=120)
    assert "published 20 minute batches" in capsys.readouterr().out
    said = [r.getMessage() for r in caplog.records if r.name == "gpuledger.feed"
            and r.levelname == "WARNING"]
    assert sum("has confirmed nothing for" in m for m in said) == 1, said
    assert sum("Kafka confirms again" in m for m in said) == 1, said
    topic = Topics().prefixed(prefix).telemetry
    values = topic_values(kafka.bootstrap, topic)
    minutes: set[datetime] = set()
    for v in values:
        times = pa.ipc.open_stream(v).read_all().column("time").to_pylist()
        minutes.update(t.replace(second=0) for t in times)
    assert len(minutes) == 20  # every minute arrived
