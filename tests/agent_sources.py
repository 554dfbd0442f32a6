"""A tiny in-test source with the agent's source interface (collect → records)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from gpuledger.agent.encode import stamp


class TinySource:
    """``gpus`` whole GPUs; GPU 0 runs process 100; can fail or lose GPUs on demand."""

    def __init__(self, gpus: int = 2, node: str = "source-node") -> None:
        self.gpus = gpus
        self.node = node
        self.fail = False
        self.unhealthy: set[int] = set()
        self.calls = 0

    def collect(self, now: datetime | None = None) -> list[dict[str, Any]]:
        self.calls += 1
        if self.fail:
            raise RuntimeError("driver hiccup")
        assert now is not None
        return [{"v": 1, "type": "telemetry", "time": stamp(now), "node": self.node,
                 "seq": 999, "gpu_index": i, "gpu_uuid": f"GPU-{i}",
                 "card_type": "H100-SXM5-80GB", "util_gpu": 10.0 * i,
                 "mem_total_mib": 81559.0, "mem_used_mib": 4.0,
                 "healthy": i not in self.unhealthy,
                 "processes": [{"pid": 100, "used_mib": 3.0, "job_id": None}] if i == 0 else []}
                for i in range(self.gpus)]
