"""``gpuledger agent`` end to end: the fake NVML driver under the real bindings, Slurm
attribution on a temporary proc root, and a real Kafka broker; the processor turns what
arrives into facts."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from fake_nvml import MIB, Scenario, fake_nvml_lib, nvml_env  # noqa: F401 (a fixture)
from http_client import metric as read_metric
from kafka import KafkaConsumer
from kafka_broker import Broker
from proctree import add_process

from gpuledger.agent.spool import Spool
from gpuledger.pipeline.config import ProcessorConfig
from gpuledger.pipeline.kafka.wire import Message, decode
from gpuledger.pipeline.processor import Processor
from gpuledger.pipeline.warehouse import Warehouse, read_table

NODE = "gpu-e2e-01"
GPUS = 8
JOB_A, JOB_B = "101", "202"   # GPUs 0-3 run job A (cgroup), 4-6 job B (environment)
NO_TEMP = 5                   # a GPU whose temperature is NOT_SUPPORTED
# GPU 7: no process, no activity (free)


def _scenario(tmp_path: Path, lost_at: int | None = None) -> Path:
    sc = Scenario(gpus=GPUS)
    for i in range(GPUS):
        procs = f"{1000 + i}:{(2000 + 100 * i) * MIB}" if i < 7 else "-"
        values: dict[str, object] = {
            "name": "NVIDIA H100 80GB HBM3", "uuid": f"GPU-{i:08d}-0000-4000-8000-000000000000",
            "util_gpu": 10 + 11 * i if i < 7 else 0, "util_mem": 5, "mem_total": 81559 * MIB,
            "mem_used": (1000 + 997 * i) * MIB, "power": 100_000 + 1000 * i, "temp": 40 + i,
            "clock_sm": 1400, "pcie_tx": 1000, "pcie_rx": 2000, "nvlinks": 18,
            "processes": procs}
        if i == NO_TEMP:
            del values["temp"]
        sc.set(f"g{i}", **values)
    if lost_at is not None:
        sc.at(lost_at, "g3", "lost", 1)                   # GPU 3 falls off the bus
    return sc.write(tmp_path / "scenario.txt")


def _proc_root(tmp_path: Path) -> Path:
    proc = tmp_path / "proc"
    add_process(proc, 1, 0)
    add_process(proc, 900, 1, cgroup="0::/user.slice", environ={"SLURM_JOB_ID": JOB_B})
    for i in range(7):
        if i < 4:
            add_process(proc, 1000 + i, 1,
                        cgroup=f"0::/system.slice/slurmstepd.scope/job_{JOB_A}/step_0/task_0")
        else:
            add_process(proc, 1000 + i, 900, cgroup="0::/user.slice", environ={})
    return proc


def _config(tmp_path: Path, **extra: Any) -> Path:
    cfg: dict[str, Any] = {
        "node": NODE, "source": "nvml", "interval_s": 0.25,
        "attribution": {"methods": ["slurm"], "proc_root": str(_proc_root(tmp_path)),
                        "cgroup_root": str(tmp_path / "cgroup"),
                        "slurm": {"job_id": "slurm-{id}"}},
        "inventory": {"pool": "train", "labels": {"rack": "r7"}},
        "spool": {"path": str(tmp_path / "spool")},
        "metrics": {"listen": "127.0.0.1:0"},
    }
    cfg.update(extra)
    path = tmp_path / "agent.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _agent_cmd(config: Path, *more: str) -> list[str]:
    return [sys.executable, "-m", "gpuledger.cli.main", "agent", "--config", str(config), *more]


def _expected_job(i: int) -> str | None:
    return f"slurm-{JOB_A}" if i < 4 else f"slurm-{JOB_B}" if i < 7 else None


def test_once_prints_attributed_samples_and_inventory(tmp_path: Path,
                                                      fake_nvml_lib: Path) -> None:  # noqa: F811
    env = nvml_env(fake_nvml_lib, _scenario(tmp_path))
    done = subprocess.run(_agent_cmd(_config(tmp_path), "--once"), env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    tel = {r["gpu_index"]: r for r in out["telemetry"]}
    assert sorted(tel) == list(range(GPUS))
    assert [r["seq"] for r in out["telemetry"]] == list(range(GPUS))
    for i, rec in tel.items():
        want = [] if i == 7 else [(1000 + i, 2000.0 + 100 * i, _expected_job(i))]
        assert [(p["pid"], p["used_mib"], p["job_id"]) for p in rec["processes"]] == want
        assert rec["util_gpu"] == (10 + 11 * i if i < 7 else 0) and rec["node"] == NODE
    assert "temp_c" not in tel[NO_TEMP] and tel[0]["temp_c"] == 40   # omitted, not faked
    inv = out["inventory"]
    assert (inv["node"], inv["pool"], inv["gpu_count"], inv["gpu_mem_mib"]) == (
        NODE, "train", GPUS, 81559.0)
    assert inv["labels"]["rack"] == "r7" and inv["health"] == "ok"
    assert not (tmp_path / "spool").exists()                  # --once spools nothing


def test_no_driver_is_a_clear_start_up_error(tmp_path: Path,
                                             fake_nvml_lib: Path) -> None:  # noqa: F811
    env = nvml_env(fake_nvml_lib, None)                        # the driver is not loaded
    env["GPULEDGER_AGENT__KAFKA__BOOTSTRAP"] = "127.0.0.1:9"
    for more in (["--once"], []):
        done = subprocess.run(_agent_cmd(_config(tmp_path), *more), env=env,
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 2, done.stderr
        assert "source nvml:" in done.stderr and "driver" in done.stderr
        assert "Traceback" not in done.stderr


def test_bad_configuration_exits_2_naming_the_key(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("interval_s: 10\nattribution: {methods: [slurm, pbs]}\n")
    done = subprocess.run(_agent_cmd(path, "--once"), capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2
    assert "configuration: attribution.methods[1]: 'pbs'" in done.stderr
    env = {**os.environ, "GPULEDGER_AGENT__KAFKA__BOOTSTRAP": ""}
    env.pop("GPULEDGER_KAFKA_BOOTSTRAP", None)
    good = tmp_path / "good.yaml"
    good.write_text(f"spool: {{path: {tmp_path / 'sp'}}}\n")
    done = subprocess.run(_agent_cmd(good), env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2 and "kafka: no Kafka bootstrap" in done.stderr
    # the agent has no --kafka flag: the error names what it does have
    assert "--kafka" not in done.stderr, done.stderr
    assert "set kafka.bootstrap in the agent configuration" in done.stderr
    env["GPULEDGER_AGENT__KAFKA__BOOTSTRAP"] = "127.0.0.1:9"
    env["GPULEDGER_KAFKA_SECURITY_PROTOCOL"] = "TLS"
    done = subprocess.run(_agent_cmd(good), env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().endswith("is not one of PLAINTEXT, SASL_PLAINTEXT, "
                                        "SASL_SSL, SSL"), done.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])



def _run_agent(config: Path, env: dict[str, str], port: int, min_sent: int,
               metric: str = "gpuledger_agent_sent_messages_total") -> None:
    """Start the agent, wait until ``metric`` reaches ``min_sent``, SIGTERM it."""
    proc = subprocess.Popen(_agent_cmd(config), env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while read_metric(port, metric) < min_sent:
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < deadline, "the agent sent too little in 60 s"
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
        assert "Traceback" not in err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _consume(broker: Broker, topic: str, lines: int) -> list[Message]:
    """Read the topic from the start until it has given ``lines`` records (or 60 s)."""
    consumer = KafkaConsumer(topic, bootstrap_servers=broker.bootstrap,
                             auto_offset_reset="earliest", enable_auto_commit=False)
    out: list[Message] = []
    try:
        deadline = time.monotonic() + 60
        while sum(m.value.count(b"\n") for m in out) < lines and time.monotonic() < deadline:
            for batch in consumer.poll(timeout_ms=500).values():
                out += [Message(m.topic, m.partition, m.offset, m.key, m.value,
                                tuple((k, v) for k, v in (m.headers or [])))
                        for m in batch]
        time.sleep(1.0)                                # anything beyond what is expected?
        for batch in consumer.poll(timeout_ms=1000).values():
            out += [Message(m.topic, m.partition, m.offset, m.key, m.value) for m in batch]
        return out
    finally:
        consumer.close()


@pytest.mark.slow
def test_agent_streams_into_kafka_and_the_processor_makes_facts(
        tmp_path: Path, kafka: Broker, fake_nvml_lib: Path) -> None:  # noqa: F811
    prefix = f"e2e{uuid.uuid4().hex[:8]}."
    tel_topic, inv_topic = prefix + "gpu.telemetry.v1", prefix + "gpu.inventory.v1"
    kafka.create_topic(tel_topic, partitions=3)
    kafka.create_topic(inv_topic, partitions=1)
    port = _free_port()
    config = _config(tmp_path, kafka={"bootstrap": kafka.bootstrap, "topic_prefix": prefix,
                                      "send_timeout_s": 5},
                     metrics={"listen": f"127.0.0.1:{port}"})
    env = nvml_env(fake_nvml_lib, _scenario(tmp_path))
    _run_agent(config, env, port, min_sent=6)
    _run_agent(config, env, port, min_sent=4)                 # a restart continues the numbering
    spool = Spool(tmp_path / "spool")
    assert spool.backlog == 0                                  # everything was confirmed
    total = int((tmp_path / "spool" / "agent.seq").read_text())

    messages = _consume(kafka, tel_topic, total)
    assert {m.key for m in messages} == {NODE.encode()}
    records = [json.loads(line) for m in messages for line in m.value.splitlines()]
    assert sorted(r["seq"] for r in records) == list(range(total))   # each once, no gap
    assert total >= 8 * GPUS
    for rec in records:
        want = [] if rec["gpu_index"] == 7 else [_expected_job(rec["gpu_index"])]
        assert [p["job_id"] for p in rec["processes"]] == want
    inv_messages = _consume(kafka, inv_topic, 2)
    inventory = [json.loads(m.value) for m in inv_messages]
    assert len(inventory) == 2                                 # once per start, unchanged
    assert {(r["node"], r["pool"], r["gpu_count"]) for r in inventory} == {(NODE, "train", 8)}

    decoded = decode(messages, "telemetry")
    assert decoded.dead_letters.height == 0
    inv_decoded = decode(inv_messages, "inventory")
    processor = Processor(ProcessorConfig(), Warehouse(tmp_path / "wh"))
    processor.process({"telemetry": decoded.frames["telemetry"],
                       "inventory": inv_decoded.frames["inventory"]})
    processor.flush()
    import polars as pl

    facts = read_table(tmp_path / "wh", "gpu_minute")
    assert set(facts["node"].to_list()) == {NODE}
    assert sorted(set(facts["gpu_index"].to_list())) == list(range(GPUS))
    # no scheduler events were sent: GPUs with processes are use outside the scheduler
    states = dict(facts.group_by("gpu_index").agg(pl.col("state").first()).iter_rows())
    assert states[7] == "free"
    assert {states[i] for i in range(7)} == {"unaccounted_use"}


@pytest.mark.slow
def test_a_gpu_lost_mid_run_changes_the_inventory(
        tmp_path: Path, kafka: Broker, fake_nvml_lib: Path) -> None:  # noqa: F811
    prefix = f"lost{uuid.uuid4().hex[:8]}."
    tel_topic, inv_topic = prefix + "gpu.telemetry.v1", prefix + "gpu.inventory.v1"
    kafka.create_topic(tel_topic)
    kafka.create_topic(inv_topic)
    port = _free_port()
    config = _config(tmp_path, kafka={"bootstrap": kafka.bootstrap, "topic_prefix": prefix},
                     inventory={"pool": "train", "check_s": 0.5},
                     metrics={"listen": f"127.0.0.1:{port}"})
    env = nvml_env(fake_nvml_lib, _scenario(tmp_path, lost_at=6), step_s=0.5)
    _run_agent(config, env, port, 2, "gpuledger_agent_inventory_published_total")
    total = int((tmp_path / "spool" / "agent.seq").read_text())
    inventory = [json.loads(m.value) for m in _consume(kafka, inv_topic, 2)]
    assert [(r["health"], r["unhealthy_gpus"]) for r in inventory] == [
        ("ok", []), ("degraded", [3])]
    records = [json.loads(line) for m in _consume(kafka, tel_topic, total)
               for line in m.value.splitlines()]
    assert sorted(r["seq"] for r in records) == list(range(total))
    gpu3 = [r["healthy"] for r in sorted(records, key=lambda r: r["seq"])
            if r["gpu_index"] == 3]
    first_lost = gpu3.index(False)
    assert first_lost > 0 and not any(gpu3[first_lost:])       # lost stays lost
    assert all(r["healthy"] for r in records if r["gpu_index"] != 3)


def _start_agent(config: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(_agent_cmd(config), env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _wait_metric(proc: subprocess.Popen[str], port: int, name: str,
                 ok: Callable[[float], bool], timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while not ok(read_metric(port, name)):
        assert proc.poll() is None, proc.communicate()[1]
        assert time.monotonic() < deadline, f"{name} never got there"
        time.sleep(0.2)


def _stop_agent(proc: subprocess.Popen[str]) -> str:
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    return err


@pytest.mark.slow
def test_outage_with_a_restart_loses_nothing(tmp_path: Path, fake_nvml_lib: Path) -> None:  # noqa: F811
    """The broker goes away; the agent is restarted during the outage and keeps
    collecting into its spool; when the broker is back every sample arrives once."""
    from kafka_broker import start_broker

    broker = start_broker(tmp_path / "kafka")
    try:
        broker.create_topic("gpu.telemetry.v1", partitions=2)
        broker.create_topic("gpu.inventory.v1")
        port = _free_port()
        config = _config(tmp_path, kafka={"bootstrap": broker.bootstrap, "send_timeout_s": 2},
                         metrics={"listen": f"127.0.0.1:{port}"})
        env = nvml_env(fake_nvml_lib, _scenario(tmp_path))
        sent = "gpuledger_agent_sent_messages_total"
        samples = "gpuledger_agent_samples_total"
        backlog = "gpuledger_agent_spool_backlog_messages"

        agent = _start_agent(config, env)
        _wait_metric(agent, port, sent, lambda v: v >= 3)
        broker.kill_process()                                  # the broker dies
        _wait_metric(agent, port, backlog, lambda v: v >= 8)   # spooling now
        err = _stop_agent(agent)                               # restarted mid-outage
        assert "messages in the spool" in err                  # it says what it kept
        kept = Spool(tmp_path / "spool").backlog
        assert kept >= 8

        agent = _start_agent(config, env)
        _wait_metric(agent, port, samples, lambda v: v >= 8 * GPUS)
        assert read_metric(port, sent) == 0                        # nothing got through
        broker.start_again()
        _wait_metric(agent, port, backlog, lambda v: v == 0)
        _stop_agent(agent)
        total = int((tmp_path / "spool" / "agent.seq").read_text())
        records = [json.loads(line)
                   for m in _consume(broker, "gpu.telemetry.v1", total)
                   for line in m.value.splitlines()]
        # nothing lost: every sequence number is there
        assert sorted({r["seq"] for r in records}) == list(range(total))
        # A message in flight when the broker was SIGKILLed may have been written but not
        # acknowledged: it is sent again, as an exact copy (one message at most), and the
        # processor counts such a copy once (duplicate_samples).
        by_seq: dict[int, list[dict[str, Any]]] = {}
        for r in records:
            by_seq.setdefault(r["seq"], []).append(r)
        copies = [rs for rs in by_seq.values() if len(rs) > 1]
        assert all(all(c == rs[0] for c in rs) for rs in copies)
        assert len(copies) <= GPUS
        assert total > kept
    finally:
        broker.stop()


def test_a_second_signal_ends_the_wait_for_kafka(tmp_path: Path,
                                                 fake_nvml_lib: Path) -> None:  # noqa: F811
    """With kafka.send_timeout_s 30 and no broker, a stop waits up to 30 s to deliver
    what is spooled; three SIGINTs still took 32 s. The second signal now ends the wait:
    the agent exits at once (status 0), saying so, and what was spooled stays there."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]          # nothing listens there once closed
    config = _config(tmp_path, kafka={"bootstrap": f"127.0.0.1:{port}",
                                      "send_timeout_s": 30})
    proc = _start_agent(config, nvml_env(fake_nvml_lib, _scenario(tmp_path)))
    spool = tmp_path / "spool"
    deadline = time.monotonic() + 60
    while not list(spool.glob("*.seg")) and time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[1]
        time.sleep(0.2)
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    time.sleep(1.0)
    asked = time.monotonic()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    took = time.monotonic() - asked
    assert proc.returncode == 0, err
    assert took < 10, (took, err[-2000:])
    assert "again: stopping without waiting for Kafka" in err
    assert "Traceback" not in err
    assert any(p.stat().st_size for p in spool.glob("*.seg"))


@pytest.mark.parametrize("listen", ["127.0.0.1:0", "0.0.0.0:0", ":0"])
def test_the_banner_names_the_metrics_bind_address(tmp_path: Path, listen: str) -> None:
    """The start line said `metrics :PORT` whether the agent listened on the loopback only
    or on every interface; it says the address it is bound to."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULEDGER_")}
    env.update(GPULEDGER_AGENT__SOURCE="simulator", GPULEDGER_AGENT__NODE="h100-001",
               GPULEDGER_AGENT__SIMULATOR__HOURS="0.1",
               GPULEDGER_AGENT__SPOOL__PATH=str(tmp_path / "spool"),
               GPULEDGER_AGENT__METRICS__LISTEN=listen,
               GPULEDGER_AGENT__KAFKA__SEND_TIMEOUT_S="0.5",
               GPULEDGER_KAFKA_BOOTSTRAP="127.0.0.1:1")
    proc = subprocess.Popen([sys.executable, "-m", "gpuledger.cli.main", "agent"], env=env,
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    try:
        assert proc.stderr is not None
        banner = proc.stderr.readline()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    assert banner.startswith("gpuledger agent: node h100-001, source simulator"), banner
    host = listen.rsplit(":", 1)[0] or "0.0.0.0"
    port = banner.rsplit(f", metrics {host}:", 1)[1].strip()
    assert port.isdigit() and int(port) > 0, banner
