"""How every command logs: one format, the Kafka library held to warnings, its errors in
one line."""

from __future__ import annotations

import logging
import os
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
    for handler in logging.getLogger().handlers:
        if client_errors_in_one_line not in handler.filters:
            handler.addFilter(client_errors_in_one_line)


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
