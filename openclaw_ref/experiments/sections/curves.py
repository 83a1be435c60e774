"""Section ``curves``: long runs with frequent validation, stock ddp vs hardened fp32 — does
the seed's C1 spike pattern appear? Each curve keeps the schedule figures (``slim_run``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from openclaw_ref.arms.config import ArmConfig
from openclaw_ref.arms.registry import STRATEGIES
from openclaw_ref.core.pools import PoolCache
from openclaw_ref.core.train import TrainConfig
from openclaw_ref.experiments.runs import run_and_return_params, slim_run

if TYPE_CHECKING:
    from openclaw_ref.experiments.settings import CompareConfig, Progress



def jobs(cfg: CompareConfig) -> int:
    return 2


def run(cfg: CompareConfig, pools: PoolCache, progress: Progress) -> dict:
    """One curve per strategy at ``curve_world_size`` (else the largest size)."""
    w = cfg.curve_world_size if cfg.curve_world_size in cfg.world_sizes else max(cfg.world_sizes)
    out = {}
    for label, sync in (("ddp", ArmConfig(name="ddp")),
                        ("hardened fp32", ArmConfig(name="hardened",
                                                    bucket_cap_mb=cfg.bucket_cap_mb))):
        if sync.name not in STRATEGIES:
            progress.tick(f"curve {label} (not available)")
            continue
        tcfg = TrainConfig(preset=cfg.preset, world_size=w, steps=cfg.curve_steps,
                           global_batch=cfg.global_batch, seed=cfg.seed, eval_every=2,
                           progress=False, sync=sync, backend=cfg.backend)
        record = pools.get(w).run(run_and_return_params, tcfg)[0]["record"]
        out[label] = {"world_size": w, **slim_run(record, schedule=True)}
        progress.tick(f"curve {label}")
    return out
