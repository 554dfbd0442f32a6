"""The committed board files: ``dashboards/<uid>.json``, written from :mod:`.boards`."""

from __future__ import annotations

import json
from pathlib import Path

from gpuledger.output_file import replace_texts
from gpuledger.pipeline.dashboards.boards import all_boards
from gpuledger.pipeline.dashboards.builders import Json
from gpuledger.pipeline.dashboards.push import uid_problem


def board_text(board: Json) -> str:
    return json.dumps(board, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


class BoardFileError(ValueError):
    """A board file that cannot be pushed: ``FILE: not a board (reason)``."""


def repo_dashboards_dir() -> Path:
    """The repository's ``dashboards/`` folder, where this module lies in a source
    checkout (``<repo>/pipeline/gpuledger/pipeline/dashboards/``). Installed from a wheel,
    this path means nothing: see :func:`default_dashboards_dir`."""
    return Path(__file__).resolve().parents[4] / "dashboards"


def default_dashboards_dir() -> Path:
    """The board folder when ``--dir`` is not given: the repository's ``dashboards/``
    when gpuledger runs from a source checkout that has one (its ``pyproject.toml`` two
    levels above the package, in a ``pipeline/`` folder), else ``./dashboards`` in the
    current directory (an installed gpuledger ships no board files; ``gpuledger
    dashboards generate`` writes them there)."""
    here = Path(__file__).resolve()
    root = here.parents[4]
    if (here.parents[3].name == "pipeline" and (root / "pyproject.toml").is_file()
            and (root / "dashboards").is_dir()):
        return root / "dashboards"
    return Path("dashboards")


def write_boards(folder: Path) -> list[Path]:
    """Write every board as ``<uid>.json`` into ``folder``; the paths written."""
    folder.mkdir(parents=True, exist_ok=True)
    texts = {folder / f"{uid}.json": board_text(board) for uid, board in all_boards().items()}
    replace_texts(texts)
    return list(texts)


def stale_boards(folder: Path) -> list[str]:
    """Boards whose file in ``folder`` differs from what the code generates."""
    stale = []
    for uid, board in all_boards().items():
        path = folder / f"{uid}.json"
        try:
            same = (path.is_file()
                    and path.read_text(encoding="utf-8", errors="replace") == board_text(board))
        except OSError:  # unreadable: it cannot be what the code generates
            same = False
        if not same:
            stale.append(uid)
    return stale


def load_boards(folder: Path) -> dict[str, Json]:
    """The board files (``*.json``) in ``folder`` by uid; :class:`BoardFileError` naming
    the first file that is not a board (not readable, not JSON, not an object with a
    title and a Grafana uid, a uid another file has too)."""
    boards: dict[str, Json] = {}
    files: dict[str, Path] = {}
    try:
        paths = sorted(folder.glob("*.json"))
    except OSError as exc:
        raise BoardFileError(f"{folder}: cannot list ({exc.strerror or exc})") from None
    for path in paths:
        board = _board(path)
        uid = board["uid"]
        if uid in files:
            raise BoardFileError(f"{path}: not a board (uid {uid!r} is {files[uid]}'s too)")
        boards[uid], files[uid] = board, path
    return boards


def _board(path: Path) -> Json:
    def bad(reason: str) -> BoardFileError:
        return BoardFileError(f"{path}: not a board ({reason})")

    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        raise bad("not UTF-8 text") from None
    except OSError as exc:
        raise bad(f"cannot read: {exc.strerror or exc}") from None
    try:
        board = json.loads(text)
    except json.JSONDecodeError as exc:
        raise bad(f"not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except RecursionError:
        raise bad("not JSON: nested too deeply") from None
    if not isinstance(board, dict):
        raise bad(f"a JSON {type(board).__name__}, not an object")
    uid, title = board.get("uid"), board.get("title")
    if not isinstance(uid, str):
        raise bad("no uid" if uid is None else f"uid {uid!r} is not text")
    problem = uid_problem(uid)
    if problem:
        raise bad(f"uid {uid!r}: {problem}")
    if not isinstance(title, str) or not title.strip():
        raise bad("no title")
    return board
