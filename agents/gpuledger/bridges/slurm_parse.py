"""Parsing what Slurm's commands print into job and node snapshots.

Two forms of the same facts, normalised into :class:`SlurmJob` and :class:`SlurmNode`:

* JSON (Slurm ≥ 21.08 with the ``serializer/json`` plugin): ``squeue --json`` and
  ``sinfo --json``. GPU indices come from a job's ``gres_detail``
  (``gpu:h100:2(IDX:1-2)``, one entry per allocated node, in node-list order).
* Text (any version): ``scontrol -o show job -d`` (one line per job; the detail part
  ``Nodes=… GRES=gpu:h100:2(IDX:1-2)`` carries the indices) and
  ``scontrol -o show node -d``. Text times are the controller's local time.

Pure Python: the bridge is as lean as the node agent.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

# Job states after which Slurm will not run the job again (unless requeued).
ENDED_STATES = ("COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED",
                "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY", "REVOKED", "SPECIAL_EXIT")
RUNNING_STATES = ("RUNNING", "COMPLETING", "SUSPENDED", "STOPPED", "SIGNALING",
                  "STAGE_OUT", "CONFIGURING", "RESIZING")
PENDING_STATES = ("PENDING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "RESV_DEL_HOLD")


class SlurmParseError(ValueError):
    """Slurm's output could not be understood."""


@dataclass(frozen=True)
class SlurmJob:
    """One job (or array task) as the controller sees it now."""

    job_id: str
    state: str
    name: str = ""
    user: str | None = None
    account: str | None = None
    partition: str | None = None
    qos: str | None = None
    priority: int | None = None
    reason: str | None = None
    restarts: int = 0
    requeue: bool = True
    submit: float | None = None
    start: float | None = None
    end: float | None = None
    exit_code: str | None = None
    """``exit:signal`` as scontrol prints it (``3:0``; ``0:9`` for a SIGKILL)."""
    gpus: int = 0
    gpu_type: str | None = None
    allocation: tuple[tuple[str, int], ...] = ()
    """(node, GPU index) pairs, from GRES IDX; empty when not running or not known."""

    def __post_init__(self) -> None:
        # Slurm fills in expected times for jobs that have not started / ended; drop them.
        if self.phase == "pending":
            object.__setattr__(self, "start", None)
        if self.phase != "ended":
            object.__setattr__(self, "end", None)

    @property
    def phase(self) -> str:
        """``pending``, ``running`` or ``ended``."""
        if self.state in ENDED_STATES:
            return "ended"
        if self.state in RUNNING_STATES:
            return "running"
        return "pending"


@dataclass(frozen=True)
class SlurmNode:
    """One node: its partitions, GPUs and state."""

    name: str
    state: str
    """Base state, lower case: idle, mixed, allocated, down, ..."""
    flags: tuple[str, ...] = ()
    """State flags, upper case: DRAIN, NOT_RESPONDING, MAINTENANCE, ..."""
    partitions: tuple[str, ...] = ()
    gpu_type: str | None = None
    gpus: int = 0
    gres_drained: tuple[int, ...] = ()
    reason: str | None = None
    labels: dict[str, str] = field(default_factory=dict)


# -- small grammars --------------------------------------------------------------------

_GRES_ITEM = re.compile(r"^(?:gres[:/])?gpu(?::(?P<type>[^:(=,]+))?[:=](?P<count>\d+)"
                        r"(?:\((?:S:[^)]*?)?(?:IDX:(?P<idx>[^)]*))?\))?$")
_GPU_COUNT_LIKE = re.compile(r"^(?:gres[:/])?gpu(?::[^:(=,]+)?[:=]"
                             r"(?P<count>[-+.]?[0-9][^(:=,]*)")
"""A GPU item whose count reads as a number (``gpu=1.5``, ``gpu:h100:-1``): one that
is not a whole number is not a count Slurm writes, and is refused rather than read as
no GPUs."""


MAX_GPU_INDEX = 1023
"""The contract's largest GPU index: a range beyond it is not a real node's."""
MAX_JOB_GPUS = 100_000
"""The contract's largest GPU request of a job."""
MAX_HOSTS = 100_000
"""A hostlist naming more nodes than this is not a real cluster's."""


def _range(part: str, what: str, largest: int) -> range:
    """``lo-hi`` as a range; :class:`SlurmParseError` when it is not one, runs backwards or
    goes beyond ``largest``."""
    lo, hi = part.split("-", 1)
    try:
        first, last = int(lo), int(hi)
    except ValueError:
        raise SlurmParseError(f"{what}: {part!r} is not a range of numbers") from None
    if first < 0 or last < first:
        raise SlurmParseError(f"{what}: {part!r} is not an ascending range")
    if last > largest:
        raise SlurmParseError(f"{what}: {part!r} goes beyond {largest}")
    return range(first, last + 1)


def expand_indices(text: str) -> list[int]:
    """``0-2,5`` → [0, 1, 2, 5]; ``N/A`` or empty → []. Indices are 0…1023
    (:class:`SlurmParseError` otherwise)."""
    out: list[int] = []
    if not text or text.upper() == "N/A":
        return out
    for part in text.split(","):
        if "-" in part:
            out.extend(_range(part, "GPU indices", MAX_GPU_INDEX))
        elif part:
            try:
                index = int(part)
            except ValueError:
                raise SlurmParseError(f"GPU indices: {part!r} is not a number") from None
            if not 0 <= index <= MAX_GPU_INDEX:
                raise SlurmParseError(f"GPU indices: {index} is not in 0-{MAX_GPU_INDEX}")
            out.append(index)
    return out


def parse_gres(text: str | None) -> tuple[str | None, int, list[int]]:
    """GPU type, count and indices of a GRES string.

    ``gpu:h100:2(IDX:1-2)``, ``gres:gpu:h100:8``, ``gres/gpu:h100=2``, ``gpu:4``,
    ``gpu:h100:8(S:0-1)``; other GRES (``nic:1``) in a comma list are skipped.
    """
    if not text or text in ("(null)", "N/A"):
        return None, 0, []
    gpu_type: str | None = None
    count = 0
    indices: list[int] = []
    for item in _split_gres(text):
        m = _GRES_ITEM.match(item.strip())
        if not m:
            odd = _GPU_COUNT_LIKE.match(item.strip())
            if odd:
                raise SlurmParseError(f"GRES {text[:80]!r}: GPU count "
                                      f"{odd.group('count')[:20]!r} is not a whole number")
            continue
        gpu_type = gpu_type or m.group("type")
        count += int(m.group("count"))
        if m.group("idx"):
            indices.extend(expand_indices(m.group("idx")))
    if count > MAX_JOB_GPUS:
        raise SlurmParseError(f"GRES {text[:80]!r}: {count} GPUs is more than "
                              f"{MAX_JOB_GPUS:,}")
    return gpu_type, count, indices


def _split_top(text: str, opening: str, closing: str) -> list[str]:
    """Split a comma list at top level (not inside ``opening`` … ``closing``)."""
    items, depth, cur = [], 0, ""
    for ch in text:
        if ch == opening:
            depth += 1
        elif ch == closing:
            depth -= 1
        if ch == "," and depth == 0:
            items.append(cur)
            cur = ""
        else:
            cur += ch
    items.append(cur)
    return [i for i in items if i]


def _split_gres(text: str) -> list[str]:
    """Split a GRES list at top level (not inside parentheses)."""
    return _split_top(text, "(", ")")


def parse_tres_gpus(text: str | None) -> tuple[str | None, int]:
    """GPU type and count of a TRES string (sacct ``AllocTRES``/``ReqTRES``).

    ``cpu=2,gres/gpu:h100=2,gres/gpu=2,mem=8G,node=1`` → ('h100', 2): the untyped
    ``gres/gpu`` total wins; typed entries give the type (and the count when there is no
    total).
    """
    if not text:
        return None, 0
    total: int | None = None
    typed = 0
    gpu_type: str | None = None
    for item in text.split(","):
        key, _, value = item.partition("=")
        if key == "gres/gpu":
            total = int(value) if value.isdigit() else total
        elif key.startswith("gres/gpu:") and value.isdigit():
            gpu_type = gpu_type or key.split(":", 1)[1]
            typed += int(value)
    count = total if total is not None else typed
    if count > MAX_JOB_GPUS:
        raise SlurmParseError(f"TRES {text[:80]!r}: {count} GPUs is more than "
                              f"{MAX_JOB_GPUS:,}")
    return gpu_type, count


def expand_hostlist(text: str | None) -> list[str]:
    """``gpu-[1-3,5],login1`` → ['gpu-1', 'gpu-2', 'gpu-3', 'gpu-5', 'login1']."""
    if not text or text in ("(null)", "None assigned"):
        return []
    out: list[str] = []
    for item in _split_hostlist(text):
        m = re.match(r"^(.*?)\[([^\]]+)\](.*)$", item)
        if not m:
            out.append(item)
            continue
        prefix, ranges, suffix = m.groups()
        for part in ranges.split(","):
            if "-" in part:
                numbers = _range(part, f"hostlist {text[:80]!r}", 10**9)
                if len(out) + len(numbers) > MAX_HOSTS:
                    raise SlurmParseError(f"hostlist {text[:80]!r}: more than "
                                          f"{MAX_HOSTS:,} nodes")
                width = len(part.split("-", 1)[0])
                out.extend(f"{prefix}{str(n).zfill(width)}{suffix}" for n in numbers)
            else:
                out.append(f"{prefix}{part}{suffix}")
        if len(out) > MAX_HOSTS:
            raise SlurmParseError(f"hostlist {text[:80]!r}: more than {MAX_HOSTS:,} nodes")
    return out


def _split_hostlist(text: str) -> list[str]:
    """Split a hostlist at top level (not inside brackets)."""
    return _split_top(text, "[", "]")


def _text(value: Any) -> str | None:
    if value is None:
        return None
    s = str(value)
    return None if s in ("", "(null)", "N/A", "None") else s


def _epoch(value: Any) -> float | None:
    """JSON times: epoch seconds; 0 means unset."""
    if isinstance(value, dict):  # Slurm ≥ 23.02: {"set": true, "number": N}
        value = value.get("number") if value.get("set", True) else None
    if value is None or isinstance(value, bool):
        return None
    number = float(value)
    return number if number > 0 else None


def _int(value: Any) -> int | None:
    if isinstance(value, dict):
        value = value.get("number") if value.get("set", True) else None
    if value is None or isinstance(value, bool):
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


NO_VAL = 0xFFFFFFFE
"""Slurm's "not set" for 32-bit numbers (and INFINITE, 0xFFFFFFFF, above it)."""


def exit_code_text(value: Any) -> str | None:
    """Slurm's ``exit:signal`` text (``3:0``, ``0:9``) from what its JSON holds.

    ``squeue --json`` / ``sacct --json`` up to 22.05 give the raw wait status of the
    batch script, as ``scontrol`` decodes it: signal = status & 0x7f when the script
    was killed by a signal, exit code = (status >> 8) & 0xff. So ``exit 3`` arrives as
    768 → ``3:0``, a SIGKILL as 9 → ``0:9``, a core dump of SIGSEGV as 139 → ``0:11``.
    Slurm ≥ 23.02 gives an object, ``{"status": [...], "return_code": {"number": 3},
    "signal": {"id": {"number": 9}, "name": "KILL"}}`` (sacct 22.05: ``return_code``
    a number and ``signal: {"signal_id": 9}``); it is read too. Unset → None.
    """
    if isinstance(value, dict) and ("return_code" in value or "signal" in value):
        code = _int(value.get("return_code")) or 0
        signal = value.get("signal")
        number = None
        if isinstance(signal, dict):
            number = _int(signal.get("id", signal.get("signal_id")))
        if code >= NO_VAL or (number or 0) >= NO_VAL:
            return None
        return f"{code}:{number or 0}"
    status = _int(value)
    if status is None or status < 0 or status >= NO_VAL:
        return None
    signal = status & 0x7F
    signaled = signal not in (0, 0x7F)
    return f"{(status >> 8) & 0xFF}:{signal if signaled else 0}"


def _state(value: Any) -> str:
    if isinstance(value, list):  # Slurm ≥ 23.02: ["RUNNING", "COMPLETING"]
        value = value[0] if value else "UNKNOWN"
    return str(value or "UNKNOWN").upper()


# -- JSON ------------------------------------------------------------------------------


def _job_id(raw: dict[str, Any]) -> str:
    return str(_int(raw.get("job_id")))


def parse_squeue_json(text: str) -> list[SlurmJob]:
    """Jobs from ``squeue --json`` (optionally ``--states=all``)."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SlurmParseError(f"squeue --json: not JSON: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("jobs"), list):
        raise SlurmParseError("squeue --json: no 'jobs' list")
    jobs = []
    for raw in doc["jobs"]:
        gpu_type, gpus, _ = parse_gres(_text(raw.get("tres_per_node")))
        if not gpus:
            gpu_type, gpus, _ = parse_gres(_text(raw.get("tres_per_job")))
        nodes = expand_hostlist(_text(raw.get("nodes")))
        allocation: list[tuple[str, int]] = []
        for node, detail in zip(nodes, raw.get("gres_detail") or [], strict=False):
            _, _, idx = parse_gres(detail)
            allocation.extend((node, i) for i in idx)
        node_count = max(len(nodes), _int(raw.get("node_count")) or 1)
        if gpus and node_count > 1 and _text(raw.get("tres_per_node")):
            gpus *= node_count
        jobs.append(SlurmJob(
            job_id=_job_id(raw), state=_state(raw.get("job_state")),
            name=str(raw.get("name") or ""), user=_text(raw.get("user_name")),
            account=_text(raw.get("account")), partition=_text(raw.get("partition")),
            qos=_text(raw.get("qos")), priority=_int(raw.get("priority")),
            reason=_text(raw.get("state_reason")), restarts=_int(raw.get("restart_cnt")) or 0,
            requeue=bool(raw.get("requeue", True)), submit=_epoch(raw.get("submit_time")),
            start=_epoch(raw.get("start_time")), end=_epoch(raw.get("end_time")),
            exit_code=exit_code_text(raw.get("exit_code")), gpus=gpus, gpu_type=gpu_type,
            allocation=tuple(allocation)))
    return jobs


def parse_sinfo_json(text: str) -> list[SlurmNode]:
    """Nodes from ``sinfo --json``."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SlurmParseError(f"sinfo --json: not JSON: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("nodes"), list):
        raise SlurmParseError("sinfo --json: no 'nodes' list")
    nodes: dict[str, SlurmNode] = {}
    for raw in doc["nodes"]:
        gpu_type, gpus, _ = parse_gres(_text(raw.get("gres")))
        _, _, drained = parse_gres(_text(raw.get("gres_drained")))
        state = raw.get("state")
        flags = [str(f).upper() for f in raw.get("state_flags") or []]
        if isinstance(state, list):  # Slurm ≥ 23.02
            flags = [str(s).upper() for s in state[1:]] + flags
            state = state[0] if state else "unknown"
        name = str(raw.get("name"))
        nodes[name] = SlurmNode(
            name=name, state=str(state or "unknown").lower(), flags=tuple(flags),
            partitions=tuple(raw.get("partitions") or ()), gpu_type=gpu_type, gpus=gpus,
            gres_drained=tuple(drained), reason=_text(raw.get("reason")))
    return list(nodes.values())


# -- text ------------------------------------------------------------------------------

_KV = re.compile(r"(?:^|\s)([A-Za-z_:/]+)=")


def _key_values(line: str) -> list[tuple[str, str]]:
    """``A=1 B=x y C=2`` → [(A, 1), (B, 'x y'), (C, 2)] (values may hold spaces)."""
    marks = list(_KV.finditer(line))
    out = []
    for i, m in enumerate(marks):
        end = marks[i + 1].start() if i + 1 < len(marks) else len(line)
        out.append((m.group(1), line[m.end():end].strip()))
    return out


def _local_time(text: str | None) -> float | None:
    if not text or text in ("Unknown", "None", "N/A", "(null)"):
        return None
    try:
        return datetime.fromisoformat(text).timestamp()  # naive: the local time zone
    except ValueError:
        return None


def _name_of(text: str | None) -> str | None:
    """``root(0)`` → ``root``."""
    if not text:
        return None
    return _text(text.split("(")[0])


def parse_scontrol_jobs(text: str) -> list[SlurmJob]:
    """Jobs from ``scontrol -o show job -d`` (one line per job)."""
    jobs = []
    for line in text.splitlines():
        if not line.startswith("JobId="):
            continue
        kv = _key_values(line)
        first: dict[str, str] = {}
        allocation: list[tuple[str, int]] = []
        node_group: list[str] = []
        for key, value in kv:
            if key == "Nodes" and "JobId" in first:  # detail part: Nodes=... GRES=...
                node_group = expand_hostlist(value)
            elif key == "GRES" and node_group:
                _, _, idx = parse_gres(value)
                allocation.extend((n, i) for n in node_group for i in idx)
                node_group = []
            elif key not in first:
                first[key] = value
        if "ArrayJobId" in first and "ArrayTaskId" in first and "JobId" not in first:
            continue
        tres = first.get("TresPerNode") or first.get("TresPerJob") or first.get("TRES")
        gpu_type, gpus, _ = parse_gres(_text(tres))
        if not gpus:
            gpu_type, gpus, _ = parse_gres(_text(first.get("JOB_GRES")))
        nodes = expand_hostlist(_text(first.get("NodeList")))
        node_count = max(len(nodes), _int((first.get("NumNodes") or "1").split("-")[0]) or 1)
        if gpus and node_count > 1 and first.get("TresPerNode"):
            gpus *= node_count
        state = first.get("JobState", "UNKNOWN").split()[0]
        jobs.append(SlurmJob(
            job_id=first["JobId"], state=state.upper(), name=first.get("JobName", ""),
            user=_name_of(first.get("UserId")), account=_text(first.get("Account")),
            partition=_text(first.get("Partition")), qos=_text(first.get("QOS")),
            priority=_int(first.get("Priority")), reason=_text(first.get("Reason")),
            restarts=_int(first.get("Restarts")) or 0, requeue=first.get("Requeue") != "0",
            submit=_local_time(first.get("SubmitTime")),
            start=_local_time(first.get("StartTime")), end=_local_time(first.get("EndTime")),
            exit_code=_text(first.get("ExitCode")), gpus=gpus, gpu_type=gpu_type,
            allocation=tuple(allocation)))
    return jobs


def parse_scontrol_nodes(text: str) -> list[SlurmNode]:
    """Nodes from ``scontrol -o show node -d``."""
    nodes = []
    for line in text.splitlines():
        if not line.startswith("NodeName="):
            continue
        kv = dict(_key_values(line))
        gpu_type, gpus, _ = parse_gres(_text(kv.get("Gres")))
        _, _, drained = parse_gres(_text(kv.get("GresDrain")))
        parts = (kv.get("State") or "UNKNOWN").split("+")
        nodes.append(SlurmNode(
            name=kv["NodeName"].split()[0], state=parts[0].rstrip("*").lower(),
            flags=tuple(p.upper() for p in parts[1:]),
            partitions=tuple(p for p in (kv.get("Partitions") or "").split(",") if p),
            gpu_type=gpu_type, gpus=gpus, gres_drained=tuple(drained),
            reason=_text(kv.get("Reason"))))
    return nodes
