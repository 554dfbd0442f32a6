"""The bad-input corpus: hostile and unlucky input, as data (tests/test_bad_input_corpus.py).

Four lists, each easy to extend:

* :data:`BAD_LINES` — one JSON line each, with a substring of the reason it must be
  rejected with. ``stage="decode"`` cases are rejected by the decoder (each is also
  decoded alone); ``stage="engine"`` cases need the processor's state (a node's
  inventory, a job's life cycle) and are only checked in the full ingest, where they sit
  among the good records of :data:`GOOD` (node ``n1``: 2 GPUs of 81 559 MiB; job ``j``
  on GPU 0 from minute 1 to 8). Add a case: ``BadLine("id", line, "reason part")``.
* :data:`VARIANTS` — documented acceptances: a good line written differently (repeated
  keys, unknown fields, escapes, another offset...) must give the same facts.
* :data:`BAD_FILES` — whole files (compression, encodings, empty, over-long lines, I/O
  errors), with the rejects they must give (line, reason part) and how many of their
  records are good.
* :data:`IMPORTER_CASES` — broken CSV files for ``gpuledger import``, with the one-line
  error (``file:line: reason``) or the per-row report they must give.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from events import alloc, at, inventory, iso, job, jsonl, series

GOOD: list[dict[str, Any]] = [
    inventory("n1", at(0), gpus=2),
    job("submitted", "j", at(0), gpus=1),
    job("started", "j", at(1), allocation=alloc("n1", 0)),
    job("finished", "j", at(8)),
    *series("n1", 0, at(0), 10, sm=0.4, jobs=["j"]),
    *series("n1", 1, at(0), 10, util=0.0, seq0=100),
]
GOOD_LINES: list[bytes] = jsonl(GOOD).splitlines()


def _dumps(record: dict[str, Any]) -> bytes:
    return json.dumps(record, allow_nan=True).encode()


class _Drop:
    """Marks a field to remove."""


_DROP: Any = _Drop()


def _apply(rec: dict[str, Any], changes: dict[str, Any]) -> bytes:
    """``rec`` with ``changes`` (``_DROP``: remove the field), as a JSON line."""
    for key, value in changes.items():
        if value is _DROP:
            rec.pop(key, None)
        else:
            rec[key] = value
    return _dumps(rec)


def tel(**changes: Any) -> bytes:
    """A telemetry line of GPU 1 at 10:03:05 (not one of the good samples' times)."""
    return _apply({
        "v": 1, "type": "telemetry", "time": iso(at(3, 5)), "node": "n1", "seq": 500,
        "gpu_index": 1, "gpu_uuid": "GPU-n1-1", "card_type": "H100-SXM5-80GB",
        "util_gpu": 50.0, "mem_used_mib": 1000.0, "mem_total_mib": 81559.0,
        "power_w": 300.0, "temp_c": 60.0,
        "processes": [{"pid": 7, "used_mib": 900.0, "job_id": None}],
    }, changes)


def inv(**changes: Any) -> bytes:
    """An inventory line of a node ``n9``."""
    return _apply({
        "v": 1, "type": "inventory", "time": iso(at(2)), "node": "n9", "pool": "train",
        "card_type": "H100-SXM5-80GB", "gpu_count": 8, "gpu_mem_mib": 81559.0,
        "schedulable": True, "health": "ok", "unhealthy_gpus": [],
    }, changes)


def jb(event: Any = "submitted", **changes: Any) -> bytes:
    """A job event line of a job ``bad-job``."""
    return _apply({"v": 1, "type": "job", "time": iso(at(2)), "job_id": "bad-job"},
                  {"event": event, **changes})




def _with_raw(field: str, raw: str) -> bytes:
    """The telemetry template with ``field``'s JSON text replaced by ``raw``."""
    text = tel()
    head, sep, tail = text.partition(f'"{field}": '.encode())
    assert sep, field
    value_end = min(i for i in (tail.find(b","), tail.find(b"}")) if i >= 0)
    return head + sep + raw.encode() + tail[value_end:]


@dataclass(frozen=True)
class BadLine:
    id: str
    line: bytes
    reason: str
    stage: str = "decode"


BAD_LINES: list[BadLine] = [
    # -- not JSON, not an object ---------------------------------------------------------
    BadLine("not-json", b"{this is not json", "malformed JSON"),
    BadLine("truncated-object", b'{"v": 1, "type": "telemetry",', "malformed JSON"),
    BadLine("two-objects", tel() + tel(), "malformed JSON"),
    BadLine("trailing-comma", b'{"v": 1, "type": "job",}', "malformed JSON"),
    BadLine("single-quotes", b"{'v': 1, 'type': 'job'}", "malformed JSON"),
    BadLine("comment", tel() + b" // a comment", "malformed JSON"),
    BadLine("unquoted-key", b'{v: 1, "type": "job"}', "malformed JSON"),
    BadLine("array", b'["an", "array"]', "not a JSON object: got an array"),
    BadLine("string", b'"a string"', "not a JSON object: got a string"),
    BadLine("number", b"42", "not a JSON object: got a number"),
    BadLine("null", b"null", "not a JSON object: got null"),
    BadLine("boolean", b"true", "not a JSON object: got true"),
    BadLine("empty-object", b"{}", "field 'type': required but missing"),
    BadLine("raw-nul-in-string", tel(node="n\x00").replace(b"\\u0000", b"\x00"),
            "malformed JSON"),
    BadLine("nul-between-tokens", tel().replace(b", ", b",\x00 ", 1), "malformed JSON"),
    BadLine("control-char-in-string", tel(node="n1").replace(b'"n1"', b'"n\x011"'),
            "malformed JSON"),
    BadLine("lone-surrogate-escape", tel().replace(b'"n1"', b'"n\\ud800"'), "malformed JSON"),
    BadLine("invalid-escape", tel().replace(b'"n1"', b'"n\\q"'), "malformed JSON"),
    BadLine("number-overflows-double", _with_raw("power_w", "1e400"), "malformed JSON"),
    BadLine("bom-inside-the-file", b"\xef\xbb\xbf" + tel(), "malformed JSON"),
    BadLine("latin-1-text", tel().replace(b'"n1"', b'"caf\xe9"'), "not valid UTF-8"),
    BadLine("overlong-utf8", tel().replace(b'"n1"', b'"n\xc0\xaf"'), "not valid UTF-8"),
    BadLine("utf8-encoded-surrogate", tel().replace(b'"n1"', b'"n\xed\xa0\x80"'),
            "not valid UTF-8"),
    BadLine("cut-multibyte", tel().replace(b'"n1"', b'"n\xe2\x82"'), "not valid UTF-8"),
    BadLine("utf16-line", tel().decode().encode("utf-16-le"), "malformed JSON"),
    BadLine("deep-nesting", tel()[:-1] + b', "x": ' + b"[" * 5000 + b"]" * 5000 + b"}",
            "malformed JSON"),
    BadLine("huge-line", tel()[:-1] + b', "pad": "' + b"x" * (2 << 20) + b'"}',
            "more than the limit"),
    BadLine("repeated-key-last-is-bad", tel()[:-1] + b', "node": 5}',
            "field 'node': expected a string"),
    # -- envelope ------------------------------------------------------------------------
    BadLine("type-missing", tel(type=_DROP), "field 'type': required but missing"),
    BadLine("type-number", tel(type=5), "field 'type': expected a string"),
    BadLine("type-unknown", tel(type="gossip"), "'gossip' is not one of"),
    BadLine("type-upper-case", tel(type="TELEMETRY"), "is not one of"),
    BadLine("version-text", tel(v="1"), "field 'v': expected an integer"),
    BadLine("version-2", tel(v=2), "unsupported contract version 2"),
    BadLine("version-0", tel(v=0), "field 'v'"),
    BadLine("version-float", tel(v=1.0), "field 'v': expected an integer"),
    # -- telemetry fields ----------------------------------------------------------------
    BadLine("seq-text", tel(seq="12"), "field 'seq': expected an integer"),
    BadLine("seq-fraction", tel(seq=1.5), "field 'seq': expected an integer"),
    BadLine("seq-negative", tel(seq=-1), "field 'seq': -1 is below the minimum 0"),
    BadLine("seq-beyond-int64", tel(seq=2**63), "out of the 64-bit integer range"),
    BadLine("seq-beyond-uint64", tel(seq=2**64), "field 'seq': expected an integer"),
    BadLine("gpu-index-bool", tel(gpu_index=True), "field 'gpu_index': expected an integer"),
    BadLine("gpu-index-negative", tel(gpu_index=-1), "field 'gpu_index': -1 is below"),
    BadLine("gpu-index-1024", tel(gpu_index=1024), "field 'gpu_index': 1024 is above"),
    BadLine("node-number", tel(node=15), "field 'node': expected a string"),
    BadLine("node-empty", tel(node=""), "field 'node': required but empty"),
    BadLine("node-null", tel(node=None), "field 'node': required but missing"),
    BadLine("uuid-missing", tel(gpu_uuid=_DROP), "field 'gpu_uuid': required but missing"),
    BadLine("card-missing", tel(card_type=_DROP), "field 'card_type': required but missing"),
    BadLine("util-text", tel(util_gpu="high"), "field 'util_gpu': expected a number"),
    BadLine("util-140", tel(util_gpu=140), "field 'util_gpu': 140.0 is above the maximum 100"),
    BadLine("util-negative", tel(util_gpu=-1), "field 'util_gpu': -1.0 is below"),
    BadLine("sm-active-1.5", tel(sm_active=1.5), "field 'sm_active': 1.5 is above"),
    BadLine("occupancy-negative", tel(sm_occupancy=-0.1), "field 'sm_occupancy'"),
    BadLine("tensor-2", tel(tensor_active=2), "field 'tensor_active': 2.0 is above"),
    BadLine("dram-7", tel(dram_active=7), "field 'dram_active': 7.0 is above"),
    BadLine("healthy-text", tel(healthy="yes"), "field 'healthy': expected true or false"),
    BadLine("healthy-number", tel(healthy=1), "field 'healthy': expected true or false"),
    BadLine("processes-object", tel(processes={"pid": 1}), "field 'processes': expected an "
                                                           "array"),
    BadLine("processes-of-numbers", tel(processes=[1]), "expected an object"),
    BadLine("process-without-pid", tel(processes=[{"used_mib": 1.0}]), "an entry has no pid"),
    BadLine("process-pid-negative", tel(processes=[{"pid": -3}]), "pid -3 is negative"),
    BadLine("process-memory-negative", tel(processes=[{"pid": 1, "used_mib": -1}]),
            "used_mib -1.0 is negative"),
    BadLine("process-null", tel(processes=[None]), "an entry is null"),
    BadLine("xid-negative", tel(xid_errors=-1), "field 'xid_errors': -1 is below"),
    BadLine("ecc-fraction", tel(ecc_dbe=1.5), "field 'ecc_dbe': expected an integer"),
    # -- time ----------------------------------------------------------------------------
    BadLine("time-missing", tel(time=_DROP), "field 'time': required but missing"),
    BadLine("time-number", tel(time=1767600000), "field 'time': expected a string"),
    BadLine("time-word", tel(time="yesterday"), "is not an RFC 3339 time"),
    BadLine("time-space", tel(time="2026-01-05 10:03:05Z"), "is not an RFC 3339 time"),
    BadLine("time-no-offset", tel(time="2026-01-05T10:03:05"), "is not an RFC 3339 time"),
    BadLine("time-month-13", tel(time="2026-13-05T10:03:05Z"), "is not an RFC 3339 time"),
    BadLine("time-february-30", tel(time="2026-02-30T10:03:05Z"), "is not an RFC 3339 time"),
    BadLine("time-hour-25", tel(time="2026-01-05T25:03:05Z"), "is not an RFC 3339 time"),
    BadLine("time-leap-second", tel(time="2026-01-05T10:03:60Z"), "is not an RFC 3339 time"),
    BadLine("time-empty", tel(time=""), "field 'time'"),
    BadLine("time-far-future", tel(time="2999-01-01T00:00:00Z"), "in the future"),
    BadLine("time-before-2000", tel(time="1999-12-31T23:59:59Z"), "is before 2000-01-01"),
    BadLine("time-year-1", tel(time="0001-01-01T00:00:00Z"), "is before 2000-01-01"),
    BadLine("time-five-digit-year", tel(time="+12026-01-05T10:03:05Z"), "not an RFC 3339"),
    BadLine("time-offset-25h", tel(time="2026-01-05T10:03:05+25:00"), "not an RFC 3339"),
    # -- non-finite numbers --------------------------------------------------------------
    BadLine("power-nan", _with_raw("power_w", "NaN"), "field 'power_w': NaN is not a number"),
    BadLine("memory-infinity", _with_raw("mem_used_mib", "Infinity"),
            "field 'mem_used_mib': inf is not finite"),
    BadLine("temp-minus-infinity", _with_raw("temp_c", "-Infinity"),
            "field 'temp_c': -inf is not finite"),
    BadLine("util-minus-nan", _with_raw("util_gpu", "-NaN"), "field 'util_gpu': NaN"),
    # -- physical limits -----------------------------------------------------------------
    BadLine("power-1e308", tel(power_w=1e308), "above the physical limit 2000 W"),
    BadLine("power-2500", tel(power_w=2500.0), "above the physical limit 2000 W"),
    BadLine("power-negative", tel(power_w=-5.0), "field 'power_w': -5.0 is below the minimum"),
    BadLine("temp-151", tel(temp_c=151.0), "above the physical limit 150 °C"),
    BadLine("temp-minus-45", tel(temp_c=-45.0), "below the physical limit -40 °C"),
    BadLine("temp-250", tel(temp_c=250.0), "field 'temp_c': 250.0 is above the maximum 200"),
    BadLine("clock-9000", tel(sm_clock_mhz=9000.0), "above the physical limit 5000 MHz"),
    BadLine("memory-1e7", tel(mem_used_mib=1e7), "field 'mem_used_mib': 10000000.0 is above "
                                                 "the physical limit"),
    BadLine("memory-over-total", tel(mem_used_mib=90000.0), "is more than mem_total_mib"),
    BadLine("memory-total-2e6", tel(mem_total_mib=2e6), "field 'mem_total_mib': 2000000.0"),
    BadLine("pcie-rx-1e14", tel(pcie_rx_bytes_s=1e14), "field 'pcie_rx_bytes_s'"),
    BadLine("pcie-tx-1e300", tel(pcie_tx_bytes_s=1e300), "field 'pcie_tx_bytes_s'"),
    BadLine("nvlink-rx-5e13", tel(nvlink_rx_bytes_s=5e13), "field 'nvlink_rx_bytes_s'"),
    BadLine("nvlink-tx-negative", tel(nvlink_tx_bytes_s=-1.0), "field 'nvlink_tx_bytes_s'"),
    BadLine("process-memory-5e6", tel(processes=[{"pid": 1, "used_mib": 5e6}]),
            "used_mib 5000000.0 is above the physical limit"),
    BadLine("processes-add-up-too-much", tel(processes=[{"pid": 1, "used_mib": 50000.0},
                                                        {"pid": 2, "used_mib": 40000.0}]),
            "used_mib adds up to 90000.0"),
    # -- inventory -----------------------------------------------------------------------
    BadLine("gpu-count-negative", inv(gpu_count=-1), "field 'gpu_count': -1 is below"),
    BadLine("gpu-count-2000", inv(gpu_count=2000), "field 'gpu_count': 2000 is above"),
    BadLine("card-memory-1e9", inv(gpu_mem_mib=1e9), "above the physical limit 1048576 MiB"),
    BadLine("card-memory-text", inv(gpu_mem_mib="80GB"), "field 'gpu_mem_mib': expected a "
                                                         "number"),
    BadLine("health-unknown", inv(health="sick"), "'sick' is not one of"),
    BadLine("schedulable-text", inv(schedulable="true"), "field 'schedulable': expected true"),
    BadLine("labels-text", inv(labels="rack=r1"), "field 'labels': expected an object"),
    BadLine("labels-number-value", inv(labels={"n": 1}), "field 'labels': expected an object"),
    BadLine("unhealthy-beyond-count", inv(unhealthy_gpus=[8]), "8 is not below gpu_count 8"),
    BadLine("unhealthy-negative", inv(unhealthy_gpus=[-1]), "field 'unhealthy_gpus': -1"),
    BadLine("unhealthy-null", inv(unhealthy_gpus=[None]), "an entry is null"),
    BadLine("pool-missing", inv(pool=_DROP), "field 'pool': required but missing"),
    # -- job events ----------------------------------------------------------------------
    BadLine("event-unknown", jb("teleported"), "'teleported' is not one of"),
    BadLine("event-missing", jb(_DROP), "field 'event': required but missing"),
    BadLine("job-id-empty", jb(job_id=""), "field 'job_id': required but empty"),
    BadLine("job-id-number", jb(job_id=42), "field 'job_id': expected a string"),
    BadLine("started-without-allocation", jb("started"), "needs a non-empty allocation"),
    BadLine("started-empty-allocation", jb("started", allocation=[]),
            "needs a non-empty allocation"),
    BadLine("allocation-gpu-twice",
            jb("started", allocation=[{"node": "n1", "gpu_index": 0},
                                      {"node": "n2", "gpu_index": 0},
                                      {"node": "n1", "gpu_index": 0, "fraction": 0.5}]),
            "a GPU (node, gpu_index) is listed twice, once as a whole GPU"),
    BadLine("allocation-object", jb("started", allocation={"node": "n1"}),
            "field 'allocation': expected an array"),
    BadLine("allocation-without-node", jb("started", allocation=[{"gpu_index": 0}]),
            "an entry has no node"),
    BadLine("allocation-index-negative",
            jb("started", allocation=[{"node": "n1", "gpu_index": -1}]), "-1 is negative"),
    BadLine("allocation-fraction-1.5",
            jb("started", allocation=[{"node": "n1", "gpu_index": 0, "fraction": 1.5}]),
            "fraction 1.5 is not in (0, 1]"),
    BadLine("allocation-fraction-0",
            jb("started", allocation=[{"node": "n1", "gpu_index": 0, "fraction": 0}]),
            "is not in (0, 1]"),
    BadLine("job-type-unknown", jb(job_type="party"), "'party' is not one of"),
    BadLine("gpus-negative", jb(gpus=-1), "field 'gpus': -1 is below"),
    BadLine("gpus-million", jb(gpus=1_000_000), "field 'gpus': 1000000 is above"),
    BadLine("priority-text", jb(priority="high"), "field 'priority': expected an integer"),
    BadLine("requested-memory-1e308", jb(gpu_mem_mib=1e308), "above the physical limit"),
    BadLine("preemptible-text", jb(preemptible="no"), "field 'preemptible': expected true"),
]


@dataclass(frozen=True)
class Variant:
    """A good line written another way that the contract accepts: same record."""

    id: str
    rewrite: Callable[[bytes], bytes]


def _obj(line: bytes) -> dict[str, Any]:
    value: dict[str, Any] = json.loads(line)
    return value


VARIANTS: list[Variant] = [
    Variant("repeated-key-last-wins", lambda b: b'{"node": "elsewhere", ' + b[1:]),
    Variant("unknown-fields", lambda b: b[:-1] + b', "colour": "blue", "extra": {"a": [1]}}'),
    Variant("unknown-field-in-process", lambda b: _dumps(
        {**_obj(b), "processes": [{**p, "cgroup": "/x"} for p in _obj(b)["processes"]]})),
    Variant("keys-reordered", lambda b: _dumps(dict(reversed(list(_obj(b).items()))))),
    Variant("spaces-around-tokens", lambda b: b"  " + b.replace(b", ", b" ,  ") + b" \t"),
    Variant("crlf", lambda b: b + b"\r"),
    Variant("unicode-escapes", lambda b: b.replace(b'"n1"', b'"\\u006e\\u0031"')),
    Variant("time-with-offset", lambda b: _dumps(
        {**_obj(b), "time": _obj(b)["time"].replace("T10:", "T11:").replace("Z", "+01:00")})),
    Variant("time-microseconds", lambda b: b.replace(b'Z"', b'000Z"', 1)),
    Variant("time-lower-case", lambda b: _dumps(
        {**_obj(b), "time": _obj(b)["time"].replace("T", "t").replace("Z", "z")})),
    Variant("exponent-notation", lambda b: b.replace(b'"mem_used_mib": 1000.0',
                                                     b'"mem_used_mib": 1e3')),
    Variant("escaped-hyphen", lambda b: b.replace(b'"H100-SXM5-80GB"',
                                                       b'"H100-SXM5\\u002d80GB"')),
]
"""Applied to the telemetry lines of GPU 0 (which carry a process): each must decode to
exactly the record of the line it rewrites."""


@dataclass(frozen=True)
class BadFile:
    """A whole file. ``rejects``: (line, reason part) it must give, exactly those lines;
    ``good``: the slice of :data:`GOOD_LINES` it carries, which must be read as usual."""

    id: str
    name: str
    build: Callable[[list[bytes]], bytes]
    rejects: tuple[tuple[int, str], ...] = ()
    good: slice | None = None


def _lines(lines: list[bytes], end: bytes = b"\n") -> bytes:
    return b"".join(line + end for line in lines)


def _truncated_gzip(lines: list[bytes]) -> bytes:
    whole = gzip.compress(_lines(lines), mtime=0)
    return whole[:-8]  # the trailer (CRC and size) is missing: the data is all there


def _cut_gzip(lines: list[bytes]) -> bytes:
    whole = gzip.compress(_lines(lines), mtime=0, compresslevel=1)
    return whole[: len(whole) // 2]


def _corrupt_gzip(lines: list[bytes]) -> bytes:
    whole = bytearray(gzip.compress(_lines(lines), mtime=0))
    for i in range(len(whole) // 3, len(whole) // 3 + 64):
        whole[i] ^= 0x5A
    return bytes(whole)


_BAD_TYPE = [tel(type="gossip", seq=i) for i in range(3000)]
"""Lines that are all rejected (unknown type), to fill a file that is cut short."""
_GOOD_SLICES = [slice(60 + 8 * i, 68 + 8 * i) for i in range(8)]

BAD_FILES: list[BadFile] = [
    BadFile("empty", "empty.jsonl", lambda g: b""),
    BadFile("blank-lines-only", "blank.jsonl", lambda g: b"\n \n\t\r\n\n"),
    BadFile("bom-at-start", "bom.jsonl", lambda g: b"\xef\xbb\xbf" + _lines(g),
            good=_GOOD_SLICES[0]),
    BadFile("crlf-line-ends", "crlf.jsonl", lambda g: _lines(g, b"\r\n"),
            good=_GOOD_SLICES[1]),
    BadFile("no-final-newline", "tail.jsonl", lambda g: _lines(g).rstrip(b"\n"),
            good=_GOOD_SLICES[2]),
    BadFile("gzip", "good.jsonl.gz", lambda g: gzip.compress(_lines(g), mtime=0),
            good=_GOOD_SLICES[3]),
    BadFile("gzip-trailer-missing", "trailer.jsonl.gz", _truncated_gzip,
            rejects=((9, "a truncated .gz file"),), good=_GOOD_SLICES[4]),
    BadFile("gzip-cut-in-half", "cut.jsonl.gz", lambda g: _cut_gzip(_BAD_TYPE),
            rejects=(("every", "'gossip' is not one of"), ("last", "a truncated .gz file"))),
    BadFile("gzip-corrupt", "corrupt.jsonl.gz", lambda g: _corrupt_gzip(_BAD_TYPE),
            rejects=(("every", ""), ("last", "the compressed data is damaged"))),
    BadFile("gzip-trailing-garbage", "garbage-after.jsonl.gz",
            lambda g: gzip.compress(_lines(g), mtime=0) + b"not gzip at all",
            rejects=((9, "is not gzip"),), good=_GOOD_SLICES[5]),
    BadFile("plain-text-named-gz", "plain.jsonl.gz", lambda g: _lines(_BAD_TYPE[:3]),
            rejects=((1, "not gzip data although the name ends in .gz"),)),
    BadFile("empty-gzip-file", "nothing.jsonl.gz", lambda g: b""),
    BadFile("gzip-of-nothing", "zero.jsonl.gz", lambda g: gzip.compress(b"", mtime=0)),
    BadFile("binary-garbage", "random.jsonl",
            lambda g: bytes((i * 7919 + 13) % 256 for i in range(20000)).replace(b"\n", b""),
            rejects=((1, "not valid UTF-8"),)),
    BadFile("utf16-file", "utf16.jsonl", lambda g: _lines(g[:2]).decode().encode("utf-16"),
            rejects=((1, "not valid UTF-8"), (2, "malformed JSON"), (3, "malformed JSON"))),
    BadFile("one-line-without-end", "endless.jsonl", lambda g: b"{" + b" " * (3 << 20),
            rejects=((1, "more than the limit"),)),
    BadFile("over-long-line-between-good", "long.jsonl",
            lambda g: _lines(g[:4]) + b"x" * (2 << 20) + b"\n" + _lines(g[4:]),
            rejects=((5, "more than the limit"),), good=_GOOD_SLICES[6]),
    BadFile("cr-only-line-ends", "mac.jsonl", lambda g: _lines(g, b"\r"),
            rejects=((1, "malformed JSON"),)),
    BadFile("read-error", "/proc/self/mem", lambda g: b"",
            rejects=((1, "read error"),)),
]
"""File cases; ``rejects`` lines may be ``"every"`` (each line read; ``""``: any reason)
and ``"last"`` (the line after them) for files whose cut point is not known in advance."""


@dataclass(frozen=True)
class ImporterCase:
    """``gpuledger import FORMAT`` on a broken file: exit status 2 with ``error`` (a
    substring of the one line, which names the file and line), or status 0 with
    ``error`` among the rows reported."""

    id: str
    format: str
    content: bytes
    error: str
    status: int = 2
    nodes: bytes | None = None
    names_nodes: bool = False
    """The error is about the node list (``nodes``), not the main file."""


SACCT_HEADER = ("JobID|JobIDRaw|JobName|Account|User|Partition|QOS|Priority|Submit|Start|"
                "End|State|ExitCode|AllocTRES|ReqTRES|NodeList|GresIDX")
_T = "2026-01-05T"
SACCT_ROW = (f"100|100|train|vision|ana|gpu|normal|50|{_T}10:00:00|{_T}10:00:05|"
             f"{_T}10:40:05|COMPLETED|0:0|cpu=2,gres/gpu:h100=2,gres/gpu=2,node=1|"
             "cpu=2,gres/gpu=2|gpu-1|")


def _sacct(row: str = SACCT_ROW, header: str = SACCT_HEADER) -> bytes:
    return (header + "\n" + row + "\n").encode()


PODS_HEADER = "name,created,gpus,scheduled,deleted,node,gpu_indices"
PODS_ROW = "p1,2026-01-05T10:00:00Z,1,2026-01-05T10:01:00Z,2026-01-05T10:30:00Z,n1,0"
OPENB_NODES = b"sn,cpu_milli,memory_mib,gpu,model\nnode-1,64000,262144,2,P100\n"
OPENB_HEADER = ("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
                "creation_time,deletion_time,scheduled_time")
OPENB_ROW = "pod-1,1000,1024,1,1000,,LS,Running,0,3600,10"


def _pods(row: str = PODS_ROW, header: str = PODS_HEADER) -> bytes:
    return (header + "\n" + row + "\n").encode()


def _openb(row: str = OPENB_ROW, header: str = OPENB_HEADER) -> bytes:
    return (header + "\n" + row + "\n").encode()


IMPORTER_CASES: list[ImporterCase] = [
    # sacct: the file is refused whole at its first bad line
    ImporterCase("sacct-latin-1", "slurm-sacct",
                 _sacct().replace(b"|ana|", b"|and\xe9|"), ":2: not UTF-8 text"),
    ImporterCase("sacct-utf16", "slurm-sacct", _sacct().decode().encode("utf-16"),
                 ":1: not UTF-8 text"),
    ImporterCase("sacct-binary", "slurm-sacct", bytes(range(256)) * 8, "not UTF-8 text"),
    ImporterCase("sacct-field-too-large", "slurm-sacct",
                 _sacct(SACCT_ROW.replace("|train|", "|" + "x" * 200_000 + "|")),
                 ":2: field larger than field limit"),
    ImporterCase("sacct-empty", "slurm-sacct", b"", "empty file"),
    ImporterCase("sacct-no-columns", "slurm-sacct", b"a|b|c\n1|2|3\n", "missing column"),
    ImporterCase("sacct-short-row", "slurm-sacct", _sacct("100|100|x"), ":2: 3 fields"),
    ImporterCase("sacct-bad-time", "slurm-sacct",
                 _sacct(SACCT_ROW.replace(f"{_T}10:00:00", "yesterday", 1)),
                 ":2: Submit: 'yesterday' is not a time"),
    ImporterCase("sacct-backward-hostlist", "slurm-sacct",
                 _sacct(SACCT_ROW.replace("|gpu-1|", "|gpu-[9-1]|")),
                 ":2: hostlist 'gpu-[9-1]': '9-1' is not an ascending range"),
    ImporterCase("sacct-billion-hosts", "slurm-sacct",
                 _sacct(SACCT_ROW.replace("|gpu-1|", "|gpu-[1-999999999]|")),
                 ":2: hostlist 'gpu-[1-999999999]': more than 100,000 nodes"),
    ImporterCase("sacct-absurd-gpu-count", "slurm-sacct",
                 _sacct(SACCT_ROW.replace("gres/gpu=2,node", "gres/gpu=99999999999,node")),
                 ":2: TRES"),
    ImporterCase("sacct-gpu-index-beyond-1023", "slurm-sacct",
                 _sacct(SACCT_ROW + "gpu-1:0-99999"), ":2: GPU indices: '0-99999' goes "
                                                      "beyond 1023"),
    ImporterCase("sacct-gpu-index-word", "slurm-sacct", _sacct(SACCT_ROW + "gpu-1:zero"),
                 ":2: GPU indices: 'zero' is not a number"),
    # sacct: a line that reads but says something impossible is left out and listed
    ImporterCase("sacct-end-before-start", "slurm-sacct",
                 _sacct(SACCT_ROW.replace(f"{_T}10:40:05", f"{_T}09:00:00")),
                 f":2: End '{_T}09:00:00' is before Start", status=0),
    ImporterCase("sacct-unknown-state", "slurm-sacct",
                 _sacct(SACCT_ROW.replace("|COMPLETED|", "|BOGUS_STATE|")),
                 ":2: State 'BOGUS_STATE' is not a job state", status=0),
    ImporterCase("sacct-fractional-gpus", "slurm-sacct",
                 _sacct(SACCT_ROW.replace("cpu=2,gres/gpu=2|", "cpu=2,gres/gpu=1.5|")
                        .replace("gres/gpu=2,node", "node")),
                 ":2: TRES 'gres/gpu=1.5': the GPU count is not a whole number", status=0),
    ImporterCase("sacct-open-bracket-hostlist", "slurm-sacct",
                 _sacct(SACCT_ROW.replace("|gpu-1|", "|gpu-[1-2|")),
                 ":2: NodeList 'gpu-[1-2' is not a host list", status=0),
    ImporterCase("sacct-header-only", "slurm-sacct", (SACCT_HEADER + "\n").encode(),
                 "holds no GPU job (0 lines, 0 step lines, 0 CPU-only jobs, 0 bad)", status=0),
    ImporterCase("sacct-year-1", "slurm-sacct",
                 _sacct(SACCT_ROW.replace(f"{_T}10:00:00", "0001-01-01T00:00:00", 1)),
                 "rejected", status=0),
    # pod lists: bad rows are reported and skipped; unreadable text refuses the file
    ImporterCase("pods-latin-1", "pods", _pods(PODS_ROW.replace("p1", "p\xe9")
                                               ).replace(b"\xc3\xa9", b"\xe9"),
                 ":2: not UTF-8 text"),
    ImporterCase("pods-field-too-large", "pods", _pods(PODS_ROW.replace("p1", "p" * 200_000)),
                 ":2: field larger than field limit"),
    ImporterCase("pods-binary", "pods", bytes(range(1, 256)) * 8, "not UTF-8 text"),
    ImporterCase("pods-no-required-column", "pods", b"name,gpus\np1,1\n",
                 "has no column 'created'"),
    ImporterCase("pods-empty", "pods", b"", "empty file"),
    ImporterCase("pods-epoch-0", "pods", _pods(PODS_ROW.replace("2026-01-05T10:00:00Z", "0")),
                 ":2: created: '0' is before 2000-01-01", status=0),
    ImporterCase("pods-header-twice", "pods", _pods(header=PODS_HEADER + ",gpus"),
                 ":1: column 'gpus' appears twice in the header"),
    ImporterCase("pods-index-twice", "pods",
                 _pods(PODS_ROW.replace(",1,2026", ",2,2026").replace(",n1,0", ",n1,\"0,0\"")),
                 ":2: gpu_indices: GPU 0 is listed twice", status=0),
    ImporterCase("pods-absurd-gpus", "pods", _pods(PODS_ROW.replace(",1,2026", ",1e12,2026")),
                 ":2: gpus must be in 0-1024", status=0),
    ImporterCase("pods-index-beyond-1023", "pods",
                 _pods(PODS_ROW.replace(",n1,0", ",n1,99999999999")),
                 ":2: gpu_indices: 99999999999 is not in 0-1023", status=0),
    ImporterCase("pods-time-word", "pods", _pods(PODS_ROW.replace("2026-01-05T10:00:00Z",
                                                                  "yesterday")),
                 ":2: created: 'yesterday' is neither ISO 8601 nor epoch seconds",
                 status=0),
    ImporterCase("pods-epoch-1e20", "pods",
                 _pods(PODS_ROW.replace("2026-01-05T10:00:00Z", "1e20")),
                 ":2: created: '1e20' is neither ISO 8601 nor epoch seconds", status=0),
    ImporterCase("pods-nodes-absurd", "pods", _pods(PODS_ROW.replace(",n1,0", ",,")),
                 ":2: needs a node and 0-1024 gpus",
                 nodes=b"node,gpus\nn1,1000000000000\n", names_nodes=True),
    # openb: the columns it reads are typed; the first bad row refuses the file
    ImporterCase("openb-missing-column", "openb", b"name,num_gpu\np,1\n",
                 "missing column(s) gpu_milli"),
    ImporterCase("openb-not-a-number", "openb", _openb(OPENB_ROW.replace(",1,1000,", ",x,1000,")),
                 ":2: column num_gpu: 'x' is not a whole number"),
    ImporterCase("openb-negative-time", "openb", _openb(OPENB_ROW.replace(",0,3600,", ",-5,3600,")),
                 ":2: column creation_time: '-5' is not in 0-1e+10"),
    ImporterCase("openb-time-1e300", "openb",
                 _openb(OPENB_ROW.replace(",3600,", ",1e300,")), ":2: column deletion_time"),
    ImporterCase("openb-deleted-before-created", "openb",
                 _openb(OPENB_ROW.replace(",0,3600,10", ",100,50,200")),
                 ":2: deletion_time 50 is before creation_time 100"),
    ImporterCase("openb-gpu-milli-0", "openb", _openb(OPENB_ROW.replace(",1,1000,", ",1,0,")),
                 ":2: gpu_milli 0 with num_gpu 1"),
    ImporterCase("openb-share-of-two-gpus", "openb",
                 _openb(OPENB_ROW.replace(",1,1000,", ",2,500,")),
                 ":2: gpu_milli 500 with num_gpu 2"),
    ImporterCase("openb-empty", "openb", b"", "empty file"),
    ImporterCase("openb-binary", "openb", bytes(range(1, 256)) * 8, "not a readable CSV file"),
    ImporterCase("openb-node-gpus-absurd", "openb", _openb(), ":2: column gpu: '5000'",
                 nodes=b"sn,cpu_milli,memory_mib,gpu,model\nnode-1,1,1,5000,P100\n",
                 names_nodes=True),
    ImporterCase("openb-node-twice", "openb", _openb(), "node 'node-1' appears twice",
                 nodes=OPENB_NODES + b"node-1,64000,262144,2,P100\n", names_nodes=True),
]
