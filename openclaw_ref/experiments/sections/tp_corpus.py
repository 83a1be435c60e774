"""Section ``tp_corpus``: FSDP2 × tensor parallel (``tp_corpus.cases``), healthy set-ups and
published TP/SP mistakes, each run as a plain user script under torchrun
(``tp_corpus.script``, through its launcher with a deadline, ``tp_corpus.launch``), under the
script as written (stock) and under ``harden()``'s defaults, on the 2-D ``(dp, tp)`` mesh (4
ranks) and the 3-D ``(replicate, shard, tp)`` mesh (8 ranks). Per case and column it records
the outcome, the error class, the step, the ranks and parameters named, the replica drift and
the parameters that drifted, the distance from the healthy base run, the warnings printed, and
for the healthy cases whether ``harden()`` left the job bitwise as stock — figures only; the
tables and their wording are ``reporting.tp_tables``.

A torchrun job ends at the first case in which a rank failed (its process group is broken),
so each column runs its cases in as many jobs as it takes: the rest of the list starts a new
job (a mistake whose base ran in an earlier job then has no distance from it). Healthy cases
run first (the mistakes' bases), the case that can hang last. ``compare --quick`` runs
``QUICK_CASES`` on the 2-D mesh only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from openclaw_ref.core.pools import PoolCache
from openclaw_ref.fsdp_corpus.outcome import REPLICAS_DIFFER
from openclaw_ref.fsdp_corpus.patterns import Column
from openclaw_ref.tp_corpus import model, script
from openclaw_ref.tp_corpus.cases import CASES, FAULT_RANK, FAULT_STEP, MeshShape, case
from openclaw_ref.tp_corpus.launch import Job, run_job
from openclaw_ref.tp_corpus.outcome import bitwise_equal

if TYPE_CHECKING:
    from openclaw_ref.experiments.settings import CompareConfig, Progress

MESHES = (MeshShape.TWO_D, MeshShape.THREE_D)
COLUMNS = (Column.STOCK, Column.HARDENED)
TIMEOUT_S = 10.0  # the process group's timeout: how long a hung collective waits
DEADLINE_S = 900.0  # one torchrun job's (inductor's first compile on 4 ranks included)
ENDS_A_JOB = ("extra-microbatch-one-rank",)  # stock: every rank hangs at the last step
QUICK_CASES = ("sequence-parallel", "norms-left-out-of-sp")


def cases_of(cfg: CompareConfig, mesh: MeshShape) -> tuple[str, ...]:
    """``mesh``'s cases in run order: healthy first, then the mistakes, the hang last."""
    here = [c for c in CASES.values() if c.mesh is mesh]
    names = [c.name for c in sorted(here, key=lambda c: (c.name in ENDS_A_JOB, not c.healthy))]
    return tuple(n for n in names if n in QUICK_CASES) if cfg.quick else tuple(names)


def meshes_of(cfg: CompareConfig) -> tuple[MeshShape, ...]:
    return MESHES[:1] if cfg.quick else MESHES


def jobs(cfg: CompareConfig) -> int:
    """One progress tick per (mesh, column): each is one or more torchrun jobs."""
    return len(meshes_of(cfg)) * len(COLUMNS)


def run_column(names: tuple[str, ...], column: Column) -> dict[str, dict]:
    """Every case's outcome under one column (``launch.run_job``'s form), in as many torchrun
    jobs as it takes: a job that stopped at a failed case is followed by one for the rest."""
    left, out = list(names), {}
    while left:
        got = run_job(Job(tuple(left), column, TIMEOUT_S, DEADLINE_S))
        out.update(got)
        left = [n for n in left if n not in got]
    return out


def case_figures(name: str, column: Column, outcome: dict,
                 stock: dict | None = None) -> dict[str, Any]:
    """One cell's figures (no wording: the error's message and the ranks' accounts stay out).
    ``stock``: the stock column's outcome of the same case, for a hardened healthy case's
    bitwise comparison."""
    warned = outcome.get("warnings") or {}
    return {"case": name, "column": column.value, "mesh": outcome["mesh"],
            "world_size": outcome["world_size"], "outcome": outcome["kind"],
            "error": outcome.get("error"), "step": outcome["step"],
            "ranks": list(outcome["ranks"]), "params": list(outcome.get("params") or []),
            "drift": outcome.get("drift"), "drift_params": list(outcome.get("drift_params", [])),
            "from_base": outcome.get("max_abs_diff"),
            "replicas_differ": outcome["detail"] == REPLICAS_DIFFER,
            "warned_ranks": sorted(int(r) for r in warned),
            "warnings_per_rank": max((len(w) for w in warned.values()), default=0),
            "failed_error": outcome.get("failed_error"),
            "failed_ranks": list(outcome.get("failed_ranks", [])),
            "bitwise_equal_to_stock": None if stock is None else bitwise_equal(stock, outcome)}


def case_source(name: str) -> dict[str, Any]:
    c = case(name)
    return {"name": name, "mesh": c.mesh.value, "healthy": c.healthy, "base": c.base,
            "source": c.source, "url": c.url, "plan": c.plan.value, "clip": c.clip.value,
            "fault": c.fault.value, "compiled": c.compiled}


def run(cfg: CompareConfig, pools: PoolCache, progress: Progress) -> dict:
    """Each (mesh, column): the cases in their torchrun jobs; ``pools`` is unused (torchrun
    starts the ranks: a rank killed by a signal must not take a pool with it)."""
    cases, names_run = [], []
    for mesh in meshes_of(cfg):
        names = cases_of(cfg, mesh)
        names_run += names
        stock = run_column(names, Column.STOCK)
        progress.tick(f"TP corpus {mesh.value} stock")
        hardened = run_column(names, Column.HARDENED)
        progress.tick(f"TP corpus {mesh.value} hardened")
        cases += [case_figures(n, Column.STOCK, stock[n]) for n in names]
        cases += [case_figures(n, Column.HARDENED, hardened[n],
                               stock[n] if case(n).healthy else None) for n in names]
    return {"settings": {"steps": script.STEPS, "fault_rank": FAULT_RANK,
                         "fault_step": FAULT_STEP, "timeout_s": TIMEOUT_S,
                         "lr_factor": script.LR_FACTOR, "weight_delta": script.WEIGHT_DELTA,
                         "max_norm": script.MAX_NORM, "batch_per_dp_rank": model.BATCH,
                         "seq": model.SEQ},
            "cases_run": [case_source(n) for n in names_run], "cases": cases}
