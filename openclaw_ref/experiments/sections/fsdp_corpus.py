"""Section ``fsdp_corpus``: the published FSDP2 mistakes (``fsdp_corpus.patterns``), each run as
a plain user script under torchrun (``fsdp_corpus.silent_errors_script``, through the launcher
with its deadline, ``fsdp_corpus.launch``), under stock FSDP2 and under ``harden()``'s
defaults, on 2 ranks with a 1-D mesh and on 4 ranks with an HSDP mesh (2 replicas × 2 shards).
Per pattern and column it records the outcome, the error
class, the step and the ranks named — figures only; the table and its wording are
``reporting.fsdp_tables.fsdp_corpus_tables``.

A torchrun job ends at the first pattern in which a rank failed (its process group is broken),
so each column runs its patterns in as many jobs as it takes: the rest of the list starts a new
job. The patterns that can end a job run last, the hang last of all. ``compare --quick`` runs
``QUICK_PATTERNS`` on the 1-D mesh only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from openclaw_ref.core.pools import PoolCache
from openclaw_ref.fsdp_corpus import silent_errors_script as script
from openclaw_ref.fsdp_corpus.launch import Job, run_job
from openclaw_ref.fsdp_corpus.outcome import REPLICAS_DIFFER
from openclaw_ref.fsdp_corpus.patterns import (
    CLEAN,
    CORPUS,
    FAULT_RANK,
    FAULT_STEP,
    PATTERNS,
    Column,
    Mesh,
)

if TYPE_CHECKING:
    from openclaw_ref.experiments.settings import CompareConfig, Progress

# (mesh, ranks) the section runs; 4 ranks on 2 cores are oversubscribed, which only slows them
# (no time is recorded); a hang on HSDP waits on a mesh subgroup, ended by the script's watchdog
MESHES: tuple[tuple[Mesh, int], ...] = ((Mesh.FSDP, 2), (Mesh.HSDP, 4))
COLUMNS = (Column.STOCK, Column.HARDENED)
TIMEOUT_S = 10.0  # the process group's timeout: how long a hung collective waits
DEADLINE_S = 300.0  # one torchrun job's
# the patterns that end a job under some column (a rank aborts or hangs), the hang last
ENDS_A_JOB = ("extra-backward-one-rank", "mixed-precision-differs", "unused-param-one-rank",
              "no-sync-one-rank")
RUN_ORDER = (CLEAN, *(p.name for p in CORPUS if p.name not in ENDS_A_JOB), *ENDS_A_JOB)
QUICK_PATTERNS = (CLEAN, "optimizer-before-shard", "extra-backward-one-rank")


def patterns_of(cfg: CompareConfig) -> tuple[str, ...]:
    return tuple(n for n in RUN_ORDER if n in QUICK_PATTERNS) if cfg.quick else RUN_ORDER


def meshes_of(cfg: CompareConfig) -> tuple[tuple[Mesh, int], ...]:
    return MESHES[:1] if cfg.quick else MESHES


def jobs(cfg: CompareConfig) -> int:
    """One progress tick per (mesh, column): each is one to four torchrun jobs."""
    return len(meshes_of(cfg)) * len(COLUMNS)


def run_column(names: tuple[str, ...], column: Column, mesh: Mesh,
               world_size: int) -> dict[str, dict]:
    """Every pattern's outcome under one column (``launch.run_job``'s form), in as many torchrun
    jobs as it takes: a job that stopped at a failed pattern is followed by one for the rest."""
    left, out = list(names), {}
    while left:
        got = run_job(Job(tuple(left), world_size=world_size, mesh=mesh, column=column,
                          timeout_s=TIMEOUT_S, deadline_s=DEADLINE_S))
        out.update(got)
        left = [n for n in left if n not in got]
    return out


def case_figures(name: str, column: Column, mesh: Mesh, world_size: int,
                 outcome: dict) -> dict[str, Any]:
    """One cell's figures: no wording (``outcome.detail`` and the ranks' accounts stay out)."""
    return {"pattern": name, "column": column.value, "mesh": mesh.value,
            "world_size": world_size, "outcome": outcome["kind"],
            "error": outcome.get("error"), "step": outcome["step"],
            "ranks": list(outcome["ranks"]), "max_abs_diff": outcome["max_abs_diff"],
            "replicas_differ": outcome["detail"] == REPLICAS_DIFFER,
            "failed_error": outcome.get("failed_error"),
            "failed_ranks": list(outcome.get("failed_ranks", []))}


def pattern_figures(name: str) -> dict[str, Any]:
    """The row's pattern: its public source (``url`` None where none was found; the clean
    script has neither)."""
    if name == CLEAN:
        return {"name": name, "source": None, "url": None}
    p = PATTERNS[name]
    return {"name": name, "source": p.source, "url": p.url}


def run(cfg: CompareConfig, pools: PoolCache, progress: Progress) -> dict:
    """Each (mesh, column): the corpus in its torchrun jobs; ``pools`` is unused (torchrun
    starts the ranks: a rank killed by a signal must not take a pool with it)."""
    names = patterns_of(cfg)
    cases = []
    for mesh, world_size in meshes_of(cfg):
        for column in COLUMNS:
            outcomes = run_column(names, column, mesh, world_size)
            cases += [case_figures(n, column, mesh, world_size, outcomes[n]) for n in names]
            progress.tick(f"FSDP2 corpus {mesh.value} {column.value}")
    return {"settings": {"steps": script.STEPS, "fault_step": FAULT_STEP,
                         "fault_rank": FAULT_RANK, "timeout_s": TIMEOUT_S,
                         "batch_per_rank": script.BATCH},
            "patterns": [pattern_figures(n) for n in names], "cases": cases}
