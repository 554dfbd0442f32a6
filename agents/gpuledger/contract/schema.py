"""Event contract v1: the three record types that flow through gpuledger.

The contract is data: one :class:`Field` per field, grouped by record type. It is pure
Python so that the lean node agent can use it without Polars or Arrow; the processor
derives its columnar (Polars) schema and its validation from the same definitions
(``gpuledger.pipeline.decode``). ``docs/events.md`` documents every field.

Every record carries the envelope ``v`` (contract version), ``type`` and ``time``
(RFC 3339, UTC). Unknown fields are tolerated and ignored.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

CONTRACT_VERSION = 1

Kind = Literal["int", "float", "str", "bool", "time", "processes", "allocation", "int_list", "json"]

RecordType = Literal["telemetry", "inventory", "job"]
RECORD_TYPES: tuple[RecordType, ...] = ("telemetry", "inventory", "job")

JOB_EVENTS = (
    "submitted",
    "started",
    "checkpointed",
    "preempted",
    "requeued",
    "finished",
    "failed",
    "cancelled",
)
JOB_TYPES = ("training", "fine-tune", "evaluation", "inference", "interactive")
NODE_HEALTH = ("ok", "degraded", "down")

# Events after which a job attempt no longer holds GPUs.
ATTEMPT_END_EVENTS = ("preempted", "requeued", "finished", "failed", "cancelled")
# Events after which the job is over for good.
JOB_END_EVENTS = ("finished", "failed", "cancelled")


@dataclass(frozen=True)
class Field:
    """One field of a record type.

    ``required`` fields must be present and non-null; ``minimum``/``maximum`` bound
    numeric values (inclusive); ``choices`` restricts strings to an enumeration.
    """

    name: str
    kind: Kind
    required: bool = False
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[str, ...] | None = None
    doc: str = ""


ENVELOPE: tuple[Field, ...] = (
    Field("v", "int", True, 1, CONTRACT_VERSION, doc="contract version"),
    Field("type", "str", True, choices=RECORD_TYPES, doc="record type"),
    Field("time", "time", True, doc="event time, RFC 3339 (UTC 'Z' or an offset)"),
)

TELEMETRY: tuple[Field, ...] = (
    Field("node", "str", True, doc="node (host) name; the Kafka key"),
    Field("seq", "int", True, 0, doc="per-agent sequence number, +1 per sample"),
    Field("agent", "str", doc="agent instance id (defaults to node)"),
    Field("gpu_index", "int", True, 0, 1023, doc="GPU index on the node (nvidia-smi order)"),
    Field("gpu_uuid", "str", True, doc="GPU UUID (or MIG device UUID)"),
    Field("card_type", "str", True, doc="card type, e.g. H100-SXM5-80GB"),
    Field("mig_instance", "str", doc="MIG instance (profile/GI id) when the sample is for one"),
    Field("util_gpu", "float", False, 0, 100, doc="NVML utilization.gpu, percent"),
    Field("sm_active", "float", False, 0, 1, doc="DCGM PROF_SM_ACTIVE, ratio"),
    Field("sm_occupancy", "float", False, 0, 1, doc="DCGM PROF_SM_OCCUPANCY, ratio"),
    Field("tensor_active", "float", False, 0, 1, doc="DCGM PROF_PIPE_TENSOR_ACTIVE, ratio"),
    Field("dram_active", "float", False, 0, 1, doc="DCGM PROF_DRAM_ACTIVE, ratio"),
    Field("mem_used_mib", "float", False, 0, doc="framebuffer memory used, MiB"),
    Field("mem_total_mib", "float", False, 0, doc="framebuffer memory total, MiB"),
    Field("power_w", "float", False, 0, doc="power draw, W"),
    Field("temp_c", "float", False, -50, 200, doc="GPU temperature, °C"),
    Field("sm_clock_mhz", "float", False, 0, doc="SM clock, MHz"),
    Field("pcie_rx_bytes_s", "float", False, 0, doc="PCIe receive throughput, bytes/s"),
    Field("pcie_tx_bytes_s", "float", False, 0, doc="PCIe transmit throughput, bytes/s"),
    Field("nvlink_rx_bytes_s", "float", False, 0, doc="NVLink receive throughput, bytes/s"),
    Field("nvlink_tx_bytes_s", "float", False, 0, doc="NVLink transmit throughput, bytes/s"),
    Field("xid_errors", "int", False, 0, doc="XID events since the previous sample"),
    Field("ecc_sbe", "int", False, 0, doc="single-bit ECC errors since the previous sample"),
    Field("ecc_dbe", "int", False, 0, doc="double-bit ECC errors since the previous sample"),
    Field("healthy", "bool", doc="false when the agent lost the GPU or saw a fatal XID"),
    Field("processes", "processes", doc="compute processes: [{pid, used_mib, job_id}]"),
)

INVENTORY: tuple[Field, ...] = (
    Field("node", "str", True, doc="node name; the compaction key"),
    Field("pool", "str", True, doc="resource pool the node belongs to"),
    Field("card_type", "str", True, doc="card type of the node's GPUs"),
    Field("gpu_count", "int", True, 0, 1024, doc="number of GPUs"),
    Field("gpu_mem_mib", "float", True, 0, doc="memory per GPU, MiB"),
    Field("nvlink_domain", "str", doc="NVLink domain / NVSwitch fabric id"),
    Field("topology", "str", doc="interconnect, e.g. nvlink, pcie"),
    Field("labels", "json", doc="free-form labels (object of strings)"),
    Field("schedulable", "bool", True, doc="false when cordoned or drained"),
    Field("health", "str", True, choices=NODE_HEALTH, doc="node health"),
    Field("unhealthy_gpus", "int_list", doc="indices of GPUs that are unhealthy"),
)

JOB: tuple[Field, ...] = (
    Field("event", "str", True, choices=JOB_EVENTS, doc="what happened"),
    Field("job_id", "str", True, doc="scheduler job id; the Kafka key"),
    Field("team", "str", doc="owning team (account / namespace)"),
    Field("user", "str", doc="submitting user"),
    Field("queue", "str", doc="queue (partition / QOS / LocalQueue)"),
    Field("pool", "str", doc="resource pool the job targets"),
    Field("priority", "int", doc="scheduler priority (higher runs first)"),
    Field("job_type", "str", choices=JOB_TYPES, doc="workload type"),
    Field("gpus", "int", False, 0, 100_000, doc="GPUs requested"),
    Field("card_type", "str", doc="card type requested (null: any in the pool)"),
    Field("gpu_mem_mib", "float", False, 0, doc="GPU memory requested per GPU, MiB"),
    Field("preemptible", "bool", doc="may be preempted"),
    Field("checkpointable", "bool", doc="writes checkpoints it can resume from"),
    Field("borrowed", "bool", doc="runs on borrowed (over-quota) capacity"),
    Field("allocation", "allocation", doc="on 'started': [{node, gpu_index, gpu_uuid, fraction}]"),
    Field("reason", "str", doc="free text, e.g. why preempted or failed"),
)

FIELDS: dict[RecordType, tuple[Field, ...]] = {
    "telemetry": ENVELOPE + TELEMETRY,
    "inventory": ENVELOPE + INVENTORY,
    "job": ENVELOPE + JOB,
}

# Job attributes carried from 'submitted' to the later events of the same job.
JOB_ATTRIBUTES = (
    "team",
    "user",
    "queue",
    "pool",
    "priority",
    "job_type",
    "gpus",
    "card_type",
    "gpu_mem_mib",
    "preemptible",
    "checkpointable",
)
