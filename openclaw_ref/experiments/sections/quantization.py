"""Section ``quantization``: seed 004's L4 deployment step — int8 quantization of a model
trained in one process without sync, accuracy and latency on the validation split."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from openclaw_ref.arms.config import ArmConfig
from openclaw_ref.core.errors import RankFailed
from openclaw_ref.core.launch import RankContext
from openclaw_ref.core.pools import PoolCache
from openclaw_ref.core.train import TrainConfig, train_model

if TYPE_CHECKING:
    from openclaw_ref.experiments.settings import CompareConfig, Progress



def jobs(cfg: CompareConfig) -> int:
    return 1


QUICK_LATENCY_REPEATS = 5  # ``compare --quick`` (the full run: quantize.measure's 20)


def quantize_rank(ctx: RankContext, tcfg: TrainConfig, repeats: int = 20) -> dict | None:
    """Train one process without sync, then quantize the trained replica to int8 and measure
    accuracy and latency on the validation split at the evaluation sparsity."""
    from openclaw_ref.core.data import SkillDataset
    from openclaw_ref.core.model import EVAL_STEP
    from openclaw_ref.experiments.quantize import measure

    result = train_model(ctx, tcfg)
    if not ctx.is_main:
        return None
    model_cfg = tcfg.model_config()
    ds = SkillDataset(model_cfg, dataclasses.replace(tcfg.data, seed=tcfg.seed))
    out = measure(result.model, ds.validation(), EVAL_STEP, repeats)
    out["trained_steps"] = tcfg.steps
    out["train_final_loss"] = result.record["summary"]["final_loss"]
    return out


def run(cfg: CompareConfig, pools: PoolCache, progress: Progress) -> dict:
    """``curve_steps`` of training, then ``quantize.measure`` (or the error that stopped it)."""
    tcfg = TrainConfig(preset=cfg.preset, world_size=1, steps=cfg.curve_steps,
                       global_batch=cfg.global_batch, seed=cfg.seed, eval_every=0,
                       progress=False, backend=cfg.backend, sync=ArmConfig(name="local"))
    try:
        repeats = QUICK_LATENCY_REPEATS if cfg.quick else 20
        sec = pools.get(1).run(quantize_rank, tcfg, repeats)[0]
    except RankFailed as exc:
        sec = {"error": exc.summary[:300]}
    progress.tick("int8 quantization")
    return sec
