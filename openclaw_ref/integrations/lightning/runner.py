"""``python -m openclaw_ref.integrations.lightning``: train openclaw under Lightning with one of
our sync strategies and write a JSON result.

``seed_everything(seed, workers=True)`` runs first, as seed 004 advises. Lightning's launcher
re-executes the script for every rank, so tests launch it as a subprocess. Exit codes as
everywhere: 0 ok, 2 bad input, 3 a check fired, 4 timeout.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import lightning as L
import torch

from openclaw_ref.arms.config import ArmConfig
from openclaw_ref.core.config import TRAIN_PRESETS, MetricsConfig, ModelSection, TrainSection
from openclaw_ref.core.data import DataConfig
from openclaw_ref.core.faults import FaultSpec, parse_fault
from openclaw_ref.integrations.lightning.data import SkillDataModule
from openclaw_ref.integrations.lightning.module import OpenClawModule
from openclaw_ref.integrations.lightning.strategy import SyncDDPStrategy
from openclaw_ref.sync.errors import BadInput, ConsistencyError, OpenClawError, SyncTimeout


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
    """A Lightning run. ``train`` gives Lightning's ``max_steps`` (``steps``), the global batch
    (split evenly over ``devices``) and the learning rate; the optimizer is AdamW and mixed
    precision is ``precision`` (Lightning's own setting)."""

    model: ModelSection = field(default_factory=ModelSection)
    train: TrainSection = TRAIN_PRESETS["lightning"]
    devices: int = 2
    precision: str = "bf16-mixed"
    balance: bool = False
    data: DataConfig = field(default_factory=DataConfig)
    sync: ArmConfig = field(default_factory=lambda: ArmConfig(name="hardened"))
    faults: tuple[FaultSpec, ...] = ()
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    out: str | None = None

    @property
    def batch_size(self) -> int:
        """Per rank (Lightning's convention)."""
        if self.train.global_batch % self.devices:
            raise BadInput(f"global batch {self.train.global_batch} is not a multiple of "
                           f"{self.devices} devices")
        return self.train.global_batch // self.devices


def all_on_gpus(devices: int) -> bool:
    """Whether ``devices`` ranks train on GPUs (one each); otherwise all of them on the CPU."""
    return torch.cuda.is_available() and torch.cuda.device_count() >= devices


def run_lightning(cfg: LightningRunConfig) -> dict:
    """Train with ``Trainer(accelerator="cpu" or "gpu", devices=…, strategy=SyncDDPStrategy)``;
    returns this rank's result. Call from a script: Lightning re-executes it for every rank."""
    L.seed_everything(cfg.model.seed, workers=True)  # seed 004: before any process starts
    on_gpu = all_on_gpus(cfg.devices)
    if not on_gpu:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // cfg.devices))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    model_cfg = cfg.model.model_config()
    module = OpenClawModule(model_cfg, cfg.train.lr)
    data = SkillDataModule(model_cfg, cfg.data, cfg.batch_size, cfg.balance, cfg.model.seed)
    strategy = SyncDDPStrategy(cfg.sync, cfg.faults, cfg.metrics,
                               process_group_backend="nccl" if on_gpu else "gloo")
    clock = StepClock()
    trainer = L.Trainer(
        accelerator="gpu" if on_gpu else "cpu", devices=cfg.devices, strategy=strategy,
        precision=cfg.precision, max_steps=cfg.train.steps, callbacks=[clock], logger=False,
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
        "metrics_port": strategy.metrics_port,
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
    p.add_argument("--canary-every", type=int, default=0, metavar="K",
                   help="hardened: the compute canary every K steps (0: off)")
    p.add_argument("--imbalance", type=float, default=1.0)
    p.add_argument("--balance", action="store_true", help="WeightedRandomSampler over labels")
    p.add_argument("--inject", action="append", default=[], metavar="NAME[=VALUE][@RANK][:STEP]")
    p.add_argument("--metrics-port", type=int, default=None, metavar="PORT",
                   help="Prometheus exporter on 127.0.0.1:PORT+rank (0: a free port, logged)")
    p.add_argument("--skew-barrier-ms", type=float, default=None, metavar="MS",
                   help="seed P2 barrier threshold (off by default)")
    p.add_argument("--out", default=None, help="rank 0 writes its result JSON here")
    a = p.parse_args(argv)
    train = dataclasses.replace(TRAIN_PRESETS["lightning"], steps=a.max_steps,
                                global_batch=a.batch_size * a.devices)
    cfg = LightningRunConfig(
        model=ModelSection(a.preset, a.seed), train=train, devices=a.devices,
        precision=a.precision, balance=a.balance,
        data=DataConfig(imbalance=a.imbalance), sync=ArmConfig.of(a.sync, wire=a.wire,
                                                           canary_every=a.canary_every),
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
