"""Follow a Kafka service's engine: one per instance, whatever partitions it holds."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def follow_engine(service: Any, attach: Callable[[Any], Any]) -> None:
    """Call ``attach(engine)`` for the engine ``service`` runs (once: partitions come and
    go inside it)."""
    service.follow(attach)
