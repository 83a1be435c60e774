"""Every way a forward legitimately reaches DDP is DDP's to ``harden()``, under either guard, 2
gloo ranks: ``ddp(x)``, ``ddp.forward(x)`` (DDP's own forward, which skips the DDP object's
``__call__`` and its forward pre-hooks, as PyTorch's own DDP tests call it), DDP inside
another module's forward (``self.ddp(x)`` or ``self.ddp.forward(x)``), and PyTorch's
``test_grads_same_across_ranks_with_no_sync`` pattern — a rank-dependent branch,
``find_unused_parameters=True``, ``no_sync()`` accumulation, ``ddp.forward(x)`` — each trains
silent and bitwise as the same stock DDP job. Only a forward that bypasses DDP's reducer
preparation is ``GradientsNotAveraged``: ``ddp.module(x)`` on the syncing micro-step of that
same pattern, named on the rank that made it. A compiled DDP (``torch.compile(ddp)``):
``tests/test_harden_ddp_surface.py``."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from openclaw_ref.sync.base import SyncConfig
from openclaw_ref.sync.errors import ConsistencyError, GradientsNotAveraged
from openclaw_ref.sync.hardening import harden

STEPS, ACCUM = 3, 2
BYPASS_RANK, BYPASS_STEP = 1, 2


class Branchy(nn.Module):
    """PyTorch's test model in spirit: rank 1 runs a branch rank 0 never does."""

    def __init__(self, rank: int) -> None:
        super().__init__()
        self.rank = rank
        self.a, self.b, self.c = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.a(x))
        if self.rank == 1:
            h = torch.relu(self.b(h))
        return self.c(h)


class Outer(nn.Module):
    """Another wrapper whose forward reaches DDP (``through``: "call" or "forward")."""

    def __init__(self, ddp: DDP, through: str) -> None:
        super().__init__()
        self.ddp, self.through = ddp, through

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (self.ddp(x) if self.through == "call" else self.ddp.forward(x)) * 2


def _build(ctx, path: str) -> DDP:
    torch.manual_seed(0)
    if path == "no_sync pattern":
        return DDP(Branchy(ctx.rank), find_unused_parameters=True)
    return DDP(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)))


def _forward(ddp: DDP, path: str, rank: int, step: int, micro: int, bypass: bool):
    """The forward of ``path``; ``bypass``: rank ``BYPASS_RANK``'s syncing micro-step of
    step ``BYPASS_STEP`` runs through ``ddp.module`` instead."""
    if bypass and rank == BYPASS_RANK and (step, micro) == (BYPASS_STEP, ACCUM - 1):
        return ddp.module
    return {"ddp(x)": ddp, "ddp.forward(x)": ddp.forward, "no_sync pattern": ddp.forward,
            "wrapper calls ddp(x)": Outer(ddp, "call"),
            "wrapper calls ddp.forward(x)": Outer(ddp, "forward")}[path]


def _train(ctx, ddp: DDP, path: str, bypass: bool = False) -> list[torch.Tensor]:
    """``STEPS`` optimizer steps of ``ACCUM`` micro-steps (the first under ``no_sync()``);
    the final parameters."""
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(100 + ctx.rank)
    for step in range(STEPS):
        for micro in range(ACCUM):
            forward = _forward(ddp, path, ctx.rank, step, micro, bypass)
            x = torch.randn(4, 8, generator=gen)
            if micro < ACCUM - 1:
                with ddp.no_sync():
                    forward(x).square().mean().backward()
            else:
                forward(x).square().mean().backward()
        opt.step()
        opt.zero_grad()
    return [p.detach().clone() for p in ddp.module.parameters()]


PATHS = ["ddp(x)", "ddp.forward(x)", "wrapper calls ddp(x)", "wrapper calls ddp.forward(x)",
         "no_sync pattern"]


def paths_task(ctx, guard: str) -> dict:
    """Each path stock and hardened: the error (None) and whether the weights are bitwise the
    stock run's; then the bypass in the no_sync pattern."""
    reply: dict = {}
    for path in PATHS:
        stock = _train(ctx, _build(ctx, path), path)
        ddp = _build(ctx, path)
        state = harden(ddp, SyncConfig(guard=guard))
        try:
            hardened, error = _train(ctx, ddp, path), None
        except ConsistencyError as exc:
            hardened, error = [], f"{type(exc).__name__}: {exc}"
        state.close(verify=error is None)
        reply[path] = {"error": error, "events": [e.kind for e in state.events],
                       "bitwise": len(hardened) == len(stock)
                       and all(torch.equal(h, s) for h, s in zip(hardened, stock))}
    ddp = _build(ctx, "no_sync pattern")
    state = harden(ddp, SyncConfig(guard=guard))
    try:
        _train(ctx, ddp, "no_sync pattern", bypass=True)
        reply["bypass"] = None
    except GradientsNotAveraged as exc:
        reply["bypass"] = {"step": exc.step, "ranks": exc.ranks, "words": str(exc)}
    state.close(verify=False)
    return reply


@pytest.fixture(scope="module", params=["step", "bucket"])
def replies(request, pools):
    return pools.get(2).run(paths_task, request.param)


@pytest.mark.parametrize("path", PATHS)
def test_a_forward_that_reaches_ddp_trains_silent_and_bitwise_as_stock(replies, path):
    for reply in replies:
        got = reply[path]
        assert got["error"] is None, got["error"]
        assert "GradientsNotAveraged" not in got["events"]
        assert got["bitwise"]


def test_a_forward_through_ddp_module_on_the_syncing_micro_step_is_named_on_its_rank(replies):
    for reply in replies:
        got = reply["bypass"]
        assert got is not None, "the bypass went unseen"
        assert got["ranks"] == [BYPASS_RANK] and got["step"] == BYPASS_STEP, got
        assert "the forward ran through ddp.module" in got["words"]
