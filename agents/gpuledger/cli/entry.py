"""The ``gpuledger`` console script.

It loads the command's modules (:mod:`gpuledger.cli.main`) inside its own guard, so
that a Ctrl-C while they load is one line and exit status 130 as everywhere else, not
a traceback from the middle of an import.
"""

from __future__ import annotations

import sys

INTERRUPTED = 130


def main() -> int:
    try:
        from gpuledger.cli.main import main as run
    except KeyboardInterrupt:
        print("gpuledger: interrupted", file=sys.stderr)
        return INTERRUPTED
    return run()


if __name__ == "__main__":
    sys.exit(main())
