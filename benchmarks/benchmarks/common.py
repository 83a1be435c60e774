"""What every benchmark class shares: the settings, the parameter lists, and the job cache.

One (strategy, world size) job yields a dozen figures; asv runs each ``track_*`` of each
parameter combination in a fresh process. So every class inherits one ``setup_cache`` (one
cache key: asv runs it once per run and environment) whose only job is to hand out asv's
per-run directory; the first figure asked of a case runs its job and stores the figures there
as JSON, the others read them (``openclaw_ref.bench.cache.CaseCache``). asv deletes the
directory when the run ends, so no figure outlives the run that measured it.

Knobs are environment variables read at import (asv's parameters are fixed at discovery):
``OPENCLAW_BENCH_MAX_WORLD`` (default 8), ``_PRESET`` (small), ``_STEPS`` (12),
``_GLOBAL_BATCH`` (16), ``_ROUNDS`` (2), ``_RAW_ITERS`` (10), ``_THREADS`` (1 torch thread per
rank; 0 = cores ÷ ranks), ``_BACKENDS`` (auto), ``_SEED`` (1), ``_HOOK_STEPS`` (300 timed steps
per arm of each hook-cost and FSDP2-cost job).
Every job is seeded (model, data and sparsity schedule derive from ``_SEED``).
"""

from __future__ import annotations

import functools
import math
import os

from openclaw_ref.bench import cache
from openclaw_ref.bench.jobs import Case
from openclaw_ref.bench.settings import PRECISIONS, STRATEGY_CASES, BenchSettings
from openclaw_ref.experiments.fsdp_cost import MAX_WORLD_SIZE as FSDP_MAX_WORLD
from openclaw_ref.experiments.fsdp_cost import TP_DEGREES as FSDP_TP


@functools.lru_cache(maxsize=1)
def settings() -> BenchSettings:
    return BenchSettings.from_env()


WORLD_SIZES = list(settings().world_sizes)
BACKENDS = list(settings().backend_params())
STRATEGIES = list(STRATEGY_CASES)
SEED004_PRECISIONS = list(PRECISIONS)
FSDP_WORLD_SIZES = [w for w in WORLD_SIZES if w <= FSDP_MAX_WORLD]  # 1, 2, 4
FSDP_TP_DEGREES = list(FSDP_TP)  # 1: the 1-D mesh; 2: (dp, tp) = (2, 2), at 4 ranks only


def case_figures(cache_dir: str, kind: str, label: str, world_size: int, backend: str) -> dict:
    """The figures of one case (its job runs the first time any figure of it is asked for).
    Raises NotImplementedError — asv's skip — for unsupported cases."""
    return cache.case_figures(Case(kind, label, world_size, backend), settings(),
                              cache.CaseCache(cache_dir))


def hook_cost(cache_dir: str, model: str) -> dict:
    """The hook-cost summary for ``model``: each figure the median of three fresh interleaved
    jobs (``cache.hook_cost_figures``)."""
    return cache.hook_cost_figures(model, settings(), cache.CaseCache(cache_dir))


def canary_cost(cache_dir: str, model: str) -> dict:
    """The canary's cost summary for ``model`` (``cache.canary_cost_figures``)."""
    return cache.canary_cost_figures(model, settings(), cache.CaseCache(cache_dir))


def fsdp_cost(cache_dir: str, model: str, world_size: int, tp: int) -> dict:
    """The FSDP2 cost summary (stock ``fully_shard`` and ``harden()`` on it) for ``model`` on
    ``world_size`` ranks, tensor-parallel degree ``tp`` (1: the 1-D mesh): each figure the
    median of three fresh interleaved jobs (``cache.fsdp_cost_figures``)."""
    return cache.fsdp_cost_figures(model, world_size, settings(), cache.CaseCache(cache_dir),
                                   tp)


def need(figures: dict, key: str) -> float:
    """One figure as a float. A figure this case does not have (a strategy that reports no
    per-bucket skew, bandwidth at one rank) is NaN: asv's value for a skipped benchmark
    (shown as n/a), never a zero. Whole-case skips raise NotImplementedError in ``setup``."""
    value = figures.get(key)
    return math.nan if value is None else float(value)


class JobBenchmark:
    """Base of every class: the shared setup_cache and the attributes multi-rank jobs need."""

    timeout = 1800  # one job at 8 ranks on 2 cores takes minutes, not asv's default 60 s
    number = 1  # a job is a measurement, never repeated inside one asv sample
    repeat = 1
    rounds = 1  # a second round would only re-read the cached figures

    def setup_cache(self) -> str:
        return os.getcwd()  # asv's per-run directory, deleted when the run ends

    setup_cache.timeout = 60
