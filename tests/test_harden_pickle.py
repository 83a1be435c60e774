"""A hardened DDP model pickles, ``torch.save``s and deep-copies as a stock one does, under
either guard, 2 gloo ranks: the copy (or the loaded model) is a plain DDP — nothing of the
guard came with it, so ``harden()`` takes it again and it trains — and the live model stays
guarded: a forward through ``ddp.module`` after the copy is still ``GradientsNotAveraged`` on
the rank that made it. Nothing of the guard is in ``state_dict()``. One job per guard checks
every behaviour; each test reads one."""

from __future__ import annotations

import copy
import io
import pickle

import pytest
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from openclaw_ref.sync.base import SyncConfig
from openclaw_ref.sync.errors import GradientsNotAveraged
from openclaw_ref.sync.hardening import harden
from openclaw_ref.sync.target import HARDENED_MARK

BYPASS_RANK = 1
HOOK_DICTS = ("_forward_pre_hooks", "_forward_hooks", "_backward_hooks",
              "_forward_pre_hooks_with_kwargs", "_forward_hooks_with_kwargs")


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))


def _saved(ddp: DDP) -> DDP:
    buf = io.BytesIO()
    torch.save(ddp, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=False)


WAYS = {"pickle": lambda m: pickle.loads(pickle.dumps(m)), "deepcopy": copy.deepcopy,
        "torch.save": _saved}


def _footprint(ddp: DDP) -> dict:
    """What a DDP object and its module carry beyond their parameters: attribute names, hook
    counts, comm hooks, the mark."""
    return {"attrs": sorted(ddp.__dict__), "module_attrs": sorted(ddp.module.__dict__),
            "hooks": {n: (len(getattr(ddp, n, {})), len(getattr(ddp.module, n, {})))
                      for n in HOOK_DICTS},
            "comm_hooks": len(ddp._comm_hooks), "marked": hasattr(ddp, HARDENED_MARK)}


def _step(ddp: DDP, gen: torch.Generator) -> None:
    ddp(torch.randn(4, 8, generator=gen)).square().mean().backward()


def _replicas_equal(ddp: DDP) -> bool:
    flat = torch.cat([p.detach().flatten() for p in ddp.module.parameters()])
    gathered = [torch.empty_like(flat) for _ in range(2)]
    torch.distributed.all_gather(gathered, flat)
    return torch.equal(gathered[0], gathered[1])


def copies_task(ctx, guard: str) -> dict:
    """A hardened DDP after one step, copied each way; each copy's footprint beside a stock
    copy's, hardened again and trained a step; then the live model's bypass."""
    gen = torch.Generator().manual_seed(100 + ctx.rank)
    stock = DDP(_model())
    _step(stock, gen)
    ddp = DDP(_model())
    state = harden(ddp, SyncConfig(guard=guard))
    for _ in range(2):  # past DDP's bucket rebuild (a broadcast at its second forward)
        _step(ddp, gen)
    reply: dict = {"stock_keys": sorted(stock.state_dict()), "keys": sorted(ddp.state_dict()),
                   "copies": {}}
    for way, make in WAYS.items():
        stock_copy, hardened_copy = make(stock), make(ddp)
        got = {"plain": _footprint(hardened_copy) == _footprint(stock_copy),
               "footprint": _footprint(hardened_copy)}
        again = harden(hardened_copy, SyncConfig(guard=guard))
        opt = torch.optim.SGD(hardened_copy.parameters(), lr=0.1)
        _step(hardened_copy, gen)
        opt.step()
        got["trained_equal"] = _replicas_equal(hardened_copy)
        again.close()
        reply["copies"][way] = got
    reply["live_marked"] = getattr(ddp, HARDENED_MARK, None) is state
    forward = ddp.module if ctx.rank == BYPASS_RANK else ddp
    try:
        forward(torch.randn(4, 8, generator=gen)).square().mean().backward()
        reply["bypass"] = None
    except GradientsNotAveraged as exc:
        reply["bypass"] = exc.ranks
    state.close(verify=False)
    reply["closed_copy_plain"] = _footprint(copy.deepcopy(ddp)) == _footprint(copy.deepcopy(
        stock))
    return reply


@pytest.fixture(scope="module", params=["step", "bucket"])
def replies(request, pools):
    return pools.get(2).run(copies_task, request.param)


@pytest.mark.parametrize("way", list(WAYS))
def test_a_hardened_ddp_copies_as_a_plain_ddp_without_the_guard(replies, way):
    for reply in replies:
        assert reply["copies"][way]["plain"], reply["copies"][way]["footprint"]
        assert not reply["copies"][way]["footprint"]["marked"]


@pytest.mark.parametrize("way", list(WAYS))
def test_a_copy_of_a_hardened_ddp_is_hardened_again_and_trains_equal_replicas(replies, way):
    for reply in replies:
        assert reply["copies"][way]["trained_equal"]


def test_nothing_of_the_guard_is_in_the_state_dict(replies):
    for reply in replies:
        assert reply["keys"] == reply["stock_keys"]


def test_copying_leaves_the_live_model_guarded_a_bypass_still_named(replies):
    for reply in replies:
        assert reply["live_marked"]
        assert reply["bypass"] == [BYPASS_RANK]


def test_a_closed_hardened_ddp_copies_as_a_plain_ddp(replies):
    assert all(reply["closed_copy_plain"] for reply in replies)
