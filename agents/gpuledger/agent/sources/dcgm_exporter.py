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

import logging
import math
import re
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import resources
from typing import Any

import yaml

from gpuledger.agent.sources.card_types import card_type_of

log = logging.getLogger("gpuledger.agent.dcgm_exporter")

MAX_GPU_INDEX = 1023
"""The contract's largest GPU index."""

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


_Series = tuple[str, dict[str, str], float]


@dataclass
class DcgmExporterSource:
    """Turns scrapes into contract telemetry samples (one per GPU or MIG instance).

    What an exporter's page cannot be trusted with is skipped, never turned into a GPU,
    and counted in :attr:`skipped` (the agent's ``source_series_skipped_total``):

    * ``no_gpu_label``: a series without a ``UUID`` label or a ``gpu`` index (0-1023);
    * ``uuid_conflict``: one GPU index (and MIG instance) under two UUIDs in one scrape.
      The UUID with more series wins; on a tie, the one this source saw there before;
      if still tied, neither (the GPU is left out of this collection);
    * ``not_a_number``: a NaN or infinite value (the field is omitted, as if not exported).

    Other labels (``DCGM_FI_DRIVER_VERSION``, ``DCGM_FI_DEV_SERIAL``, ``Hostname``,
    ``pci_bus_id``, ``device``, ``container``…) are ignored. A GPU shared by several pods
    (one series per pod) gets one process entry per job.
    """

    node: str
    card_type: str | None = None
    url: str = "http://127.0.0.1:9400/metrics"
    timeout_s: float = 5.0
    seq: int = 0
    skipped: Counter[str] = field(default_factory=Counter)
    _fields: dict[str, FieldMap] = field(default_factory=dict)
    _memory_parts: list[str] = field(default_factory=list)
    _previous: dict[tuple[str, str, str], float] = field(default_factory=dict)
    _uuid_at: dict[tuple[int, str], str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._fields, self._memory_parts = load_field_map()

    def scrape(self) -> str:
        with urllib.request.urlopen(self.url, timeout=self.timeout_s) as response:
            body: bytes = response.read()
        return body.decode("utf-8", "replace")

    def collect(self, now: datetime | None = None) -> list[dict[str, Any]]:
        """Scrape and convert."""
        return self.convert(self.scrape(), now)

    def _group(self, text: str) -> dict[tuple[int, str], dict[str, list[_Series]]]:
        """The series this source reads, by (GPU index, MIG instance) and UUID."""
        groups: dict[tuple[int, str], dict[str, list[_Series]]] = {}
        for name, labels, value in parse_metrics(text):
            if name not in self._fields and name not in self._memory_parts:
                continue
            gpu, uuid = labels.get("gpu", ""), labels.get("UUID", "")
            if not uuid or not gpu.isdigit() or int(gpu) > MAX_GPU_INDEX:
                self.skipped["no_gpu_label"] += 1
                continue
            if not math.isfinite(value):
                self.skipped["not_a_number"] += 1
                continue
            mig = ""
            if labels.get("GPU_I_PROFILE"):
                mig = f"{labels['GPU_I_PROFILE']}/{labels.get('GPU_I_ID', '0')}"
            groups.setdefault((int(gpu), mig), {}).setdefault(uuid, []).append(
                (name, labels, value))
        return groups

    def _choose(self, key: tuple[int, str], by_uuid: dict[str, list[_Series]]) -> str | None:
        """The UUID of a GPU index (see the class's doc); the others' series are skipped."""
        most = max(len(series) for series in by_uuid.values())
        best = [uuid for uuid, series in by_uuid.items() if len(series) == most]
        chosen = best[0] if len(best) == 1 else (
            self._uuid_at.get(key) if self._uuid_at.get(key) in best else None)
        for uuid, series in by_uuid.items():
            if uuid != chosen:
                self.skipped["uuid_conflict"] += len(series)
        if len(by_uuid) > 1:
            log.warning("GPU %d%s is exported under %d UUIDs (%s); kept %s", key[0],
                        f" ({key[1]})" if key[1] else "", len(by_uuid),
                        ", ".join(sorted(by_uuid)), chosen or "none")
        return chosen

    def convert(self, text: str, now: datetime | None = None) -> list[dict[str, Any]]:
        """Contract telemetry records (JSON form) from one scrape's text."""
        when = (now or datetime.now(UTC)).astimezone(UTC)
        stamp = when.strftime("%Y-%m-%dT%H:%M:%S.") + f"{when.microsecond // 1000:03d}Z"
        out = []
        for key, by_uuid in sorted(self._group(text).items()):
            uuid = self._choose(key, by_uuid)
            if uuid is None:
                continue
            self._uuid_at[key] = uuid
            series = by_uuid[uuid]
            index, mig = key
            jobs = sorted({p["job_id"]: p for _, labels, _ in series
                           for p in _attribution(labels)}.values(), key=lambda p: p["job_id"])
            rec: dict[str, Any] = {
                "v": 1, "type": "telemetry", "time": stamp, "node": self.node,
                "gpu_index": index, "gpu_uuid": uuid,
                "card_type": self.card_type or card_type_of(
                    series[0][1].get("modelName", "unknown")),
                "mig_instance": mig or None, "processes": jobs}
            parts: dict[str, float] = {}  # a GPU shared by pods has a series per pod
            for name, _labels, value in series:
                if name in self._memory_parts:
                    parts.setdefault(name, value)
                spec = self._fields.get(name)
                if spec is not None and spec.field not in rec:
                    rec[spec.field] = self._value(spec, (uuid, mig, name), value)
            if parts:
                rec["mem_total_mib"] = sum(parts.values())
            if rec.get("util_gpu") is not None:
                rec["util_gpu"] = min(max(rec["util_gpu"], 0.0), 100.0)
            rec["seq"] = self.seq
            self.seq += 1
            out.append(rec)
        return out

    def _value(self, spec: FieldMap, key: tuple[str, str, str], value: float) -> float | int:
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
