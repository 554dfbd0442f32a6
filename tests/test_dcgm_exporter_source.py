"""The dcgm-exporter source on /metrics text in dcgm-exporter's format."""

from __future__ import annotations

import json
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


HOSTILE = (Path(__file__).parent / "fixtures" / "dcgm_exporter_hostile.txt").read_text()
UUID_0 = "GPU-3c1e7f2a-1111-4c9d-a0b1-000000000000"
UUID_1 = "GPU-3c1e7f2a-2222-4c9d-a0b1-000000000001"
STRAY = "GPU-9f00dead-beef-4c9d-a0b1-00000000ffff"


def test_untrusted_series_are_skipped_and_counted_never_turned_into_gpus() -> None:
    src = DcgmExporterSource(node="gpu-node-11")
    recs = src.convert(HOSTILE, NOW)
    # two physical GPUs, each once: no 'gpu-?' of card 'unknown', no second GPU 0
    assert [(r["gpu_index"], r["gpu_uuid"]) for r in recs] == [(0, UUID_0), (1, UUID_1)]
    assert STRAY not in json.dumps(recs)
    assert dict(src.skipped) == {"no_gpu_label": 2, "uuid_conflict": 1, "not_a_number": 2}
    g0, g1 = recs
    # extra labels are ignored; the card type still comes from modelName
    assert g0["card_type"] == g1["card_type"] == "H100-80GB-HBM3"
    assert g0["processes"] == [{"pid": 0, "used_mib": 0.0, "job_id": "vision/resnet-train-0"}]
    # a GPU time-sliced between two pods: both jobs, its memory counted once
    assert [p["job_id"] for p in g1["processes"]] == ["serving/llm-a-7f9c", "serving/llm-b-5d2e"]
    assert g1["mem_total_mib"] == 20815 + 60000 + 496 and g1["mem_used_mib"] == 20815
    assert g0["mem_total_mib"] == 70823 + 10240 + 496 and g0["sm_active"] == 0.93
    assert "sm_active" not in g1                     # NaN: not exported, not faked
    decoded = decode_jsonl(b"".join(json.dumps({k: v for k, v in r.items() if v is not None})
                                    .encode() + b"\n" for r in recs), now=NOW)
    assert decoded.rejects.height == 0 and decoded.frames["telemetry"].height == 2
    src.convert(HOSTILE, NOW)                        # counted again at every scrape
    assert src.skipped["uuid_conflict"] == 2


def _series(gpu: str, uuid: str, value: float = 50) -> str:
    return f'DCGM_FI_DEV_GPU_UTIL{{gpu="{gpu}",UUID="{uuid}",modelName="NVIDIA A100"}} {value}\n'


def test_a_tie_between_two_uuids_keeps_the_one_seen_there_before() -> None:
    src = DcgmExporterSource(node="n")
    tie = _series("2", "GPU-a") + _series("2", "GPU-b")
    assert src.convert(tie, NOW) == []               # undecidable: GPU 2 is left out
    assert src.skipped["uuid_conflict"] == 2
    assert [r["gpu_uuid"] for r in src.convert(_series("2", "GPU-b"), NOW)] == ["GPU-b"]
    assert [r["gpu_uuid"] for r in src.convert(tie, NOW)] == ["GPU-b"]
    assert src.skipped["uuid_conflict"] == 3
    # MIG instances share their GPU's index under their own UUIDs: not a conflict
    mig = (_series("2", "GPU-b") + 'DCGM_FI_DEV_GPU_UTIL{gpu="2",UUID="MIG-x",'
           'GPU_I_PROFILE="1g.10gb",GPU_I_ID="7"} 5\n')
    assert [r["gpu_uuid"] for r in src.convert(mig, NOW)] == ["GPU-b", "MIG-x"]
    assert src.skipped["uuid_conflict"] == 3


def test_the_agent_counts_the_skips_in_its_self_metrics() -> None:
    from prometheus_client import generate_latest

    from gpuledger.agent.attribution import Chain
    from gpuledger.agent.config import AgentConfig
    from gpuledger.agent.metrics import registry_for
    from gpuledger.agent.run import Agent

    class Scrape(DcgmExporterSource):
        def scrape(self) -> str:
            return HOSTILE

    agent = Agent(AgentConfig(node="gpu-node-11", source="dcgm-exporter"),
                  Scrape(node="gpu-node-11"), Chain([]))
    assert len(agent.collect(NOW)) == 2
    text = generate_latest(registry_for(agent)).decode()
    for reason, count in (("no_gpu_label", 2), ("uuid_conflict", 1), ("not_a_number", 2)):
        line = f'gpuledger_agent_source_series_skipped_total{{reason="{reason}"}} {count}.0'
        assert line in text, text
