"""``gpuledger dashboards``: write the boards' JSON, check it, push it to Grafana.

Registered through ``COMMAND_MODULES``; imports nothing heavy at module level.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path

from gpuledger.cli.errors import CliError

URL_VARIABLE = "GPULEDGER_GRAFANA_URL"
URL_TOKEN_HINT = "GPULEDGER_GRAFANA_TOKEN"
GENERATE_ONLY = ("check",)
PUSH_ONLY = ("url", "folder_uid", "folder_title")


def _option(name: str) -> str:
    return "--" + name.replace("_", "-")


def cmd_dashboards(args: argparse.Namespace) -> int:
    # an option of the other action is refused, not ignored: 'push --check' would
    # otherwise overwrite the boards of a Grafana whose user expected a dry run
    wrong = [_option(n) for n in (GENERATE_ONLY if args.action == "push" else PUSH_ONLY)
             if getattr(args, n) not in (None, False)]
    if wrong:
        other = "generate" if args.action == "push" else "push"
        dry = " (push has no dry run)" if "--check" in wrong else ""
        raise CliError(f"{', '.join(wrong)}: only for dashboards {other}, not "
                       f"{args.action}{dry}")
    try:
        from gpuledger.pipeline.dashboards.files import (
            BoardFileError,
            default_dashboards_dir,
            load_boards,
            stale_boards,
            write_boards,
        )
    except ImportError:
        raise CliError("dashboards needs the ops extra (grafana-foundation-sdk): "
                       "pip install 'gpuledger[ops]'") from None

    folder: Path = args.dir or default_dashboards_dir()
    if folder.exists() and not folder.is_dir():
        raise CliError(f"--dir {folder}: not a folder")
    if args.action == "generate":
        if args.check:
            stale = stale_boards(folder)
            if stale:
                raise CliError(f"{folder}: out of date: {', '.join(stale)} "
                               "(run: gpuledger dashboards generate)")
            print(f"{folder}: up to date")
            return 0
        try:
            paths = write_boards(folder)
        except OSError as exc:
            raise CliError(f"cannot write the boards into {folder}: "
                           f"{exc.strerror or exc}") from None
        for path in paths:
            print(path)
        return 0
    # push
    from gpuledger.http_url import http_url_problem, redacted
    from gpuledger.pipeline.dashboards.push import (
        FOLDER_TITLE,
        FOLDER_UID,
        PushError,
        push_boards,
        token_from,
        uid_problem,
    )

    url = args.url if args.url is not None else os.environ.get(URL_VARIABLE, "")
    given = "--url" if args.url is not None else URL_VARIABLE
    if not url.strip():
        raise CliError(f"push needs --url (or {URL_VARIABLE}): Grafana's base URL")
    problem = http_url_problem(url)
    if problem:
        hint = (f"; the token goes in {URL_TOKEN_HINT}" if "credentials" in problem else "")
        raise CliError(f"{given} {redacted(url)!r}: {problem}{hint}")
    folder_uid = FOLDER_UID if args.folder_uid is None else args.folder_uid
    problem = uid_problem(folder_uid)
    if problem:
        raise CliError(f"--folder-uid {folder_uid!r}: {problem}")
    folder_title = FOLDER_TITLE if args.folder_title is None else args.folder_title
    if not folder_title.strip() or not folder_title.isprintable():
        raise CliError(f"--folder-title {folder_title!r}: must be a non-empty "
                       "title without control characters")
    if not folder.is_dir():
        raise CliError(f"{folder}: no such folder; write the boards with: gpuledger "
                       f"dashboards generate --dir {folder} (or give --dir)")
    try:
        boards = load_boards(folder)
    except BoardFileError as exc:
        raise CliError(str(exc)) from None
    if not boards:
        raise CliError(f"{folder}: no board files (*.json); write them with: gpuledger "
                       f"dashboards generate --dir {folder}")
    try:
        token = token_from(os.environ)
        pushed = push_boards(url, token, boards, folder_uid, folder_title)
    except ImportError:
        raise CliError("push needs the ops extra: pip install 'gpuledger[ops]'") from None
    except PushError as exc:
        raise CliError(str(exc)) from None
    for p in pushed:
        print(f"{p.uid}: version {p.version} {p.url}")
    print(f"pushed {len(pushed)} boards to {redacted(url)} (folder {folder_uid})",
          file=sys.stderr)
    return 0


def register(subparsers: argparse._SubParsersAction,  # type: ignore[type-arg]
             common: Callable[..., None]) -> None:
    p = subparsers.add_parser(
        "dashboards", help="Grafana boards: generate the JSON, push it to a Grafana",
        description="The Grafana boards (fleet, team, job, queues) are generated from code. "
        "'generate' writes <dir>/*.json (--check: fail when the files differ from the "
        "code, and write nothing); 'push' creates or overwrites them in a Grafana folder "
        "through the HTTP API, with a service-account token from $GPULEDGER_GRAFANA_TOKEN "
        "(or $GRAFANA_TOKEN), never printed. An option of the other action is refused "
        "(push has no dry run). The board folder: --dir, else the repository's "
        "dashboards/ when gpuledger runs from a source checkout, else ./dashboards (an "
        "installed gpuledger ships no board files: run 'generate' first). "
        "See docs/deployment.md.")
    p.add_argument("action", choices=("generate", "push"), help="what to do")
    p.add_argument("--dir", type=Path, default=None,
                   help="board folder (default: the source checkout's dashboards/, else "
                   "./dashboards)")
    p.add_argument("--check", action="store_true",
                   help="generate: only check that the files match the code")
    p.add_argument("--url", default=None,
                   help=f"push: Grafana's base URL, e.g. http://grafana:3000 (default "
                   f"${URL_VARIABLE}); no credentials in it: the token goes in "
                   f"${URL_TOKEN_HINT}")
    p.add_argument("--folder-uid", default=None,
                   help="push: folder uid, 1 to 40 letters, digits, _ or - (default "
                   "gpuledger)")
    p.add_argument("--folder-title", default=None,
                   help="push: folder title when it is created (default gpuledger)")
    p.set_defaults(func=cmd_dashboards)
