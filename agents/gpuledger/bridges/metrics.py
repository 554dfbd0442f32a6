"""A scheduler bridge's own ``/metrics`` and ``/healthz`` (``--metrics-address``).

So that Prometheus can tell a bridge that is down (``up == 0``) or gone (no ``up`` at
all) — the alerts ``GpuledgerBridgeDown`` and ``GpuledgerBridgeAbsent``
(``docs/alerts.md``). Plain text exposition, no client library: the bridges stay as lean
as the node agent. Served by :mod:`gpuledger.agent.http_server` (bounded, timeouts).

| metric | type | meaning |
|---|---|---|
| ``gpuledger_bridge_info{scheduler}`` | gauge | always 1 |
| ``gpuledger_bridge_<counter>_total`` | counter | what the bridge did (below) |

Counters: Slurm ``polls``, ``failed_polls``, ``records``; Kubernetes ``lists``,
``relists``, ``watch_events``, ``records``.
"""

from __future__ import annotations

from collections.abc import Callable

from gpuledger.agent.http_server import BoundedHTTPServer

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def exposition(scheduler: str, counters: dict[str, float]) -> bytes:
    """Prometheus text exposition of the bridge's identity and counters."""
    lines = ["# HELP gpuledger_bridge_info The bridge's identity.",
             "# TYPE gpuledger_bridge_info gauge",
             f'gpuledger_bridge_info{{scheduler="{scheduler}"}} 1']
    for name, value in sorted(counters.items()):
        metric = f"gpuledger_bridge_{name}_total"
        lines += [f"# HELP {metric} {name.replace('_', ' ').capitalize()} since the start.",
                  f"# TYPE {metric} counter", f"{metric} {float(value)}"]
    return ("\n".join(lines) + "\n").encode()


def parse_address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``:PORT``: every interface) → (host, port); ValueError otherwise."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{text!r}: expected HOST:PORT, e.g. 127.0.0.1:9467")
    return host.strip("[]") or "0.0.0.0", int(port)


def serve(address: str, scheduler: str,
          counters: Callable[[], dict[str, float]]) -> BoundedHTTPServer:
    """Serve ``/metrics`` and ``/healthz`` on ``address`` (a daemon thread)."""
    def metrics() -> tuple[int, bytes, str]:
        return 200, exposition(scheduler, counters()), CONTENT_TYPE

    def healthz() -> tuple[int, bytes, str]:
        return 200, b"ok\n", "text/plain; charset=utf-8"

    return BoundedHTTPServer(parse_address(address), {"/metrics": metrics,
                                                      "/healthz": healthz}).start()
