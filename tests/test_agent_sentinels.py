"""Driver sentinels and impossible readings are omitted, the rest of the sample kept;
one dcgm-exporter scrape is bounded as a whole (time and size)."""

from __future__ import annotations

import http.server
import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from fake_nvml import MIB, Scenario, nvml_env

from gpuledger.agent.sources import dcgm_exporter
from gpuledger.agent.sources.dcgm_exporter import DcgmExporterSource
from gpuledger.pipeline.decode import decode_jsonl

NOW = datetime(2026, 1, 5, 10, 0, tzinfo=UTC)


def _assert_valid(records: list[dict[str, Any]]) -> None:
    """Every record passes the processor's validation (none rejected whole)."""
    rows = [dict(r, agent="a", seq=n) for n, r in enumerate(records)]
    data = b"".join(json.dumps({k: v for k, v in r.items() if v is not None}).encode() + b"\n"
                    for r in rows)
    decoded = decode_jsonl(data, now=NOW)
    assert decoded.rejects.height == 0, decoded.rejects["reason"].to_list()
    assert decoded.frames["telemetry"].height == len(records)


# ---- NVML -------------------------------------------------------------------------

RUN = """
import json, ctypes
from datetime import datetime, timedelta, UTC
lib = ctypes.CDLL("libnvidia-ml.so.1")
from gpuledger.agent.sources.nvml import NvmlSource
src = NvmlSource("n1")
out = []
for step in range(3):
    lib.fake_nvml_set_step(ctypes.c_uint(step))
    out.append(src.collect(datetime(2026, 1, 5, 10, 0, tzinfo=UTC) + timedelta(seconds=10 * step)))
print(json.dumps({"collects": out, "skipped": dict(src.skipped), "errors": src.errors}))
src.close()
"""


def _run_nvml(tmp_path: Path, lib: Path, sc: Scenario) -> tuple[dict[str, Any], str]:
    done = subprocess.run([sys.executable, "-c", RUN], capture_output=True, text=True,
                          timeout=60, env=nvml_env(lib, sc.write(tmp_path / "s.txt")))
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout), done.stderr


def test_nvml_sentinels_and_impossible_readings_are_omitted_not_the_sample(
        tmp_path: Path, fake_nvml_lib: Path) -> None:
    dbe = 4                                       # NVML_FI_DEV_ECC_DBE_VOL_TOTAL
    sc = Scenario(gpus=2)
    for g in (0, 1):
        sc.set(f"g{g}", name="NVIDIA H100 80GB HBM3", uuid=f"GPU-{g}", util_gpu=50,
               util_mem=5, mem_total=81559 * MIB, mem_used=1024 * MIB, clock_sm=1980,
               processes=f"{4242 + g}:{512 * MIB}")
    sc.set("g0", temp=0xFFFFFFFF, power=612_000)  # NVML's not-available; 612 W
    sc.set("g1", temp=180, power=5_000_000)       # 180 °C, 5000 W: no GPU does that
    for step, value in enumerate([5, 0xFFFFFFFFFFFFFFFF, 7]):
        sc.at(step, "g0", f"field.{dbe}", value)  # a counter that misses one reading
    out, stderr = _run_nvml(tmp_path, fake_nvml_lib, sc)
    first = out["collects"][0]
    g0, g1 = first
    assert "temp_c" not in g0 and "temp_c" not in g1
    assert g0["power_w"] == 612.0 and "power_w" not in g1
    for rec in first:                             # the rest of each sample is kept
        assert rec["util_gpu"] == 50.0 and rec["mem_used_mib"] == 1024.0
        assert rec["sm_clock_mhz"] == 1980.0 and rec["healthy"] is True
        assert rec["processes"] == [{"pid": 4242 + rec["gpu_index"], "used_mib": 512.0,
                                     "job_id": None}]
    ecc = [c[0].get("ecc_dbe") for c in out["collects"]]
    assert ecc == [None, None, 2]                 # no delta from a sentinel: 7 - 5
    # 3 collections: g0 temp (3) + dbe (1) no value; g1 temp and power (3 each) out of range
    assert out["skipped"] == {"no_value": 4, "out_of_range": 6}
    assert stderr.count("omitted from the sample") == 4   # once per GPU, field and reason
    for collect in out["collects"]:
        _assert_valid(collect)


# ---- dcgm-exporter: values ------------------------------------------------------------

LABELS = 'gpu="0",UUID="GPU-d0",modelName="NVIDIA H100 80GB HBM3",hpc_job="4242"'


def _page(**values: float | str) -> str:
    return "".join(f"DCGM_FI_{name}{{{LABELS}}} {value}\n" for name, value in values.items())


BASE: dict[str, float | str] = {
    "DEV_GPU_UTIL": 90, "DEV_GPU_TEMP": 61, "DEV_POWER_USAGE": 612.5, "DEV_SM_CLOCK": 1980,
    "DEV_FB_USED": 70000, "DEV_FB_FREE": 10000, "DEV_ECC_DBE_VOL_TOTAL": 1,
    "DEV_XID_ERRORS": 0, "PROF_SM_ACTIVE": 0.5}


@pytest.mark.parametrize(("name", "blank"), [
    ("DEV_GPU_TEMP", "2147483632"),               # DCGM_INT32_BLANK
    ("DEV_GPU_TEMP", "2147483634"),               # ... NOT_SUPPORTED
    ("DEV_GPU_UTIL", "9223372036854775792"),      # DCGM_INT64_BLANK (not clamped to 100)
    ("DEV_POWER_USAGE", "140737488355328"),       # DCGM_FP64_BLANK, 2**47
    ("PROF_SM_ACTIVE", "1.40737488355329e14"),    # ... + 1 (NOT_FOUND)
])
def test_dcgm_blank_values_are_omitted_and_the_sample_kept(name: str, blank: str) -> None:
    src = DcgmExporterSource(node="n1")
    (rec,) = src.convert(_page(**{**BASE, name: blank}), NOW)
    field = dcgm_exporter.load_field_map()[0][f"DCGM_FI_{name}"].field
    assert field not in rec
    assert rec["mem_used_mib"] == 70000 and rec["mem_total_mib"] == 80000
    assert rec["processes"] == [{"pid": 0, "used_mib": 0.0, "job_id": "4242"}]
    assert dict(src.skipped) == {"no_value": 1}
    _assert_valid([rec])


def test_dcgm_impossible_values_blank_counters_and_memory_parts() -> None:
    src = DcgmExporterSource(node="n1")
    src.convert(_page(**BASE), NOW)
    (rec,) = src.convert(_page(**{**BASE, "DEV_SM_CLOCK": 99999, "DEV_GPU_TEMP": 151,
                                   "DEV_FB_FREE": 2147483632,
                                   "DEV_ECC_DBE_VOL_TOTAL": 9223372036854775792,
                                   "DEV_XID_ERRORS": 2147483632}), NOW)
    for field in ("sm_clock_mhz", "temp_c", "mem_total_mib", "ecc_dbe", "xid_errors"):
        assert field not in rec                   # a blank counter or event code: no value
    assert rec["util_gpu"] == 90 and rec["power_w"] == 612.5 and rec["mem_used_mib"] == 70000
    assert dict(src.skipped) == {"no_value": 3, "out_of_range": 2}
    _assert_valid([rec])
    (after,) = src.convert(_page(**{**BASE, "DEV_ECC_DBE_VOL_TOTAL": 4}), NOW)
    assert after["ecc_dbe"] == 3                  # from the last real reading, 1
    assert after["xid_errors"] == 0


# ---- dcgm-exporter: the scrape's deadline and size bound ---------------------------------

PAGE = _page(**BASE).encode() * 40


@contextmanager
def _server(handle: Callable[[socket.socket], None]) -> Iterator[str]:
    """A raw TCP server answering each connection with ``handle``; yields its URL."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=_answer, args=(conn, handle), daemon=True).start()

    def _answer(conn: socket.socket, handler: Callable[[socket.socket], None]) -> None:
        with conn:
            try:
                conn.recv(65536)
                handler(conn)
            except OSError:
                pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/metrics"
    finally:
        stop.set()
        thread.join(2)
        listener.close()


def _trickle_body(conn: socket.socket) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(PAGE))
    for i in range(0, len(PAGE), 32):
        conn.sendall(PAGE[i:i + 32])
        time.sleep(0.05)                          # the whole page: ~20 s


def _trickle_headers(conn: socket.socket) -> None:
    for byte in b"HTTP/1.1 200 OK\r\nX-Slow: " + b"a" * 1000:
        conn.sendall(bytes([byte]))
        time.sleep(0.05)


@pytest.mark.parametrize("handler", [_trickle_body, _trickle_headers])
def test_a_trickling_exporter_is_cut_off_at_timeout_s(
        handler: Callable[[socket.socket], None]) -> None:
    with _server(handler) as url:
        src = DcgmExporterSource(node="n1", url=url, timeout_s=0.5)
        started = time.monotonic()
        with pytest.raises(OSError) as caught:
            src.collect(NOW)
        assert time.monotonic() - started < 1.5
        assert type(caught.value).__name__ == "ScrapeError"
        assert "within dcgm_exporter.timeout_s = 0.5 s" in str(caught.value)


def _whole_page(conn: socket.socket) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(PAGE) + PAGE)


def _endless(conn: socket.socket) -> None:
    conn.sendall(b"HTTP/1.0 200 OK\r\n\r\n")     # no length: read until closed
    while True:
        conn.sendall(b"# padding padding padding padding\n" * 100)


def test_a_page_over_the_size_bound_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    with _server(_whole_page) as url:
        assert len(DcgmExporterSource(node="n1", url=url, timeout_s=5).collect(NOW)) == 1
        monkeypatch.setattr(dcgm_exporter, "MAX_PAGE_BYTES", len(PAGE) - 1)
        with pytest.raises(dcgm_exporter.ScrapeError,
                           match=r"announced a page of \d+ bytes, over the"):
            DcgmExporterSource(node="n1", url=url, timeout_s=5).collect(NOW)
    monkeypatch.setattr(dcgm_exporter, "MAX_PAGE_BYTES", 100_000)
    with _server(_endless) as url:
        started = time.monotonic()
        with pytest.raises(dcgm_exporter.ScrapeError, match="sent more than 100000 bytes: refused"):
            DcgmExporterSource(node="n1", url=url, timeout_s=30).collect(NOW)
        assert time.monotonic() - started < 5


def test_the_bounded_scrape_serves_a_plain_http_server() -> None:
    body = PAGE

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        src = DcgmExporterSource(node="n1", url=f"http://127.0.0.1:{srv.server_address[1]}/m")
        assert src.scrape() == body.decode()
    finally:
        srv.shutdown()
        srv.server_close()


def test_dcgm_job_labels_that_are_not_job_ids_attribute_nothing() -> None:
    page = _page(**BASE).replace('hpc_job="4242"', 'hpc_job="4242\\n"')
    page += _page(**BASE).replace('gpu="0",UUID="GPU-d0"', 'gpu="1",UUID="GPU-d1"').replace(
        'hpc_job="4242"', 'hpc_job="' + "9" * 300 + '"')
    src = DcgmExporterSource(node="n1")
    recs = src.convert(page, NOW)
    assert [r["processes"] for r in recs] == [[], []]
    assert all(r["temp_c"] == 61 for r in recs)
    assert src.skipped["invalid_job_id"] == 2 * len(BASE)
    _assert_valid(recs)
