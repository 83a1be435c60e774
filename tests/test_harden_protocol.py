"""``harden()`` without the step protocol: a user who only calls ``harden(ddp)`` and trains as
usual gets every check on every step, raised from ``backward()`` — or, with the verdict read at
the optimizer step (``VerdictAt.OPTIMIZER_STEP``, the default on CUDA, forced here on CPU),
from ``optimizer.step()`` before it applies anything; presence and the clock reset by
themselves."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from openclaw_ref.sync.base import SyncConfig
from openclaw_ref.sync.errors import ConsistencyError, MissingGradient
from openclaw_ref.sync.hardening import harden


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


def train_without_protocol(ctx, skip_at: int | None, steps: int = 4,
                           verdict_at: str = "auto") -> dict:
    torch.manual_seed(0)
    ddp = DDP(TwoStage(), find_unused_parameters=True)
    state = harden(ddp, SyncConfig(nonfinite="raise", verdict_at=verdict_at),
                   ctx)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    seen: dict = {"error": None, "steps": 0, "raised_in": None, "deferred": state.deferred,
                  "pending_after_backward": []}
    where = "backward"
    try:
        for step in range(steps):
            x = torch.randn(3, 4, generator=torch.Generator().manual_seed(step + 10 * ctx.rank))
            skip = ctx.rank == 1 and step == skip_at
            where = "backward"
            F.mse_loss(ddp(x, skip_b=skip), torch.zeros(3, 2)).backward()
            seen["pending_after_backward"].append(state.progress()[1])
            before = [p.detach().clone() for p in ddp.parameters()]
            where = "optimizer.step"
            try:
                opt.step()
            finally:
                seen["unchanged"] = all(torch.equal(a, p) for a, p in zip(before,
                                                                          ddp.parameters()))
            opt.zero_grad(set_to_none=True)
            seen["steps"] += 1
    except ConsistencyError as exc:
        seen["error"], seen["raised_in"] = exc, where
    finally:
        seen["summary"] = state.summary()
        seen["final"] = [p.detach().clone() for p in ddp.parameters()]
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
        assert seen["raised_in"] == "backward"


def test_on_a_cpu_the_verdict_is_read_in_backward_unless_deferred(pools):
    backward = pools.get(2).run(train_without_protocol, None)
    deferred = pools.get(2).run(train_without_protocol, None, 4, "optimizer-step")
    assert [s["deferred"] for s in backward] == [False, False]
    assert all(n == 0 for s in backward for n in s["pending_after_backward"])
    assert [s["deferred"] for s in deferred] == [True, True]
    assert all(n > 0 for s in deferred for n in s["pending_after_backward"])


def test_a_deferred_verdict_trains_bitwise_like_one_read_in_backward(pools):
    backward = pools.get(2).run(train_without_protocol, None)
    deferred = pools.get(2).run(train_without_protocol, None, 4, "optimizer-step")
    for a, b in zip(backward, deferred):
        assert a["error"] is None and b["error"] is None and b["steps"] == 4
        assert b["summary"]["steps"] == 4
        assert b["summary"]["checks_run"] == b["summary"]["checks_passed"] > 4
        assert all(torch.equal(x, y) for x, y in zip(a["final"], b["final"]))


def test_a_deferred_error_is_raised_from_the_optimizer_step_before_it_applies_anything(pools):
    for seen in pools.get(2).run(train_without_protocol, 2, 4, "optimizer-step"):
        err = seen["error"]
        assert isinstance(err, MissingGradient), err
        assert err.step == 2 and err.ranks == [1] and seen["steps"] == 2
        assert seen["raised_in"] == "optimizer.step" and seen["unchanged"]
