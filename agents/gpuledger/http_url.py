"""The one check of an HTTP URL a user configures: the DCGM exporter the agent reads,
the Kubernetes API server the bridge watches, the Alertmanager the alerts go to."""

from __future__ import annotations

import re
from urllib.parse import urlsplit


def http_url_problem(url: str) -> str | None:
    """Why ``url`` is not an ``http(s)://HOST[:PORT][/PATH]`` URL fit to connect to and to
    log (a host, a port in range, no credentials: they would be logged; no spaces or
    control characters: they would be sent as they are), or None."""
    if any(c.isspace() or not c.isprintable() for c in url):
        return "spaces or control characters in the URL"
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:  # "Port out of range 0-65535", "Invalid IPv6 URL"
        return str(exc)
    if parts.scheme not in ("http", "https"):
        return "expected an http:// or https:// URL"
    if not parts.hostname:
        return "no host in the URL"
    if parts.username is not None or parts.password is not None:
        return "credentials in the URL are not supported (they would be logged)"
    if port == 0:
        return "port 0 is not a port"
    return None


def redacted(url: str) -> str:
    """``url`` with its user name and password, if any, shown as ``***`` (for messages)."""
    return re.sub(r"(?<=//)[^/?#@]*@", "***@", url, count=1)
