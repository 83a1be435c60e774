"""The whole matrix without asv: every case, the targets and the environment as one JSON-able
dict (what ``python -m openclaw_ref.bench`` writes)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from openclaw_ref.bench.cache import CaseCache, case_figures
from openclaw_ref.bench.jobs import Case, run_seed004_case, run_sync_case
from openclaw_ref.bench.settings import PRECISIONS, STRATEGY_CASES, BenchSettings
from openclaw_ref.bench.targets import targets
from openclaw_ref.core.environment import environment


def run_matrix(settings: BenchSettings, strategies: Sequence[str] | None = None,
               world_sizes: Sequence[int] | None = None, seed004: bool = True,
               progress: Callable[[str], None] | None = None,
               cache: CaseCache | None = None) -> dict:
    """Every case of the matrix, the targets, and the environment, as one JSON-able dict.
    ``strategies``: benchmark labels (default: all of ``STRATEGY_CASES``; empty: none).
    Skipped cases are listed with their reason, failed ones with their error; a failure does
    not stop the matrix. ``cache``: reuse/keep per-case figures (e.g. resume an interrupted run).
    """
    labels = list(STRATEGY_CASES) if strategies is None else list(strategies)
    worlds = [w for w in (world_sizes or settings.world_sizes)]
    cases: list[Case] = [Case("sync", s, w, b) for w in worlds for s in labels
                         for b in settings.backend_params()]
    if seed004:
        cases += [Case("seed004", p, w, b) for w in worlds for p in PRECISIONS
                  for b in settings.backend_params()]
    results, skipped, failed = [], [], []
    for i, case in enumerate(cases):
        if progress:
            progress(f"[{i + 1}/{len(cases)}] {case.key}")
        try:
            if cache is not None:
                results.append(case_figures(case, settings, cache))
            elif case.kind == "sync":
                results.append(run_sync_case(case.label, case.world_size, case.backend, settings))
            else:
                results.append(run_seed004_case(case.label, case.world_size, case.backend,
                                                settings))
        except NotImplementedError as exc:
            skipped.append({"case": case.key, "reason": str(exc)})
        except Exception as exc:
            failed.append({"case": case.key, "error": f"{type(exc).__name__}: {exc}"})
    sync_cases = [r for r in results if r["kind"] == "sync"]
    return {
        "settings": settings.to_json(),
        "environment": environment(",".join(settings.backend_params()), max(worlds)),
        "cases": sync_cases,
        "seed004": [r for r in results if r["kind"] == "seed004"],
        "targets": [dataclasses.asdict(t) for t in targets(sync_cases)],
        "skipped": skipped,
        "failed": failed,
    }
