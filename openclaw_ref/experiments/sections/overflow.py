"""Section ``overflow``: FP16 overflow on high-dynamic-range gradients (the seed's F3) at every
size, stock fp16 hook vs the seed's uniform 2^12 vs the agreed ``auto`` scale; overflow vs the
scale exponent; and the rank-dependent pre-scale (M4) on real DDP buckets, measured by
``probes.ScaleMismatchProbe``."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from openclaw_ref.arms.config import ArmConfig
from openclaw_ref.conformance.checks import check_overflow_rate
from openclaw_ref.conformance.settings import ConformSettings
from openclaw_ref.core.callbacks import Callback
from openclaw_ref.core.collectives import gather
from openclaw_ref.core.config import TRAIN_PRESETS
from openclaw_ref.core.launch import RankContext
from openclaw_ref.core.pools import PoolCache
from openclaw_ref.core.train import TrainConfig, train_model
from openclaw_ref.experiments.probes import ScaleMismatchProbe, mismatch_counts

if TYPE_CHECKING:
    from openclaw_ref.experiments.settings import CompareConfig, Progress

OVERFLOW_WORKLOADS = {"real": 0.0, "harsh": 2.0}  # extra spread: each element × 10^U(-d, d)
SCALE_EXPONENTS = (4, 8, 12, 16)


def overflow_sizes(cfg: CompareConfig) -> list[int]:
    """World sizes of the FP16 counts (F3, M4): the comparison's multi-rank sizes plus the
    extra ones (8 by default: the seed's FP16 sum is over 8 ranks)."""
    return sorted({w for w in cfg.world_sizes if w >= 2} | set(cfg.overflow_extra_sizes))


def jobs(cfg: CompareConfig) -> int:
    return len(overflow_sizes(cfg)) * 7 + len(SCALE_EXPONENTS)


def scale_mismatch_rank(ctx: RankContext, tcfg: TrainConfig,
                        spreads: dict[str, float]) -> dict[str, dict]:
    """The seed's M4 on the real training loop (weights fixed): stock DDP buckets, the last
    rank pre-scaling by 2^10 and the others by 2^12 (the seed's pair). Every rank returns the
    same counts per workload (per-rank flags are gathered; an allreduce is corrupted if any
    rank's average is off)."""
    from openclaw_ref.arms.ddp import wrap_ddp

    w = ctx.world_size
    exponents = [12] * (w - 1) + [10]
    probe = ScaleMismatchProbe(ctx.rank, w, exponents, tcfg.seed, spreads)

    class ProbedDDP(Callback):
        def wrap(self, model, ctx_, strategy):
            ddp = wrap_ddp(model, ctx_, tcfg.sync)
            ddp.register_comm_hook(None, probe)
            return ddp

    train_model(ctx, tcfg, (ProbedDDP(),), apply_updates=False)
    per_rank = gather(ctx, probe.rows)
    return {k: {"exponents": exponents, "steps": tcfg.steps,
                **mismatch_counts([rows[k] for rows in per_rank])} for k in spreads}


def _steps(cfg: CompareConfig):
    """The conformance run's train section at the comparison's overflow step count."""
    return dataclasses.replace(TRAIN_PRESETS["conformance"], steps=cfg.overflow_steps)


def _rates(cfg: CompareConfig, sizes: list[int], pools: PoolCache,
           progress: Progress) -> list[dict]:
    # text 000's F3 (one 2^12 on every rank) and our auto scale: the per-bucket guard's wire
    variants = {"ddp-fp16": ArmConfig(name="ddp-fp16"),
                "hardened-fp16": ArmConfig.of("hardened", wire="fp16", scale="4096",
                                              guard="bucket"),
                "hardened-fp16-auto": ArmConfig.of("hardened", wire="fp16", scale="auto",
                                                   guard="bucket")}
    rates = []
    for w in sizes:
        for workload, spread in OVERFLOW_WORKLOADS.items():
            for label, sync in variants.items():
                s = ConformSettings(sync=sync, hdr_spread_decades=spread, train=_steps(cfg))
                fig = pools.get(w).run(check_overflow_rate, s, None)[0].figures
                rates.append({"strategy": label, "workload": workload, "world_size": w, **fig})
                progress.tick(f"overflow {label} {workload} ×{w}")
    return rates


def _vs_scale(cfg: CompareConfig, w0: int, pools: PoolCache, progress: Progress) -> list[dict]:
    vs_scale = []
    for exp in SCALE_EXPONENTS:
        s = ConformSettings(sync=ArmConfig.of("hardened", wire="fp16", scale=str(2 ** exp),
                                              guard="bucket"),
                            hdr_spread_decades=OVERFLOW_WORKLOADS["harsh"],
                            train=_steps(cfg))
        fig = pools.get(w0).run(check_overflow_rate, s, None)[0].figures
        vs_scale.append({"strategy": "hardened fp16 (harsh workload)", "scale_exp": exp,
                         "world_size": w0, "overflow_rate": fig["overflow_rate"]})
        progress.tick(f"overflow scale 2^{exp}")
    return vs_scale


def _mismatch(cfg: CompareConfig, sizes: list[int], pools: PoolCache,
              progress: Progress) -> list[dict]:
    mismatch = []
    for w in sizes:
        tcfg = TrainConfig(preset=cfg.preset, world_size=w, steps=cfg.mismatch_steps,
                           global_batch=w * -(-cfg.global_batch // w), seed=cfg.seed,
                           eval_every=0, progress=False, backend=cfg.backend,
                           sync=ArmConfig(name="ddp", bucket_cap_mb=cfg.bucket_cap_mb))
        rows = pools.get(w).run(scale_mismatch_rank, tcfg, OVERFLOW_WORKLOADS)[0]
        mismatch += [{"world_size": w, "workload": k, **v} for k, v in rows.items()]
        progress.tick(f"scale mismatch ×{w}")
    return mismatch


def run(cfg: CompareConfig, pools: PoolCache, progress: Progress) -> dict:
    """Overflow rates at every size, overflow vs the scale exponent (at the smallest size),
    and the rank-dependent pre-scale (M4) at every size."""
    sizes = overflow_sizes(cfg)
    rates = _rates(cfg, sizes, pools, progress)
    vs_scale = _vs_scale(cfg, sizes[0], pools, progress)
    mismatch = _mismatch(cfg, sizes, pools, progress)
    return {"rates": rates, "vs_scale": vs_scale, "scale_mismatch": mismatch}
