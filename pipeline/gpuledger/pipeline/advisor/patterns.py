"""The documented patterns of idle and inefficient GPU-minutes, and the seed's remedies.

One place for their names, what each means, the fields it needs and its remedy
(``docs/diagnosis.md`` explains them with examples).
"""

from __future__ import annotations

from dataclasses import dataclass

INPUT = "input_bound"
COMMUNICATION = "communication_bound"
MEMORY = "memory_bound"
CHECKPOINT = "checkpoint_stall"
INFERENCE = "underfilled_inference"
NO_PROCESS = "held_no_process"
UNKNOWN = "unknown"

PATTERNS = (INPUT, COMMUNICATION, MEMORY, CHECKPOINT, INFERENCE, NO_PROCESS, UNKNOWN)


@dataclass(frozen=True)
class Pattern:
    """A pattern: what it means, the fields it needs, the remedy."""

    name: str
    meaning: str
    needs: str
    remedy: str


CATALOGUE: dict[str, Pattern] = {p.name: p for p in (
    Pattern(INPUT, "the GPU works in bursts or at a low level while neither its links nor its "
            "memory are busy: it waits for input from the host (data loading, storage)",
            "activity, PCIe (and NVLink, DRAM where reported)",
            "add DataLoader workers, pin memory and prefetch; cache or stage the data set on "
            "local disk"),
    Pattern(COMMUNICATION, "a multi-GPU job with busy NVLink or PCIe and low SM activity: the "
            "GPUs wait for each other", "sm_active (DCGM), NVLink or PCIe, two or more GPUs",
            "check the topology and communication settings: keep the job on NVLink-connected "
            "GPUs or one node, tune NCCL and gradient bucket sizes, overlap communication"),
    Pattern(MEMORY, "DRAM is busy while the SMs are not: kernels wait for memory",
            "sm_active and dram_active (DCGM)",
            "raise the batch size (or use mixed precision, fused kernels) so each pass over "
            "memory does more compute"),
    Pattern(CHECKPOINT, "short, periodic drops of activity between busy minutes: the job "
            "stops to write checkpoints", "activity",
            "checkpoint asynchronously, less often, or to faster storage"),
    Pattern(INFERENCE, "an inference service running below capacity (its load follows the "
            "day)", "activity, job type", "scale replicas with the load (fewer off-peak, "
            "autoscaling) or share GPUs between models"),
    Pattern(NO_PROCESS, "the GPU is allocated but no process runs on it", "process list",
            "release the GPUs: end the job, or add an idle timeout to notebooks"),
    Pattern(UNKNOWN, "none of the above could be shown (start-up, shared GPU, no telemetry, "
            "or no clear signal)", "-", "look at the Job board's activity, PCIe and NVLink "
            "panels"),
)}
