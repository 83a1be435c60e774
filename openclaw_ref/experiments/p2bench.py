"""Measure the seed's P2 policy: does a barrier on high skew help, or only move the wait?

Runs the ``hardened`` strategy (its control block carries every rank's bucket-ready time) with
the skew barrier off and on, interleaved and repeated on one rank pool, and reports per arm the
median step time (slowest rank), the P2 statistic (largest across-rank std of a bucket's ready
time), the bucket skew, the exposed sync time and how many barriers ran.

Skew source: ``jitter_ms`` makes each rank sleep a seeded uniform Δt before every backward —
the seed's M1 ("per-rank sparse-mask compute delay Δt in [0.3, 5.7] ms"); 0 = only the
machine's own noise. Benchmarks (asv) can call ``measure_skew_barrier`` directly.

Each repeat runs both arms on one jitter draw and draws anew for the next (``jitter_seed``).

    openclaw-bench p2 --world-size 2 --steps 40 --repeats 3
"""

from __future__ import annotations

import dataclasses
import random
import statistics
import time
from collections.abc import Callable

from torch import nn

from openclaw_ref.arms.config import ArmConfig
from openclaw_ref.core.callbacks import Callback
from openclaw_ref.core.config import MetricsConfig
from openclaw_ref.core.launch import RankContext, RankPool
from openclaw_ref.core.train import TrainConfig, train_rank
from openclaw_ref.experiments.runs import rotated
from openclaw_ref.ops.prometheus import metrics_callbacks
from openclaw_ref.sync.errors import BadInput

SEED_JITTER_MS = (0.3, 5.7)  # the seed's M1 range
WARMUP_STEPS = 2  # per run, left out of its figures (``step_stats``)


class Jitter(Callback):
    """Sleeps a seeded, rank-dependent Δt before each backward (the seed's M1). It observes
    the step metrics only so that its runs record ``skew_barrier: false`` like the barrier's."""

    observes_metrics = True

    def __init__(self, rank: int, lo_ms: float, hi_ms: float, seed: int = 0) -> None:
        self.rng = random.Random(seed * 1009 + rank)
        self.lo_ms, self.hi_ms = lo_ms, hi_ms

    def before_backward(self, step: int, model: nn.Module) -> None:
        time.sleep(self.rng.uniform(self.lo_ms, self.hi_ms) / 1e3)


def jitter_seed(seed: int, repeat: int) -> int:
    """The jitter draw of one repeat: shared by its off and on arms, which are compared with
    each other, and new for every repeat. The barrier's gain depends on the draw (how often
    the ranks' Δt differ by more than the threshold), so an interval over repeats that all
    replayed one draw would measure the host's noise on that draw alone."""
    return seed * 1_000_003 + repeat


def p2_arm_rank(ctx: RankContext, cfg: TrainConfig, jitter: tuple[float, float] | None,
                seed: int) -> dict | None:
    """One arm of one repeat on one rank: the training loop with the seed's per-rank Δt drawn
    from ``seed`` (``jitter_seed``) before every backward."""
    extra = (Jitter(ctx.rank, *jitter, seed=seed),) if jitter else ()
    return train_rank(ctx, cfg, extra, metrics_callbacks)


def step_stats(record: dict, warmup: int = WARMUP_STEPS) -> dict:
    """Per-run figures from a run record (rank 0's), warm-up steps excluded."""
    steps = record["steps"][warmup:]
    ready_std, skew, sync = [], [], []
    for s in steps:
        buckets = s["sync"].get("buckets", [])
        ready_std.append(max((statistics.pstdev(b["ready_ms"]) for b in buckets), default=0.0))
        skew.append(max((b["skew_ms"] for b in buckets), default=0.0))
        sync.append(s["sync"].get("sync_ms", 0.0))
    step_ms = [s["step_ms"] for s in steps]
    return {
        "median_step_ms": statistics.median(step_ms),
        "median_ready_std_ms": statistics.median(ready_std),
        "p90_ready_std_ms": sorted(ready_std)[int(0.9 * (len(ready_std) - 1))],
        "median_skew_ms": statistics.median(skew),
        "median_sync_ms": statistics.median(sync),
        "barriers": sum(bool(s["sync"].get("skew_barrier")) for s in record["steps"]),
        "steps": len(record["steps"]),
    }


def check_p2_input(world_size: int, steps: int, repeats: int, threshold_ms: float,
                   jitter_ms: tuple[float, float] | None) -> None:
    """Raise ``BadInput`` before any rank starts: the barrier compares ranks (≥ 2), each run
    needs a step after its warm-up, each arm a repeat, the threshold is a positive std, and
    Δt a range LOW ≤ HIGH of sleeps."""
    if world_size < 2:
        raise BadInput(f"the P2 barrier compares ranks: need --world-size >= 2; got {world_size}")
    if steps <= WARMUP_STEPS:
        raise BadInput(f"need --steps > {WARMUP_STEPS} (the warm-up steps are left out); "
                       f"got {steps}")
    if repeats < 1:
        raise BadInput(f"need --repeats >= 1; got {repeats}")
    if not threshold_ms > 0:
        raise BadInput(f"--threshold-ms must be positive; got {threshold_ms}")
    if jitter_ms is not None and not 0 <= jitter_ms[0] <= jitter_ms[1]:
        raise BadInput(f"--jitter-ms must be LOW,HIGH with 0 <= LOW <= HIGH; got {jitter_ms}")


def measure_skew_barrier(world_size: int = 2, steps: int = 40, repeats: int = 3,
                         threshold_ms: float = 1.5, jitter_ms: tuple[float, float] | None
                         = SEED_JITTER_MS, preset: str = "tiny", pool: RankPool | None = None,
                         *, backend: str = "gloo", seed: int = 0,
                         on_repeat: Callable[[int], None] | None = None
                         ) -> dict[str, list[dict]]:
    """{"off": [stats per repeat], "on": [...]}: per repeat both arms on one jitter draw
    (``jitter_seed``), in an order rotated per repeat so that the host's drift hits both arms
    alike (they are paired by repeat index). ``on_repeat(repeat)`` after each repeat."""
    from openclaw_ref.core.launch import LaunchConfig

    check_p2_input(world_size, steps, repeats, threshold_ms, jitter_ms)
    base = TrainConfig(preset=preset, world_size=world_size, steps=steps, global_batch=8 *
                       world_size, eval_every=0, progress=False, sync=ArmConfig(name="hardened"),
                       backend=backend)
    arms = [("off", base),
            ("on", dataclasses.replace(base, metrics=MetricsConfig(skew_barrier_ms=threshold_ms)))]
    own = pool is None
    pool = pool or RankPool(LaunchConfig(world_size, backend=backend, timeout_s=600))
    out: dict[str, list[dict]] = {name: [] for name, _ in arms}
    try:
        for repeat in range(repeats):
            for name, cfg in rotated(arms, repeat):
                record = pool.run(p2_arm_rank, cfg, jitter_ms, jitter_seed(seed, repeat))[0]
                out[name].append(step_stats(record))
            if on_repeat is not None:
                on_repeat(repeat)
    finally:
        if own:
            pool.close()
    return out


def summarize(result: dict[str, list[dict]]) -> list[list]:
    rows = []
    for arm, runs in result.items():
        rows.append([arm] + [round(statistics.median(r[k] for r in runs), 2) for k in
                             ("median_step_ms", "median_ready_std_ms", "p90_ready_std_ms",
                              "median_skew_ms", "median_sync_ms")]
                    + [sum(r["barriers"] for r in runs), sum(r["steps"] for r in runs)])
    return rows
