"""Publish time-ordered batches when their time comes.

Batch ``i`` covers simulated seconds ``[i·chunk_s, (i+1)·chunk_s)`` from the start; it is
published once that span has passed on the wall clock, scaled by ``speed`` (2 = twice as
fast as real time). Sleeping is done in short slices so that a stop request is honoured
within a fraction of a second.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import TypeVar

T = TypeVar("T")


def feed(batches: Iterable[T], publish: Callable[[T], None], chunk_s: float, speed: float,
         stop: Callable[[], bool] = lambda: False,
         clock: Callable[[], float] = time.monotonic,
         sleep: Callable[[float], None] = time.sleep) -> int:
    """Publish each batch at its due time; return how many were published."""
    if chunk_s <= 0 or speed <= 0:
        raise ValueError("chunk_s and speed must be > 0")
    start = clock()
    published = 0
    for i, batch in enumerate(batches):
        due = start + (i + 1) * chunk_s / speed
        while (left := due - clock()) > 0:
            if stop():
                return published
            sleep(min(left, 0.25))
        if stop():
            return published
        publish(batch)
        published += 1
    return published
