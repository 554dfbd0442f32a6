"""The agent's JSON-lines encoder: contract order, omissions, and the processor accepts it."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone

from gpuledger.agent.encode import encode_lines, ordered, stamp
from gpuledger.contract.schema import FIELDS
from gpuledger.pipeline.decode import decode_jsonl

NOW = datetime(2026, 1, 5, 10, 0, 10, 123456, tzinfo=UTC)


def test_stamp_is_utc_with_milliseconds() -> None:
    plus2 = NOW.astimezone(timezone(timedelta(hours=2)))
    assert stamp(plus2) == "2026-01-05T10:00:10.123Z"


def test_order_omissions_and_unknown_fields() -> None:
    rec = {"processes": [{"pid": 1, "used_mib": 2.0, "job_id": None}], "extra": "kept",
           "gpu_uuid": "GPU-1", "power_w": float("nan"), "temp_c": float("inf"),
           "mig_instance": None, "type": "telemetry", "v": 1, "time": NOW, "node": "n",
           "seq": 4, "gpu_index": 0, "card_type": "A10-24GB", "util_gpu": 3.0}
    out = ordered(rec)
    contract = [f.name for f in FIELDS["telemetry"]]
    names = list(out)
    assert names[-1] == "extra"
    assert names[:-1] == [n for n in contract if n in out]      # contract order
    assert "power_w" not in out and "temp_c" not in out and "mig_instance" not in out
    assert out["time"] == "2026-01-05T10:00:10.123Z"
    assert out["processes"] == [{"pid": 1, "used_mib": 2.0, "job_id": None}]


def test_lines_decode_without_rejects() -> None:
    recs = [{"v": 1, "type": "telemetry", "time": NOW, "node": "n", "seq": i, "gpu_index": i,
             "gpu_uuid": f"GPU-{i}", "card_type": "A10-24GB", "util_gpu": float(i),
             "healthy": True, "processes": []} for i in range(3)]
    recs.append({"v": 1, "type": "inventory", "time": NOW, "node": "n", "pool": "p",
                 "card_type": "A10-24GB", "gpu_count": 3, "gpu_mem_mib": 23028.0,
                 "labels": {"rack": "r1"}, "schedulable": True, "health": "ok",
                 "unhealthy_gpus": []})
    data = encode_lines(recs)
    assert data.count(b"\n") == 4 and json.loads(data.splitlines()[3])["labels"] == {"rack": "r1"}
    decoded = decode_jsonl(data, now=NOW)
    assert decoded.rejects.height == 0
    assert decoded.frames["telemetry"]["seq"].to_list() == [0, 1, 2]
    assert decoded.frames["inventory"].height == 1


def test_the_examples_in_docs_agent_md_are_valid_records() -> None:
    import re
    from pathlib import Path

    text = (Path(__file__).parent.parent / "docs" / "agent.md").read_text()
    blocks = re.findall(r"```json\n(.*?)```", text, re.S)
    lines = [line for block in blocks for line in block.splitlines() if line.strip()]
    assert len(lines) >= 2
    decoded = decode_jsonl(("\n".join(lines) + "\n").encode(), now=datetime(2026, 1, 6,
                                                                          tzinfo=UTC))
    assert decoded.rejects.height == 0, decoded.rejects["reason"].to_list()
    assert decoded.frames["telemetry"].height == len(lines)
