"""Section ``faults``: the fault × hook outcome matrix (2 ranks) — stock DDP, PyTorch's own comm
hooks as users register them, the suite's strategies — the seed's F5 hook as written through the
same matrix (plus its fault-free case), and every column's bucket layout recorded on every rank
(the seed's M3). Beside the cases the record holds each column's settings and its strategy's
defaults (``columns``), from which the renderer marks the columns not run at their defaults;
``hardened-defaults`` is ``harden(model)`` as users call it. ``compare --quick`` runs
``QUICK_FAULTS`` × ``QUICK_COLUMNS`` (without the defaults column: the quick run shows each
table's shape, and its marked ``hardened`` column still shows the marking)."""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING

from openclaw_ref.arms.ddp import POWERSGD_EPSILON, POWERSGD_RANK, POWERSGD_START_ITER
from openclaw_ref.arms.registry import STRATEGIES
from openclaw_ref.conformance.fault_matrix import (
    FAULTS,
    CaseOutcome,
    MatrixRunner,
    MatrixSettings,
    case_task,
    column_settings,
    matrix_strategies,
)
from openclaw_ref.core.errors import LaunchTimeout, RankFailed
from openclaw_ref.core.pools import PoolCache
from openclaw_ref.sync.errors import ConsistencyError

if TYPE_CHECKING:
    from openclaw_ref.experiments.settings import CompareConfig, Progress

SEED_F5 = "seed-f5"
# ``compare --quick``: three faults whose cases take under a second (crash, hang and
# local-buckets restart the ranks: 3-11 s each), on stock DDP and ours
QUICK_FAULTS = ("late-rank", "missing-grad", "nan-grad")
QUICK_COLUMNS = ("ddp", "hardened")


def faults_of(cfg: CompareConfig) -> tuple[str, ...]:
    return QUICK_FAULTS if cfg.quick else FAULTS


def columns_of(cfg: CompareConfig) -> tuple[str, ...]:
    columns = matrix_strategies()
    return tuple(c for c in columns if c in QUICK_COLUMNS) if cfg.quick else columns


def jobs(cfg: CompareConfig) -> int:
    columns, faults = len(columns_of(cfg)), len(faults_of(cfg))
    # the matrix, the seed-f5 column (with "none"), the layouts
    return columns * faults + faults + 1 + columns


def _case(outcome: CaseOutcome, fault_name: str) -> dict:
    return {**outcome.to_json(), "fault_name": fault_name, "cell": outcome.summary()}


def _clean_outcome(runner: MatrixRunner, pools: PoolCache) -> CaseOutcome:
    """The seed-f5 hook's fault-free run judged against stock ddp's (see ``seed_f5_cases``)."""
    st = runner.settings
    ddp_digest = runner.reference("ddp")
    clean = CaseOutcome(SEED_F5, "none", "no-effect")
    t0 = time.perf_counter()
    try:
        reply = pools.get(st.world_size).run(case_task, st.train_config(SEED_F5, None),
                                             timeout_s=st.case_timeout_s)[0]
    except LaunchTimeout as exc:
        clean.outcome, clean.kind, clean.detail = "hang-timeout", "LaunchTimeout", str(exc)[:300]
        reply = None
    except RankFailed as exc:
        cause = exc.cause
        clean.outcome = "detected" if isinstance(cause, ConsistencyError) else "crash"
        clean.kind, clean.ranks, clean.detail = exc.summary.split(":")[0], [exc.rank], \
            exc.summary[:300]
        reply = None
    if reply is not None and reply[0] == "detected":
        clean.outcome, clean.kind, clean.detail = "detected", type(reply[1]).__name__, \
            str(reply[1])[:300]
    elif reply is not None:
        summary = reply[1]["summary"]
        runner.references[SEED_F5] = summary["param_digest"]
        if not summary["replicas_equal"] or summary["param_digest"] != ddp_digest:
            clean.outcome = "silent-corruption"
            clean.detail = ("replicas diverged; " if not summary["replicas_equal"] else "") + \
                "result differs from stock ddp's fault-free run"
        clean.detail = (clean.detail + "; " if clean.detail else "") + ", ".join(
            f"{k} {v}" for k, v in summary["sync"].items())
    if SEED_F5 not in runner.references:  # no clean reference: judge faults without one
        runner.references[SEED_F5] = None
    clean.wall_s = time.perf_counter() - t0
    return clean


def seed_f5_cases(runner: MatrixRunner, pools: PoolCache, progress: Progress,
                  faults: tuple[str, ...] = FAULTS) -> list[dict]:
    """The seed's F5 hook as written (``arms/seed_f5.py``) through the same fault
    matrix, plus a fault-free case (fault ``none``): no-effect when it trains exactly like stock
    ``ddp`` (same parameter digest), detected when its assertion fires (a false alarm), crash /
    hang-timeout when a rank dies or stalls, silent-corruption when it changes the result."""
    cases = [_case(_clean_outcome(runner, pools), "none")]
    progress.tick(f"fault none × {SEED_F5}")
    for fault in faults:
        cases.append(_case(runner.run_case(SEED_F5, fault), fault))
        progress.tick(f"fault {fault} × {SEED_F5}")
    return cases


def _alignment(cfg: CompareConfig, settings: MatrixSettings, pools: PoolCache,
               progress: Progress) -> list[dict]:
    from openclaw_ref.conformance.checks import check_bucket_alignment
    from openclaw_ref.conformance.settings import ConformSettings

    alignment = []
    w = max(cfg.world_sizes)
    for strategy in columns_of(cfg):
        sync = dataclasses.replace(settings.sync_config(strategy), bucket_cap_mb=cfg.bucket_cap_mb)
        s = ConformSettings(sync=sync)
        if w >= 2:
            result = pools.get(w).run(check_bucket_alignment, s)[0]
            alignment.append({"strategy": strategy, "world_size": w, "aligned": result.passed,
                              "steps": s.train.steps, "buckets": result.figures.get("buckets"),
                              "detail": result.detail})
        progress.tick(f"bucket alignment {strategy}")
    return alignment


def run(cfg: CompareConfig, pools: PoolCache, progress: Progress) -> dict:
    """The fault × hook matrix (2 ranks) and per-rank bucket layouts of every column."""
    settings = MatrixSettings()
    runner = MatrixRunner(settings, get_pool=pools.get)
    cases = []
    try:
        for strategy in columns_of(cfg):
            for fault in faults_of(cfg):
                cases.append(_case(runner.run_case(strategy, fault), fault))
                progress.tick(f"fault {fault} × {strategy}")
        if SEED_F5 in STRATEGIES:
            cases += seed_f5_cases(runner, pools, progress, faults_of(cfg))
    finally:
        runner.close()
    return {"settings": dataclasses.asdict(settings), "cases": cases,
            "columns": column_settings(settings, columns_of(cfg)),
            "powersgd": {"rank": POWERSGD_RANK, "start_iter": POWERSGD_START_ITER,
                         "epsilon": POWERSGD_EPSILON},
            "bucket_alignment": _alignment(cfg, settings, pools, progress)}
