"""``harden()`` without the step protocol: a user who only calls ``harden(ddp)`` and trains as
usual gets every check on every step, raised from ``backward()``; presence and the clock reset
by themselves."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from openclaw_ref.sync.base import SyncConfig
from openclaw_ref.sync.errors import ConsistencyError, MissingGradient
from openclaw_ref.sync.hardened import harden


class TwoStage(nn.Module):
    """Declares every parameter required (no conditional ones); ``skip_b`` leaves ``b``
    without a gradient, which DDP with ``find_unused_parameters`` zero-fills silently."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 2)

    def conditional_parameter_names(self) -> list[str]:
        return []

    def forward(self, x: torch.Tensor, skip_b: bool = False) -> torch.Tensor:
        h = self.a(x)
        return h[:, :2] if skip_b else self.b(h)


def train_without_protocol(ctx, skip_at: int | None, steps: int = 4) -> dict:
    torch.manual_seed(0)
    ddp = DDP(TwoStage(), find_unused_parameters=True)
    state = harden(ddp, SyncConfig(name="hardened", nonfinite="raise"), ctx)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    seen: dict = {"error": None, "steps": 0}
    try:
        for step in range(steps):
            x = torch.randn(3, 4, generator=torch.Generator().manual_seed(step + 10 * ctx.rank))
            skip = ctx.rank == 1 and step == skip_at
            F.mse_loss(ddp(x, skip_b=skip), torch.zeros(3, 2)).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            seen["steps"] += 1
    except ConsistencyError as exc:
        seen["error"] = exc
    finally:
        seen["summary"] = state.summary()
        state.close()
    return seen


def test_every_step_is_checked_without_begin_or_finish_step(pools):
    for seen in pools.get(2).run(train_without_protocol, None):
        assert seen["error"] is None and seen["steps"] == 4
        assert seen["summary"]["steps"] == 4  # four settled steps, one per backward
        assert seen["summary"]["checks_run"] == seen["summary"]["checks_passed"] > 4


def test_a_missing_required_gradient_after_step_0_is_raised_from_backward(pools):
    for seen in pools.get(2).run(train_without_protocol, 2):
        err = seen["error"]
        assert isinstance(err, MissingGradient), err
        assert err.step == 2 and err.ranks == [1] and seen["steps"] == 2
        assert err.params and err.params[0].startswith("b.")
