"""``harden()`` refuses what it cannot verify, with one ``BadInput`` and nothing registered."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from openclaw_ref.sync.base import NonFinitePolicy, Planner, SyncConfig, Wire
from openclaw_ref.sync.errors import BadInput
from openclaw_ref.sync.hardened import harden
from openclaw_ref.sync.target import reducible_dtypes


def harden_twice(ctx) -> tuple[str, int]:
    ddp = DDP(nn.Linear(4, 2))
    state = harden(ddp, SyncConfig(name="hardened"), ctx)
    try:
        harden(ddp, SyncConfig(name="hardened"), ctx)
    except BadInput as exc:
        return str(exc), len(ddp._comm_hooks)
    finally:
        state.close()
    return "", len(ddp._comm_hooks)


def harden_a_plain_module(ctx) -> str:
    try:
        harden(nn.Linear(4, 2), SyncConfig(name="hardened"), ctx)
    except BadInput as exc:
        return str(exc)
    return ""


def test_a_model_that_is_not_ddp_is_refused(pools):
    assert all("DistributedDataParallel" in m for m in pools.get(2).run(harden_a_plain_module))


def test_hardening_twice_is_refused_and_leaves_one_hook(pools):
    for message, hooks in pools.get(2).run(harden_twice):
        assert "already has a comm hook" in message and hooks == 1


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
        SyncConfig(**kwargs)


def test_the_config_holds_enums_and_the_parsed_scale_and_records_the_cli_strings():
    cfg = SyncConfig(wire="fp16", nonfinite="raise", planner="norm-ema", scale="1024")
    assert (cfg.wire, cfg.nonfinite, cfg.planner) == (Wire.FP16, NonFinitePolicy.RAISE,
                                                      Planner.NORM_EMA)
    assert cfg == SyncConfig(wire=Wire.FP16, nonfinite=NonFinitePolicy.RAISE,
                             planner=Planner.NORM_EMA, scale="1024")
    assert cfg.scale_exp == 10 and SyncConfig(scale="auto").scale_exp is None
    recorded = json.loads(json.dumps(dataclasses.asdict(cfg)))
    assert (recorded["wire"], recorded["nonfinite"], recorded["planner"], recorded["scale"]) == (
        "fp16", "raise", "norm-ema", "1024")
