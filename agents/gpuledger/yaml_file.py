"""Reading a text or YAML file a user hands over (configuration, mapping, cluster spec, policies):
every way it can fail is one line that names the file and the reason.

A missing file, a folder, a file that cannot be opened, bytes that are not UTF-8 and text
that is not YAML (with the line and column where the parser stopped) each raise
:class:`YamlFileError`; callers put their own prefix on it (the option or section).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml


class YamlFileError(ValueError):
    """A YAML file that cannot be read: ``<path>: <reason>``, one line."""


class NotUtf8Error(YamlFileError):
    """The file's bytes are not UTF-8 text."""


def yaml_problem(exc: yaml.YAMLError) -> str:
    """The parser's complaint in one line: where it stopped (1-based) and what it found."""
    mark = getattr(exc, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    return f"not valid YAML{where}: {problem}"


def read_text(path: Path) -> str:
    """The file's text (UTF-8), or :class:`YamlFileError` saying why not."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except IsADirectoryError:
        raise YamlFileError(f"{path}: is a directory, not a file") from None
    except FileNotFoundError:
        raise YamlFileError(f"{path}: no such file") from None
    except OSError as exc:
        raise YamlFileError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise NotUtf8Error(f"{path}: not UTF-8 text (byte {exc.start})") from None


def parse_yaml(text: str, origin: str | Path) -> Any:
    """The YAML document in ``text`` (read from ``origin``), or :class:`YamlFileError`."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise YamlFileError(f"{origin}: {yaml_problem(exc)}") from None


def read_yaml(path: Path) -> Any:
    """The YAML document in the file ``path`` (None for an empty file)."""
    return parse_yaml(read_text(path), path)
