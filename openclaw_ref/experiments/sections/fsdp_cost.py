"""Section ``fsdp_cost``: what ``harden()`` costs an FSDP2 job per step — stock ``fully_shard``
and ``harden(fully_shard(model))`` interleaved step by step in one 2-rank job on the MLP
(``experiments.fsdp_cost``), with the correctness of the same job beside it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from openclaw_ref.core.pools import PoolCache
from openclaw_ref.experiments import fsdp_cost

if TYPE_CHECKING:
    from openclaw_ref.experiments.settings import CompareConfig, Progress

# the MLP of the hook-cost section (the openclaw presets cannot run under stock FSDP2: see
# ``experiments.fsdp_cost``), on 2 ranks — the published size; ``compare --quick`` runs the
# same job at its own ``hook_steps``
MODELS = fsdp_cost.MODELS
WORLD_SIZE = 2


def jobs(cfg: CompareConfig) -> int:
    return len(MODELS)


def run(cfg: CompareConfig, pools: PoolCache, progress: Progress) -> dict:
    """One interleaved job per model, ``cfg.hook_steps`` timed steps per arm."""
    out: dict[str, Any] = {"jobs": {}}
    for model in MODELS:
        fcfg = fsdp_cost.FSDPCostConfig(model=model, world_size=WORLD_SIZE,
                                        steps=cfg.hook_steps, seed=cfg.seed)
        raw = pools.get(WORLD_SIZE).run(fsdp_cost.fsdp_cost_rank, fcfg)[0]
        out["jobs"][model] = fsdp_cost.job_figures(fcfg, raw)
        progress.tick(f"FSDP2 cost {model}")
    return out
