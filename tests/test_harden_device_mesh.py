"""``harden()`` on DDP over one dimension of a 2-D ``DeviceMesh`` (4 gloo ranks, a (2, 2) mesh,
DDP on the ``dp`` dimension, as a job that also shards or pipelines along the other would):
each ``dp`` group trains bitwise like stock DDP on the same group, silently, and a fault is
named with the rank's global number, in its own group only."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.nn.parallel import DistributedDataParallel as DDP

from openclaw_ref.sync.base import SyncConfig
from openclaw_ref.sync.errors import NonFiniteGradient
from openclaw_ref.sync.hardening import harden

STEPS = 3


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 2))


def _train(ddp: DDP, rank: int, poison_at: int | None = None) -> list[torch.Tensor]:
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for step in range(STEPS):
        g = torch.Generator().manual_seed(100 * step + rank)
        x = torch.randn(8, 6, generator=g) * (1 + rank)
        if step == poison_at:
            x[0, 0] = float("nan")
        ddp(x).square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return [p.detach().clone() for p in ddp.parameters()]


def mesh_task(ctx) -> dict:
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    group = mesh["dp"].get_group()
    oracle = _train(DDP(_net(), process_group=group), ctx.rank)
    ddp = DDP(_net(), process_group=group)
    state = harden(ddp, SyncConfig(), ctx)
    try:
        hardened = _train(ddp, ctx.rank)
    finally:
        state.close()
    ddp = DDP(_net(), process_group=group)
    state = harden(ddp, SyncConfig(nonfinite="raise"), ctx)
    error = None
    try:
        _train(ddp, ctx.rank, poison_at=1 if ctx.rank == 3 else None)
    except NonFiniteGradient as exc:
        error = (exc.step, exc.ranks)
    finally:
        state.close()
    dist.barrier()
    return {"group": dist.get_process_group_ranks(group), "events": list(state.events),
            "exact": all(torch.equal(a, b) for a, b in zip(oracle, hardened)),
            "checks": state.summary()["checks_run"], "error": error}


def test_a_dp_dimension_of_a_device_mesh_is_guarded_in_its_own_group(pools):
    replies = pools.get(4).run(mesh_task)
    for rank, reply in enumerate(replies):
        assert reply["exact"] and reply["events"] == [], reply
        assert reply["checks"] >= 2  # the start-up check and at least one step
        # ranks 1 and 3 share a dp group: only they see rank 3's NaN, named globally
        assert reply["error"] == ((1, [3]) if rank in reply["group"] and 3 in reply["group"]
                                  else None), (rank, reply)
    assert [r["group"] for r in replies] == [[0, 2], [1, 3], [0, 2], [1, 3]]
