"""A user's FSDP2 × tensor-parallel script, as the tests of ``harden()`` on 2-D and 3-D meshes run
it: a 2-block model (LayerNorm → Linear → ReLU → Linear, residual; a head) under a TP plan on
the ``tp`` dim and ``fully_shard`` over the data-parallel dims, trained a few steps with or
without ``harden()``, healthy or with one of the published TP/SP bugs planted.

The plans (``Plan``): sequence parallel done right (norms under ``SequenceParallel``, ``w1``
``ColwiseParallel(input_layouts=Shard(1))``, ``w2`` ``RowwiseParallel(output_layouts=Shard(1))``,
the head ``ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate())``, each tp rank
fed its own part of the sequence of the dp group's batch); the plain plan
(activations replicated over tp, norms and the head left as plain parameters, every tp rank
fed the whole batch).
"""

from __future__ import annotations

import enum

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    SequenceParallel,
    loss_parallel,
    parallelize_module,
)

from openclaw_ref.sync.base import SyncConfig
from openclaw_ref.sync.errors import ConsistencyError
from openclaw_ref.sync.hardening import harden

DIM, SEQ, BATCH, STEPS = 16, 8, 4, 3


class Plan(enum.StrEnum):
    SEQUENCE_PARALLEL = "sp"
    PLAIN = "plain"
    LOSS_PARALLEL = "loss-parallel"  # sequence parallel; the head's logits stay vocab-sharded


class Bug(enum.StrEnum):
    NONE = "none"
    NORMS_LEFT_OUT = "norms-left-out"  # SP plan without the norms: their grads never reduced
    BATCH_BY_GLOBAL_RANK = "batch-by-global-rank"  # each tp rank its own batch (plain plan)
    LR_ONE_RANK = "lr-one-rank"  # BUG_RANK's lr doubled
    LOCAL_NORM_CLIP = "local-norm-clip"  # each rank clips by its own local shards' norm
    NORM_WEIGHT_ONE_RANK = "norm-weight-one-rank"  # BUG_RANK's replicated norm weight moved
    EXTRA_MICROBATCH = "extra-microbatch"  # BUG_RANK runs one more forward/backward


BUG_RANK = 3


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(DIM)
        self.w1, self.w2 = nn.Linear(DIM, 4 * DIM), nn.Linear(4 * DIM, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, C) or its part of T
        return x + self.w2(F.relu(self.w1(self.norm(x))))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([Block(), Block()])
        self.head = nn.Linear(DIM, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def _plan(plan: Plan, norms: bool) -> dict:
    """A block's TP plan (module docstring)."""
    if plan is Plan.PLAIN:
        return {"w1": ColwiseParallel(), "w2": RowwiseParallel()}
    out = {"w1": ColwiseParallel(input_layouts=Shard(1)),
           "w2": RowwiseParallel(output_layouts=Shard(1))}
    return {"norm": SequenceParallel(), **out} if norms else out


def build(plan: Plan, bug: Bug, mesh: DeviceMesh, dp: DeviceMesh | None = None,
          compiled: bool = False) -> Net:
    """The model under the plan on ``mesh["tp"]``, each block compiled (as torchtitan does:
    ``block.compile()`` after the plan, before ``fully_shard``) if asked, ``fully_shard`` on
    ``dp`` (default ``mesh["dp"]``) per block and on the root."""
    torch.manual_seed(0)
    model = Net()
    for block in model.blocks:
        parallelize_module(block, mesh["tp"], _plan(plan, bug is not Bug.NORMS_LEFT_OUT))
        if compiled:
            block.compile()
        fully_shard(block, mesh=dp if dp is not None else mesh["dp"])
    if plan is Plan.SEQUENCE_PARALLEL:  # the head gathers the sequence: its output replicated
        parallelize_module(model.head, mesh["tp"], ColwiseParallel(
            input_layouts=Shard(1), output_layouts=Replicate()))
    if plan is Plan.LOSS_PARALLEL:  # the logits stay sharded over the classes (loss_parallel)
        parallelize_module(model.head, mesh["tp"], ColwiseParallel(
            input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False))
    fully_shard(model, mesh=dp if dp is not None else mesh["dp"])
    return model


def batch(step: int, micro: int, dp_rank: int, tp_rank: int, plan: Plan
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """The dp group's batch (the target of the whole sequence); under sequence parallel the
    input is this tp rank's part of the sequence."""
    g = torch.Generator().manual_seed(1000 * step + 10 * micro + dp_rank)
    x = torch.randn(BATCH, SEQ, DIM, generator=g)
    y = x[..., :4].sin()
    if plan is Plan.LOSS_PARALLEL:
        y = (x[..., 0] > 0).long() + 2 * (x[..., 1] > 0).long()  # (B, T) class indices
    if plan is not Plan.PLAIN:
        part = SEQ // 2
        return x[:, tp_rank * part:(tp_rank + 1) * part], y
    return x, y


def loss_of(plan: Plan, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> None:
    """Forward and backward (under ``loss_parallel`` for the vocab-sharded logits)."""
    if plan is Plan.LOSS_PARALLEL:
        with loss_parallel():
            F.cross_entropy(model(x).flatten(0, 1), y.flatten(0, 1)).backward()
        return
    F.mse_loss(model(x), y).backward()


def train(plan: Plan, bug: Bug, hardened: bool, mesh_shape: tuple[int, ...] = (2, 2),
          cfg: SyncConfig | None = None, compiled: bool = False, clip: bool = False) -> dict:
    """The user's loop; this rank's account: the full parameters it ends with, or the error it
    stopped on, and the guard's summary and events."""
    rank = dist.get_rank()
    names = ("dp", "tp") if len(mesh_shape) == 2 else ("replicate", "shard", "tp")
    mesh = init_device_mesh("cpu", mesh_shape, mesh_dim_names=names)
    dp = mesh["dp"] if len(mesh_shape) == 2 else mesh["replicate", "shard"]
    model = build(plan, bug, mesh, dp, compiled)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    guard = harden(model, cfg) if hardened else None
    tp_rank = mesh["tp"].get_local_rank()
    dp_rank = dp._flatten().get_local_rank() if dp.ndim > 1 else dp.get_local_rank()
    if bug is Bug.BATCH_BY_GLOBAL_RANK:
        dp_rank = rank
    outcome = None
    try:
        for step in range(STEPS):
            micros = 2 if bug is Bug.EXTRA_MICROBATCH and rank == BUG_RANK and step == 1 else 1
            if bug is Bug.NORM_WEIGHT_ONE_RANK and rank == BUG_RANK and step == 0:
                with torch.no_grad():
                    model.blocks[0].norm.weight.to_local().add_(1e-3)
            for micro in range(micros):
                x, y = batch(step, micro, dp_rank, tp_rank, plan)
                loss_of(plan, model, x, y)
            if bug is Bug.LOCAL_NORM_CLIP:
                _clip_by_local_norm(model, 0.05)
            elif clip:
                clip_by_global_norm(list(model.parameters()), 0.05)
            for group in opt.param_groups:
                group["lr"] = 2e-2 if bug is Bug.LR_ONE_RANK and rank == BUG_RANK else 1e-2
            opt.step()
            opt.zero_grad(set_to_none=True)
    except ConsistencyError as exc:
        outcome = (exc.kind, exc.step, exc.ranks, exc.params, str(exc))
    finally:
        if guard is not None:
            guard.close()
    full = {} if outcome else {n: p.full_tensor().detach().clone()
                               for n, p in model.named_parameters()}
    reply: dict = {"outcome": outcome, "full": full,
                   "drift": replicated_drift(model, mesh["tp"].get_group())}
    if guard is not None:
        reply["summary"] = guard.summary()
        reply["events"] = [(e.kind, e.step, e.ranks, e.detail) for e in guard.events]
    return reply


def clip_by_global_norm(params: list[nn.Parameter], max_norm: float) -> torch.Tensor:
    """The recipe docs/meshes.md gives for FSDP2 × TP: the gradients' norm per mesh (DTensor's
    norm counts a replicated dim once), the meshes' norms combined, one factor for all.
    ``torch.nn.utils.clip_grad_norm_`` raises when the parameters live on two meshes."""
    by_mesh: dict = {}
    for p in params:
        if p.grad is not None:
            by_mesh.setdefault(p.grad.device_mesh, []).append(p)
    norms = [torch.nn.utils.get_total_norm([p.grad for p in group])
             for group in by_mesh.values()]
    total = torch.linalg.vector_norm(torch.stack([n.full_tensor() for n in norms]))
    for group in by_mesh.values():  # one mesh at a time: torch's foreach ops take one
        torch.nn.utils.clip_grads_with_norm_(group, max_norm, total)
    return total


def _clip_by_local_norm(model: nn.Module, max_norm: float) -> None:
    """The bug: each rank's factor from its own local shards' norm."""
    grads = [p.grad.to_local() for p in model.parameters() if p.grad is not None]
    norm = torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))
    factor = min(1.0, max_norm / (float(norm) + 1e-6))
    for g in grads:
        g.mul_(factor)


def replicated_drift(model: nn.Module, tp_group: dist.ProcessGroup) -> float:
    """The largest |Δ| of the first block's norm weight (this rank's shard of it) across this
    rank's tp group: what stock training shows silently, as every tp rank should hold the
    same norm."""
    local = model.blocks[0].norm.weight.to_local().detach().contiguous()
    others = [torch.empty_like(local) for _ in range(dist.get_world_size(tp_group))]
    dist.all_gather(others, local, group=tp_group)
    return max(float((o - local).abs().max()) for o in others)
