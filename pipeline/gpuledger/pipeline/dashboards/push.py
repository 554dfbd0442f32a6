"""Push the boards to a Grafana through its HTTP API (``grafana-client``).

The token comes from the environment (``GPULEDGER_GRAFANA_TOKEN``, else
``GRAFANA_TOKEN``); it is sent as a bearer token and never printed. Every failure is a
:class:`PushError` of one line: the URL is shown without credentials, what a server
answers is shown only as far as it is Grafana's JSON message (one line, the token cut
out), and an error of the HTTP library is reduced to its reason (its text can hold the
request's headers, and with them the token).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuledger.http_url import http_url_problem, redacted
from gpuledger.pipeline.dashboards.builders import Json

TOKEN_VARIABLES = ("GPULEDGER_GRAFANA_TOKEN", "GRAFANA_TOKEN")
FOLDER_UID = "gpuledger"
FOLDER_TITLE = "gpuledger"
GRAFANA_UID = re.compile(r"[A-Za-z0-9_-]{1,40}")
"""Grafana's rule for a folder's or a board's uid."""
MESSAGE_MAX = 200
"""At most this many characters of a message Grafana sends back."""


class PushError(RuntimeError):
    """Grafana refused or could not be reached (the message never holds the token)."""


@dataclass(frozen=True)
class Pushed:
    uid: str
    url: str
    version: int


def uid_problem(uid: str) -> str | None:
    """Why ``uid`` is not a Grafana uid (it goes into the API's URL paths), or None."""
    if GRAFANA_UID.fullmatch(uid):
        return None
    return "a Grafana uid is 1 to 40 letters, digits, '_' or '-'"


def token_from(environ: Mapping[str, str]) -> str:
    """The token from the first variable of :data:`TOKEN_VARIABLES` that is set: printable
    ASCII without spaces (anything else would be sent as a header of its own, or not be
    sendable at all). The errors never show it."""
    for name in TOKEN_VARIABLES:
        value = environ.get(name, "").strip()
        if not value:
            continue
        if not all("!" <= c <= "~" for c in value):
            raise PushError(f"{name}: the token must be printable ASCII without spaces or "
                            "control characters (it is not shown)")
        return value
    raise PushError(f"no Grafana token: set {TOKEN_VARIABLES[0]} (a service-account token)")


class _LastResponse:
    """A response hook of the HTTP session: the content type of the latest answer."""

    def __init__(self) -> None:
        self.content_type = ""

    def __call__(self, response: Any, **_: Any) -> Any:
        headers = getattr(response, "headers", None) or {}
        self.content_type = str(headers.get("Content-Type") or "").split(";")[0].strip()
        return response


def push_boards(url: str, token: str, boards: Mapping[str, Json],
                folder_uid: str = FOLDER_UID, folder_title: str = FOLDER_TITLE,
                timeout_s: float = 10.0) -> list[Pushed]:
    """Create the folder when missing, then create or overwrite every board in it.

    ``timeout_s`` bounds each read; the whole push has ``timeout_s`` per request it
    makes (one per board and two for the folder): a server that trickles its answers a
    byte at a time never trips a read timeout, and held the push forever (a probe)."""
    problem = http_url_problem(url)
    if problem:
        raise PushError(f"Grafana URL {redacted(url)!r}: {problem}")
    problem = uid_problem(folder_uid)
    if problem:
        raise PushError(f"folder uid {folder_uid!r}: {problem}")
    done: list[list[Pushed]] = []
    failed: list[BaseException] = []

    def push() -> None:
        try:
            done.append(_push(url, token, boards, folder_uid, folder_title, timeout_s))
        except BaseException as exc:  # handed to the caller's thread
            failed.append(exc)

    worker = threading.Thread(target=push, name="grafana-push", daemon=True)
    worker.start()
    limit = timeout_s * (len(boards) + 2)
    worker.join(limit)
    if worker.is_alive():   # the daemon thread is left to the process's exit
        raise PushError(f"Grafana at {redacted(url)}: no whole answer within {limit:g} s "
                        f"({timeout_s:g} s for each of its {len(boards) + 2} requests); "
                        "the boards answered before stay pushed")
    if failed:
        raise failed[0]
    return done[0]


def _push(url: str, token: str, boards: Mapping[str, Json], folder_uid: str,
          folder_title: str, timeout_s: float) -> list[Pushed]:
    from grafana_client.api import GrafanaApi
    from grafana_client.client import GrafanaClientError, GrafanaException
    from niquests.exceptions import JSONDecodeError

    where = f"Grafana at {redacted(url)}"
    last = _LastResponse()
    api = GrafanaApi.from_url(url=url, credential=token, timeout=timeout_s)
    api.client.s.hooks["response"].append(last)

    def not_grafana(what: str) -> PushError:
        kind = last.content_type or "no content type"
        return PushError(f"{where} answered something that is not Grafana's JSON "
                         f"({kind}{': ' + what if what else ''}); is that Grafana's base "
                         "URL, not a login page or a proxy in front of it?")

    def mapping(reply: Any) -> dict[str, Any]:
        if not isinstance(reply, dict):
            raise not_grafana("" if isinstance(reply, str) else
                              f"a JSON {type(reply).__name__} where an object belongs")
        return reply

    try:
        try:
            mapping(api.folder.get_folder(folder_uid))
        except GrafanaClientError as exc:
            if exc.status_code != 404:
                raise
            mapping(api.folder.create_folder(folder_title, uid=folder_uid))
        out = []
        for uid, board in boards.items():
            body = {k: v for k, v in board.items() if k not in ("id", "version")}
            reply = mapping(api.dashboard.update_dashboard({
                "dashboard": body, "folderUid": folder_uid, "overwrite": True,
                "message": "gpuledger dashboards push"}))
            version, board_url = reply.get("version"), reply.get("url", "")
            if isinstance(version, bool) or not isinstance(version, int):
                raise not_grafana(f"board {uid}: version {_short(repr(version), token)} "
                                  "is not a whole number")
            if not isinstance(board_url, str) or not board_url.isprintable():
                raise not_grafana(f"board {uid}: its url is not text")
            out.append(Pushed(uid, board_url, version))
        return out
    except GrafanaException as exc:
        raise PushError(f"{where}: {_reason(exc, token, last.content_type, timeout_s)}") from None
    except JSONDecodeError:
        raise not_grafana("") from None
    except OSError as exc:
        raise PushError(f"cannot reach {where}: {_network_reason(exc, timeout_s)}") from None


def _short(text: str, token: str) -> str:
    """``text`` fit for one line of an error: the token cut out, control characters and
    line breaks made spaces, at most :data:`MESSAGE_MAX` characters."""
    if token:
        text = text.replace(token, "<token>")
    text = " ".join("".join(c if c.isprintable() else " " for c in text).split())
    return text if len(text) <= MESSAGE_MAX else text[:MESSAGE_MAX - 1] + "…"


def _reason(exc: Exception, token: str, content_type: str, timeout_s: float) -> str:
    """An HTTP status and Grafana's JSON message, or the network failure behind it."""
    status = getattr(exc, "status_code", None)
    if not status:  # a timeout or an HTTP library error, wrapped by grafana-client
        cause = exc.__cause__
        if isinstance(cause, OSError):
            return f"cannot reach it: {_network_reason(cause, timeout_s)}"
        return "cannot reach it"
    response = getattr(exc, "response", None)
    message = response.get("message") if isinstance(response, dict) else None
    text = (_short(message, token) if isinstance(message, str) and message.strip()
            else f"an answer of {content_type or 'no content type'}")
    hint = {401: " (check the token in GPULEDGER_GRAFANA_TOKEN)",
            403: " (the token's service account needs dashboard and folder write)"}
    return f"HTTP {status}: {text}{hint.get(status, '')}"


def _network_reason(exc: OSError, timeout_s: float) -> str:
    """Why a request failed, from the exception's type and the operating system's reason,
    never from its whole text (which can hold the request's headers)."""
    from niquests.exceptions import SSLError, Timeout

    text = str(exc)
    if isinstance(exc, Timeout) or "timed out" in text.lower():
        return f"no answer within {timeout_s:g} s" if timeout_s else "timed out"
    if isinstance(exc, SSLError):
        ssl = re.search(r"\[SSL: [A-Z0-9_]+\] ([a-z][a-z0-9 ,()._-]*)", text)
        return f"TLS failed: {ssl.group(1).strip()}" if ssl else "TLS failed"
    errno = re.search(r"\[Errno -?\d+\] ([A-Za-z][A-Za-z0-9 ,._-]*)", text)
    return errno.group(1).strip() if errno else type(exc).__name__
