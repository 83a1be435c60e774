"""The compute canary on the conformance target (the user's model, or the openclaw model): a
plain loop over the target's own batches, ``harden()`` with the canary every K steps, and
optionally the last rank's matmuls computing wrong (``core.sdc_faults``) from a step on; under
DDP, or under ``--openclaw-wrapper fsdp2/hsdp`` sharded as ``fsdp_run`` shards it (the default
cell). What the run raised, its events, how many results the fault corrupted, and the final
parameters, full (``conformance/suite/test_canary.py`` compares the canary on and off
bitwise)."""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.fsdp import MixedPrecisionPolicy
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel as DDP

from openclaw_ref.conformance.fsdp_run import FSDP_OPTION_SETS, device_mesh, shard_model
from openclaw_ref.conformance.target import FSDP_WRAPPERS, build_target, forward_loss
from openclaw_ref.conformance.user_run import RUN_SEED
from openclaw_ref.core.sdc_faults import FaultyMatmul, entered, sdc_model
from openclaw_ref.sync.base import SyncConfig
from openclaw_ref.sync.errors import ConsistencyError
from openclaw_ref.sync.hardening import harden


def canary_task(ctx, factory: str, canary_every: int, steps: int, fault: str = "",
                fault_step: int = 0, wrapper: str = "ddp") -> dict:
    """One run on this rank (module docstring); never raises a ``ConsistencyError``."""
    torch.manual_seed(RUN_SEED)
    target = build_target(factory)
    model = target.module.to(ctx.device)
    ddp = _wrapped(model, target, wrapper, ctx.world_size)
    state = harden(ddp, SyncConfig(canary_every=canary_every), ctx)
    opt = torch.optim.SGD(model.parameters(), lr=target.lr)
    mode = FaultyMatmul(sdc_model(fault, "")) if fault and ctx.rank == ctx.world_size - 1 \
        else None
    reply: dict = {"error": None, "fired": 0}
    torch.manual_seed(RUN_SEED + 1 + ctx.rank)
    try:
        with entered(mode):
            for step in range(steps):
                if mode is not None:
                    mode.active = step >= fault_step
                batch = target.batch(step, ctx.rank, ctx.world_size)
                forward_loss(target, ddp, batch).backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
    except ConsistencyError as exc:
        reply["error"] = {"kind": exc.kind, "step": exc.step, "ranks": exc.ranks}
    finally:
        if mode is not None:
            reply["fired"] = mode.fired
        reply["events"] = [e.kind for e in state.events]
        state.close(verify=reply["error"] is None)
    reply["params"] = {n: (p.full_tensor() if isinstance(p, DTensor) else p).detach().cpu()
                       .clone() for n, p in model.named_parameters()}
    return reply


def _wrapped(model: nn.Module, target, wrapper: str, world_size: int) -> nn.Module:
    """The model under DDP, or sharded in place (``fsdp_run.shard_model``, the default cell)."""
    if wrapper not in FSDP_WRAPPERS:
        return DDP(model, find_unused_parameters=target.find_unused_parameters)
    shard_model(model, device_mesh(wrapper, world_size), FSDP_OPTION_SETS["default"],
                MixedPrecisionPolicy())
    return model
