"""The demo's summary: the seed's questions answered from the warehouse."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from gpuledger.pipeline import query

SECTIONS: list[tuple[str, str]] = [
    (
        "Allocation vs use by pool and card type (GPU-hours)",
        """SELECT pool, card_type, round(available_gpu_hours, 1) AS available,
                  round(allocated_gpu_hours, 1) AS allocated,
                  round(used_gpu_hours, 1) AS used,
                  round(idle_gpu_hours, 1) AS idle, round(inefficient_gpu_hours, 1) AS inefficient,
                  round(free_gpu_hours, 1) AS free,
                  round(100 * allocation_rate, 1) AS "alloc %",
                  round(100 * utilisation_of_allocation, 1) AS "used/alloc %"
           FROM utilisation_by_pool ORDER BY pool, card_type""",
    ),
    (
        "Allocation vs use by team (GPU-hours)",
        """SELECT team, round(sum(allocated_gpu_hours), 1) AS allocated,
                  round(sum(used_gpu_hours), 1) AS used,
                  round(sum(idle_gpu_hours), 1) AS idle,
                  round(sum(inefficient_gpu_hours), 1) AS inefficient,
                  round(sum(waste_gpu_hours), 1) AS waste,
                  round(100 * sum(used_gpu_hours) / nullif(sum(allocated_gpu_hours), 0), 1)
                      AS "used/alloc %"
           FROM utilisation_by_team GROUP BY team ORDER BY waste DESC""",
    ),
    (
        "Top 10 wasting jobs (allocated − used GPU-hours)",
        """SELECT job_id, team, job_type, held_card_type AS "card held", allocated_gpus AS gpus,
                  round(allocated_gpu_hours, 1) AS allocated, round(used_gpu_hours, 1) AS used,
                  round(waste_gpu_hours, 1) AS waste,
                  round(100 * utilisation_of_allocation, 1) AS "used/alloc %", status
           FROM attempts WHERE allocated_gpu_hours > 0
           ORDER BY waste_gpu_hours DESC, job_id LIMIT 10""",
    ),
    (
        "Queue wait by queue (minutes)",
        """SELECT queue, pool, attempts, round(p50_s / 60, 1) AS p50, round(p90_s / 60, 1) AS p90,
                  round(p99_s / 60, 1) AS p99, round(max_s / 60, 1) AS max
           FROM queue_wait ORDER BY queue, pool""",
    ),
    (
        "Fragmentation by pool and card type (time averages)",
        """SELECT pool, card_type, round(mean_free_gpus, 1) AS "free GPUs",
                  round(frag_2, 3) AS frag_2, round(frag_4, 3) AS frag_4,
                  round(frag_8, 3) AS frag_8,
                  round(frag_node, 3) AS frag_node, round(frag_demand, 3) AS frag_demand,
                  blocked_job_minutes AS "blocked job-min"
           FROM fragmentation ORDER BY pool, card_type""",
    ),
    (
        "Preemptions and lost work",
        """SELECT team, queue, preemptions, requeued, round(lost_gpu_hours, 1) AS "lost GPU-h"
           FROM preemption_cost ORDER BY lost_gpu_hours DESC""",
    ),
    (
        "Recommendations by kind",
        """SELECT kind, count(*) AS jobs, round(sum(gpu_hours), 1) AS "GPU-h at stake"
           FROM recommendations GROUP BY kind ORDER BY 3 DESC""",
    ),
]


def summary_text(warehouse: Path) -> str:
    """All sections as plain text tables, each number with the decimals its query rounded
    it to (not 26.000 for a share rounded to 26.0)."""
    out: list[str] = []
    for title, sql in SECTIONS:
        columns, rows = query.run(warehouse, sql)
        out.append(f"\n== {title}\n")
        out.append(query.table_text(columns, _as_rounded(rows)))
    return "".join(out)


def _as_rounded(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """Each column of floats as text with the fewest decimals (up to 3) that show every
    value of it exactly as rounded."""
    if not rows:
        return rows
    places: dict[int, int] = {}
    for i in range(len(rows[0])):
        values = [r[i] for r in rows if isinstance(r[i], float) and math.isfinite(r[i])]
        if values:
            places[i] = next((d for d in range(3) if all(round(v, d) == v for v in values)), 3)
    return [tuple(f"{v:,.{places[i]}f}" if i in places and isinstance(v, float)
                  and math.isfinite(v) else v for i, v in enumerate(r)) for r in rows]
