"""The job cache: a finished job's figures kept as JSON, so the many figures of one job cost
one job (asv asks for each figure in a fresh process)."""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable
from pathlib import Path

from openclaw_ref.bench.jobs import Case, run_seed004_case, run_sync_case
from openclaw_ref.bench.settings import BenchSettings
from openclaw_ref.core.jsonio import read_json, write_json_atomic


class CaseCache:
    """Figures of finished jobs as JSON files in one directory, so the many figures of one job
    cost one job. asv runs every ``track_*`` in a fresh process, with the working directory set
    to the directory ``setup_cache`` made for this run (deleted when the run ends): that is the
    directory to use there. Skips and failures are cached too, so a case is attempted once."""

    def __init__(self, directory: str | os.PathLike) -> None:
        self.directory = Path(directory)

    def get(self, key: str, compute: Callable[[], dict]) -> dict:
        path = self.directory / f"{key}.json"
        if path.exists():
            entry = read_json(path)
        else:
            try:
                entry = {"figures": compute()}
            except NotImplementedError as exc:
                entry = {"skip": str(exc)}
            except Exception as exc:  # recorded once; every figure of the case then fails
                entry = {"error": f"{type(exc).__name__}: {exc}"}
            self.directory.mkdir(parents=True, exist_ok=True)
            write_json_atomic(path, entry)
        if "skip" in entry:
            raise NotImplementedError(entry["skip"])
        if "error" in entry:
            raise RuntimeError(f"benchmark job {key} failed: {entry['error']}")
        return entry["figures"]


def case_figures(case: Case, settings: BenchSettings, cache: CaseCache) -> dict:
    """Cached figures of ``case`` (runs its job the first time)."""
    key = f"{case.key}-{settings.digest()}"
    if case.kind == "sync":
        return cache.get(key, lambda: run_sync_case(case.label, case.world_size,
                                                         case.backend, settings))
    if case.kind == "seed004":
        return cache.get(key, lambda: run_seed004_case(case.label, case.world_size,
                                                            case.backend, settings))
    raise NotImplementedError(f"unknown case kind {case.kind!r}")


HOOK_COST_JOBS = 3  # fresh interleaved jobs behind every hook-cost figure


def hook_cost_figures(model: str, settings: BenchSettings, cache: CaseCache) -> dict:
    """``{"arms": per arm, "pairs": per pair of arms (``hook_cost.pair_name`` → figures)}`` of
    ``HOOK_COST_JOBS`` fresh interleaved hook-cost jobs on 2 ranks
    (``experiments/hook_cost.py``), every figure the median over the jobs. The repeats are made
    here because asv runs a ``track_*`` benchmark once per commit (its ``rounds`` attribute
    applies to timing benchmarks only). Each job is cached, so all figures of one commit cost
    the three jobs once."""
    from openclaw_ref.experiments.hook_cost import HookCostConfig, pair_name, run

    if settings.max_world < 2:
        raise NotImplementedError("the hook cost needs 2 ranks")
    cfg = HookCostConfig(model=model, world_size=2, steps=settings.hook_steps,
                         warmup=hook_warmup(settings), seed=settings.seed)
    key = f"hookcost-{model}-{settings.digest()}"

    def job_figures() -> dict:
        result = run(cfg, threads_per_rank=settings.threads or 1)
        return {"arms": result["summary"],
                "pairs": {pair_name(p["arm"], p["over"]): p for p in result["pairs"]}}

    jobs = [cache.get(f"{key}-{job}", job_figures) for job in range(HOOK_COST_JOBS)]
    return {part: median_summary([j[part] for j in jobs]) for part in ("arms", "pairs")}


CANARY_ARMS = ("ddp", "hardened", "hardened+canary")


def canary_cost_figures(model: str, settings: BenchSettings, cache: CaseCache) -> dict:
    """As ``hook_cost_figures``, with the three arms the canary's cost needs (stock DDP,
    ``harden()``'s defaults, and a probe every step) and a third of the steps — so that the
    ``small`` preset fits a benchmark run too."""
    from openclaw_ref.experiments.hook_cost import HookCostConfig, pair_name, run

    if settings.max_world < 2:
        raise NotImplementedError("the canary's cost needs 2 ranks")
    steps = max(5, settings.hook_steps // 3)
    cfg = HookCostConfig(model=model, world_size=2, steps=steps, arms=CANARY_ARMS,
                         warmup=hook_warmup(settings), seed=settings.seed)
    key = f"canarycost-{model}-{settings.digest()}"

    def job_figures() -> dict:
        result = run(cfg, threads_per_rank=settings.threads or 1)
        return {"arms": result["summary"],
                "pairs": {pair_name(p["arm"], p["over"]): p for p in result["pairs"]}}

    jobs = [cache.get(f"{key}-{job}", job_figures) for job in range(HOOK_COST_JOBS)]
    return {part: median_summary([j[part] for j in jobs]) for part in ("arms", "pairs")}


def fsdp_cost_figures(model: str, world_size: int, settings: BenchSettings,
                      cache: CaseCache, tp: int = 1) -> dict:
    """As ``hook_cost_figures``, for the FSDP2 arms (stock ``fully_shard`` and ``harden()`` on
    it, ``experiments/fsdp_cost.py``) on ``world_size`` ranks and tensor-parallel degree
    ``tp`` (1: the 1-D mesh): the median over ``HOOK_COST_JOBS`` fresh interleaved jobs of
    ``settings.hook_steps`` steps per arm. A mesh the experiment refuses (tp 2 needs 4 ranks)
    is asv's skip."""
    from openclaw_ref.experiments.fsdp_cost import FSDPCostConfig, job_name, mesh_fits, run

    if world_size > settings.max_world:
        raise NotImplementedError(f"{world_size} ranks is over the run's maximum world size")
    if not mesh_fits(world_size, tp):
        raise NotImplementedError(f"no (dp, tp) mesh of tp {tp} on {world_size} ranks")
    cfg = FSDPCostConfig(model=model, world_size=world_size, tp=tp, steps=settings.hook_steps,
                         warmup=hook_warmup(settings), seed=settings.seed)
    key = f"fsdpcost-{job_name(cfg)}-{settings.digest()}"
    return median_summary([
        cache.get(f"{key}-{job}", lambda: run(cfg, threads_per_rank=settings.threads or 1)
                  ["summary"]) for job in range(HOOK_COST_JOBS)])


def hook_warmup(settings: BenchSettings) -> int:
    """Untimed steps per arm of an interleaved job: a tenth of the timed ones, 2 to 10."""
    return min(10, max(2, settings.hook_steps // 10))


def median_summary(summaries: list[dict]) -> dict:
    """Per arm, each numeric figure's median over ``summaries`` (one per job, as
    ``hook_cost.summarize`` gives them); a figure that is not a number is the first job's."""
    out: dict = {}
    for arm, first in summaries[0].items():
        rows = [s.get(arm, {}) for s in summaries]
        out[arm] = {key: (statistics.median(r[key] for r in rows)
                          if all(_number(r.get(key)) for r in rows) else value)
                    for key, value in first.items()}
    return out


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
