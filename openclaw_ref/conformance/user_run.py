"""A user's comm hook as one more sync strategy, and the loop that trains a ``Target`` with it.

``UserHook`` wraps the model in DDP and hands it to the user's ``CALLABLE(ddp_model,
process_group)``; every hook that callable registers runs inside a ``LayoutRecorder`` (so the
bucket-layout check reads what the user's hook saw), and without a callable it records stock
DDP's allreduce. ``train_target`` is the training loop of ``core/train.py`` reduced to what
any model supports — batch, forward, loss, backward, ``finish_step``, SGD — calling the same
callbacks (``core/callbacks.py``) at the same points, so the fault injector and the
conformance recorders work on a user's model unchanged. With ``LoopOptions.uneven`` the last
rank runs fewer steps and every rank trains inside ``ddp.join()`` (DDP's uneven-inputs mode).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from openclaw_ref.conformance.recorders import LayoutRecorder
from openclaw_ref.conformance.target import (
    Target,
    TargetSpec,
    build_target,
    forward_loss,
    load_hook,
)
from openclaw_ref.core.callbacks import Callback, CallbackList
from openclaw_ref.core.faults import FaultInjector, FaultSpec
from openclaw_ref.sync.base import RankInfo, SyncConfig, SyncStrategy
from openclaw_ref.sync.target import HARDENED_MARK, registered_hook

USER_STRATEGY = "user-hook"


@dataclass(frozen=True)
class LoopOptions:
    """How a check trains: steps, extra DDP keyword arguments (they override the target's
    ``find_unused_parameters``), micro-batches per step (more than one: all but the last run
    under ``ddp.no_sync()``), DDP's bucket cap, and ``uneven``: the steps the last rank runs
    fewer than the others, every rank inside ``ddp.join()``."""

    steps: int = 4
    ddp_options: tuple[tuple[str, Any], ...] = ()
    accumulate: int = 1
    bucket_cap_mb: float = 25.0  # torch DDP's default
    uneven: int = 0

    def steps_of(self, rank: int, world_size: int) -> int:
        return self.steps - (self.uneven if rank == world_size - 1 else 0)


class UserHook(SyncStrategy):
    """``user-hook``: DDP with the comm hook a user's ``CALLABLE`` registers (stock allreduce
    when there is none), every hook wrapped in a ``LayoutRecorder``. The state the hook was
    registered with is the strategy's source of figures and events where it keeps them (as
    ``harden``'s does: ``step_metrics()``, ``events``), so a hook reports what it saw without
    the suite knowing the hook."""

    name = USER_STRATEGY

    def __init__(self, cfg: SyncConfig, spec: TargetSpec, target: Target,
                 options: LoopOptions) -> None:
        super().__init__(cfg)
        self.spec, self.target, self.options = spec, target, options
        self.recorder: LayoutRecorder | None = None
        self.hook_state: Any = None
        self.ddp: DDP | None = None

    def wrap(self, model: nn.Module, ctx: RankInfo) -> nn.Module:
        kwargs = {"find_unused_parameters": self.target.find_unused_parameters,
                  "bucket_cap_mb": self.cfg.bucket_cap_mb, **dict(self.options.ddp_options)}
        ddp = DDP(model, **kwargs)

        def register(state: Any, hook: Any) -> None:
            self.recorder = LayoutRecorder(model, hook)
            self.hook_state = state
            if isinstance(getattr(state, "events", None), list):
                self.events = state.events
            DDP.register_comm_hook(ddp, state, self.recorder)

        ddp.register_comm_hook = register  # the user's registrations go through the recorder
        user = load_hook(self.spec.hook)
        if user is not None:
            user(ddp, ddp.process_group)
        guard = getattr(ddp, HARDENED_MARK, None)  # harden()'s step guard registers no hook
        if guard is not None and self.hook_state is None:
            self.hook_state = guard
            self.events = guard.events
        if self.recorder is None and registered_hook(ddp) is None:  # record around DDP's own
            self.recorder = LayoutRecorder(model)
            DDP.register_comm_hook(ddp, ddp.process_group, self.recorder)
        self.ddp = ddp
        return ddp

    def step_metrics(self) -> dict:
        metrics = getattr(self.hook_state, "step_metrics", None)
        return metrics() if callable(metrics) else {}


class Layouts(Callback):
    """Each step's bucket layout on this rank, as the user's hook saw it."""

    def __init__(self) -> None:
        self.layouts: list[tuple] = []

    def before_sync(self, step: int, model: nn.Module, strategy: SyncStrategy) -> None:
        recorder = getattr(strategy, "recorder", None)
        if recorder is not None:
            self.layouts.append(recorder.take())


def initial_state(target: Target) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in target.module.named_parameters()}


def train_target(ctx, spec: TargetSpec, options: LoopOptions,
                 faults: tuple[FaultSpec, ...] = (),
                 callbacks: Sequence[Callback] = ()) -> tuple[nn.Module, dict]:
    """Train the spec's target on this rank through ``UserHook``; returns the replica and the
    parameters it started from (rank 0's, broadcast by DDP)."""
    target = build_target(spec.factory)
    model = target.module.to(ctx.device)
    loop = CallbackList([FaultInjector(faults, ctx.rank, ctx.world_size), *callbacks])
    sync = SyncConfig(name=USER_STRATEGY, bucket_cap_mb=options.bucket_cap_mb)
    strategy = UserHook(loop.setup(model, sync), spec, target, options)
    try:
        module = loop.wrap(model, ctx, strategy)
        start = initial_state(target)
        opt = torch.optim.SGD(model.parameters(), lr=target.lr)
        joining = module.join() if options.uneven and isinstance(module, DDP) \
            else contextlib.nullcontext()
        with joining:
            for step in range(options.steps_of(ctx.rank, ctx.world_size)):
                _step(ctx, target, module, strategy, loop, opt, step, options.accumulate)
    finally:
        loop.close()
        strategy.close()
    return model, start


def _step(ctx, target: Target, module: nn.Module, strategy: SyncStrategy, loop: CallbackList,
          opt: torch.optim.Optimizer, step: int, accumulate: int) -> None:
    model = module.module if isinstance(module, DDP) else module
    strategy.begin_step(step)
    loop.before_forward(step, model)
    for micro in range(accumulate):
        batch = target.batch(step * accumulate + micro, ctx.rank, ctx.world_size)
        last = micro == accumulate - 1
        if last:
            loss = forward_loss(target, module, batch) / accumulate
            loop.before_backward(step, model)
            loss.backward()
        else:
            with module.no_sync():
                (forward_loss(target, module, batch) / accumulate).backward()
    loop.before_sync(step, model, strategy)
    applied = strategy.finish_step(step)
    loop.after_sync(step, model, strategy, applied)
    if applied:
        opt.step()
    opt.zero_grad(set_to_none=True)
    loop.after_step(step, model)


def train_reference(spec: TargetSpec, options: LoopOptions, world_size: int,
                    start: dict[str, torch.Tensor]) -> nn.Module:
    """One process, no DDP, on the concatenated global batch of every step, from ``start``.
    Under ``uneven`` a step some rank sat out holds only the active ranks' samples, and its
    loss counts them against the initial world size (a joined rank contributes zeros and DDP
    still divides by ``world_size``)."""
    from openclaw_ref.conformance.target import global_batch

    target = build_target(spec.factory)
    model = target.module
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(start[n])
    opt = torch.optim.SGD(model.parameters(), lr=target.lr)
    for step in range(options.steps):
        active = [r for r in range(world_size) if step < options.steps_of(r, world_size)]
        weight = len(active) / (world_size * options.accumulate)
        for micro in range(options.accumulate):
            batch = global_batch(target, step * options.accumulate + micro, world_size, active)
            (forward_loss(target, model, batch) * weight).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return model
