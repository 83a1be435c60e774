"""``harden()`` on the two composable ``replicate()``s (2 gloo ranks): the DDP-based one (DDP
inside, driven by the module's own forward hooks) and ``replicate_with_fsdp`` (an FSDP2 module on
a replicate mesh). Each trains bitwise like itself without the guard, a drifting replica is
named with the rank and the module's own parameter name (not the ``ParameterList`` index
replicate's DDP sees), and what the guard cannot do there is refused before any collective."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed._composable.replicate import replicate
from torch.distributed._composable.replicate_with_fsdp import replicate as replicate_fsdp

from openclaw_ref.sync.base import Guard, SyncConfig
from openclaw_ref.sync.errors import BadInput, ReplicaDivergence
from openclaw_ref.sync.hardening import harden

STEPS = 4


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 2))


def _train(model: nn.Module, rank: int, drift_at: int | None = None) -> list[torch.Tensor]:
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(STEPS):
        g = torch.Generator().manual_seed(100 * step + rank)
        model(torch.randn(8, 6, generator=g) * (1 + rank)).square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step == drift_at:
            with torch.no_grad():
                model[2].bias.add_(1e-3)  # this rank's replica drifts after the update
    return [p.detach().clone() for p in model.parameters()]


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def replicate_fsdp_task(ctx) -> dict:
    return replicate_task(ctx, replicate_fsdp)


def replicate_task(ctx, wrap=replicate) -> dict:
    stock = _train(wrap(_net()), ctx.rank)
    model = wrap(_net())
    guard = harden(model, SyncConfig(), ctx)  # before the first forward
    try:
        hardened = _train(model, ctx.rank)
        summary, events = guard.summary(), list(guard.events)
    finally:
        guard.close()
    model = wrap(_net())
    guard = harden(model, SyncConfig(replica_slices=1), ctx)
    error = None
    try:
        _train(model, ctx.rank, drift_at=1 if ctx.rank == 1 else None)
    except ReplicaDivergence as exc:
        error = {"ranks": exc.ranks, "step": exc.step, "message": str(exc)}
    finally:
        guard.close(verify=False)
    dist.barrier()
    return {"exact": all(torch.equal(_local(a), _local(b)) for a, b in zip(stock, hardened)),
            "events": events, "checks": summary["checks_run"],
            "error": error}


@pytest.fixture(scope="module")
def ddp_replies(pools) -> list[dict]:
    return pools.get(2).run(replicate_task)


@pytest.fixture(scope="module")
def fsdp_replies(pools) -> list[dict]:
    return pools.get(2).run(replicate_fsdp_task)


@pytest.fixture(params=["ddp_replies", "fsdp_replies"])
def replies(request) -> list[dict]:
    return request.getfixturevalue(request.param)


def test_a_replicated_module_trains_bitwise_like_replicate_without_the_guard(replies):
    for reply in replies:
        assert reply["exact"] and reply["events"] == [], reply
        assert reply["checks"] >= STEPS, reply  # every step (the DDP guard counts start-up too)


def test_a_drifting_replica_is_named_by_rank_before_the_next_update(replies):
    for reply in replies:
        assert reply["error"] is not None, reply
        assert reply["error"]["step"] == 2, reply  # drifted after step 1's update
        assert reply["error"]["ranks"] in ([1], [0, 1]), reply  # 2 ranks: no majority


def test_the_ddp_replicate_names_the_drifting_parameter_by_the_modules_own_name(ddp_replies):
    for reply in ddp_replies:
        assert "2.bias" in reply["error"]["message"], reply  # not ParameterList's "1"


def test_the_per_bucket_guard_on_a_replicated_module_is_refused_before_any_collective():
    model = replicate(_net())  # no process group: a collective here would raise another error
    with pytest.raises(BadInput, match="step guard only"):
        harden(model, SyncConfig(guard=Guard.BUCKET))
