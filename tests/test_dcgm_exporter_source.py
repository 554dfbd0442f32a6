"""The dcgm-exporter source on /metrics text in dcgm-exporter's format."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from gpuledger.agent.sources.dcgm_exporter import DcgmExporterSource, parse_metrics
from gpuledger.pipeline.decode import decode_jsonl

TEXT = (Path(__file__).parent / "fixtures" / "dcgm_exporter_metrics.txt").read_text()
NOW = datetime(2026, 1, 5, 10, 0, tzinfo=UTC)


def test_parser_reads_names_labels_values_and_escapes() -> None:
    rows = parse_metrics(TEXT + 'x_total{a="q\\"uote",b="back\\\\slash"} 3 1700000000000\n')
    assert ("DCGM_FI_DEV_GPU_UTIL", "0") in {(n, lb.get("gpu")) for n, lb, _ in rows}
    assert rows[-1] == ("x_total", {"a": 'q"uote', "b": "back\\slash"}, 3.0)


def test_samples_map_fields_attribution_and_mig() -> None:
    src = DcgmExporterSource(node="gpu-node-07")
    recs = src.convert(TEXT, NOW)
    by = {(r["gpu_index"], r["mig_instance"]): r for r in recs}
    g0, g1, mig = by[(0, None)], by[(1, None)], by[(1, "1g.10gb/9")]
    assert g0["util_gpu"] == 100.0 and g0["sm_active"] == 0.912345
    assert g0["tensor_active"] == 0.5321 and g0["pcie_rx_bytes_s"] == 2.5e9
    assert g0["mem_used_mib"] == 70823 and g0["mem_total_mib"] == 70823 + 10240 + 496
    assert g0["power_w"] == 612.513 and g0["temp_c"] == 61 and g0["sm_clock_mhz"] == 1980
    # the same card type name as the NVML source gives (modelName is NVML's name)
    assert g0["card_type"] == "H100-80GB-HBM3"
    assert g0["processes"] == [{"pid": 0, "used_mib": 0.0, "job_id": "vision/resnet-train-0"}]
    assert g1["processes"][0]["job_id"] == "4242"
    assert mig["gpu_uuid"].startswith("MIG-")
    assert mig["processes"][0]["job_id"] == "notebooks/nb-ana"
    assert "nvlink_rx_bytes_s" not in g0           # not exported: omitted, not faked
    assert [r["seq"] for r in recs] == [0, 1, 2]
    assert g1["ecc_dbe"] == 0                       # a counter: no increase seen yet
    assert g1["xid_errors"] == 0


def test_counters_become_deltas_and_xid_codes_events() -> None:
    src = DcgmExporterSource(node="gpu-node-07", card_type="H100-SXM5-80GB")
    src.convert(TEXT, NOW)
    later = TEXT.replace('hpc_job="4242"} 2\n', 'hpc_job="4242"} 5\n').replace(
        'hpc_job="4242",err_code="0",err_msg="No Error"} 0',
        'hpc_job="4242",err_code="79",err_msg="GPU has fallen off the bus"} 79')
    g1 = {r["gpu_index"]: r for r in src.convert(later, NOW) if r["mig_instance"] is None}[1]
    assert g1["ecc_dbe"] == 3 and g1["xid_errors"] == 1
    assert g1["card_type"] == "H100-SXM5-80GB"
    again = {r["gpu_index"]: r for r in src.convert(later, NOW) if r["mig_instance"] is None}
    assert again[1]["xid_errors"] == 0 and again[1]["ecc_dbe"] == 0   # nothing new


def test_records_are_valid_contract_events() -> None:
    import json

    recs = DcgmExporterSource(node="gpu-node-07").convert(TEXT, NOW)
    data = b"".join(json.dumps({k: v for k, v in r.items() if v is not None}).encode() + b"\n"
                    for r in recs)
    decoded = decode_jsonl(data, now=NOW)
    assert decoded.rejects.height == 0, decoded.rejects["reason"].to_list()
    assert decoded.frames["telemetry"].height == 3
