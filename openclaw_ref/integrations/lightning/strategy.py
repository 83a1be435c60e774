"""``SyncDDPStrategy``: Lightning DDP whose wrapper and comm hook come from ``openclaw_ref.sync``,
and which runs the training loop's callbacks (``core/callbacks.py``) at Lightning's points.

Why a subclass: Lightning's own ``DDPStrategy`` registers a comm hook only when the device is CUDA
and silently does nothing on CPU/gloo; here the hook is installed by ``SyncStrategy.wrap`` on
every device. Per step it calls ``begin_step`` before the forward and ``finish_step`` after the
backward; a False from ``finish_step`` (every rank skips together, e.g. an FP16 overflow) clears
the gradients so the optimizer step that Lightning still runs changes nothing.

Callbacks (built once the rank is known, in ``_setup_model``): the metrics callbacks (P2 barrier,
exporter) then the fault injector — the order Lightning ran them in before they were callbacks
(its callback hooks run before the module's). They act on the ``OpenClawModule``'s inner model,
so parameter names are the plain loop's. The end of a step (``after_step``, the step's metrics)
runs from ``SyncStepEnd``, a Lightning callback the strategy adds to its trainer, after the
runner's step clock.

Registration: importing this package registers the strategy in Lightning's ``StrategyRegistry``
as ``openclaw_sync_ddp`` (the hardened hook, defaults otherwise), so
``Trainer(strategy="openclaw_sync_ddp")`` works. Lightning 2.6 reads no entry point for
strategies (only for callbacks), so the import is what registers it.
"""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any

import lightning as L
import torch
import torch.distributed as dist
from lightning.pytorch.strategies import DDPStrategy, StrategyRegistry
from torch import nn

from openclaw_ref.arms.config import ArmConfig
from openclaw_ref.arms.registry import make_strategy
from openclaw_ref.arms.strategy import SyncStrategy
from openclaw_ref.core.callbacks import CallbackList
from openclaw_ref.core.config import MetricsConfig
from openclaw_ref.core.faults import FaultInjector, FaultSpec
from openclaw_ref.core.launch import RankContext
from openclaw_ref.integrations.lightning.module import OpenClawModule
from openclaw_ref.ops.prometheus import PrometheusExporter, metrics_callbacks
from openclaw_ref.sync.errors import BadInput

HARDENED = ArmConfig(name="hardened")
NO_METRICS = MetricsConfig()


class SyncDDPStrategy(DDPStrategy):
    """Lightning DDP whose wrapper and comm hook come from ``openclaw_ref.arms`` (see module
    docstring). ``sync.name`` must be a DDP-based strategy (``hardened``, ``ddp``, ``ddp-fp16``);
    ``faults`` and ``metrics`` become the loop callbacks of every rank.

    After ``fit``: ``step_metrics`` (one dict per step, this rank), ``sync_summary``,
    ``events``, ``skipped_steps`` and ``metrics_port``."""

    strategy_name = "openclaw_sync_ddp"

    def __init__(self, sync: ArmConfig = HARDENED, faults: tuple[FaultSpec, ...] = (),
                 metrics: MetricsConfig = NO_METRICS,
                 **kwargs: Any) -> None:
        kwargs.setdefault("process_group_backend", None)
        deadline = max(30.0, sync.harden.watchdog_s * 2)
        kwargs.setdefault("timeout", datetime.timedelta(seconds=deadline))
        super().__init__(**kwargs)
        self.sync_cfg, self.fault_specs, self.metrics = sync, faults, metrics
        self.sync: SyncStrategy | None = None
        self.callbacks = CallbackList()
        self.step_metrics: list[dict] = []
        self.sync_summary: dict = {}
        self.events: list = []
        self.skipped_steps = 0
        self._step = 0
        self._target: nn.Module | None = None  # the model the callbacks act on

    @classmethod
    def register_strategies(cls, strategy_registry: Any) -> None:
        """Lightning's registration hook: only our own name (the parent's would re-register
        ``ddp``, ``ddp_spawn``, ... as this class)."""
        strategy_registry.register(
            cls.strategy_name, cls, override=True,
            description="DDP with the openclaw hardened comm hook (also on CPU/gloo)")

    def rank_context(self) -> RankContext:
        return RankContext(self.global_rank, self.world_size, self.local_rank, self.num_processes,
                           self._get_process_group_backend(), self.root_device,
                           dist.distributed_c10d._get_default_store())

    @property
    def metrics_port(self) -> int | None:
        """The port of this rank's Prometheus exporter, if one runs."""
        exporter = next((c for c in self.callbacks.callbacks
                         if isinstance(c, PrometheusExporter)), None)
        return exporter.port if exporter else None

    def setup(self, trainer: L.Trainer) -> None:
        if not any(isinstance(c, SyncStepEnd) for c in trainer.callbacks):
            trainer.callbacks.append(SyncStepEnd())  # after the user's (e.g. a step clock)
        super().setup(trainer)

    def _setup_model(self, model: nn.Module) -> nn.Module:
        ctx = self.rank_context()
        self._target = model.model if isinstance(model, OpenClawModule) else model
        self.callbacks = CallbackList([*metrics_callbacks(self.metrics, ctx),
                                       FaultInjector(self.fault_specs, ctx.rank, ctx.world_size)])
        cfg = self.callbacks.setup(self._target, self.sync_cfg)
        # the user's DDP flags (find_unused_parameters, static_graph, gradient_as_bucket_view,
        # bucket_cap_mb, ...) win over the suite's defaults, as with Lightning's own DDPStrategy
        cfg = dataclasses.replace(cfg, ddp_options={**cfg.ddp_options, **self._ddp_kwargs})
        self.sync = make_strategy(cfg)
        wrapped = self.callbacks.wrap(model, ctx, self.sync)
        if not isinstance(wrapped, nn.parallel.DistributedDataParallel):
            raise BadInput(f"--sync {cfg.name} does not build on torch DDP; under Lightning use "
                           "hardened, ddp or ddp-fp16")
        return wrapped

    def _register_ddp_hooks(self) -> None:
        """Nothing to do: ``SyncStrategy.wrap`` registered our hook on every device type (the
        parent's version would register only on CUDA, and only Lightning's own hooks)."""

    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        if self.sync is not None:
            self.sync.begin_step(self._step)
            self.callbacks.before_forward(self.lightning_module.global_step, self._target)
        return super().training_step(*args, **kwargs)

    def pre_backward(self, closure_loss: torch.Tensor) -> None:
        super().pre_backward(closure_loss)
        if self.sync is not None:
            self.callbacks.before_backward(self.lightning_module.global_step, self._target)

    def post_backward(self, closure_loss: torch.Tensor) -> None:
        super().post_backward(closure_loss)
        if self.sync is None:
            return
        step, self._step = self._step, self._step + 1
        applied = self.sync.finish_step(step)
        module = self.lightning_module
        if not applied:  # every rank got False: the optimizer step is skipped everywhere
            self.skipped_steps += 1
            if getattr(self.precision_plugin, "scaler", None) is None:
                for p in module.parameters():  # no loss scaler to see the NaN/inf and skip
                    p.grad = None
        self.callbacks.after_sync(step, self._target, self.sync, applied)
        self.step_metrics.append(dict(self.sync.step_metrics(), applied=applied))
        self.events = list(self.sync.events)

    def end_step(self, step: int) -> None:
        """After the optimizer step: ``after_step`` and the step's metrics to the callbacks."""
        if self.sync is None or not self.step_metrics:
            return
        self.callbacks.after_step(step, self._target)
        last = self.step_metrics[-1]
        self.step_metrics[-1] = self.callbacks.on_step_metrics(
            step, last, bool(last.get("applied", True)), self.events)

    def teardown(self) -> None:
        if self.sync is not None:
            self.sync_summary = self.sync.summary()
            self.events = list(self.sync.events)
            self.sync.close()
        self.callbacks.close()
        super().teardown()


class SyncStepEnd(L.Callback):
    """Ends each step of a ``SyncDDPStrategy`` once Lightning's optimizer step is done."""

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        strategy = trainer.strategy
        if isinstance(strategy, SyncDDPStrategy):
            strategy.end_step(trainer.global_step - 1)  # global_step already advanced


SyncDDPStrategy.register_strategies(StrategyRegistry)
