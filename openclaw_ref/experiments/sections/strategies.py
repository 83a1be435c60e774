"""Section ``strategies``: every sync strategy × world size, repeated and interleaved.

Each run keeps its slimmed record (``runs.slim_run``), its largest parameter difference from one
process trained without sync, and on the first repeat the exact per-step costs of its layout.
A strategy that fails is a result (its error, and the check that stopped it), not a crash.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from openclaw_ref.arms.config import ArmConfig
from openclaw_ref.arms.registry import STRATEGIES
from openclaw_ref.core.errors import RankFailed
from openclaw_ref.core.pools import PoolCache
from openclaw_ref.core.train import TrainConfig
from openclaw_ref.experiments.runs import rotated, run_and_return_params, slim_run
from openclaw_ref.sync.errors import ConsistencyError

if TYPE_CHECKING:
    from openclaw_ref.experiments.settings import CompareConfig, Progress


@dataclass(frozen=True)
class Variant:
    """One row label of the comparison: a strategy with its knobs."""

    label: str
    sync: ArmConfig

    @property
    def available(self) -> bool:
        return self.sync.name in STRATEGIES


def default_variants(bucket_cap_mb: float) -> tuple[Variant, ...]:
    def v(label: str, **kw: Any) -> Variant:
        return Variant(label, ArmConfig.of(bucket_cap_mb=bucket_cap_mb, **kw))

    return (
        v("local (no sync)", name="local"),
        v("ddp", name="ddp"),
        v("ddp-fp16", name="ddp-fp16"),
        v("hardened fp32", name="hardened", wire="fp32"),  # harden()'s defaults: the step guard
        v("hardened fp16", name="hardened", wire="fp16"),  # the step guard on DDP's fp16 wire
        v("hardened per-bucket fp32", name="hardened", wire="fp32", guard="bucket"),
        v("hardened per-bucket fp16 (2^12)", name="hardened", wire="fp16", scale="4096",
          guard="bucket"),  # text 000's F3: one uniform pre-scale
        v("hardened per-bucket bf16", name="hardened", wire="bf16", guard="bucket"),
        v("bucketed static", name="bucketed", planner="static"),
        v("bucketed norm-ema-agreed", name="bucketed", planner="norm-ema-agreed"),
        v("bucketed norm-ema (text 000's F2)", name="bucketed", planner="norm-ema"),
    )


# ``compare --quick``: stock DDP, harden()'s two guards, the bucketed engine as text 000's F2
# wrote it (which misaligns: a row that shows a stopped run), the floor
QUICK_VARIANTS = ("local (no sync)", "ddp", "hardened fp32", "hardened per-bucket fp32",
                  "bucketed norm-ema (text 000's F2)")


def variants_of(cfg: CompareConfig) -> tuple[Variant, ...]:
    """The rows the comparison runs: every default variant, or the quick subset."""
    variants = default_variants(cfg.bucket_cap_mb)
    return tuple(v for v in variants if v.label in QUICK_VARIANTS) if cfg.quick else variants


def jobs(cfg: CompareConfig, variants: tuple[Variant, ...]) -> int:
    return 1 + cfg.repeats * len(cfg.world_sizes) * len(variants)


def _max_abs_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max(float((a[n].float() - b[n].float()).abs().max()) for n in a)


def _costs(pools: PoolCache, tcfg: TrainConfig) -> dict | None:
    from openclaw_ref.bench.rank_tasks import cost_probe_rank

    if tcfg.sync.name == "local":
        return {"collectives": 0, "wire_bytes": 0, "host_syncs": 0}
    probe = pools.get(tcfg.world_size).run(cost_probe_rank, tcfg)[0]
    return None if not probe or "unavailable" in probe else probe


def _run_one(pools: PoolCache, tcfg: TrainConfig, reference: dict, row: dict) -> dict:
    try:
        out = pools.get(tcfg.world_size).run(run_and_return_params, tcfg)[0]
    except RankFailed as exc:  # a strategy that fails is a result, not a crash
        if isinstance(exc.cause, ConsistencyError):
            row["stopped_by"] = exc.cause.event().to_json()
        row["error"] = exc.summary
        return row
    row.update(slim_run(out["record"]))
    row["max_abs_diff_vs_reference"] = _max_abs_diff(out["params"], reference)
    if row["repeat"] == 0:
        row["costs"] = _costs(pools, tcfg)
    return row


def run(cfg: CompareConfig, pools: PoolCache, progress: Progress,
        variants: tuple[Variant, ...]) -> dict:
    """Every variant × world size, repeated and interleaved (variant order rotates per repeat)."""
    base = TrainConfig(preset=cfg.preset, steps=cfg.steps, global_batch=cfg.global_batch,
                       seed=cfg.seed, eval_every=0, progress=False, backend=cfg.backend)
    reference = pools.get(1).run(run_and_return_params,
                                 dataclasses.replace(base, world_size=1,
                                                     sync=ArmConfig(name="local")))[0]["params"]
    progress.tick("reference: 1 process")
    runs: list[dict] = []
    for repeat in range(cfg.repeats):
        for w in cfg.world_sizes:
            for variant in rotated(list(variants), repeat):
                if not variant.available:
                    progress.tick(f"{variant.label} (not available)")
                    continue
                tcfg = dataclasses.replace(base, world_size=w, sync=variant.sync)
                row = {"variant": variant.label, "sync": variant.sync.to_json(),
                       "world_size": w, "repeat": repeat}
                runs.append(_run_one(pools, tcfg, reference, row))
                progress.tick(f"{variant.label} ×{w} r{repeat}")
    return {"runs": runs, "reference": "1 process, no sync, same global batch and seed"}
