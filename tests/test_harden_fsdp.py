"""``harden()`` on an FSDP2 module (``fully_shard`` per layer and on the root, 2 gloo ranks on
CPU): it trains bitwise like the same script without it, and each fault the FSDP2 corpus
found silent or fatal is named, with its rank, on every rank, at the optimizer step's exchange
(or the extra forward's) before the optimizer applies anything.

Every case runs in the session's 2-rank pool (one task, a few seconds); CI keeps the bitwise
case, the others are behind ``slow`` (CI's fast suite is at its time budget)."""

from __future__ import annotations

import datetime
import enum

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.utils.checkpoint import checkpoint

from openclaw_ref.core.launch import LaunchConfig, RankPool
from openclaw_ref.sync.base import SyncConfig
from openclaw_ref.sync.errors import BadInput, ConsistencyError, SyncTimeout
from openclaw_ref.sync.hardening import harden

STEPS = 3
FAULT_STEP = 1
FAULT_RANK = 1
MICRO = 2  # micro-batches per step under gradient accumulation


class Fault(enum.StrEnum):
    NONE = "none"
    EXTRA_BACKWARD = "extra-backward"  # FAULT_RANK runs one more forward/backward
    OPTIMIZER_BEFORE_SHARD = "optimizer-before-shard"  # every rank
    LR_ONE_RANK = "lr-one-rank"  # FAULT_RANK's lr doubled
    NAN_ONE_RANK = "nan-one-rank"  # a NaN in FAULT_RANK's batch
    ACCUMULATE = "accumulate"  # healthy: no-sync micro-steps and activation checkpointing
    SYNC_LEFT_OFF = "sync-left-off"  # every rank: set_requires_gradient_sync(False) all step
    NAN_SKIPPED = "nan-skipped"  # NAN_ONE_RANK under the default nonfinite="skip"
    HSDP = "hsdp"  # healthy, on a (2, 2) replicate x shard mesh
    HSDP_REPLICA_DRIFTS = "hsdp-replica-drifts"  # HSDP_RANK's shards drift from its replica's


HSDP_RANK = 3  # on a (2, 2) mesh its replica is rank 1: a 2-replica tie names both


class Net(nn.Module):
    def __init__(self, checkpointed: bool = False) -> None:
        super().__init__()
        self.inp, self.h1, self.out = nn.Linear(6, 16), nn.Linear(16, 16), nn.Linear(16, 2)
        self.checkpointed = checkpointed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.tanh(self.inp(x))
        x = checkpoint(self.h1, x, use_reentrant=False) if self.checkpointed else self.h1(x)
        return self.out(torch.tanh(x))


def _batch(step: int, micro: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + 10 * micro + rank)
    x = torch.randn(8, 6, generator=g)
    return x, x[:, :2].sin()


def _train(fault: Fault, hardened: bool) -> tuple[dict[str, torch.Tensor], object]:
    """The user's script; the full parameters it ends with, or the error it stopped on."""
    rank = dist.get_rank()
    mine = rank == FAULT_RANK
    torch.manual_seed(0)
    model = Net(checkpointed=fault is Fault.ACCUMULATE)
    early = torch.optim.AdamW(model.parameters(), lr=1e-2) \
        if fault is Fault.OPTIMIZER_BEFORE_SHARD else None
    world = dist.get_world_size()
    hsdp = fault in (Fault.HSDP, Fault.HSDP_REPLICA_DRIFTS)
    mesh = init_device_mesh("cpu", (world // 2, 2), mesh_dim_names=("replicate", "shard")) \
        if hsdp else init_device_mesh("cpu", (world,))
    for layer in (model.inp, model.h1):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = early or torch.optim.AdamW(model.parameters(), lr=1e-2)
    policy = "skip" if fault is Fault.NAN_SKIPPED else "raise"
    guard = harden(model, SyncConfig(nonfinite=policy)) if hardened else None
    try:
        for step in range(STEPS):
            faulty = step == FAULT_STEP
            micros = MICRO if fault is Fault.ACCUMULATE else 1
            for micro in range(micros):
                model.set_requires_gradient_sync(
                    micro == micros - 1 and not (faulty and fault is Fault.SYNC_LEFT_OFF))
                x, y = _batch(step, micro, rank)
                if faulty and micro == 0 and fault is Fault.HSDP_REPLICA_DRIFTS \
                        and rank == HSDP_RANK:
                    _drift(model)
                if faulty and mine and fault in (Fault.NAN_ONE_RANK, Fault.NAN_SKIPPED):
                    x[0, 0] = float("nan")
                F.mse_loss(model(x), y).backward()
                if faulty and mine and fault is Fault.EXTRA_BACKWARD:
                    F.mse_loss(model(x), y).backward()
            for group in opt.param_groups:
                group["lr"] = 2e-2 if faulty and mine and fault is Fault.LR_ONE_RANK else 1e-2
            opt.step()
            opt.zero_grad(set_to_none=True)
    except ConsistencyError as exc:
        return {}, (exc.kind, exc.step, exc.ranks)
    finally:
        if guard is not None:
            guard.close()
    full = {n: p.full_tensor().detach().clone() for n, p in model.named_parameters()}
    if guard is None:
        return full, None
    return full, {**guard.summary(), "events": [(e.kind, e.step, e.ranks) for e in guard.events]}


def _drift(model: nn.Module) -> None:
    """What a rank-local load or update does to HSDP: this rank's shards, and no one else's."""
    with torch.no_grad():
        for p in model.parameters():
            p.to_local().add_(1e-3)


def fsdp_task(ctx, fault: str) -> dict:
    """This rank's account of the script with ``fault``, hardened, and (healthy cases) of the
    same script without ``harden``."""
    fault = Fault(fault)
    hardened, outcome = _train(fault, True)
    reply = {"outcome": outcome}
    if fault in (Fault.NONE, Fault.ACCUMULATE, Fault.HSDP):
        stock, _ = _train(fault, False)
        reply["bitwise"] = bool(hardened) and all(torch.equal(hardened[n], stock[n])
                                                  for n in stock)
    dist.barrier()
    return reply


def refused_task(ctx) -> str:
    model = Net()
    fully_shard(model, mesh=init_device_mesh("cpu", (dist.get_world_size(),)))
    try:
        harden(model, SyncConfig(guard="bucket"))
    except BadInput as exc:
        return str(exc)
    return "accepted"


RELEASED = "test/harden-fsdp/released"


def late_rank_task(ctx) -> dict:
    """Rank 1 stops before its optimizer step at FAULT_STEP until rank 0 has caught the
    watchdog's diagnosis of the step's exchange (the store orders it, no sleep)."""
    torch.manual_seed(0)
    model = Net()
    fully_shard(model, mesh=init_device_mesh("cpu", (dist.get_world_size(),)))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    guard = harden(model, SyncConfig(watchdog_s=1.0), ctx)
    try:
        for step in range(STEPS):
            F.mse_loss(model(_batch(step, 0, ctx.rank)[0]), _batch(step, 0, ctx.rank)[1]) \
                .backward()
            if ctx.rank == 1 and step == FAULT_STEP:
                ctx.store.wait([RELEASED], datetime.timedelta(seconds=120))
                return {"error": None}
            opt.step()
            opt.zero_grad(set_to_none=True)
    except SyncTimeout as exc:
        ctx.store.set(RELEASED, "1")
        return {"error": (exc.step, exc.ranks, exc.detail)}
    finally:
        guard.close()
    return {"error": None}


def _run(pools, fault: Fault, world_size: int = 2) -> list[dict]:
    return pools.get(world_size).run(fsdp_task, fault.value, timeout_s=180)


def test_a_hardened_fsdp2_model_trains_bitwise_like_stock_and_checks_every_step(pools):
    for reply in _run(pools, Fault.NONE):
        assert reply["bitwise"], reply
        summary = reply["outcome"]
        assert summary["checks_run"] == summary["checks_passed"] == STEPS  # one per step
        assert summary["optimizer_steps"] == STEPS and summary["extra_forward_exchanges"] == 0
        assert summary["events"] == []


@pytest.mark.slow
def test_an_extra_backward_on_one_rank_is_a_clock_mismatch_naming_it_on_every_rank(pools):
    replies = _run(pools, Fault.EXTRA_BACKWARD)  # two ranks, no majority: both suspects
    assert [r["outcome"] for r in replies] == [("ClockMismatch", FAULT_STEP, [0, 1])] * 2


@pytest.mark.slow
def test_an_optimizer_built_before_fully_shard_is_named_at_its_first_step(pools):
    replies = _run(pools, Fault.OPTIMIZER_BEFORE_SHARD)
    assert [r["outcome"] for r in replies] == [("OptimizerMismatch", 0, [0, 1])] * 2


@pytest.mark.slow
def test_one_ranks_doubled_learning_rate_is_named_before_the_step_applies(pools):
    replies = _run(pools, Fault.LR_ONE_RANK)  # two ranks, no majority: both suspects
    assert [r["outcome"] for r in replies] == [("OptimizerMismatch", FAULT_STEP, [0, 1])] * 2


@pytest.mark.slow
def test_a_nan_in_one_ranks_gradients_is_named_before_the_reduce_mixes_them(pools):
    replies = _run(pools, Fault.NAN_ONE_RANK)
    assert [r["outcome"] for r in replies] == [("NonFiniteGradient", FAULT_STEP,
                                                [FAULT_RANK])] * 2


@pytest.mark.slow
def test_a_step_whose_gradients_fsdp2_never_reduced_is_named_before_it_applies(pools):
    replies = _run(pools, Fault.SYNC_LEFT_OFF)
    assert [r["outcome"] for r in replies] == [("GradientsNotAveraged", FAULT_STEP, [0, 1])] * 2


@pytest.mark.slow
def test_a_nan_under_the_default_skip_policy_is_an_event_naming_the_rank(pools):
    for reply in _run(pools, Fault.NAN_SKIPPED):  # later steps: every rank's (NaN weights)
        assert reply["outcome"]["events"][0] == ("NonFiniteGradient", FAULT_STEP, [FAULT_RANK])


@pytest.mark.slow
def test_no_sync_micro_steps_and_activation_checkpointing_raise_no_false_alarm(pools):
    for reply in _run(pools, Fault.ACCUMULATE):
        assert reply["bitwise"], reply
        assert reply["outcome"]["checks_passed"] == STEPS
        assert reply["outcome"]["backwards"] == STEPS * MICRO
        assert reply["outcome"]["events"] == []


@pytest.mark.slow
def test_hsdp_trains_bitwise_like_stock_and_compares_replicas_every_step(pools):
    for reply in _run(pools, Fault.HSDP, 4):
        assert reply["bitwise"], reply
        assert reply["outcome"]["checks_passed"] == reply["outcome"]["replica_checks"] == STEPS
        assert reply["outcome"]["events"] == []


@pytest.mark.slow
def test_hsdp_replicas_that_drift_apart_are_named_before_the_next_step_applies(pools):
    replies = _run(pools, Fault.HSDP_REPLICA_DRIFTS, 4)  # its replica and it: both suspects
    assert [r["outcome"] for r in replies] == [("ReplicaDivergence", FAULT_STEP,
                                                [HSDP_RANK - 2, HSDP_RANK])] * 4


@pytest.mark.slow
def test_a_rank_that_never_reaches_the_steps_exchange_is_named_by_the_watchdog():
    with RankPool(LaunchConfig(2, backend="gloo", pg_timeout_s=4.0, timeout_s=120)) as pool:
        replies = pool.run(late_rank_task)
    step, ranks, detail = replies[0]["error"]
    assert (step, ranks) == (FAULT_STEP, [1]) and "alive" in detail, detail
    assert replies[1]["error"] is None


@pytest.mark.slow
def test_an_fsdp2_module_takes_only_the_step_guard(pools):
    for text in pools.get(2).run(refused_task, timeout_s=60):
        assert "step guard with the native wire only" in text
