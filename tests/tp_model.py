"""A user's FSDP2 × tensor-parallel loop, as the tests of ``harden()`` on 2-D and 3-D meshes run
it in a rank pool: the TP corpus's model, plans, data and clipping
(``openclaw_ref.tp_corpus.model``: one user model for the corpus, the conformance zoo and these
tests), trained a few steps with or without ``harden()``, healthy or with one of the published
TP/SP bugs planted — and, beside what the corpus's torchrun script records, the guard's own
``summary()`` and events, which only a loop holding the guard can read.
"""

from __future__ import annotations

import enum

import torch
import torch.distributed as dist
from torch import nn

from openclaw_ref.sync.base import SyncConfig
from openclaw_ref.sync.errors import ConsistencyError
from openclaw_ref.sync.hardening import harden
from openclaw_ref.tp_corpus.cases import MeshShape, Plan
from openclaw_ref.tp_corpus.model import (
    batch,
    build,
    clip_per_mesh,
    data_rank,
    forward_backward,
)

STEPS, BUG_RANK = 3, 3


class Bug(enum.StrEnum):
    NONE = "none"
    BATCH_BY_GLOBAL_RANK = "batch-by-global-rank"  # each tp rank its own batch
    LR_ONE_RANK = "lr-one-rank"  # BUG_RANK's lr doubled
    LOCAL_NORM_CLIP = "local-norm-clip"  # each rank clips by its own local shards' norm
    NORM_WEIGHT_ONE_RANK = "norm-weight-one-rank"  # BUG_RANK's replicated norm weight moved
    EXTRA_MICROBATCH = "extra-microbatch"  # BUG_RANK runs one more forward/backward
    # norms left out of a sequence-parallel plan: Plan.SP_WITHOUT_NORMS, no Bug needed


def train(plan: Plan, bug: Bug, hardened: bool, shape: MeshShape = MeshShape.TWO_D,
          cfg: SyncConfig | None = None, compiled: bool = False, clip: bool = False) -> dict:
    """The user's loop; this rank's account: the full parameters it ends with (none after an
    error), the error it stopped on, and the guard's summary and events."""
    rank, world = dist.get_rank(), dist.get_world_size()
    model, mesh = build(shape, plan, compiled)
    opt = torch.optim.AdamW(model.parameters(),
                            lr=2e-2 if bug is Bug.LR_ONE_RANK and rank == BUG_RANK else 1e-2)
    guard = harden(model, cfg) if hardened else None
    index, size = (rank, world) if bug is Bug.BATCH_BY_GLOBAL_RANK else data_rank(mesh)
    outcome = None
    try:
        if bug is Bug.NORM_WEIGHT_ONE_RANK and rank == BUG_RANK:
            with torch.no_grad():
                model.blocks[0].norm.weight.to_local().add_(1e-3)
        for step in range(STEPS):
            x, y = batch(step, index, size)
            forward_backward(model, x, y, plan)
            if bug is Bug.EXTRA_MICROBATCH and rank == BUG_RANK and step == 1:
                forward_backward(model, x, y, plan)
            if bug is Bug.LOCAL_NORM_CLIP:
                _clip_by_local_norm(model, 0.05)
            elif clip:
                clip_per_mesh(model, 0.05)
            opt.step()
            opt.zero_grad(set_to_none=True)
    except ConsistencyError as exc:
        outcome = (exc.kind, exc.step, exc.ranks, exc.params, str(exc))
    finally:
        if guard is not None:
            guard.close()
    full = {} if outcome else {n: p.full_tensor().detach().clone()
                               for n, p in model.named_parameters()}
    reply: dict = {"outcome": outcome, "full": full}
    if guard is not None:
        reply["summary"] = guard.summary()
        reply["events"] = [(e.kind, e.step, e.ranks, e.detail) for e in guard.events]
    return reply


def _clip_by_local_norm(model: nn.Module, max_norm: float) -> None:
    """The bug: each rank's factor from its own local shards' norm."""
    grads = [p.grad.to_local() for p in model.parameters() if p.grad is not None]
    norm = torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))
    factor = min(1.0, max_norm / (float(norm) + 1e-6))
    for g in grads:
        g.mul_(factor)
