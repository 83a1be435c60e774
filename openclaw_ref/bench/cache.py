"""The job cache: a finished job's figures kept as JSON, so the many figures of one job cost
one job (asv asks for each figure in a fresh process)."""

from __future__ import annotations

import os
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

    def draw(self, name: str) -> int:
        """How many times ``name`` was drawn before in this directory (0 the first time); counts
        this draw. asv runs one benchmark process at a time, so no lock is needed."""
        path = self.directory / f"{name}.draws"
        drawn = int(path.read_text()) if path.exists() else 0
        self.directory.mkdir(parents=True, exist_ok=True)
        path.write_text(str(drawn + 1))
        return drawn


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


def hook_cost_figures(model: str, settings: BenchSettings, cache: CaseCache,
                      figure: str) -> dict:
    """The summary of an interleaved hook-cost job (``experiments/hook_cost.py``) on 2 ranks,
    for ``figure``'s next sample: the n-th request of one figure reads the n-th job, so each of
    asv's rounds (``HookCost.rounds``) is a fresh job and the figures of one round share it."""
    from openclaw_ref.experiments.hook_cost import HookCostConfig, run

    if settings.max_world < 2:
        raise NotImplementedError("the hook cost needs 2 ranks")
    cfg = HookCostConfig(model=model, world_size=2, steps=settings.hook_steps,
                         warmup=min(10, max(2, settings.hook_steps // 10)), seed=settings.seed)
    sample = cache.draw(f"hookcost-{model}-{figure}")
    key = f"hookcost-{model}-{settings.digest()}-{sample}"
    return cache.get(key, lambda: run(cfg, threads_per_rank=settings.threads or 1)["summary"])
