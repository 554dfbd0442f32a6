"""Builds the agent's parts from its configuration: source, attribution chain, spool."""

from __future__ import annotations

from typing import Any

from gpuledger.agent.attribution import Chain, Method
from gpuledger.agent.attribution.procfs import Procfs
from gpuledger.agent.config import AgentConfig


class SourceError(RuntimeError):
    """The configured source cannot start (no driver, not a simulated node, ...)."""


def build_source(config: AgentConfig) -> Any:
    """The configured source; :class:`SourceError` with a clear message when it cannot start."""
    node = config.node_name
    if config.source == "nvml":
        from gpuledger.agent.sources.nvml import NvmlSource, NvmlUnavailable
        from gpuledger.agent.sources.nvml_spec import FieldFileError

        try:
            return NvmlSource(node, config.nvml.fields)
        except (NvmlUnavailable, FieldFileError) as exc:
            raise SourceError(f"source nvml: {exc}") from None
    if config.source == "dcgm-exporter":
        from gpuledger.agent.sources.dcgm_exporter import DcgmExporterSource

        d = config.dcgm_exporter
        return DcgmExporterSource(node=node, card_type=d.card_type, url=d.url,
                                  timeout_s=d.timeout_s)
    try:
        from gpuledger.agent.sources.simulator import SimulatorNodeError, SimulatorSource
    except ImportError as exc:
        raise SourceError("source simulator: needs the pipeline extra "
                          f"(pip install 'gpuledger[pipeline]'): {exc}") from None
    s = config.simulator
    try:
        return SimulatorSource(node, config.interval_s, s.cluster, s.seed, s.hours)
    except ImportError as exc:  # the simulator (NumPy, Polars) is imported when it is built
        raise SourceError("source simulator: needs the pipeline extra "
                          f"(pip install 'gpuledger[pipeline]'): {exc}") from None
    except (SimulatorNodeError, OSError, ValueError) as exc:
        raise SourceError(f"source simulator: {exc}") from None


def build_chain(config: AgentConfig) -> Chain:
    """The attribution methods in their configured order."""
    a = config.attribution
    procfs = Procfs(a.proc_root)
    methods: list[Method] = []
    for name in a.methods:
        if name == "slurm":
            from gpuledger.agent.attribution.slurm import SlurmAttribution

            methods.append(SlurmAttribution(procfs, a.cgroup_root, a.slurm.job_id,
                                            a.slurm.walk_parents, a.slurm.device_cgroups))
        elif name == "kubernetes":
            from gpuledger.agent.attribution.kubernetes import KubernetesAttribution

            k = a.kubernetes
            client = None
            if k.pod_resources_socket:
                from gpuledger.agent.attribution.podresources import PodResourcesClient

                client = PodResourcesClient(k.pod_resources_socket, k.timeout_s)
            methods.append(KubernetesAttribution(procfs, client, k.job_id,
                                                 tuple(k.resources), k.refresh_s))
        elif name == "mapping_dir":
            from gpuledger.agent.attribution.mapping_dir import MappingDirAttribution

            assert a.mapping_dir.path is not None  # validated
            methods.append(MappingDirAttribution(a.mapping_dir.path))
        elif name == "static":
            from gpuledger.agent.attribution.static import StaticAttribution

            st = a.static
            methods.append(StaticAttribution(st.job_id, st.gpus, st.env))
    return Chain(methods)
