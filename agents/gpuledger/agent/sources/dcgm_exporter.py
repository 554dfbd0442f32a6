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

A value DCGM marks as "no value" (its blank sentinels: int32 2147483632-2147483647,
int64 from 9223372036854775792, double 2**47 = 140737488355328 to +15) and a value outside
the contract's and the processor's physical bounds
(:data:`gpuledger.agent.sources.nvml.READING_BOUNDS`) are omitted from the sample, the
rest of it kept, and counted (``no_value``, ``out_of_range``). One scrape is bounded as a
whole: ``timeout_s`` is a deadline over the request (connection, headers and body), and
a page larger than :data:`MAX_PAGE_BYTES` is refused.
"""

from __future__ import annotations

import http.client
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

from gpuledger.agent.attribution import job_id_problem
from gpuledger.agent.sources.card_types import card_type_of
from gpuledger.agent.sources.nvml import reading_problem
from gpuledger.deadline import RequestDeadline

log = logging.getLogger("gpuledger.agent.dcgm_exporter")

MAX_GPU_INDEX = 1023
"""The contract's largest GPU index."""

MAX_PAGE_BYTES = 16 << 20
"""A ``/metrics`` page larger than this (16 MiB) is refused: an exporter's page for a
full node (8 GPUs x 7 MIG instances, every field) is well under 2 MiB."""

DCGM_INT32_BLANK = 0x7FFFFFF0
DCGM_INT64_BLANK = 0x7FFFFFFFFFFFFFF0
DCGM_FP64_BLANK = 140737488355328.0
"""DCGM's "no value" sentinels (dcgm_structs.h): the BLANK value and the 15 above it
(NOT_FOUND, NOT_SUPPORTED, NOT_PERMISSIONED, ...)."""


def dcgm_blank(value: float) -> bool:
    """Whether an exported value is one of DCGM's blank sentinels ("no value")."""
    return (DCGM_INT32_BLANK <= value <= DCGM_INT32_BLANK + 15
            or DCGM_FP64_BLANK <= value <= DCGM_FP64_BLANK + 15
            or value >= float(DCGM_INT64_BLANK))


class ScrapeError(OSError):
    """The exporter's page could not be read within the bounds (time, size)."""

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
_NOT_READINGS = frozenset({"v", "type", "time", "node", "gpu_index", "gpu_uuid", "card_type",
                           "mig_instance", "processes", "seq"})
_MAX_WARNED = 4096


@dataclass
class DcgmExporterSource:
    """Turns scrapes into contract telemetry samples (one per GPU or MIG instance).

    What an exporter's page cannot be trusted with is skipped, never turned into a GPU,
    and counted in :attr:`skipped` (the agent's ``source_series_skipped_total``):

    * ``no_gpu_label``: a series without a ``UUID`` label or a ``gpu`` index (0-1023);
    * ``uuid_conflict``: one GPU index (and MIG instance) under two UUIDs in one scrape.
      The UUID with more series wins; on a tie, the one this source saw there before;
      if still tied, neither (the GPU is left out of this collection);
    * ``not_a_number``: a NaN or infinite value (the field is omitted, as if not exported);
    * ``no_value``: one of DCGM's blank sentinels (:func:`dcgm_blank`), omitted likewise
      (a blank memory part omits ``mem_total_mib``);
    * ``out_of_range``: a value outside the field's bounds
      (:data:`~gpuledger.agent.sources.nvml.READING_BOUNDS`), omitted likewise;
    * ``invalid_job_id``: an ``hpc_job`` or ``namespace/pod`` label that is not a valid
      job id (blank, control characters, over 256 characters): that series names no job.

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
    _warned: set[tuple[str, str, str]] = field(default_factory=set)

    def __post_init__(self) -> None:
        self._fields, self._memory_parts = load_field_map()

    def scrape(self) -> str:
        """The exporter's page, read within ``timeout_s`` in all and at most
        :data:`MAX_PAGE_BYTES` long (:class:`ScrapeError` otherwise)."""
        watch = RequestDeadline(self.timeout_s)
        got = 0
        chunks: list[bytes] = []
        try:
            with _opener(watch).open(self.url, timeout=watch.remaining()) as response:
                length = response.headers.get("Content-Length", "")
                if length.strip().isdigit() and int(length) > MAX_PAGE_BYTES:
                    raise ScrapeError(f"dcgm-exporter at {self.url} announced a page of "
                                      f"{int(length)} bytes, over the {MAX_PAGE_BYTES}-byte "
                                      "bound: refused (is this an exporter's /metrics?)")
                while True:
                    if watch.expired or watch.remaining() <= 0:
                        raise _timeout(self.url, self.timeout_s, got)
                    chunk = response.read1(65536)
                    if not chunk:
                        break
                    got += len(chunk)
                    if got > MAX_PAGE_BYTES:
                        raise ScrapeError(f"dcgm-exporter at {self.url} sent more than "
                                          f"{MAX_PAGE_BYTES} bytes: refused (is this an "
                                          "exporter's /metrics?)")
                    chunks.append(chunk)
                if watch.expired:          # the socket was shut at the deadline
                    raise _timeout(self.url, self.timeout_s, got)
        except ScrapeError:
            raise
        except (OSError, http.client.HTTPException) as exc:
            if watch.expired or isinstance(exc, TimeoutError):
                raise _timeout(self.url, self.timeout_s, got) from exc
            raise
        finally:
            watch.finish()
        return b"".join(chunks).decode("utf-8", "replace")

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
                           for p in self._attribution(uuid, labels)}.values(),
                          key=lambda p: p["job_id"])
            rec: dict[str, Any] = {
                "v": 1, "type": "telemetry", "time": stamp, "node": self.node,
                "gpu_index": index, "gpu_uuid": uuid,
                "card_type": self.card_type or card_type_of(
                    series[0][1].get("modelName", "unknown")),
                "mig_instance": mig or None, "processes": jobs}
            parts: dict[str, float] = {}  # a GPU shared by pods has a series per pod
            blank_parts: set[str] = set()
            for name, _labels, value in series:
                if dcgm_blank(value):     # "no value": omitted, a counter's last value kept
                    self._omit(uuid, name, "no_value", value)
                    if name in self._memory_parts:
                        blank_parts.add(name)
                    continue
                if name in self._memory_parts:
                    parts.setdefault(name, value)
                spec = self._fields.get(name)
                if spec is not None and spec.field not in rec:
                    rec[spec.field] = self._value(spec, (uuid, mig, name), value)
            if parts and not blank_parts - parts.keys():
                rec["mem_total_mib"] = sum(parts.values())
            if rec.get("util_gpu") is not None:
                rec["util_gpu"] = min(max(rec["util_gpu"], 0.0), 100.0)
            for name in [n for n in rec if n not in _NOT_READINGS]:
                if reading_problem(name, rec[name]) is not None:
                    self._omit(uuid, name, "out_of_range", rec.pop(name))
            rec["seq"] = self.seq
            self.seq += 1
            out.append(rec)
        return out

    def _omit(self, uuid: str, name: str, reason: str, value: float) -> None:
        """Count an omitted reading; warn once per GPU, field and reason."""
        self.skipped[reason] += 1
        if (uuid, name, reason) not in self._warned and len(self._warned) < _MAX_WARNED:
            self._warned.add((uuid, name, reason))
            log.warning("GPU %s: %s %r omitted (%s)", uuid, name, value,
                        "DCGM's blank: no value" if reason == "no_value"
                        else reading_problem(name, value) or reason)

    def _attribution(self, uuid: str, labels: dict[str, str]) -> list[dict[str, Any]]:
        """The job a series names (``hpc_job``, else ``namespace/pod``); a label that is
        not a valid job id (docs/agent.md, "Job ids") names none (``invalid_job_id``)."""
        job = labels.get("hpc_job") or ""
        if not job and labels.get("pod"):
            job = f"{labels.get('namespace', 'default')}/{labels['pod']}"
        if not job:
            return []
        problem = job_id_problem(job)
        if problem is not None:
            self.skipped["invalid_job_id"] += 1
            if (uuid, "job_id", problem) not in self._warned and (
                    len(self._warned) < _MAX_WARNED):
                self._warned.add((uuid, "job_id", problem))
                log.warning("GPU %s: job %s from the exporter's labels skipped: %s", uuid,
                            ascii(job[:64]), problem)
            return []
        return [{"pid": 0, "used_mib": 0.0, "job_id": job}]

    def _value(self, spec: FieldMap, key: tuple[str, str, str], value: float) -> float | int:
        previous = self._previous.get(key)
        self._previous[key] = value
        if spec.kind == "delta":
            return 0 if previous is None or value < previous else int(value - previous)
        if spec.kind == "event":
            return 1 if value > 0 and value != previous else 0
        return value





def _timeout(url: str, timeout_s: float, got: int) -> ScrapeError:
    return ScrapeError(f"dcgm-exporter at {url} did not send its page within "
                       f"dcgm_exporter.timeout_s = {timeout_s:g} s ({got} bytes read)")


def _opener(watch: RequestDeadline) -> urllib.request.OpenerDirector:
    """urllib (proxies, redirects, HTTPS as before) whose connections join ``watch``."""

    class Http(http.client.HTTPConnection):
        def connect(self) -> None:
            self.timeout = max(watch.remaining(), 0.001)
            super().connect()
            watch.add(self.sock)

    class Https(http.client.HTTPSConnection):
        def connect(self) -> None:
            self.timeout = max(watch.remaining(), 0.001)
            super().connect()
            watch.add(self.sock)

    class HttpHandler(urllib.request.HTTPHandler):
        def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
            return self.do_open(Http, req)

    class HttpsHandler(urllib.request.HTTPSHandler):
        def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
            return self.do_open(Https, req)

    return urllib.request.build_opener(HttpHandler, HttpsHandler)
