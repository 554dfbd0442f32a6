"""How a daemon says a failure it retries (a broker away, a scheduler not answering):
at the first failure, once a minute while it lasts, and when it works again, rather
than at every retry (a node agent retrying every 5 s said it 720 times an hour)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

REMIND_S = 60.0
"""While the failure lasts, a warning says so this often."""


def span(seconds: float) -> str:
    """``seconds`` for a person: ``45 s``, ``3.2 min``."""
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


class OutageLog:
    """The warnings of one retried operation, ``what`` (``"delivery"``, ``"poll"``)."""

    def __init__(self, log: logging.Logger, what: str,
                 clock: Callable[[], float] = time.monotonic,
                 remind_s: float = REMIND_S) -> None:
        self.log = log
        self.what = what
        self.clock = clock
        self.remind_s = remind_s
        self.since: float | None = None
        """When the failures started (None while it works)."""
        self._said_at = 0.0
        self.tries = 0

    def failed(self, why: str, state: str) -> None:
        """A try failed for ``why``; ``state`` says what that leaves (``"3 messages kept
        in the spool"``)."""
        now = self.clock()
        if self.since is None:
            self.since, self._said_at, self.tries = now, now, 1
            self.log.warning("%s failed (%s); %s, retrying (said again each minute while "
                             "it fails)", self.what, why, state)
            return
        self.tries += 1
        said = now - self._said_at >= self.remind_s
        if said:
            self._said_at = now
        self.log.log(logging.WARNING if said else logging.DEBUG,
                     "%s still failing after %s (%s; the last: %s); %s", self.what,
                     span(now - self.since), _tries(self.tries), why, state)

    def worked(self, state: str) -> None:
        """A try worked: said when tries had failed before it."""
        if self.since is None:
            return
        self.log.warning("%s works again after %s (%s failed); %s", self.what,
                         span(self.clock() - self.since), _tries(self.tries), state)
        self.since = None


def _tries(n: int) -> str:
    return f"{n} try" if n == 1 else f"{n} tries"


def error_text(exc: BaseException, first_line_chars: int | None = None) -> str:
    """``Name: text`` of ``exc``, the name once (kafka-python's errors put their own name
    in their text); with ``first_line_chars``, of the text's first line that many
    characters at most."""
    name, text = type(exc).__name__, str(exc).strip()
    if first_line_chars is not None and text:
        text = text.splitlines()[0][:first_line_chars]
    text = text.removeprefix(f"{name}: ")
    return f"{name}: {text}" if text else name
