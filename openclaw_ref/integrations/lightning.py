"""The openclaw model under PyTorch Lightning (seed 004), synchronized by our own strategies.

Pieces, each usable alone (optional extra ``lightning``):
  * ``OpenClawModule``  — LightningModule around ``build_model``; the logical step passed to the
    model is Lightning's ``global_step``, so sparsity follows the same seeded schedule as
    ``openclaw-bench train``. Fault injectors (``openclaw_ref.core.faults``) hook in where the plain
    loop calls them.
  * ``SkillDataModule`` — the synthetic skill task with *dynamic padding* (``pad_collate``: each
    batch is padded to its own longest sample, token 0 = padding, which the model masks) and an
    optional ``WeightedRandomSampler`` that balances imbalanced skill labels (seed 004, L4).
  * ``SyncDDPStrategy`` — a Lightning ``DDPStrategy`` whose DDP wrapper comes from our strategy
    registry (``hardened`` by default, i.e. ``harden()`` applied). Why a subclass: Lightning's
    own ``DDPStrategy`` registers a comm hook only when the device is CUDA and silently does
    nothing on CPU/gloo; here the hook is installed by ``SyncStrategy.wrap`` on every device.
    Per step it calls ``begin_step`` before the forward and ``finish_step`` after the backward;
    a False from ``finish_step`` (every rank skips together, e.g. an FP16 overflow) clears the
    gradients so the optimizer step that Lightning still runs changes nothing.
  * ``python -m openclaw_ref.integrations.lightning`` — a small runner (``seed_everything(seed,
    workers=True)`` first, as seed 004 advises) that writes a JSON result; tests launch it as a
    subprocess because Lightning's launcher re-executes the script for every rank.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset, WeightedRandomSampler

try:
    import lightning as L
    from lightning.pytorch.strategies import DDPStrategy
except ImportError as exc:  # pragma: no cover - only without the extra
    raise ImportError("openclaw_ref.integrations.lightning needs the lightning extra: "
                      "pip install 'openclaw-sync[lightning]'") from exc

from openclaw_ref.core.data import PAD, DataConfig, SkillDataset
from openclaw_ref.core.faults import FaultInjector, FaultSpec, parse_fault
from openclaw_ref.core.launch import RankContext
from openclaw_ref.core.model import EVAL_STEP, OpenClawConfig, build_model, preset
from openclaw_ref.ops.prometheus import MetricsConfig, StepObservers
from openclaw_ref.sync import make_strategy
from openclaw_ref.sync.base import SyncConfig, SyncStrategy
from openclaw_ref.sync.errors import BadInput, ConsistencyError, OpenClawError, SyncTimeout

# ---------------------------------------------------------------------------------------------
# Data: dynamic padding and class balancing


class SkillSamples(Dataset):
    """Samples of a ``SkillDataset`` split *without* their trailing padding: (tokens_T, label, id).

    The generator pads every sample at its end only (token 0 never occurs inside a sample), so
    cutting at the recorded length loses nothing."""

    def __init__(self, ds: SkillDataset, ids: torch.Tensor) -> None:
        self.ds, self.ids = ds, ids

    def __len__(self) -> int:
        return int(self.ids.numel())

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int, int]:
        idx = int(self.ids[i])
        return self.ds.tokens[idx, : int(self.ds.lengths[idx])], int(self.ds.labels[idx]), idx

    def labels(self) -> torch.Tensor:
        return self.ds.labels[self.ids]


def pad_collate(samples: Sequence[tuple[torch.Tensor, int, int]]) -> dict[str, torch.Tensor]:
    """Dynamic padding: stack samples padded with ``PAD`` to the longest one *in this batch*.

    Invariant: the model masks ``PAD`` and positions are absolute, so logits are identical to
    those of the same samples padded to the full ``seq_len`` — only the wasted compute differs."""
    longest = max(int(t.numel()) for t, _, _ in samples)
    tokens_BT = torch.full((len(samples), longest), PAD, dtype=torch.int64)
    for row, (t, _, _) in enumerate(samples):
        tokens_BT[row, : t.numel()] = t
    return {"tokens": tokens_BT,
            "labels": torch.tensor([lab for _, lab, _ in samples], dtype=torch.int64),
            "sample_ids": torch.tensor([i for _, _, i in samples], dtype=torch.int64)}


def balancing_weights(labels: torch.Tensor, n_classes: int) -> torch.Tensor:
    """Per-sample weight 1 / (count of its label): every label is drawn equally often in
    expectation. Labels absent from the split get no weight (there is nothing to draw)."""
    counts = torch.bincount(labels, minlength=n_classes).to(torch.float64)
    return (1.0 / counts.clamp_min(1.0))[labels]


class SkillDataModule(L.LightningDataModule):
    """The synthetic skill task (``openclaw_ref.core.data``) for Lightning, padded per batch.

    ``batch_size`` is per rank (Lightning's convention). ``balance=True`` draws training samples
    through a seeded ``WeightedRandomSampler`` (with replacement) that evens out the skill
    labels; Lightning shards it across ranks with its distributed sampler wrapper."""

    def __init__(self, model_cfg: OpenClawConfig, data_cfg: DataConfig = DataConfig(),
                 batch_size: int = 16, balance: bool = False, seed: int = 1) -> None:
        super().__init__()
        if batch_size < 1:
            raise BadInput(f"batch size must be >= 1; got {batch_size}")
        self.model_cfg, self.data_cfg = model_cfg, dataclasses.replace(data_cfg, seed=seed)
        self.batch_size, self.balance, self.seed = batch_size, balance, seed
        self.ds: SkillDataset | None = None

    def setup(self, stage: str | None = None) -> None:
        if self.ds is None:
            self.ds = SkillDataset(self.model_cfg, self.data_cfg)

    def train_samples(self) -> SkillSamples:
        self.setup()
        assert self.ds is not None
        return SkillSamples(self.ds, torch.arange(self.data_cfg.n_train))

    def val_samples(self) -> SkillSamples:
        self.setup()
        assert self.ds is not None
        n = self.data_cfg.n_train
        return SkillSamples(self.ds, torch.arange(n, n + self.data_cfg.n_val))

    def sampler(self, samples: SkillSamples) -> WeightedRandomSampler | None:
        if not self.balance:
            return None
        weights = balancing_weights(samples.labels(), self.model_cfg.n_skills)
        return WeightedRandomSampler(weights, num_samples=len(samples), replacement=True,
                                     generator=torch.Generator().manual_seed(self.seed))

    def train_dataloader(self) -> DataLoader:
        samples = self.train_samples()
        sampler = self.sampler(samples)
        return DataLoader(samples, batch_size=self.batch_size, sampler=sampler,
                          shuffle=sampler is None, drop_last=True, collate_fn=pad_collate,
                          generator=torch.Generator().manual_seed(self.seed))

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_samples(), batch_size=self.batch_size, shuffle=False,
                          collate_fn=pad_collate)


# ---------------------------------------------------------------------------------------------
# Model


class OpenClawModule(L.LightningModule):
    """The openclaw model as a LightningModule: cross-entropy on skill labels, AdamW."""

    def __init__(self, model_cfg: OpenClawConfig, lr: float = 3e-3,
                 faults: tuple[FaultSpec, ...] = ()) -> None:
        super().__init__()
        self.model_cfg, self.lr, self.fault_specs = model_cfg, lr, faults
        self.model = build_model(model_cfg)
        self.faults = FaultInjector((), 0, 1)  # replaced in setup(), once the rank is known

    def setup(self, stage: str) -> None:
        # Lightning calls this after the process group exists and before DDP wraps the model.
        self.faults = FaultInjector(self.fault_specs, self.global_rank, self.trainer.world_size)
        self.faults.on_model_built(self.model)

    def forward(self, tokens: torch.Tensor, sample_ids: torch.Tensor, step: int) -> torch.Tensor:
        return self.model(tokens, sample_ids, step)

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        step = self.global_step
        self.faults.before_forward(step, self.model)
        logits = self.model(batch["tokens"], batch["sample_ids"], step)
        loss = F.cross_entropy(logits.float(), batch["labels"])
        if self._trainer is not None:  # also usable as a plain module (tests, notebooks)
            self.log("train_loss", loss.detach(), prog_bar=False)
        return loss

    def on_before_backward(self, loss: torch.Tensor) -> None:
        self.faults.before_backward(self.global_step)

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.faults.after_step(self.global_step - 1, self.model)  # global_step already advanced

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        logits = self.model(batch["tokens"], batch["sample_ids"], EVAL_STEP)
        loss = F.cross_entropy(logits.float(), batch["labels"])
        self.log("val_loss", loss, sync_dist=True)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=self.lr, weight_decay=0.0)


# ---------------------------------------------------------------------------------------------
# Strategy


class SyncDDPStrategy(DDPStrategy):
    """Lightning DDP whose wrapper and comm hook come from ``openclaw_ref.sync`` (see module
    docstring). ``sync.name`` must be a DDP-based strategy (``hardened``, ``ddp``, ``ddp-fp16``).

    After ``fit``: ``step_metrics`` (one dict per step, this rank), ``sync_summary``,
    ``events`` and ``skipped_steps``."""

    strategy_name = "openclaw_sync_ddp"

    def __init__(self, sync: SyncConfig = SyncConfig(name="hardened"), **kwargs: Any) -> None:
        kwargs.setdefault("process_group_backend", None)
        kwargs.setdefault("timeout", datetime.timedelta(seconds=max(30.0, sync.watchdog_s * 2)))
        super().__init__(**kwargs)
        self.sync_cfg = sync
        self.sync: SyncStrategy | None = None
        self.step_metrics: list[dict] = []
        self.sync_summary: dict = {}
        self.events: list = []
        self.skipped_steps = 0
        self._step = 0

    def rank_context(self) -> RankContext:
        return RankContext(self.global_rank, self.world_size, self.local_rank, self.num_processes,
                           self._get_process_group_backend(), self.root_device,
                           dist.distributed_c10d._get_default_store())

    def _setup_model(self, model: nn.Module) -> nn.Module:
        cfg = self.sync_cfg
        faults = getattr(self.lightning_module, "faults", None)
        if isinstance(faults, FaultInjector):
            cfg = faults.sync_config(cfg)  # e.g. a rank-local FP16 pre-scale (scale-mismatch)
        # the user's DDP flags (find_unused_parameters, static_graph, gradient_as_bucket_view,
        # bucket_cap_mb, ...) win over the suite's defaults, as with Lightning's own DDPStrategy
        cfg = dataclasses.replace(cfg, ddp_options={**cfg.ddp_options, **self._ddp_kwargs})
        self.sync = make_strategy(cfg)
        wrapped = self.sync.wrap(model, self.rank_context())
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
        return super().training_step(*args, **kwargs)

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
        faults = getattr(module, "faults", None)
        if isinstance(faults, FaultInjector):
            faults.after_sync(step, module.model)
        self.step_metrics.append(dict(self.sync.step_metrics(), applied=applied))
        self.events = list(self.sync.events)

    def teardown(self) -> None:
        if self.sync is not None:
            self.sync_summary = self.sync.summary()
            self.events = list(self.sync.events)
            self.sync.close()
        super().teardown()


# ---------------------------------------------------------------------------------------------
# Runner


class StepObserversCallback(L.Callback):
    """Feeds ``openclaw_ref.ops.prometheus`` observers (per-rank exporter, P2 skew barrier) from a
    ``SyncDDPStrategy`` — the same hooks the plain training loop calls."""

    def __init__(self, metrics: MetricsConfig) -> None:
        self.metrics = metrics
        self.observers: StepObservers | None = None

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        strategy = trainer.strategy
        if not isinstance(strategy, SyncDDPStrategy):
            raise BadInput("StepObserversCallback needs SyncDDPStrategy")
        ctx = strategy.rank_context()
        self.observers = StepObservers.from_config(self.metrics, ctx.rank, ctx.world_size,
                                                   ctx.device, ctx.store)

    @property
    def port(self) -> int | None:
        exporter = self.observers.exporter if self.observers else None
        return exporter.port if exporter else None

    def on_before_backward(self, trainer: L.Trainer, pl_module: L.LightningModule,
                           loss: torch.Tensor) -> None:
        if self.observers is not None:
            self.observers.before_backward(trainer.global_step)

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        strategy = trainer.strategy
        if self.observers is None or not isinstance(strategy, SyncDDPStrategy) \
                or not strategy.step_metrics:
            return
        last = strategy.step_metrics[-1]
        strategy.step_metrics[-1] = self.observers.after_step(
            trainer.global_step - 1, last, bool(last.get("applied", True)), strategy.events)

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self.observers is not None:
            self.observers.close()


class StepClock(L.Callback):
    """Wall time per training batch on this rank (forward, backward, sync, optimizer)."""

    def __init__(self) -> None:
        self.step_ms: list[float] = []
        self._t0 = 0.0

    def on_train_batch_start(self, *args: Any) -> None:
        self._t0 = time.perf_counter()

    def on_train_batch_end(self, *args: Any) -> None:
        self.step_ms.append((time.perf_counter() - self._t0) * 1e3)


@dataclass(frozen=True)
class LightningRunConfig:
    preset: str = "tiny"
    devices: int = 2
    max_steps: int = 8
    batch_size: int = 8  # per rank
    seed: int = 1
    lr: float = 3e-3
    precision: str = "bf16-mixed"
    balance: bool = False
    data: DataConfig = field(default_factory=DataConfig)
    sync: SyncConfig = field(default_factory=lambda: SyncConfig(name="hardened"))
    faults: tuple[FaultSpec, ...] = ()
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    out: str | None = None


def run_lightning(cfg: LightningRunConfig) -> dict:
    """Train with ``Trainer(accelerator="cpu" or "gpu", devices=…, strategy=SyncDDPStrategy)``;
    returns this rank's result. Call from a script: Lightning re-executes it for every rank."""
    L.seed_everything(cfg.seed, workers=True)  # seed 004: before any process starts
    on_gpu = torch.cuda.is_available() and torch.cuda.device_count() >= cfg.devices
    if not on_gpu:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // cfg.devices))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    model_cfg = preset(cfg.preset, seed=cfg.seed)
    module = OpenClawModule(model_cfg, cfg.lr, cfg.faults)
    data = SkillDataModule(model_cfg, cfg.data, cfg.batch_size, cfg.balance, cfg.seed)
    strategy = SyncDDPStrategy(cfg.sync, process_group_backend="nccl" if on_gpu else "gloo")
    clock = StepClock()
    callbacks: list[L.Callback] = [clock]
    observers = StepObserversCallback(cfg.metrics) if cfg.metrics.enabled else None
    if observers is not None:
        callbacks.append(observers)
    trainer = L.Trainer(
        accelerator="gpu" if on_gpu else "cpu", devices=cfg.devices, strategy=strategy,
        precision=cfg.precision, max_steps=cfg.max_steps, callbacks=callbacks, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        limit_val_batches=0, num_sanity_val_steps=0, use_distributed_sampler=True)
    t0 = time.perf_counter()
    result: dict = {"rank": trainer.global_rank, "world_size": cfg.devices}
    try:
        trainer.fit(module, datamodule=data)
    except (ConsistencyError, SyncTimeout) as exc:
        result["error"] = {"kind": type(exc).__name__, **exc.event().to_json(),
                           "exit_code": exc.exit_code}
    wall_s = time.perf_counter() - t0
    timed = clock.step_ms[2:] or clock.step_ms
    checks_run = sum(int(m.get("checks_run", 0)) for m in strategy.step_metrics)
    checks_passed = sum(int(m.get("checks_passed", 0)) for m in strategy.step_metrics)
    result.update({
        "steps": trainer.global_step, "wall_s": wall_s,
        "median_step_ms": sorted(timed)[len(timed) // 2] if timed else None,
        "steps_per_s": 1e3 * len(timed) / sum(timed) if timed else None,
        "checks_run": checks_run, "checks_passed": checks_passed,
        "skipped_steps": strategy.skipped_steps,
        "events": [e.to_json() for e in strategy.events],
        "sync_summary": strategy.sync_summary, "step_metrics": strategy.step_metrics,
        "final_loss": float(trainer.callback_metrics["train_loss"])
        if "train_loss" in trainer.callback_metrics else None,
        "precision": cfg.precision, "accelerator": "gpu" if on_gpu else "cpu",
        "metrics_port": observers.port if observers is not None else None,
    })
    return result


def _parse(argv: Sequence[str] | None) -> tuple[LightningRunConfig, str | None]:
    p = argparse.ArgumentParser(prog="python -m openclaw_ref.integrations.lightning",
                                description="train openclaw under Lightning with a sync strategy")
    p.add_argument("--preset", default="tiny")
    p.add_argument("--devices", type=int, default=2)
    p.add_argument("--max-steps", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=8, help="per rank")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--precision", default="bf16-mixed")
    p.add_argument("--sync", default="hardened")
    p.add_argument("--wire", default="native")
    p.add_argument("--imbalance", type=float, default=1.0)
    p.add_argument("--balance", action="store_true", help="WeightedRandomSampler over labels")
    p.add_argument("--inject", action="append", default=[], metavar="NAME[=VALUE][@RANK][:STEP]")
    p.add_argument("--metrics-port", type=int, default=None, metavar="PORT",
                   help="Prometheus exporter on 127.0.0.1:PORT+rank (0: a free port, logged)")
    p.add_argument("--skew-barrier-ms", type=float, default=None, metavar="MS",
                   help="seed P2 barrier threshold (off by default)")
    p.add_argument("--out", default=None, help="rank 0 writes its result JSON here")
    a = p.parse_args(argv)
    cfg = LightningRunConfig(
        preset=a.preset, devices=a.devices, max_steps=a.max_steps, batch_size=a.batch_size,
        seed=a.seed, precision=a.precision, balance=a.balance,
        data=DataConfig(imbalance=a.imbalance), sync=SyncConfig(name=a.sync, wire=a.wire),
        faults=tuple(parse_fault(f) for f in a.inject), out=a.out,
        metrics=MetricsConfig(port=a.metrics_port, skew_barrier_ms=a.skew_barrier_ms))
    return cfg, a.out


def main(argv: Sequence[str] | None = None) -> int:
    """Exit codes as everywhere: 0 ok, 2 bad input, 3 a check fired, 4 timeout."""
    try:
        cfg, out = _parse(argv)
        result = run_lightning(cfg)
    except OpenClawError as exc:
        sys.stderr.write(f"openclaw-lightning: {exc}\n")
        return exc.exit_code
    if result["rank"] == 0 and out:
        from openclaw_ref.core.jsonio import write_json_atomic

        write_json_atomic(out, result)
    elif result["rank"] == 0:
        print(json.dumps({k: v for k, v in result.items() if k != "step_metrics"}, indent=1))
    if "error" in result:
        sys.stderr.write(f"openclaw-lightning: rank {result['rank']}: {result['error']}\n")
        sys.stderr.flush()
        os._exit(result["error"]["exit_code"])  # the group may be wedged: do not tear it down
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
