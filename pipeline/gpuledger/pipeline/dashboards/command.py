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


def cmd_dashboards(args: argparse.Namespace) -> int:
    try:
        from gpuledger.pipeline.dashboards.files import (
            load_boards,
            repo_dashboards_dir,
            stale_boards,
            write_boards,
        )
    except ImportError:
        raise CliError("dashboards needs the ops extra (grafana-foundation-sdk): "
                       "pip install 'gpuledger[ops]'") from None

    folder: Path = args.dir or repo_dashboards_dir()
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
    from gpuledger.pipeline.dashboards.push import PushError, push_boards, token_from

    if not args.url:
        raise CliError("push needs --url (or GPULEDGER_GRAFANA_URL)")
    boards = load_boards(folder)
    if not boards:
        raise CliError(f"{folder}: no board files (*.json)")
    try:
        token = token_from(os.environ)
        pushed = push_boards(args.url, token, boards, args.folder_uid, args.folder_title)
    except ImportError:
        raise CliError("push needs the ops extra: pip install 'gpuledger[ops]'") from None
    except PushError as exc:
        raise CliError(str(exc)) from None
    for p in pushed:
        print(f"{p.uid}: version {p.version} {p.url}")
    print(f"pushed {len(pushed)} boards to {args.url} (folder {args.folder_uid})",
          file=sys.stderr)
    return 0


def register(subparsers: argparse._SubParsersAction,  # type: ignore[type-arg]
             common: Callable[..., None]) -> None:
    p = subparsers.add_parser(
        "dashboards", help="Grafana boards: generate the JSON, push it to a Grafana",
        description="The Grafana boards (fleet, team, job, queues) are generated from code. "
        "'generate' writes dashboards/*.json (--check: fail when the files differ from the "
        "code); 'push' creates or overwrites them in a Grafana folder through the HTTP API, "
        "with a service-account token from $GPULEDGER_GRAFANA_TOKEN (or $GRAFANA_TOKEN), "
        "never printed. See docs/deployment.md.")
    p.add_argument("action", choices=("generate", "push"), help="what to do")
    p.add_argument("--dir", type=Path, default=None,
                   help="board folder (default: the repository's dashboards/)")
    p.add_argument("--check", action="store_true",
                   help="generate: only check that the files match the code")
    p.add_argument("--url", default=os.environ.get("GPULEDGER_GRAFANA_URL"),
                   help="push: Grafana's base URL, e.g. http://grafana:3000")
    p.add_argument("--folder-uid", default="gpuledger", help="push: folder uid (default gpuledger)")
    p.add_argument("--folder-title", default="gpuledger",
                   help="push: folder title when it is created (default gpuledger)")
    p.set_defaults(func=cmd_dashboards)
