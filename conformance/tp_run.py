"""A user's ``Target`` under ``--openclaw-wrapper fsdp2-tp``: FSDP2 × tensor parallel on a
``(dp, tp) = (W/2, 2)`` mesh — the loop, its recorded run (the ``RunRecord`` every check reads)
and the fault cases stock TP is silent on.

How the model is split and sharded: the target's ``tp_plan(model, mesh["tp"])`` (the user's
``parallelize_module`` calls), then ``fully_shard(m, mesh=mesh["dp"])`` on each module it
returns and on the root — torchtitan's order. Every tp rank of dp group d trains on
``batch(step, d, W/2)``: one batch per dp group, the same on its tp ranks, as TP needs. The
subject is ``CALLABLE(model, mesh)`` (default ``fsdp_run.harden_defaults``: ``harden(model)``)
after the last ``fully_shard``; the oracle is the same loop with none: stock FSDP2 × TP.

What a run records besides the full states after each step (``fsdp_run.full_state``: a
tp-replicated parameter's full tensor is this rank's own copy): every warning it gave, and
after each step every tp-replicated parameter's digest with its replica key. Which parameters
are replicated over tp, and which ranks hold the same copy, is read from their placements by
the hook library's own reader (``sync.fsdp.mesh.seats``: a ``Seat`` whose ``beyond`` names a
dim FSDP2 does not reduce over), never re-derived here.

Invariant: as in ``fsdp_run``, two runs of one spec start from the same weights (torch seeded
before the factory) and draw the same random numbers — per dp group, so the tp ranks of a group
draw alike — so the subject and stock differ by the subject alone.
"""

from __future__ import annotations

import enum
import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard

from openclaw_ref.conformance.fsdp_run import Trained, fill_record, full_state, keep_state
from openclaw_ref.conformance.run_record import RunRecord
from openclaw_ref.conformance.target import (
    TP_SIZE,
    TargetSpec,
    build_target,
    forward_loss,
    load_hook,
)
from openclaw_ref.conformance.user_run import RUN_SEED, snapshot
from openclaw_ref.core.digests import tensor_digest
from openclaw_ref.sync.errors import ConsistencyError
from openclaw_ref.sync.fsdp.mesh import seats

FAULT_RANK = 1  # the faulty rank of every case: tp rank 1 of dp group 0
LR_FACTOR = 2.0  # lr-one-rank: the faulty rank's learning rate × this


class TpFault(enum.StrEnum):
    """The faults stock FSDP2 × TP trains through silently, each acting on ``FAULT_RANK`` from
    step 0."""

    OTHER_BATCH = "tp-rank-fed-another-batch"  # it trains on the next dp group's batch
    LR_ONE_RANK = "lr-one-rank"  # its learning rate × LR_FACTOR


@dataclass(frozen=True)
class TpOptions:
    """How a check trains under fsdp2-tp: SGD steps (the target's lr)."""

    steps: int = 3


def tp_mesh(world_size: int) -> DeviceMesh:
    return init_device_mesh("cpu", (world_size // TP_SIZE, TP_SIZE),
                            mesh_dim_names=("dp", "tp"))


def tp_replicas(model: nn.Module) -> dict[str, tuple[int, str]]:
    """Each tp-replicated parameter's (replica key, digest of this rank's local values): the
    ranks with one key hold copies that must be bitwise equal (module docstring)."""
    named = list(model.named_parameters())
    return {n: (seat.key, tensor_digest(p.to_local()))
            for (n, p), seat in zip(named, seats(model, named), strict=True) if seat.beyond}


def train_tp(ctx, spec: TargetSpec, options: TpOptions, fault: TpFault | None = None,
             after_step: Callable[[int, nn.Module], None] | None = None) -> Trained:
    """Train the spec's target under fsdp2-tp on this rank (module docstring). A
    ``ConsistencyError`` from the subject propagates, after the subject is closed."""
    rank, world = ctx.rank, ctx.world_size
    mesh = tp_mesh(world)
    torch.manual_seed(RUN_SEED)
    target = build_target(spec.factory)
    model = target.module
    start = snapshot(model)
    for unit in target.tp_plan(model, mesh["tp"]) or ():
        fully_shard(unit, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    subject = load_hook(spec.hook)
    guard = subject(model, mesh) if subject is not None else None
    mine = rank == FAULT_RANK
    dp_index, dp_size = mesh["dp"].get_local_rank(), mesh["dp"].size()
    fed = (dp_index + 1) % dp_size if mine and fault is TpFault.OTHER_BATCH else dp_index
    lr = target.lr * (LR_FACTOR if mine and fault is TpFault.LR_ONE_RANK else 1.0)
    try:
        torch.manual_seed(RUN_SEED + 1 + dp_index)
        opt = torch.optim.SGD(model.parameters(), lr=lr)
        for step in range(options.steps):
            forward_loss(target, model, target.batch(step, fed, dp_size)).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if after_step is not None:
                after_step(step, model)
    finally:
        if guard is not None and callable(getattr(guard, "close", None)):
            guard.close()
    return Trained(model, list(getattr(guard, "events", None) or []), start)


def record_tp_run(ctx, spec: TargetSpec, options: TpOptions) -> RunRecord:
    """``user_record.record_run`` under fsdp2-tp: the full state after each step, its digests,
    the tp replicas' digests, the subject's events, every warning, and the error that stopped
    the run. (No one-process run: a TP model's oracle is stock TP on the same mesh.)"""
    record = RunRecord(ctx.rank, hooked=spec.hook is not None)

    def keep(step: int, model: nn.Module) -> None:
        keep_state(record, model)
        record.tp_replicas.append(tp_replicas(model))

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fill_record(record, lambda: train_tp(ctx, spec, options, after_step=keep))
    record.warnings = sorted({f"{w.category.__name__}: {w.message}" for w in caught})
    return record


def tp_case_task(ctx, spec: TargetSpec, fault: str, options: TpOptions) -> dict:
    """One fault case on this rank, under stock and under the subject: stock's final parameter
    digests (in ``named_parameters`` order, as ``RunRecord.param_digests``: did the fault
    change the run?) and what the subject raised (an event, or None)."""
    case = TpFault(fault)
    stock = train_tp(ctx, replace(spec, hook=None), options, case)
    state = full_state(stock.model)
    reply: dict = {"stock": tuple(tensor_digest(state[n])
                                  for n, _ in stock.model.named_parameters()),
                   "subject": None}
    try:
        train_tp(ctx, spec, options, case)
    except ConsistencyError as exc:
        reply["subject"] = exc.event().to_json()
    return reply
