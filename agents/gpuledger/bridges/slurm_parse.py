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
import math
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


class SlurmAmbiguousLine(SlurmParseError):
    """A line of scontrol's text whose fields cannot be told from text a user wrote into
    a free-text field (JobName, Comment, WorkDir, StdOut, ...)."""


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
    """``gpu-[1-3,5],login1`` → ['gpu-1', 'gpu-2', 'gpu-3', 'gpu-5', 'login1'].

    Every bracket group is expanded, the first one outermost as Slurm does:
    ``rack[1-2]-node[01-02]`` → rack1-node01, rack1-node02, rack2-node01, rack2-node02.
    An unbalanced or empty bracket is refused (:class:`SlurmParseError`).
    """
    if not text or text in ("(null)", "None assigned"):
        return []
    out: list[str] = []
    for item in _split_hostlist(text):
        out.extend(_expand_host(item, text, MAX_HOSTS - len(out)))
    return out


def _expand_host(item: str, text: str, room: int) -> list[str]:
    """The host names of one hostlist item (all its bracket groups), at most ``room``."""
    names = [""]
    rest = item
    while rest:
        opening, closing = rest.find("["), rest.find("]")
        if opening < 0:
            if closing >= 0:
                raise SlurmParseError(f"hostlist {text[:80]!r}: unbalanced ']'")
            names = [n + rest for n in names]
            break
        closing = rest.find("]", opening)
        if closing < 0 or "[" in rest[opening + 1:closing] or "]" in rest[:opening]:
            raise SlurmParseError(f"hostlist {text[:80]!r}: unbalanced brackets")
        prefix, ranges, rest = rest[:opening], rest[opening + 1:closing], rest[closing + 1:]
        values: list[str] = []
        for part in ranges.split(","):
            if "-" in part:
                numbers = _range(part, f"hostlist {text[:80]!r}", 10**9)
                if len(values) + len(numbers) > MAX_HOSTS:
                    raise SlurmParseError(f"hostlist {text[:80]!r}: more than "
                                          f"{MAX_HOSTS:,} nodes")
                width = len(part.split("-", 1)[0])
                values.extend(str(n).zfill(width) for n in numbers)
            elif part.isdigit():
                values.append(part)
            else:
                raise SlurmParseError(f"hostlist {text[:80]!r}: {part!r} is not a number "
                                      "or a range")
        if len(names) * len(values) > room:
            raise SlurmParseError(f"hostlist {text[:80]!r}: more than {MAX_HOSTS:,} nodes")
        names = [n + prefix + v for n in names for v in values]
    return names


def _split_hostlist(text: str) -> list[str]:
    """Split a hostlist at top level (not inside brackets)."""
    return _split_top(text, "[", "]")


def _text(value: Any) -> str | None:
    if value is None:
        return None
    s = str(value)
    return None if s in ("", "(null)", "N/A", "None") else s


MAX_EPOCH = 253_402_300_799.0
"""9999-12-31T23:59:59Z: a time beyond it is not one Slurm keeps (nor one a timestamp can
hold)."""


def _epoch(value: Any, what: str = "time") -> float | None:
    """JSON times: epoch seconds; 0 means unset. :class:`SlurmParseError` when it is not a
    number of seconds (``"yesterday"``, ``1e300``, a list)."""
    if isinstance(value, dict):  # Slurm ≥ 23.02: {"set": true, "number": N}
        value = value.get("number") if value.get("set", True) else None
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SlurmParseError(f"{what}: {str(value)[:40]!r} is not a time in epoch seconds")
    number = float(value)
    if not math.isfinite(number) or number > MAX_EPOCH:
        raise SlurmParseError(f"{what}: {value!r} is not a time in epoch seconds")
    return number if number > 0 else None


def _jtext(raw: dict[str, Any], key: str, job: str = "") -> str | None:
    """A text field of a JSON object: a string (or number); anything else is refused."""
    value = raw.get(key)
    if isinstance(value, dict | list | bool):
        raise SlurmParseError(f"{job}{key}: expected text, got {type(value).__name__} "
                              f"{str(value)[:40]!r}")
    return _text(value)


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


def _state(value: Any, what: str = "job_state") -> str:
    if isinstance(value, list):  # Slurm ≥ 23.02: ["RUNNING", "COMPLETING"]
        value = value[0] if value else "UNKNOWN"
    if value is not None and not isinstance(value, str):
        raise SlurmParseError(f"{what}: expected a state name, got {str(value)[:40]!r}")
    return str(value or "UNKNOWN").upper()


# -- JSON ------------------------------------------------------------------------------


def _job_id(raw: dict[str, Any]) -> str:
    job_id = _int(raw.get("job_id"))
    if job_id is None or job_id <= 0 or isinstance(raw.get("job_id"), float):
        raise SlurmParseError(f"a job without a valid job_id ({str(raw.get('job_id'))[:40]!r})")
    return str(job_id)


def _check_errors(doc: dict[str, Any], command: str) -> None:
    """Slurm's ``errors`` list: an answer that carries errors is not a view of the
    cluster (its ``jobs`` may be empty), so it fails the poll."""
    errors = doc.get("errors")
    if not errors:
        return
    if not isinstance(errors, list):
        raise SlurmParseError(f"{command}: 'errors' is not a list")
    first = errors[0]
    if isinstance(first, dict):
        first = first.get("error") or first.get("description") or first
    raise SlurmParseError(f"{command}: Slurm reported {len(errors)} error(s): "
                          f"{str(first)[:200]}")


def parse_squeue_json(text: str) -> list[SlurmJob]:
    """Jobs from ``squeue --json`` (optionally ``--states=all``).

    An answer that is not what squeue writes (an ``errors`` list, a job that is not an
    object or has no job id, a time or a name that is not one) is refused whole with
    :class:`SlurmParseError`: the bridge's poll fails and nothing changes."""
    try:
        doc = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise SlurmParseError(f"squeue --json: not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise SlurmParseError("squeue --json: no 'jobs' list")
    _check_errors(doc, "squeue --json")
    if not isinstance(doc.get("jobs"), list):
        raise SlurmParseError("squeue --json: no 'jobs' list")
    jobs = []
    seen: set[str] = set()
    for n, raw in enumerate(doc["jobs"]):
        if not isinstance(raw, dict):
            raise SlurmParseError(f"squeue --json: job #{n} is not an object "
                                  f"({str(raw)[:40]!r})")
        try:
            job = _squeue_job(raw)
        except SlurmParseError as exc:
            raise SlurmParseError(f"squeue --json: job #{n}: {exc}") from None
        if job.job_id in seen:
            raise SlurmParseError(f"squeue --json: job {job.job_id} is listed twice")
        seen.add(job.job_id)
        jobs.append(job)
    return jobs


def _squeue_job(raw: dict[str, Any]) -> SlurmJob:
    job_id = _job_id(raw)
    where = f"job {job_id}: "
    gpu_type, gpus, _ = parse_gres(_jtext(raw, "tres_per_node", where))
    if not gpus:
        gpu_type, gpus, _ = parse_gres(_jtext(raw, "tres_per_job", where))
    nodes = expand_hostlist(_jtext(raw, "nodes", where))
    details = raw.get("gres_detail") or []
    if not isinstance(details, list) or not all(isinstance(d, str) for d in details):
        raise SlurmParseError(f"{where}gres_detail: expected a list of GRES strings")
    allocation: list[tuple[str, int]] = []
    for node, detail in zip(nodes, details, strict=False):
        _, _, idx = parse_gres(detail)
        allocation.extend((node, i) for i in idx)
    if len(set(allocation)) != len(allocation):
        raise SlurmParseError(f"{where}gres_detail lists a GPU twice ({details!r:.80})")
    node_count = max(len(nodes), _int(raw.get("node_count")) or 1)
    if gpus and node_count > 1 and _jtext(raw, "tres_per_node", where):
        gpus *= node_count
    restarts = _int(raw.get("restart_cnt")) or 0
    if restarts < 0:
        raise SlurmParseError(f"{where}restart_cnt {restarts} is negative")
    return SlurmJob(
        job_id=job_id, state=_state(raw.get("job_state"), f"{where}job_state"),
        name=_jtext(raw, "name", where) or "", user=_jtext(raw, "user_name", where),
        account=_jtext(raw, "account", where), partition=_jtext(raw, "partition", where),
        qos=_jtext(raw, "qos", where), priority=_int(raw.get("priority")),
        reason=_jtext(raw, "state_reason", where), restarts=restarts,
        requeue=bool(raw.get("requeue", True)),
        submit=_epoch(raw.get("submit_time"), f"{where}submit_time"),
        start=_epoch(raw.get("start_time"), f"{where}start_time"),
        end=_epoch(raw.get("end_time"), f"{where}end_time"),
        exit_code=exit_code_text(raw.get("exit_code")), gpus=gpus, gpu_type=gpu_type,
        allocation=tuple(allocation))


def parse_sinfo_json(text: str) -> list[SlurmNode]:
    """Nodes from ``sinfo --json`` (an ``errors`` list or a malformed node is refused)."""
    try:
        doc = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise SlurmParseError(f"sinfo --json: not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise SlurmParseError("sinfo --json: no 'nodes' list")
    _check_errors(doc, "sinfo --json")
    if not isinstance(doc.get("nodes"), list):
        raise SlurmParseError("sinfo --json: no 'nodes' list")
    nodes: dict[str, SlurmNode] = {}
    for n, raw in enumerate(doc["nodes"]):
        if not isinstance(raw, dict) or not isinstance(raw.get("name"), str) \
                or not raw["name"]:
            raise SlurmParseError(f"sinfo --json: node #{n} is not an object with a name")
        name = raw["name"]
        where = f"sinfo --json: node {name[:40]}: "
        gpu_type, gpus, _ = parse_gres(_jtext(raw, "gres", where))
        _, _, drained = parse_gres(_jtext(raw, "gres_drained", where))
        state = raw.get("state")
        raw_flags = raw.get("state_flags") or []
        partitions = raw.get("partitions") or []
        for key, value in (("state_flags", raw_flags), ("partitions", partitions)):
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise SlurmParseError(f"{where}{key}: expected a list of names")
        flags = [f.upper() for f in raw_flags]
        if isinstance(state, list):  # Slurm ≥ 23.02
            flags = [str(s).upper() for s in state[1:]] + flags
            state = state[0] if state else "unknown"
        state = _state(state, f"{where}state")
        nodes[name] = SlurmNode(
            name=name, state=state.lower(), flags=tuple(flags),
            partitions=tuple(partitions), gpu_type=gpu_type, gpus=gpus,
            gres_drained=tuple(drained), reason=_jtext(raw, "reason", where))
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


# The keys ``scontrol -o show job -d`` prints, in its order (Slurm 22.05; keys on one row
# may come in any order among themselves). JobName, Comment, WorkDir, StdOut, ... are
# free text, printed as written — ``sbatch -J 'x Account=rich UserId=boss(0)'`` puts
# those keys into the line — so a line where one of these keys comes twice or out of
# this order does not say which value is Slurm's, and is refused.
_JOB_KEY_ORDER: tuple[tuple[str, ...], ...] = (
    ("JobId",), ("ArrayJobId",), ("ArrayTaskId",), ("ArrayTaskThrottle",),
    ("HetJobId",), ("HetJobOffset",), ("HetJobIdSet",), ("JobName",), ("UserId",),
    ("GroupId",), ("MCS_label",), ("Priority",), ("Nice",), ("Account",), ("QOS",),
    ("JobState",), ("Reason",), ("Dependency",), ("Requeue",), ("Restarts",),
    ("BatchFlag",), ("Reboot",), ("ExitCode",), ("DerivedExitCode",), ("RunTime",),
    ("TimeLimit",), ("TimeMin",), ("SubmitTime",), ("EligibleTime",), ("AccrueTime",),
    ("StartTime",), ("EndTime",), ("Deadline",), ("SuspendTime",), ("SecsPreSuspend",),
    ("LastSchedEval",), ("Scheduler",), ("Partition",), ("AllocNode:Sid",),
    ("ReqNodeList",), ("ExcNodeList",), ("NodeList",), ("BatchHost",), ("NumNodes",),
    ("NumCPUs",), ("NumTasks",), ("CPUs/Task",), ("ReqB:S:C:T",), ("TRES",),
    ("Socks/Node",), ("NtasksPerN:B:S:C",), ("CoreSpec",), ("JOB_GRES",),
    ("MinCPUsNode",), ("MinMemoryNode", "MinMemoryCPU"), ("MinTmpDiskNode",),
    ("Features",), ("DelayBoot",), ("OverSubscribe",), ("Contiguous",), ("Licenses",),
    ("Network",), ("Command",), ("WorkDir",), ("StdErr",), ("StdIn",), ("StdOut",),
    ("Power",), ("TresPerJob", "TresPerNode", "TresPerSocket", "TresPerTask"),
)
_JOB_KEY_RANK = {key: rank for rank, keys in enumerate(_JOB_KEY_ORDER) for key in keys}
_JOB_DETAIL_KEYS = ("Nodes", "CPU_IDs", "Mem", "GRES")
"""The per-node detail of ``-d`` (``Nodes=… CPU_IDs=… Mem=… GRES=…``), once per node
group, between JOB_GRES and MinCPUsNode."""


def _job_fields(line: str) -> tuple[dict[str, str], list[tuple[str, str]]]:
    """The fields of one ``scontrol -o show job -d`` line and its detail pairs.

    Only scontrol's own keys in scontrol's order count (:data:`_JOB_KEY_ORDER`); the
    detail keys only between TRES/JOB_GRES and MinCPUsNode. JobName runs up to UserId
    (``JobName=lr=0.1 bs=32`` is that name). :class:`SlurmParseError` when a key comes
    twice or out of order: text written by a user pretends to be a field."""
    marks = list(_KV.finditer(line))
    known = [(i, m.group(1)) for i, m in enumerate(marks) if m.group(1) in _JOB_KEY_RANK]
    last_rank, last_key, index = -1, "", {}
    for i, key in known:
        rank = _JOB_KEY_RANK[key]
        if key in index:
            raise SlurmAmbiguousLine(f"{key}= appears twice (text in a free-text field such "
                                  "as JobName, Comment, WorkDir or StdOut looks like "
                                  "scontrol's fields)")
        if rank < last_rank:
            raise SlurmAmbiguousLine(f"{key}= comes after {last_key}= (text in a free-text "
                                  "field looks like scontrol's fields)")
        index[key] = i
        last_rank, last_key = rank, key
    if "JobId" not in index or index["JobId"] != 0:
        raise SlurmParseError("the line does not start with JobId=")
    region_start = max(index.get(k, -1) for k in ("TRES", "CoreSpec", "JOB_GRES"))
    later = [i for i, key in known if _JOB_KEY_RANK[key] >= _JOB_KEY_RANK["MinCPUsNode"]]
    region_end = min(later) if later else len(marks)
    delimiters = [m for i, m in enumerate(marks)
                  if m.group(1) not in _JOB_DETAIL_KEYS or region_start < i < region_end]
    name_mark = marks[index["JobName"]] if "JobName" in index else None
    fields: dict[str, str] = {}
    detail: list[tuple[str, str]] = []
    for n, m in enumerate(delimiters):
        key = m.group(1)
        if m is name_mark:  # free text up to the next of scontrol's keys
            end = next((d.start() for d in delimiters[n + 1:] if d.group(1) in _JOB_KEY_RANK),
                       len(line))
        else:
            end = delimiters[n + 1].start() if n + 1 < len(delimiters) else len(line)
        value = line[m.end():end].strip()
        if key in _JOB_DETAIL_KEYS:
            detail.append((key, value))
        elif key in _JOB_KEY_RANK or key not in fields:
            fields.setdefault(key, value)
    return fields, detail


def parse_scontrol_jobs(text: str, refused: dict[str, str] | None = None) -> list[SlurmJob]:
    """Jobs from ``scontrol -o show job -d`` (one line per job).

    A line whose fields cannot be told from text a user wrote into it (see
    :func:`_job_fields`) raises :class:`SlurmAmbiguousLine`, or, when ``refused`` is
    given, is left out and noted there (job id → reason): that job's values are not
    known, and the other jobs are still read. Any other line that cannot be read (a GPU
    count of 1.5) raises :class:`SlurmParseError`."""
    jobs = []
    for line in text.splitlines():
        if not line.startswith("JobId="):
            continue
        job_id = line[len("JobId="):].split(" ", 1)[0]
        try:
            if not job_id.isdigit():
                raise SlurmParseError(f"JobId {job_id[:40]!r} is not a number")
            jobs.append(_scontrol_job(line))
        except SlurmAmbiguousLine as exc:
            if refused is None:
                raise SlurmAmbiguousLine(f"scontrol job {job_id}: {exc}") from None
            refused[job_id] = str(exc)
        except SlurmParseError as exc:  # not Slurm's output as it writes it: the poll fails
            raise SlurmParseError(f"scontrol job {job_id[:40]}: {exc}") from None
    return jobs


def _scontrol_job(line: str) -> SlurmJob:
    first, detail = _job_fields(line)
    allocation: list[tuple[str, int]] = []
    node_group: list[str] = []
    for key, value in detail:
        if key == "Nodes":
            node_group = expand_hostlist(value)
        elif key == "GRES" and node_group:
            _, _, idx = parse_gres(value)
            allocation.extend((n, i) for n in node_group for i in idx)
            node_group = []
    tres = first.get("TresPerNode") or first.get("TresPerJob") or first.get("TRES")
    gpu_type, gpus, _ = parse_gres(_text(tres))
    if not gpus:
        gpu_type, gpus, _ = parse_gres(_text(first.get("JOB_GRES")))
    nodes = expand_hostlist(_text(first.get("NodeList")))
    node_count = max(len(nodes), _int((first.get("NumNodes") or "1").split("-")[0]) or 1)
    if gpus and node_count > 1 and first.get("TresPerNode"):
        gpus *= node_count
    state = (first.get("JobState") or "UNKNOWN").split()[0]
    return SlurmJob(
        job_id=first["JobId"], state=state.upper(), name=first.get("JobName", ""),
        user=_name_of(first.get("UserId")), account=_text(first.get("Account")),
        partition=_text(first.get("Partition")), qos=_text(first.get("QOS")),
        priority=_int(first.get("Priority")), reason=_text(first.get("Reason")),
        restarts=_int(first.get("Restarts")) or 0, requeue=first.get("Requeue") != "0",
        submit=_local_time(first.get("SubmitTime")),
        start=_local_time(first.get("StartTime")), end=_local_time(first.get("EndTime")),
        exit_code=_text(first.get("ExitCode")), gpus=gpus, gpu_type=gpu_type,
        allocation=tuple(allocation))


_NODE_READ_KEYS = ("NodeName", "Gres", "GresDrain", "State", "Partitions")


def parse_scontrol_nodes(text: str) -> list[SlurmNode]:
    """Nodes from ``scontrol -o show node -d``.

    ``Reason=`` is free text (an admin's or a health check's, ``NHC: gpu count=4
    State=IDLE``) and scontrol prints it last: everything after the first ``Reason=``
    that follows ``State=`` is the reason, never a field. A key the bridge reads that
    comes twice before it is refused (:class:`SlurmParseError`)."""
    nodes = []
    for line in text.splitlines():
        if not line.startswith("NodeName="):
            continue
        state_at = re.search(r"\sState=", line)
        reason_at = re.search(r"\sReason=", line[state_at.end():]) if state_at else None
        reason = None
        if state_at and reason_at:
            cut = state_at.end() + reason_at.start()
            reason = line[cut:].strip()[len("Reason="):]
            line = line[:cut]
        pairs = _key_values(line)
        keys = [k for k, _ in pairs]
        for key in _NODE_READ_KEYS:
            if keys.count(key) > 1:
                raise SlurmParseError(f"scontrol node {line[9:49]!r}: {key}= appears twice")
        kv = dict(pairs)
        gpu_type, gpus, _ = parse_gres(_text(kv.get("Gres")))
        _, _, drained = parse_gres(_text(kv.get("GresDrain")))
        parts = (kv.get("State") or "UNKNOWN").split("+")
        nodes.append(SlurmNode(
            name=kv["NodeName"].split()[0], state=parts[0].rstrip("*").lower(),
            flags=tuple(p.upper() for p in parts[1:]),
            partitions=tuple(p for p in (kv.get("Partitions") or "").split(",") if p),
            gpu_type=gpu_type, gpus=gpus, gres_drained=tuple(drained),
            reason=_text(reason if reason is not None else kv.get("Reason"))))
    return nodes
