"""A user's ``Target`` under FSDP2 (``--openclaw-wrapper fsdp2``: ``fully_shard`` on a 1-D mesh)
or HSDP (``hsdp``: a (W/2, 2) replicate × shard mesh): the training loop, its recorded run
(the same ``RunRecord`` the DDP checks read), and the option sets of the healthy-jobs table.

How the model is sharded: ``fully_shard`` on every direct child that holds parameters, then on
the root (torchtitan's per-block wrapping, for a model whose children are its blocks). The
subject is ``CALLABLE(fsdp_model, mesh)`` (default ``harden_defaults``: ``harden(model)``),
called right after the last ``fully_shard``; what it returns is closed after the run. The
oracle is the same loop with no subject: stock FSDP2.

The loop is ``user_run.train_target``'s reduced to FSDP2: batch, forward, loss, backward
(``set_requires_gradient_sync(False)`` on all but the last micro-batch), SGD step. A
``FsdpJob`` injects one fault or FSDP2 corpus pattern (``fsdp_faults``) on its rank.

Invariant: as under DDP, two runs of one spec start from the same weights (torch seeded before
the factory) and draw the same random numbers per rank, so the subject and stock FSDP2 differ
by the subject alone. States are full tensors (``full_tensor()``: gathered over the shard
dimension only, so under HSDP each replica reports its own copy).
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from openclaw_ref.conformance.run_record import RunRecord
from openclaw_ref.conformance.target import (
    Target,
    TargetSpec,
    build_target,
    forward_loss,
    load_hook,
)
from openclaw_ref.conformance.user_run import RUN_SEED, snapshot
from openclaw_ref.core.digests import params_digest, tensor_digest
from openclaw_ref.core.faults import flip_bit_
from openclaw_ref.fsdp_corpus.patterns import FAULT_STEP, PATTERNS, acts_on
from openclaw_ref.fsdp_corpus.silent_errors_script import clip_local_norm
from openclaw_ref.sync.errors import ConsistencyError

PAUSE_STEP = 1  # the rank-0 pause: before this step's optimizer step (a load, orders nothing)
LOSS_SCALE = 4.0  # scale-mismatch: the faulty rank's loss (and so its gradient) × this
CLIP_NORM = 1e-3  # clip-local-norm: below every gradient norm here, so the clip acts
LOAD_DELTA = 1e-2  # load-one-rank: the "checkpoint" is the initial model plus this
HANG_S = 600.0


@dataclass(frozen=True)
class FsdpOptions:
    """How one cell of the healthy-jobs table trains: steps, micro-batches per step (all but
    the last under ``set_requires_gradient_sync(False)``), ``reshard_after_forward``, CPU
    offload (``CPUOffloadPolicy(pin_memory=False)``: pinning needs an accelerator), activation
    checkpointing on every sharded block, and a pause of rank 0 before step ``PAUSE_STEP``'s
    optimizer step (a load only: nothing waits on it but the collectives themselves)."""

    steps: int = 4
    accumulate: int = 1
    reshard_after_forward: bool = True
    offload: bool = False
    checkpointing: bool = False
    pause_s: float = 0.0


FSDP_OPTION_SETS: dict[str, FsdpOptions] = {
    "default": FsdpOptions(),
    "reshard_after_forward=False": FsdpOptions(reshard_after_forward=False),
    "accumulation (set_requires_gradient_sync(False))": FsdpOptions(accumulate=2),
    "activation checkpointing": FsdpOptions(checkpointing=True),
    "CPUOffloadPolicy": FsdpOptions(offload=True),
    "rank-0 pause (0.5 s)": FsdpOptions(pause_s=0.5),
}


@dataclass(frozen=True)
class FsdpJob:
    """One fault or FSDP2 corpus pattern (``case``; None: none) and whether the run is its
    corrected script (the reference of ``clip-local-norm`` and ``load-one-rank``)."""

    case: str | None = None
    corrected: bool = False
    rank: int = 1  # the rank a fault of ``fsdp_faults.FSDP_FAULTS`` acts on

    def acts(self, rank: int, world_size: int) -> bool:
        if self.case is None or self.corrected:
            return False
        if self.case in PATTERNS:
            return acts_on(PATTERNS[self.case], rank, world_size)
        return rank == self.rank

    def first(self, step: int, rank: int, world_size: int) -> bool:
        return step == FAULT_STEP and self.acts(rank, world_size)


def harden_defaults(model: nn.Module, mesh: DeviceMesh) -> Any:
    """``fsdp2``/``hsdp``'s default subject: ``harden()`` with its defaults."""
    from openclaw_ref.sync.hardening import harden

    return harden(model)


def device_mesh(wrapper: str, world_size: int) -> DeviceMesh:
    if wrapper == "hsdp":
        return init_device_mesh("cpu", (world_size // 2, 2),
                                mesh_dim_names=("replicate", "shard"))
    return init_device_mesh("cpu", (world_size,), mesh_dim_names=("shard",))


def blocks(model: nn.Module) -> list[nn.Module]:
    """The modules ``fully_shard`` wraps before the root: each direct child with parameters."""
    return [c for c in model.children() if any(True for _ in c.parameters())]


def shard_model(model: nn.Module, mesh: DeviceMesh, options: FsdpOptions,
                mp: MixedPrecisionPolicy) -> None:
    from torch.distributed._composable import checkpoint

    kwargs: dict[str, Any] = {"mesh": mesh, "mp_policy": mp,
                              "reshard_after_forward": options.reshard_after_forward}
    if options.offload:
        kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=False)
    for block in blocks(model):
        if options.checkpointing:
            checkpoint(block)  # composable: parameter names unchanged
        fully_shard(block, **kwargs)
    fully_shard(model, **kwargs)


def full_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter as a full tensor (a collective: every rank calls it) and every buffer."""
    out = {n: (p.full_tensor() if isinstance(p, DTensor) else p).detach().to("cpu", copy=True)
           for n, p in model.named_parameters()}
    out.update({n: b.detach().to("cpu", copy=True) for n, b in model.named_buffers()})
    return out


@dataclass
class Trained:
    """What a run left: the model, the subject's events, the error that stopped it."""

    model: nn.Module
    events: list = field(default_factory=list)
    start: dict[str, torch.Tensor] = field(default_factory=dict)


def train_fsdp(ctx, spec: TargetSpec, options: FsdpOptions, job: FsdpJob = FsdpJob(),
               after_step: Callable[[int, nn.Module], None] | None = None) -> Trained:
    """Train the spec's target under its wrapper on this rank (module docstring). A
    ``ConsistencyError`` from the subject propagates, after the subject is closed."""
    rank, world = ctx.rank, ctx.world_size
    torch.manual_seed(RUN_SEED)
    target = build_target(spec.factory)
    model = target.module
    start = snapshot(model)
    mine = job.acts(rank, world)
    early = torch.optim.SGD(model.parameters(), lr=target.lr) \
        if mine and job.case == "optimizer-before-shard" else None
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16) \
        if mine and job.case == "mixed-precision-differs" else MixedPrecisionPolicy()
    mesh = device_mesh(spec.wrapper, world)
    shard_model(model, mesh, options, mp)
    subject = load_hook(spec.hook)
    guard = subject(model, mesh) if subject is not None else None
    try:
        if job.case == "load-one-rank" and (mine or job.corrected):
            model.load_state_dict({k: v.detach() + LOAD_DELTA
                                   for k, v in model.state_dict().items()})
        torch.manual_seed(RUN_SEED + 1 + rank)
        opt = early or torch.optim.SGD(model.parameters(), lr=target.lr)
        for step in range(options.steps):
            _step(ctx, target, model, opt, step, options, job)
            if after_step is not None:
                after_step(step, model)
    finally:
        if guard is not None and callable(getattr(guard, "close", None)):
            guard.close()
    events = list(getattr(guard, "events", None) or [])
    return Trained(model, events, start)


def _step(ctx, target: Target, model: nn.Module, opt: torch.optim.Optimizer, step: int,
          options: FsdpOptions, job: FsdpJob) -> None:
    rank, world = ctx.rank, ctx.world_size
    first = job.first(step, rank, world)
    for micro in range(options.accumulate):
        last = micro == options.accumulate - 1
        model.set_requires_gradient_sync(last and not (first and job.case == "no-sync-one-rank"))
        batch = target.batch(step * options.accumulate + micro, rank, world)
        if first and micro == 0:
            _before_backward(job.case)
        loss = forward_loss(target, model, batch) / options.accumulate
        if first and job.case == "nan-grad":
            loss = loss * float("nan")
        if job.case == "scale-mismatch" and job.acts(rank, world) and step >= FAULT_STEP:
            loss = loss * LOSS_SCALE
        loss.backward()
        if first and last and job.case == "extra-backward-one-rank":
            (forward_loss(target, model, batch) / options.accumulate).backward()
    model.set_requires_gradient_sync(True)
    if job.case == "clip-local-norm" and step >= FAULT_STEP:
        _clip(model, local=not job.corrected)
    lr_factor = 2.0 if job.case == "lr-one-rank" and job.acts(rank, world) \
        and step >= FAULT_STEP else 1.0
    for group in opt.param_groups:
        group["lr"] = target.lr * lr_factor
    if options.pause_s and rank == 0 and step == PAUSE_STEP:
        time.sleep(options.pause_s)
    opt.step()
    opt.zero_grad(set_to_none=True)
    if first and job.case == "bitflip":
        flip_bit_(next(model.parameters()).to_local())


def _before_backward(case: str | None) -> None:
    if case == "late-rank":
        time.sleep(0.25)
    elif case == "hang":
        time.sleep(HANG_S)
    elif case == "crash":
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(13)


def _clip(model: nn.Module, local: bool) -> None:
    """The corpus's clip-local-norm mistake (each rank clips its shards by their own norm), or
    its correction (``clip_grad_norm_`` over the DTensor gradients: the global norm)."""
    if local:
        clip_local_norm(model, CLIP_NORM)
    else:
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP_NORM)


def keep_state(record: RunRecord, model: nn.Module) -> None:
    """Append the full state after a step (a collective) and its parameter digests."""
    state = full_state(model)
    record.states.append(state)
    record.param_digests.append(tuple(tensor_digest(state[n])
                                       for n, _ in model.named_parameters()))


def fill_record(record: RunRecord, train: Callable[[], Trained]) -> None:
    """Run ``train`` into ``record``: where it started, its parameter names and the subject's
    events, or the ``ConsistencyError`` that stopped it (any other error propagates)."""
    try:
        trained = train()
        record.start = trained.start
        record.param_names = tuple(n for n, _ in trained.model.named_parameters())
        record.events = [e.to_json() for e in trained.events]
    except ConsistencyError as exc:
        record.error, record.error_text = exc.event().to_json(), str(exc)


def record_fsdp_run(ctx, spec: TargetSpec, options: FsdpOptions,
                    one_process: bool = False) -> RunRecord:
    """``user_record.record_run`` under FSDP2: the full state after each step, its digests,
    the subject's events, and the error that stopped the run. ``one_process``: rank 0 also
    trains one process on the global batch (the model's shard invariance)."""
    from openclaw_ref.conformance.user_run import LoopOptions, train_reference

    record = RunRecord(ctx.rank, hooked=spec.hook is not None)
    fill_record(record, lambda: train_fsdp(ctx, spec, options,
                                           after_step=lambda _, m: keep_state(record, m)))
    if one_process and ctx.rank == 0 and record.start:
        reference = LoopOptions(steps=options.steps, accumulate=options.accumulate)
        record.one_process = train_reference(spec, reference, ctx.world_size, record.start)
    return record


def fsdp_case_task(ctx, spec: TargetSpec, job: FsdpJob, steps: int) -> tuple[str, Any]:
    """One fault-matrix case on one rank, replied as ``user_faults.user_case_task`` replies:
    ("ok", record) or ("detected", the error raised on every rank)."""
    from openclaw_ref.conformance.fault_matrix import detected_in_band

    try:
        trained = train_fsdp(ctx, spec, FsdpOptions(steps=steps), job)
    except ConsistencyError as exc:
        return detected_in_band(ctx, exc)
    full = full_state(trained.model)
    names = [n for n, _ in trained.model.named_parameters()]
    digests = [None] * ctx.world_size
    dist.all_gather_object(digests, params_digest((n, full[n]) for n in names))
    finite = all(math.isfinite(float(full[n].double().sum())) for n in names)
    return ("ok", {"events": [e.to_json() for e in trained.events], "steps": [],
                   "summary": {"param_digest": digests[0], "finite": finite,
                               "replicas_equal": len(set(digests)) == 1}})
