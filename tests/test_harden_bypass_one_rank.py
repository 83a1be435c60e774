"""One rank's forward through ``ddp.module`` instead of the DDP wrapper, under ``harden()``'s
defaults, 2 gloo ranks, in a plain loop and in the gradient-accumulation idiom
(``ddp.require_backward_grad_sync = micro == last``, as nanoGPT's train.py does, or
``ddp.no_sync()``): on a micro-step DDP would have averaged, every rank raises the same
``GradientsNotAveraged`` — class, step, ranks and words — naming the bypassing rank, before the
optimizer applies the step; on a micro-step DDP would not have averaged, the bypass is harmless
and the job trains bitwise as stock DDP does."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from openclaw_ref.sync.base import SyncConfig
from openclaw_ref.sync.errors import ConsistencyError, GradientsNotAveraged
from openclaw_ref.sync.hardening import harden

STEPS, ACCUM = 4, 2
BYPASS_STEP, BYPASS_RANK = 2, 1


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(),
                         nn.Linear(16, 1))


def _micro_batch(gen: torch.Generator) -> torch.Tensor:
    return torch.randn(4, 8, generator=gen)


def _train(ctx, ddp: DDP, bypass: tuple[int, int] | None, idiom: str) -> None:
    """``STEPS`` optimizer steps of ``ACCUM`` micro-steps, the last one syncing; rank
    ``BYPASS_RANK`` runs micro-step ``bypass`` = (step, micro) through ``ddp.module``.
    ``idiom``: "flag" sets ``require_backward_grad_sync``, "no_sync" enters ``ddp.no_sync()``."""
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(100 + ctx.rank)
    for step in range(STEPS):
        for micro in range(ACCUM):
            syncing = micro == ACCUM - 1
            forward = (ddp.module if ctx.rank == BYPASS_RANK and (step, micro) == bypass
                       else ddp)
            if idiom == "flag":
                ddp.require_backward_grad_sync = syncing
            with ddp.no_sync() if idiom == "no_sync" and not syncing else _Nothing():
                (forward(_micro_batch(gen)).square().mean() / ACCUM).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


class _Nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc) -> None:
        return None


def _params(module: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in module.parameters()]


def accumulation_task(ctx, micro: int, idiom: str, guard: str = "step") -> dict:
    """Stock DDP without and with the bypass at (``BYPASS_STEP``, ``micro``), then the hardened
    job with it: the final parameters of each, and what the hardened job raised."""
    stock_clean = DDP(_model())
    _train(ctx, stock_clean, None, idiom)
    reply: dict = {"stock_clean": _params(stock_clean.module), "error": None}
    if micro != ACCUM - 1:  # stock DDP on a syncing bypass hangs or pairs the wrong buckets
        stock = DDP(_model())
        _train(ctx, stock, (BYPASS_STEP, micro), idiom)
        reply["stock"] = _params(stock.module)
    hardened = DDP(_model())
    state = harden(hardened, SyncConfig(guard=guard))
    try:
        _train(ctx, hardened, (BYPASS_STEP, micro), idiom)
    except ConsistencyError as exc:
        reply["error"] = exc
    else:
        reply["events"] = list(state.events)
        reply["summary"] = state.summary()
    finally:
        state.close(verify=reply["error"] is None)
    reply["hardened"] = _params(hardened.module)
    return reply


def plain_task(ctx, guard: str) -> dict:
    """A plain ``backward(); opt.step()`` loop; rank ``BYPASS_RANK``'s forward of step
    ``BYPASS_STEP`` through ``ddp.module``."""
    ddp = DDP(_model())
    state = harden(ddp, SyncConfig(guard=guard))
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(100 + ctx.rank)
    reply: dict = {"error": None}
    for step in range(STEPS):
        forward = ddp.module if ctx.rank == BYPASS_RANK and step == BYPASS_STEP else ddp
        before = _params(ddp.module)
        try:
            forward(_micro_batch(gen)).square().mean().backward()
        except ConsistencyError as exc:
            reply["error"] = exc
            break
        opt.step()
        opt.zero_grad()
    reply["unchanged"] = all(torch.equal(b, p) for b, p in zip(before, ddp.module.parameters()))
    state.close(verify=False)
    return reply


def _one_verdict(replies: list[dict]) -> ConsistencyError:
    """The error every rank raised, asserted the same on each: class, step, ranks, bucket,
    parameters and words."""
    errors = [r["error"] for r in replies]
    assert all(e is not None for e in errors), errors
    first = errors[0]
    for e in errors[1:]:
        assert type(e) is type(first), errors
        assert (e.step, e.ranks, e.bucket, e.params, str(e)) == (
            first.step, first.ranks, first.bucket, first.params, str(first)), errors
    return first


@pytest.mark.parametrize("guard", ["step", "bucket"])
def test_a_syncing_forward_through_ddp_module_on_one_rank_raises_one_verdict_everywhere(pools,
                                                                                        guard):
    replies = pools.get(2).run(plain_task, guard)
    err = _one_verdict(replies)
    assert isinstance(err, GradientsNotAveraged), err
    assert err.step == BYPASS_STEP and err.ranks == [BYPASS_RANK]
    assert "the forward ran through ddp.module" in str(err)
    assert all(r["unchanged"] for r in replies)  # no optimizer step applied that step


@pytest.mark.parametrize("guard", ["step", "bucket"])
@pytest.mark.parametrize("idiom", ["flag", "no_sync"])
def test_a_bypass_on_the_syncing_micro_step_raises_one_verdict_everywhere(pools, idiom, guard):
    replies = pools.get(2).run(accumulation_task, ACCUM - 1, idiom, guard)
    err = _one_verdict(replies)
    assert isinstance(err, GradientsNotAveraged), err
    assert err.step == BYPASS_STEP and err.ranks == [BYPASS_RANK]
    assert "the forward ran through ddp.module" in str(err)


@pytest.mark.parametrize("guard", ["step", "bucket"])
@pytest.mark.parametrize("idiom", ["flag", "no_sync"])
def test_a_bypass_on_a_micro_step_ddp_does_not_sync_trains_bitwise_as_stock_ddp(pools, idiom,
                                                                                guard):
    for reply in pools.get(2).run(accumulation_task, 0, idiom, guard):
        assert reply["error"] is None, reply["error"]
        assert reply["events"] == []
        s = reply["summary"]
        assert s["checks_run"] == s["checks_passed"] and s["bucket_checks"] == STEPS  # 1 a step
        assert all(torch.equal(h, s) for h, s in zip(reply["hardened"], reply["stock"]))
        # the bypass is harmless to stock DDP too: the same weights as the clean run
        assert all(torch.equal(s, c) for s, c in zip(reply["stock"], reply["stock_clean"]))
