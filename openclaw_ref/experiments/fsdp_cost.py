"""What ``harden()`` costs an FSDP2 (``fully_shard``) job per step: stock FSDP2 and
``harden(fully_shard(model))`` interleaved step by step in ONE job (``experiments.interleave``:
why, and the paired ratio every figure is).

Arms, each an identical copy of ``hook_cost``'s MLP (8 × ``Linear(512, 512)``, 2.1 M
parameters, the same batches), SGD built after the sharding:
  ``fsdp``           stock FSDP2 (the denominator)
  ``hardened-fsdp``  ``harden(model)`` with its defaults (``sync.fsdp.guard``: FSDP2's own
                     reduce-scatter wrapped to take this rank's non-finite sum, a Python hook
                     per sharded parameter and per backward, and one ``world × len(Field)`` int64
                     allreduce at the optimizer step's pre-hook)

The mesh (``FSDPCostConfig.tp``):
  1  one 1-D mesh over the job's ranks, ``fully_shard`` on every ``Linear`` and on the root,
     each rank its own batch;
  2  a ``(dp, tp)`` mesh (2 × 2 on 4 ranks), a tensor-parallel plan on the MLP (``tp_plan``:
     ``ColwiseParallel``/``RowwiseParallel`` on alternate pairs of its ``Linear`` layers, the
     other layers left out, so plain parameters replicated over tp sit beside tp-sharded ones
     and a row-parallel bias replicated over tp), then ``fully_shard`` on ``mesh["dp"]``; the
     tp ranks of a dp group fed the same batch. The guard reads the mesh: it compares every
     parameter replicated over tp and the digest of the root's input across the tp group, in
     the same one exchange per step.

A timed step is forward, backward, ``opt.step()`` and ``opt.zero_grad()``. The guard's
optimizer pre-hook is torch's global one, so it also runs (and returns at once: not its
model's optimizer) inside the stock arm's ``opt.step()``: a few µs, what any job with two
optimizers pays. Beside the timing, the correctness of the same job: the two arms end with
bitwise-equal parameters (the guard leaves FSDP2's and TP's collectives as they were), the
guard's exchanges per optimizer step, and its events (a false alarm would show here).

World sizes: 1 (no reduce-scatter: FSDP2 calls none on a 1-rank shard group, so the guard
adds its hooks and a 1-rank exchange), 2 (the published figure), 4 (on 2 cores the ranks
time-share and each step's figure measures the host more than the guard; the 2-D job runs
there only). Only the MLP: the openclaw presets route each sample to some of their experts, so
an expert can get no gradient on one rank, and FSDP2's reduce-scatter then differs in size
between ranks (gloo aborts; ``unused-param-one-rank`` in the FSDP2 corpus).
"""

from __future__ import annotations

import copy
import dataclasses
import os
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from openclaw_ref.core.launch import LaunchConfig, RankContext, RankPool
from openclaw_ref.experiments.hook_cost import mlp_loss, plain_mlp
from openclaw_ref.experiments.interleave import interleaved_times, paired_figures, slowest_rank
from openclaw_ref.reporting.record import fsdp_cost_job_key
from openclaw_ref.sync.errors import BadInput

ARMS = ("fsdp", "hardened-fsdp")
BASELINE = "fsdp"
HARDENED = "hardened-fsdp"
MODELS = ("mlp",)
MAX_WORLD_SIZE = 4
TP_DEGREES = (1, 2)  # 1: the 1-D mesh; 2: a (dp, tp) mesh with the TP plan (module docstring)


def mesh_fits(world_size: int, tp: int) -> bool:
    """Whether ``world_size`` ranks make the mesh of tensor-parallel degree ``tp``: any, for
    the 1-D mesh; else tp must divide it, leaving at least 2 dp ranks to shard over."""
    return tp == 1 or (world_size % tp == 0 and world_size // tp >= 2)


@dataclass(frozen=True)
class FSDPCostConfig:
    model: str = "mlp"
    world_size: int = 2
    tp: int = 1  # tensor-parallel degree: the mesh (module docstring)
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
        if self.tp not in TP_DEGREES:
            raise BadInput(f"the tensor-parallel degree must be one of {TP_DEGREES}; "
                           f"got {self.tp}")
        if not mesh_fits(self.world_size, self.tp):
            raise BadInput(f"a (dp, tp) mesh with tp {self.tp} needs a world size that tp "
                           f"divides, with at least 2 dp ranks (4 ranks: (dp, tp) = (2, 2)); "
                           f"got world size {self.world_size}")
        if self.steps < 5 or self.warmup < 2:
            raise BadInput("need at least 5 timed and 2 warm-up steps per arm")

    @property
    def mesh_shape(self) -> tuple[int, ...]:
        """(world,) for the 1-D mesh; (dp, tp) otherwise."""
        return (self.world_size,) if self.tp == 1 else (self.world_size // self.tp, self.tp)


def sharded_mlp(net: nn.Module, mesh) -> nn.Module:
    """``fully_shard`` on every ``Linear`` of ``net`` and then on ``net`` itself (in place)."""
    from torch.distributed.fsdp import fully_shard

    for layer in net:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    return fully_shard(net, mesh=mesh)


def tp_plan(net: nn.Module) -> dict:
    """The TP plan of the 2-D mesh: ``ColwiseParallel`` then ``RowwiseParallel`` on the first
    pair of ``net``'s ``Linear`` layers, on the third pair, and so on (activations replicated
    over tp between pairs, the ReLU between a pair's two layers on the column shard); the
    other pairs left out of the plan."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    linears = [name for name, layer in net.named_children() if isinstance(layer, nn.Linear)]
    pairs = [linears[i:i + 2] for i in range(0, len(linears) - 1, 2)]
    return {name: style() for first, second in pairs[::2]
            for name, style in ((first, ColwiseParallel), (second, RowwiseParallel))}


def cost_models(cfg: FSDPCostConfig, ctx: RankContext) -> tuple[dict[str, nn.Module], int]:
    """Each arm's copy of the MLP on the config's mesh (module docstring), and the rank whose
    batch this rank takes (itself on the 1-D mesh, its dp rank on the 2-D one)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module

    net = plain_mlp(cfg.seed).to(ctx.device)
    if cfg.tp == 1:
        mesh = init_device_mesh(ctx.device.type, cfg.mesh_shape)
        return {arm: sharded_mlp(copy.deepcopy(net), mesh) for arm in ARMS}, ctx.rank
    mesh = init_device_mesh(ctx.device.type, cfg.mesh_shape, mesh_dim_names=("dp", "tp"))
    models = {arm: sharded_mlp(parallelize_module(copy.deepcopy(net), mesh["tp"], tp_plan(net)),
                               mesh["dp"]) for arm in ARMS}
    return models, mesh["dp"].get_local_rank()


def fsdp_cost_rank(ctx: RankContext, cfg: FSDPCostConfig) -> dict | None:
    """Rank task: both arms' step times (ms, slowest rank per step), interleaved; whether they
    end bitwise equal; the guard's exchanges and events."""
    from openclaw_ref.sync.hardening import harden

    models, data_rank = cost_models(cfg, ctx)
    loss = mlp_loss(cfg.seed, ctx, data_rank)
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
        summary, kinds = guard.summary(), Counter(e.kind for e in guard.events)
    finally:
        guard.close()
    bitwise = all(torch.equal(a.full_tensor(), b.full_tensor()) for a, b in
                  zip(models[BASELINE].parameters(), models[HARDENED].parameters()))
    slowest = slowest_rank(times, ARMS)
    if not ctx.is_main:
        return None
    return {"arms": list(ARMS), "step_ms": slowest, "bitwise_equal": bitwise,
            "exchanges": summary["checks_run"], "optimizer_steps": summary["optimizer_steps"],
            "events": sum(kinds.values()), "event_kinds": dict(sorted(kinds.items()))}


def summarize(raw: dict) -> dict:
    """Per arm: its median step and the median per-step ratio to stock FSDP2 with its 95 %
    interval (``interleave.paired_figures``)."""
    base = raw["step_ms"][BASELINE]
    return {arm: paired_figures(raw["step_ms"][arm], base) for arm in raw["arms"]}


def job_name(cfg: FSDPCostConfig) -> str:
    """The job's key in the record's ``fsdp_cost.jobs``."""
    return fsdp_cost_job_key(cfg.model, cfg.world_size, cfg.tp)


def job_figures(cfg: FSDPCostConfig, raw: dict) -> dict:
    """What the record keeps of one job: its settings, the summary, the correctness beside it
    (``event_kinds``: the guard's events by kind — on the (dp, tp) mesh ``CanaryOff``, said
    once at ``harden()``: the compute canary cannot probe a TP model; any other kind in a
    healthy job is a false alarm)."""
    return {"config": dataclasses.asdict(cfg), "summary": summarize(raw), "baseline": BASELINE,
            **{k: raw[k] for k in ("bitwise_equal", "exchanges", "optimizer_steps", "events",
                                   "event_kinds")}}


def measure(pool: RankPool, cfg: FSDPCostConfig) -> dict:
    """One job on ``pool``: ``job_figures`` of it, and the host's 1-minute load average before
    and after it (on a shared host the step times follow the load; the ratio less so)."""
    before = os.getloadavg()[0]
    raw = pool.run(fsdp_cost_rank, cfg)[0]
    return {**job_figures(cfg, raw), "load_average": [round(before, 2),
                                                      round(os.getloadavg()[0], 2)]}


def run(cfg: FSDPCostConfig, threads_per_rank: int = 1) -> dict:
    """One job on ``cfg.world_size`` fresh ranks: ``measure`` of it."""
    launch = LaunchConfig(world_size=cfg.world_size, backend="gloo",
                          threads_per_rank=threads_per_rank)
    with RankPool(launch) as pool:
        return measure(pool, cfg)
