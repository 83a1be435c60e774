"""The real-world corpus × column matrix: what stock DDP, ``ddp-detail``, ``harden()`` with its
defaults (every parameter compared within ``replica_slices`` steps) and ``harden()`` comparing
every parameter at every step (K = 1) do with each published pattern of
``core.corpus_faults.CORPUS`` on the openclaw model.

One short run per cell on a reusable rank pool, judged by the fault matrix's ``classify`` (one
way to classify): detected (rank and cause), silent-corruption (replicas differ, or the result
differs from the same column's clean run), crash, hang-timeout, no-effect. The two hardened
columns are built in one function each (``hardened_defaults``, ``hardened_k1``): they are what
a user gets with ``harden(ddp)`` and with the every-step replica window.
"""

from __future__ import annotations

import enum
import importlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from openclaw_ref.arms.config import ArmConfig, harden_defaults
from openclaw_ref.conformance.fault_matrix import CaseOutcome, case_task, classify
from openclaw_ref.core.config import ModelSection, TrainSection
from openclaw_ref.core.corpus_faults import CORPUS, Pattern, acting_rank, pattern
from openclaw_ref.core.errors import LaunchTimeout, RankFailed
from openclaw_ref.core.faults import FaultSpec
from openclaw_ref.core.launch import RankContext, RankPool
from openclaw_ref.sync.base import SyncConfig
from openclaw_ref.sync.errors import ConsistencyError

# The plain-model user script, shipped in the package so an installed copy runs the corpus too.
SCRIPT_MODULE = "openclaw_ref.conformance.silent_errors_script"
# Long enough for the default replica window to cover every parameter after a fault at step 2.
DEFAULT_WINDOW = SyncConfig().replica_slices
CORPUS_STEPS = 2 + DEFAULT_WINDOW + 2
SCRIPT_STEPS = CORPUS_STEPS


class Column(enum.StrEnum):
    STOCK = "ddp"
    DETAIL = "ddp-detail"
    HARDENED = "hardened"
    HARDENED_K1 = "hardened-k1"


def hardened_defaults() -> ArmConfig:
    """``harden(ddp)`` exactly as a user calls it: every field of its ``SyncConfig`` at its
    default."""
    return harden_defaults()


def hardened_k1() -> ArmConfig:
    """``harden(ddp)`` with every parameter compared on every step (one replica slice)."""
    return hardened_defaults().replace(replica_slices=1)


def column_config(column: Column) -> ArmConfig:
    if column is Column.HARDENED:
        return hardened_defaults()
    if column is Column.HARDENED_K1:
        return hardened_k1()
    return ArmConfig(name=column.value)


def replica_window(column: Column) -> int:
    """Steps within which the column compares every parameter (1: the same or next step)."""
    return column_config(column).harden.replica_slices if column in HARDENED_COLUMNS else 1


HARDENED_COLUMNS = (Column.HARDENED, Column.HARDENED_K1)


@dataclass(frozen=True)
class CorpusSettings:
    """The tiny preset on 2 ranks; per-step patterns start at step 2, and the run lasts until
    the default replica window has compared every parameter after it."""

    world_size: int = 2
    model: ModelSection = ModelSection()
    train: TrainSection = TrainSection(steps=CORPUS_STEPS, global_batch=8, eval_every=0)
    case_timeout_s: float = 60.0

    def train_config(self, column: Column):
        from openclaw_ref.core.train import TrainConfig

        return TrainConfig.from_sections(self.model, self.train, world_size=self.world_size,
                                         sync=column_config(column), backend="gloo",
                                         progress=False)


def fault_spec(p: Pattern, world_size: int) -> FaultSpec:
    """The pattern as ``classify`` reads a fault: the rank it acts on and its first step."""
    return FaultSpec(p.name, rank=acting_rank(p, world_size), step=p.first_step)


def corpus_task(ctx: RankContext, job: tuple[Any, str | None]) -> tuple[str, Any]:
    """One corpus case on one rank: ``case_task`` with the pattern's callback (none: clean)."""
    from openclaw_ref.core.corpus_faults import CorpusFault

    cfg, name = job
    if name is None:
        return case_task(ctx, cfg)
    return case_task(ctx, cfg, callbacks=[CorpusFault(name, ctx.rank, ctx.world_size)])


def user_script() -> ModuleType:
    """The plain-model user script as a module (imported on first use: it imports this one)."""
    return importlib.import_module(SCRIPT_MODULE)


def script_task(ctx: RankContext, job: tuple[str, str, int]) -> tuple[str, Any]:
    """One plain-model case on one rank (the pool's process group is the script's): the user
    script's training with (pattern, column, steps), replied as ``case_task`` replies."""
    pattern_name, column, steps = job
    try:
        summary = user_script().train(pattern_name, column, steps)
    except ConsistencyError as exc:
        return ("detected", exc)
    return ("ok", {"summary": summary, "events": []})


class CorpusRunner:
    """Runs pattern × column cases on a shared pool (``get_pool(world_size)``), each column's
    clean run once for its reference digest: on the openclaw model (the loop with a
    ``CorpusFault``), or with ``script=True`` on the plain-model user script."""

    def __init__(self, settings: CorpusSettings, get_pool: Callable[[int], RankPool], *,
                 script: bool = False) -> None:
        self.settings = settings
        self._get_pool = get_pool
        self.script = script
        self.references: dict[Column, str] = {}

    def reference(self, column: Column) -> str:
        if column not in self.references:
            reply = self._run(column, None)
            if reply[0] != "ok":
                raise AssertionError(f"clean {column} run was not clean: {reply[1]}")
            self.references[column] = reply[1]["summary"]["param_digest"]
        return self.references[column]

    def _run(self, column: Column, name: str | None) -> tuple[str, Any]:
        st = self.settings
        if self.script:
            job: tuple = (name or "none", column.value, SCRIPT_STEPS)
            return self._get_pool(st.world_size).run(script_task, job,
                                                     timeout_s=st.case_timeout_s)[0]
        return self._get_pool(st.world_size).run(corpus_task, (st.train_config(column), name),
                                                 timeout_s=st.case_timeout_s)[0]

    def run_case(self, column: Column, name: str) -> CaseOutcome:
        st = self.settings
        spec = fault_spec(pattern(name), st.world_size)
        reference = self.reference(column)
        t0 = time.perf_counter()
        reply, failure = None, None
        try:
            reply = self._run(column, name)
        except (RankFailed, LaunchTimeout) as exc:
            failure = exc
        out = classify(column.value, spec, st.world_size, reply=reply, failure=failure,
                       reference_digest=reference, window=replica_window(column))
        out.wall_s = time.perf_counter() - t0
        return out


def steps_to_detect(out: CaseOutcome, p: Pattern) -> int | None:
    """Steps from the pattern's first step to the detection (0: the same step)."""
    if out.outcome != "detected" or out.step is None:
        return None
    return max(0, out.step - p.first_step)


__all__ = ["CORPUS", "Column", "CorpusRunner", "CorpusSettings", "corpus_task",
           "hardened_defaults", "hardened_k1", "script_task", "steps_to_detect"]
