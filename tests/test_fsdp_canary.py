"""The compute canary on FSDP2 and HSDP (``sync/fsdp/canary.py``): the probe computes on the
full parameters the same gradients an unsharded copy of the model gives, leaves FSDP2's hooks,
state and sharded gradients as they were, trains bitwise as the canary-off run does on the
FSDP2 set-ups of the healthy-jobs table (weights, optimizer state, buffers, RNG), and names the
rank whose matmuls are corrupted on every rank, where ``harden()`` without it stays silent."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy
from torch.distributed.tensor import DTensor

from openclaw_ref.conformance.fsdp_run import FSDP_OPTION_SETS, device_mesh, shard_model
from openclaw_ref.core.sdc_faults import FaultyMatmul, entered, sdc_model
from openclaw_ref.sync.base import SyncConfig
from openclaw_ref.sync.canary.probe import run_probe
from openclaw_ref.sync.errors import ConsistencyError
from openclaw_ref.sync.fsdp.canary import hidden_fsdp_hooks
from openclaw_ref.sync.fsdp.canary_units import UnitGather, full_value
from openclaw_ref.sync.hardening import harden

STEPS = 4
K = 2  # the SDC runs: a fault from FAULT_STEP is captured there and named one step later
FAULT_STEP = 2
SDC_STEPS = FAULT_STEP + 2 * K + 1


class Net(nn.Module):
    """Blocks ``fully_shard`` wraps (``fsdp_run.blocks``: the children with parameters), with
    BatchNorm (a buffer the probe must not move) and dropout (an RNG stream it must not
    draw from); LayerNorm instead under a bf16 policy (stock FSDP2 casts the parameters, not
    BatchNorm's float32 buffers, and the forward fails)."""

    def __init__(self, bf16: bool = False) -> None:
        super().__init__()
        self.inp = nn.Sequential(nn.Linear(6, 16), nn.LayerNorm(16) if bf16 else
                                 nn.BatchNorm1d(16))
        self.drop = nn.Dropout(0.25)
        self.h1 = nn.Linear(16, 16)
        self.out = nn.Linear(16, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.h1(self.drop(torch.tanh(self.inp(x))))))


def _batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(8, 6, generator=g)
    return x, x[:, :2].sin()


def _sharded(wrapper: str, option_set: str, bf16: bool = False) -> nn.Module:
    """``Net`` under ``fully_shard`` (``fsdp2``, ``hsdp``: ``fsdp_run.shard_model``) or
    ``replicate_with_fsdp`` (``replicate``)."""
    torch.manual_seed(0)
    model = Net(bf16)
    if wrapper == "replicate":
        from torch.distributed._composable.replicate_with_fsdp import replicate

        return replicate(model)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16) if bf16 else MixedPrecisionPolicy()
    shard_model(model, device_mesh(wrapper, dist.get_world_size()),
                FSDP_OPTION_SETS[option_set], mp)
    return model


def _full(t):
    return t.full_tensor() if isinstance(t, DTensor) else t


def train_task(ctx, wrapper: str, option_set: str, every: int, bf16: bool = False) -> dict:
    """The option set's loop (micro-batches under ``set_requires_gradient_sync``), AdamW,
    ``harden()`` with the canary every ``every`` steps (0: off): the final state."""
    options = FSDP_OPTION_SETS[option_set]
    model = _sharded(wrapper, option_set, bf16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    guard = harden(model, SyncConfig(canary_every=every), ctx)
    torch.manual_seed(7 + ctx.rank)  # the dropout streams, rank-dependent as in a real job
    error = None
    try:
        for step in range(STEPS):
            for micro in range(options.accumulate):
                model.set_requires_gradient_sync(micro == options.accumulate - 1)
                x, y = _batch(step * options.accumulate + micro, ctx.rank)
                F.mse_loss(model(x).float(), y).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    except ConsistencyError as exc:
        error = (exc.kind, exc.step, exc.ranks)
    finally:
        guard.close()
    state = [(k, _full(v).clone()) for s in opt.state.values() for k, v in sorted(s.items())]
    return {"error": error, "events": [e.kind for e in guard.events],
            "probes": guard.canary.probes if guard.canary is not None else 0,
            "params": {n: _full(p).detach().clone() for n, p in model.named_parameters()},
            "buffers": {n: b.clone() for n, b in model.named_buffers()},
            "optimizer": state, "rng": torch.get_rng_state()}


def _bitwise_equal(a: dict, b: dict) -> None:
    for part in ("params", "buffers"):
        assert a[part].keys() == b[part].keys()
        for name in a[part]:
            assert torch.equal(a[part][name], b[part][name]), (part, name)
    assert len(a["optimizer"]) == len(b["optimizer"]) > 0
    for (k, x), (j, y) in zip(a["optimizer"], b["optimizer"]):
        assert k == j and torch.equal(x, y), k
    assert torch.equal(a["rng"], b["rng"])


def _assert_on_off_bitwise(pools, world: int, wrapper: str, option_set: str,
                           bf16: bool = False) -> None:
    pool = pools.get(world)
    off, on = (pool.run(train_task, wrapper, option_set, every, bf16) for every in (0, 1))
    for a, b in zip(off, on):
        assert a["error"] is b["error"] is None, (a["error"], b["error"])
        assert a["events"] == b["events"] == []
        assert b["probes"] >= STEPS - 1  # K = 1: a probe every step after the first
        _bitwise_equal(a, b)


@pytest.mark.parametrize("option_set", ["default", "reshard_after_forward=False"])
def test_fsdp2_trains_bitwise_the_same_with_the_canary_at_every_step(pools, option_set):
    _assert_on_off_bitwise(pools, 2, "fsdp2", option_set)


@pytest.mark.slow
@pytest.mark.parametrize("option_set", [
    "accumulation (set_requires_gradient_sync(False))", "activation checkpointing",
    "CPUOffloadPolicy"])
def test_fsdp2_trains_bitwise_the_same_with_the_canary_under_every_option(pools, option_set):
    _assert_on_off_bitwise(pools, 2, "fsdp2", option_set)


@pytest.mark.slow
def test_fsdp2_under_a_bf16_mixed_precision_policy_trains_bitwise_the_same_with_the_canary(
        pools):
    _assert_on_off_bitwise(pools, 2, "fsdp2", "default", bf16=True)


@pytest.mark.slow
def test_hsdp_trains_bitwise_the_same_with_the_canary_at_every_step(pools):
    _assert_on_off_bitwise(pools, 4, "hsdp", "default")


class _Upfront:
    """Every parameter a stand-in gathered up front: no unit gathered lazily."""

    ids, peak_bytes = frozenset(), 0

    def __init__(self, model) -> None:
        pass

    def installed(self, stream, where):
        from contextlib import nullcontext

        return nullcontext()


def leaky_train_task(ctx, every: int) -> dict:
    """``train_task`` with the probe run through FSDP2's hooks (not hidden) on stand-ins of
    every parameter: the leak the on/off comparison must see."""
    from contextlib import nullcontext

    from openclaw_ref.sync.fsdp import canary

    hidden, units = canary.hidden_fsdp_hooks, canary.UnitGather
    canary.hidden_fsdp_hooks = lambda model: nullcontext()
    canary.UnitGather = _Upfront
    try:
        return train_task(ctx, "fsdp2", "default", every)
    finally:
        canary.hidden_fsdp_hooks, canary.UnitGather = hidden, units


def test_a_probe_run_through_fsdp2s_own_hooks_would_change_training_and_is_seen(pools):
    """Why the hooks are hidden, and that the bitwise comparison above can fail: through
    FSDP2's hooks the probe's gradients are reduce-scattered into the sharded ``.grad``."""
    pool = pools.get(2)
    off, on = (pool.run(leaky_train_task, every) for every in (0, 1))
    assert [b["error"] for b in on] == [None, None]  # silently: nothing else sees it
    assert all(not torch.equal(a["params"][n], b["params"][n])
               for a, b in zip(off, on) for n in ("h1.weight", "out.weight"))


def probe_task(ctx) -> dict:
    """After one training step: the probe through FSDP2 beside the same probe on an unsharded
    copy of the model, and what FSDP2 holds before and after it."""
    model = _sharded("fsdp2", "default")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x, y = _batch(0, ctx.rank)
    F.mse_loss(model(x), y).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    plain = Net()
    plain.load_state_dict({n: _full(v).detach() for n, v in model.state_dict().items()})
    states = [m._get_fsdp_state() for m in model.modules() if isinstance(m, FSDPModule)]

    def seen() -> tuple:
        hooks = tuple((tuple(m._forward_pre_hooks), tuple(m._forward_hooks))
                      for m in model.modules())
        return hooks, tuple(str(s._training_state) for s in states), tuple(
            p.grad is None for p in model.parameters())

    before, buffers = seen(), copy.deepcopy(dict(model.named_buffers()))
    tracked = list(model.named_parameters())
    x = _batch(1, 0)[0][:2]
    with hidden_fsdp_hooks(model):
        inside = tuple(len(m._forward_pre_hooks) for m in model.modules())
    units = UnitGather(model)
    got = run_probe(model, tracked, (x,), {}, 11, value=full_value,
                    around=lambda: hidden_fsdp_hooks(model), lazy=units)
    reference = run_probe(plain, list(plain.named_parameters()), (x,), {}, 11)
    full = sum(p.numel() * p.element_size() for p in plain.parameters())
    largest = max(sum(p.numel() * p.element_size() for p in m.parameters())
                  for m in model.children() if isinstance(m, FSDPModule))
    after = seen()
    dist.barrier()
    return {"same": before == after, "inside": inside,
            "outside": tuple(len(m._forward_pre_hooks) for m in model.modules()),
            "buffers": all(torch.equal(b, buffers[n]) for n, b in model.named_buffers()),
            "grads": [g == r for g, r in zip(got.digest_list(), reference.digest_list())],
            "param_bytes": got.param_bytes, "full_bytes": full, "largest_unit": largest}


def test_the_fsdp2_probe_gives_the_unsharded_models_gradients_and_leaves_fsdp2_as_it_was(
        pools):
    for reply in pools.get(2).run(probe_task):
        assert reply["grads"] and all(reply["grads"]), reply["grads"]
        # one unit's full parameters at a time, not the model's
        assert 0 < reply["param_bytes"] <= reply["largest_unit"] < reply["full_bytes"], reply
        assert reply["same"] and reply["buffers"]
        assert sum(reply["inside"]) == 0 < sum(reply["outside"])  # FSDP2's hooks were hidden


def sdc_task(ctx, wrapper: str, fault: str, every: int, faulty_rank: int,
             start: int = FAULT_STEP, then: str = "", then_at: int = 0) -> dict:
    """``fault`` (``core/sdc_faults.py``) on ``faulty_rank`` from step ``start`` (from step
    ``then_at``, fault ``then`` instead, if given); what harden() with the canary every
    ``every`` steps (0: off) raised, and its events."""
    model = _sharded(wrapper, "default")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    guard = harden(model, SyncConfig(canary_every=every), ctx)
    mode = FaultyMatmul(sdc_model(fault, "")) if ctx.rank == faulty_rank else None
    error = None
    try:
        with entered(mode):
            for step in range(SDC_STEPS):
                if mode is not None:
                    mode.active = step >= start
                    if then and step == then_at:
                        mode.model = sdc_model(then, "1")
                x, y = _batch(step, ctx.rank)
                F.mse_loss(model(x), y).backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
    except ConsistencyError as exc:
        error = (exc.kind, exc.step, exc.ranks, str(exc))
    finally:
        guard.close(verify=error is None)
    return {"error": error, "fired": mode.fired if mode is not None else None,
            "events": [e.kind for e in guard.events]}


@pytest.mark.parametrize("fault", ["sdc-backward", "sdc-forward"])
def test_an_sdc_rank_under_fsdp2_is_named_by_the_canary_within_2k_steps_on_every_rank(
        pools, fault):
    replies = pools.get(2).run(sdc_task, "fsdp2", fault, K, 1)
    assert replies[1]["fired"] > 0
    for reply in replies:
        kind, step, ranks, text = reply["error"]
        assert (kind, ranks) == ("ComputeMismatch", [0, 1])  # two ranks: both suspects
        assert 0 <= step - FAULT_STEP <= 2 * K and "no majority" in text, text


@pytest.mark.parametrize("fault", ["sdc-backward", "sdc-forward"])
def test_an_sdc_rank_under_fsdp2_goes_unseen_by_harden_without_the_canary(pools, fault):
    replies = pools.get(2).run(sdc_task, "fsdp2", fault, 0, 1)
    assert replies[1]["fired"] > 0
    assert [r["error"] for r in replies] == [None, None]


def test_a_fault_present_at_start_up_is_named_by_the_fsdp2_canary_at_its_first_probe(pools):
    """The fingerprints agree, so the first probe is compared bitwise: a 1-ulp fault from step
    0 persists over the re-runs and is named (both ranks: two, no majority)."""
    replies = pools.get(2).run(sdc_task, "fsdp2", "sdc-ulp", K, 1, 0)
    for reply in replies:
        assert reply["events"] == ["ComputeMismatch"], reply["events"]  # no canary event
        kind, step, ranks, text = reply["error"]
        assert (kind, ranks, step) == ("ComputeMismatch", [0, 1], 1), text


@pytest.mark.slow
def test_an_sdc_rank_under_hsdp_is_named_as_the_outlier_on_every_rank(pools):
    replies = pools.get(4).run(sdc_task, "hsdp", "sdc-backward", K, 3)
    for reply in replies:
        kind, step, ranks, text = reply["error"]
        assert (kind, ranks) == ("ComputeMismatch", [3]) and 0 <= step - FAULT_STEP <= 2 * K, text



# the zoo's models that stock fully_shard runs (tied_lm, sparse_embedding and moe_router it
# refuses; branching leaves parameters unused, which the guard names before any probe)
ZOO = ("models:batchnorm_cnn", "models:frozen_layers", "models:contrastive", "fsdp:mlp")


@pytest.mark.slow
@pytest.mark.parametrize("model", ZOO)
def test_on_the_zoos_models_the_fsdp2_canary_is_bitwise_silent_and_names_an_sdc_rank(
        pools, model):
    from openclaw_ref.conformance.canary_run import canary_task

    factory, pool = f"openclaw_ref.conformance.zoo.{model}", pools.get(2)
    off, on = (pool.run(canary_task, factory, every, 4, "", 0, "fsdp2") for every in (0, 1))
    for a, b in zip(off, on):
        assert a["error"] is b["error"] is None and b["events"] == [], (a["error"], b["error"])
        assert all(torch.equal(p, b["params"][n]) for n, p in a["params"].items())
    faulty = pool.run(canary_task, factory, K, 6, "sdc-ulp", FAULT_STEP, "fsdp2")
    assert [(r["error"]["kind"], r["error"]["ranks"]) for r in faulty] == [
        ("ComputeMismatch", [0, 1])] * 2  # two ranks: both suspects
    assert all(0 <= r["error"]["step"] - FAULT_STEP <= 2 * K for r in faulty)


def unhideable_task(ctx) -> tuple[str, bool]:
    """harden() with the canary where FSDP2 keeps no handle of its root's forward pre-hook (as
    a torch other than 2.13 might): the refusal, and whether the root's hooks are as before."""
    from openclaw_ref.sync.errors import BadInput

    model = _sharded("fsdp2", "default")
    state = model._get_fsdp_state()
    handle, state._pre_forward_hook_handle = state._pre_forward_hook_handle, None
    before = (tuple(model._forward_pre_hooks), tuple(model._forward_hooks))
    try:
        harden(model, SyncConfig(canary_every=1), ctx)
    except BadInput as exc:
        return str(exc), before == (tuple(model._forward_pre_hooks), tuple(model._forward_hooks))
    finally:
        state._pre_forward_hook_handle = handle
    return "accepted", False


def test_fsdp2_hooks_the_probe_cannot_hide_refuse_the_canary_before_anything_is_registered(
        pools):
    for text, untouched in pools.get(2).run(unhideable_task):
        assert "cannot hide FSDP2's own forward hooks" in text and untouched, text



@pytest.mark.slow
def test_replicate_with_fsdp_takes_the_canary_bitwise_and_names_an_sdc_rank(pools):
    """FSDP2's replicate mesh (every rank holds whole parameters: ``full_tensor`` gathers
    nothing)."""
    _assert_on_off_bitwise(pools, 2, "replicate", "default")
    faulty = pools.get(2).run(sdc_task, "replicate", "sdc-backward", K, 1)
    for reply in faulty:
        kind, step, ranks, text = reply["error"]
        assert (kind, ranks) == ("ComputeMismatch", [0, 1])  # two ranks: both suspects
        assert 0 <= step - FAULT_STEP <= 2 * K, text
