"""Which deployment a consumer group's commits belong to (``kafka/group_claim.py``); the
service's use of it runs against a real broker in test_kafka_resilience.py."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from gpuledger.pipeline.kafka import group_claim
from gpuledger.pipeline.store import open_store


def test_the_id_is_made_once_and_shared(tmp_path: Path) -> None:
    store = open_store(tmp_path / "state")
    ids: list[str] = []
    threads = [threading.Thread(target=lambda: ids.append(group_claim.deployment_id(store)))
               for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(ids)) == 1 and len(ids[0]) == 16 and ids[0].isalnum()
    assert (tmp_path / "state" / "deployment.id").read_text().strip() == ids[0]


@pytest.mark.parametrize("content", [b"", b"not an id!\n", b"\xff\xfe", b"a" * 65])
def test_a_damaged_id_file_is_refused_with_its_place(tmp_path: Path, content: bytes) -> None:
    store = open_store(tmp_path / "state")
    (tmp_path / "state").mkdir(exist_ok=True)
    (tmp_path / "state" / "deployment.id").write_bytes(content)
    with pytest.raises(ValueError, match=r"deployment\.id: not a deployment id .*delete the file"):
        group_claim.deployment_id(store)


def test_commits_are_read_back_and_sorted_by_age() -> None:
    now = 1_000_000.0
    meta = group_claim.commit_metadata("abc", now - 30)
    assert meta == "gpuledger abc 999970"
    claims = [group_claim.parse(0, meta, now),
              group_claim.parse(1, "gpuledger other 999000", now),
              group_claim.parse(2, "gpuledger other 999990", now)]
    assert [c.age_s for c in claims if c] == [30.0, 1000.0, 10.0]
    # as librdkafka (the confluent client) stores it: with its C string's NUL
    assert group_claim.parse(0, meta + "\x00", now) == claims[0]
    for foreign in ("", None, "something else", "gpuledger x", "gpuledger x y",
                    "gpuledger x 12 13", "other x 12"):
        assert group_claim.parse(3, foreign, now) is None
    others = group_claim.others([c for c in claims if c], "abc")
    assert [(c.partition, c.age_s) for c in others] == [(2, 10.0), (1, 1000.0)]
    assert group_claim.parse(0, "gpuledger abc 2000000", now).age_s == 0  # type: ignore[union-attr]


def test_a_live_service_is_one_that_committed_within_six_intervals() -> None:
    assert group_claim.window_s(10) == 120
    assert group_claim.window_s(60) == 360
