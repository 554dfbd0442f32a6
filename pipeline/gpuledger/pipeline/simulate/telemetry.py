"""Vectorised telemetry synthesis: one row per GPU per sample, whole chunks at a time.

For a chunk of sample times the synthesiser

1. expands the GPU *occupancy segments* of the schedule (one per attempt and GPU, plus
   processes outside the scheduler) into occupancy rows (sample, GPU, segment) with
   ``numpy.repeat`` — no Python loop over samples;
2. evaluates each segment's *profile* on those rows (activity, memory, PCIe/NVLink
   traffic, DCGM ratios), see :func:`profile_activity`;
3. sums the rows of each (sample, GPU) cell with ``numpy.bincount`` (fractional GPUs can
   host several jobs) and derives power, temperature and SM clock from the activity;
4. builds the ``processes`` list column from the occupancy rows with Arrow offsets.

Profiles (``tau`` = seconds since the attempt started):

- ``training``/``finetune``: ``base`` (0.86–0.95 / 0.72–0.86) with small noise, a
  2-minute start-up at ~0.05, and a 1-minute dip to ~0.05 after every checkpoint.
- ``dataloader_bound``: saw-tooth from 0.05 up to ``base`` over ``period`` (60–150 s),
  mean ~0.3, with heavy PCIe receive traffic when the GPU starves.
- ``notebook``: mostly idle (< 1 %), 5-minute bursts in ~4 % of the blocks; jobs with
  ``no_process_s`` show no process and no memory until the kernel starts.
- ``evaluation``: ``base`` for 70 % of each ``period`` (300–900 s), ~0.03 in between.
- ``inference``: follows a daily load curve (low at 04:00 UTC, peak at 16:00 UTC) up
  to ``base`` (0.45–0.65), the rest being reserved headroom; memory grows with load.
- ``oversized``: moderate activity, memory use 5–18 % of the card.
- ``memory_bound``: steady low SM activity (0.15–0.25) with DRAM 4 × as busy (capped
  at 1): small kernels waiting on memory.
- ``comm_bound``: steady low SM activity (0.15–0.25); a multi-GPU attempt moves about
  1.2 TB/s × activity over NVLink (or 140 GB/s × activity over PCIe): GPUs waiting on
  each other.
- outside-the-scheduler processes: constant activity, ``job_id`` null.

Free GPUs report ~0 activity and 4 MiB of memory; unhealthy GPUs report
``healthy = false`` (``xid_errors = 1`` on the first sample after the XID); nodes that
are down send nothing. H100/A100-class nodes (``dcgm: true``) report the DCGM ratios
``sm_active``, ``sm_occupancy``, ``tensor_active`` and ``dram_active``; the others report
only ``util_gpu``. NVLink counters exist only on NVLink nodes.
"""

from __future__ import annotations

import numpy as np
import polars as pl
import pyarrow as pa

from gpuledger.pipeline.columns import conform, empty_frame
from gpuledger.pipeline.simulate.cluster import PROFILES
from gpuledger.pipeline.simulate.layout import Layout
from gpuledger.pipeline.simulate.scheduler import WHOLE, Schedule
from gpuledger.pipeline.simulate.workload import Job

KINDS = (*PROFILES, "outside")
KIND = {name: i for i, name in enumerate(KINDS)}
STARTUP_S = 120.0
DIP_S = 60.0
BURST_BLOCK_S = 300.0
IDLE_MEM_MIB = 4.0

# Per kind (order of KINDS): DCGM ratios relative to sm_active, and traffic at full load
# (PCIe on multi-GPU attempts only for comm_bound, whose GPUs talk over it).
SM_OCCUPANCY = np.array([0.55, 0.50, 0.45, 0.30, 0.50, 0.35, 0.40, 0.20, 0.30, 0.30])
TENSOR = np.array([0.65, 0.55, 0.45, 0.20, 0.40, 0.45, 0.35, 0.15, 0.30, 0.10])
DRAM = np.array([0.45, 0.40, 0.30, 0.15, 0.50, 0.60, 0.30, 4.00, 0.30, 0.30])
PCIE_RX = np.array([1.5e9, 1.0e9, 0.5e9, 0.05e9, 3.0e9, 0.4e9, 1.0e9, 0.5e9, 1.0e9, 0.5e9])
PCIE_TX = np.array([0.3e9, 0.2e9, 0.2e9, 0.02e9, 0.3e9, 0.4e9, 0.2e9, 0.1e9, 0.2e9, 0.1e9])
NVLINK = np.array([60e9, 30e9, 20e9, 0.0, 5e9, 2e9, 10e9, 10e9, 1.2e12, 0.0])
PCIE_PEER = np.array([0.0] * 8 + [1.4e11, 0.0])
STARTUP_KINDS = np.array(
    [k in ("training", "finetune", "dataloader_bound", "evaluation", "oversized",
           "memory_bound", "comm_bound") for k in KINDS]
)


def daily_load(hour_of_day: np.ndarray) -> np.ndarray:
    """Inference load in [0, 1]: 0 at 04:00 UTC, 1 at 16:00 UTC."""
    return np.asarray(0.5 - 0.5 * np.cos(2.0 * np.pi * (hour_of_day - 4.0) / 24.0))


def profile_activity(
    kind: np.ndarray,
    tau: np.ndarray,
    hour: np.ndarray,
    base: np.ndarray,
    period: np.ndarray,
    phase: np.ndarray,
    checkpoint: np.ndarray,
    job: np.ndarray,
    noise: np.ndarray,
) -> np.ndarray:
    """Activity (0–1) of occupancy rows, by profile; all arguments are aligned arrays."""
    act = np.clip(base + 0.02 * noise, 0.0, 1.0)  # training, finetune, oversized, outside
    safe_period = np.where(period > 0, period, 1.0)
    cycle = np.mod(tau + phase, safe_period) / safe_period
    is_loader = kind == KIND["dataloader_bound"]
    act = np.where(is_loader, 0.05 + (base - 0.05) * cycle + 0.03 * noise, act)
    is_eval = kind == KIND["evaluation"]
    act = np.where(is_eval, np.where(cycle < 0.7, act, 0.03 + 0.01 * noise), act)
    is_infer = kind == KIND["inference"]
    load = daily_load(hour)
    act = np.where(is_infer, 0.12 + (base - 0.12) * load + 0.04 * noise, act)
    is_notebook = kind == KIND["notebook"]
    block = np.floor((tau + phase) / BURST_BLOCK_S).astype(np.int64)
    draw = ((block * 2654435761 + job * 97531 + 12345) % 1000) / 1000.0
    act = np.where(is_notebook, np.where(draw < 0.04, act, 0.004 * np.abs(noise)), act)
    ckpt = checkpoint > 0
    in_dip = ckpt & (tau >= checkpoint) & (np.mod(tau, np.where(ckpt, checkpoint, 1.0)) < DIP_S)
    act = np.where(in_dip, 0.05 + 0.01 * noise, act)
    starting = STARTUP_KINDS[kind] & (tau < STARTUP_S)
    act = np.where(starting, 0.05 + 0.01 * noise, act)
    return np.asarray(np.clip(act, 0.0, 1.0))


class TelemetrySynth:
    """Synthesises telemetry chunk by chunk, in time order (``seq`` carries over)."""

    def __init__(
        self,
        schedule: Schedule,
        jobs: list[Job],
        layout: Layout,
        *,
        seed: int,
        origin_ms: int,
        origin_day_s: int,
        interval_s: int,
    ) -> None:
        self.layout = layout
        self.seed = seed
        self.origin_ms = origin_ms
        self.origin_day_s = origin_day_s
        self.interval_s = interval_s
        self.start_s = schedule.start_s
        self.end_s = schedule.end_s
        self.node_seq = np.zeros(layout.node_count, dtype=np.int64)
        seg = schedule.segments
        self.seg = seg
        is_job = seg.job >= 0
        jx = np.where(is_job, seg.job, 0)

        def per_job(values: list[float]) -> np.ndarray:
            arr = np.array(values, dtype=np.float64)
            return arr[jx] if arr.size else np.zeros(len(jx))

        self.kind = np.where(
            is_job, per_job([KIND[j.profile] for j in jobs]), KIND["outside"]
        ).astype(np.int64)
        self.base = np.where(is_job, per_job([j.base_activity for j in jobs]), seg.activity)
        card_mem = layout.gpu_mem_mib[seg.gpu]
        share = card_mem * seg.units / WHOLE
        need = np.where(is_job, per_job([j.mem_need_mib for j in jobs]), 0.2 * card_mem)
        self.mem = np.minimum(need, 0.98 * share)
        self.period = np.where(is_job, per_job([j.period_s for j in jobs]), 0.0)
        self.phase = np.where(is_job, per_job([j.phase_s for j in jobs]), 0.0)
        self.checkpoint = np.where(is_job, per_job([float(j.checkpoint_s) for j in jobs]), 0.0)
        self.no_process = np.where(is_job, per_job([float(j.no_process_s) for j in jobs]), 0.0)
        self.multi = np.where(is_job, per_job([float(j.gpus > 1) for j in jobs]), 0.0) > 0
        local = layout.gpu_local[seg.gpu]
        self.pid = np.where(
            is_job,
            10_000 + ((seg.job * 61 + seg.attempt * 17) % 400_000) * 8 + local % 8,
            4_000_000 + seg.gpu,
        )
        ids = [j.job_id for j in jobs]
        self.job_ids = pa.array([*ids, None], type=pa.string())
        self.job_ref = np.where(is_job, seg.job, len(ids))
        self.down = schedule.down
        self.unhealthy = schedule.unhealthy
        self.node_series = pl.Series(list(layout.node_names), dtype=pl.String)
        self.card_series = pl.Series(list(layout.node_card), dtype=pl.String)
        self.uuid_series = pl.Series(list(layout.gpu_uuid), dtype=pl.String)

    def chunk(self, index: int, lo_s: int, hi_s: int) -> pl.DataFrame:
        """Telemetry for samples at ``lo_s <= t < hi_s`` (seconds since the origin)."""
        dt = self.interval_s
        k0 = -(-(lo_s - self.start_s) // dt)
        k1 = -(-(min(hi_s, self.end_s) - self.start_s) // dt)
        if k1 <= k0:
            return empty_frame("telemetry")
        lay = self.layout
        n_gpu = lay.gpu_count
        times = self.start_s + np.arange(k0, k1, dtype=np.int64) * dt
        n_k = times.size
        rng = np.random.default_rng([self.seed, 3, index])

        # 1. occupancy rows
        seg = self.seg
        live = np.flatnonzero((seg.start_s <= times[-1]) & (seg.end_s > times[0]))
        first = np.clip(-(-(seg.start_s[live] - times[0]) // dt), 0, n_k)
        last = np.clip(-(-(seg.end_s[live] - times[0]) // dt), 0, n_k)
        count = last - first
        occ = np.repeat(live, count)
        offsets = np.repeat(np.cumsum(count) - count, count)
        occ_k = np.repeat(first, count) + (np.arange(occ.size) - offsets)
        cell = occ_k * n_gpu + seg.gpu[occ]
        order = np.argsort(cell, kind="stable")
        occ, occ_k, cell = occ[order], occ_k[order], cell[order]
        occ_t = times[occ_k]

        # 2. profiles
        tau = (occ_t - seg.start_s[occ]).astype(np.float64)
        hour = ((occ_t + self.origin_day_s) % 86_400) / 3600.0
        kind = self.kind[occ]
        noise = rng.standard_normal(occ.size)
        act = profile_activity(
            kind,
            tau,
            hour,
            self.base[occ],
            self.period[occ],
            self.phase[occ],
            self.checkpoint[occ],
            np.where(seg.job[occ] >= 0, seg.job[occ], 0),
            noise,
        )
        has_proc = tau >= self.no_process[occ]
        act = np.where(has_proc, act, 0.0)
        ramp = np.minimum(1.0, tau / 90.0 + 0.05)
        mem = self.mem[occ] * ramp * (1.0 + 0.01 * noise)
        mem = np.where(kind == KIND["inference"], mem * (0.85 + 0.15 * daily_load(hour)), mem)
        mem = np.where(has_proc, np.round(mem), 0.0)
        loader = kind == KIND["dataloader_bound"]
        rx = np.where(loader, 0.5e9 + 5.0e9 * (1.0 - act), PCIE_RX[kind] * act)
        tx = PCIE_TX[kind] * act
        nvl = np.where(self.multi[occ], NVLINK[kind] * act, 0.0)
        # GPUs without NVLink talk over PCIe (only comm_bound has peer traffic)
        peer = np.where(self.multi[occ] & ~lay.gpu_nvlink[seg.gpu[occ]],
                        PCIE_PEER[kind] * act, 0.0)
        rx, tx = rx + peer / 2, tx + peer / 2

        # 3. cells
        size = n_k * n_gpu

        def total(weights: np.ndarray) -> np.ndarray:
            out: np.ndarray = np.bincount(cell, weights=weights, minlength=size)
            return out

        a = np.clip(total(act), 0.0, 1.0)
        occupancy = np.clip(total(act * SM_OCCUPANCY[kind]), 0.0, 1.0)
        tensor = np.clip(total(act * TENSOR[kind]), 0.0, 1.0)
        dram = np.clip(total(act * DRAM[kind]), 0.0, 1.0)
        mem_used = IDLE_MEM_MIB + total(mem)
        cell_noise = rng.standard_normal((4, size))
        pcie_rx = total(rx) + 2e4 * np.abs(cell_noise[0])
        pcie_tx = total(tx) + 1e4 * np.abs(cell_noise[1])
        nvlink = total(nvl)

        gpu = np.tile(np.arange(n_gpu), n_k)
        node = lay.gpu_node[gpu]
        healthy, xid = self._health(times, n_k)
        tdp, idle = lay.gpu_tdp_w[gpu], lay.gpu_idle_w[gpu]
        power = idle + a * (tdp - idle) * 0.95 + 0.01 * tdp * cell_noise[2]
        power = np.maximum(np.round(power, 1), 0.0)
        temp = np.round(30.0 + 45.0 * a + cell_noise[3], 1)
        clock = np.where(
            a > 0.02, np.round(lay.gpu_max_clock[gpu] * (1.0 - 0.04 * a)), lay.gpu_idle_clock[gpu]
        )
        dcgm = lay.gpu_dcgm[gpu]
        util = np.where(dcgm, np.minimum(1.0, a * 1.15 + 0.03 * (a > 0.005)), a)
        util = np.clip(np.round(100.0 * util), 0.0, 100.0)
        ecc_sbe = (rng.random(size) < 2e-5).astype(np.int64)

        # 4. rows to emit (nodes that are down send nothing) and their seq
        up = self._node_up(times, n_k)
        keep = up[np.arange(size) // n_gpu, node]
        seq = self._seq(up, gpu, node, n_k)

        proc_cells = cell[has_proc]
        counts = np.bincount(proc_cells, minlength=size)
        if counts[~keep].any():
            raise AssertionError("processes on a node that is down")
        proc_offsets = np.concatenate([[0], np.cumsum(counts[keep])]).astype(np.int32)
        structs = pa.StructArray.from_arrays(
            [
                pa.array(self.pid[occ][has_proc], type=pa.int64()),
                pa.array(mem[has_proc], type=pa.float64()),
                self.job_ids.take(pa.array(self.job_ref[occ][has_proc])),
            ],
            names=["pid", "used_mib", "job_id"],
        )
        processes = pl.Series("processes", pa.ListArray.from_arrays(proc_offsets, structs))

        def col(name: str, values: np.ndarray, present: np.ndarray | None = None) -> pl.Series:
            v = values[keep]
            if present is None:
                return pl.Series(name, v)
            return pl.Series(name, np.where(present[keep], v, np.nan), nan_to_null=True)

        time_ms = self.origin_ms + times[np.arange(size) // n_gpu] * 1000
        gpu_kept = gpu[keep]
        node_kept = node[keep]
        frame = pl.DataFrame(
            [
                pl.Series("v", np.ones(gpu_kept.size, dtype=np.int64)),
                pl.Series("type", ["telemetry"], dtype=pl.String).gather(
                    np.zeros(gpu_kept.size, dtype=np.int64)
                ),
                pl.Series("time", time_ms[keep])
                .cast(pl.Datetime("ms"))
                .dt.replace_time_zone("UTC"),
                self.node_series.gather(node_kept).alias("node"),
                col("seq", seq),
                self.node_series.gather(node_kept).alias("agent"),
                pl.Series("gpu_index", lay.gpu_local[gpu_kept]),
                self.uuid_series.gather(gpu_kept).alias("gpu_uuid"),
                self.card_series.gather(node_kept).alias("card_type"),
                col("util_gpu", util),
                col("sm_active", np.round(a, 4), dcgm),
                col("sm_occupancy", np.round(occupancy, 4), dcgm),
                col("tensor_active", np.round(tensor, 4), dcgm),
                col("dram_active", np.round(dram, 4), dcgm),
                col("mem_used_mib", mem_used),
                col("mem_total_mib", lay.gpu_mem_mib[gpu]),
                col("power_w", power),
                col("temp_c", temp),
                col("sm_clock_mhz", clock),
                col("pcie_rx_bytes_s", np.round(pcie_rx)),
                col("pcie_tx_bytes_s", np.round(pcie_tx)),
                col("nvlink_rx_bytes_s", np.round(nvlink), lay.gpu_nvlink[gpu]),
                col("nvlink_tx_bytes_s", np.round(nvlink * 0.98), lay.gpu_nvlink[gpu]),
                col("xid_errors", xid),
                col("ecc_sbe", ecc_sbe),
                col("ecc_dbe", np.zeros(size, dtype=np.int64)),
                col("healthy", healthy),
                processes,
            ]
        )
        return conform(frame, "telemetry")

    def _health(self, times: np.ndarray, n_k: int) -> tuple[np.ndarray, np.ndarray]:
        n_gpu = self.layout.gpu_count
        healthy = np.ones((n_k, n_gpu), dtype=bool)
        xid = np.zeros((n_k, n_gpu), dtype=np.int64)
        for g, t0, t1 in self.unhealthy:
            rows = (times >= t0) & (times < t1)
            healthy[rows, g] = False
            if rows.any() and times[rows][0] - t0 < self.interval_s:
                xid[np.flatnonzero(rows)[0], g] = 1
        return healthy.ravel(), xid.ravel()

    def skip(self, lo_s: int, hi_s: int) -> None:
        """What :meth:`chunk` leaves behind for ``lo_s <= t < hi_s`` (the nodes' sequence
        numbers) without synthesising it."""
        dt = self.interval_s
        k0 = -(-(lo_s - self.start_s) // dt)
        k1 = -(-(min(hi_s, self.end_s) - self.start_s) // dt)
        if k1 <= k0:
            return
        times = self.start_s + np.arange(k0, k1, dtype=np.int64) * dt
        up = self._node_up(times, times.size)
        self.node_seq += (up * self.layout.node_gpus[None, :]).sum(axis=0)

    def _node_up(self, times: np.ndarray, n_k: int) -> np.ndarray:
        up = np.ones((n_k, self.layout.node_count), dtype=bool)
        for n, t0, t1 in self.down:
            up[(times >= t0) & (times < t1), n] = False
        return up

    def _seq(self, up: np.ndarray, gpu: np.ndarray, node: np.ndarray, n_k: int) -> np.ndarray:
        """Per-node sequence numbers: +1 per emitted row, carried across chunks."""
        lay = self.layout
        rows_per_sample = up * lay.node_gpus[None, :]
        before = np.cumsum(rows_per_sample, axis=0) - rows_per_sample  # rows earlier in chunk
        k = np.repeat(np.arange(n_k), lay.gpu_count)
        seq = self.node_seq[node] + before[k, node] + lay.gpu_local[gpu]
        self.node_seq += rows_per_sample.sum(axis=0)
        out: np.ndarray = seq
        return out
