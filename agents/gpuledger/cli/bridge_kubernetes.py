"""``gpuledger bridge kubernetes``: the Kubernetes/Kueue bridge (docs/kubernetes.md)."""

from __future__ import annotations

import argparse
import copy
import sys
from dataclasses import replace
from typing import Any

from gpuledger.cli.errors import CliError

TRANSLATOR_PARTS = ("jobs", "pods", "nodes", "workloads")


def _shape_problem(doc: dict[str, Any], config: Any) -> str | None:
    """Why a saved Kubernetes state cannot be resumed from, or None."""
    from gpuledger.bridges.kubernetes.translate import Translator

    versions = doc.get("resource_versions") or {}
    if not isinstance(versions, dict) or not all(
            isinstance(v, str) for v in versions.values()):
        return "resource_versions: expected an object of strings"
    saved = doc.get("translator") or {}
    if not isinstance(saved, dict):
        return "translator: expected an object"
    for part in TRANSLATOR_PARTS:
        entries = saved.get(part, {})
        if not isinstance(entries, dict) or not all(
                isinstance(e, dict) for e in entries.values()):
            return f"translator.{part}: expected an object of objects"
    try:  # read it as the bridge will, on a copy
        Translator(config.mapping, config.options, state=copy.deepcopy(saved)).tick()
    except (AttributeError, KeyError, TypeError, ValueError, IndexError) as exc:
        return f"translator: an entry of the wrong shape ({type(exc).__name__}: {exc})"
    return None


def check_state(args: argparse.Namespace, config: Any, helpers: Any) -> None:
    """The ``--state`` file is a Kubernetes bridge state the bridge can resume from:
    checked before anything (``--out``, the spool) is created."""
    problem = _shape_problem(helpers.check_state(args), config)
    if problem:
        raise CliError(f"--state {args.state}: not a Kubernetes bridge state file "
                       f"({problem})")


def unsent_note(unsent: int, sink: Any) -> str:
    """The exit summary's note on records still in the Kafka spool (the Slurm bridge's
    wording, docs/slurm.md); empty when none are."""
    if not unsent:
        return ""
    return (f"; {unsent} record(s) spooled in {sink.spool.folder}, not sent to Kafka yet "
            "(the next run sends them)")


class FlushAtClose:
    """With ``--once``: the records go to Kafka once, at close — one bounded wait when
    Kafka is unreachable, not one per resource listed. The spool holds them meanwhile."""

    def __init__(self, sink: Any) -> None:
        self.sink = sink
        self.spool = getattr(sink, "spool", None)

    def position(self) -> int:
        return int(self.sink.position())

    def complete(self, start: int, records: list[dict[str, Any]]) -> None:
        self.sink.complete(start, records)

    def flush(self) -> None:
        return None

    def close(self) -> None:
        self.sink.close()


def cmd_bridge_kubernetes(args: argparse.Namespace, helpers: Any) -> int:
    from gpuledger.bridges.kubernetes.api import ApiClient, ApiError
    from gpuledger.bridges.kubernetes.bridge import Bridge
    from gpuledger.bridges.kubernetes.config import ConfigError, connection, load_config
    from gpuledger.bridges.state import StateError

    helpers._logging(args.quiet)
    try:
        config = replace(load_config(args.config), state_file=args.state)
        client = ApiClient(connection(config), request_timeout_s=config.request_timeout_s)
    except (ConfigError, ValueError) as exc:
        raise CliError(f"config: {exc}") from None
    check_state(args, config, helpers)
    sink = helpers.open_sink(args)
    if args.once:
        sink = FlushAtClose(sink)
    try:
        bridge = Bridge(config, client, sink)
    except (StateError, ValueError) as exc:
        raise CliError(f"state: {exc}") from None
    s = bridge.stats
    server = helpers.serve_metrics(args, "kubernetes", lambda: {
        "lists": sum(s.lists.values()), "relists": sum(s.relists.values()),
        "watch_events": sum(s.events.values()), "records": s.records})
    try:
        if args.once:
            bridge.sync()
        else:
            bridge.run(helpers.stop_on_signals())
    except (OSError, ApiError) as exc:
        raise CliError(f"cannot read the Kubernetes API at {client.connection.server}: "
                       f"{exc}") from None
    finally:
        sink.close()
        if server is not None:
            server.close()
    unsent = helpers.unsent_records(sink)
    print(f"kubernetes bridge: {s.records} records; lists {s.lists}, relists after 410 "
          f"{s.relists}, resumed watches {s.resumes}, watch events {s.events}"
          + (f", malformed answers {s.malformed}" if s.malformed else "")
          + unsent_note(unsent, sink), file=sys.stderr)
    return 1 if args.once and unsent else 0


def register(bridges: Any, helpers: Any) -> None:
    q = bridges.add_parser(
        "kubernetes", help="watch Pods, Nodes and Kueue Workloads of a Kubernetes cluster",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="""\
Watch a Kubernetes cluster and emit contract v1 records (docs/kubernetes.md):

  Nodes with GPUs           → inventory (card type from nvidia.com/gpu.product, GPU count,
                              memory, pool label; cordon/taints → schedulable; Ready and
                              allocatable GPUs → health)
  Kueue Workloads           → jobs kueue/NAMESPACE/NAME: submitted at creation, started at
                              admission (queue wait = admission − creation) with the GPUs
                              of their bound pods, preempted/requeued on eviction,
                              finished/failed at Finished
  GPU pods of no Workload   → jobs NAMESPACE/POD (requests of nvidia.com/gpu and MIG
                              resources nvidia.com/mig-*)

Lists, then watches with resourceVersions; resumes cut watches, lists again after
410 Gone and emits only what it had not emitted. --config FILE holds a `kubernetes:`
section (server, kubeconfig, token/CA files, kueue, gpu_index_annotation, timeouts) and
the shared `mapping:` section (docs/mapping.md); without `server` the bridge uses the
in-cluster service account, or `kubernetes.kubeconfig`. The RBAC it needs is in
deploy/kubernetes/clusterrole.yaml.

examples:
  gpuledger bridge kubernetes --config k8s.yaml --out events.jsonl --once
  gpuledger bridge kubernetes --config k8s.yaml --kafka kafka:9092 \\
      --state /var/lib/gpuledger/k8s.state
""")
    helpers.output_options(
        q, "gpuledger-kubernetes-bridge.state", polls=False,
        config_help="YAML with a `kubernetes:` section (server, kubeconfig, token and CA "
        "files, kueue, timeouts; docs/kubernetes.md) and the shared `mapping:` section "
        "(docs/mapping.md); default: the in-cluster service account, identity mapping")
    q.set_defaults(func=lambda args: cmd_bridge_kubernetes(args, helpers))
