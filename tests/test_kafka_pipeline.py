"""The pipeline on a real Kafka broker (KRaft, started by the harness).

Each test uses its own topic prefix, so tests share one broker per session.
"""

from __future__ import annotations

import dataclasses
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
import types
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from fact_views import assert_same_facts
from kafka import KafkaConsumer, KafkaProducer
from kafka_broker import Broker
from kafka_fixtures import topic_messages
from polars.testing import assert_frame_equal
from test_simulate import SMALL
from test_wire_decode import damaged_views

from gpuledger.pipeline.advisor.diagnosis_batch import SORT as DIAGNOSIS_SORT
from gpuledger.pipeline.config import ProcessorConfig
from gpuledger.pipeline.demo import run_demo
from gpuledger.pipeline.kafka.producer import KafkaSink
from gpuledger.pipeline.kafka.service import KafkaProcessorService, ServiceOptions
from gpuledger.pipeline.kafka.settings import KafkaSettings, Topics, load_settings
from gpuledger.pipeline.kafka.topics import create_topics
from gpuledger.pipeline.kafka.wire import ARROW, JSONL, encode, ipc_stream
from gpuledger.pipeline.partitions import partition_of
from gpuledger.pipeline.simulate import SimConfig, parse_cluster, simulate
from gpuledger.pipeline.warehouse import read_table

HOURS = 1.0
# Views this short run may leave empty.
SPARSE = ("blocked_minute", "preemptions", "candidates")


def _sim() -> SimConfig:
    return SimConfig(hours=HOURS, seed=5, cluster=parse_cluster(SMALL))


def _settings(kafka: Broker) -> KafkaSettings:
    prefix = f"t{uuid.uuid4().hex[:8]}."
    return KafkaSettings(bootstrap=kafka.bootstrap, topics=Topics().prefixed(prefix))


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same simulation processed on the embedded bus."""
    root = tmp_path_factory.mktemp("embedded")
    run_demo(_sim(), ProcessorConfig(), root)
    return root


def _publish(settings: KafkaSettings, fmt: bytes = ARROW, sim: SimConfig | None = None) -> int:
    create_topics(settings, telemetry_partitions=4)
    sink = KafkaSink(settings, fmt=fmt)
    for batch in simulate(sim or _sim()):
        sink.publish_batch(batch)
    sink.close()
    return sink.messages


def _process(settings: KafkaSettings, root: Path, group: str = "g") -> KafkaProcessorService:
    service = KafkaProcessorService(settings, ProcessorConfig(), root,
                                    ServiceOptions(group_id=group, exit_when_idle_s=2.0,
                                                   checkpoint_interval_s=1.0))
    try:
        service.run()
    finally:
        service.close()
    return service


def _process_cmd(kafka: Broker, settings: KafkaSettings, root: Path, group: str,
                 *extra: str) -> list[str]:
    """The `gpuledger process` command line for a test's topics."""
    prefix = settings.topics.telemetry.split("gpu.telemetry.v1")[0]
    return [sys.executable, "-m", "gpuledger.cli.main", "process", "--kafka", kafka.bootstrap,
            "--topic-prefix", prefix, "--warehouse", str(root), "--group", group, *extra]


def test_no_topics_or_no_broker_is_one_line(kafka: Broker, tmp_path: Path) -> None:
    """Topics that do not exist, and a broker that cannot be reached, stop the service
    with one line and exit status 2 (tracebacks before: RuntimeError, and
    KafkaTimeoutError after 30 s, still so with the alerts on until 2026-12-05)."""
    missing = [sys.executable, "-m", "gpuledger.cli.main", "process", "--kafka",
               kafka.bootstrap, "--topic-prefix", f"none{uuid.uuid4().hex[:6]}.",
               "--warehouse", str(tmp_path / "a"), "--group", "g", "--no-alerts"]
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]   # nothing listens there once closed
    # alerts on (the default): the alerts topic is made first, and that was a traceback
    gone = [sys.executable, "-m", "gpuledger.cli.main", "process", "--kafka",
            f"127.0.0.1:{port}", "--warehouse", str(tmp_path / "b"), "--group", "g"]
    demo = [sys.executable, "-m", "gpuledger.cli.main", "demo", "--kafka",
            f"127.0.0.1:{port}", "--hours", "0.1", "--warehouse", str(tmp_path / "c"),
            "--quiet"]                  # a traceback too, from making the topics
    # making the topics, alone and before a feed: "cannot create topics on …" after the
    # library's 14 lines (the feed's), now as the others
    topics = [sys.executable, "-m", "gpuledger.cli.main", "topics", "create", "--kafka",
              f"127.0.0.1:{port}"]
    feed = [sys.executable, "-m", "gpuledger.cli.main", "feed", "--kafka",
            f"127.0.0.1:{port}", "--hours", "0.1", "--quiet"]
    runs = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for c in (missing, gone, demo, topics, feed)]   # side by side: 30 s each
    outs = [r.communicate(timeout=120) for r in runs]
    for r, (_out, err) in zip(runs, outs, strict=True):
        assert r.returncode == 2, err[-2000:]
        assert "Traceback" not in err, err[-2000:]
    assert outs[0][1].strip().splitlines()[-1].startswith(
        "gpuledger: error: topic none"), outs[0][1][-500:]
    assert "does not exist on" in outs[0][1] and "gpuledger topics create" in outs[0][1]
    for _out, err in outs[1:]:
        last = err.strip().splitlines()[-1]
        assert last.startswith(
            f"gpuledger: error: cannot reach Kafka at 127.0.0.1:{port} ("), err[-500:]
        # the client's first failure is the reason; its own lines (14 of them: a WARNING
        # and two ERRORs a try) are held back
        assert "; first: " in last and "ECONNREFUSED" in last, last
        assert not [line for line in err.splitlines() if " kafka." in line], err[-2000:]
    assert f"connecting to Kafka at 127.0.0.1:{port}" in outs[1][1]
    assert not (tmp_path / "c").exists()


def test_a_prefix_of_no_topics_creates_nothing(kafka: Broker, tmp_path: Path) -> None:
    """A typo'd --topic-prefix with the alerts on was refused ("topic … does not exist")
    after the alerts topic had been created under it: the input topics are checked
    before anything is made."""
    from kafka import KafkaAdminClient

    prefix = f"nosuch{uuid.uuid4().hex[:6]}."
    done = subprocess.run([sys.executable, "-m", "gpuledger.cli.main", "process", "--kafka",
                           kafka.bootstrap, "--topic-prefix", prefix, "--warehouse",
                           str(tmp_path / "wh"), "--group", "g"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"gpuledger: error: topic {prefix}gpu.telemetry.v1 does not "
                           "exist on") and "gpuledger topics create" in last, last
    admin = KafkaAdminClient(bootstrap_servers=kafka.bootstrap)
    try:
        made = [t for t in admin.list_topics() if t.startswith(prefix)]
    finally:
        admin.close()
    assert made == []


def test_the_kafka_demo_gives_the_embedded_demos_facts_and_diagnosis(
        kafka: Broker, tmp_path: Path) -> None:
    """`gpuledger demo --kafka` end to end, as the README's Kafka stack runs it: the facts
    the embedded demo writes, and the diagnosis of idle and inefficient GPU-time too (the
    Kafka demo wrote no job_diagnosis: the recommendations had no diagnosis)."""
    demo = [sys.executable, "-m", "gpuledger.cli.main", "demo", "--hours", "1", "--seed",
            "5", "--quiet"]
    through = subprocess.run([*demo, "--kafka", kafka.bootstrap, "--topic-prefix",
                              f"d{uuid.uuid4().hex[:8]}.", "--warehouse", str(tmp_path / "k")],
                             capture_output=True, text=True, timeout=300, check=False)
    assert through.returncode == 0, through.stderr[-2000:]
    embedded = subprocess.run([*demo, "--warehouse", str(tmp_path / "e")],
                              capture_output=True, text=True, timeout=300, check=False)
    assert embedded.returncode == 0, embedded.stderr[-2000:]
    for run in (through, embedded):
        assert "warning" not in run.stderr and "Traceback" not in run.stderr, run.stderr
    assert_same_facts(tmp_path / "k", tmp_path / "e", SPARSE)
    got, want = (read_table(tmp_path / w, "job_diagnosis").sort(DIAGNOSIS_SORT)
                 for w in ("k", "e"))
    assert want.height > 0 and set(want["pattern"]) - {"unknown"}
    assert_frame_equal(got, want, check_exact=False, rel_tol=1e-9, abs_tol=1e-8)


def test_topics_a_broker_made_on_first_use_are_unfit_and_said(kafka: Broker) -> None:
    """A broker with auto.create.topics.enable (compose's used to be) made the topics an
    agent published to before `topics create` ran: one partition, the broker's 7-day
    retention, no compaction. `topics create` said only "exists, with 1 partitions" and
    exited 0, and inventory was deleted after a week. It now says each unfit
    configuration with the command that fixes it, and exits 2; once fixed, 0."""

    from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient, NewTopic

    settings = _settings(kafka)
    t = settings.topics
    admin = KafkaAdminClient(bootstrap_servers=kafka.bootstrap)
    try:   # what auto-creation makes: the broker's defaults
        admin.create_topics([NewTopic(t.telemetry, 1, 1), NewTopic(t.inventory, 1, 1),
                             NewTopic(t.jobs, 3, 1, topic_configs={"retention.ms": "3600000"})])
        prefix = t.telemetry.split("gpu.telemetry.v1")[0]
        cmd = [sys.executable, "-m", "gpuledger.cli.main", "topics", "create", "--kafka",
               kafka.bootstrap, "--topic-prefix", prefix]
        said = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert said.returncode == 2, said.stdout + said.stderr
        lines = dict(x.split(": ", 1) for x in said.stdout.splitlines())
        inventory = lines[t.inventory]
        assert "UNFIT for gpuledger: cleanup.policy=delete (gpuledger's: compact)" in inventory
        assert (f"kafka-configs.sh --bootstrap-server {kafka.bootstrap} --alter --entity-type "
                f"topics --entity-name {t.inventory} --add-config cleanup.policy=compact,"
                "retention.ms=-1") in inventory
        assert "delete the topic and run `gpuledger topics create` again" in inventory
        # one hour of scheduler events where gpuledger keeps 7 days: unfit
        assert "UNFIT for gpuledger: retention.ms=3600000 (1 h; gpuledger's: 604800000, " \
            "7 days)" in lines[t.jobs]
        # telemetry: another count (said, as before) and a longer retention (a note)
        telemetry = lines[t.telemetry]
        assert telemetry.startswith("exists, with 1 partitions (not 12: ")
        assert "retention.ms=604800000 (7 days; gpuledger's: 86400000, 1 day)" in telemetry
        assert "UNFIT" not in telemetry
        assert lines[t.dead_letters] == "created"
        last = said.stderr.strip().splitlines()[-1]
        assert last.startswith("gpuledger: error: 2 existing topic(s) unfit for gpuledger: ")
        assert t.inventory in last and t.jobs in last and "Traceback" not in said.stderr
        # the fix it gives, applied: nothing unfit is left
        admin.alter_configs([
            ConfigResource(ConfigResourceType.TOPIC, t.inventory,
                           {"cleanup.policy": "compact", "retention.ms": "-1"}),
            ConfigResource(ConfigResourceType.TOPIC, t.jobs, {"retention.ms": "604800000"})])
        again = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert again.returncode == 0, again.stdout + again.stderr
        assert "UNFIT" not in again.stdout and f"{t.jobs}: exists\n" in again.stdout
        assert f"{t.inventory}: exists, with 1 partitions (not 3: " in again.stdout
    finally:
        admin.close()


def test_topics_help_names_every_topic_and_a_refusal_is_one_line(kafka: Broker) -> None:
    """`topics --help` named 4 of the 6 topics it creates; `--replication 3` on one broker
    printed kafka-python's request dump cut at 200 characters, without the reason."""
    from gpuledger.pipeline.kafka.settings import KafkaSettings
    from gpuledger.pipeline.kafka.topics import topic_specs

    helped = subprocess.run([sys.executable, "-m", "gpuledger.cli.main", "topics", "--help"],
                            capture_output=True, text=True, timeout=60)
    text = " ".join(helped.stdout.split())
    for spec in topic_specs(KafkaSettings(bootstrap="k:9092")):
        assert spec.name in text, spec.name
    prefix = f"r{uuid.uuid4().hex[:8]}."
    refused = subprocess.run([sys.executable, "-m", "gpuledger.cli.main", "topics", "create",
                              "--kafka", kafka.bootstrap, "--topic-prefix", prefix,
                              "--replication", "3"], capture_output=True, text=True,
                             timeout=120)
    assert refused.returncode == 2 and refused.stdout == ""
    [line] = refused.stderr.strip().splitlines()
    assert line.startswith("gpuledger: error: Kafka refused the request (InvalidReplication"
                           f"FactorError: topic {prefix}gpu.telemetry.v1: "), line
    # the broker's own reason (Kafka 4: "…The target replication factor of 3 cannot be
    # reached because only 1 broker(s) are registered…"), not the request's dump
    assert "replication factor of 3" in line and "Request" not in line, line


def test_topics_are_created_once(kafka: Broker) -> None:
    settings = _settings(kafka)
    first = create_topics(settings, telemetry_partitions=4)
    assert set(first.values()) == {"created"}
    assert set(create_topics(settings, telemetry_partitions=4).values()) == {"exists"}
    # asked for another count, the existing topic is left as it is, and said so
    again = create_topics(settings)
    assert again.pop(settings.topics.telemetry).startswith(
        "exists, with 4 partitions (not 12: an existing topic is left as it is")
    assert set(again.values()) == {"exists"}
    consumer = KafkaConsumer(bootstrap_servers=kafka.bootstrap)
    try:
        assert consumer.partitions_for_topic(settings.topics.telemetry) == {0, 1, 2, 3}
    finally:
        consumer.close()


@pytest.mark.parametrize("fmt", [ARROW, JSONL], ids=["arrow", "jsonl"])
def test_kafka_gives_the_same_facts_as_the_embedded_bus(
    kafka: Broker, reference: Path, tmp_path: Path, fmt: bytes,
) -> None:
    settings = _settings(kafka)
    assert _publish(settings, fmt) > 0
    service = _process(settings, tmp_path / "wh")
    assert service.counters().late_telemetry == 0
    assert sorted(service.held) == [0, 1, 2, 3]
    assert_same_facts(tmp_path / "wh", reference, SPARSE)


def test_polls_bounded_by_samples_give_the_same_facts(kafka: Broker, tmp_path: Path) -> None:
    """A poll takes about ``max_poll_samples`` samples, counted by the last poll's samples
    per message, however long the backlog; the facts do not depend on the batches."""
    settings = _settings(kafka)
    # a message per node and minute: many more than a first poll takes (the simulation
    # differs with its chunks: the reference is the same one on the embedded bus)
    sim = dataclasses.replace(_sim(), chunk_minutes=1)
    _publish(settings, sim=sim)
    run_demo(sim, ProcessorConfig(), tmp_path / "embedded")
    bound = 2_000
    service = KafkaProcessorService(settings, ProcessorConfig(), tmp_path / "wh",
                                    ServiceOptions(group_id="small-polls", exit_when_idle_s=2.0,
                                                   max_poll_samples=bound))
    polls: list[tuple[int, int, int]] = []  # messages allowed, messages taken, samples
    poll, handle = service._poll_telemetry, service._handle

    def counted_poll() -> dict[Any, list[Any]]:
        allowed = service.poll_size()
        records = poll()
        if records:
            polls.append((allowed, sum(len(r) for r in records.values()), 0))
        return records

    def counted_handle(by_topic: dict[str, list[Any]], telemetry: bool) -> int:
        before = service.counters().records_in.get("telemetry", 0)
        n = handle(by_topic, telemetry)
        if telemetry:
            allowed, taken, _ = polls[-1]
            polls[-1] = (allowed, taken,
                         service.counters().records_in["telemetry"] - before)
        return n

    service._poll_telemetry = counted_poll  # type: ignore[method-assign]
    service._handle = counted_handle  # type: ignore[method-assign]
    try:
        service.run()
    finally:
        service.close()
    samples = sum(s for _a, _t, s in polls)
    assert samples == service.counters().records_in["telemetry"] > 10 * bound
    assert polls[0][0] == 500  # nothing known yet
    assert all(taken <= allowed for allowed, taken, _s in polls)
    assert max(s for _a, _t, s in polls[1:]) <= 2 * bound, polls
    assert len(polls) >= samples // (2 * bound)
    assert_same_facts(tmp_path / "wh", tmp_path / "embedded", SPARSE)


def test_malformed_messages_go_to_dead_letters_and_the_rest_goes_through(
    kafka: Broker, reference: Path, tmp_path: Path,
) -> None:
    settings = _settings(kafka)
    _publish(settings)
    t = settings.topics
    producer = KafkaProducer(bootstrap_servers=kafka.bootstrap)
    bad_json = b'{"v":1,"type":"job","time":"2026-01-05T00:30:00Z","event":"exploded","job_id":"x"}'
    producer.send(t.jobs, key=b"x", value=b"{not json\n" + bad_json + b"\n")
    producer.send(t.telemetry, key=b"h100-001", value=b"\x00\x01garbage",
                  headers=[("gpuledger-format", ARROW), ("gpuledger-type", b"telemetry")])
    # Arrow that Arrow's own validation passes and Polars crashed the process on (the view
    # of a null string pointing outside its buffers), at every restart
    sample = next(iter(simulate(_sim())))["telemetry"].filter(pl.col("node") == "h100-001")
    producer.send(t.telemetry, key=b"h100-001", value=damaged_views(sample.head(4)),
                  headers=[("gpuledger-format", ARROW), ("gpuledger-type", b"telemetry")])
    producer.send(t.telemetry, key=b"h100-001", value=b"whatever",
                  headers=[("gpuledger-format", b"protobuf-v9")])
    # tombstones (null values: how a compacted topic forgets a key) hold no record; they
    # crashed every instance on every restart
    for topic, key in ((t.telemetry, b"h100-001"), (t.inventory, b"h100-001"),
                       (t.jobs, b"x"), (t.attempt_parts, b"p001")):
        producer.send(topic, key=key, value=None)
    # attempt parts that are not: the owner crashed on them, and so did every owner after
    producer.send(t.attempt_parts, key=b"p001", value=b"\x00garbage not arrow")
    producer.send(t.attempt_parts, key=b"p001",
                  value=ipc_stream(pl.DataFrame({"job_id": [1]}), "uncompressed"))
    # a node's samples (a copy of what it sent) on another node's partition: one instance
    # holding both kept them, two dropped them; a dead letter now, whatever the instances
    home = partition_of("h100-001", 4)
    first = next(iter(simulate(_sim())))["telemetry"].filter(pl.col("node") == "h100-001")
    producer.send(t.telemetry, key=b"h100-001", partition=(home + 1) % 4,
                  value=encode(first, "telemetry"),
                  headers=[("gpuledger-format", ARROW), ("gpuledger-type", b"telemetry")])
    producer.flush()
    producer.close()
    service = _process(settings, tmp_path / "wh")
    assert service.stats.dead_letters == 8
    dead = topic_messages(kafka.bootstrap, t.dead_letters)
    assert len(dead) == 8
    reasons = sorted(dict(m.headers)["reason"].decode() for m in dead)
    assert any(f"came on partition {(home + 1) % 4}; its node's partition is {home}" in r
               for r in reasons)
    assert sum(r.startswith("not attempt parts (") for r in reasons) == 2
    assert any("malformed JSON" in r for r in reasons)
    assert any("'exploded'" in r for r in reasons)
    assert any("unreadable Arrow IPC" in r for r in reasons)
    assert any("a string view points outside its buffers" in r for r in reasons)
    assert any("unknown gpuledger-format" in r for r in reasons)
    for m in dead:
        h = dict(m.headers)
        assert h["source-topic"].decode() in (t.jobs, t.telemetry, t.attempt_parts)
        assert int(h["source-offset"]) >= 0
    assert b"{not json" in [m.value for m in dead]
    assert_same_facts(tmp_path / "wh", reference, SPARSE)


def test_sigkill_at_random_points_loses_and_doubles_nothing(
    kafka: Broker, reference: Path, tmp_path: Path,
) -> None:
    settings = _settings(kafka)
    _publish(settings)
    root = tmp_path / "wh"
    cmd = _process_cmd(kafka, settings, root, "crashy", "--instance-id", "crashy-1",
                       "--checkpoint-interval", "0.3", "--exit-when-idle", "3")
    rng = random.Random(7)
    kills = 0
    log = open(tmp_path / "service.log", "wb")  # noqa: SIM115 - closed below
    try:
        while kills < 10:
            proc = subprocess.Popen(cmd, stdout=log, stderr=log)
            time.sleep(rng.uniform(1.0, 3.5))  # from start-up to mid-stream
            if proc.poll() is not None:
                break  # it finished before the kill
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            kills += 1
        final = subprocess.run(cmd, stdout=log, stderr=log, timeout=300)
        assert final.returncode == 0
    finally:
        log.close()
    assert kills == 10, (tmp_path / "service.log").read_text()[-2000:]
    assert_same_facts(root, reference, SPARSE)


def test_sigterm_checkpoints_and_a_restart_finishes_the_job(
    kafka: Broker, reference: Path, tmp_path: Path,
) -> None:
    settings = _settings(kafka)
    _publish(settings)
    root = tmp_path / "wh"
    base = _process_cmd(kafka, settings, root, "polite")
    proc = subprocess.Popen(base, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    time.sleep(6)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out.decode()[-2000:]
    # the log says it stopped, with what it held (it ended at "then stopping")
    assert "stopped: partial hours written and checkpointed (partitions [0, 1, 2, 3]" \
        in out.decode(), out.decode()[-2000:]
    names = sorted(p.name for p in (root / "state" / "polite").iterdir())
    assert [n for n in names if n.startswith("partition-")] == sorted(
        f"partition-p{p:03d}{end}" for p in range(4) for end in (".checkpoint", ""))
    for p in range(4):  # each section's frames of open hours, in its frames files
        assert list((root / "state" / "polite" / f"partition-p{p:03d}").glob("hours-*.frames"))
    assert len([n for n in names if n.startswith("global-")]) == 1, names
    done = subprocess.run([*base, "--exit-when-idle", "3"], capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert_same_facts(root, reference, SPARSE)


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-512"])
def test_sasl_and_credentials_never_logged(kafka: Broker, tmp_path: Path,
                                           mechanism: str) -> None:
    if kafka.sasl_bootstrap is None:
        pytest.skip("the external broker has no SASL listener configured")
    user, password = next(iter(kafka.users.items()))
    secret_file = tmp_path / "password"
    secret_file.write_text(password + "\n")
    prefix = f"s{uuid.uuid4().hex[:8]}."
    env = {**os.environ, "GPULEDGER_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
           "GPULEDGER_KAFKA_SASL_MECHANISM": mechanism,
           "GPULEDGER_KAFKA_SASL_USERNAME": user,
           "GPULEDGER_KAFKA_SASL_PASSWORD_FILE": str(secret_file)}
    settings = load_settings(kafka.sasl_bootstrap, {**env, "GPULEDGER_KAFKA_TOPIC_PREFIX": prefix})
    assert password not in repr(settings) and password not in str(settings)
    created = subprocess.run(
        [sys.executable, "-m", "gpuledger.cli.main", "topics", "create", "--kafka",
         kafka.sasl_bootstrap, "--topic-prefix", prefix, "--telemetry-partitions", "2"],
        env=env, capture_output=True, text=True, timeout=120)
    assert created.returncode == 0, created.stderr[-2000:]
    assert "created" in created.stdout
    sink = KafkaSink(settings)
    for batch, _ in zip(simulate(SimConfig(hours=0.2, cluster=parse_cluster(SMALL))), range(2),
                        strict=False):
        sink.publish_batch(batch)
    sink.close()
    done = subprocess.run(
        [sys.executable, "-m", "gpuledger.cli.main", "process", "--kafka",
         kafka.sasl_bootstrap, "--topic-prefix", prefix, "--warehouse", str(tmp_path / "wh"),
         "--exit-when-idle", "2"],
        env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    logs = done.stdout + done.stderr + created.stdout + created.stderr
    assert "messages=" in logs or "flushing" in logs      # it did log, verbosely
    assert password not in logs
    gm = read_table(tmp_path / "wh", "gpu_minute")
    assert gm.height > 0
    bad_env = {**env, "GPULEDGER_KAFKA_SASL_PASSWORD_FILE": str(tmp_path / "nope")}
    refused = subprocess.run(
        [sys.executable, "-m", "gpuledger.cli.main", "topics", "create", "--kafka",
         kafka.sasl_bootstrap, "--topic-prefix", prefix],
        env=bad_env, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2
    assert f"GPULEDGER_KAFKA_SASL_PASSWORD_FILE: {tmp_path / 'nope'}: no such file" \
        in refused.stderr


def test_the_progress_line_gives_the_current_rate_and_quietens_when_idle(
        kafka: Broker, tmp_path: Path, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The progress line's rate was the lifetime average (an idle service's "(94/s)"
    fell slowly), and an idle service said the same line every 10 s: now the rate is of
    the messages since the last line, and nothing changing is said every sixth interval."""
    from gpuledger.pipeline.kafka import service as service_module

    settings = _settings(kafka)
    create_topics(settings, telemetry_partitions=4)
    service = KafkaProcessorService(settings, ProcessorConfig(), tmp_path / "wh",
                                    ServiceOptions(group_id="progress", log_interval_s=10.0))
    clock = [1000.0]
    # the service module's clock only (the client's threads keep the real one)
    monkeypatch.setattr(service_module, "time", types.SimpleNamespace(
        monotonic=lambda: clock[0], time=time.time, sleep=time.sleep))
    try:
        service._last_log = clock[0]
        with caplog.at_level("INFO", logger="gpuledger.kafka.service"):
            service.stats.messages = 500
            # rejected records (dead letters', and samples of GPUs no inventory knows that
            # the processor refused): the line said dead letters and late samples only
            service.engine.counters.add_rejects("telemetry", 7)
            for step in range(1, 14):          # 500 messages in the first 10 s, then none
                clock[0] = 1000.0 + 10.0 * step
                service._log_progress()
        lines = [r.getMessage() for r in caplog.records if "messages=" in r.getMessage()]
        assert [re.search(r"messages=(\d+) \((\d+)/s\)", line).groups()  # type: ignore[union-attr]
                for line in lines] == [("500", "50"), ("500", "0"), ("500", "0")]
        assert all(" rejected=7 " in line for line in lines), lines
    finally:
        service.close()


def test_the_service_refuses_hours_another_writer_wrote_and_goes_on_after_earlier_ones(
    kafka: Broker, tmp_path: Path,
) -> None:
    """`gpuledger ingest` of the records, then the service over the same records from
    Kafka: it wrote every fact a second time beside the ingest's (gpu_minute rows
    doubled), saying nothing. It refuses in one line, exit 2, writing no fact. After an
    ingest of EARLIER hours the service goes on as before."""
    from gpuledger.cli.main import main
    from gpuledger.pipeline.simulate import simulate, write_jsonl

    settings = _settings(kafka)
    _publish(settings)
    same = tmp_path / "same"
    write_jsonl(simulate(_sim()), tmp_path / "records")
    assert main(["ingest", *map(str, sorted((tmp_path / "records").glob("*.jsonl"))),
                 "--warehouse", str(same), "--quiet"]) == 0
    before = {p: p.read_bytes() for p in same.rglob("*") if p.is_file()
              and "state" not in p.relative_to(same).parts}
    done = subprocess.run([*_process_cmd(kafka, settings, same, "g", "--exit-when-idle", "2",
                                         "--no-alerts")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("gpuledger: error: the warehouse") and \
        "already holds facts in the hours this service's input covers" in last, last
    assert "Traceback" not in done.stderr
    after = {p: p.read_bytes() for p in same.rglob("*") if p.is_file()
             and "state" not in p.relative_to(same).parts}
    assert {p for p in after if p.suffix == ".parquet"} == \
        {p for p in before if p.suffix == ".parquet"}

    # an ingest of the day before: the service's hours hold no fact of another writer
    earlier = tmp_path / "earlier"
    day_before = dataclasses.replace(_sim(), start=_sim().start - timedelta(days=1))
    write_jsonl(simulate(day_before), tmp_path / "before")
    assert main(["ingest", *map(str, sorted((tmp_path / "before").glob("*.jsonl"))),
                 "--warehouse", str(earlier), "--quiet"]) == 0
    _process(settings, earlier, group="after-history")
    minutes = read_table(earlier, "gpu_minute")["minute"]
    assert minutes.min() < _sim().start <= minutes.max()

    # an instance killed after writing facts and before its first checkpoint (a
    # probe's random kill -9 met it): its restart was refused its own hours. The group
    # marks that it passed the check before its first fact; a restart is not checked
    group = earlier / "state" / "after-history"
    assert (group / "writing").is_file()
    for path in group.rglob("*"):
        if path.is_file() and path.name not in ("writing", "deployment.id"):
            path.unlink()
    _process(settings, earlier, group="after-history")


def test_the_progress_lines_samples_are_what_this_process_read(
        kafka: Broker, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """`samples=` was the engine's counter, restored from the checkpoint it resumed from
    (its own, or another instance's after a rebalance), plus what it read: after kill -9
    and a restart it said 751,172 for 621,360 samples of input. It counts what this
    process read."""
    settings = _settings(kafka)
    _publish(settings)
    root = tmp_path / "wh"
    first = _process(settings, root, group="count")
    read = first.counters().records_in["telemetry"]
    assert read > 0
    again = KafkaProcessorService(settings, ProcessorConfig(), root,
                                  ServiceOptions(group_id="count", log_interval_s=0.0))
    try:
        assert again.counters().records_in["telemetry"] == read   # from the checkpoint
        with caplog.at_level("INFO", logger="gpuledger.kafka.service"):
            again._log_progress()
        lines = [r.getMessage() for r in caplog.records if "samples=" in r.getMessage()]
        assert lines and all(" samples=0 " in line for line in lines), lines
    finally:
        again.close()
    assert first.stats.samples == read   # a fresh group: what it read, all of it
