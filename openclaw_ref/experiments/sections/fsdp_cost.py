"""Section ``fsdp_cost``: what ``harden()`` costs an FSDP2 job per step — stock ``fully_shard``
and ``harden(fully_shard(model))`` interleaved step by step in one job on the MLP
(``experiments.fsdp_cost``), with the correctness of the same job beside it: the 1-D mesh at 2
and 4 ranks, and a (dp, tp) = (2, 2) mesh with a tensor-parallel plan at 4."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from openclaw_ref.core.pools import PoolCache
from openclaw_ref.experiments import fsdp_cost

if TYPE_CHECKING:
    from openclaw_ref.experiments.settings import CompareConfig, Progress

# the MLP of the hook-cost section (the openclaw presets cannot run under stock FSDP2: see
# ``experiments.fsdp_cost``)
MODELS = fsdp_cost.MODELS
# (world size, tp degree) per job: the 1-D mesh at 2 ranks (the published size), then at 4
# ranks the 1-D mesh beside the (dp, tp) = (2, 2) mesh, so the 2-D guard's ratio stands beside
# the 1-D one at the same world size; ``compare --quick`` runs the first only, at its own
# ``hook_steps``
MESHES = ((2, 1), (4, 1), (4, 2))


def meshes_of(cfg: CompareConfig) -> tuple[tuple[int, int], ...]:
    return MESHES[:1] if cfg.quick else MESHES


def jobs(cfg: CompareConfig) -> int:
    return len(MODELS) * len(meshes_of(cfg))


def run(cfg: CompareConfig, pools: PoolCache, progress: Progress) -> dict:
    """One interleaved job per model and mesh, ``cfg.hook_steps`` timed steps per arm."""
    out: dict[str, Any] = {"jobs": {}}
    for model in MODELS:
        for world_size, tp in meshes_of(cfg):
            fcfg = fsdp_cost.FSDPCostConfig(model=model, world_size=world_size, tp=tp,
                                            steps=cfg.hook_steps, seed=cfg.seed)
            out["jobs"][fsdp_cost.job_name(fcfg)] = fsdp_cost.measure(pools.get(world_size), fcfg)
            progress.tick(f"FSDP2 cost {fsdp_cost.job_name(fcfg)}")
    return out
