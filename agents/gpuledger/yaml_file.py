"""Reading a text or YAML file a user hands over (configuration, mapping, cluster spec, policies):
every way it can fail is one line that names the file and the reason.

A missing file, a folder, a file that cannot be opened, bytes that are not UTF-8 and text
that is not YAML (with the line and column where the parser stopped) each raise
:class:`YamlFileError`; callers put their own prefix on it (the option or section).

YAML that is valid but would make the reader hang or crash is refused before it is built
(:func:`load_yaml`), with the line and column: collections nested more than
:data:`MAX_DEPTH` deep (the parser recursed until Python stopped it, a traceback), aliases
that would add more than :data:`MAX_ALIASED` values (nine nested lists of nine aliases
each, a "billion laughs", took over 4 GB and never ended: every error message that
showed the value expanded it), and an alias inside the collection it names (a value
that contains itself).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml


class YamlFileError(ValueError):
    """A YAML file that cannot be read: ``<path>: <reason>``, one line."""


class NotUtf8Error(YamlFileError):
    """The file's bytes are not UTF-8 text."""


MAX_DEPTH = 64
"""Collections nested deeper than this are refused (gpuledger's files nest 5 deep at most;
PyYAML's reader recurses per level and failed at about 330)."""
MAX_ALIASED = 100_000
"""The most values that aliases (``*name``) may add to a document, counted as expanded."""


class YamlRefused(yaml.YAMLError):
    """Valid YAML that gpuledger does not read (:func:`load_yaml`)."""

    def __init__(self, problem: str, mark: Any) -> None:
        super().__init__(problem)
        self.problem = problem
        self.problem_mark = mark


def yaml_problem(exc: yaml.YAMLError) -> str:
    """The parser's complaint in one line: where it stopped (1-based) and what it found."""
    mark = getattr(exc, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    return f"{'refused' if isinstance(exc, YamlRefused) else 'not valid YAML'}{where}: {problem}"


def _check_shape(text: str) -> None:
    """Refuse ``text`` (:class:`YamlRefused`) when it nests too deep or its aliases expand
    too far, from the parser's events alone (the parser itself does not recurse).

    The events come from libyaml's parser where PyYAML has it (20 times faster: the
    check of a 1.2 MB mapping file took 2.6 s in Python, as much as 60 % of reading it);
    text libyaml does not take (not YAML, or a lone surrogate from an environment
    variable's undecodable byte) is checked again by the Python parser, which reads it as
    ``yaml.safe_load`` will (and raises what it finds wrong)."""
    parsers: list[Any] = [yaml.SafeLoader]
    if getattr(yaml, "__with_libyaml__", False):
        parsers.insert(0, yaml.CSafeLoader)
    for parser in parsers:
        try:
            _check_events(yaml.parse(text, Loader=parser))
            return
        except YamlRefused:
            raise
        except Exception:  # libyaml's: a YAMLError, or a UnicodeEncodeError (a surrogate)
            if parser is yaml.SafeLoader:
                raise


def _check_events(events: Iterator[yaml.Event]) -> None:
    """:func:`_check_shape` over the parser's ``events``."""
    sizes: dict[str, int] = {}  # anchor → the values its collection or scalar holds
    anchors: list[str | None] = []  # per open collection: its anchor
    counts: list[int] = []  # per open collection: the values in it so far
    keys: list[set[str] | None] = []  # per open collection: a mapping's keys so far
    at_key: list[bool] = []  # per open collection: a mapping's next node is a key
    aliased = 0

    def add(values: int) -> None:
        if counts:
            counts[-1] += values

    def node_done() -> None:  # a key or a value ended: a mapping expects the other
        if keys and keys[-1] is not None:
            at_key[-1] = not at_key[-1]

    for event in events:
        if isinstance(event, yaml.ScalarEvent) and keys and keys[-1] is not None \
                and at_key[-1] and event.value != "<<":
            seen = keys[-1]
            if event.value in seen:  # the parser keeps the last: a setting lost in silence
                raise YamlRefused(f"the key {event.value!r} appears twice in one mapping",
                                  event.start_mark)
            seen.add(event.value)
        if isinstance(event, yaml.AliasEvent | yaml.ScalarEvent):
            node_done()
        if isinstance(event, yaml.AliasEvent):
            anchor = str(event.anchor)
            if anchor not in sizes:  # still open: it would contain itself
                raise YamlRefused(f"the alias *{anchor} is inside the value it names "
                                  "(a value that contains itself)", event.start_mark)
            aliased += sizes[anchor]
            if aliased > MAX_ALIASED:
                raise YamlRefused(f"aliases expand to more than {MAX_ALIASED:,} values "
                                  f"(at *{anchor})", event.start_mark)
            add(sizes[anchor])
        elif isinstance(event, yaml.ScalarEvent):
            if event.anchor is not None:
                sizes[str(event.anchor)] = 1  # a scalar: one value
            add(1)
        elif isinstance(event, yaml.CollectionStartEvent):
            if len(counts) >= MAX_DEPTH:
                raise YamlRefused(f"nested more than {MAX_DEPTH} levels deep",
                                  event.start_mark)
            anchors.append(None if event.anchor is None else str(event.anchor))
            counts.append(1)
            keys.append(set() if isinstance(event, yaml.MappingStartEvent) else None)
            at_key.append(True)
        elif isinstance(event, yaml.CollectionEndEvent):
            named, size = anchors.pop(), counts.pop()
            keys.pop()
            at_key.pop()
            if named is not None:
                sizes[named] = size
            add(size)
            node_done()


def load_yaml(text: str) -> Any:
    """``yaml.safe_load(text)``, after :func:`_check_shape`: a ``yaml.YAMLError`` (a
    :class:`YamlRefused` for what it refuses) when it cannot be read."""
    _check_shape(text)
    return yaml.safe_load(text)


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
        return load_yaml(text)
    except yaml.YAMLError as exc:
        raise YamlFileError(f"{origin}: {yaml_problem(exc)}") from None


def read_yaml(path: Path) -> Any:
    """The YAML document in the file ``path`` (None for an empty file)."""
    return parse_yaml(read_text(path), path)
