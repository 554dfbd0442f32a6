"""Which deployment a consumer group's committed offsets belong to.

A consumer group splits the telemetry partitions among its members, whatever they
write to. Two services given the same group (``--group``, by default
``gpuledger-processor``) and different warehouses — staging and production on one Kafka
cluster, say — each get some of the partitions and write only theirs: both warehouses
miss facts, and nothing says so.

A *deployment* is a warehouse with its checkpoint folder. Its id is a random token kept
in the group's checkpoint folder (``deployment.id``, created by the first instance and
read by every other, so all instances of one deployment share it; in a bucket two
instances starting in the same instant may both write it, each reading its own back;
the last write stands, and every check reads the file again, before this instance
commits with the id). Each offset commit
carries ``gpuledger <id> <unix time>`` as its metadata. Before each checkpoint, and at
the start, the service reads the group's committed metadata of every telemetry
partition: a commit by another deployment within ``window_s`` means another service is
live in the group, and this one stops with the reason (at the start before it reads
anything; at a checkpoint before it commits).
An older commit by another deployment (a warehouse deleted and started again, a
deployment since moved to its own group) is a warning only; this deployment's commits
replace it. Commits without such metadata (other tools, earlier releases) are ignored.
"""

from __future__ import annotations

import contextlib
import secrets
from dataclasses import dataclass

from gpuledger.pipeline.store import Store, StoreConflict

ID_FILE = "deployment.id"
PREFIX = "gpuledger"


def deployment_id(store: Store) -> str:
    """The deployment's id from ``store`` (the group's checkpoint folder), created there
    once when missing (the first writer's stands when two instances start at once)."""
    data = store.read(ID_FILE)
    if data is None:
        with contextlib.suppress(StoreConflict):
            store.create(ID_FILE, secrets.token_hex(8).encode() + b"\n")
        data = store.read(ID_FILE)
    text = (data or b"").decode("ascii", "replace").strip()
    if not text or not text.isalnum() or len(text) > 64:
        raise ValueError(f"{store.url_of(ID_FILE)}: not a deployment id ({text[:40]!r}); "
                         "delete the file to make a new one")
    return text


FLUSHED = "flushed"
"""The last word of a commit made after a batch run's flush (``--exit-when-idle``) with
no record read since: every minute of the partition up to that offset is written."""


def commit_metadata(deployment: str, now: float, flushed: bool = False) -> str:
    return f"{PREFIX} {deployment} {int(now)}" + (f" {FLUSHED}" if flushed else "")


@dataclass(frozen=True)
class Claim:
    """A telemetry partition's commit by a deployment, ``age_s`` ago."""

    partition: int
    deployment: str
    age_s: float
    flushed: bool = False
    """Committed after a flush with nothing read since (:data:`FLUSHED`)."""


def parse(partition: int, metadata: str | None, now: float) -> Claim | None:
    """The claim in a commit's metadata, or None when it is not one of ours. (librdkafka
    stores the metadata with its C string's terminating NUL: it is not part of it.)"""
    words = (metadata or "").rstrip("\x00").split()
    if (len(words) not in (3, 4) or words[0] != PREFIX or not words[2].isdigit()
            or words[3:] not in ([], [FLUSHED])):
        return None
    return Claim(partition, words[1], max(0.0, now - int(words[2])), words[3:] == [FLUSHED])


def others(claims: list[Claim], mine: str) -> list[Claim]:
    """The claims of other deployments, newest first."""
    return sorted((c for c in claims if c.deployment != mine), key=lambda c: c.age_s)


def window_s(checkpoint_interval_s: float) -> float:
    """How recent another deployment's commit must be to count as a live service: a
    live one commits every checkpoint interval."""
    return max(120.0, 6 * checkpoint_interval_s)
