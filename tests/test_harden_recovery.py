"""What a user may do after a ``ConsistencyError`` (docs/errors.md, "After a check fired"):
under the per-bucket guard the DDP model it was raised from cannot run another backward — DDP's
reducer was left mid-iteration — while under the step guard a verdict read after DDP's finalize
leaves DDP whole; either way the module can be wrapped again and hardened once the failed model
is closed and dropped (its reducer's hooks on the parameters go with it: ``close()`` keeps no
reference to it), and training goes on with equal replicas — the one recipe the docs give."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from openclaw_ref.sync.base import SyncConfig
from openclaw_ref.sync.errors import ClockMismatch
from openclaw_ref.sync.hardening import harden

STEPS_AFTER = 2


def _step(ddp: DDP, opt: torch.optim.Optimizer, step: int, rank: int) -> None:
    g = torch.Generator().manual_seed(100 * step + rank)
    x, y = torch.randn(8, 4, generator=g) * (1 + rank), torch.randn(8, 2, generator=g)
    F.mse_loss(ddp(x), y).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def _clock_fault(ctx, ddp: DDP, guard: str = "step") -> str:
    """Rank 1 names step 1 where rank 0 names step 0: every rank raises ClockMismatch (its
    name returned, so that nothing keeps the failed step's frames alive)."""
    state = harden(ddp, SyncConfig(guard=guard), ctx)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    try:
        state.begin_step(ctx.rank)
        _step(ddp, opt, 0, ctx.rank)
    except ClockMismatch as exc:
        return type(exc).__name__
    finally:
        state.close()
    return "nothing raised"


def reuse_task(ctx, guard: str) -> dict:
    torch.manual_seed(0)
    ddp = DDP(nn.Linear(4, 2))
    first = _clock_fault(ctx, ddp, guard)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    try:
        _step(ddp, opt, 1, ctx.rank)
    except RuntimeError as exc:
        return {"first": first, "again": type(exc).__name__}
    return {"first": first, "again": None}


def rewrap_task(ctx) -> dict:
    """The docs' recipe: close (done by ``_clock_fault``), drop the failed DDP model, wrap
    the same module again and harden it."""
    torch.manual_seed(0)
    module = nn.Linear(4, 2)
    ddp = DDP(module)
    first = _clock_fault(ctx, ddp)
    del ddp  # its reducer's autograd hooks on the parameters go with it
    ddp = DDP(module)  # rank 0's parameters are broadcast again
    state = harden(ddp, SyncConfig(), ctx)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    try:
        for step in range(STEPS_AFTER):
            _step(ddp, opt, step, ctx.rank)
    finally:
        state.close()
    flat = torch.cat([p.detach().reshape(-1) for p in module.parameters()])
    gathered = [torch.empty_like(flat) for _ in range(ctx.world_size)]
    dist.all_gather(gathered, flat)
    return {"first": first, "equal": all(torch.equal(gathered[0], g) for g in gathered),
            "steps": state.summary()["steps"]}


@pytest.mark.parametrize("guard,again", [("step", None), ("bucket", "RuntimeError")])
def test_whether_the_ddp_model_an_error_was_raised_from_runs_another_backward(pools, guard,
                                                                             again):
    for reply in pools.get(2).run(reuse_task, guard):
        assert reply == {"first": "ClockMismatch", "again": again}


def test_after_an_error_the_module_wrapped_and_hardened_again_trains_with_equal_replicas(pools):
    for reply in pools.get(2).run(rewrap_task):
        assert reply == {"first": "ClockMismatch", "equal": True, "steps": STEPS_AFTER}
