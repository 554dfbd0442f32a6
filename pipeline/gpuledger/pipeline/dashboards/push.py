"""Push the boards to a Grafana through its HTTP API (``grafana-client``).

The token comes from the environment (``GPULEDGER_GRAFANA_TOKEN``, else
``GRAFANA_TOKEN``); it is sent as a bearer token and never printed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gpuledger.pipeline.dashboards.builders import Json

TOKEN_VARIABLES = ("GPULEDGER_GRAFANA_TOKEN", "GRAFANA_TOKEN")
FOLDER_UID = "gpuledger"
FOLDER_TITLE = "gpuledger"


class PushError(RuntimeError):
    """Grafana refused or could not be reached (the message never holds the token)."""


@dataclass(frozen=True)
class Pushed:
    uid: str
    url: str
    version: int


def token_from(environ: Mapping[str, str]) -> str:
    for name in TOKEN_VARIABLES:
        value = environ.get(name, "").strip()
        if value:
            return value
    raise PushError(f"no Grafana token: set {TOKEN_VARIABLES[0]} (a service-account token)")


def push_boards(url: str, token: str, boards: Mapping[str, Json],
                folder_uid: str = FOLDER_UID, folder_title: str = FOLDER_TITLE,
                timeout_s: float = 10.0) -> list[Pushed]:
    """Create the folder when missing, then create or overwrite every board in it."""
    from grafana_client.api import GrafanaApi
    from grafana_client.client import GrafanaClientError, GrafanaException

    api = GrafanaApi.from_url(url=url, credential=token, timeout=timeout_s)
    try:
        try:
            api.folder.get_folder(folder_uid)
        except GrafanaClientError as exc:
            if exc.status_code != 404:
                raise
            api.folder.create_folder(folder_title, uid=folder_uid)
        out = []
        for uid, board in boards.items():
            body = {k: v for k, v in board.items() if k not in ("id", "version")}
            reply = api.dashboard.update_dashboard({
                "dashboard": body, "folderUid": folder_uid, "overwrite": True,
                "message": "gpuledger dashboards push"})
            out.append(Pushed(uid, str(reply.get("url", "")), int(reply.get("version", 0))))
        return out
    except GrafanaException as exc:
        raise PushError(f"Grafana at {url}: {_reason(exc)}") from None
    except OSError as exc:
        raise PushError(f"cannot reach Grafana at {url}: {exc}") from None


def _reason(exc: Exception) -> str:
    status = getattr(exc, "status_code", None)
    message = getattr(exc, "message", None) or str(exc)
    return f"HTTP {status}: {message}" if status else str(message)
