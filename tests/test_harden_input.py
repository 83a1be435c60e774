"""``harden()`` refuses what it cannot verify, with one ``BadInput`` and nothing registered."""

from __future__ import annotations

import json

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.optim.optimizer import _global_optimizer_pre_hooks

from openclaw_ref.arms.config import ArmConfig, Planner
from openclaw_ref.sync.base import NonFinitePolicy, SyncConfig, Wire
from openclaw_ref.sync.errors import BadInput
from openclaw_ref.sync.hardening import harden
from openclaw_ref.sync.target import process_backend, reducible_dtypes, validate_target


def harden_twice(ctx, guard: str) -> tuple[str, int]:
    ddp = DDP(nn.Linear(4, 2))
    state = harden(ddp, SyncConfig(guard=guard), ctx)
    try:
        harden(ddp, SyncConfig(), ctx)
    except BadInput as exc:
        return str(exc), len(ddp._comm_hooks)
    finally:
        state.close()
    return "", len(ddp._comm_hooks)


def harden_a_plain_module(ctx) -> str:
    try:
        harden(nn.Linear(4, 2), SyncConfig(), ctx)
    except BadInput as exc:
        return str(exc)
    return ""


def test_a_model_that_is_not_ddp_is_refused(pools):
    assert all("DistributedDataParallel" in m for m in pools.get(2).run(harden_a_plain_module))


@pytest.mark.parametrize("guard,hooks", [("step", 0), ("bucket", 1)])
def test_hardening_twice_is_refused_and_leaves_what_the_first_registered(pools, guard, hooks):
    for message, left in pools.get(2).run(harden_twice, guard):
        assert "already hardened" in message and left == hooks


def harden_over_a_registered_hook(ctx, kind: str) -> str:
    """Only rank 0 registers ``kind`` and calls harden(); rank 1 never does. Had harden() run
    a collective before refusing, rank 0 would wait for rank 1 forever."""
    ddp = DDP(nn.Linear(4, 2))
    message = ""
    if ctx.rank == 0:
        if kind == "python":
            ddp.register_comm_hook(None, default_hooks.allreduce_hook)
        else:
            ddp._register_builtin_comm_hook(dist.BuiltinCommHookType.ALLREDUCE)
        try:
            harden(ddp, SyncConfig(), ctx).close()
        except BadInput as exc:
            message = str(exc)
    dist.barrier()
    return message


@pytest.mark.parametrize("kind,name", [("python", "allreduce_hook"),
                                       ("builtin", "BuiltinCommHookType.ALLREDUCE")])
def test_a_hook_already_registered_is_refused_before_any_collective(pools, kind, name):
    message, _ = pools.get(2).run(harden_over_a_registered_hook, kind, timeout_s=60)
    assert "already has a comm hook" in message and name in message


def harden_what_needs_the_bucket_guard(ctx, kwargs: dict) -> str:
    """Only rank 0 asks; had harden() run a collective before refusing, it would hang."""
    ddp = DDP(nn.Linear(4, 2))
    message = ""
    if ctx.rank == 0:
        try:
            harden(ddp, SyncConfig(**kwargs), ctx).close()
        except BadInput as exc:
            message = f"{exc} | hooks left: {len(ddp._forward_pre_hooks)}"
    dist.barrier()
    return message


@pytest.mark.parametrize("kwargs,words", [
    ({"wire": "bf16"}, "a bf16 wire needs the per-bucket guard"),
    ({"wire": "fp16", "scale": "4096"}, "an fp16 pre-scale (--scale 4096) needs"),
    ({"wire": "fp16", "scale": "auto"}, "an fp16 pre-scale (--scale auto) needs"),
])
def test_the_step_guard_refuses_what_only_the_bucket_guard_sends_before_any_collective(
        pools, kwargs, words):
    message, _ = pools.get(2).run(harden_what_needs_the_bucket_guard, kwargs, timeout_s=60)
    assert words in message and "guard='bucket'" in message
    assert message.endswith("hooks left: 0")


def harden_on_a_group_without_backend(ctx) -> dict:
    """A process group created without a backend reports "undefined"; its CPU backend is
    gloo, which the dtype checks must judge (not skip)."""
    group = dist.new_group(backend="undefined")
    ddp = DDP(nn.Linear(4, 2), process_group=group)
    bf16 = SyncConfig(wire="bf16", guard="bucket")  # judged: gloo reduces bf16
    reply = {"reported": dist.get_backend(group), "judged": validate_target(ddp, bf16)}
    state = harden(ddp, bf16, ctx)
    ddp(torch.ones(3, 4)).sum().backward()
    reply["checks"] = state.summary()["bucket_checks"]
    state.close()
    try:
        process_backend(group, torch.device("cuda"))
    except BadInput as exc:
        reply["cuda"] = str(exc)
    return reply


def test_a_group_without_backend_is_judged_by_its_device_backend_or_refused(pools):
    for reply in pools.get(2).run(harden_on_a_group_without_backend):
        assert reply["reported"] == "undefined" and reply["judged"] == "gloo"
        assert reply["checks"] == 1
        assert "no backend for cuda" in reply["cuda"]


def close_and_keep_training(ctx) -> dict:
    """harden(), one checked step, close(); DDP keeps averaging like stock DDP."""
    torch.manual_seed(0)
    ddp = DDP(nn.Linear(4, 2))
    torch.manual_seed(0)
    plain = DDP(nn.Linear(4, 2))
    before = len(ddp._forward_pre_hooks)
    optimizer_hooks = len(_global_optimizer_pre_hooks)
    state = harden(ddp, SyncConfig(), ctx)
    added = len(ddp._forward_pre_hooks) - before
    added_optimizer = len(_global_optimizer_pre_hooks) - optimizer_hooks
    x = torch.full((3, 4), float(ctx.rank + 1))
    for model in (ddp, plain):
        for _ in range(2):
            model(x).square().sum().backward()
    checked = state.summary()["bucket_checks"]
    state.close()
    for model in (ddp, plain):
        model(x).square().sum().backward()
    return {"added": added, "left": len(ddp._forward_pre_hooks) - before,
            "added_optimizer": added_optimizer,
            "left_optimizer": len(_global_optimizer_pre_hooks) - optimizer_hooks,
            "thread": state.watchdog._thread.is_alive(), "checked": checked,
            "after": state.summary()["bucket_checks"],
            "equal": all(torch.equal(a.grad, b.grad) for a, b in
                         zip(ddp.parameters(), plain.parameters()))}


def test_close_removes_the_hooks_and_thread_and_ddp_averages_as_before(pools):
    for reply in pools.get(2).run(close_and_keep_training):
        assert reply["added"] == 1 and reply["left"] == 0 and not reply["thread"]
        assert reply["added_optimizer"] == 1 and reply["left_optimizer"] == 0
        assert reply["checked"] == 2 and reply["after"] == 2  # closed: nothing checked
        assert reply["equal"]  # the inert hook averages exactly as DDP's own allreduce


@pytest.mark.parametrize("backend,nccl,dtype,ok", [
    ("gloo", None, torch.bfloat16, True),
    ("gloo", None, torch.float16, True),
    ("nccl", (2, 9, 9), torch.bfloat16, False),
    ("nccl", (2, 18, 1), torch.bfloat16, True),
    ("nccl", (2, 9, 9), torch.float16, True),
])
def test_wire_dtypes_are_checked_against_what_the_backend_can_reduce(backend, nccl, dtype, ok):
    assert (dtype in reducible_dtypes(backend, nccl)) is ok


def test_an_unknown_nonfinite_policy_is_bad_input():
    with pytest.raises(BadInput, match="nonfinite"):
        SyncConfig(nonfinite="ignore")


@pytest.mark.parametrize("kwargs, flag", [(dict(wire="fp8"), "--wire"),
                                          (dict(planner="random"), "--planner"),
                                          (dict(scale="3000"), "--scale"),
                                          (dict(scale="0"), "--scale")])
def test_an_unknown_wire_planner_or_scale_is_bad_input_naming_its_flag(kwargs, flag):
    with pytest.raises(BadInput, match=flag):
        ArmConfig.of(**kwargs)


def test_the_config_holds_enums_and_the_parsed_scale_and_records_the_cli_strings():
    cfg = ArmConfig.of(wire="fp16", nonfinite="raise", planner="norm-ema", scale="1024")
    assert (cfg.harden.wire, cfg.harden.nonfinite, cfg.planner) == (
        Wire.FP16, NonFinitePolicy.RAISE, Planner.NORM_EMA)
    assert cfg == ArmConfig.of(wire=Wire.FP16, nonfinite=NonFinitePolicy.RAISE,
                               planner=Planner.NORM_EMA, scale="1024")
    assert cfg.harden.scale_exp == 10 and SyncConfig(scale="auto").scale_exp is None
    recorded = json.loads(json.dumps(cfg.to_json()))
    assert (recorded["wire"], recorded["nonfinite"], recorded["planner"], recorded["scale"]) == (
        "fp16", "raise", "norm-ema", "1024")
