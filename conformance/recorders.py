"""Recorders: loop callbacks (``core/callbacks.py``) that watch the one training loop for the
conformance checks, so the checks run this very loop instead of a copy of it.

Each recorder keeps what this rank saw; the checks gather it to every rank afterwards. Nothing
here adds a collective to a step.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

from openclaw_ref.arms.strategy import SyncStrategy
from openclaw_ref.conformance.settings import ConformSettings
from openclaw_ref.core.callbacks import Callback
from openclaw_ref.core.digests import tensor_digest
from openclaw_ref.core.launch import RankContext
from openclaw_ref.core.metrics import GradientProbe
from openclaw_ref.sync.base import RankInfo


def observed_run(ctx: RankContext, cfg, *recorders: Callback,
                 apply_updates: bool = True) -> nn.Module:
    """Run ``cfg`` (a ``TrainConfig``) through the one training loop with ``recorders`` as its
    last callbacks; returns this rank's replica. ``apply_updates=False`` keeps the weights."""
    from openclaw_ref.core.train import train_model

    return train_model(ctx, cfg, recorders, apply_updates=apply_updates).model


def grad_manifest(model: nn.Module) -> tuple[tuple[str, tuple[int, ...], str, bool], ...]:
    """(name, shape, dtype, present) of every parameter's gradient, in registration order."""
    return tuple((n, tuple(p.grad.shape) if p.grad is not None else tuple(p.shape),
                  str(p.grad.dtype if p.grad is not None else p.dtype), p.grad is not None)
                 for n, p in model.named_parameters())


class ManifestRecorder(GradientProbe):
    """Records, after each sync, the synchronized gradient manifest and which parameters had no
    *local* gradient on this rank (read by the probe before the sync)."""

    def __init__(self) -> None:
        super().__init__(norm_suffixes=())
        self.synced: list[tuple] = []
        self.local_missing: list[tuple[str, ...]] = []

    def after_sync(self, step: int, model: nn.Module, strategy: SyncStrategy,
                   applied: bool) -> None:
        self.synced.append(grad_manifest(model))
        self.local_missing.append(tuple(self.missing()))


class LayoutRecorder:
    """A DDP comm hook that records each bucket's members (names) on this rank, then runs the
    wrapped hook (stock allreduce by default). Layout per step: [(bucket index, (names…)), …]."""

    def __init__(self, model: nn.Module, inner: Callable | None = None) -> None:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        self.__name__ = self.__qualname__ = "LayoutRecorder"  # DDP's logger names the hook
        self.names = {id(p): n for n, p in model.named_parameters()}
        self.inner = inner or default_hooks.allreduce_hook
        self.current: list[tuple[int, tuple[str, ...]]] = []

    def __call__(self, state, bucket):  # no annotations: DDP rejects string ones
        self.current.append((bucket.index(),
                             tuple(self.names.get(id(p), "?") for p in bucket.parameters())))
        return self.inner(state, bucket)

    def take(self) -> tuple[tuple[int, tuple[str, ...]], ...]:
        layout, self.current = tuple(sorted(self.current)), []
        return layout


class HookRecorder(LayoutRecorder):
    """A user's comm hook as the suite runs it: each bucket's members (``LayoutRecorder``) and,
    while ``keep_values`` is set, the bucket this rank handed the hook (cloned before the hook
    touches it) and the tensor the hook's future completed with. Values per step:
    [(bucket index, local, result), …].

    While recording, DDP gets the hook's future chained through one callback that copies the
    value and passes it on unchanged — chained, not a done-callback, so that DDP cannot finish
    the backward before the copy exists (a done-callback may run after DDP's wait returned).
    A hook's failed future then reaches DDP wrapped in the callback's error; outside the
    recorded steps the hook's own future goes back untouched."""

    def __init__(self, model: nn.Module, inner: Callable) -> None:
        super().__init__(model, inner)
        self.keep_values = False
        self.values: list[tuple[int, torch.Tensor, torch.Tensor]] = []

    def __call__(self, state, bucket):
        if not self.keep_values:
            return super().__call__(state, bucket)
        local = bucket.buffer().detach().clone()
        index, values = bucket.index(), self.values

        def keep(done):
            value = done.value()
            result = value[0] if isinstance(value, (list, tuple)) else value
            values.append((index, local, result.detach().clone()))
            return value

        return super().__call__(state, bucket).then(keep)

    def take_values(self) -> list[tuple[int, torch.Tensor, torch.Tensor]]:
        values, self.values = sorted(self.values, key=lambda v: v[0]), []
        return values


def strategy_layout(strategy: SyncStrategy) -> tuple | None:
    """The bucket layout a self-verifying strategy used in the current step, read from its own
    records: ``hardened`` keeps this step's bucket records until ``finish_step`` (so call this
    before it), ``bucketed`` keeps its last plan. A public ``bucket_layout()`` wins when present.
    None when the strategy exposes nothing."""
    fn = getattr(strategy, "bucket_layout", None)
    if fn is not None:
        return tuple(sorted((int(i), tuple(names)) for i, names in fn()))
    state_layout = getattr(getattr(strategy, "state", None), "step_layout", None)
    if state_layout is not None:
        return tuple(sorted((i, tuple(names)) for i, names in state_layout()))
    engine = getattr(strategy, "engine", None)
    if engine is not None and getattr(engine, "last_plan", None) is not None:
        return tuple((f.index, tuple(f.names)) for f in engine.frames(engine.last_plan))
    return None


class BucketLayouts(Callback):
    """Each step's bucket layout on this rank: stock DDP's through a ``LayoutRecorder`` around
    its own hook (installed by ``wrap``), others' from the strategy's records
    (``strategy_layout``) — before ``finish_step`` for ``hardened``, whose records die in it."""

    def __init__(self) -> None:
        self.layouts: list[tuple | None] = []
        self.recorder: LayoutRecorder | None = None

    def wrap(self, model: nn.Module, ctx: RankInfo, strategy: SyncStrategy) -> nn.Module | None:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        from openclaw_ref.arms.ddp import is_stock, wrap_ddp

        # DDP plus at most one of PyTorch's hooks (``StockDDP.comm_hook``), nothing else: its
        # hook is run inside the recorder.
        if not is_stock(type(strategy)):
            return None
        ddp = wrap_ddp(model, ctx, strategy.cfg)
        state, hook = strategy.comm_hook(ddp) or (None, default_hooks.allreduce_hook)
        self.recorder = LayoutRecorder(model, hook)
        ddp.register_comm_hook(state, self.recorder)
        return ddp

    def before_sync(self, step: int, model: nn.Module, strategy: SyncStrategy) -> None:
        if self.recorder is not None:
            self.layouts.append(self.recorder.take())
        elif getattr(strategy, "state", None) is not None:
            self.layouts.append(strategy_layout(strategy))

    def after_sync(self, step: int, model: nn.Module, strategy: SyncStrategy,
                   applied: bool) -> None:
        if self.recorder is None and getattr(strategy, "state", None) is None:
            self.layouts.append(strategy_layout(strategy))


class HighDynamicRange(Callback):
    """The high-dynamic-range gradient workload: each parameter's gradient is multiplied by a
    seeded per-element factor 10^U(-d, d) (and the loss by ``hdr_loss_scale`` beforehand), so
    within every tensor max/min ≫ 1e4 — the seed's M4 setting. Seeded by (seed, step, index):
    identical on every rank, independent of the rank's data. The hooks live for one backward."""

    def __init__(self, s: ConformSettings) -> None:
        self.s = s
        self._handles: list = []

    def before_backward(self, step: int, model: nn.Module) -> None:
        s = self.s
        for i, p in enumerate(model.parameters()):
            g = torch.Generator().manual_seed(s.model.seed * 1_000_003 + step * 1009 + i)
            factor = (10.0 ** ((torch.rand(p.shape, generator=g) * 2 - 1)
                               * s.hdr_spread_decades) * s.hdr_loss_scale).to(p.device)
            self._handles.append(p.register_hook(lambda grad, f=factor: grad * f))

    def before_sync(self, step: int, model: nn.Module, strategy: SyncStrategy) -> None:
        self.close()

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()


class OverflowCounter(Callback):
    """Counts, after each sync, the gradient elements that are inf/NaN, those the strategy
    reports as wire overflows, skipped steps and the smallest max/min |g| ratio of a step."""

    def __init__(self) -> None:
        self.counts = {"elements": 0, "nonfinite": 0, "reported": 0, "skipped": 0,
                       "ratio_min": math.inf}

    def after_sync(self, step: int, model: nn.Module, strategy: SyncStrategy,
                   applied: bool) -> None:
        counts = self.counts
        grads = [p.grad.detach().reshape(-1) for p in model.parameters() if p.grad is not None]
        flat = torch.cat(grads).float()
        finite = flat[torch.isfinite(flat)].abs()
        nonzero = finite[finite > 0]
        if nonzero.numel():  # the step's dynamic range: max/min nonzero |g| over the model
            counts["ratio_min"] = min(counts["ratio_min"], float(nonzero.max() / nonzero.min()))
        counts["elements"] += flat.numel()
        counts["nonfinite"] += int((~torch.isfinite(flat)).sum())
        counts["reported"] += int(strategy.step_metrics().get("overflow_elements", 0) or 0)
        counts["skipped"] += not applied


class ReplicaDigests(Callback):
    """Each parameter's digest on this rank after every optimizer step."""

    def __init__(self) -> None:
        self.digests: list[tuple[str, ...]] = []
        self.names: list[str] = []

    def after_step(self, step: int, model: nn.Module) -> None:
        if not self.names:
            self.names.extend(n for n, _ in model.named_parameters())
        self.digests.append(tuple(tensor_digest(p) for p in model.parameters()))
