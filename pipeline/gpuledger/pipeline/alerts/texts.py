"""The words of the native engine's alerts: summaries, descriptions, recommendations."""

from __future__ import annotations

from typing import Any

from gpuledger.pipeline.config import ProcessorConfig

LOW_UTIL = "GpuJobLowUtilisation"
MEMORY = "GpuJobMemoryOversized"
BLOCKED = "GpuJobBlockedByFragmentation"


def severity(config: ProcessorConfig, wasted_gpu_hours: float) -> str:
    """Severity grows with the GPU-hours wasted so far."""
    a = config.alerts
    if wasted_gpu_hours >= a.waste_critical_gpu_hours:
        return "critical"
    return "warning" if wasted_gpu_hours >= a.waste_warning_gpu_hours else "info"


def job_name(job_id: str, attempt: int, labels: dict[str, str]) -> str:
    ctx = ", ".join(f"{k} {labels[k]}" for k in ("team", "queue") if labels.get(k))
    where = "/".join(labels[k] for k in ("pool", "card_type") if labels.get(k))
    return f"job {job_id} (attempt {attempt}{', ' + ctx if ctx else ''}" \
           f"{', ' + where if where else ''})"


def low_util(config: ProcessorConfig, job: str, ev: dict[str, Any]) -> tuple[str, str, str]:
    a = config.alerts
    summary = f"Low GPU utilisation: {job}"
    description = (
        f"Mean activity {ev['mean_activity']:.1%} over the trailing "
        f"{ev['window_s'] / 60:.0f} min on {ev['allocated_gpus']:g} GPU(s), after "
        f"{ev['runtime_s'] / 60:.0f} min of runtime; {ev['wasted_gpu_hours']:.2f} GPU-hours "
        f"wasted so far (fires below {a.low_util_activity:.0%}, resolves above "
        f"{a.low_util_resolve_activity:.0%}, {a.low_util_grace_s / 60:g} min grace period).")
    if ev.get("likely_cause"):
        description += (f" Likely cause: {ev['likely_cause'].replace('_', '-')} "
                        f"({ev['likely_cause_evidence']}); {ev['likely_cause_remedy']}.")
    recommendation = (
        "Check the input pipeline (data loading, storage, network) and the batch size; if "
        "the job does not need its GPUs, release them or resubmit with fewer.")
    return summary, description, recommendation


def memory(config: ProcessorConfig, job: str, ev: dict[str, Any]) -> tuple[str, str, str]:
    t = config.thresholds
    summary = f"Memory over-sized: {job}"
    description = (
        f"Peak memory {ev['mem_peak_mib']:,.0f} MiB is {ev['mem_peak_ratio']:.1%} of the "
        f"{ev['mem_held_mib']:,.0f} MiB held per GPU after {ev['runtime_s'] / 60:.0f} min "
        f"(threshold {t.memory_oversized_ratio:.0%}).")
    fits = [(tier.memory_mib, card) for card, tier in config.card_tiers.items()
            if ev["mem_peak_mib"] <= t.lower_tier_memory_headroom * tier.memory_mib
            and tier.memory_mib < ev["mem_held_mib"]]
    recommendation = "Request less GPU memory (a smaller MIG profile or a GPU fraction)"
    if fits:
        recommendation += f" or a card with less memory: its peak fits {min(fits)[1]}"
    return summary, description, recommendation + "."


def blocked(config: ProcessorConfig, job: str, ev: dict[str, Any]) -> tuple[str, str, str]:
    summary = f"Pending {job} is blocked by fragmentation"
    description = (
        f"It asks for {ev['gpus']} GPU(s) on one node; its pool has {ev['free_gpus']} free "
        f"but at most {ev['largest_free_block']} on any node, for "
        f"{ev['blocked_s'] / 60:.0f} min (threshold "
        f"{config.alerts.blocked_s / 60:g} min).")
    recommendation = ("Drain or back-fill a node to free a whole block, consolidate small "
                      "jobs, or allow the job to span nodes.")
    return summary, description, recommendation
