"""The verdict read at the optimizer step (``VerdictAt.OPTIMIZER_STEP``, the default on CUDA,
forced here on CPU) on DDP set-ups the suite does not own: ``no_sync`` accumulation, ``join()``
with uneven inputs, ``static_graph``, reentrant activation checkpointing and GradScaler with
fp16 autocast. Each trains with ``harden(ddp)`` alone — no ``begin_step``/``finish_step`` — once
with the verdict read in backward and once deferred: no false alarm, bitwise the same weights."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.checkpoint import checkpoint

from openclaw_ref.sync.base import SyncConfig
from openclaw_ref.sync.hardening import harden

SETUPS = ("no_sync", "join", "static_graph", "checkpoint", "grad_scaler")
STEPS = 4


class Net(nn.Module):
    def __init__(self, reentrant: bool) -> None:
        super().__init__()
        self.a, self.b, self.head = nn.Linear(8, 16), nn.Linear(16, 16), nn.Linear(16, 3)
        self.reentrant = reentrant

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.a(x))
        if self.reentrant:
            h = checkpoint(self.b, h, use_reentrant=True)
        else:
            h = self.b(h)
        return self.head(torch.relu(h))


def _batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(6, 8, generator=g, requires_grad=True), torch.randint(0, 3, (6,),
                                                                          generator=g)


def deferred_task(ctx, setup: str, verdict_at: str) -> dict:
    """Train ``setup`` with ``harden(ddp)`` under ``verdict_at``; the final weights and what
    the state saw (its checks, events, any error)."""
    torch.manual_seed(0)
    net = Net(reentrant=setup == "checkpoint")
    ddp = DDP(net, bucket_cap_mb=0.001, static_graph=setup in ("static_graph", "checkpoint"))
    state = harden(ddp, SyncConfig(verdict_at=verdict_at), ctx)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    scaler = torch.amp.GradScaler("cpu", enabled=setup == "grad_scaler")
    steps = STEPS + ctx.rank if setup == "join" else STEPS
    error = None
    try:
        with ddp.join(enable=setup == "join"):
            for step in range(steps):
                if setup == "no_sync":  # one accumulated micro-batch, then the synced one
                    xa, ya = _batch(2 * step, ctx.rank)
                    with ddp.no_sync():
                        F.cross_entropy(ddp(xa), ya).backward()
                x, y = _batch(2 * step + 1, ctx.rank)
                with torch.autocast("cpu", dtype=torch.float16, enabled=setup == "grad_scaler"):
                    loss = F.cross_entropy(ddp(x), y)
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
                opt.zero_grad(set_to_none=True)
    except Exception as exc:  # a false alarm
        error = f"{type(exc).__name__}: {exc}"
    finally:
        out = {"error": error, "deferred": state.deferred, "summary": state.summary(),
               "events": [e.kind for e in state.events],
               "weights": [p.detach().clone() for p in ddp.parameters()]}
        state.close()
    return out


@pytest.mark.parametrize("setup", SETUPS)
def test_a_deferred_verdict_raises_no_false_alarm_and_trains_bitwise_alike(pools, setup):
    pool = pools.get(2)
    backward = pool.run(deferred_task, setup, "backward")
    deferred = pool.run(deferred_task, setup, "optimizer-step")
    for a, b in zip(backward, deferred):
        assert a["error"] is None and b["error"] is None, (a["error"], b["error"])
        assert (a["deferred"], b["deferred"]) == (False, True)
        assert b["summary"]["checks_run"] == b["summary"]["checks_passed"] > 0
        assert b["events"] == a["events"]
        assert all(torch.equal(x, y) for x, y in zip(a["weights"], b["weights"]))
