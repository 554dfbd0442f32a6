"""Regenerate the committed Grafana boards (dashboards/*.json) from code.

    .venv/bin/python dashboards/generate.py          # same as: gpuledger dashboards generate
    .venv/bin/python dashboards/generate.py --check  # writes nothing; exit 2 when a file differs
                                                     # (as gpuledger dashboards generate --check)

The boards are defined in pipeline/gpuledger/pipeline/dashboards/boards.py;
tests/test_dashboards.py fails when these files and the code disagree.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from gpuledger.pipeline.dashboards.files import stale_boards, write_boards


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="dashboards/generate.py",
        description="Write the Grafana boards (dashboards/*.json) from code, or check them.")
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 2 naming the boards whose file differs "
                        "from what the code generates (as `gpuledger dashboards generate "
                        "--check`)")
    args = parser.parse_args(argv)   # anything else is refused (exit 2)
    folder = Path(__file__).resolve().parent
    if args.check:
        stale = stale_boards(folder)
        for uid in stale:
            print(f"{folder / (uid + '.json')}: differs from the code (run "
                  "dashboards/generate.py)")
        return 2 if stale else 0
    for path in write_boards(folder):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
