"""The CLI's user-facing error type, shared by every command module."""

from __future__ import annotations


class CliError(Exception):
    """A user-facing error: printed without a traceback, exit status 2."""


def need_pipeline() -> None:
    """Fail with the install hint when the pipeline extra (Polars, DuckDB) is missing."""
    try:
        import duckdb  # noqa: F401
        import polars  # noqa: F401
    except ImportError:
        raise CliError(
            "this command needs the pipeline extra: pip install 'gpuledger[pipeline]'"
        ) from None
