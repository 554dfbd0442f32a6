"""Best fit vs FGD on the openb default trace: GPUs left unallocatable as the cluster fills.

The experiment of Weng et al., "Beware of Fragmentation" (USENIX ATC '23), on the
published trace (``openb_node_list_gpu_node.csv``, ``openb_pod_list_default.csv``):
1,213 nodes with 6,212 GPUs; pods are drawn at random (with replacement, seeded) from the
trace — GPU pods and CPU-only pods alike — and arrive one by one, never leave, until the
GPUs they asked for reach 130 % of the cluster's. Each pod goes where the policy puts it
(CPU and GPU must fit; a shared pod takes ``gpu_milli`` of one GPU, other pods whole
GPUs) or fails. At every 1 % of arrived GPU demand the allocated share of the GPUs is
recorded; the measure is the share left unallocated.

Policies (the placement code of ``gpuledger whatif`` where it applies):

- ``fgd``: ``advisor.fragment.fgd_choice`` — the smallest growth of the expected
  fragment ``F_n(M)``, ``M`` = the trace's GPU pod types (GPUs, milli-GPU, CPU) weighted
  by how often they occur (CPU-only pods too: their CPU can strand a node's GPUs);
- ``best-fit``: the paper's baseline: the node with the least CPU and GPU left after
  placement (each normalised by the largest node, weighted 0.5/0.5), a shared pod on the
  GPU with the least room that fits;
- ``best-fit-gpu``: gpuledger's own best fit (``simulate.scheduler.best_fit``): the node
  with the fewest completely free GPUs that fits, a shared pod on the GPU with the least
  room (then the node with the fewest free GPUs); a CPU-only pod on the node with the
  fewest free GPUs, then the least CPU left.

    python bench/fgd_openb.py --seeds 3
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import polars as pl

from gpuledger.pipeline.advisor.fragment import TaskMix, fgd_choice

# ../shared/data/openb beside the checkout (or beside the main checkout, from a worktree)
DATA = next((d for d in (Path(__file__).resolve().parents[n] / "shared" / "data" / "openb"
                         for n in (2, 3)) if d.is_dir()),
            Path(__file__).resolve().parents[2] / "shared" / "data" / "openb")
MILLI = 1000


class Cluster:
    """Free CPU and free milli-GPU per GPU slot of every node."""

    def __init__(self, nodes: pl.DataFrame) -> None:
        self.gpus = nodes["gpu"].to_numpy().astype(np.int64)
        width = int(self.gpus.max())
        slots = np.arange(width)[None, :] < self.gpus[:, None]
        self.free = np.where(slots, MILLI, 0).astype(np.int64)
        self.cpu = nodes["cpu_milli"].to_numpy().astype(np.float64)
        self.total = int(self.gpus.sum()) * MILLI
        self.max_cpu, self.max_gpu = float(self.cpu.max()), float(width * MILLI)

    def allocated(self) -> float:
        return 1.0 - self.free.sum() / self.total


def _fits(c: Cluster, gpus: int, milli: int, cpu: float) -> np.ndarray:
    ok = c.cpu >= cpu
    if gpus == 0:
        return ok
    if milli < MILLI:
        return ok & (c.free >= milli).any(axis=1)
    return ok & ((c.free == MILLI).sum(axis=1) >= gpus)


def _take(c: Cluster, node: int, slots: list[int], milli: int, cpu: float) -> None:
    c.free[node, slots] -= milli
    c.cpu[node] -= cpu


def _shared_slot(c: Cluster, node: int, milli: int) -> int:
    room = np.where(c.free[node] >= milli, c.free[node], 10 * MILLI)
    return int(np.argmin(room))


def place(policy: str, c: Cluster, gpus: int, milli: int, cpu: float, mix: TaskMix) -> bool:
    """Place one pod; False when it fits nowhere."""
    ok = _fits(c, gpus, milli, cpu)
    cand = np.flatnonzero(ok)
    if cand.size == 0:
        return False
    if policy == "fgd":  # CPU-only pods too: where the fragment grows least
        node, slots = fgd_choice(c.free, c.gpus, cand, gpus, milli if gpus else MILLI, MILLI,
                                 mix, c.cpu, cpu)
        _take(c, node, slots, milli, cpu)
        return True
    if policy == "best-fit":
        gpu_left = c.free[cand].sum(axis=1) - gpus * milli
        score = 0.5 * (c.cpu[cand] - cpu) / c.max_cpu + 0.5 * gpu_left / c.max_gpu
        node = int(cand[np.argmin(score)])
    else:  # best-fit-gpu
        whole = (c.free[cand] == MILLI).sum(axis=1)
        if gpus == 0:  # no GPU asked: the node with the fewest free GPUs, least CPU left
            node = int(cand[np.lexsort((cand, c.cpu[cand], c.free[cand].sum(axis=1)))[0]])
        elif milli < MILLI:
            room = np.where(c.free[cand] >= milli, c.free[cand], 10 * MILLI).min(axis=1)
            node = int(cand[np.lexsort((cand, whole, room))[0]])
        else:
            node = int(cand[np.lexsort((cand, whole))[0]])
    if gpus == 0:
        slots = []
    elif milli < MILLI:
        slots = [_shared_slot(c, node, milli)]
    else:
        slots = np.flatnonzero(c.free[node] == MILLI)[:gpus].tolist()
    _take(c, node, slots, milli, cpu)
    return True


def run(policy: str, nodes: pl.DataFrame, pods: pl.DataFrame, mix: TaskMix, seed: int,
        inflate: float) -> list[float]:
    """Allocated GPU share at each 1 % of arrived GPU demand (index = percent)."""
    c = Cluster(nodes)
    rng = np.random.default_rng(seed)
    gpus = pods["num_gpu"].to_numpy()
    milli = pods["gpu_milli"].to_numpy()
    cpu = pods["cpu_milli"].to_numpy().astype(np.float64)
    curve = [0.0]
    arrived = 0
    while arrived < inflate * c.total:
        i = int(rng.integers(pods.height))
        g, m = int(gpus[i]), int(milli[i]) if gpus[i] > 0 else 0
        demand = m if (g == 1 and m < MILLI) else g * MILLI
        place(policy, c, g, min(m, MILLI), float(cpu[i]), mix)
        arrived += demand
        while len(curve) <= 100 * arrived / c.total and len(curve) <= 100 * inflate:
            curve.append(c.allocated())
    return curve


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DATA, help="folder of the openb CSVs")
    ap.add_argument("--seeds", type=int, default=3, help="runs per policy (seeds 42, 43, …)")
    ap.add_argument("--inflate", type=float, default=1.3,
                    help="arrived GPU demand, as a share of capacity (default 1.3)")
    ap.add_argument("--policies", default="best-fit,best-fit-gpu,fgd")
    args = ap.parse_args()
    nodes = pl.read_csv(args.data / "openb_node_list_gpu_node.csv").filter(pl.col("gpu") > 0)
    pods = pl.read_csv(args.data / "openb_pod_list_default.csv")
    gpu_pods = pods.filter(pl.col("num_gpu") > 0)
    mix = TaskMix.of([(int(g), int(min(m, MILLI)) if g == 1 else MILLI)
                      for g, m in gpu_pods.select("num_gpu", "gpu_milli").iter_rows()],
                     MILLI, gpu_pods["cpu_milli"].cast(pl.Float64).to_list())
    total = int(nodes["gpu"].sum())
    print(f"# openb default trace: {nodes.height:,} nodes, {total:,} GPUs, {pods.height:,} "
          f"pods ({gpu_pods.height:,} with GPUs); {mix.gpus.size} GPU pod types; "
          f"arrivals to {args.inflate:.0%} of GPU capacity; seeds 42…{41 + args.seeds}\n")
    print("| policy | unallocated GPUs at 100 % arrived | at 130 % (± sd over seeds) "
          "| GPUs at 130 % | s per run |")
    print("|---|---:|---:|---:|---:|")
    results: dict[str, np.ndarray] = {}
    for policy in args.policies.split(","):
        curves, spent = [], []
        for seed in range(42, 42 + args.seeds):
            t0 = time.monotonic()
            curves.append(run(policy, nodes, pods, mix, seed, args.inflate))
            spent.append(time.monotonic() - t0)
        arr = np.array([cv[: int(100 * args.inflate) + 1] for cv in curves])
        results[policy] = 1.0 - arr
        un = 100 * (1.0 - arr)
        last = un[:, -1]
        print(f"| {policy} | {un[:, 100].mean():.2f} % | {last.mean():.2f} % "
              f"(±{last.std():.2f}) | {last.mean() / 100 * total:.0f} | {np.mean(spent):.0f} |")
    if "fgd" in results and "best-fit" in results:
        for base in ("best-fit", "best-fit-gpu"):
            if base in results:
                cut = 1 - results["fgd"][:, -1].mean() / results[base][:, -1].mean()
                print(f"\nFGD leaves {cut:.0%} fewer GPUs unallocated than {base} at the end "
                      f"({(results[base][:, -1].mean() - results['fgd'][:, -1].mean()) * total:.0f}"
                      f" GPUs).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
