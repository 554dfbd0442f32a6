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

An existing topic is left as it is, but compared with what would be created: another
partition count is said; another ``cleanup.policy``, or a shorter retention than the
one set here, makes the topic *unfit* (``TopicsReport.unfit``): a topic that a broker
created on first use (``auto.create.topics.enable``) has one partition, the broker's
retention and no compaction, and inventory kept that way is lost after a week.
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


class TopicsReport(dict[str, str]):
    """``{topic: "created" | "exists" | "exists, …"}``; ``unfit`` names the existing
    topics whose configuration gpuledger cannot work with (each one's line says why and
    how to fix it)."""

    def __init__(self) -> None:
        super().__init__()
        self.unfit: list[str] = []


def _span(ms: int) -> str:
    if ms < 0:
        return "forever"
    for unit, size in (("days", 24 * HOUR_MS), ("h", HOUR_MS), ("min", 60_000),
                       ("s", 1000)):
        if ms >= size and ms % size == 0:
            n = ms // size
            return f"{n} {'day' if unit == 'days' and n == 1 else unit}"
    return f"{ms} ms"


def _policy(value: str) -> frozenset[str]:
    return frozenset(p.strip() for p in value.split(",") if p.strip())


def config_problems(spec: TopicSpec, have: dict[str, str]) -> tuple[list[str], list[str]]:
    """How an existing topic's effective configuration ``have`` differs from ``spec``'s:
    ``(unfit, notes)``. Another cleanup policy is unfit (compaction is what keeps each
    node's inventory; a compacted topic of keyless records fails), and so is a
    retention shorter than gpuledger's, where the topic deletes (records would go
    before they are read or rebuilt from); a longer one is a note (more disk)."""
    unfit: list[str] = []
    notes: list[str] = []
    want_policy = spec.config.get("cleanup.policy")
    got_policy = have.get("cleanup.policy")
    if want_policy and got_policy is not None and _policy(got_policy) != _policy(want_policy):
        unfit.append(f"cleanup.policy={got_policy} (gpuledger's: {want_policy})")
    want_ret = spec.config.get("retention.ms")
    got_ret = have.get("retention.ms")
    deletes = "delete" in _policy(got_policy or want_policy or "delete")
    if want_ret is not None and got_ret is not None and deletes:
        want_ms, got_ms = int(want_ret), int(got_ret)
        if want_ms != got_ms:
            said = (f"retention.ms={got_ms} ({_span(got_ms)}; gpuledger's: {want_ms}, "
                    f"{_span(want_ms)})")
            if want_ms < 0 or 0 <= got_ms < want_ms:
                unfit.append(said)
            else:
                notes.append(said)
    return unfit, notes


def _fix(settings: KafkaSettings, spec: TopicSpec) -> str:
    config = ",".join(f"{k}={v}" for k, v in sorted(spec.config.items()))
    return (f"fix: kafka-configs.sh --bootstrap-server {settings.bootstrap} --alter "
            f"--entity-type topics --entity-name {spec.name} --add-config {config}, or "
            "delete the topic and run `gpuledger topics create` again (docs/kafka.md, "
            "Topics)")


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
                  replication: int = 1) -> TopicsReport:
    """Create missing topics; returns ``{topic: "created" | "exists" | "exists, …"}``,
    an existing topic's other partition count or configuration said after "exists", the
    unfit ones in ``.unfit``."""
    from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient, NewTopic
    from kafka.errors import TopicAlreadyExistsError

    admin = KafkaAdminClient(**settings.client_config())
    try:
        existing = set(admin.list_topics())
        specs = topic_specs(settings, telemetry_partitions, replication)
        there = [s.name for s in specs if s.name in existing]
        held = {d.get("name") or d.get("topic"): len(d.get("partitions") or [])
                for d in (admin.describe_topics(there) if there else [])}
        configs: dict[str, dict[str, str]] = {}
        unchecked = ""
        if there:
            try:
                described = admin.describe_configs(
                    [ConfigResource(ConfigResourceType.TOPIC, name) for name in there],
                    config_filter="all")
                for name, entries in (described.get("topic") or {}).items():
                    configs[name] = {k: str(v.get("value")) for k, v in entries.items()
                                     if isinstance(v, dict) and v.get("value") is not None}
            except Exception as exc:  # e.g. no DESCRIBE_CONFIGS right: say, do not stop
                unchecked = f" (its configuration not checked: {type(exc).__name__}: {exc})"
        result = TopicsReport()
        for spec in specs:
            if spec.name in existing:
                said: list[str] = []
                have = held.get(spec.name, spec.partitions)
                if have != spec.partitions:
                    # "exists" alone hid a topic of another size than asked
                    said.append(f"with {have} partitions (not {spec.partitions}: an "
                                "existing topic is left as it is; docs/kafka.md, Topics "
                                "created again)")
                unfit, notes = config_problems(spec, configs.get(spec.name, {}))
                said += notes
                if unfit:
                    result.unfit.append(spec.name)
                    said.append("UNFIT for gpuledger: " + "; ".join(unfit) + "; "
                                + _fix(settings, spec))
                result[spec.name] = ", ".join(["exists", *said]) + (
                    unchecked if spec.name not in configs else "")
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
