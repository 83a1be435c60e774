"""The one callback protocol of the training loop: faults, the gradient probe, the Prometheus
exporter and P2 barrier, and the conformance recorders all see a run through these hook points.

Hook points, in the order the loop (``core/train.py``) and the Lightning strategy call them:

  ``setup(model, sync)``            the model is built, the strategy not yet; may reorder the
                                    model's registration or change this rank's ``ArmConfig``
  ``wrap(model, ctx, strategy)``    may return the module to run forward on instead of
                                    ``strategy.wrap`` (the first callback that returns one wins)
  ``on_wrapped(strategy)``          the strategy has wrapped the model (its hooks exist)
  per step:
  ``before_forward(step, model)``   after the strategy's ``begin_step``
  ``before_backward(step, model)``  the loss exists; tensor hooks registered here see the
                                    local gradients of this backward
  ``before_sync(step, model, strategy)``           after backward, before ``finish_step``
  ``after_sync(step, model, strategy, applied)``   after ``finish_step``, before the optimizer
  ``after_step(step, model)``       after the optimizer step (or the skipped one)
  ``on_step_metrics(step, metrics, applied, events)``  after the step was timed: the strategy's
                                    ``step_metrics()``, which a callback may annotate in place
                                    (only callbacks with ``observes_metrics`` are called)
  ``on_event(event)``               a check stopped the run with this event
  ``close()``                       the run is over (also after an error)

Invariant: a ``CallbackList`` calls every hook on its callbacks in list order, so the order of
events within a step is fixed by the order of the list the loop builds.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from torch import nn

from openclaw_ref.arms.config import ArmConfig
from openclaw_ref.arms.strategy import SyncStrategy
from openclaw_ref.core.config import MetricsConfig
from openclaw_ref.sync.base import RankInfo
from openclaw_ref.sync.errors import BadInput, Event


class Callback:
    """A no-op at every hook point; subclasses override the ones they need."""

    observes_metrics: bool = False  # True: ``on_step_metrics`` is called every step

    def setup(self, model: nn.Module, sync: ArmConfig) -> ArmConfig:
        return sync

    def wrap(self, model: nn.Module, ctx: RankInfo, strategy: SyncStrategy) -> nn.Module | None:
        return None

    def on_wrapped(self, strategy: SyncStrategy) -> None:
        pass

    def before_forward(self, step: int, model: nn.Module) -> None:
        pass

    def before_backward(self, step: int, model: nn.Module) -> None:
        pass

    def before_sync(self, step: int, model: nn.Module, strategy: SyncStrategy) -> None:
        pass

    def after_sync(self, step: int, model: nn.Module, strategy: SyncStrategy,
                   applied: bool) -> None:
        pass

    def after_step(self, step: int, model: nn.Module) -> None:
        pass

    def on_step_metrics(self, step: int, metrics: dict, applied: bool,
                        events: Sequence[Event]) -> None:
        pass

    def on_event(self, event: Event) -> None:
        pass

    def close(self) -> None:
        pass


class CallbackList:
    """Calls each hook on every callback, in list order."""

    def __init__(self, callbacks: Sequence[Callback] = ()) -> None:
        self.callbacks = list(callbacks)

    def setup(self, model: nn.Module, sync: ArmConfig) -> ArmConfig:
        for c in self.callbacks:
            sync = c.setup(model, sync)
        return sync

    def wrap(self, model: nn.Module, ctx: RankInfo, strategy: SyncStrategy) -> nn.Module:
        """The first module a callback returns, else ``strategy.wrap``; then ``on_wrapped``."""
        module = None
        for c in self.callbacks:
            module = c.wrap(model, ctx, strategy)
            if module is not None:
                break
        if module is None:
            module = strategy.wrap(model, ctx)
        for c in self.callbacks:
            c.on_wrapped(strategy)
        return module

    def before_forward(self, step: int, model: nn.Module) -> None:
        for c in self.callbacks:
            c.before_forward(step, model)

    def before_backward(self, step: int, model: nn.Module) -> None:
        for c in self.callbacks:
            c.before_backward(step, model)

    def before_sync(self, step: int, model: nn.Module, strategy: SyncStrategy) -> None:
        for c in self.callbacks:
            c.before_sync(step, model, strategy)

    def after_sync(self, step: int, model: nn.Module, strategy: SyncStrategy,
                   applied: bool) -> None:
        for c in self.callbacks:
            c.after_sync(step, model, strategy, applied)

    def after_step(self, step: int, model: nn.Module) -> None:
        for c in self.callbacks:
            c.after_step(step, model)

    def on_step_metrics(self, step: int, metrics: dict, applied: bool,
                        events: Sequence[Event]) -> dict:
        """The step's metrics as the run records them. Unobserved: ``metrics`` itself. Observed:
        a copy marked ``skew_barrier`` (False unless the P2 barrier ran in this step, which
        its callback sets) that each observer may annotate in turn."""
        observers = [c for c in self.callbacks if c.observes_metrics]
        if not observers:
            return metrics
        metrics = dict(metrics, skew_barrier=False)
        for c in observers:
            c.on_step_metrics(step, metrics, applied, events)
        return metrics

    def on_event(self, event: Event) -> None:
        for c in self.callbacks:
            c.on_event(event)

    def close(self) -> None:
        for c in self.callbacks:
            c.close()


class RankCallbacks(Protocol):
    """Builds the callbacks a run's ``MetricsConfig`` asks for, on the rank, once it runs (a
    parent cannot build them and send them: the exporter binds its port on its own rank). The
    metrics sink, ``ops.prometheus.metrics_callbacks`` (the P2 barrier, the Prometheus
    exporter), reaches the loop this way, passed by whoever builds the run (the CLI, the P2
    bench), so ``core`` never imports ``ops``, the floor above it."""

    def __call__(self, cfg: MetricsConfig, ctx: RankInfo) -> list[Callback]: ...


def no_metrics(cfg: MetricsConfig, ctx: RankInfo) -> list[Callback]:
    """The loop's sink when none is passed: no callbacks, and a run whose config asks for
    metrics is refused rather than trained silently without them."""
    if cfg.enabled:
        raise BadInput("this run's MetricsConfig asks for an exporter or the P2 barrier, but no "
                       "metrics sink was passed (metrics=ops.prometheus.metrics_callbacks)")
    return []
