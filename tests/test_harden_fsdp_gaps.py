"""The FSDP2 guard's later checks, each with its fault (named, with its rank, on every rank) and
its healthy variants (silent): a state dict loaded on some ranks only (``CheckpointMismatch``),
gradients scaled by each rank's own factor (``ScaleMismatch``: clipping by the local norm), a
parameter without a gradient on every rank (legal: silent, bitwise equal to stock, its short
reduce-scatters noted), and HSDP's replica check at ``close()``. Gradient sync off on one rank
and a parameter without a gradient on one rank break the process group (a rank aborted or
timed out), so they run as torchrun jobs in ``tests/test_fsdp_last_words.py``.

Each pool run plays several scenarios in order in one process group, each on a fresh model: a
guard error is raised on every rank before any rank issues a collective its peers do not, so
the group stays usable for the next scenario. CI runs them at 4 ranks (1-D mesh of 4, then HSDP
2 x 2) and at 2 ranks."""

from __future__ import annotations

import enum

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.checkpoint.state_dict import set_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.utils.checkpoint import checkpoint

from openclaw_ref.sync.base import SyncConfig
from openclaw_ref.sync.errors import ConsistencyError
from openclaw_ref.sync.hardening import harden

STEPS = 3
FAULT_STEP = 1
MAX_NORM = 0.05  # below every step's norm here: clip_grad_norm_ clips
UNSCALE = 2.0 ** -10  # a GradScaler's unscale: every rank multiplies by the same power of two


class S(enum.StrEnum):
    """A scenario: a healthy variant (no error) or a fault (its error)."""

    HEALTHY = "healthy"  # also run stock: bitwise equal
    LOAD_EVERY_RANK = "load-every-rank"
    LOAD_DCP_EVERY_RANK = "load-dcp-every-rank"  # set_model_state_dict on every rank
    LOAD_ONE_RANK = "load-one-rank"  # rank 0 only
    CLIP_GLOBAL = "clip-global"  # clip_grad_norm_ on the DTensor gradients
    CLIP_VALUE = "clip-value"
    UNSCALE = "unscale"
    ACCUMULATE = "accumulate"  # no-sync micro-steps, activation checkpointing
    ACCUMULATE_SYNCED = "accumulate-synced"  # every micro-step reduced
    CLIP_LOCAL_NORM = "clip-local-norm"  # every rank clips by its own shards' norm
    UNUSED_PARAM_EVERY_RANK = "unused-param-every-rank"  # legal: short notes, no error
    HSDP_HEALTHY = "hsdp-healthy"
    HSDP_DRIFT_AFTER_LAST_STEP = "hsdp-drift-after-last-step"  # named by close()


HSDP = (S.HSDP_HEALTHY, S.HSDP_DRIFT_AFTER_LAST_STEP)
NO_SYNC_MICRO_STEPS = (S.ACCUMULATE,)
BITWISE = (S.HEALTHY, S.HSDP_HEALTHY, S.UNUSED_PARAM_EVERY_RANK)


class Net(nn.Module):
    def __init__(self, checkpointed: bool = False) -> None:
        super().__init__()
        self.inp, self.h1 = nn.Linear(6, 16), nn.Linear(16, 16)
        self.aux, self.out = nn.Linear(16, 16), nn.Linear(16, 2)
        self.checkpointed, self.use_aux = checkpointed, True

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, 6) -> (B, 2)
        x = torch.tanh(self.inp(x))
        x = checkpoint(self.h1, x, use_reentrant=False) if self.checkpointed else self.h1(x)
        x = torch.tanh(x)
        if self.use_aux:
            x = x + self.aux(x)
        return self.out(x)


def _batch(step: int, micro: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + 10 * micro + rank)
    x = torch.randn(8, 6, generator=g) * (1 + rank)  # rank-dependent norms
    return x, x[:, :2].sin()


def _load(model: nn.Module, dcp: bool) -> None:
    state = {k: v.detach() + 1e-2 for k, v in model.state_dict().items()}
    if dcp:
        set_model_state_dict(model, state)
    else:
        model.load_state_dict(state)


def _clip(model: nn.Module, s: S) -> None:
    params = list(model.parameters())
    if s is S.CLIP_GLOBAL:
        torch.nn.utils.clip_grad_norm_(params, MAX_NORM)
    elif s is S.CLIP_VALUE:
        torch.nn.utils.clip_grad_value_(params, 1e-2)
    elif s is S.UNSCALE:
        with torch.no_grad():
            for p in params:
                p.grad.mul_(UNSCALE)
    elif s is S.CLIP_LOCAL_NORM:
        local = [p.grad.to_local() for p in params if p.grad is not None]  # views
        coef = (MAX_NORM / (torch.nn.utils.get_total_norm(local) + 1e-6)).clamp(max=1.0)
        torch._foreach_mul_(local, coef)


def _train(s: S, hardened: bool) -> tuple[dict[str, torch.Tensor], object]:
    """The user's script; the full parameters it ends with and the guard's summary, or the
    error every rank stopped on."""
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = Net(checkpointed=s is S.ACCUMULATE)
    mesh = init_device_mesh("cpu", (world // 2, 2), mesh_dim_names=("replicate", "shard")) \
        if s in HSDP else init_device_mesh("cpu", (world,))
    for layer in (model.inp, model.h1):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    cfg = SyncConfig(nonfinite="raise")
    guard = harden(model, cfg) if hardened else None
    micros = 2 if s in (S.ACCUMULATE, S.ACCUMULATE_SYNCED) else 1
    try:
        if s in (S.LOAD_EVERY_RANK, S.LOAD_DCP_EVERY_RANK) or (s is S.LOAD_ONE_RANK
                                                               and rank == 0):
            _load(model, s is S.LOAD_DCP_EVERY_RANK)
        for step in range(STEPS):
            for micro in range(micros):
                model.set_requires_gradient_sync(
                    s is S.ACCUMULATE_SYNCED or micro == micros - 1)
                model.use_aux = not (step == FAULT_STEP and s is S.UNUSED_PARAM_EVERY_RANK)
                x, y = _batch(step, micro, rank)
                F.mse_loss(model(x), y).backward()
            _clip(model, s)
            opt.step()
            opt.zero_grad(set_to_none=True)
        if s is S.HSDP_DRIFT_AFTER_LAST_STEP and rank == world - 1:
            with torch.no_grad():
                next(model.parameters()).to_local().add_(1e-3)
        if guard is not None:
            guard.close()
    except ConsistencyError as exc:
        if guard is not None:
            guard.close()
        return {}, (exc.kind, exc.step, exc.ranks)
    full = {n: p.full_tensor().detach().clone() for n, p in model.named_parameters()}
    if guard is None:
        return full, None
    summary = guard.summary()
    return full, {"events": [(e.kind, e.step, e.ranks) for e in guard.events],
                  "passed": summary["checks_passed"] == summary["checks_run"] > 0,
                  "notes": summary["notes"]}


def scenarios_task(ctx, names: list[str]) -> dict:
    """This rank's account of each scenario, in order, in one process group."""
    out = {}
    for name in names:
        s = S(name)
        hardened, outcome = _train(s, True)
        reply = {"outcome": outcome}
        if s in BITWISE:
            stock, _ = _train(s, False)
            reply["bitwise"] = bool(hardened) and all(torch.equal(hardened[n], stock[n])
                                                      for n in stock)
        out[name] = reply
    dist.barrier()
    return out


SILENT_1D = (S.HEALTHY, S.LOAD_EVERY_RANK, S.LOAD_DCP_EVERY_RANK, S.CLIP_GLOBAL, S.CLIP_VALUE,
             S.UNSCALE, S.ACCUMULATE, S.ACCUMULATE_SYNCED, S.UNUSED_PARAM_EVERY_RANK)


def _faults(world: int) -> dict[S, tuple]:
    """Each fault's (error, step, ranks) at ``world`` ranks on a 1-D mesh."""
    return {S.LOAD_ONE_RANK: ("CheckpointMismatch", 0, [0]),
            S.CLIP_LOCAL_NORM: ("ScaleMismatch", 0, list(range(world)))}


def _check(replies: list[dict], silent, faults: dict) -> None:
    for s in silent:
        for reply in replies:
            got = reply[s.value]
            assert isinstance(got["outcome"], dict), (s, got)
            assert got["outcome"]["events"] == [] and got["outcome"]["passed"], (s, got)
            # notes in the store (last_words) only where a parameter has no gradient (here
            # on every rank alike, which is legal) or a backward runs with sync off
            notes = got["outcome"]["notes"]
            assert (notes["short"] > 0) == (s is S.UNUSED_PARAM_EVERY_RANK), (s, notes)
            assert (notes["nosync"] > 0) == (s in NO_SYNC_MICRO_STEPS), (s, notes)
            if s in BITWISE:
                assert got["bitwise"], s
    for s, expected in faults.items():
        assert [r[s.value]["outcome"] for r in replies] == [expected] * len(replies), s


SILENT_4 = (S.HEALTHY,)  # at 4 ranks, for CI's time: the other healthy variants at 2 ranks


def test_four_ranks_name_each_fault_and_stay_silent_on_healthy_variants(pools):
    """1-D mesh of 4: a healthy run silent and bitwise equal to stock FSDP2, each fault named
    with its ranks; then HSDP 2 x 2: its steps silent, and a drift after the last step named by
    close() on every rank (rank 3 against its replica rank 1: two replicas, no majority, both
    named)."""
    faults = _faults(4)
    names = [s.value for s in (*SILENT_4, *faults, S.HSDP_DRIFT_AFTER_LAST_STEP)]
    replies = pools.get(4).run(scenarios_task, names, timeout_s=300)
    _check(replies, SILENT_4, faults)
    drift = [r[S.HSDP_DRIFT_AFTER_LAST_STEP.value]["outcome"] for r in replies]
    assert drift == [("ReplicaDivergence", STEPS - 1, [1, 3])] * 4, drift


def test_two_ranks_name_each_fault_and_stay_silent_on_healthy_variants(pools):
    faults = _faults(2)
    names = [s.value for s in (*SILENT_1D, *faults)]
    replies = pools.get(2).run(scenarios_task, names, timeout_s=300)
    _check(replies, SILENT_1D, faults)


@pytest.mark.slow
def test_hsdp_trains_bitwise_like_stock_with_the_close_check(pools):
    replies = pools.get(4).run(scenarios_task, [S.HSDP_HEALTHY.value], timeout_s=300)
    _check(replies, (S.HSDP_HEALTHY,), {})


@pytest.mark.parametrize("s", list(S))
def test_every_scenario_is_played(s):
    assert s in (*SILENT_1D, *_faults(2), *HSDP)
