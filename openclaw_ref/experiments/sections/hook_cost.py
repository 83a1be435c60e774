"""Section ``hook_cost``: each hook's per-step cost beside stock DDP and
PyTorch's Python hooks, arms interleaved in one 2-rank job per model
(``experiments.hook_cost``), the memory each hook holds, and the cost of verifying a step's
control blocks at 8 to 8,192 ranks, per-rank and counted (``experiments.verify_scale``)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from openclaw_ref.core.pools import PoolCache
from openclaw_ref.experiments import hook_cost, verify_scale

if TYPE_CHECKING:
    from openclaw_ref.experiments.settings import CompareConfig, Progress

# a plain 8-bucket MLP, the openclaw tiny preset at 15 buckets and the small one (5.4 M
# parameters, ~22 buckets), whose ~0.4 s steps on 2 CPU cores get fewer timed steps
MODELS = ("mlp", "tiny", "small")
MAX_STEPS = {"small": 40}
WORLD_SIZE = 2
# ``compare --quick``: the MLP (the model the speed target is read on), one steady-state step
# per memory arm, and the verification timings at the smallest and a large size
QUICK_MODELS = ("mlp",)
QUICK_MEMORY_STEPS = 1
QUICK_VERIFY_SIZES = (8, 1024)
QUICK_COUNT_BUCKETS = (16, 128)


def models_of(cfg: CompareConfig) -> tuple[str, ...]:
    return QUICK_MODELS if cfg.quick else MODELS


def jobs(cfg: CompareConfig) -> int:
    return len(models_of(cfg)) + 2


def run(cfg: CompareConfig, pools: PoolCache, progress: Progress) -> dict:
    """One interleaved job per model, the memory job, the verification timings."""
    out: dict[str, Any] = {"jobs": {}}
    for model in models_of(cfg):
        steps = min(cfg.hook_steps, MAX_STEPS.get(model, cfg.hook_steps))
        hcfg = hook_cost.HookCostConfig(model=model, world_size=WORLD_SIZE, steps=steps,
                                        seed=cfg.seed)
        raw = pools.get(WORLD_SIZE).run(hook_cost.hook_cost_rank, hcfg)[0]
        summary = hook_cost.summarize(raw)
        out["jobs"][model] = {"config": dataclasses.asdict(hcfg), "summary": summary,
                              "pairs": hook_cost.pair_ratios(raw),
                              "baseline": hook_cost.BASELINE, "hardened_events": raw["events"]}
        progress.tick(f"hook cost {model}")
    quick = cfg.quick
    out["memory"] = hook_cost.run_memory(WORLD_SIZE, QUICK_MEMORY_STEPS if quick else 3)
    progress.tick("hook memory")
    out["verify"] = (verify_scale.measure(QUICK_VERIFY_SIZES) if quick
                     else verify_scale.measure())
    out["verify_counts"] = (verify_scale.measure_counts(QUICK_VERIFY_SIZES, QUICK_COUNT_BUCKETS)
                            if quick else verify_scale.measure_counts())
    progress.tick("verification at scale")
    return out
