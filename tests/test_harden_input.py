"""``harden()`` refuses what it cannot verify, with one ``BadInput`` and nothing registered."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from openclaw_ref.sync.base import SyncConfig
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
