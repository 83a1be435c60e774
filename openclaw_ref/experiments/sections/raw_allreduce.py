"""Section ``raw_allreduce``: one flat allreduce of the model's gradient bytes (fp32 and fp16)
at every multi-rank size — the limit any sync strategy approaches."""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING

from openclaw_ref.core.pools import PoolCache

if TYPE_CHECKING:
    from openclaw_ref.experiments.settings import CompareConfig, Progress

ITERATIONS = 20


def jobs(cfg: CompareConfig) -> int:
    return len(cfg.world_sizes)


def run(cfg: CompareConfig, pools: PoolCache, progress: Progress) -> dict:
    """Median of ``ITERATIONS`` allreduces (slowest rank, after a barrier) per size and wire."""
    from openclaw_ref.bench.figures import algbw_gbps, busbw_gbps
    from openclaw_ref.bench.rank_tasks import raw_allreduce_rank
    from openclaw_ref.core.model import build_model, preset

    numel = sum(p.numel() for p in build_model(preset(cfg.preset, seed=cfg.seed)).parameters())
    rows = []
    for w in cfg.world_sizes:
        if w < 2:
            progress.tick("raw allreduce ×1 (nothing to reduce)")
            continue
        for wire, width in (("fp32", 4), ("fp16", 2)):
            times = pools.get(w).run(raw_allreduce_rank, numel, wire, ITERATIONS)[0]
            ms = statistics.median(times)
            alg = algbw_gbps(numel * width, ms / 1e3)
            rows.append({"world_size": w, "wire": wire, "bytes": numel * width, "median_ms": ms,
                         "algbw_gbps": alg, "busbw_gbps": busbw_gbps(alg, w)})
        progress.tick(f"raw allreduce ×{w}")
    return {"elements": numel, "iterations": ITERATIONS, "rows_data": rows}
