"""``gpuledger alerts generate``: write the Prometheus rule files from the configuration.

Imported when the parser is built, so it imports nothing heavy at module level.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpuledger.cli.errors import CliError


def register(sub: Any, common: Callable[..., None]) -> None:
    p = sub.add_parser(
        "alerts", help="alert rules: generate the Prometheus rule files",
        description="Write alerts/gpuledger-alerts.yml (alerting rules) and "
        "alerts/gpuledger-recording.yml (recording rules for the boards) from the processor "
        "configuration's thresholds (section alerts, docs/alerts.md), so that Prometheus and "
        "the processor's own alert engine use one definition of each threshold.")
    p.add_argument("action", choices=("generate", "check"),
                   help="generate: write the files; check: exit 1 when the files in --out "
                   "differ from what the configuration generates")
    p.add_argument("--out", type=Path, default=Path("alerts"),
                   help="folder of the rule files (default ./alerts)")
    p.add_argument("--config", type=Path, default=None,
                   help="processor configuration YAML (docs/configuration.md)")
    p.set_defaults(func=cmd_alerts)


def cmd_alerts(args: argparse.Namespace) -> int:
    from gpuledger.pipeline.alerts.prometheus_rules import generate, write
    from gpuledger.pipeline.config import ConfigError, load_config

    try:
        config = load_config(args.config)
    except ConfigError as exc:
        raise CliError(f"configuration: {exc}") from None
    if args.out.exists() and not args.out.is_dir():
        raise CliError(f"--out {args.out}: not a folder")
    if args.action == "generate":
        try:
            paths = write(config, args.out)
        except OSError as exc:
            raise CliError(f"cannot write the rule files into {args.out}: "
                           f"{exc.strerror or exc}") from None
        for path in paths:
            print(path)
        return 0
    stale = 0
    for name, text in generate(config).items():
        path = args.out / name
        if not path.is_file():
            print(f"{path}: missing; run gpuledger alerts generate")
        elif path.read_text(errors="replace") != text:
            print(f"{path}: differs from the configuration; run gpuledger alerts generate")
        else:
            continue
        stale += 1
    return 1 if stale else 0
