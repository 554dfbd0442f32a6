"""Source: an existing dcgm-exporter ``/metrics`` endpoint.

Many clusters already run NVIDIA's dcgm-exporter; the agent can read it instead of
competing with it for the GPUs. Which ``DCGM_FI_*`` fields map to which contract
fields is data (``dcgm_fields.yaml``). Polling (HTTP) is separate from parsing, so the
parser is tested on captured output.

Labels used: ``gpu`` (index), ``UUID``, ``modelName``, ``Hostname``, ``GPU_I_PROFILE`` /
``GPU_I_ID`` (MIG), and for attribution ``hpc_job`` (dcgm-exporter's HPC job mapping)
or ``namespace``/``pod`` (Kubernetes): the sample's process list then holds one entry
with ``job_id`` = the hpc job, or ``namespace/pod`` (dcgm-exporter names no process, so
the entry has pid 0 and no memory). A field the exporter does not export is omitted,
never filled in.
"""

from __future__ import annotations

import re
import urllib.request
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import resources
from typing import Any

import yaml

from gpuledger.agent.sources.card_types import card_type_of

_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\d+)?\s*$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"\s*,?\s*')


@dataclass(frozen=True)
class FieldMap:
    """One DCGM field's place in the contract."""

    field: str
    kind: str = "gauge"


def load_field_map() -> tuple[dict[str, FieldMap], list[str]]:
    """The packaged field list: DCGM name → contract field, and memory-total parts."""
    text = resources.files("gpuledger.agent.sources").joinpath("dcgm_fields.yaml").read_text()
    raw = yaml.safe_load(text)
    fields = {name: FieldMap(spec["field"], spec.get("kind", "gauge"))
              for name, spec in raw["fields"].items()}
    return fields, list(raw["memory_total"])


def _unescape(value: str) -> str:
    return value.replace(r"\\", "\x00").replace(r"\"", '"').replace(r"\n", "\n").replace(
        "\x00", "\\")


def parse_metrics(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Prometheus text exposition → (metric, labels, value); comments skipped."""
    out: list[tuple[str, dict[str, str], float]] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _LINE.match(line)
        if m is None:
            continue
        name, labels_text, value = m.groups()
        labels = {k: _unescape(v) for k, v in _LABEL.findall(labels_text or "")}
        try:
            out.append((name, labels, float(value)))
        except ValueError:
            continue
    return out


@dataclass
class DcgmExporterSource:
    """Turns scrapes into contract telemetry samples (one per GPU or MIG instance)."""

    node: str
    card_type: str | None = None
    url: str = "http://127.0.0.1:9400/metrics"
    timeout_s: float = 5.0
    seq: int = 0
    _fields: dict[str, FieldMap] = field(default_factory=dict)
    _memory_parts: list[str] = field(default_factory=list)
    _previous: dict[tuple[str, str], float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._fields, self._memory_parts = load_field_map()

    def scrape(self) -> str:
        with urllib.request.urlopen(self.url, timeout=self.timeout_s) as response:
            body: bytes = response.read()
        return body.decode("utf-8", "replace")

    def collect(self, now: datetime | None = None) -> list[dict[str, Any]]:
        """Scrape and convert."""
        return self.convert(self.scrape(), now)

    def convert(self, text: str, now: datetime | None = None) -> list[dict[str, Any]]:
        """Contract telemetry records (JSON form) from one scrape's text."""
        when = (now or datetime.now(UTC)).astimezone(UTC)
        stamp = when.strftime("%Y-%m-%dT%H:%M:%S.") + f"{when.microsecond // 1000:03d}Z"
        samples: dict[str, dict[str, Any]] = {}
        memory: dict[str, float] = {}
        for name, labels, value in parse_metrics(text):
            if name not in self._fields and name not in self._memory_parts:
                continue
            uuid = labels.get("UUID") or f"gpu-{labels.get('gpu', '?')}"
            mig = None
            if labels.get("GPU_I_PROFILE"):
                mig = f"{labels['GPU_I_PROFILE']}/{labels.get('GPU_I_ID', '0')}"
            key = f"{uuid}/{mig or ''}"
            rec = samples.get(key)
            if rec is None:
                rec = {"v": 1, "type": "telemetry", "time": stamp, "node": self.node,
                       "gpu_index": int(labels.get("gpu", "0")), "gpu_uuid": uuid,
                       "card_type": self.card_type or card_type_of(
                           labels.get("modelName", "unknown")),
                       "mig_instance": mig, "processes": _attribution(labels)}
                samples[key] = rec
            if name in self._memory_parts:
                memory[key] = memory.get(key, 0.0) + value
            spec = self._fields.get(name)
            if spec is None:
                continue
            rec[spec.field] = self._value(spec, (key, name), value)
        for key, rec in samples.items():
            if key in memory:
                rec["mem_total_mib"] = memory[key]
            if rec.get("util_gpu") is not None:
                rec["util_gpu"] = min(max(rec["util_gpu"], 0.0), 100.0)
        out = []
        order = sorted(samples.values(), key=lambda r: (r["gpu_index"], r["mig_instance"] or ""))
        for rec in order:
            rec["seq"] = self.seq
            self.seq += 1
            out.append(rec)
        return out

    def _value(self, spec: FieldMap, key: tuple[str, str], value: float) -> float | int:
        previous = self._previous.get(key)
        self._previous[key] = value
        if spec.kind == "delta":
            return 0 if previous is None or value < previous else int(value - previous)
        if spec.kind == "event":
            return 1 if value > 0 and value != previous else 0
        return value


def _attribution(labels: dict[str, str]) -> list[dict[str, Any]]:
    job = labels.get("hpc_job") or ""
    if not job and labels.get("pod"):
        job = f"{labels.get('namespace', 'default')}/{labels['pod']}"
    return [{"pid": 0, "used_mib": 0.0, "job_id": job}] if job else []
