"""Arms timed step by step in ONE job, and their paired ratios: the one implementation behind
``hook_cost`` (DDP arms: stock, PyTorch's hooks, the guards) and ``fsdp_cost`` (FSDP2 arms).

Why interleave: separate runs on a shared host differ by ±12 %, far more than the few per cent
a guard costs. Every arm wraps an identical copy of the same network on the same ranks and
process group, and the arms take turns step by step, the order rotating each step so no arm
always runs first after the barrier. Arm ``a``'s step ``s`` and the baseline's step ``s`` ran
within milliseconds of each other: their ratio is a paired measurement, and every ratio is the
median of the per-step ratios (``metrics.median_paired_ratio``), so a load spike from another
process, which slows both steps of a pair, cancels.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence

import torch
import torch.distributed as dist

from openclaw_ref.core.metrics import median_paired_ratio


def rotated(arms: Sequence[str], step: int) -> tuple[str, ...]:
    """The order the arms run in at ``step``: ``arms`` rotated left by ``step``."""
    k = step % len(arms)
    return tuple(arms[k:]) + tuple(arms[:k])


def interleaved_times(step_fns: Mapping[str, Callable[[int], None]], arms: Sequence[str],
                      warmup: int, steps: int, device: torch.device,
                      order: Callable[[int], Sequence[str]] | None = None
                      ) -> dict[str, list[float]]:
    """Run ``step_fns[arm](step)`` for every arm at each of ``warmup + steps`` steps, in
    ``rotated`` order (or ``order(step)``'s, the same on every rank), a ``dist.barrier()``
    before each; this rank's ms of the timed ones."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    times: dict[str, list[float]] = {arm: [] for arm in arms}
    for step in range(warmup + steps):
        for arm in (order(step) if order else rotated(arms, step)):
            dist.barrier()
            sync()
            t0 = time.perf_counter()
            step_fns[arm](step)
            sync()
            if step >= warmup:
                times[arm].append((time.perf_counter() - t0) * 1e3)
    return times


def slowest_rank(times: Mapping[str, list[float]], arms: Sequence[str]) -> dict[str, list[float]]:
    """Per arm and step, the slowest rank's time (one MAX allreduce; every rank calls it)."""
    slowest = torch.tensor([times[a] for a in arms], dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return dict(zip(arms, slowest.tolist()))


def paired_figures(ms: Sequence[float], base: Sequence[float]) -> dict[str, float]:
    """One arm beside the baseline arm of the same job: its median step, and the median of its
    per-step ratios to the baseline's with a 95 % bootstrap interval."""
    ratio = median_paired_ratio(ms, base)
    return {"median_step_ms": statistics.median(ms), "ratio": ratio.point,
            "ratio_low": ratio.low, "ratio_high": ratio.high}
