"""Small HTTP helpers for the tests of the /metrics servers (agent, exporter, bridges)."""

from __future__ import annotations

import urllib.error
import urllib.request


def get(port: int, path: str, method: str = "GET") -> tuple[int, str]:
    """(status, body) of ``method path`` on 127.0.0.1:``port``; HTTP errors are answers."""
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method)
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def metric(port: int, name: str) -> float:
    """The value of the first sample of ``name`` on ``/metrics``; -1 when the endpoint or
    the sample is not there (yet)."""
    try:
        _status, text = get(port, "/metrics")
    except OSError:
        return -1.0
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return -1.0
