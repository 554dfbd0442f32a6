"""The topics gpuledger uses, and the command that creates them.

| topic | key | partitions | retention | cleanup |
|---|---|---|---|---|
| ``gpu.telemetry.v1`` | node | 12 | 24 h | delete |
| ``gpu.inventory.v1`` | node | 3 | forever | compact |
| ``sched.events.v1`` | job | 3 | 7 days | delete |
| ``gpuledger.deadletter.v1`` | none | 1 | 7 days | delete |
| ``gpuledger.attempt-parts.v1`` | shard | 1 | 7 days | delete |
| ``gpuledger.alerts.v1`` | alert/job/attempt | 1 | 30 days | delete |

Telemetry is partitioned by node, so processors can share it in one consumer group.
Inventory is compacted: the newest record of each node is its state. Scheduler events
keep a full history so a processor can rebuild job state by reading them from the start.
Attempt parts are internal: each processor shard's part of the job attempts that ended
(``shard.py``), read by the owner shard.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuledger.pipeline.kafka.settings import KafkaSettings

HOUR_MS = 3_600_000


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int
    config: dict[str, str]


def topic_specs(settings: KafkaSettings, telemetry_partitions: int = 12,
                replication: int = 1) -> list[TopicSpec]:
    """The topics to create, with their partitions and configuration."""
    t = settings.topics
    return [
        TopicSpec(t.telemetry, telemetry_partitions,
                  {"retention.ms": str(24 * HOUR_MS), "cleanup.policy": "delete"}),
        TopicSpec(t.inventory, 3, {"cleanup.policy": "compact", "retention.ms": "-1"}),
        TopicSpec(t.jobs, 3, {"retention.ms": str(7 * 24 * HOUR_MS), "cleanup.policy": "delete"}),
        TopicSpec(t.dead_letters, 1,
                  {"retention.ms": str(7 * 24 * HOUR_MS), "cleanup.policy": "delete"}),
        TopicSpec(t.attempt_parts, 1,
                  {"retention.ms": str(7 * 24 * HOUR_MS), "cleanup.policy": "delete"}),
        TopicSpec(t.alerts, 1,
                  {"retention.ms": str(30 * 24 * HOUR_MS), "cleanup.policy": "delete"}),
    ]


def create_topics(settings: KafkaSettings, telemetry_partitions: int = 12,
                  replication: int = 1) -> dict[str, str]:
    """Create missing topics; returns ``{topic: "created" | "exists"}``."""
    from kafka.admin import KafkaAdminClient, NewTopic
    from kafka.errors import TopicAlreadyExistsError

    admin = KafkaAdminClient(**settings.client_config())
    try:
        existing = set(admin.list_topics())
        specs = topic_specs(settings, telemetry_partitions, replication)
        there = [s.name for s in specs if s.name in existing]
        held = {d.get("name") or d.get("topic"): len(d.get("partitions") or [])
                for d in (admin.describe_topics(there) if there else [])}
        result: dict[str, str] = {}
        for spec in specs:
            if spec.name in existing:
                have = held.get(spec.name, spec.partitions)
                # "exists" alone hid a topic of another size than asked
                result[spec.name] = "exists" if have == spec.partitions else (
                    f"exists, with {have} partitions (not {spec.partitions}: an existing "
                    "topic is left as it is; docs/kafka.md, Topics created again)")
                continue
            try:
                admin.create_topics([NewTopic(spec.name, spec.partitions, replication,
                                              topic_configs=spec.config)])
                result[spec.name] = "created"
            except TopicAlreadyExistsError:
                result[spec.name] = "exists"
        return result
    finally:
        admin.close()
