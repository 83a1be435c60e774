"""Benchmark jobs: one multi-rank job per case, and every figure it yields (JSON-able).

One sync job is one fresh ``RankPool`` that runs, in this order:

1. the strategy under test (``train_rank``, the one training loop) — first, so the process's
   peak memory (max RSS on CPU, the allocator peak on CUDA) is the strategy's own;
2. the ``local`` strategy (no sync) on the same ranks: the compute floor. *Exposed sync* is the
   strategy's median step minus this one's, both from the same job;
   (1 and 2 alternate ``rounds`` times, so drifting machine load hits both alike);
3. one step of the strategy again, to read its exact per-step costs (collectives, bytes on the
   wire, host syncs) off the live layout with ``openclaw_ref.arms.costs.step_cost``;
4. a raw flat allreduce of those bytes in the wire dtype: time, algbw = bytes / time and
   busbw = algbw × 2(n−1)/n (nccl-tests' allreduce definition).

A seed-004 job runs the training loop alone (claim L3's table). Medians exclude the first two
steps (the training loop's warm-up rule, ``figures.WARMUP_STEPS``).
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from dataclasses import dataclass

from openclaw_ref.arms.config import ArmConfig
from openclaw_ref.bench.figures import (
    WARMUP_STEPS,
    algbw_gbps,
    busbw_gbps,
    costs_from_probe,
    sync_figures,
    timed_steps,
)
from openclaw_ref.bench.rank_tasks import cost_probe_rank, raw_allreduce_rank
from openclaw_ref.bench.settings import (
    PRECISIONS,
    WIRE_DTYPES,
    BenchSettings,
    backend_for,
    sync_config_for,
)
from openclaw_ref.core.launch import LaunchConfig, RankPool


@dataclass(frozen=True)
class Case:
    """One benchmark cell: a strategy label (or a seed-004 precision) at a world size."""

    kind: str  # "sync" or "seed004"
    label: str
    world_size: int
    backend: str

    @property
    def key(self) -> str:
        return f"{self.kind}-{self.label}-w{self.world_size}-{self.backend}"


def _train_config(settings: BenchSettings, world_size: int, backend: str, sync: ArmConfig,
                  amp: str | None = None):
    """The training run of a benchmark. Validation is cut to one sample: the loop always ends
    with a validation forward, and on the full split that forward would cost more than the
    timed steps and set every rank's peak memory, hiding the strategies' differences."""
    from openclaw_ref.core.data import DataConfig
    from openclaw_ref.core.train import TrainConfig

    return TrainConfig(preset=settings.preset, world_size=world_size, steps=settings.steps,
                       global_batch=settings.global_batch, seed=settings.seed, eval_every=0,
                       sync=sync, data=DataConfig(n_val=1), backend=backend,
                       timeout_s=settings.timeout_s, progress=False, amp=amp)


def _pool(world_size: int, backend: str, settings: BenchSettings) -> RankPool:
    return RankPool(LaunchConfig(world_size, backend=backend, timeout_s=settings.timeout_s,
                                 pg_timeout_s=120.0, threads_per_rank=settings.threads or None))


def run_sync_case(label: str, world_size: int, backend: str, settings: BenchSettings,
                  pool: RankPool | None = None) -> dict:
    """Run one (strategy, world size) job and return every figure it yields (JSON-able).

    ``pool``: run on these ranks instead of a fresh pool (tests do, to reuse their pools);
    the peak-memory figure then includes whatever those processes held before."""
    from openclaw_ref.core.train import train_rank

    sync = sync_config_for(label)
    backend = backend_for(world_size, backend, settings)
    wire = "fp16" if sync.name == "ddp-fp16" else sync.harden.wire
    train_cfg = _train_config(settings, world_size, backend, sync)
    own = pool is None
    pool = pool or _pool(world_size, backend, settings)
    records, floors = [], []
    try:
        t0 = time.perf_counter()
        for _ in range(settings.rounds):  # alternate, so drift in machine load hits both alike
            records.append(pool.run(train_rank, train_cfg)[0])
            floors.append(pool.run(train_rank, _train_config(settings, world_size, backend,
                                                             ArmConfig(name="local")))[0])
        costs = costs_from_probe(pool.run(cost_probe_rank, train_cfg)[0], settings.preset,
                                 wire, settings.seed)
        # the same bytes as one flat buffer, in the wire dtype
        numel = max(1, costs["wire_bytes_per_step"] // WIRE_DTYPES[wire].itemsize)
        raw_ms = pool.run(raw_allreduce_rank, numel, wire, settings.raw_iters)[0]
        job_s = time.perf_counter() - t0
    finally:
        if own:
            pool.close()
    timed, floor_timed = timed_steps(records), timed_steps(floors)
    step_ms, floor_ms = statistics.median(timed), statistics.median(floor_timed)
    summary = records[0]["summary"]  # the first run: its peak memory is the strategy's own
    raw = statistics.median(raw_ms)
    nbytes = numel * WIRE_DTYPES[wire].itemsize
    algbw = algbw_gbps(nbytes, raw / 1e3)
    exposed = step_ms - floor_ms
    figures = {
        "kind": "sync", "strategy": label, "world_size": world_size, "backend": backend,
        "sync_config": dataclasses.asdict(sync),
        "median_step_ms": step_ms,
        "local_median_step_ms": floor_ms,
        "exposed_sync_ms": exposed,
        "step_ms_cv": statistics.pstdev(timed) / statistics.mean(timed) if len(timed) > 1
        else 0.0,
        "peak_memory_mb": max(summary["peak_memory_mb"]),
        "peak_memory_mb_per_rank": summary["peak_memory_mb"],
        "replicas_equal": all(r["summary"]["replicas_equal"] for r in records),
        "skipped_step_rate": sum(r["summary"]["skipped_steps"] for r in records)
        / sum(len(r["steps"]) for r in records),
        "events": sum(len(r["events"]) for r in records),
        "raw_allreduce_ms": raw,
        "raw_allreduce_bytes": nbytes,
        "raw_allreduce_dtype": wire,
        "raw_algbw_gbps": algbw if world_size > 1 else None,
        "raw_busbw_gbps": busbw_gbps(algbw, world_size) if world_size > 1 else None,
        "sync_over_raw": exposed / raw if world_size > 1 and raw > 0 else None,
        "step_ms": [[s["step_ms"] for s in r["steps"]] for r in records],
        "local_step_ms": [[s["step_ms"] for s in r["steps"]] for r in floors],
        "job_s": job_s,
        "pool_reused": not own,
    }
    figures.update(sync_figures([s for r in records for s in r["steps"][WARMUP_STEPS:]],
                                warmup=0))
    figures.update(costs)
    return figures


def run_seed004_case(precision: str, world_size: int, backend: str, settings: BenchSettings,
                     pool: RankPool | None = None) -> dict:
    """Seed 004's table (claim L3): s/iter and peak memory per rank. One rank runs without a
    wrapper (``local``: the single-device flow), N ranks run DDP. AMP is bf16 autocast on CPU
    and fp16 on GPU, as in the seed's ``precision=16``."""
    from openclaw_ref.core.train import train_rank

    if precision not in PRECISIONS:
        raise NotImplementedError(f"no precision {precision!r}; choose one of {PRECISIONS}")
    backend = backend_for(world_size, backend, settings)
    amp = None if precision == "fp32" else ("fp16" if backend == "nccl" else "bf16")
    sync = ArmConfig(name="local" if world_size == 1 else "ddp")
    own = pool is None
    pool = pool or _pool(world_size, backend, settings)
    train_cfg = _train_config(settings, world_size, backend, sync, amp)
    try:
        records = [pool.run(train_rank, train_cfg)[0] for _ in range(settings.rounds)]
    finally:
        if own:
            pool.close()
    summary = records[0]["summary"]  # the first run's peak memory is this case's own
    return {
        "kind": "seed004", "precision": precision, "amp_dtype": amp, "world_size": world_size,
        "backend": backend, "strategy": sync.name,
        "s_per_iter": statistics.median(timed_steps(records)) / 1e3,
        "peak_memory_mb": max(summary["peak_memory_mb"]),
        "peak_memory_mb_per_rank": summary["peak_memory_mb"],
        "peak_memory_scope": summary.get("peak_memory_scope", "process"),
        "final_loss": summary["final_loss"],
    }
