"""An example Alertmanager webhook receiver: prints each notification's alerts, one line
each, to standard output (the compose stack's `alert-webhook` service).

    python webhook_echo.py [--host 0.0.0.0] [--port 9095]

Alertmanager POSTs JSON ``{"status", "alerts": [{"status", "labels", "annotations",
"startsAt", ...}], ...}`` (its webhook format, version 4) to any path. Replace this with
your own receiver; it has no dependencies beyond the Python standard library.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MAX_BODY = 1 << 20


def _object(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def lines(payload: Any) -> list[str]:
    """One line per alert: status, name, labels, summary (what is not of the webhook
    format's shape is left out, not an error)."""
    out = []
    alerts = _object(payload).get("alerts")
    for alert in alerts if isinstance(alerts, list) else []:
        if not isinstance(alert, dict):
            continue
        labels = {str(k): str(v) for k, v in _object(alert.get("labels")).items()}
        name = labels.pop("alertname", "?")
        summary = str(_object(alert.get("annotations")).get("summary", ""))
        pairs = " ".join(f"{k}={v}" for k, v in sorted(labels.items()))
        out.append(" ".join(f"{alert.get('status', '?')} {name} {pairs} {summary}"
                            .split()))  # one line, whatever the values hold
    return out


class Handler(BaseHTTPRequestHandler):
    timeout = 10

    def do_POST(self) -> None:
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if length < 0:
            self.send_error(400, "no valid Content-Length")
            return
        if length > MAX_BODY:
            self.send_error(413)
            return
        try:
            payload = json.loads(self.rfile.read(length))
        except (ValueError, RecursionError):  # nested too deeply: a RecursionError
            self.send_error(400, "not JSON")
            return
        for line in lines(payload):
            print(line, flush=True)
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9095)
    args = parser.parse_args(argv)
    server = ThreadingHTTPServer((args.host, args.port), Handler)
    print(f"listening on {args.host}:{server.server_address[1]}", file=sys.stderr, flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
