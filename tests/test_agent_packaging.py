"""The agent path runs without Polars, DuckDB, PyArrow or NumPy."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

HEAVY = ("polars", "duckdb", "pyarrow", "numpy")
FIXTURE = Path(__file__).parent / "fixtures" / "dcgm_exporter_metrics.txt"

CODE = """
import sys
for name in {heavy!r}:
    sys.modules[name] = None          # importing it now raises ImportError
import http.server, threading
body = open({fixture!r}, "rb").read()
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(body)
    def log_message(self, *a): pass
srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
threading.Thread(target=srv.serve_forever, daemon=True).start()
cfg = open({config!r}, "w")
cfg.write("node: n1\\nsource: dcgm-exporter\\n"
          "dcgm_exporter: {{url: 'http://127.0.0.1:%d/metrics'}}\\n"
          "attribution: {{methods: [slurm, kubernetes, mapping_dir, static],"
          " mapping_dir: {{path: /nonexistent}},"
          " kubernetes: {{pod_resources_socket: null}}}}\\n" % srv.server_address[1])
cfg.close()
import gpuledger.agent.run, gpuledger.agent.metrics, gpuledger.agent.producer
import gpuledger.agent.attribution.podresources, gpuledger.agent.sources.nvml
from gpuledger.cli.main import main
code = main(["agent", "--config", {config!r}, "--once"])
srv.shutdown()
sys.exit(code)
"""


def test_agent_once_without_heavy_libraries(tmp_path: Path) -> None:
    code = CODE.format(heavy=HEAVY, fixture=str(FIXTURE), config=str(tmp_path / "a.yaml"))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert len(out["telemetry"]) == 3 and out["inventory"]["node"] == "n1"


def test_the_simulator_source_without_the_pipeline_extra_is_one_line(tmp_path: Path) -> None:
    """deploy/agent.Dockerfile installs the agent extra only: the simulator source ended
    in a ModuleNotFoundError (numpy) traceback, exit 1, where `process` says in one line
    that it needs the pipeline extra, exit 2."""
    code = ("import sys\n"
            f"for name in {HEAVY!r}:\n"
            "    sys.modules[name] = None\n"
            "from gpuledger.cli.main import main\n"
            "sys.exit(main(['agent', '--once']))\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULEDGER_")}
    env.update(GPULEDGER_AGENT__SOURCE="simulator", GPULEDGER_AGENT__NODE="h100-001",
               GPULEDGER_AGENT__SPOOL__PATH=str(tmp_path / "spool"))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, env=env)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert "source simulator: needs the pipeline extra (pip install 'gpuledger[pipeline]')" \
        in line, line
