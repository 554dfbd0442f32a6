"""The NVML source's field file (``nvml_fields.yaml``): which contract fields to collect
and how to read each from NVML. Checked at start; errors name the bad key.

The file is data, the constants in it (``NVML_FI_*``, ``NVML_CLOCK_SM``...) are resolved
against the pynvml module given, so a constant this pynvml lacks is an error at start.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from gpuledger.contract.schema import TELEMETRY
from gpuledger.yaml_file import YamlFileError, parse_yaml, read_text

KINDS = ("gauge", "delta", "rate")
TELEMETRY_FIELDS = frozenset(f.name for f in TELEMETRY)
# Fields the source itself sets; the field file cannot map NVML values onto them.
OWN_FIELDS = frozenset({"node", "seq", "agent", "gpu_index", "gpu_uuid", "card_type",
                        "mig_instance", "healthy", "processes", "xid_errors"})


class FieldFileError(ValueError):
    """The field file is invalid; the message names the bad key."""


@dataclass(frozen=True)
class Reader:
    """One way to read a contract field from NVML."""

    field: str
    call: str | None = None
    args: tuple[int, ...] = ()
    attr: str | None = None
    field_id: int | None = None
    scope: int | None = None
    scale: float = 1.0
    kind: str = "gauge"


@dataclass(frozen=True)
class FieldSpec:
    """The parsed field file."""

    readers: dict[str, tuple[Reader, ...]]
    mig_fields: frozenset[str]
    xid: bool
    fatal_xids: frozenset[int]
    processes: bool
    mig_parent_omit: frozenset[str] = frozenset()


def _constant(nvml: Any, value: Any, where: str) -> int:
    if isinstance(value, bool):
        raise FieldFileError(f"{where}: expected an integer or an NVML constant name")
    if isinstance(value, int):
        return value
    if isinstance(value, str) and isinstance(getattr(nvml, value, None), int):
        return int(getattr(nvml, value))
    raise FieldFileError(f"{where}: {value!r} is not an NVML constant of this pynvml")


def _reader(nvml: Any, name: str, i: int, raw: Any) -> Reader:
    where = f"fields.{name}[{i}]"
    if not isinstance(raw, dict):
        raise FieldFileError(f"{where}: expected a mapping with 'call' or 'field'")
    unknown = set(raw) - {"call", "args", "attr", "field", "scope", "scale", "kind"}
    if unknown:
        raise FieldFileError(f"{where}.{sorted(unknown)[0]}: unknown key")
    kind = raw.get("kind", "gauge")
    if kind not in KINDS:
        raise FieldFileError(f"{where}.kind: {kind!r} is not one of {', '.join(KINDS)}")
    scale = raw.get("scale", 1.0)
    if not isinstance(scale, int | float) or isinstance(scale, bool):
        raise FieldFileError(f"{where}.scale: expected a number")
    if ("call" in raw) == ("field" in raw):
        raise FieldFileError(f"{where}: give exactly one of 'call' and 'field'")
    if "call" in raw:
        call = raw["call"]
        if not isinstance(call, str) or not callable(getattr(nvml, call, None)):
            raise FieldFileError(f"{where}.call: {call!r} is not a pynvml function")
        args = raw.get("args", [])
        if not isinstance(args, list):
            raise FieldFileError(f"{where}.args: expected a list")
        attr = raw.get("attr")
        if attr is not None and not isinstance(attr, str):
            raise FieldFileError(f"{where}.attr: expected a name")
        return Reader(name, call=call, attr=attr, scale=float(scale), kind=kind,
                      args=tuple(_constant(nvml, a, f"{where}.args") for a in args))
    scope = raw.get("scope")
    return Reader(name, field_id=_constant(nvml, raw["field"], f"{where}.field"),
                  scope=None if scope is None else _constant(nvml, scope, f"{where}.scope"),
                  scale=float(scale), kind=kind)


def load_field_spec(nvml: Any, path: str | Path | None = None) -> FieldSpec:
    """Read and check a field file (the packaged one when ``path`` is None)."""
    if path is None:
        text = resources.files("gpuledger.agent.sources").joinpath("nvml_fields.yaml").read_text()
        origin = "nvml_fields.yaml"
    else:
        origin = str(path)
    try:
        if path is not None:
            text = read_text(Path(path))
        raw = parse_yaml(text, origin)
    except YamlFileError as err:
        raise FieldFileError(str(err)) from None
    if not isinstance(raw, dict):
        raise FieldFileError(f"{origin}: expected a mapping at the top")
    unknown = set(raw) - {"fields", "mig_fields", "mig_parent_omit", "xid", "fatal_xids",
                      "processes"}
    if unknown:
        raise FieldFileError(f"{origin}: {sorted(unknown)[0]}: unknown key")
    fields = raw.get("fields") or {}
    if not isinstance(fields, dict):
        raise FieldFileError(f"{origin}: fields: expected a mapping")
    readers: dict[str, tuple[Reader, ...]] = {}
    for name, ways in fields.items():
        if name not in TELEMETRY_FIELDS or name in OWN_FIELDS:
            raise FieldFileError(f"{origin}: fields.{name}: not a telemetry metric field "
                                 "of the contract")
        if not isinstance(ways, list) or not ways:
            raise FieldFileError(f"{origin}: fields.{name}: expected a list of ways to read it")
        try:
            readers[name] = tuple(_reader(nvml, name, i, w) for i, w in enumerate(ways))
        except FieldFileError as err:
            raise FieldFileError(f"{origin}: {err}") from err
    mig = raw.get("mig_fields") or []
    if not isinstance(mig, list) or any(m not in readers for m in mig):
        raise FieldFileError(f"{origin}: mig_fields: expected a list of names under fields")
    omit = raw.get("mig_parent_omit") or []
    if not isinstance(omit, list) or any(m not in readers for m in omit):
        raise FieldFileError(f"{origin}: mig_parent_omit: expected a list of names under fields")
    fatal = raw.get("fatal_xids") or []
    if not isinstance(fatal, list) or not all(isinstance(x, int) for x in fatal):
        raise FieldFileError(f"{origin}: fatal_xids: expected a list of XID codes")
    for key in ("xid", "processes"):
        if not isinstance(raw.get(key, True), bool):
            raise FieldFileError(f"{origin}: {key}: expected true or false")
    return FieldSpec(readers, frozenset(mig), bool(raw.get("xid", True)),
                     frozenset(fatal), bool(raw.get("processes", True)), frozenset(omit))
