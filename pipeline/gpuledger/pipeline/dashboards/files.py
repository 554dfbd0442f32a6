"""The committed board files: ``dashboards/<uid>.json``, written from :mod:`.boards`."""

from __future__ import annotations

import json
from pathlib import Path

from gpuledger.pipeline.dashboards.boards import all_boards
from gpuledger.pipeline.dashboards.builders import Json


def board_text(board: Json) -> str:
    return json.dumps(board, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def repo_dashboards_dir() -> Path:
    """The repository's ``dashboards/`` folder (three levels above the package)."""
    return Path(__file__).resolve().parents[4] / "dashboards"


def write_boards(folder: Path) -> list[Path]:
    """Write every board as ``<uid>.json`` into ``folder``; the paths written."""
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for uid, board in all_boards().items():
        path = folder / f"{uid}.json"
        path.write_text(board_text(board), encoding="utf-8")
        out.append(path)
    return out


def stale_boards(folder: Path) -> list[str]:
    """Boards whose file in ``folder`` differs from what the code generates."""
    stale = []
    for uid, board in all_boards().items():
        path = folder / f"{uid}.json"
        if not path.is_file() or path.read_text(encoding="utf-8") != board_text(board):
            stale.append(uid)
    return stale


def load_boards(folder: Path) -> dict[str, Json]:
    """The board files in ``folder`` by uid."""
    boards: dict[str, Json] = {}
    for path in sorted(folder.glob("*.json")):
        board = json.loads(path.read_text(encoding="utf-8"))
        boards[str(board["uid"])] = board
    return boards
