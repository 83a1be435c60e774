"""A user's comm hook as one more sync strategy, and the loop that trains a ``Target`` with it.

``UserHook`` wraps the model in DDP and hands it to the user's ``CALLABLE(ddp_model,
process_group)``; every hook that callable registers runs inside a ``HookRecorder`` (so the
checks read the buckets the user's hook saw, and what it returned). Without a callable it is
stock DDP itself — no comm hook at all, DDP's own reduction — because stock DDP is the oracle a
hook is judged against. ``train_target`` is the training loop of ``core/train.py`` reduced to
what any model supports — batch, forward, loss, backward, ``finish_step``, SGD — calling the
same callbacks (``core/callbacks.py``) at the same points, so the fault injector and the
conformance recorders work on a user's model unchanged. With ``LoopOptions.uneven`` the last
rank runs fewer steps and every rank trains inside ``ddp.join()`` (DDP's uneven-inputs mode).

Invariant: two runs of the same spec and options start from the same weights (torch's RNG is
seeded before the factory is called) and draw the same random numbers on each rank (seeded per
rank after wrapping), so a run with a hook and a run of stock DDP differ by the hook alone.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from openclaw_ref.arms.config import ArmConfig
from openclaw_ref.arms.strategy import SyncStrategy
from openclaw_ref.conformance.recorders import HookRecorder
from openclaw_ref.conformance.target import (
    Target,
    TargetSpec,
    build_target,
    forward_loss,
    load_hook,
)
from openclaw_ref.core.callbacks import Callback, CallbackList
from openclaw_ref.core.faults import FaultInjector, FaultSpec
from openclaw_ref.sync.base import RankInfo
from openclaw_ref.sync.target import HARDENED_MARK

USER_STRATEGY = "user-hook"
RUN_SEED = 20_251  # torch's seed before the factory; rank r trains from RUN_SEED + 1 + r


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

    def ddp_option(self, name: str, default: Any) -> Any:
        return dict(self.ddp_options).get(name, default)


class UserHook(SyncStrategy):
    """``user-hook``: DDP with the comm hook a user's ``CALLABLE`` registers, every hook wrapped
    in a ``HookRecorder``; without a callable, stock DDP with no comm hook. The state the hook
    was registered with is the strategy's source of figures and events where it keeps them (as
    ``harden``'s does: ``step_metrics()``, ``events``), so a hook reports what it saw without
    the suite knowing the hook."""

    name = USER_STRATEGY

    def __init__(self, cfg: ArmConfig, spec: TargetSpec, target: Target,
                 options: LoopOptions) -> None:
        super().__init__(cfg)
        self.spec, self.target, self.options = spec, target, options
        self.recorder: HookRecorder | None = None
        self.hook_state: Any = None
        self.ddp: DDP | None = None

    def wrap(self, model: nn.Module, ctx: RankInfo) -> nn.Module:
        kwargs = {"find_unused_parameters": self.target.find_unused_parameters,
                  "bucket_cap_mb": self.cfg.bucket_cap_mb, **dict(self.options.ddp_options)}
        ddp = DDP(model, **kwargs)

        def register(state: Any, hook: Any) -> None:
            self.recorder = HookRecorder(model, hook)
            self.hook_state = state
            if isinstance(getattr(state, "events", None), list):
                self.events = state.events
            DDP.register_comm_hook(ddp, state, self.recorder)

        user = load_hook(self.spec.hook)
        if user is not None:
            ddp.register_comm_hook = register  # the user's registrations go through the recorder
            user(ddp, ddp.process_group)
        guard = getattr(ddp, HARDENED_MARK, None)  # harden()'s step guard registers no hook
        if guard is not None and self.hook_state is None:
            self.hook_state = guard
            self.events = guard.events
        self.ddp = ddp
        return ddp

    def step_metrics(self) -> dict:
        metrics = getattr(self.hook_state, "step_metrics", None)
        return metrics() if callable(metrics) else {}


def snapshot(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter and buffer of ``model`` by name, copied to the CPU (a tied parameter
    once, under its first name)."""
    named = [*model.named_parameters(), *model.named_buffers()]
    return {n: t.detach().to("cpu", copy=True) for n, t in named}


def train_target(ctx, spec: TargetSpec, options: LoopOptions,
                 faults: tuple[FaultSpec, ...] = (),
                 callbacks: Sequence[Callback] = ()) -> nn.Module:
    """Train the spec's target on this rank through ``UserHook``; returns the replica."""
    torch.manual_seed(RUN_SEED)
    target = build_target(spec.factory)
    model = target.module.to(ctx.device)
    loop = CallbackList([FaultInjector(faults, ctx.rank, ctx.world_size), *callbacks])
    sync = ArmConfig(name=USER_STRATEGY, bucket_cap_mb=options.bucket_cap_mb)
    strategy = UserHook(loop.setup(model, sync), spec, target, options)
    try:
        module = loop.wrap(model, ctx, strategy)
        torch.manual_seed(RUN_SEED + 1 + ctx.rank)
        opt = torch.optim.SGD(model.parameters(), lr=target.lr)
        joining = module.join() if options.uneven and isinstance(module, DDP) \
            else contextlib.nullcontext()
        with joining:
            for step in range(options.steps_of(ctx.rank, ctx.world_size)):
                _step(ctx, target, module, strategy, loop, opt, step, options.accumulate)
    finally:
        loop.close()
        strategy.close()
    return model


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
                    start: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """One process, no DDP, on the concatenated global batch of every step, from ``start``
    (parameters and buffers, as DDP started); returns its final ``snapshot``. Under ``uneven``
    a step some rank sat out holds only the active ranks' samples, and its loss counts them
    against the initial world size (a joined rank contributes zeros and DDP still divides by
    ``world_size``). What stock DDP is compared with to tell whether the model is
    shard-invariant: a property of the model, never a verdict on a hook."""
    from openclaw_ref.conformance.target import global_batch

    torch.manual_seed(RUN_SEED)
    target = build_target(spec.factory)
    model = target.module
    with torch.no_grad():
        for n, t in [*model.named_parameters(), *model.named_buffers()]:
            t.copy_(start[n])
    torch.manual_seed(RUN_SEED + 1)
    opt = torch.optim.SGD(model.parameters(), lr=target.lr)
    for step in range(options.steps):
        active = [r for r in range(world_size) if step < options.steps_of(r, world_size)]
        weight = len(active) / (world_size * options.accumulate)
        for micro in range(options.accumulate):
            batch = global_batch(target, step * options.accumulate + micro, world_size, active)
            (forward_loss(target, model, batch) * weight).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return snapshot(model)
