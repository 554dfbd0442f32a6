"""Source: the node's GPUs, read through NVIDIA's NVML with the official bindings.

The bindings are ``nvidia-ml-py`` (module ``pynvml``, the ``agent`` extra); they load the
driver's ``libnvidia-ml.so.1``. Which contract fields are collected, and with which NVML
call, is data (``nvml_fields.yaml``, docs/nvml.md). Rules:

* A field the GPU answers ``NVML_ERROR_NOT_SUPPORTED`` for is omitted, never filled in,
  and that way of reading it is not asked again (per GPU); the next way listed, if any,
  is tried instead.
* A GPU that answers ``NVML_ERROR_GPU_IS_LOST`` is reported with ``healthy: false`` and
  no metrics from then on (a lost GPU needs a reset; the agent's restart re-detects it).
* An XID critical error listed as fatal in the field file makes the GPU unhealthy from
  then on; every XID is counted in the sample's ``xid_errors``.
* A MIG-enabled GPU gives one sample for the whole GPU (power, temperature, ECC, XID,
  health, total memory; no ``processes``, no used memory: those are split over the MIG
  devices and the processor adds them up) and one per MIG device (``mig_instance``
  "profile/GI id", its memory and its processes).
* No driver (or no bindings) is :class:`NvmlUnavailable` at construction.
* A reading that is NVML's "not available" value (``0xFFFFFFFF``, ``2**64 - 1``), not a
  finite number, or outside the field's bounds (:data:`READING_BOUNDS`: the contract's
  range narrowed by the processor's default physical limits) is omitted from the sample
  — the rest of the sample is kept — counted in :attr:`NvmlSource.skipped` (``no_value``,
  ``not_a_number``, ``out_of_range``) and logged once per GPU and field.

Per sample the work is a handful of NVML calls per GPU (counters in one
``nvmlDeviceGetFieldValues`` call); the layout (GPUs, MIG devices, NVLink links) is read
at start and again by :meth:`NvmlSource.inventory`.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import math
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gpuledger.agent.sources.card_types import card_type_of
from gpuledger.agent.sources.nvml_spec import Reader, load_field_spec
from gpuledger.contract.schema import TELEMETRY
from gpuledger.pipeline.config import Limits

log = logging.getLogger("gpuledger.agent.nvml")

MIB = 1.0 / (1024 * 1024)
MAX_EVENTS_PER_SAMPLE = 1024
NVML_NOT_AVAILABLE = (float(0xFFFFFFFF), float(0xFFFFFFFFFFFFFFFF))
"""NVML's "value not available" (``NVML_VALUE_NOT_AVAILABLE`` as unsigned int and long
long): a driver sentinel, never a reading."""
_MAX_WARNED = 4096


def _bounds() -> dict[str, tuple[float | None, float | None]]:
    """Field → (minimum, maximum): the contract's range, narrowed by the processor's
    default physical limits (``gpuledger.pipeline.config.Limits``), which reject the
    whole sample when one reading is outside them."""
    limits = Limits()
    physical: dict[str, tuple[float | None, float | None]] = {
        "power_w": (None, limits.power_max_w),
        "temp_c": (limits.temp_min_c, limits.temp_max_c),
        "sm_clock_mhz": (None, limits.clock_max_mhz),
        "mem_used_mib": (None, limits.memory_max_mib),
        "mem_total_mib": (None, limits.memory_max_mib),
        "used_mib": (0.0, limits.memory_max_mib),
        **{f"{bus}_{way}_bytes_s": (None, limits.byte_rate_max)
           for bus in ("pcie", "nvlink") for way in ("rx", "tx")},
    }
    out: dict[str, tuple[float | None, float | None]] = {}
    for f in TELEMETRY:
        if f.kind not in ("int", "float") or f.name in ("seq", "gpu_index"):
            continue
        low, high = physical.get(f.name, (None, None))
        lows = [x for x in (f.minimum, low) if x is not None]
        highs = [x for x in (f.maximum, high) if x is not None]
        out[f.name] = (max(lows) if lows else None, min(highs) if highs else None)
    out["used_mib"] = physical["used_mib"]   # a process's memory
    return out


READING_BOUNDS = _bounds()
"""Field → (minimum, maximum) a source may report; a reading outside is omitted."""


def reading_problem(name: str, value: float) -> str | None:
    """Why ``value`` cannot be a reading of field ``name`` (None when it can)."""
    if not math.isfinite(value):
        return f"{value} is not a number"
    low, high = READING_BOUNDS.get(name, (None, None))
    if low is not None and value < low:
        return f"{value:g} is below {low:g}"
    if high is not None and value > high:
        return f"{value:g} is above {high:g}"
    return None


class NvmlUnavailable(Exception):
    """NVML cannot be used here: no bindings, no driver library, or no driver."""


@dataclass
class _Device:
    """A GPU or a MIG device, with what the source remembers about it."""

    index: int
    handle: Any
    uuid: str
    card_type: str
    mig_instance: str | None = None
    parent: _Device | None = None
    lost: bool = False
    fatal: bool = False
    xid_events: bool = False
    process_list: bool = True
    xids: int = 0
    nvlinks: int = 0
    mem_total_mib: float | None = None
    migs: list[_Device] = field(default_factory=list)
    ways: dict[str, list[Reader]] = field(default_factory=dict)
    previous: dict[str, tuple[float, float]] = field(default_factory=dict)

    @property
    def healthy(self) -> bool:
        root = self.parent or self
        return not (root.lost or root.fatal)


class NvmlSource:
    """Contract telemetry and inventory records from the node's GPUs through NVML."""

    def __init__(self, node: str, fields: str | Path | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """``clock`` times the readings a counter rate divides by: a monotonic clock, so
        that a step of the wall clock (NTP, a VM resumed) makes no rate up."""
        self._clock = clock
        try:
            import pynvml  # type: ignore[import-untyped,unused-ignore]
        except ImportError as err:
            raise NvmlUnavailable(
                "the NVML bindings are not installed (Python package nvidia-ml-py): "
                "install the agent extra, pip install 'gpuledger[agent]'") from err
        self._nvml: Any = pynvml
        self.node = node
        self.seq = 0
        self.errors = 0
        self.skipped: Counter[str] = Counter()
        """Readings omitted as not a reading, by reason (``no_value``, ``not_a_number``,
        ``out_of_range``): the agent's ``source_series_skipped_total``."""
        self._warned: set[tuple[str, str, str]] = set()
        self._spec = load_field_spec(pynvml, fields)
        self._start()
        self._open_nvml = True
        self._events: Any = None
        self._gpus: list[_Device] = []
        self._by_address: dict[int, _Device] = {}
        try:
            self.driver_version = str(self._nvml.nvmlSystemGetDriverVersion())
            self._discover()
        except pynvml.NVMLError as err:
            self.close()
            raise NvmlUnavailable(f"NVML failed while listing the GPUs: {err}") from err
        except Exception:
            self.close()
            raise

    def _start(self) -> None:
        nvml = self._nvml
        try:
            nvml.nvmlInit()
        except nvml.NVMLError_LibraryNotFound as err:
            raise NvmlUnavailable(
                "the NVIDIA driver library libnvidia-ml.so.1 was not found: install the "
                "NVIDIA driver on this node (in a container, run it with the NVIDIA "
                "container toolkit so that the driver's libraries are mounted), or "
                "configure the dcgm-exporter or simulator source instead") from err
        except nvml.NVMLError_DriverNotLoaded as err:
            raise NvmlUnavailable(
                "the NVIDIA kernel driver is not loaded (nvmlInit: Driver Not Loaded): "
                "check that `nvidia-smi` works on this node") from err
        except nvml.NVMLError_NoPermission as err:
            raise NvmlUnavailable(
                "no permission to open the NVIDIA devices (nvmlInit: Insufficient "
                "Permissions): run the agent as a user that may open /dev/nvidia*") from err
        except nvml.NVMLError as err:
            raise NvmlUnavailable(f"NVML initialisation failed: {err}") from err

    # ---- layout ------------------------------------------------------------------

    def _discover(self) -> None:
        nvml = self._nvml
        count = int(nvml.nvmlDeviceGetCount())
        if self._spec.xid:
            try:
                self._events = nvml.nvmlEventSetCreate()
            except nvml.NVMLError:
                self._events = None
        for index in range(count):
            gpu = self._open(index)
            self._gpus.append(gpu)
            if gpu.lost:
                continue
            self._by_address[_address(gpu.handle)] = gpu
            if self._events is not None:
                try:
                    nvml.nvmlDeviceRegisterEvents(gpu.handle, nvml.nvmlEventTypeXidCriticalError,
                                                  self._events)
                    gpu.xid_events = True
                except nvml.NVMLError:
                    gpu.xid_events = False
            self._read_layout(gpu)

    def _open(self, index: int) -> _Device:
        nvml = self._nvml
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            uuid = str(nvml.nvmlDeviceGetUUID(handle))
            name = str(nvml.nvmlDeviceGetName(handle))
        except nvml.NVMLError_GpuIsLost:
            return _Device(index, None, f"gpu-{index}", "unknown", lost=True)
        except nvml.NVMLError:  # e.g. no permission on this GPU: unusable, say so
            self.errors += 1
            return _Device(index, None, f"gpu-{index}", "unknown", lost=True)
        return _Device(index, handle, uuid, card_type_of(name), ways=self._ways(None))

    def _ways(self, mig: bool | None) -> dict[str, list[Reader]]:
        names = self._spec.mig_fields if mig else self._spec.readers.keys()
        return {n: list(self._spec.readers[n]) for n in self._spec.readers if n in names}

    def _read_layout(self, gpu: _Device) -> None:
        """MIG devices, active NVLink links and memory size of one GPU."""
        nvml = self._nvml
        try:
            gpu.migs = self._mig_devices(gpu)
            gpu.nvlinks = self._active_links(gpu.handle)
            gpu.mem_total_mib = nvml.nvmlDeviceGetMemoryInfo(gpu.handle).total * MIB
        except nvml.NVMLError_GpuIsLost:
            gpu.lost = True
        except nvml.NVMLError:
            self.errors += 1

    def _mig_devices(self, gpu: _Device) -> list[_Device]:
        nvml = self._nvml
        try:
            current, _pending = nvml.nvmlDeviceGetMigMode(gpu.handle)
        except (nvml.NVMLError_NotSupported, nvml.NVMLError_FunctionNotFound):
            return []
        if current != nvml.NVML_DEVICE_MIG_ENABLE:
            return []
        known = {m.uuid: m for m in gpu.migs}
        found: list[_Device] = []
        for slot in range(int(nvml.nvmlDeviceGetMaxMigDeviceCount(gpu.handle))):
            try:
                handle = nvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu.handle, slot)
            except nvml.NVMLError_NotFound:
                continue
            uuid = str(nvml.nvmlDeviceGetUUID(handle))
            name = str(nvml.nvmlDeviceGetName(handle))
            profile = name.rsplit("MIG ", 1)[-1].strip() if "MIG " in name else name
            instance = f"{profile}/{int(nvml.nvmlDeviceGetGpuInstanceId(handle))}"
            mig = known.get(uuid)
            if mig is None or mig.mig_instance != instance:
                mig = _Device(gpu.index, handle, uuid, gpu.card_type, instance, gpu,
                              ways=self._ways(True))
            mig.handle = handle
            found.append(mig)
        return found

    def _active_links(self, handle: Any) -> int:
        nvml = self._nvml
        active = 0
        for link in range(int(nvml.NVML_NVLINK_MAX_LINKS)):
            try:
                state = nvml.nvmlDeviceGetNvLinkState(handle, link)
            except nvml.NVMLError_GpuIsLost:
                raise
            except nvml.NVMLError:
                break
            if state == nvml.NVML_FEATURE_ENABLED:
                active += 1
        return active

    # ---- samples -----------------------------------------------------------------

    def collect(self, now: datetime | None = None) -> list[dict[str, Any]]:
        """One sample per GPU (and per MIG device), as contract telemetry records."""
        when = (now or datetime.now(UTC)).astimezone(UTC)
        stamp = when.strftime("%Y-%m-%dT%H:%M:%S.") + f"{when.microsecond // 1000:03d}Z"
        seconds = self._clock()
        self._drain_events()
        out: list[dict[str, Any]] = []
        for gpu in self._gpus:
            out.append(self._sample(gpu, stamp, seconds, whole=not gpu.migs))
            for mig in gpu.migs:
                out.append(self._sample(mig, stamp, seconds, whole=True))
            gpu.xids = 0
        for rec in out:
            rec["seq"] = self.seq
            self.seq += 1
        return out

    def _sample(self, dev: _Device, stamp: str, seconds: float, whole: bool) -> dict[str, Any]:
        rec: dict[str, Any] = {
            "v": 1, "type": "telemetry", "time": stamp, "node": self.node,
            "gpu_index": dev.index, "gpu_uuid": dev.uuid, "card_type": dev.card_type,
            "mig_instance": dev.mig_instance}
        nvml = self._nvml
        root = dev.parent or dev
        if not root.lost:
            try:
                rec.update(self._metrics(dev, seconds))
                if dev.migs:
                    for name in self._spec.mig_parent_omit:
                        rec.pop(name, None)
                if self._spec.processes and whole and dev.process_list:
                    procs = self._processes(dev)
                    if procs is not None:
                        rec["processes"] = procs
            except nvml.NVMLError_GpuIsLost:
                root.lost = True
                for key in list(rec):
                    if key not in ("v", "type", "time", "node", "gpu_index", "gpu_uuid",
                                   "card_type", "mig_instance"):
                        del rec[key]
        if dev.parent is None and dev.xid_events:
            rec["xid_errors"] = dev.xids
        rec["healthy"] = dev.healthy
        return rec

    def _metrics(self, dev: _Device, seconds: float) -> dict[str, float | int]:
        nvml = self._nvml
        out: dict[str, float | int] = {}
        values = self._field_values(dev)
        results: dict[tuple[str, tuple[int, ...]], Any] = {}
        for name, ways in list(dev.ways.items()):
            while ways:
                way = ways[0]
                try:
                    if way.field_id is not None:
                        if (way.field_id, way.scope) not in values:
                            break  # a fallback field way: read from the next sample on
                        raw = values[(way.field_id, way.scope)]
                    else:
                        raw = self._call(dev, way, results)
                except (nvml.NVMLError_NotSupported, nvml.NVMLError_FunctionNotFound):
                    ways.pop(0)
                    continue
                except nvml.NVMLError_GpuIsLost:
                    raise
                except nvml.NVMLError:
                    self.errors += 1
                    break
                reading = float(raw)
                if reading in NVML_NOT_AVAILABLE or not math.isfinite(reading):
                    # not a reading; a counter keeps its previous one
                    self._omit(dev, name, "no_value" if math.isfinite(reading)
                               else "not_a_number", reading)
                    break
                value = _convert(dev, way, reading, seconds)
                if value is not None:
                    if reading_problem(name, value) is None:
                        out[name] = value
                    else:
                        self._omit(dev, name, "out_of_range", value)
                break
            if not ways:
                del dev.ways[name]
        return out

    def _call(self, dev: _Device, way: Reader,
              results: dict[tuple[str, tuple[int, ...]], Any]) -> float:
        assert way.call is not None
        key = (way.call, way.args)
        if key not in results:
            try:
                results[key] = getattr(self._nvml, way.call)(dev.handle, *way.args)
            except self._nvml.NVMLError as err:
                results[key] = err
        result = results[key]
        if isinstance(result, Exception):
            raise result
        return float(getattr(result, way.attr) if way.attr else result)

    def _field_values(self, dev: _Device) -> dict[tuple[int, int | None], float]:
        """The GPU's counter fields in one nvmlDeviceGetFieldValues call."""
        nvml = self._nvml
        wanted = [(ways[0].field_id, ways[0].scope) for ways in dev.ways.values()
                  if ways and ways[0].field_id is not None]
        if not wanted:
            return {}
        request = [(fid, scope) if scope is not None else fid for fid, scope in wanted]
        try:
            got = nvml.nvmlDeviceGetFieldValues(dev.handle, request)
        except nvml.NVMLError_GpuIsLost:
            raise
        except (nvml.NVMLError_NotSupported, nvml.NVMLError_FunctionNotFound):
            got = None  # the whole call: no counter field can be read on this GPU
        except nvml.NVMLError:
            self.errors += 1
            return {}
        out: dict[tuple[int, int | None], float] = {}
        unsupported: set[tuple[int | None, int | None]] = set()
        for (fid, scope), value in zip(wanted, [] if got is None else got, strict=False):
            if value.nvmlReturn == nvml.NVML_SUCCESS:
                out[(fid, scope)] = _field_value(nvml, value)
            elif value.nvmlReturn == nvml.NVML_ERROR_GPU_IS_LOST:
                raise nvml.NVMLError(nvml.NVML_ERROR_GPU_IS_LOST)
            elif value.nvmlReturn == nvml.NVML_ERROR_NOT_SUPPORTED:
                unsupported.add((fid, scope))
            else:
                self.errors += 1
        for ways in dev.ways.values():
            while ways and ways[0].field_id is not None and (
                    got is None or (ways[0].field_id, ways[0].scope) in unsupported):
                ways.pop(0)
        return out

    def _processes(self, dev: _Device) -> list[dict[str, Any]] | None:
        nvml = self._nvml
        try:
            procs = nvml.nvmlDeviceGetComputeRunningProcesses(dev.handle)
        except nvml.NVMLError_GpuIsLost:
            raise
        except (nvml.NVMLError_NotSupported, nvml.NVMLError_FunctionNotFound):
            dev.process_list = False
            return None
        except nvml.NVMLError:
            self.errors += 1
            return None
        out: list[dict[str, Any]] = []
        for p in procs:
            entry: dict[str, Any] = {"pid": int(p.pid)}
            if p.usedGpuMemory is not None:
                used = float(p.usedGpuMemory)
                if used in NVML_NOT_AVAILABLE:
                    self._omit(dev, "used_mib", "no_value", used)
                elif reading_problem("used_mib", used * MIB) is not None:
                    self._omit(dev, "used_mib", "out_of_range", used * MIB)
                else:
                    entry["used_mib"] = used * MIB
            entry["job_id"] = None
            out.append(entry)
        return out

    def _omit(self, dev: _Device, name: str, reason: str, value: float) -> None:
        """Count a reading left out of a sample; warn once per device, field and reason."""
        self.skipped[reason] += 1
        if (dev.uuid, name, reason) not in self._warned and len(self._warned) < _MAX_WARNED:
            self._warned.add((dev.uuid, name, reason))
            log.warning("GPU %d (%s): %s %r omitted from the sample (%s)", dev.index,
                        dev.uuid, name, value, "NVML's value-not-available"
                        if reason == "no_value" else reading_problem(name, value) or reason)

    def _drain_events(self) -> None:
        nvml = self._nvml
        if self._events is None:
            return
        for _ in range(MAX_EVENTS_PER_SAMPLE):
            try:
                data = nvml.nvmlEventSetWait(self._events, 0)
            except nvml.NVMLError_Timeout:
                return
            except nvml.NVMLError:
                self.errors += 1
                return
            gpu = self._by_address.get(_address(data.device))
            if gpu is None or not data.eventType & nvml.nvmlEventTypeXidCriticalError:
                continue
            gpu.xids += 1
            if int(data.eventData) in self._spec.fatal_xids:
                gpu.fatal = True

    # ---- inventory and devices ---------------------------------------------------

    def devices(self) -> list[dict[str, Any]]:
        """The GPUs by index, with their MIG device UUIDs (for attribution by device)."""
        return [{"index": g.index, "uuid": g.uuid, "mig": [m.uuid for m in g.migs]}
                for g in self._gpus]

    def inventory(self, pool: str, now: datetime | None = None) -> dict[str, Any]:
        """The node's inventory record; re-reads MIG layout, NVLink links and health."""
        for gpu in self._gpus:
            if not gpu.lost:
                self._read_layout(gpu)
        when = (now or datetime.now(UTC)).astimezone(UTC)
        types = Counter(g.card_type for g in self._gpus if g.card_type != "unknown")
        sizes = [g.mem_total_mib for g in self._gpus if g.mem_total_mib is not None]
        unhealthy = [g.index for g in self._gpus if not g.healthy]
        labels = {"nvidia.driver_version": self.driver_version}
        if len(types) > 1:
            labels["nvidia.card_types"] = ",".join(sorted(types))
        layout = [f"{g.index}:" + "+".join(m.mig_instance or "" for m in g.migs)
                  for g in self._gpus if g.migs]
        if layout:
            labels["nvidia.mig"] = ";".join(layout)
        if unhealthy and len(unhealthy) == len(self._gpus):
            health = "down"
        else:
            health = "degraded" if unhealthy else "ok"
        return {
            "v": 1, "type": "inventory",
            "time": when.strftime("%Y-%m-%dT%H:%M:%S.") + f"{when.microsecond // 1000:03d}Z",
            "node": self.node, "pool": pool,
            "card_type": types.most_common(1)[0][0] if types else "unknown",
            "gpu_count": len(self._gpus), "gpu_mem_mib": max(sizes, default=0.0),
            "topology": "nvlink" if any(g.nvlinks for g in self._gpus) else "pcie",
            "labels": labels, "schedulable": True, "health": health,
            "unhealthy_gpus": unhealthy,
        }

    def close(self) -> None:
        """Release the event set and shut NVML down (idempotent)."""
        nvml = self._nvml
        if self._events is not None:
            with contextlib.suppress(nvml.NVMLError):
                nvml.nvmlEventSetFree(self._events)
            self._events = None
        if self._open_nvml:
            self._open_nvml = False
            with contextlib.suppress(nvml.NVMLError):
                nvml.nvmlShutdown()


def _address(handle: Any) -> int:
    return int(ctypes.cast(handle, ctypes.c_void_p).value or 0)


def _field_value(nvml: Any, value: Any) -> float:
    kind = value.valueType
    if kind == nvml.NVML_VALUE_TYPE_DOUBLE:
        return float(value.value.dVal)
    if kind == nvml.NVML_VALUE_TYPE_UNSIGNED_INT:
        return float(value.value.uiVal)
    if kind == nvml.NVML_VALUE_TYPE_UNSIGNED_LONG:
        return float(value.value.ulVal)
    if kind == nvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG:
        return float(value.value.sllVal)
    if kind == getattr(nvml, "NVML_VALUE_TYPE_SIGNED_INT", -1):
        return float(value.value.siVal)
    return float(value.value.ullVal)


def _convert(dev: _Device, way: Reader, raw: float, seconds: float) -> float | int | None:
    """The field's value from a raw reading: gauge, counter delta or counter rate."""
    if way.kind == "gauge":
        return raw * way.scale
    previous = dev.previous.get(way.field)
    dev.previous[way.field] = (raw, seconds)
    if previous is None or raw < previous[0]:
        return None
    if way.kind == "delta":
        return round((raw - previous[0]) * way.scale)
    interval = seconds - previous[1]
    return (raw - previous[0]) * way.scale / interval if interval > 0 else None
