"""Section ``ablations``: two controls the seed never ran. (1) Is the skew caused by the sparse
path? The same hardened runs with the gating unit's masking off (sparsity 0). (2) The seed's P2
barrier (std of bucket-ready times > 1.5 ms → barrier before the next backward), on vs off,
with the seed's Δt ∈ [0.3, 5.7] ms per-rank jitter injected. Both pairs of arms run
interleaved (order rotated per repeat)."""

from __future__ import annotations

import os
import statistics
from typing import TYPE_CHECKING

import torch

from openclaw_ref.arms.config import ArmConfig
from openclaw_ref.core.launch import RankPool, resolve_backend
from openclaw_ref.core.metrics import percentile
from openclaw_ref.core.pools import PoolCache
from openclaw_ref.core.train import TrainConfig
from openclaw_ref.experiments.runs import bucket_skews, rotated, run_and_return_params

if TYPE_CHECKING:
    from openclaw_ref.experiments.settings import CompareConfig, Progress

BARRIER_MS = 1.5  # the seed's P2 threshold on the std of bucket-ready times


def jobs(cfg: CompareConfig) -> int:
    return cfg.repeats + cfg.p2_repeats


def skew_barrier_interleaved(cfg: CompareConfig, pool: RankPool, w: int,
                             progress: Progress) -> dict[str, list[dict]]:
    """``p2bench.measure_skew_barrier`` (hardened, threshold 1.5 ms, the seed's jitter, a new
    draw per repeat) for ``cfg.p2_repeats`` repeats: {"off": [stats per repeat], "on": [...]}."""
    from openclaw_ref.experiments.p2bench import SEED_JITTER_MS, measure_skew_barrier

    return measure_skew_barrier(w, cfg.steps, cfg.p2_repeats, BARRIER_MS, SEED_JITTER_MS,
                                cfg.preset, pool, backend=cfg.backend, seed=cfg.seed,
                                on_repeat=lambda r: progress.tick(f"P2 barrier on/off r{r}"))


def _sparsity(cfg: CompareConfig, w: int, pools: PoolCache, progress: Progress) -> dict:
    """Bucket skews of the per-bucket guard (fp32) with the seed's masking vs masking off, per
    arm: the step guard sees one ready time per rank and step, not per bucket."""
    arms = [("sparse (text 000's range)", None), ("masking off (s = 0)", (0.0, 0.0))]
    skews: dict[str, list[float]] = {label: [] for label, _ in arms}
    for repeat in range(cfg.repeats):
        for label, rng in rotated(arms, repeat):
            tcfg = TrainConfig(preset=cfg.preset, world_size=w, steps=cfg.steps,
                               global_batch=cfg.global_batch, seed=cfg.seed, eval_every=0,
                               progress=False, backend=cfg.backend, sparsity_range=rng,
                               sync=ArmConfig.of("hardened", bucket_cap_mb=cfg.bucket_cap_mb,
                                                 guard="bucket"))
            record = pools.get(w).run(run_and_return_params, tcfg)[0]["record"]
            skews[label] += bucket_skews(record)
        progress.tick(f"ablation sparse/masking-off r{repeat}")
    return {label: {"world_size": w, "bucket_steps": len(x),
                    "share_over_3ms": sum(v > 3.0 for v in x) / max(1, len(x)),
                    "skew_p50_ms": percentile(x, 50) if x else None,
                    "skew_p99_ms": percentile(x, 99) if x else None}
            for label, x in skews.items()}


def _barrier_rows(barrier: dict[str, list[dict]], w: int) -> list[dict]:
    """Per arm: medians over repeats, barrier and step counts summed."""
    return [{"arm": arm, "world_size": w,
             **{k: statistics.median(r[k] for r in runs)
                for k in ("median_step_ms", "median_ready_std_ms", "p90_ready_std_ms",
                          "median_skew_ms")},
             "barriers": sum(r["barriers"] for r in runs), "steps": sum(r["steps"] for r in runs)}
            for arm, runs in barrier.items()]


def control_size(cfg: CompareConfig) -> int:
    """The largest multi-rank size whose ranks each get a core (a GPU under NCCL) — the size
    the ledger judges skew at (C3/C4) — else the largest size."""
    backend = resolve_backend(cfg.backend, max(cfg.world_sizes))
    capacity = torch.cuda.device_count() if backend == "nccl" else (os.cpu_count() or 1)
    fit = [w for w in cfg.world_sizes if 2 <= w <= capacity]
    return max(fit) if fit else max(cfg.world_sizes)


def p2_size(cfg: CompareConfig) -> int:
    """The P2 arms' world size: 2 when the comparison runs 2 ranks, else its largest size —
    but never 1, since the barrier compares ranks (``p2bench.check_p2_input``)."""
    return 2 if 2 in cfg.world_sizes else max(2, max(cfg.world_sizes))


def run(cfg: CompareConfig, pools: PoolCache, progress: Progress) -> dict:
    """The sparsity control at ``control_size``, the P2 arms at ``p2_size``."""
    w = control_size(cfg)
    sparsity = _sparsity(cfg, w, pools, progress)
    pw = p2_size(cfg)
    barrier = skew_barrier_interleaved(cfg, pools.get(pw), pw, progress)
    barrier_rows = _barrier_rows(barrier, pw)
    return {"sparsity": sparsity, "sparsity_arms": list(sparsity),
            "skew_barrier": barrier_rows, "skew_barrier_repeats": barrier}
