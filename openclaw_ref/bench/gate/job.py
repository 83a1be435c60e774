"""One gate job: stock DDP, BASE's ``harden()`` and HEAD's ``harden()`` on the same MLP and the
same two gloo ranks, taking turns step by step (``experiments.interleave``).

Each arm wraps an identical copy of ``hook_cost``'s MLP (8 × ``Linear(512, 512)``, a 1 MB
bucket cap, the same rank-dependent batches per step), and each hardened arm is ``harden(ddp)``
with its defaults, as users call it, from that side's copy of the library (``trees``). A
timed step is forward, backward, the guard's verdict and the optimizer step (``hook_cost.
arm_step``, the step the hook-cost job times). The job returns the slowest rank's ms per arm
and step; what they mean is ``stat``'s.

What it cannot see: ``harden()`` registers torch's global optimizer-step pre-hook, which runs
inside every arm's ``opt.step()`` alike, and its watchdog thread runs beside every arm; a cost
added there lands on all three arms and cancels in the pairs.
"""

from __future__ import annotations

import copy
import importlib
import random
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from openclaw_ref.core.launch import LaunchConfig, RankContext, RankPool
from openclaw_ref.experiments.hook_cost import BUCKET_CAP_MB, arm_step, step_fn, wrap_arm
from openclaw_ref.experiments.interleave import interleaved_times, slowest_rank
from openclaw_ref.sync.errors import BadInput

STOCK = "ddp"  # the arm every figure is expressed in: one stock DDP step
MODEL = "mlp"
WORLD_SIZE = 2


@dataclass(frozen=True)
class GateJobConfig:
    """One job: where the two library copies lie and how long it runs."""

    sides: tuple[tuple[str, str, str], ...]  # (arm, root on sys.path, module name)
    steps: int = 800  # timed steps per arm
    warmup: int = 10  # untimed steps per arm (DDP rebuilds its buckets after the first)
    seed: int = 0  # the model's and the batches' seed: the same in every job
    job: int = 0  # which job of a comparison: seeds its arm orders, picks which side is built first

    def __post_init__(self) -> None:
        if self.steps < 5 or self.warmup < 2:
            raise BadInput("a gate job needs at least 5 timed and 2 warm-up steps per arm")

    @property
    def arms(self) -> tuple[str, ...]:
        return (STOCK, *(arm for arm, _, _ in self.sides))


def shuffled(arms: Sequence[str], seed: int) -> Callable[[int], tuple[str, ...]]:
    """``order(step)``: a random order of ``arms`` per step, drawn from ``seed`` (so every rank
    draws the same). Why not ``interleave.rotated``: rotating one order keeps every arm behind
    the same neighbour (ddp → base → head → ddp), and a step pays for what the step before it
    left behind — on identical code HEAD read 1.3 % of a DDP step faster than BASE on average
    over 6 rotated jobs (5 of them below 0; 300 steps, load 3–11), 0.4 % (3 of 6) with drawn
    orders. Drawn orders put each arm behind each other arm alike."""
    rng = random.Random(seed)
    memo: dict[int, tuple[str, ...]] = {}

    def order(step: int) -> tuple[str, ...]:
        while len(memo) <= step:
            memo[len(memo)] = tuple(rng.sample(list(arms), len(arms)))
        return memo[step]
    return order


def import_harden(root: str, module: str) -> Callable:
    """``harden`` of the library copy ``module`` under ``root``."""
    if root not in sys.path:
        sys.path.insert(0, root)
    return importlib.import_module(f"{module}.hardening").harden


def gate_rank(ctx: RankContext, cfg: GateJobConfig) -> dict | None:
    """Rank task: every arm's step times (ms, slowest rank per step), interleaved, and the
    hardened arms' events (a false alarm would show here)."""
    net, loss = step_fn(MODEL, cfg.seed, ctx)
    cap = BUCKET_CAP_MB[MODEL]
    arms = {STOCK: wrap_arm(STOCK, copy.deepcopy(net), ctx, cap, False)}
    sides = cfg.sides if cfg.job % 2 == 0 else tuple(reversed(cfg.sides))  # built first, alike
    for arm, root, module in sides:
        ddp, _ = wrap_arm(STOCK, copy.deepcopy(net), ctx, cap, False)
        arms[arm] = (ddp, import_harden(root, module)(ddp, ctx=ctx))
    steps = {arm: arm_step(ddp, state, torch.optim.SGD(ddp.parameters(), lr=1e-3), loss)
             for arm, (ddp, state) in arms.items()}
    try:
        times = interleaved_times(steps, cfg.arms, cfg.warmup, cfg.steps, ctx.device,
                                  shuffled(cfg.arms, cfg.seed * 7919 + cfg.job))
        events = sum(len(state.events) for _, state in arms.values() if state is not None)
    finally:
        for _, state in arms.values():
            if state is not None:
                state.close()
    slowest = slowest_rank(times, cfg.arms)
    return {"step_ms": slowest, "events": events} if ctx.is_main else None


def run_job(cfg: GateJobConfig, threads_per_rank: int = 1) -> dict:
    """One job on 2 fresh gloo ranks: ``{"step_ms": {arm: [ms per step]}, "events": n}``."""
    launch = LaunchConfig(world_size=WORLD_SIZE, backend="gloo",
                          threads_per_rank=threads_per_rank)
    with RankPool(launch) as pool:
        return pool.run(gate_rank, cfg)[0]
