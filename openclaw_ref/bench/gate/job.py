"""One gate job: BASE's and HEAD's ``harden()`` (and stock DDP, the unit) on the same MLP and the
same two gloo ranks, taking turns step by step.

Each arm wraps an identical copy of ``hook_cost``'s MLP (8 × ``Linear(512, 512)``, a 1 MB
bucket cap, the same rank-dependent batches per step), and each hardened arm is ``harden(ddp)``
with its defaults, as users call it, from that side's copy of the library (``trees``). A timed
step is forward, backward, the guard's verdict and the optimizer step (``hook_cost.arm_step``),
from the barrier before it to its return on each rank; the job keeps the slowest rank's ms per
arm and round, what the job as a whole waits for.

A *round* is one step of each hardened arm, in an order drawn afresh (``shuffled``); every
``stock_every``-th round stock DDP takes a turn too. Why not stock in every round: it only
gives the unit the excess is expressed in (its median step), not the excess, and a third of a
round's time spent on it bought nothing else — measured every fourth round, its median over a
job is good to under 1 %.

Jobs run one after another on the same two ranks (``run.compare`` keeps one ``RankPool``):
each builds its arms afresh — new copies of the model, new DDP wrappers, new ``harden()`` — in
an order that alternates with the job's parity, and closes them before the next; the ranks'
start-up (spawning, importing torch and both libraries, ~3–10 s) is paid once per run.

What it cannot see: ``harden()`` registers torch's global optimizer-step pre-hook, which runs
inside every arm's ``opt.step()`` alike, and its watchdog thread runs beside every arm; a cost
added there lands on all arms and cancels in the pairs.
"""

from __future__ import annotations

import copy
import gc
import importlib
import random
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from openclaw_ref.core.launch import RankContext, RankPool
from openclaw_ref.experiments.hook_cost import BUCKET_CAP_MB, arm_step, step_fn, wrap_arm
from openclaw_ref.experiments.interleave import interleaved_times
from openclaw_ref.sync.errors import BadInput

STOCK = "ddp"  # the arm every figure is expressed in: one stock DDP step
BASE, HEAD = "base", "head"  # the two hardened arms (``trees.Side`` values)
MODEL = "mlp"
WORLD_SIZE = 2


@dataclass(frozen=True)
class GateJobConfig:
    """One job: where the two library copies lie and how long it runs."""

    sides: tuple[tuple[str, str, str], ...]  # (arm, root on sys.path, module name)
    rounds: int = 200  # timed rounds: one step of each hardened arm each
    warmup: int = 5  # untimed rounds of every arm (DDP rebuilds its buckets after the first)
    stock_every: int = 4  # stock DDP is timed every this many rounds
    seed: int = 0  # the model's and the batches' seed: the same in every job
    job: int = 0  # which job of a run: seeds its arm orders, picks which side is built first

    def __post_init__(self) -> None:
        if self.rounds < 5 or self.warmup < 2 or self.stock_every < 1:
            raise BadInput("a gate job needs at least 5 timed rounds, 2 warm-up rounds, and "
                           "stock DDP every >= 1 rounds")

    @property
    def hardened(self) -> tuple[str, ...]:
        return tuple(arm for arm, _, _ in self.sides)

    @property
    def arms(self) -> tuple[str, ...]:
        return (STOCK, *self.hardened)

    def with_stock(self, step: int) -> bool:
        """Whether stock DDP takes a turn at ``step`` (every warm-up round, then every
        ``stock_every``-th timed one)."""
        return step < self.warmup or (step - self.warmup) % self.stock_every == 0


def shuffled(arms: Sequence[str], seed: int,
             include: Callable[[int, str], bool] = lambda step, arm: True
             ) -> Callable[[int], tuple[str, ...]]:
    """``order(step)``: a random order of the ``arms`` that ``include(step, arm)`` admits,
    drawn from ``seed`` (so every rank draws the same). Why not ``interleave.rotated``: rotating
    one order keeps every arm behind the same neighbour, and a step pays for what the step
    before it left behind — on identical code HEAD read 1.3 % of a DDP step faster than BASE on
    average over 6 rotated jobs (5 of them below 0; 300 steps, load 3–11), 0.4 % (3 of 6) with
    drawn orders. Drawn orders put each arm behind each other arm alike."""
    rng = random.Random(seed)
    memo: dict[int, tuple[str, ...]] = {}

    def order(step: int) -> tuple[str, ...]:
        while len(memo) <= step:
            at = len(memo)
            admitted = [a for a in arms if include(at, a)]
            memo[at] = tuple(rng.sample(admitted, len(admitted)))
        return memo[step]
    return order


def import_harden(root: str, module: str) -> Callable:
    """``harden`` of the library copy ``module`` under ``root`` (imported once per process)."""
    if root not in sys.path:
        sys.path.insert(0, root)
    return importlib.import_module(f"{module}.hardening").harden


def slowest(times: dict[str, list[float]], arms: Sequence[str]) -> dict[str, list[float]]:
    """Per arm and timed step, the slowest rank's ms (one MAX allreduce; every rank calls it
    with lists of the same lengths: every rank ran the same schedule)."""
    flat = torch.tensor([ms for arm in arms for ms in times[arm]], dtype=torch.float64)
    dist.all_reduce(flat, op=dist.ReduceOp.MAX)
    out, at = {}, 0
    for arm in arms:
        out[arm], at = flat[at:at + len(times[arm])].tolist(), at + len(times[arm])
    return out


def build_arms(ctx: RankContext, cfg: GateJobConfig
               ) -> tuple[dict[str, tuple[nn.Module, Any]], dict[str, Callable[[int], None]]]:
    """The job's arms — ``{arm: (DDP model, its guard or None)}``, the hardened ones built in
    the order of the job's parity — and each arm's ``step(i)`` (``hook_cost.arm_step``)."""
    net, loss = step_fn(MODEL, cfg.seed, ctx)
    cap = BUCKET_CAP_MB[MODEL]
    arms = {STOCK: wrap_arm(STOCK, copy.deepcopy(net), ctx, cap, False)}
    sides = cfg.sides if cfg.job % 2 == 0 else tuple(reversed(cfg.sides))  # built first, alike
    for arm, root, module in sides:
        ddp, _ = wrap_arm(STOCK, copy.deepcopy(net), ctx, cap, False)
        arms[arm] = (ddp, import_harden(root, module)(ddp, ctx=ctx))
    steps = {arm: arm_step(ddp, state, torch.optim.SGD(ddp.parameters(), lr=1e-3), loss)
             for arm, (ddp, state) in arms.items()}
    return arms, steps


def order_of(cfg: GateJobConfig) -> Callable[[int], tuple[str, ...]]:
    """The job's arm order at each step: drawn from its seed, stock DDP where ``with_stock``."""
    return shuffled(cfg.arms, cfg.seed * 7919 + cfg.job,
                    lambda step, arm: arm != STOCK or cfg.with_stock(step))


def gate_rank(ctx: RankContext, cfg: GateJobConfig) -> dict | None:
    """Rank task, one job: every arm's timed steps (ms, slowest rank), the hardened arms'
    events (a false alarm would show here), and where its seconds went (building the arms —
    the first job of a run also imports both libraries —, warm-up and timed rounds, closing).
    The arms are closed and dropped before it returns, so the next job on these ranks starts
    from none."""
    t0 = time.perf_counter()
    arms, steps = build_arms(ctx, cfg)
    gc.collect()
    gc.disable()  # a collection inside a timed step lands on whichever arm ran into it
    t1 = time.perf_counter()
    try:
        times = interleaved_times(steps, cfg.arms, cfg.warmup, cfg.rounds, ctx.device,
                                  order_of(cfg))
        events = sum(len(state.events) for _, state in arms.values() if state is not None)
    finally:
        gc.enable()
        t2 = time.perf_counter()
        for _, state in arms.values():
            if state is not None:
                state.close()
    ms = slowest(times, cfg.arms)
    del arms, steps
    gc.collect()
    phases = {"build_s": t1 - t0, "steps_s": t2 - t1, "close_s": time.perf_counter() - t2}
    return {"step_ms": ms, "events": events, "phases": phases} if ctx.is_main else None


def run_job(pool: RankPool, cfg: GateJobConfig) -> dict:
    """One job on ``pool``'s 2 gloo ranks: ``{"step_ms": {arm: [ms per step]}, "events": n}``
    (stock DDP's list is every ``stock_every``-th round's; the hardened arms' pair by round)."""
    if pool.cfg.world_size != WORLD_SIZE:
        raise BadInput(f"a gate job runs on {WORLD_SIZE} ranks; the pool has "
                       f"{pool.cfg.world_size}")
    return pool.run(gate_rank, cfg)[0]
