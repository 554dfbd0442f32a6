"""Bad input never changes the facts of the good input, and is reported line by line."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
from events import alloc, at, inventory, iso, job, jsonl, series
from test_pipeline_properties import digest

from gpuledger.pipeline import query
from gpuledger.pipeline.config import ProcessorConfig
from gpuledger.pipeline.ingest import ingest

GOOD = [
    inventory("n1", at(0), gpus=2),
    job("submitted", "j", at(0), gpus=1),
    job("started", "j", at(1), allocation=alloc("n1", 0)),
    job("finished", "j", at(8)),
    *series("n1", 0, at(0), 10, sm=0.4, jobs=["j"]),
    *series("n1", 1, at(0), 10, util=0.0, seq0=100),
]

BAD_LINES = [
    b"{this is not json",
    b'["an", "array"]',
    json.dumps({"v": 1, "type": "telemetry", "time": iso(at(3)), "node": "n1", "seq": 7,
                "gpu_index": 0, "gpu_uuid": "GPU-n1-0", "card_type": "H100-SXM5-80GB",
                "util_gpu": "high"}).encode(),                                  # wrong type
    json.dumps({"v": 1, "type": "telemetry", "time": iso(at(3)), "seq": 8, "gpu_index": 1,
                "gpu_uuid": "GPU-n1-1", "card_type": "H100-SXM5-80GB"}).encode(),  # no node
    json.dumps({"v": 1, "type": "telemetry", "time": iso(at(3)), "node": "n1", "seq": 9,
                "gpu_index": 1, "gpu_uuid": "GPU-n1-1", "card_type": "H100-SXM5-80GB",
                "util_gpu": 80.0, "mem_used_mib": -5.0}).encode(),               # negative
    json.dumps({"v": 1, "type": "telemetry", "time": iso(at(3)), "node": "n1", "seq": 10,
                "gpu_index": 1, "gpu_uuid": "GPU-n1-1", "card_type": "H100-SXM5-80GB",
                "sm_active": 1.5}).encode(),                                      # out of range
    json.dumps({"v": 1, "type": "job", "time": iso(at(4)), "event": "teleported",
                "job_id": "j"}).encode(),                                         # unknown event
    json.dumps({"v": 1, "type": "gossip", "time": iso(at(4))}).encode(),        # unknown type
    json.dumps({"v": 1, "type": "job", "time": "2999-01-01T00:00:00Z", "event": "finished",
                "job_id": "j"}).encode(),                                         # far future
    json.dumps({"v": 1, "type": "job", "time": "yesterday", "event": "finished",
                "job_id": "j"}).encode(),                                         # bad time
    json.dumps({"v": 1, "type": "job", "time": iso(at(2)), "event": "started",
                "job_id": "k"}).encode(),                                         # no allocation
    json.dumps({"v": 9, "type": "job", "time": iso(at(2)), "event": "finished",
                "job_id": "j"}).encode(),                                         # version
]


def test_bad_lines_are_rejected_and_good_facts_unchanged(tmp_path: Path) -> None:
    clean = tmp_path / "clean.jsonl"
    clean.write_bytes(jsonl(GOOD))
    ingest([clean], tmp_path / "clean_wh", ProcessorConfig())

    good_lines = jsonl(GOOD).splitlines()
    mixed_lines: list[bytes] = []
    bad_at: list[int] = []
    for i, line in enumerate(good_lines):
        mixed_lines.append(line)
        if i % 10 == 5 and len(bad_at) < len(BAD_LINES):
            mixed_lines.append(BAD_LINES[len(bad_at)])
            bad_at.append(len(mixed_lines))           # 1-based line number
    mixed_lines.extend(BAD_LINES[len(bad_at):])
    bad_at.extend(range(len(mixed_lines) - len(BAD_LINES) + len(bad_at) + 1,
                        len(mixed_lines) + 1))
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_bytes(b"\n".join(mixed_lines) + b"\n")
    result = ingest([mixed], tmp_path / "mixed_wh", ProcessorConfig())

    assert result.rejects.height == len(BAD_LINES)
    assert sorted(result.rejects["line"].to_list()) == bad_at
    assert (result.rejects["source"] == str(mixed)).all()
    assert result.rejects["reason"].str.len_chars().min() > 10
    clean_facts = {k: v for k, v in digest(tmp_path / "clean_wh").items()
                   if not k.startswith("facts/rejects")}
    mixed_facts = {k: v for k, v in digest(tmp_path / "mixed_wh").items()
                   if not k.startswith("facts/rejects")}
    assert mixed_facts == clean_facts
    _, rows = query.run(tmp_path / "mixed_wh", "SELECT count(*) FROM rejects")
    assert rows[0][0] == len(BAD_LINES)
    reasons = " | ".join(result.rejects.sort("line")["reason"].to_list())
    for needle in ("util_gpu", "node", "mem_used_mib", "sm_active", "teleported",
                   "gossip", "future", "time", "allocation"):
        assert needle in reasons, needle
    assert result.counters.rejected == {
        k or "unknown": v
        for k, v in result.rejects.group_by("record_type").len().iter_rows()
    }
    assert isinstance(result.rejects, pl.DataFrame)
