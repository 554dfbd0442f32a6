"""A Kafka that cannot be reached, said in one line by every command that meets it."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

from gpuledger.cli.errors import CliError

if TYPE_CHECKING:
    from gpuledger.pipeline.kafka.settings import KafkaSettings
    from gpuledger.pipeline.kafka.topics import TopicsReport


@contextlib.contextmanager
def unreachable_said(bootstrap: str | None) -> Iterator[None]:
    """A Kafka at ``bootstrap`` that cannot be reached, met in the block, is one line
    (``CliError``: ``service.kafka_reached``'s) instead of a traceback; other errors go
    on as they are."""
    if bootstrap is None:
        yield
        return
    from gpuledger.pipeline.kafka.service import ServiceStartError, kafka_reached

    try:
        with kafka_reached(bootstrap):
            yield
    except ServiceStartError as exc:
        raise CliError(str(exc)) from None


def topics_created(settings: KafkaSettings, telemetry_partitions: int = 12,
                   replication: int = 1) -> TopicsReport:
    """``create_topics``, its failures as one line: ``cannot reach Kafka at …`` or
    ``cannot create topics on …: the reason``."""
    from gpuledger.pipeline.kafka.topics import create_topics

    try:
        with unreachable_said(settings.bootstrap):
            return create_topics(settings, telemetry_partitions, replication)
    except CliError:
        raise
    except Exception as exc:
        raise CliError(f"cannot create topics on {settings.bootstrap}: {exc}") from None
