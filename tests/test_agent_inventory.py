"""Inventory: labels, pool, the record from samples, and when to publish."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from gpuledger.agent.inventory import (
    InventoryPublisher,
    explicit_pool,
    inventory_from_samples,
    node_labels,
    read_labels_file,
    with_labels,
)


def test_labels_file_and_pool(tmp_path: Path) -> None:
    path = tmp_path / "labels"
    path.write_text("# written by provisioning\nrack=r12\n\nzone = az1\nnot a label\n"
                    "gpuledger.io/pool=train\n")
    assert read_labels_file(path) == {"rack": "r12", "zone": "az1", "gpuledger.io/pool": "train"}
    labels = node_labels({"rack": "r1", "team": "ml"}, path)
    assert labels["rack"] == "r12" and labels["team"] == "ml"      # the file wins
    assert explicit_pool("infer", "gpuledger.io/pool", labels) == "infer"
    assert explicit_pool(None, "gpuledger.io/pool", labels) == "train"
    assert explicit_pool(None, "absent", labels) is None
    assert read_labels_file(tmp_path / "absent") == {}


def _sample(i: int, **kw: object) -> dict[str, object]:
    return {"gpu_index": i, "card_type": "H100-SXM5-80GB", "mem_total_mib": 81559.0,
            "healthy": True, **kw}


def test_record_from_samples_with_mig_and_unhealthy() -> None:
    samples = [_sample(0), _sample(1, healthy=False, nvlink_rx_bytes_s=1.0),
               _sample(2, mig_instance=None),
               _sample(2, mig_instance="3g.40gb/1", mem_total_mib=40192.0)]
    rec = inventory_from_samples("n1", "train", samples, "2026-01-05T10:00:00.000Z")
    assert (rec["gpu_count"], rec["gpu_mem_mib"], rec["card_type"]) == (3, 81559.0,
                                                                         "H100-SXM5-80GB")
    assert rec["health"] == "degraded" and rec["unhealthy_gpus"] == [1]
    assert rec["topology"] == "nvlink" and rec["labels"] == {"gpuledger.mig": "2:3g.40gb/1"}
    down = inventory_from_samples("n1", "p", [_sample(0, healthy=False)], "t")
    assert down["health"] == "down"
    merged = with_labels(rec, {"rack": "r1"}, "other", schedulable=False)
    assert merged["labels"]["rack"] == "r1" and merged["pool"] == "other"
    assert merged["schedulable"] is False and rec["schedulable"] is True


def test_publisher_on_change_and_republish() -> None:
    pub = InventoryPublisher(republish_s=100.0)
    a = {"time": "t0", "node": "n", "health": "ok"}
    assert pub.due(a, 0.0)
    pub.mark(a, 0.0)
    assert not pub.due({**a, "time": "t1"}, 50.0)                 # only the time differs
    assert pub.due({**a, "health": "degraded"}, 50.0)              # a change
    assert pub.due({**a, "time": "t2"}, 100.0)                     # refresh
    never = InventoryPublisher(republish_s=0)
    never.mark(a, 0.0)
    assert not never.due(a, 1e9)


def test_a_bad_labels_file_is_one_warning(tmp_path: Path,
                                          caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "labels"
    path.write_bytes(b"\xff\xfe=\xff\n")
    with caplog.at_level(logging.WARNING):
        assert read_labels_file(path) == {}
        assert read_labels_file(tmp_path) == {}                    # a folder
        path.write_text("=x\nrack=r1\n")
        assert read_labels_file(path) == {"rack": "r1"}            # no empty label name
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 3 and all("\n" not in m for m in said)
    assert "cannot read the labels file" in said[0] and "not UTF-8 text (byte 0)" in said[0]
    assert "is a directory" in said[1]
    assert "line 1: no label name" in said[2]
