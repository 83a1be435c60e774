"""``harden()`` with its defaults answers "were the gradients averaged?" in a plain
``loss.backward(); opt.step()`` loop on a plain 4-layer MLP, 2 gloo ranks: the two published
patterns in which DDP averages nothing — the model converted after wrapping (pytorch#104336) and
a forward through ``ddp.module`` — raise ``GradientsNotAveraged`` from ``backward()`` on every
rank, naming the cause, before the optimizer applies the step; every legitimate way of issuing
no bucket (``no_sync()``, ``join()``, unused branches, static graph, frozen parameters, a loss
that does not reach the parameters, a loss scaler) stays silent and trains replicas equal."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from openclaw_ref.sync.base import SyncConfig
from openclaw_ref.sync.canary.row import CanaryEvent
from openclaw_ref.sync.errors import GradientsNotAveraged
from openclaw_ref.sync.hardening import harden

STEPS = 4


class Branchy(nn.Module):
    """A plain 4-layer MLP with one optional branch (``use_branch``)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(),
                                  nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 1))
        self.branch = nn.Linear(8, 1)
        self.use_branch = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x) + (self.branch(x) if self.use_branch else 0.0)


def _wrap(case: str) -> DDP:
    torch.manual_seed(0)
    model = Branchy()
    if case == "frozen":
        model.body[0].requires_grad_(False)
    return DDP(model, find_unused_parameters=case == "unused", static_graph=case == "static")


def _batch(gen: torch.Generator) -> torch.Tensor:
    return torch.randn(8, 8, generator=gen)


def _clean_loop(ctx, case: str, ddp: DDP, opt: torch.optim.Optimizer) -> None:
    """``STEPS`` optimizer steps of ``case``, each a legitimate use of DDP."""
    gen = torch.Generator().manual_seed(100 + ctx.rank)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8) if case == "scaler" else None
    batches = STEPS + ctx.rank if case == "join" else STEPS  # uneven inputs
    with ddp.join() if case == "join" else _nothing():
        for step in range(batches):
            if case == "unused":
                ddp.module.use_branch = (step + ctx.rank) % 2 == 0  # rank-dependent
            if case == "no_sync":
                with ddp.no_sync():
                    ddp(_batch(gen)).square().mean().backward()
            loss = ddp(_batch(gen)).square().mean()
            if scaler is not None:
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
            else:
                loss.backward()
                opt.step()
            opt.zero_grad()
            if case == "unrelated":  # a backward that reaches no parameter of the model
                (torch.ones(3, requires_grad=True) * 2).sum().backward()
                x = _batch(gen).requires_grad_()
                torch.autograd.grad(ddp.module(x).sum(), x)  # an input saliency: no parameter


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc) -> None:
        return None


def clean_task(ctx, case: str) -> dict:
    ddp = _wrap(case)
    state = harden(ddp)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    reply: dict = {"error": None}
    try:
        _clean_loop(ctx, case, ddp, opt)
    except Exception as exc:  # reported, not raised: the test names it
        reply["error"] = f"{type(exc).__name__}: {exc}"
    reply["summary"] = state.summary()
    reply["events"] = list(state.events)
    state.close()
    flat = torch.cat([p.detach().flatten() for p in ddp.module.parameters()])
    gathered = [torch.empty_like(flat) for _ in range(ctx.world_size)]
    dist.all_gather(gathered, flat)
    reply["replicas_equal"] = all(torch.equal(g, gathered[0]) for g in gathered)
    return reply


def faulty_task(ctx, case: str, guard: str = "step") -> dict:
    """The published pattern ``case`` on every rank; what each rank saw."""
    ddp = _wrap("plain")
    state = harden(ddp, SyncConfig(guard=guard))
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(100 + ctx.rank)
    forward = ddp.module if case == "bypassed" else ddp
    reply: dict = {"error": None, "kind": None, "step": None}
    for step in range(STEPS):
        if (case, step) in (("converted", 0), ("converted later", 2)):
            ddp.double()
            ddp.float()
        if (case, step) == ("reassigned", 1):  # a Parameter put in its place (DDP's one bucket)
            ddp.module.body[2].weight = nn.Parameter(ddp.module.body[2].weight.detach().clone())
        before = [p.detach().clone() for p in ddp.module.parameters()]
        try:
            forward(_batch(gen)).square().mean().backward()
        except GradientsNotAveraged as exc:
            reply.update(error=str(exc), kind=exc.kind, step=step, ranks=exc.ranks)
            break
        opt.step()
        opt.zero_grad()
    reply["unchanged"] = all(torch.equal(b, p) for b, p in zip(before, ddp.module.parameters()))
    state.close()
    dist.barrier()
    return reply


CLEAN = ["plain", "no_sync", "join", "unused", "static", "frozen", "unrelated", "scaler"]


@pytest.mark.parametrize("case", CLEAN)
def test_legitimate_uses_of_ddp_stay_silent_and_average(pools, case):
    for reply in pools.get(2).run(clean_task, case):
        assert reply["error"] is None, reply["error"]
        canary = reply["summary"]["canary"]
        if case == "unused":  # a rank-dependent branch: the probe cannot replay it, said once
            assert [e.kind for e in reply["events"]] == [CanaryEvent.UNAVAILABLE]
            assert canary["mode"] == "off" and "different paths" in canary["why"]
        else:
            assert reply["events"] == [] and canary["mode"] == "bitwise", canary
        s = reply["summary"]
        assert s["checks_run"] == s["checks_passed"]
        assert reply["replicas_equal"]


@pytest.mark.parametrize("guard", ["step", "bucket"])
@pytest.mark.parametrize("case,cause,step", [
    ("converted", "parameters were replaced after DDP wrapped them", 0),
    ("converted later", "parameters were replaced after DDP wrapped them", 2),
    ("bypassed", "the forward ran through ddp.module", 0),
    ("reassigned", "parameters were replaced after DDP wrapped them", 1),
])
def test_gradients_ddp_never_averaged_raise_on_every_rank_before_the_step(pools, case, cause,
                                                                           step, guard):
    replies = pools.get(2).run(faulty_task, case, guard)
    for reply in replies:
        assert reply["kind"] == "GradientsNotAveraged", reply
        assert cause in reply["error"]
        assert reply["step"] == step and reply["ranks"] == [0, 1]  # every rank's DDP failed
        assert reply["unchanged"]  # the optimizer had no un-averaged gradient to apply
        if case == "reassigned":
            assert reply["error"].endswith("[params: body.2.weight]"), reply["error"]
