"""Two faults of kafka-python 3.0.12's group join, mended on each consumer we open.

A rebalance's JoinGroup/SyncGroup round runs as a task on the client's network thread;
``poll`` waits for it at most its own timeout and leaves it in flight. What the client
does with a round that ends *between* two polls is wrong twice:

1. **A member stuck for good.** A rejoin asked for by a metadata change (the topic's
   partitions seen for the first time, or grown) is not recorded: ``need_rejoin()``
   derives it from the leader's assignment snapshot, which the round itself updates. When
   the round ends between two polls, the next poll sees nothing to do: the assignment it
   received is never applied and its heartbeat, turned off for the round, stays off. The
   member holds no partition until it is restarted. (Seen: one service instance of two
   idle for six minutes; the Java client records the rejoin, KAFKA-9815.) Mended by
   recording it: a rejoin ``need_rejoin()`` reports stays asked for until a round
   completes.
2. **Rounds thrown away.** A round that ended between two polls is not read: the next
   poll sends a new JoinGroup, which starts another rebalance of the whole group. A
   service busy between its polls, as ours is, can loop like this for minutes (seen: two
   minutes, the instance leader at every generation and never assigned). Mended by
   waiting, inside the poll that finds a round in flight, until it ends (at most
   ``join_wait_ms``), so no round ends between polls unless it outlasts that wait.

Both are applied to the consumer's own coordinator object and only when it has the
attributes they use; a release that changed them is left as it is (the test
``tests/test_kafka_group_join.py`` shows whether the fault is back). The confluent client
(librdkafka) runs its group protocol on its own thread and needs neither.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger("gpuledger.kafka.group_join")

JOIN_WAIT_MS = 10_000
"""How long a poll that finds a join round in flight waits for it, by default."""


def mend(consumer: Any, join_wait_ms: int = JOIN_WAIT_MS) -> bool:
    """Mend ``consumer``'s (a kafka-python ``KafkaConsumer``) group join; False when it
    has no group coordinator or not the attributes the mends use."""
    coordinator = getattr(consumer, "_coordinator", None)
    need_rejoin = getattr(coordinator, "need_rejoin", None)
    ensure = getattr(coordinator, "ensure_active_group", None)
    if (coordinator is None or need_rejoin is None or ensure is None
            or not hasattr(coordinator, "rejoin_needed")
            or not hasattr(coordinator, "_join_task")):
        log.debug("kafka-python consumer without the coordinator attributes mended here: "
                  "left as it is")
        return False
    coordinator.need_rejoin = _recording(coordinator, need_rejoin)
    coordinator.ensure_active_group = _waiting(coordinator, ensure, join_wait_ms)
    return True


def _recording(coordinator: Any, need_rejoin: Callable[[], bool]) -> Callable[[], bool]:
    def recorded() -> bool:
        needed = bool(need_rejoin())
        if needed:
            coordinator.rejoin_needed = True   # cleared by the client when a round completes
        return needed
    return recorded


def _waiting(coordinator: Any, ensure: Callable[..., bool],
             join_wait_ms: int) -> Callable[..., bool]:
    def ensured(timeout_ms: float | None = None) -> bool:
        if ensure(timeout_ms=timeout_ms):
            return True
        if timeout_ms is None:
            return False
        deadline = time.monotonic() + join_wait_ms / 1000
        while _in_flight(coordinator):
            left_ms = (deadline - time.monotonic()) * 1000
            if left_ms <= 0:
                return False
            if ensure(timeout_ms=left_ms):
                return True
        return False
    return ensured


def _in_flight(coordinator: Any) -> bool:
    task = getattr(coordinator, "_join_task", None)
    return task is not None and not task.is_done
