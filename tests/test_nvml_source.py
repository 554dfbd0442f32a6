"""The NVML source through the real pynvml bindings, on the fake libnvidia-ml.so.1.

Each test writes a scenario (tests/fake_nvml), runs NvmlSource against it in a
subprocess (the fake driver is found through LD_LIBRARY_PATH) and checks the records
against values read back from the same scenario.
"""

from __future__ import annotations

import ctypes.util
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import polars as pl
import pynvml
import pytest
import yaml
from fake_nvml import MIB, Scenario, drive, processes_value

from gpuledger.agent.sources.card_types import card_type_of
from gpuledger.pipeline.decode import decode_jsonl
from gpuledger.pipeline.facts.telemetry_minutes import finish, partials, prepare

H100 = "NVIDIA H100 80GB HBM3"
A100 = "NVIDIA A100-SXM4-40GB"
START = datetime(2026, 1, 5, 10, 0, tzinfo=UTC)
INTERVAL = 10.0
FIELDS = yaml.safe_load(
    (Path(__file__).parents[1] / "agents/gpuledger/agent/sources/nvml_fields.yaml").read_text())


def gpu(sc: Scenario, i: int, name: str = H100, **extra: object) -> Scenario:
    """A fully supported GPU whose values differ by index (so mix-ups show)."""
    values: dict[str, object] = {
        "name": name, "uuid": f"GPU-{i:08d}-0000-4000-8000-00000000000{i % 10}",
        "util_gpu": 10 + 11 * i, "util_mem": 5 + i, "mem_total": 81559 * MIB,
        "mem_used": (1000 + 997 * i) * MIB, "power": 100_000 + 12_345 * i, "temp": 30 + i,
        "clock_sm": 1400 + 10 * i, "pcie_tx": 1000 + i, "pcie_rx": 2000 + 3 * i,
        "nvlinks": 18, "processes": "-"}
    values.update(extra)
    return sc.set(f"g{i}", **values)


def run(tmp_path: Path, lib: Path, sc: Scenario, **plan: Any) -> dict[str, Any]:
    plan.setdefault("start", START.isoformat())
    plan.setdefault("interval_s", INTERVAL)
    return drive(lib, sc.write(tmp_path / "scenario.txt"), **plan)


def by_gpu(records: list[dict[str, Any]]) -> dict[tuple[int, str | None], dict[str, Any]]:
    return {(r["gpu_index"], r["mig_instance"]): r for r in records}


def assert_valid(records: list[dict[str, Any]]) -> None:
    data = "".join(json.dumps(r) + "\n" for r in records).encode()
    decoded = decode_jsonl(data, now=START + timedelta(days=1))
    assert decoded.rejects.height == 0, decoded.rejects["reason"].to_list()


def expected_gauges(sc: Scenario, step: int, target: str) -> dict[str, float]:
    """The gauge fields as the packaged field file converts them (units from NVML)."""
    n = sc.number
    return {
        "util_gpu": n(step, target, "util.gpu"),
        "mem_used_mib": n(step, target, "mem.used") / MIB,
        "mem_total_mib": n(step, target, "mem.total") / MIB,
        "power_w": n(step, target, "power") / 1000,
        "temp_c": n(step, target, "temp"),
        "sm_clock_mhz": n(step, target, "clock.sm"),
        "pcie_tx_bytes_s": n(step, target, "pcie.tx") * 1024,
        "pcie_rx_bytes_s": n(step, target, "pcie.rx") * 1024,
    }


def expected_processes(sc: Scenario, step: int, target: str) -> list[dict[str, Any]]:
    return [{"pid": pid, "used_mib": used / MIB, "job_id": None}
            for pid, used in sc.processes(step, target)]


def test_eight_gpus_with_processes_from_two_jobs(tmp_path: Path, fake_nvml_lib: Path) -> None:
    sc = Scenario(gpus=8)
    job_a = {i: [(41000 + i, (20 + i) * 1024 * MIB)] for i in range(4)}      # a 4-GPU job
    job_b = {i: [(52000 + i, (30 + i) * 1024 * MIB)] for i in range(4, 8)}   # another one
    job_b[7].append((52100, 512 * MIB))                                      # a helper process
    for i in range(8):
        gpu(sc, i, processes=processes_value({**job_a, **job_b}[i]))
    sc.at(1, "g3", "processes", "-").at(1, "g5", "util.gpu", 3)             # A's rank 3 exits
    out = run(tmp_path, fake_nvml_lib, sc, steps=[0, 1], pool="train-h100", node="gpu-a-01")

    for step, records in enumerate(out["collects"]):
        assert [r["gpu_index"] for r in records] == list(range(8))
        for rec in records:
            target = f"g{rec['gpu_index']}"
            assert rec["node"] == "gpu-a-01"
            assert rec["gpu_uuid"] == sc.value(step, target, "uuid")
            assert rec["card_type"] == card_type_of(H100) == "H100-80GB-HBM3"
            assert rec["mig_instance"] is None and rec["healthy"] is True
            for name, value in expected_gauges(sc, step, target).items():
                assert rec[name] == pytest.approx(value), (target, name)
            assert rec["processes"] == expected_processes(sc, step, target)
            assert rec["xid_errors"] == 0
            assert "nvlink_rx_bytes_s" not in rec and "ecc_sbe" not in rec  # not in scenario
        assert_valid(records)
    first, second = out["collects"]
    assert [r["seq"] for r in first + second] == list(range(16))
    pids = {p["pid"] for r in first for p in r["processes"]}
    assert pids == {pid for procs in (*job_a.values(), *job_b.values()) for pid, _ in procs}
    assert second[3]["processes"] == [] and second[5]["util_gpu"] == 3

    inv = out["inventories"][-1]
    assert inv["node"] == "gpu-a-01" and inv["pool"] == "train-h100"
    assert inv["card_type"] == card_type_of(H100) and inv["gpu_count"] == 8
    assert inv["gpu_mem_mib"] == sc.number(0, "g0", "mem.total") / MIB
    assert inv["topology"] == "nvlink" and inv["health"] == "ok" and inv["unhealthy_gpus"] == []
    assert inv["labels"] == {"nvidia.driver_version": sc.driver}
    assert inv["schedulable"] is True
    assert_valid([inv])
    assert out["devices"] == [{"index": i, "uuid": sc.value(0, f"g{i}", "uuid"), "mig": []}
                              for i in range(8)]
    assert out["errors"] == 0
    assert out["heavy_modules"] == []          # the agent stays lean: no Polars/DuckDB/Arrow


def test_mig_partitioned_gpu_has_a_sample_per_instance(tmp_path: Path,
                                                       fake_nvml_lib: Path) -> None:
    sc = Scenario(gpus=2)
    gpu(sc, 0, A100, nvlinks=0, processes=processes_value([(700, 3000 * MIB)]))
    # GPU 1 in MIG mode: whole-GPU power/temperature/memory, no utilisation (as on A100).
    sc.set("g1", name=A100, uuid="GPU-11111111-2222-3333-4444-555555555555", mig_mode=1,
           mem_total=40960 * MIB, mem_used=9000 * MIB, power=150_000, temp=41)
    migs = [(0, 1, 0, "3g.20gb", 20096, [(801, 4000 * MIB), (802, 1000 * MIB)]),
            (1, 5, 0, "1g.5gb", 4864, [(803, 2500 * MIB)]),
            (2, 6, 0, "1g.5gb", 4864, [])]
    for slot, gi, ci, profile, total, procs in migs:
        sc.mig(1, slot, gi, ci).set(
            f"g1.m{slot}", name=f"{A100} MIG {profile}", uuid=f"MIG-0000000{slot}-aaaa-bbbb",
            mem_total=total * MIB, mem_used=sum(b for _, b in procs), processes=
            processes_value(procs))
    out = run(tmp_path, fake_nvml_lib, sc, steps=[0], pool="shared-a100")
    records = out["collects"][0]
    assert [(r["gpu_index"], r["mig_instance"]) for r in records] == (
        [(0, None), (1, None)] + [(1, f"{p}/{gi}") for _, gi, _, p, _, _ in migs])
    got = by_gpu(records)
    whole = got[(1, None)]
    assert "processes" not in whole          # the processes are on the instance samples
    assert "util_gpu" not in whole           # not supported in MIG mode: omitted
    assert whole["power_w"] == sc.number(0, "g1", "power") / 1000
    assert "mem_used_mib" not in whole       # split over the instances, not counted twice
    assert whole["mem_total_mib"] == sc.number(0, "g1", "mem.total") / MIB
    for slot, gi, _ci, profile, _total, _procs in migs:
        rec, target = got[(1, f"{profile}/{gi}")], f"g1.m{slot}"
        assert rec["gpu_uuid"] == sc.value(0, target, "uuid")
        assert rec["mem_total_mib"] == sc.number(0, target, "mem.total") / MIB
        assert rec["mem_used_mib"] == sc.number(0, target, "mem.used") / MIB
        assert rec["processes"] == expected_processes(sc, 0, target)
        assert rec["card_type"] == card_type_of(A100) and rec["healthy"] is True
        assert "power_w" not in rec and "xid_errors" not in rec   # whole-GPU fields
    assert got[(0, None)]["processes"] == expected_processes(sc, 0, "g0")
    assert_valid(records)
    # The processor folds the instances into one GPU-minute: memory and processes add up.
    data = "".join(json.dumps(r) + "\n" for r in records).encode()
    telemetry = decode_jsonl(data, now=START + timedelta(days=1)).frames["telemetry"]
    prepared = prepare(telemetry).with_columns(partition=pl.lit(0, pl.Int64))
    minute = finish(partials(prepared)).filter(pl.col("gpu_index") == 1).row(0, named=True)
    assert minute["mem_used_mib"] == sum(sc.number(0, f"g1.m{s}", "mem.used") / MIB
                                         for s, *_ in migs)
    assert minute["processes"] == sum(len(sc.processes(0, f"g1.m{s}")) for s, *_ in migs)
    inv = out["inventories"][0]
    assert inv["labels"]["nvidia.mig"] == "1:" + "+".join(f"{p}/{gi}" for _, gi, _, p, _, _ in migs)
    assert inv["topology"] == "pcie" and inv["gpu_count"] == 2
    assert out["devices"][1]["mig"] == [sc.value(0, f"g1.m{s}", "uuid") for s, *_ in migs]


def test_unsupported_fields_are_omitted_and_not_asked_again(tmp_path: Path,
                                                             fake_nvml_lib: Path) -> None:
    sc = Scenario(gpus=3)
    gpu(sc, 0)
    rx, tx = 198, 197  # NVML_FI_DEV_PCIE_COUNT_RX_BYTES / _TX_BYTES: byte counters
    for step, (r, t) in enumerate([(10_000, 5_000), (260_000, 45_000), (1_260_000, 45_000)]):
        sc.at(step, "g0", f"field.{rx}", r).at(step, "g0", f"field.{tx}", t)
    gpu(sc, 1)
    sc.values = [v for v in sc.values if not (v[1] == "g1" and v[2] in ("temp", "clock.sm"))]
    # g2: a driver without nvmlDeviceGetFieldValues support and no process list
    gpu(sc, 2).at(0, "g2", "fieldvalues.error", pynvml.NVML_ERROR_NOT_SUPPORTED)
    sc.at(0, "g2", f"field.{rx}", 1)
    sc.values = [v for v in sc.values if not (v[1] == "g2" and v[2] == "processes")]
    steps = [0, 1, 2]
    out = run(tmp_path, fake_nvml_lib, sc, steps=steps,
              counts=["temp", "clock.sm", f"field.{rx}", "pcie.rx", "fieldvalues.error",
                      "processes"])
    for step, records in enumerate(out["collects"]):
        g0, g1, g2 = records
        assert "temp_c" not in g1 and "sm_clock_mhz" not in g1
        assert g1["util_gpu"] == sc.number(step, "g1", "util.gpu")
        assert g0["temp_c"] == sc.number(step, "g0", "temp")
        # g1, g2 have no byte counters: the 20 ms throughput sample, KB/s → bytes/s
        for rec, target in ((g1, "g1"), (g2, "g2")):
            assert rec["pcie_rx_bytes_s"] == sc.number(step, target, "pcie.rx") * 1024
        if step == 0:
            assert "pcie_rx_bytes_s" not in g0   # a rate needs two readings
        else:
            for field, fid in (("pcie_rx_bytes_s", rx), ("pcie_tx_bytes_s", tx)):
                delta = sc.number(step, "g0", f"field.{fid}") - sc.number(
                    step - 1, "g0", f"field.{fid}")
                assert g0[field] == pytest.approx(delta / INTERVAL)
        assert "processes" not in g2 and g2["healthy"] is True
        assert g1["processes"] == [] and g0["processes"] == []
        assert_valid(records)
    n = len(steps)
    assert out["errors"] == 0
    assert out["counts"]["temp"] == 2 * n + 1          # g0 and g2 every sample, g1 once
    assert out["counts"]["clock.sm"] == 2 * n + 1
    assert out["counts"][f"field.{rx}"] == n + 1       # g1 tried the counter once
    assert out["counts"]["pcie.rx"] == 2 * n           # g0 never needed the fallback
    assert out["counts"]["fieldvalues.error"] == n + 2  # g0 every sample, g1 and g2 once
    assert out["counts"]["processes"] == 2 * n + 1     # g2 asked once


def test_a_gpu_lost_mid_run_is_unhealthy_and_the_others_carry_on(
        tmp_path: Path, fake_nvml_lib: Path) -> None:
    sc = Scenario(gpus=3)
    for i in range(3):
        gpu(sc, i, processes=processes_value([(900 + i, (i + 1) * 1024 * MIB)]))
    sc.at(1, "g1", "lost", 1).at(1, "g1", "xid", 79)   # fell off the bus
    out = run(tmp_path, fake_nvml_lib, sc, steps=[0, 1, 2], pool="p")
    for step, records in enumerate(out["collects"]):
        got = by_gpu(records)
        for i in (0, 2):
            rec = got[(i, None)]
            assert rec["healthy"] is True
            assert rec["util_gpu"] == sc.number(step, f"g{i}", "util.gpu")
            assert rec["processes"] == expected_processes(sc, step, f"g{i}")
        lost = got[(1, None)]
        is_lost = sc.value(step, "g1", "lost") == "1"
        assert lost["healthy"] is (not is_lost)
        assert lost["gpu_uuid"] == sc.value(0, "g1", "uuid")
        metrics = set(expected_gauges(sc, step, "g1")) | {"processes"}
        if is_lost:
            assert not metrics & set(lost), sorted(metrics & set(lost))
        else:
            assert metrics <= set(lost)
        assert_valid(records)
    assert [by_gpu(r)[(1, None)]["xid_errors"] for r in out["collects"]] == [0, 1, 0]
    assert [inv["unhealthy_gpus"] for inv in out["inventories"]] == [[], [1], [1]]
    assert [inv["health"] for inv in out["inventories"]] == ["ok", "degraded", "degraded"]


def test_a_gpu_lost_at_start_is_reported_unhealthy(tmp_path: Path,
                                                   fake_nvml_lib: Path) -> None:
    sc = Scenario(gpus=2)
    gpu(sc, 0)
    gpu(sc, 1)
    sc.at(0, "g1", "lost", 1)
    out = run(tmp_path, fake_nvml_lib, sc, steps=[0], pool="p")
    g0, g1 = out["collects"][0]
    assert g0["healthy"] is True and g0["gpu_uuid"] == sc.value(0, "g0", "uuid")
    assert g1 == {"v": 1, "type": "telemetry", "time": g0["time"], "node": "node-1",
                  "gpu_index": 1, "gpu_uuid": "gpu-1", "card_type": "unknown",
                  "mig_instance": None, "healthy": False, "seq": 1}
    assert out["inventories"][0]["unhealthy_gpus"] == [1]
    assert_valid(out["collects"][0])


def test_xid_events_are_counted_and_fatal_ones_make_the_gpu_unhealthy(
        tmp_path: Path, fake_nvml_lib: Path) -> None:
    sc = Scenario(gpus=2)
    gpu(sc, 0)
    gpu(sc, 1)
    sc.at(1, "g0", "xid", 13).at(1, "g0", "xid", 31)   # application errors: not fatal
    sc.at(2, "g1", "xid", 48)                           # double-bit ECC: fatal
    fatal = set(FIELDS["fatal_xids"])
    steps = [0, 1, 2, 3]
    out = run(tmp_path, fake_nvml_lib, sc, steps=steps)
    for step, records in enumerate(out["collects"]):
        for rec in records:
            target = f"g{rec['gpu_index']}"
            now = [int(v) for s, t, k, v in sc.values if t == target and k == "xid" and s == step]
            seen = [int(v) for s, t, k, v in sc.values if t == target and k == "xid" and s <= step]
            assert rec["xid_errors"] == len(now)
            assert rec["healthy"] is not (fatal & set(seen)), (step, target)
            assert rec["util_gpu"] == sc.number(step, target, "util.gpu")  # still measured
        assert_valid(records)
    assert [r[1]["healthy"] for r in out["collects"]] == [True, True, False, False]


def test_ecc_and_nvlink_counters_become_deltas_and_rates(tmp_path: Path,
                                                         fake_nvml_lib: Path) -> None:
    sbe, dbe, nv_tx, nv_rx = 3, 4, 138, 139   # NVML_FI_DEV_ECC_*_VOL_TOTAL, NVLINK_THROUGHPUT_DATA
    sc = Scenario(gpus=1)
    gpu(sc, 0)
    series = {sbe: [5, 7, 7, 1], dbe: [0, 1, 1, 1],                  # step 3: counters reset
              nv_tx: [1_000, 901_000, 1_801_000, 2_701_000], nv_rx: [0, 0, 50_000, 50_001]}
    for fid, values in series.items():
        for step, value in enumerate(values):
            sc.at(step, "g0", f"field.{fid}", value)
    out = run(tmp_path, fake_nvml_lib, sc, steps=[0, 1, 2, 3])
    recs = [c[0] for c in out["collects"]]
    assert all(k not in recs[0] for k in ("ecc_sbe", "ecc_dbe", "nvlink_tx_bytes_s"))

    def delta(fid: int, step: int) -> float:
        return sc.number(step, "g0", f"field.{fid}") - sc.number(step - 1, "g0", f"field.{fid}")

    for step in (1, 2):
        assert recs[step]["ecc_sbe"] == delta(sbe, step)
        assert recs[step]["ecc_dbe"] == delta(dbe, step)
    for step in (1, 2, 3):
        for field, fid in (("nvlink_tx_bytes_s", nv_tx), ("nvlink_rx_bytes_s", nv_rx)):
            assert recs[step][field] == pytest.approx(delta(fid, step) * 1024 / INTERVAL)
    assert "ecc_sbe" not in recs[3]           # went backwards (reset): no made-up delta
    assert recs[3]["ecc_dbe"] == 0
    assert_valid(recs)


def test_a_step_of_the_wall_clock_makes_no_rate_up(tmp_path: Path,
                                                   fake_nvml_lib: Path) -> None:
    """NTP steps the wall clock back an hour between two collections, then forward
    again: the samples carry the wall time, the rates the 10 s that passed."""
    nv_tx = 138
    sc = Scenario(gpus=1)
    gpu(sc, 0)
    for step, value in enumerate([0, 100_000, 200_000, 300_000]):
        sc.at(step, "g0", f"field.{nv_tx}", value)
    walls = [START, START + timedelta(seconds=10), START - timedelta(seconds=3580),
             START + timedelta(seconds=30)]
    out = run(tmp_path, fake_nvml_lib, sc, steps=[0, 1, 2, 3],
              times=[t.isoformat() for t in walls])
    recs = [c[0] for c in out["collects"]]
    assert [r["time"] for r in recs] == [
        t.strftime("%Y-%m-%dT%H:%M:%S.000Z") for t in walls]
    for rec in recs[1:]:
        assert rec["nvlink_tx_bytes_s"] == pytest.approx(100_000 * 1024 / INTERVAL)


def test_a_field_file_chooses_what_is_collected(tmp_path: Path, fake_nvml_lib: Path) -> None:
    fields = tmp_path / "fields.yaml"
    fields.write_text(yaml.safe_dump({
        "fields": {"util_gpu": FIELDS["fields"]["util_gpu"],
                   "power_w": FIELDS["fields"]["power_w"]},
        "xid": False, "processes": False}))
    sc = Scenario(gpus=1)
    gpu(sc, 0)
    out = run(tmp_path, fake_nvml_lib, sc, steps=[0], fields=str(fields), counts=["temp"])
    rec = out["collects"][0][0]
    assert {k for k in rec if k not in ("v", "type", "time", "node", "gpu_index", "gpu_uuid",
                                        "card_type", "mig_instance", "healthy", "seq")} == {
        "util_gpu", "power_w"}
    assert out["counts"]["temp"] == 0


def test_the_scenario_can_advance_by_itself(tmp_path: Path, fake_nvml_lib: Path) -> None:
    """For a free-running agent: FAKE_NVML_STEP_S moves the scenario on with time."""
    sc = Scenario(gpus=1)
    gpu(sc, 0)
    sc.at(3, "g0", "util.gpu", 99)
    out = drive(fake_nvml_lib, sc.write(tmp_path / "s.txt"), step_s=0.5, steps=[0, 1],
                sleep_s=1.6)
    first, second = (c[0]["util_gpu"] for c in out["collects"])
    assert first == sc.number(0, "g0", "util.gpu") and second == sc.number(3, "g0", "util.gpu")


def test_no_driver_library_is_a_clear_error(tmp_path: Path) -> None:
    if ctypes.util.find_library("nvidia-ml"):
        pytest.skip("a real NVIDIA driver library is installed on this machine")
    empty = tmp_path / "lib"
    empty.mkdir()
    out = drive(empty, None)
    assert out["error"]["type"] == "NvmlUnavailable"
    assert "libnvidia-ml.so.1 was not found" in out["error"]["message"]
    assert "install the NVIDIA driver" in out["error"]["message"]


def test_a_driver_that_is_not_loaded_is_a_clear_error(fake_nvml_lib: Path) -> None:
    out = drive(fake_nvml_lib, None)   # the fake answers DRIVER_NOT_LOADED without a scenario
    assert out["error"]["type"] == "NvmlUnavailable"
    assert "kernel driver is not loaded" in out["error"]["message"]
