"""How every command logs: one format, the Kafka library held to warnings, its errors in
one line."""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Mapping
from typing import Any

from gpuledger.cli.errors import CliError

CLIENT_LOG_ENV = "GPULEDGER_KAFKA_CLIENT_LOG"
"""The Kafka library's log level (``kafka.*`` loggers): WARNING by default, whatever the
command's own level. Its INFO lines (each connection, metadata update and fetch reset)
were 184 of the 194 lines of a service instance's two-minute run."""
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def configure(level: int, environ: Mapping[str, str] | None = None) -> None:
    """Log at ``level`` (the Kafka library at ``GPULEDGER_KAFKA_CLIENT_LOG``, WARNING by
    default); :class:`CliError` naming the variable when it is not a level."""
    environ = os.environ if environ is None else environ
    client = environ.get(CLIENT_LOG_ENV, "").strip().upper() or "WARNING"
    if client not in LEVELS:
        raise CliError(f"{CLIENT_LOG_ENV}: {environ[CLIENT_LOG_ENV]!r} is not one of "
                       f"{', '.join(LEVELS)}")
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("kafka").setLevel(client)
    for handler in logging.getLogger().handlers:   # each once, whatever the calls
        if client_errors_in_one_line not in handler.filters:
            handler.addFilter(client_errors_in_one_line)
        if not any(isinstance(f, ClientRepeats) for f in handler.filters):
            handler.addFilter(ClientRepeats())
    selector = logging.getLogger("kafka.net.selector")
    if short_steps_unsaid not in selector.filters:
        selector.addFilter(short_steps_unsaid)


def client_errors_in_one_line(record: Any) -> bool:
    """The Kafka client logs a connection lost during a broker's outage with the whole
    traceback, at ERROR; the service recovers from it by itself (docs/kafka.md): the
    exception is said in the line instead."""
    if record.name.startswith("kafka") and record.exc_info and record.exc_info[1]:
        exc = record.exc_info[1]
        record.msg = f"{record.getMessage()} ({type(exc).__name__}: {exc})"
        record.args = None
        record.exc_info = record.exc_text = None
    return True


_STEP = re.compile(r"^Task .* ran for ([0-9.]+)s \(>")
SLOW_STEP_S = 5.0
"""A step of the Kafka library's network loop this long is said; a shorter one is not."""


def short_steps_unsaid(record: Any) -> bool:
    """kafka-python warns of any step of its network loop over 0.1 s ("likely a tight
    sync loop inside a coroutine"): the service's rebalance callback, which loads a
    partition's checkpoint, is such a step at every handover (0.5 s seen). Under
    ``SLOW_STEP_S`` (half the default session timeout) the warning is dropped, unless the
    library's lines were asked for (``GPULEDGER_KAFKA_CLIENT_LOG`` INFO or DEBUG)."""
    match = _STEP.match(str(record.msg))
    if match is None or logging.getLogger("kafka").getEffectiveLevel() < logging.WARNING:
        return True
    return float(match.group(1)) >= SLOW_STEP_S


REPEAT_S = 60.0
"""A line of the Kafka library said again within this long is counted, not printed."""
_NUMBERS = re.compile(r"0x[0-9a-f]+|[0-9][0-9.]*")


class ClientRepeats(logging.Filter):
    """The Kafka library's lines that repeat (each retry of a broker away: five lines a
    second, 319 in a node agent's first minute of an outage) are printed once per
    ``REPEAT_S``, the next one saying how many were not. Lines are alike when they
    differ only in their numbers (backoffs, addresses); the library's lines asked for
    (``GPULEDGER_KAFKA_CLIENT_LOG`` INFO or DEBUG) are all printed."""

    def __init__(self, clock: Any = time.monotonic) -> None:
        super().__init__()
        self.clock = clock
        self.said: dict[tuple[str, int, str], tuple[float, int]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.name.startswith("kafka") \
                or logging.getLogger("kafka").getEffectiveLevel() < logging.WARNING:
            return True
        key = (record.name, record.levelno, _NUMBERS.sub("#", record.getMessage()))
        now = self.clock()
        last, unsaid = self.said.get(key, (float("-inf"), 0))
        if now - last < REPEAT_S:
            self.said[key] = (last, unsaid + 1)
            return False
        self.said[key] = (now, 0)
        if unsaid:
            record.msg = (f"{record.getMessage()} (and {unsaid} more like it in the last "
                          f"{now - last:.0f} s)")
            record.args = None
        return True
