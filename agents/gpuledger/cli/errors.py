"""The CLI's user-facing error type, shared by every command module."""

from __future__ import annotations

from pathlib import Path


class CliError(Exception):
    """A user-facing error: printed without a traceback, exit status 2."""


def check_input_files(*paths: Path | None) -> None:
    """Each given path must be a readable regular file; else a :class:`CliError` that
    says why (no such file, a directory, not a regular file, cannot be opened)."""
    for path in paths:
        if path is None:
            continue
        if path.is_dir():
            raise CliError(f"{path}: is a directory, not a file")
        if not path.exists():
            raise CliError(f"{path}: no such file")
        if not path.is_file():
            raise CliError(f"{path}: not a regular file")
        try:
            path.open("rb").close()
        except OSError as exc:
            raise CliError(f"{path}: cannot read: {exc.strerror or exc}") from None


def need_pipeline() -> None:
    """Fail with the install hint when the pipeline extra (Polars, DuckDB) is missing."""
    try:
        import duckdb  # noqa: F401
        import polars  # noqa: F401
    except ImportError:
        raise CliError(
            "this command needs the pipeline extra: pip install 'gpuledger[pipeline]'"
        ) from None
