"""Publish time-ordered batches when their time comes.

The pacing clock starts at the first batch, once it is ready (planning comes before it,
so a slow plan never turns into a burst): the first batch is published at once, batch
``i`` ``i·chunk_s/speed`` seconds later (2 = twice as fast as real time). A batch is
never published before ``not_before(batch)`` on the wall clock (Unix seconds): the
simulated minutes it covers must have passed, so no record is ever ahead of the wall
clock whatever the speed. Sleeping is done in short slices so that a stop request is
honoured within a fraction of a second.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import TypeVar

T = TypeVar("T")


def feed(batches: Iterable[T], publish: Callable[[T], None], chunk_s: float, speed: float,
         stop: Callable[[], bool] = lambda: False,
         clock: Callable[[], float] = time.monotonic,
         sleep: Callable[[float], None] = time.sleep,
         not_before: Callable[[T], float] | None = None,
         wall: Callable[[], float] = time.time) -> int:
    """Publish each batch at its due time; return how many were published."""
    if chunk_s <= 0 or speed <= 0:
        raise ValueError("chunk_s and speed must be > 0")
    first: float | None = None
    published = 0
    for i, batch in enumerate(batches):
        if first is None:
            first = clock()
        due = first + i * chunk_s / speed
        earliest = not_before(batch) if not_before is not None else -float("inf")
        while (left := max(due - clock(), earliest - wall())) > 0:
            if stop():
                return published
            sleep(min(left, 0.25))
        if stop():
            return published
        publish(batch)
        published += 1
    return published
