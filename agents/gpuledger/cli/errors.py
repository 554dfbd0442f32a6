"""The CLI's user-facing error type, shared by every command module."""

from __future__ import annotations


class CliError(Exception):
    """A user-facing error: printed without a traceback, exit status 2."""
