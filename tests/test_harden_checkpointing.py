"""``harden()`` under activation checkpointing, on a plain model the suite does not own: the step is
settled only once DDP has issued its last bucket, so reentrant and non-reentrant checkpointing
(with and without ``static_graph``) train bitwise like the same loop without the hook, silently."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.checkpoint import checkpoint

from openclaw_ref.sync.base import SyncConfig
from openclaw_ref.sync.hardening import harden

STEPS = 4


class CheckpointedMLP(nn.Module):
    """Four checkpointed blocks; small buckets so that some buckets become ready inside a
    checkpoint's own (reentrant: nested) backward and others outside of it."""

    def __init__(self, reentrant: bool, width: int = 32, blocks: int = 4) -> None:
        super().__init__()
        self.reentrant = reentrant
        self.inp = nn.Linear(8, width)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(width, width), nn.Tanh(), nn.Linear(width, width))
            for _ in range(blocks))
        self.out = nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for block in self.blocks:
            h = h + checkpoint(block, h, use_reentrant=self.reentrant)
        return self.out(h)


def _train(ddp: DDP, rank: int) -> dict[str, torch.Tensor]:
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(100 + rank)
    for _ in range(STEPS):
        x = torch.randn(16, 8, generator=gen, requires_grad=True)
        ddp(x).square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return {n: p.detach().clone() for n, p in ddp.module.named_parameters()}


def _build(reentrant: bool, static_graph: bool) -> DDP:
    torch.manual_seed(0)
    return DDP(CheckpointedMLP(reentrant), bucket_cap_mb=0.004, static_graph=static_graph)


def checkpointed_task(ctx, reentrant: bool, static_graph: bool) -> dict:
    """The oracle (no hook) and the hardened loop on the same rank; never raises."""
    oracle = _train(_build(reentrant, static_graph), ctx.rank)
    ddp = _build(reentrant, static_graph)
    state = harden(ddp, SyncConfig(), ctx)
    reply: dict = {"error": None, "oracle": oracle}
    try:
        reply["hardened"] = _train(ddp, ctx.rank)
    except Exception as exc:  # reported, not raised: the test names it
        reply["error"] = f"{type(exc).__name__}: {exc}"
    reply["summary"] = state.summary()
    reply["events"] = list(state.events)
    reply["buckets"] = len(state.last_layout)
    state.close()
    dist.barrier()
    return reply


@pytest.mark.parametrize("reentrant,static_graph", [(True, False), (False, False),
                                                    (True, True), (False, True)],
                         ids=["reentrant", "non-reentrant", "reentrant-static",
                              "non-reentrant-static"])
def test_checkpointed_blocks_train_bitwise_like_ddp_without_the_hook(pools, reentrant,
                                                                      static_graph):
    for reply in pools.get(2).run(checkpointed_task, reentrant, static_graph):
        assert reply["error"] is None, reply["error"]
        assert reply["events"] == []
        s = reply["summary"]
        assert s["checks_run"] == s["checks_passed"] and s["bucket_checks"] >= STEPS
        assert reply["buckets"] > 1  # several buckets: some settle inside a nested backward
        for name, p in reply["oracle"].items():
            assert torch.equal(reply["hardened"][name], p), name
