"""Section ``precision``: seed 004's matrix — 1 rank fp32, 1 rank AMP, N ranks DDP+AMP (bf16
autocast on CPU) — repeated with the case order rotated, kept per repeat so the ledger's
bootstrap can pair them; peak memory per run (see ``peak_memory_scope``)."""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING

from openclaw_ref.core.launch import resolve_backend
from openclaw_ref.core.pools import PoolCache
from openclaw_ref.experiments.runs import rotated

if TYPE_CHECKING:
    from openclaw_ref.experiments.settings import CompareConfig, Progress


def jobs(cfg: CompareConfig) -> int:
    return 4 * cfg.repeats


def _row(precision: str, w: int, reps: list[dict]) -> dict:
    """One configuration: the first repeat's fields, medians and per-repeat lists."""
    r = reps[0]
    label = (f"{w} rank{'s' if w > 1 else ''} {'DDP+' if w > 1 else ''}"
             f"{'AMP (' + r['amp_dtype'] + ')' if r['amp_dtype'] else 'fp32'}")
    peaks = [x["peak_memory_mb"] for x in reps]
    return {**{k: v for k, v in r.items() if k != "peak_memory_mb_per_rank"},
            "label": label, "world_size": w,
            "s_per_iter": statistics.median(x["s_per_iter"] for x in reps),
            "s_per_iter_repeats": [x["s_per_iter"] for x in reps],
            "peak_memory_mb": statistics.median(peaks), "peak_mib": max(peaks),
            "peak_memory_mb_repeats": peaks,
            "peak_memory_scope": "run" if all(x["peak_memory_scope"] == "run"
                                              for x in reps) else "process"}


def run(cfg: CompareConfig, pools: PoolCache, progress: Progress) -> dict:
    """``cfg.repeats`` interleaved repeats of the four cases at 1 and the largest size."""
    from openclaw_ref.bench.jobs import run_seed004_case
    from openclaw_ref.bench.settings import BenchSettings

    n = max(cfg.world_sizes)
    settings = BenchSettings(preset=cfg.preset, steps=max(12, cfg.steps // 2),
                             global_batch=cfg.global_batch, seed=cfg.seed, max_world=n, rounds=1)
    cases = [("fp32", 1), ("amp", 1), ("fp32", n), ("amp", n)]
    runs: dict[tuple[str, int], list[dict]] = {c: [] for c in cases}
    for repeat in range(cfg.repeats):
        for precision, w in rotated(cases, repeat):
            r = run_seed004_case(precision, w, resolve_backend(cfg.backend, w), settings,
                                 pool=pools.get(w))
            runs[(precision, w)].append(r)
            progress.tick(f"precision {precision} ×{w} r{repeat}")
    rows = [_row(precision, w, reps) for (precision, w), reps in runs.items()]
    return {"rows_data": rows}
