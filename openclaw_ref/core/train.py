"""The training loop every strategy is measured on, and the run JSON it writes.

One loop for all strategies: the strategy owns synchronization, callbacks (``core/callbacks.py``:
faults, the gradient probe, metrics, conformance recorders) observe or perturb it at fixed hook
points, this file owns the order of events and the records. Per-rank figures are kept locally
and gathered once at the end of the run, so recording adds no collective to any step.

Run JSON (written by rank 0, atomically): ``config``, ``environment``, ``steps`` (global
records: step, loss, step_ms = slowest rank, per-rank lists, sync metrics), ``summary``
(final_loss, param_digest, replicas_equal, …), ``events`` (detected problems; empty in a clean
run). A run that stops — an error, a SIGTERM, its watchdog — is recorded by every rank that
stops, each its part merged into the same file, before it can be killed (``stop_record.py``).
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from openclaw_ref.arms.config import ArmConfig
from openclaw_ref.arms.registry import make_strategy
from openclaw_ref.arms.strategy import SyncStrategy
from openclaw_ref.core.callbacks import Callback, CallbackList, RankCallbacks, no_metrics
from openclaw_ref.core.config import MetricsConfig, ModelSection, TrainSection
from openclaw_ref.core.data import DataConfig, SkillDataset, rank_batch
from openclaw_ref.core.digests import params_digest
from openclaw_ref.core.environment import environment
from openclaw_ref.core.faults import FaultInjector, FaultSpec, validate_faults
from openclaw_ref.core.jsonio import check_output_file, write_json_atomic
from openclaw_ref.core.launch import LaunchConfig, RankContext, launch
from openclaw_ref.core.metrics import GradientProbe, StepTimer, peak_memory_mb, reset_peak_memory
from openclaw_ref.core.model import EVAL_STEP, OpenClawConfig, build_model
from openclaw_ref.core.progress import progress_bar
from openclaw_ref.core.stop_record import StopRecord
from openclaw_ref.sync.errors import BadInput, ConsistencyError, SyncTimeout

OPTIMIZERS = ("adamw", "sgd")
# Seed 004's AMP (claim L3): bf16 autocast on CPU, fp16 on GPU. Forward and loss only; no
# GradScaler, so fp16 runs time the autocast cost, not a loss-scaled recipe.
AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class TrainConfig:
    """A run of the loop. Its keywords are flat (they are the run JSON's ``config``); the model
    and training fields are the ``ModelSection`` and ``TrainSection`` of ``core/config.py``,
    which other run configurations embed and translate through ``from_sections``."""

    preset: str = "tiny"
    world_size: int = 1
    steps: int = 50
    global_batch: int = 32
    seed: int = 1
    lr: float = 3e-3
    optimizer: str = "adamw"
    sparsity_range: tuple[float, float] | None = None  # None: the preset's (the seed's range)
    eval_every: int = 10  # 0 = only at the end
    sync: ArmConfig = field(default_factory=ArmConfig)
    data: DataConfig = field(default_factory=DataConfig)
    faults: tuple[FaultSpec, ...] = ()
    metrics: MetricsConfig = field(default_factory=MetricsConfig)  # exporter, P2 barrier
    amp: str | None = None  # autocast dtype of forward + loss: None (fp32), "bf16" or "fp16"
    backend: str = "auto"
    timeout_s: float = 600.0
    progress: bool = True
    out: str | None = None

    @classmethod
    def from_sections(cls, model: ModelSection, train: TrainSection, **rest: Any) -> TrainConfig:
        """The loop configuration of a model and training section; ``rest`` sets the others."""
        return cls(preset=model.preset, seed=model.seed, sparsity_range=model.sparsity_range,
                   steps=train.steps, global_batch=train.global_batch, lr=train.lr,
                   optimizer=train.optimizer, eval_every=train.eval_every, amp=train.amp, **rest)

    @property
    def model_section(self) -> ModelSection:
        return ModelSection(self.preset, self.seed, self.sparsity_range)

    def model_config(self) -> OpenClawConfig:
        return self.model_section.model_config()

    def validate(self) -> None:
        """Every check that can run before a process is spawned; raises BadInput."""
        if self.world_size < 1:
            raise BadInput(f"world size must be >= 1; got {self.world_size}")
        if self.steps < 1:
            raise BadInput(f"steps must be >= 1; got {self.steps}")
        if self.global_batch < 1 or self.global_batch % self.world_size:
            raise BadInput(f"global batch {self.global_batch} is not a positive multiple of "
                           f"world size {self.world_size}")
        if self.optimizer not in OPTIMIZERS:
            raise BadInput(f"optimizer must be one of {', '.join(OPTIMIZERS)}")
        if self.lr <= 0:
            raise BadInput(f"learning rate must be positive; got {self.lr}")
        if self.amp is not None and self.amp not in AMP_DTYPES:
            raise BadInput(f"amp must be one of {', '.join(AMP_DTYPES)} (or unset); "
                           f"got {self.amp!r}")
        try:
            self.model_config()
        except ValueError as exc:
            raise BadInput(str(exc)) from None
        validate_faults(self.faults, self.world_size, self.steps)
        if self.out:
            check_output_file(self.out, "--out")

    def launch_config(self) -> LaunchConfig:
        return LaunchConfig(self.world_size, backend=self.backend, timeout_s=self.timeout_s,
                            pg_timeout_s=max(30.0, self.sync.harden.watchdog_s * 2))

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        d["sync"] = self.sync.to_json()
        d["faults"] = [dataclasses.asdict(f) for f in self.faults]
        return d


SGD_MOMENTUM = 0.9  # the conformance equivalence tolerance of PowerSGD depends on it


def make_optimizer(cfg: TrainConfig, model: nn.Module) -> torch.optim.Optimizer:
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=SGD_MOMENTUM)
    return torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)


@torch.no_grad()
def validation_loss(model: nn.Module, ds: SkillDataset, device: torch.device) -> float:
    """Loss on the whole validation split at the middle sparsity; identical on every rank."""
    model.eval()
    batch = ds.validation().to(device)
    loss = F.cross_entropy(model(batch.tokens, batch.sample_ids, EVAL_STEP), batch.labels)
    model.train()
    return float(loss)


@dataclass
class RankLog:
    """What one rank measured, gathered to rank 0 at the end of the run."""

    rank: int
    loss: list[float] = field(default_factory=list)
    step_ms: list[float] = field(default_factory=list)
    grad_norms: list[dict] = field(default_factory=list)
    missing_grads: list[list[str]] = field(default_factory=list)
    realized_sparsity: list[float] = field(default_factory=list)
    mask_entropy: list[float] = field(default_factory=list)
    sync: list[dict] = field(default_factory=list)
    applied: list[bool] = field(default_factory=list)
    peak_memory_mb: float = 0.0
    peak_memory_scope: str = "process"  # "run": the high-water mark was reset at its start
    param_digest: str = ""


@dataclass
class TrainResult:
    model: nn.Module  # this rank's trained replica (unwrapped)
    record: dict | None  # the run record on rank 0, None elsewhere


@dataclass
class Run:
    """One rank's run in progress: what the step functions share."""

    ctx: RankContext
    cfg: TrainConfig
    ds: SkillDataset
    model: nn.Module
    strategy: SyncStrategy
    module: nn.Module  # what the forward runs on (the strategy's wrapper)
    opt: torch.optim.Optimizer
    probe: GradientProbe
    callbacks: CallbackList
    apply_updates: bool
    timer: StepTimer
    log: RankLog
    val_curve: list[tuple[int, float]] = field(default_factory=list)

    def stop_record(self) -> StopRecord | None:
        """This rank's share of the record of a run that stops (None without ``out``)."""
        if not self.cfg.out:
            return None
        return StopRecord(self.cfg.out, self.ctx.rank, lambda: _record_head(self.ctx, self.cfg),
                          lambda: {"loss": self.log.loss, "step_ms": self.log.step_ms,
                                   "events": [e.to_json() for e in self.strategy.events]},
                          cause=self.strategy.known_failure)


def train_rank(ctx: RankContext, cfg: TrainConfig, callbacks: Sequence[Callback] = (),
               metrics: RankCallbacks = no_metrics) -> dict | None:
    """One rank's run. Returns the run record on rank 0 and None elsewhere.

    ``callbacks`` see every step after the built-in ones (tests scrape the exporter from one);
    ``metrics`` builds the callbacks ``cfg.metrics`` asks for (``core/callbacks.py``)."""
    return train_model(ctx, cfg, callbacks, metrics=metrics).record


def train_model(ctx: RankContext, cfg: TrainConfig, callbacks: Sequence[Callback] = (), *,
                apply_updates: bool = True, metrics: RankCallbacks = no_metrics) -> TrainResult:
    """The training loop on one rank; also hands back the replica for equivalence checks.

    The loop's callbacks run in this order: the fault injector, the gradient probe, the metrics
    callbacks ``metrics`` builds from ``cfg.metrics`` (P2 barrier, exporter), then
    ``callbacks``. ``apply_updates=False`` keeps the weights fixed (conformance rates measured
    over many batches)."""
    memory_scope = reset_peak_memory(ctx.device)  # per run, not per (reused) worker process
    model_cfg = cfg.model_config()
    ds = SkillDataset(model_cfg, dataclasses.replace(cfg.data, seed=cfg.seed))
    model = build_model(model_cfg).to(ctx.device)
    probe = GradientProbe()
    loop_callbacks = CallbackList([FaultInjector(cfg.faults, ctx.rank, ctx.world_size), probe,
                                   *metrics(cfg.metrics, ctx), *callbacks])
    try:
        strategy = make_strategy(loop_callbacks.setup(model, cfg.sync))
        module = loop_callbacks.wrap(model, ctx, strategy)
        run = Run(ctx, cfg, ds, model, strategy, module, make_optimizer(cfg, model), probe,
                  loop_callbacks, apply_updates, StepTimer(ctx.device), RankLog(ctx.rank))
        t_start = time.perf_counter()
        _run_steps(run)
    finally:
        loop_callbacks.close()
    return _finish(run, memory_scope, t_start)


def _run_steps(run: Run) -> None:
    """Every step, the final validation and the strategy's close — with its last check on a
    run every rank finished (``hardened``: every replica slice, so a divergence after the last
    visit of its slice still ends the run with ``ReplicaDivergence``, exit 3); a check that
    stops the run is reported to the callbacks, to the peers (the strategy's failure note)
    and recorded by this rank (``stop_record``) before it propagates."""
    stop = run.stop_record()
    with stop.armed(run.ctx) if stop is not None else nullcontext():
        _run_all(run, stop)


def _run_all(run: Run, stop: StopRecord | None) -> None:
    ctx, cfg = run.ctx, run.cfg
    bar = _progress(ctx, cfg)
    ended = False  # every rank finished every step: the strategy's close may check (a collective)
    try:
        for step in range(cfg.steps):
            _train_step(run, step)
            if cfg.eval_every and (step + 1) % cfg.eval_every == 0 and step + 1 < cfg.steps:
                run.val_curve.append((step, validation_loss(run.model, run.ds, ctx.device)))
            if bar is not None:
                bar.update(1)
                bar.set_postfix_str(f"rank 0 loss {run.log.loss[-1]:.3f}")
        run.val_curve.append((cfg.steps - 1, validation_loss(run.model, run.ds, ctx.device)))
        ended = True
        if bar is not None:
            bar.close()
            bar = None
        run.strategy.close()  # hardened: every replica slice compared once (exit 3 if not)
    except Exception as exc:
        if isinstance(exc, ConsistencyError | SyncTimeout):
            run.callbacks.on_event(exc.event())
        run.strategy.declare_failed(exc, leaving=run.ctx.ends_on_failure)
        if stop is not None:
            stop.stopped(exc)
        raise
    finally:
        if bar is not None:
            bar.close()
        if not ended:
            run.strategy.close(verify=False)  # a failed run: a peer may never arrive


def _train_step(run: Run, step: int) -> None:
    """One step, in the order every strategy and callback relies on."""
    ctx, cfg, model, strategy, callbacks = run.ctx, run.cfg, run.model, run.strategy, run.callbacks
    batch = rank_batch(run.ds, step, cfg.global_batch, ctx.rank, ctx.world_size).to(ctx.device)
    run.timer.start()
    strategy.begin_step(step)
    callbacks.before_forward(step, model)
    with torch.autocast(ctx.device.type, dtype=AMP_DTYPES.get(cfg.amp or ""),
                        enabled=cfg.amp is not None):
        logits = run.module(batch.tokens, batch.sample_ids, step)
        loss = F.cross_entropy(logits, batch.labels)
    callbacks.before_backward(step, model)
    loss.backward()
    callbacks.before_sync(step, model, strategy)
    applied = strategy.finish_step(step)
    callbacks.after_sync(step, model, strategy, applied)
    if applied and run.apply_updates:
        run.opt.step()
    run.opt.zero_grad(set_to_none=True)
    callbacks.after_step(step, model)
    _log_step(run, step, float(loss.detach()), applied)


def _log_step(run: Run, step: int, loss: float, applied: bool) -> None:
    log, model = run.log, run.model
    log.step_ms.append(run.timer.stop_ms())
    log.loss.append(loss)
    log.applied.append(applied)
    log.grad_norms.append(run.probe.norms())
    log.missing_grads.append(run.probe.missing())
    log.realized_sparsity.append(model.realized_sparsity())
    log.mask_entropy.append(model.sparse_mask_entropy())
    log.sync.append(run.callbacks.on_step_metrics(step, run.strategy.step_metrics(), applied,
                                                  run.strategy.events))


def _finish(run: Run, memory_scope: str, t_start: float) -> TrainResult:
    """Gather every rank's log (one collective, after the last step); rank 0 writes the record."""
    ctx, log = run.ctx, run.log
    log.peak_memory_mb = peak_memory_mb(ctx.device, memory_scope)
    log.peak_memory_scope = memory_scope
    log.param_digest = params_digest(run.model.named_parameters())
    logs: list[RankLog] = [log]
    if ctx.world_size > 1:  # a one-rank context (e.g. a reference run inside rank 0) never talks
        logs = [None] * ctx.world_size  # type: ignore[list-item]
        dist.all_gather_object(logs, log)
    events = [e.to_json() for e in run.strategy.events]
    if not ctx.is_main:
        return TrainResult(run.model, None)
    record = _record(ctx, run.cfg, logs, run.val_curve, events, run.strategy.summary(),
                     wall_s=time.perf_counter() - t_start)
    if run.cfg.out:
        write_json_atomic(run.cfg.out, record)
    return TrainResult(run.model, record)


def _progress(ctx: RankContext, cfg: TrainConfig):
    """Rank 0's bar. It shows rank 0's own loss, labelled so (the summary table's is the mean
    over ranks, which would cost a collective per step here)."""
    if not (cfg.progress and ctx.is_main):
        return None
    return progress_bar(total=cfg.steps, desc=f"{cfg.sync.name} ×{ctx.world_size}",
                        unit="step", leave=False, mininterval=0.5)


def _record_head(ctx: RankContext, cfg: TrainConfig) -> dict:
    return {
        "config": cfg.to_json(),
        "environment": environment(ctx.backend, ctx.world_size),
    }


def _record(ctx: RankContext, cfg: TrainConfig, logs: list[RankLog],
            val_curve: list[tuple[int, float]], events: list[dict], sync_summary: dict,
            wall_s: float) -> dict:
    steps = []
    for i in range(len(logs[0].loss)):
        per_rank_ms = [lg.step_ms[i] for lg in logs]
        steps.append({
            "step": i,
            "loss": sum(lg.loss[i] for lg in logs) / len(logs),  # equal shards: the global mean
            "step_ms": max(per_rank_ms),
            "rank_step_ms": per_rank_ms,
            "rank_loss": [lg.loss[i] for lg in logs],
            "applied": all(lg.applied[i] for lg in logs),
            "realized_sparsity": logs[0].realized_sparsity[i],
            "mask_entropy_bits": logs[0].mask_entropy[i],
            "missing_grads": [len(lg.missing_grads[i]) for lg in logs],
            "grad_presence_agrees": len({tuple(lg.missing_grads[i]) for lg in logs}) == 1,
            "grad_norms": {n: [lg.grad_norms[i].get(n) for lg in logs]
                           for n in logs[0].grad_norms[i]},
            "sync": logs[0].sync[i],
        })
    digests = [lg.param_digest for lg in logs]
    step_ms = [s["step_ms"] for s in steps]
    timed = step_ms[min(len(step_ms) - 1, 2):]  # the first steps warm up allocators and DDP
    record = _record_head(ctx, cfg)
    record.update({
        "steps": steps,
        "validation": [{"step": s, "loss": v} for s, v in val_curve],
        "summary": {
            "final_loss": steps[-1]["loss"],
            "first_loss": steps[0]["loss"],
            "final_val_loss": val_curve[-1][1],
            "param_digest": digests[0],
            "replicas_equal": len(set(digests)) == 1,
            "median_step_ms": statistics.median(timed),
            "step_ms_cv": (statistics.pstdev(timed) / statistics.mean(timed)) if len(timed) > 1
            else 0.0,
            "peak_memory_mb": [lg.peak_memory_mb for lg in logs],
            "peak_memory_scope": ("run" if all(lg.peak_memory_scope == "run" for lg in logs)
                                  else "process"),
            "skipped_steps": sum(not s["applied"] for s in steps),
            "wall_s": wall_s,
            "sync": sync_summary,
        },
        "events": events,
    })
    return record


def run_training(cfg: TrainConfig, metrics: RankCallbacks = no_metrics) -> dict | None:
    """Validate, launch ``cfg.world_size`` ranks (or join torchrun's), return rank 0's record;
    ``metrics``: the sink of ``cfg.metrics`` on each rank (``train_rank``)."""
    cfg.validate()
    results = launch(train_rank, cfg.launch_config(), cfg, (), metrics)
    return results[0]
