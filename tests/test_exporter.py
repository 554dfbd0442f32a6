"""The Prometheus exporter: gauges of the latest closed minute, job series that go away,
bounded labels, the queue-wait histogram, pipeline health."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from events import alloc, at, frames, inventory, job, series
from prometheus_client.parser import text_string_to_metric_families

from gpuledger.pipeline.config import ProcessorConfig
from gpuledger.pipeline.exporter import Exporter, parse_address
from gpuledger.pipeline.exporter.server import AddressError
from gpuledger.pipeline.processor import Processor
from gpuledger.pipeline.simulate import SimConfig, load_cluster, simulate
from gpuledger.pipeline.warehouse import Warehouse, read_table

Sample = tuple[str, dict[str, str], float]
MIB = 1_048_576


def samples(exporter: Exporter) -> list[Sample]:
    text = exporter.render().decode()
    return [(s.name, dict(s.labels), s.value)
            for fam in text_string_to_metric_families(text) for s in fam.samples]


def pick(found: Iterable[Sample], name: str, **labels: str) -> dict[tuple[tuple[str, str], ...],
                                                                    float]:
    return {tuple(sorted(lab.items())): v for n, lab, v in found
            if n == name and all(lab.get(k) == val for k, val in labels.items())}


def one(found: Iterable[Sample], name: str, **labels: str) -> float:
    hits = pick(found, name, **labels)
    assert len(hits) == 1, (name, labels, hits)
    return next(iter(hits.values()))


class EndedAttempts:
    """A fact listener that remembers when each attempt ended (``job_attempts`` facts)."""

    def __init__(self) -> None:
        self.at: dict[tuple[str, int], datetime] = {}

    def facts(self, table: str, frame: pl.DataFrame) -> None:
        if table == "job_attempts":
            for job_id, attempt, ended_at in frame.select(
                    "job_id", "attempt", "ended_at").iter_rows():
                self.at[(job_id, attempt)] = ended_at

    def closed(self, processor: Processor, until: datetime) -> None:
        pass


def _processor(tmp_path: Path) -> tuple[Processor, Exporter]:
    proc = Processor(ProcessorConfig(), Warehouse(tmp_path / "wh"))
    exporter = Exporter(proc.config)
    exporter.attach(proc)
    return proc, exporter


def _cluster(minutes: int) -> list[dict[str, Any]]:
    """n1 (4 GPUs): j1 (any card) on GPUs 0-1 at 0.8/0.2 for 20 min; j2 on GPU 2 idle."""
    recs: list[dict[str, Any]] = [inventory("n1", at(0), gpus=4, pool="train")]
    recs += [job("submitted", "j1", at(0), gpus=2, team="nlp", queue="prod", card_type=None),
             job("started", "j1", at(0), allocation=alloc("n1", 0, 1)),
             job("finished", "j1", at(20))]
    recs += series("n1", 0, at(0), 20, sm=0.8, mem=20_000.0, jobs=["j1"])
    recs += series("n1", 1, at(0), 20, sm=0.2, mem=4_000.0, jobs=["j1"])
    recs += [job("submitted", "j2", at(0), gpus=1, team="vision"),
             job("started", "j2", at(1), allocation=alloc("n1", 2))]
    recs += series("n1", 2, at(0), minutes, sm=0.0, mem=900.0, jobs=["j2"])
    recs += series("n1", 3, at(0), minutes, sm=0.0, mem=0.0)
    return recs


def test_latest_minute_gauges_and_job_series(tmp_path: Path) -> None:
    proc, exporter = _processor(tmp_path)
    recs = _cluster(40)
    # newest sample 11:50, lateness 2 min: minutes before 9 close, the last is minute 8
    proc.process(frames([r for r in recs if r["time"] < at(12)]))
    s = samples(exporter)
    assert one(s, "gpuledger_facts_minute_timestamp_seconds") == at(8).timestamp()
    # GPUs by state: j1's two GPUs busy (0.8) and inefficient (0.2), j2's idle, GPU 3 free
    assert one(s, "gpuledger_gpus", state="allocated_busy", team="nlp") == 1
    assert one(s, "gpuledger_gpus", state="allocated_inefficient", team="nlp") == 1
    assert one(s, "gpuledger_gpus", state="allocated_idle", team="vision") == 1
    assert one(s, "gpuledger_gpus", state="free") == 1
    assert one(s, "gpuledger_allocated_gpus", team="nlp", queue="prod") == 2
    assert one(s, "gpuledger_used_gpus", team="nlp", queue="prod") == pytest.approx(0.8 + 0.2)
    assert one(s, "gpuledger_available_gpus", pool="train") == 4
    # per-job series of the running jobs
    assert one(s, "gpuledger_job_activity_ratio", job_id="j1") == pytest.approx(0.5)
    assert one(s, "gpuledger_job_allocated_gpus", job_id="j1") == 2
    assert one(s, "gpuledger_job_memory_peak_bytes", job_id="j1") == 20_000 * MIB
    assert one(s, "gpuledger_job_memory_held_bytes", job_id="j1") == 81_559 * MIB
    assert one(s, "gpuledger_job_memory_used_bytes", job_id="j1") == 24_000 * MIB
    assert one(s, "gpuledger_job_runtime_seconds", job_id="j1") == 9 * 60
    assert one(s, "gpuledger_job_runtime_seconds", job_id="j2") == 8 * 60
    # base units: 9 minutes of 2 GPUs of which 1.0 used = 540 GPU-seconds
    assert one(s, "gpuledger_job_wasted_gpu_seconds", job_id="j1") == pytest.approx(
        9 * (2 - 1.0) * 60)
    assert one(s, "gpuledger_job_gpu_activity_ratio", job_id="j1", gpu="1") == pytest.approx(0.2)
    # job series: the card the job asked for (none: any card of the pool); per-GPU series
    # also the physical card of the GPU, as on the fleet series
    info = pick(s, "gpuledger_job_info", job_id="j1")
    assert [dict(k)["requested_card_type"] for k in info] == ["any"]
    assert all("card_type" not in dict(k) for k in info)
    physical = {dict(k)["card_type"] for k in pick(s, "gpuledger_gpus")}
    for key in pick(s, "gpuledger_job_gpu_activity_ratio", job_id="j1"):
        labels = dict(key)
        assert labels["requested_card_type"] == "any"
        assert labels["card_type"] in physical and labels["card_type"] != "unknown"
    assert one(s, "gpuledger_job_gpu_processes", job_id="j2", gpu="2") == 1
    # j1 ends at minute 20: its series are gone once that minute has closed
    proc.process(frames([r for r in recs if at(12) <= r["time"] < at(30)]))
    s = samples(exporter)
    assert one(s, "gpuledger_facts_minute_timestamp_seconds") == at(26).timestamp()
    for name in ("gpuledger_job_info", "gpuledger_job_activity_ratio",
                 "gpuledger_job_gpu_activity_ratio", "gpuledger_job_memory_peak_bytes"):
        assert pick(s, name, job_id="j1") == {}, name
        assert pick(s, name, job_id="j2"), name
    assert one(s, "gpuledger_gpus", state="free") == 3


def test_queue_wait_histogram_observes_each_attempt_once(tmp_path: Path) -> None:
    proc, exporter = _processor(tmp_path)
    recs: list[dict[str, Any]] = [inventory("n1", at(0), gpus=2)]
    # j1 waits 5 min; j2 waits 40 min, starts and ends between two close steps
    recs += [job("submitted", "j1", at(0), queue="q"),
             job("started", "j1", at(5), allocation=alloc("n1", 0)),
             job("submitted", "j2", at(0), queue="q"),
             job("started", "j2", at(40), allocation=alloc("n1", 1)),
             job("finished", "j2", at(42))]
    recs += series("n1", 0, at(0), 60, sm=0.5, jobs=["j1"])
    for part in (range(0, 20), range(20, 60)):
        proc.process(frames([r for r in recs if part.start <= (r["time"] - at(0)).seconds / 60
                             < part.stop]))
        s = samples(exporter)
    counts = pick(s, "gpuledger_queue_wait_seconds_count", queue="q")
    assert sum(counts.values()) == 2                       # not again at the second step
    assert one(s, "gpuledger_queue_wait_seconds_sum", queue="q") == 5 * 60 + 40 * 60
    assert one(s, "gpuledger_queue_wait_seconds_bucket", queue="q", le="600.0") == 1
    assert one(s, "gpuledger_queue_wait_seconds_bucket", queue="q", le="3600.0") == 2


def test_pending_blocked_and_health(tmp_path: Path) -> None:
    proc, exporter = _processor(tmp_path)
    recs: list[dict[str, Any]] = [inventory("n1", at(0), gpus=4), inventory("n2", at(0), gpus=4)]
    # 2 GPUs busy on each node: 4 free, but no node has 3 → the 3-GPU job is blocked
    recs += [job("submitted", "a", at(0)), job("started", "a", at(0), allocation=alloc("n1", 0, 1)),
             job("submitted", "b", at(0)), job("started", "b", at(0), allocation=alloc("n2", 0, 1)),
             job("submitted", "big", at(2), gpus=3, queue="batch", team="nlp")]
    recs += series("n1", 0, at(0), 15, sm=0.5, jobs=["a"])
    recs += [{**r, "node": "n2"} for r in series("n1", 0, at(0), 15, sm=0.5, jobs=["b"])]
    proc.process(frames(recs))
    s = samples(exporter)
    assert one(s, "gpuledger_free_gpus") == 4
    assert one(s, "gpuledger_largest_free_block_gpus") == 2
    assert one(s, "gpuledger_fragmentation_ratio", k="4") == 1.0
    assert one(s, "gpuledger_fragmentation_ratio", k="2") == 0.0
    assert one(s, "gpuledger_blocked_demand_jobs") == 1
    assert one(s, "gpuledger_queue_pending_gpus", queue="batch", team="nlp") == 3
    assert one(s, "gpuledger_queue_blocked_jobs", queue="batch") == 1
    assert one(s, "gpuledger_job_blocked_gpus", job_id="big") == 3
    minute = one(s, "gpuledger_facts_minute_timestamp_seconds")
    assert one(s, "gpuledger_queue_oldest_pending_seconds", queue="batch") == \
        minute + 60 - at(2).timestamp()
    assert one(s, "gpuledger_records_total", record_type="job") == 5
    assert one(s, "gpuledger_records_total", record_type="telemetry") == 2 * 15 * 6
    assert one(s, "gpuledger_last_event_timestamp_seconds", stream="telemetry") == \
        max(r["time"] for r in recs if r["type"] == "telemetry").timestamp()
    assert one(s, "gpuledger_node_telemetry_age_seconds", node="n1") == 0
    assert one(s, "gpuledger_node_healthy", node="n2") == 1
    assert all(v == 1 for v in pick(s, "gpuledger_exporter_collect_success").values())
    # a's end arrives after its minutes closed: the closed minutes charged it 2 GPUs
    # from 10:01 to the closed point (docs/metrics.md, 'Late job events')
    assert one(s, "gpuledger_late_job_allocation_gpu_seconds_total",
               error="charged_after_end") == 0
    proc.process(frames([job("finished", "a", at(1))]))
    s = samples(exporter)
    closed = proc.closed_until
    assert closed is not None
    assert one(s, "gpuledger_late_job_allocation_gpu_seconds_total",
               error="charged_after_end") == 2 * (closed - at(1)).total_seconds() > 0
    assert one(s, "gpuledger_late_job_allocation_gpu_seconds_total",
               error="uncharged_before_start") == 0


def test_label_cardinality_bounded_under_the_demo_workload(tmp_path: Path) -> None:
    """Job-level series exist only for running jobs; everything else is bounded by the
    fleet's pools, card types, teams, queues and nodes, scrape after scrape."""
    proc, exporter = _processor(tmp_path)
    sim = SimConfig(hours=6, seed=11, sample_interval_s=60)
    spec = load_cluster(None)
    ended = EndedAttempts()
    proc.listeners.append(ended)
    job_series_max = 0
    for i, batch in enumerate(simulate(sim)):
        proc.process(batch)
        if i % 5:
            continue
        s = samples(exporter)
        assert proc.closed_until is not None
        last = proc.closed_until - timedelta(minutes=1)
        exported = {(lab["job_id"], int(lab["attempt"])) for n, lab, _ in s
                    if n == "gpuledger_job_info"}
        # no attempt that ended before the latest closed minute is still exported
        gone = {k for k, t in ended.at.items() if t <= last}
        assert not exported & gone
        gpu_series = pick(s, "gpuledger_job_gpu_activity_ratio")
        assert len(gpu_series) <= spec.total_gpus / 0.25       # quarter GPUs at most
        job_series_max = max(job_series_max, len(exported))
        nodes = {lab["node"] for n, lab, _ in s if n == "gpuledger_node_healthy"}
        teams = {lab["team"] for n, lab, _ in s if n == "gpuledger_gpus"}
        states = {lab["state"] for n, lab, _ in s if n == "gpuledger_gpus"}
        assert len(states) <= 6
        pool_cards = len(spec.gpus_by_pool_card())
        assert len(teams) <= len(spec.teams) + 1                    # + "" for no team
        assert len(pick(s, "gpuledger_gpus")) <= (len(spec.teams) + 1) * 6 * pool_cards
        queues = {lab["queue"] for n, lab, _ in s if n == "gpuledger_allocated_gpus"}
        assert len(queues) <= len(spec.queues)
        assert len(nodes) <= len(proc.inventory.records["node"].unique())
    assert job_series_max > 10
    proc.flush()
    s = samples(exporter)
    last = proc.closed_until - timedelta(minutes=1) if proc.closed_until else None
    exported = {(lab["job_id"], int(lab["attempt"])) for n, lab, _ in s
                if n == "gpuledger_job_info"}
    assert not exported & {k for k, t in ended.at.items() if last and t <= last}


def test_parse_address() -> None:
    assert parse_address("127.0.0.1:9108") == ("127.0.0.1", 9108)
    assert parse_address(":9108") == ("0.0.0.0", 9108)
    for bad in ("9108", "host:", "host:port", "h:70000"):
        with pytest.raises(AddressError):
            parse_address(bad)


def test_matches_the_warehouse(tmp_path: Path) -> None:
    """At the end of a simulated run, the fleet gauges equal the warehouse's last minute."""
    proc, exporter = _processor(tmp_path)
    for batch in simulate(SimConfig(hours=1, seed=3, sample_interval_s=60)):
        proc.process(batch)
    proc.flush()
    s = samples(exporter)
    gm = read_table(tmp_path / "wh", "gpu_minute")
    last = gm.filter(pl.col("minute") == pl.col("minute").max())
    assert one(s, "gpuledger_facts_minute_timestamp_seconds") == last["minute"][0].timestamp()
    parts = by_share(last)
    want = dict(parts.group_by("state").agg(pl.col("gpus").sum()).filter(
        pl.col("gpus") > 0).iter_rows())
    got: dict[str, float] = {}
    for key, v in pick(s, "gpuledger_gpus").items():
        state = dict(key)["state"]
        got[state] = got.get(state, 0) + v
    assert got == pytest.approx(want)
    assert sum(got.values()) == pytest.approx(last.height)      # every GPU once
    allocated = sum(pick(s, "gpuledger_allocated_gpus").values())
    assert allocated == pytest.approx(parts.filter(pl.col("held"))["gpus"].sum())


def by_share(last: pl.DataFrame) -> pl.DataFrame:
    """A minute's ``gpu_minute`` rows split as the roll-ups split a GPU-minute: the held
    part (``alloc_fraction``, at most 1) in the row's state, ``used`` = part × activity,
    the rest free (or unavailable). Columns: pool, state, held, gpus, used."""
    part = pl.min_horizontal(pl.col("alloc_fraction"), pl.lit(1.0))
    rest = pl.when(~pl.col("allocated")).then(pl.col("state")).when(
        (pl.col("state") == "unavailable") | ~pl.col("schedulable")).then(
        pl.lit("unavailable")).otherwise(pl.lit("free"))
    return pl.concat([
        last.filter(pl.col("allocated")).select(
            "pool", "state", pl.lit(True).alias("held"), part.alias("gpus"),
            (part * pl.col("activity").fill_null(0.0)).alias("used")),
        last.select("pool", rest.alias("state"), pl.lit(False).alias("held"),
                    (1.0 - part).alias("gpus"), pl.lit(0.0).alias("used"))])


def test_a_shared_gpu_counts_by_share_and_each_team_its_part(tmp_path: Path) -> None:
    """One GPU held 0.5 by team a's job and 0.25 by team b's, one held 0.5 by a's other
    job, at 40 %: the fleet gauges counted each held GPU as one whole allocated GPU of
    one team (2 where the jobs held 1.25, a probe), and used GPUs unweighted."""
    proc, exporter = _processor(tmp_path)
    recs: list[dict[str, Any]] = [inventory("n1", at(0), gpus=2, pool="infer")]
    for job_id, team, gpu, fraction in (("a1", "a", 0, 0.5), ("b1", "b", 0, 0.25),
                                        ("a2", "a", 1, 0.5)):
        recs += [job("submitted", job_id, at(0), gpus=1, team=team, queue="q"),
                 job("started", job_id, at(0), allocation=alloc("n1", gpu,
                                                                  fraction=fraction))]
    recs += series("n1", 0, at(0), 15, sm=0.4, mem=1_000.0, jobs=["a1", "b1"])
    recs += series("n1", 1, at(0), 15, sm=0.4, mem=1_000.0, jobs=["a2"])
    proc.process(frames(recs))
    s = samples(exporter)
    assert one(s, "gpuledger_allocated_gpus", team="a") == pytest.approx(0.5 * 0.75 / 0.75
                                                                          + 0.5)
    assert one(s, "gpuledger_allocated_gpus", team="b") == pytest.approx(0.25)
    assert one(s, "gpuledger_used_gpus", team="a") == pytest.approx(1.0 * 0.4)
    assert one(s, "gpuledger_used_gpus", team="b") == pytest.approx(0.25 * 0.4)
    assert one(s, "gpuledger_gpus", state="free") == pytest.approx(0.25 + 0.5)
    assert sum(pick(s, "gpuledger_gpus").values()) == pytest.approx(2.0)
    assert sum(pick(s, "gpuledger_job_allocated_gpus").values()) == pytest.approx(1.25)


def test_label_values_empty_or_with_control_characters(tmp_path: Path) -> None:
    """A team given as "" was exported as team="", the boards' mark of a GPU no job
    holds; control characters went raw into the exposition (and alert texts)."""
    proc, exporter = _processor(tmp_path)
    recs: list[dict[str, Any]] = [inventory("n1", at(0), gpus=2)]
    for job_id, team, gpu in (("e", "", 0), ("c", "ops\x1b[31m\u2028x", 1)):
        recs += [job("submitted", job_id, at(0), gpus=1, team=team, queue=""),
                 job("started", job_id, at(0), allocation=alloc("n1", gpu))]
    recs += series("n1", 0, at(0), 15, sm=0.4, jobs=["e"])
    recs += series("n1", 1, at(0), 15, sm=0.4, jobs=["c"])
    proc.process(frames(recs))
    text = exporter.render().decode()
    assert "\x1b" not in text and "\u2028" not in text
    s = samples(exporter)
    teams = {dict(k)["team"] for k in pick(s, "gpuledger_allocated_gpus")}
    assert teams == {"unknown", "ops\ufffd[31m\ufffdx"}
    assert {dict(k)["queue"] for k in pick(s, "gpuledger_allocated_gpus")} == {"unknown"}
    info = {dict(k)["job_id"]: dict(k)["team"] for k in pick(s, "gpuledger_job_info")}
    assert info == {"e": "unknown", "c": "ops\ufffd[31m\ufffdx"}


def test_the_exposition_passes_promtool_check_metrics(tmp_path: Path) -> None:
    """Prometheus's own linter (names, units, help, types) on a scrape with data in it."""
    import shutil
    import subprocess

    proc, exporter = _processor(tmp_path)
    proc.process(frames(_cluster(30)), validated=True)
    proc.flush()
    text = exporter.render()
    assert b"gpuledger_closed_windows_total" in text
    promtool = shutil.which("promtool")
    assert promtool, "promtool is installed by scripts/test.sh (Debian's prometheus)"
    done = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True,
                          timeout=60, check=False)
    assert done.returncode == 0, (done.stdout + done.stderr).decode()
