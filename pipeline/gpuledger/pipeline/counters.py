"""The processor's own counters, in one place (log lines now, metrics later)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

GLOBAL = {"late_job_events", "late_inventory", "early_job_events", "early_inventory",
          "duplicate_job_events",
          "out_of_order_job_events", "minutes_closed", "late_overcharged_ms",
          "late_undercharged_ms", "late_job_max_ms"}
"""Counters every shard counts alike: shards combine by their maximum, not their sum."""
GLOBAL_KEYS = {"records_in": {"job", "inventory"}, "rejected": {"job", "inventory"}}


@dataclass
class Counters:
    """Monotonic counts since the processor started."""

    records_in: dict[str, int] = field(default_factory=lambda: {
        "telemetry": 0, "inventory": 0, "job": 0})
    rejected: dict[str, int] = field(default_factory=dict)
    late_telemetry: int = 0
    late_job_events: int = 0
    late_inventory: int = 0
    early_job_events: int = 0
    """Job events dated before the processor's first minute that came before any minute
    was closed (a window of a history, facts that begin after far-early records): they
    update the books only, and no closed minute is wrong for them, so they are not late."""
    early_inventory: int = 0
    """Inventory records dated before the processor's first minute (as above)."""
    duplicate_samples: int = 0
    duplicate_job_events: int = 0
    out_of_order_job_events: int = 0
    telemetry_lost_samples: int = 0
    ahead_telemetry: int = 0
    """Samples further ahead of the fleet than ``windows.max_ahead_s`` (rejected)."""
    implausible_telemetry: int = 0
    """Samples using more memory than their card has (per the inventory): rejected."""
    unplaced_telemetry: int = 0
    """Samples of GPUs no inventory knows (an unknown node, a GPU index beyond its count):
    rejected."""
    overcommitted_gpu_minutes: int = 0
    """GPU-minutes whose allocations summed to more than the whole GPU (two jobs each
    given all of it by the scheduler, or pods whose fractions add up past 1): the GPU
    counts as allocated once; ``gpu_minute.alloc_fraction`` keeps the sum."""
    uncharged_allocation_ms: int = 0
    """Allocated GPU-time (ms) on GPUs no inventory knew at the time (an unknown node, a
    GPU index beyond its count, a GPU that left the inventory): not charged, no capacity."""
    late_overcharged_ms: int = 0
    """Allocated GPU-time (ms) charged to attempts after they ended: the end arrived after
    its minutes had closed (closed facts are not rewritten)."""
    late_undercharged_ms: int = 0
    """Allocated GPU-time (ms) not charged before attempts started: the start arrived
    after its minutes had closed."""
    late_job_max_ms: int = 0
    """How far behind the closed point the latest-arriving job event was (ms)."""
    misrouted_telemetry: int = 0
    """Samples for a node of another shard's partition (dropped; see shard.py)."""
    minutes_closed: int = 0
    close_passes: int = 0
    """Times minutes were closed (each pass closes one or more; a pass has a fixed cost,
    so catching up closes in large steps, see ``windows.catchup_close_minutes``)."""
    fact_rows: dict[str, int] = field(default_factory=dict)
    batches: int = 0

    def add_rejects(self, record_type: str, n: int) -> None:
        if n:
            self.rejected[record_type] = self.rejected.get(record_type, 0) + n

    def add_rows(self, table: str, n: int) -> None:
        self.fact_rows[table] = self.fact_rows.get(table, 0) + n

    @staticmethod
    def total(parts: list[Counters]) -> Counters:
        """Several processors' (shards') counters combined: telemetry-side counts add up;
        counts of the global inputs (scheduler and inventory events, which every shard
        reads, and the minutes every shard closes) are the largest shard's."""
        out = Counters()
        for c in parts:
            for name, value in vars(c).items():
                if isinstance(value, dict):
                    mine = getattr(out, name)
                    for k, v in value.items():
                        both = (mine.get(k, 0), v)
                        mine[k] = max(both) if k in GLOBAL_KEYS.get(name, ()) else sum(both)
                elif name in GLOBAL:
                    setattr(out, name, max(getattr(out, name), value))
                else:
                    setattr(out, name, getattr(out, name) + value)
        return out

    def as_dict(self) -> dict[str, object]:
        return asdict(self)
