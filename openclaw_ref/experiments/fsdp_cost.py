"""What ``harden()`` costs an FSDP2 (``fully_shard``) job per step: stock FSDP2 and
``harden(fully_shard(model))`` interleaved step by step in ONE job (``experiments.interleave``:
why, and the paired ratio every figure is).

Arms, each an identical copy of ``hook_cost``'s MLP (8 × ``Linear(512, 512)``, 2.1 M
parameters, the same rank-dependent batches), ``fully_shard`` on every ``Linear`` and on the
root, on one 1-D mesh over the job's ranks, SGD built after the sharding:
  ``fsdp``           stock FSDP2 (the denominator)
  ``hardened-fsdp``  ``harden(model)`` with its defaults (``sync.fsdp.guard``: FSDP2's own
                     reduce-scatter wrapped to take this rank's non-finite sum, a Python hook
                     per sharded parameter and per backward, and one ``world × len(Field)`` int64
                     allreduce at the optimizer step's pre-hook)

A timed step is forward, backward, ``opt.step()`` and ``opt.zero_grad()``. The guard's
optimizer pre-hook is torch's global one, so it also runs (and returns at once: not its
model's optimizer) inside the stock arm's ``opt.step()``: a few µs, what any job with two
optimizers pays. Beside the timing, the correctness of the same job: the two arms end with
bitwise-equal parameters (the guard leaves FSDP2's collectives as they were), the guard's
exchanges per optimizer step, and its events (a false alarm would show here).

World sizes: 1 (no reduce-scatter: FSDP2 calls none on a 1-rank shard group, so the guard
adds its hooks and a 1-rank exchange), 2 (the published figure), 4 (on 2 cores the ranks
time-share and each step's figure measures the host more than the guard). Only the MLP: the
openclaw presets route each sample to some of their experts, so an expert can get no gradient
on one rank, and FSDP2's reduce-scatter then differs in size between ranks (gloo aborts;
``unused-param-one-rank`` in the FSDP2 corpus).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from openclaw_ref.core.launch import LaunchConfig, RankContext, RankPool
from openclaw_ref.experiments.hook_cost import mlp_loss, plain_mlp
from openclaw_ref.experiments.interleave import interleaved_times, paired_figures, slowest_rank
from openclaw_ref.sync.errors import BadInput

ARMS = ("fsdp", "hardened-fsdp")
BASELINE = "fsdp"
HARDENED = "hardened-fsdp"
MODELS = ("mlp",)
MAX_WORLD_SIZE = 4


@dataclass(frozen=True)
class FSDPCostConfig:
    model: str = "mlp"
    world_size: int = 2
    steps: int = 150  # timed steps per arm
    warmup: int = 10  # untimed steps per arm (FSDP2's lazy init runs in the first)
    seed: int = 0

    def __post_init__(self) -> None:
        if self.model not in MODELS:
            raise BadInput(f"the FSDP2 cost runs on the MLP only (an openclaw preset can leave "
                           f"an expert without a gradient on one rank, which stock FSDP2 "
                           f"cannot reduce); got model {self.model!r}")
        if not 1 <= self.world_size <= MAX_WORLD_SIZE:
            raise BadInput(f"world size must be 1 to {MAX_WORLD_SIZE}; got {self.world_size}")
        if self.steps < 5 or self.warmup < 2:
            raise BadInput("need at least 5 timed and 2 warm-up steps per arm")


def sharded_mlp(net: nn.Module, mesh) -> nn.Module:
    """``fully_shard`` on every ``Linear`` of ``net`` and then on ``net`` itself (in place)."""
    from torch.distributed.fsdp import fully_shard

    for layer in net:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    return fully_shard(net, mesh=mesh)


def fsdp_cost_rank(ctx: RankContext, cfg: FSDPCostConfig) -> dict | None:
    """Rank task: both arms' step times (ms, slowest rank per step), interleaved; whether they
    end bitwise equal; the guard's exchanges and events."""
    from torch.distributed.device_mesh import init_device_mesh

    from openclaw_ref.sync.hardening import harden

    mesh = init_device_mesh(ctx.device.type, (ctx.world_size,))
    net = plain_mlp(cfg.seed).to(ctx.device)
    loss = mlp_loss(cfg.seed, ctx)
    models = {arm: sharded_mlp(copy.deepcopy(net), mesh) for arm in ARMS}
    guard = harden(models[HARDENED], ctx=ctx)
    opts = {arm: torch.optim.SGD(m.parameters(), lr=1e-3) for arm, m in models.items()}

    def step_of(arm: str) -> Callable[[int], None]:
        model, opt = models[arm], opts[arm]

        def step(i: int) -> None:
            loss(model, i).backward()
            opt.step()
            opt.zero_grad()
        return step

    try:
        times = interleaved_times({arm: step_of(arm) for arm in ARMS}, ARMS, cfg.warmup,
                                  cfg.steps, ctx.device)
        summary, events = guard.summary(), len(guard.events)
    finally:
        guard.close()
    bitwise = all(torch.equal(a.full_tensor(), b.full_tensor()) for a, b in
                  zip(models[BASELINE].parameters(), models[HARDENED].parameters()))
    slowest = slowest_rank(times, ARMS)
    if not ctx.is_main:
        return None
    return {"arms": list(ARMS), "step_ms": slowest, "bitwise_equal": bitwise,
            "exchanges": summary["checks_run"], "optimizer_steps": summary["optimizer_steps"],
            "events": events}


def summarize(raw: dict) -> dict:
    """Per arm: its median step and the median per-step ratio to stock FSDP2 with its 95 %
    interval (``interleave.paired_figures``)."""
    base = raw["step_ms"][BASELINE]
    return {arm: paired_figures(raw["step_ms"][arm], base) for arm in raw["arms"]}


def job_figures(cfg: FSDPCostConfig, raw: dict) -> dict:
    """What the record keeps of one job: its settings, the summary, the correctness beside it."""
    return {"config": dataclasses.asdict(cfg), "summary": summarize(raw), "baseline": BASELINE,
            **{k: raw[k] for k in ("bitwise_equal", "exchanges", "optimizer_steps", "events")}}


def run(cfg: FSDPCostConfig, threads_per_rank: int = 1) -> dict:
    """One job on ``cfg.world_size`` fresh ranks: ``job_figures`` of it."""
    launch = LaunchConfig(world_size=cfg.world_size, backend="gloo",
                          threads_per_rank=threads_per_rank)
    with RankPool(launch) as pool:
        return job_figures(cfg, pool.run(fsdp_cost_rank, cfg)[0])
