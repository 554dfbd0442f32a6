"""Regenerate the committed Grafana boards (dashboards/*.json) from code.

    .venv/bin/python dashboards/generate.py          # same as: gpuledger dashboards generate

The boards are defined in pipeline/gpuledger/pipeline/dashboards/boards.py;
tests/test_dashboards.py fails when these files and the code disagree.
"""

from __future__ import annotations

from pathlib import Path

from gpuledger.pipeline.dashboards.files import write_boards

if __name__ == "__main__":
    for path in write_boards(Path(__file__).resolve().parent):
        print(path)
