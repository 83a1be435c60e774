"""The fault matrix on a user's target: every fault of ``core.faults`` that needs no cooperation
from the model, and every corpus pattern of ``core.corpus_faults`` that applies to it, injected
into the user-target loop (``user_run.train_target``) by the same injectors and judged by the
fault matrix's one ``classify``: detected (naming the rank), silent corruption, crash,
hang-timeout or no effect.

A case that cannot apply to the model is not run but skipped with its reason
(``not_applicable``): permuted registration and the corpus's layer order need two same-shaped
sibling submodules whose registration order is not their forward order (so not positions of an
``nn.Sequential`` / ``nn.ModuleList``); a missing gradient without
``find_unused_parameters`` is DDP's own error that leaves the other ranks waiting.

Invariant: a case always ends, and names a rank. Crash and hang run on a fresh pool with short
deadlines: a hang is ended by the hook's own watchdog where it has one (raised from the waiting
rank at gloo's timeout, naming the late rank), else by gloo's timeout on the waiting rank, else
by the pool's deadline (``LaunchTimeout`` naming the unfinished ranks) — never by the test run's.
"""

from __future__ import annotations

import dataclasses
import enum
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from openclaw_ref.arms.strategy import SyncStrategy
from openclaw_ref.conformance.case_pool import play
from openclaw_ref.conformance.corpus import fault_spec as corpus_fault_spec
from openclaw_ref.conformance.fault_matrix import (
    CaseOutcome,
    classify,
    detected_in_band,
    kills_group,
)
from openclaw_ref.conformance.settings import CheckResult
from openclaw_ref.conformance.target import Target, TargetSpec, build_target
from openclaw_ref.conformance.user_checks import strategy_label
from openclaw_ref.core.callbacks import Callback
from openclaw_ref.core.corpus_faults import CORPUS, CorpusFault, Reach, pattern
from openclaw_ref.core.faults import FaultSpec, fault_text, parse_fault
from openclaw_ref.core.launch import LaunchConfig, RankContext, RankPool
from openclaw_ref.sync.errors import BadInput, ConsistencyError

# The faults of ``core.faults`` any model takes (``local-buckets`` is left out: on a model
# smaller than its bucket cap it changes nothing).
USER_FAULTS = ("late-rank", "scale-mismatch", "missing-grad", "permuted-params", "bitflip",
               "nan-grad", "crash", "hang")
# Faults aimed at one parameter of the model (its first one).
PARAM_FAULTS = frozenset({"missing-grad", "bitflip", "nan-grad"})
SWAP_CASES = frozenset({"permuted-params", "layer-order"})
ORDERED_CONTAINERS = (nn.Sequential, nn.ModuleList)


class CaseKind(enum.StrEnum):
    FAULT = "fault"
    CORPUS = "corpus"


@dataclass(frozen=True)
class UserCase:
    """One row of the user target's fault matrix: a fault of ``core.faults`` or a corpus
    pattern (their names do not overlap)."""

    kind: CaseKind
    name: str

    @property
    def check(self) -> str:
        return f"{self.kind}: {self.name}"


def user_cases() -> tuple[UserCase, ...]:
    return (tuple(UserCase(CaseKind.FAULT, f) for f in USER_FAULTS)
            + tuple(UserCase(CaseKind.CORPUS, p.name) for p in CORPUS))


def user_case_names(text: str) -> tuple[str, ...]:
    """A comma-separated list of case names (``all``: every case), each checked."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    if names == ["all"]:
        return tuple(c.name for c in user_cases())
    for n in names:
        user_case(n)
    return tuple(names)


def user_case(name: str) -> UserCase:
    """The case named ``name`` (a fault or a corpus pattern); ``BadInput`` naming them all."""
    for case in user_cases():
        if case.name == name:
            return case
    raise BadInput(f"unknown fault or corpus pattern {name!r}; choose from "
                   f"{', '.join(c.name for c in user_cases())} (or all)")


@dataclass(frozen=True)
class UserFaultSettings:
    """One short run per case: the fault at ``fault_step`` (corpus patterns: from their own
    first step), a late rank far above scheduler noise, and for crash/hang a fresh pool whose
    gloo deadline is ``pg_timeout_s`` (above the example's watchdog deadline)."""

    steps: int = 5
    fault_step: int = 2
    late_rank_value: str = "250ms"
    hang_value: str = "600s"
    pg_timeout_s: float = 8.0
    case_timeout_s: float = 120.0
    backend: str = "gloo"
    seed: int = 0

    def fault_text(self, fault: str) -> str:
        value = {"late-rank": self.late_rank_value, "hang": self.hang_value}.get(fault)
        return fault_text(fault, value, self.fault_step)


def swappable_pair(model: nn.Module) -> tuple[str, str] | None:
    """Two sibling submodules with the same parameter shapes whose parent is not an ordered
    container (swapping them changes only the registration order), or None."""
    for parent_name, parent in model.named_modules():
        if isinstance(parent, ORDERED_CONTAINERS):
            continue
        seen: dict[tuple, str] = {}
        for name, child in parent.named_children():
            shapes = tuple(tuple(p.shape) for p in child.parameters())
            if not shapes:
                continue
            if shapes in seen:
                prefix = f"{parent_name}." if parent_name else ""
                return f"{prefix}{seen[shapes]}", f"{prefix}{name}"
            seen[shapes] = name
    return None


def not_applicable(case: UserCase, target: Target) -> str | None:
    """Why ``case`` cannot run on ``target`` (None: it can)."""
    if case.name in SWAP_CASES and swappable_pair(target.module) is None:
        return (f"{case.name} swaps two same-shaped sibling submodules in registration order "
                f"only; this model has none outside an nn.Sequential/nn.ModuleList (whose order "
                f"is the forward's)")
    if case.name == "missing-grad" and not target.find_unused_parameters:
        return ("missing-grad without find_unused_parameters: DDP raises on the next forward "
                "and leaves the other ranks waiting (stock DDP's own behaviour; the target "
                "declares that every parameter gets a gradient)")
    return None


def case_fault(case: UserCase, target: Target, settings: UserFaultSettings,
               world_size: int) -> FaultSpec:
    """The case as ``classify`` reads a fault (rank, step, parameters), aimed at ``target``."""
    if case.kind is CaseKind.CORPUS:
        return corpus_fault_spec(pattern(case.name), world_size)
    spec = parse_fault(settings.fault_text(case.name))
    if case.name in PARAM_FAULTS:
        spec = dataclasses.replace(spec, value=first_parameter(target.module))
    elif case.name == "permuted-params":
        spec = dataclasses.replace(spec, value=",".join(swappable_pair(target.module) or ()))
    return spec


def first_parameter(model: nn.Module) -> str:
    return next(n for n, _ in model.named_parameters())


class RunObserver(Callback):
    """The strategy (for its events) and each step's sync metrics, as the run record holds
    them for ``classify``."""

    def __init__(self) -> None:
        self.strategy: SyncStrategy | None = None
        self.steps: list[dict] = []

    def on_wrapped(self, strategy: SyncStrategy) -> None:
        self.strategy = strategy

    def after_sync(self, step: int, model: nn.Module, strategy: SyncStrategy,
                   applied: bool) -> None:
        self.steps.append({"step": step, "sync": strategy.step_metrics()})


@dataclass(frozen=True)
class CaseJob:
    """What a rank needs for one case (``case`` None: the clean run): the fault as ``classify``
    reads it, and for a corpus pattern the parameter and the sibling pair it acts on (both
    found on the model by the parent)."""

    case: UserCase | None = None
    fault: FaultSpec | None = None
    replaced: str = ""
    swapped: tuple[str, str] = ("", "")


def user_case_task(ctx: RankContext, spec: TargetSpec, job: CaseJob,
                   settings: UserFaultSettings) -> tuple[str, Any]:
    """One case on one rank, replied as the fault matrix's ``case_task`` replies: ("ok",
    record) or ("detected", the error raised on every rank). Any other error (a watchdog's
    ``SyncTimeout`` included) leaves the task for the pool to name. Torch's RNG is seeded
    first, so a factory that draws its weights starts every case from the same ones."""
    from openclaw_ref.conformance.user_run import LoopOptions, train_target
    from openclaw_ref.core.collectives import gather
    from openclaw_ref.core.digests import params_digest

    torch.manual_seed(settings.seed)
    observer = RunObserver()
    callbacks: list[Callback] = [observer]
    faults: tuple[FaultSpec, ...] = ()
    if job.case is not None and job.case.kind is CaseKind.CORPUS:
        callbacks.insert(0, CorpusFault(job.case.name, ctx.rank, ctx.world_size,
                                        replaced=job.replaced, swapped=job.swapped))
    elif job.fault is not None:
        faults = (job.fault,)
    try:
        model = train_target(ctx, spec, LoopOptions(steps=settings.steps), faults, callbacks)
    except ConsistencyError as exc:
        return detected_in_band(ctx, exc)
    digests = gather(ctx, params_digest(model.named_parameters()))
    events = observer.strategy.events if observer.strategy is not None else []
    return ("ok", {"events": [e.to_json() for e in events], "steps": observer.steps,
                   "summary": {"param_digest": digests[0],
                               "replicas_equal": len(set(digests)) == 1}})


class UserFaultRunner:
    """Runs the cases of one ``TargetSpec`` on a shared pool (``get_pool(world_size)``), the
    clean run once for the reference digest; crash and hang on fresh pools with short
    deadlines."""

    def __init__(self, spec: TargetSpec, get_pool: Callable[[int], RankPool],
                 settings: UserFaultSettings = UserFaultSettings()) -> None:
        self.spec, self.settings = spec, settings
        self._get_pool = get_pool
        self.target = build_target(spec.factory)
        self._reference: str | None = None

    def clean_reply(self) -> tuple[str, Any]:
        return self._get_pool(self.spec.world_size).run(
            user_case_task, self.spec, CaseJob(), self.settings,
            timeout_s=self.settings.case_timeout_s)[0]

    def reference(self) -> str:
        if self._reference is None:
            reply = self.clean_reply()
            if reply[0] != "ok":
                raise AssertionError(f"the fault-free run of {strategy_label(self.spec)} was "
                                     f"not clean: {reply[1]}")
            self._reference = reply[1]["summary"]["param_digest"]
        return self._reference

    def run_case(self, case: UserCase) -> CaseOutcome:
        """The outcome of ``case`` (the caller skips a case ``not_applicable`` names)."""
        st, ws = self.settings, self.spec.world_size
        fault = case_fault(case, self.target, st, ws)
        reference = self.reference()
        t0 = time.perf_counter()
        fresh = kills_group("user-hook", case.name)
        pool = self._fresh() if fresh else self._get_pool(ws)
        reply, failure, died = play(pool, fresh, user_case_task, self.spec,
                                    self._job(case, fault), st, timeout_s=st.case_timeout_s)
        out = classify(strategy_label(self.spec), fault, ws, reply=reply, failure=failure,
                       reference_digest=reference, died=died)
        out.fault = case.name
        out.wall_s = time.perf_counter() - t0
        return out

    def _job(self, case: UserCase, fault: FaultSpec) -> CaseJob:
        model = self.target.module
        return CaseJob(case, fault, first_parameter(model), swappable_pair(model) or ("", ""))

    def _fresh(self) -> RankPool:
        st = self.settings
        return RankPool(LaunchConfig(self.spec.world_size, backend=st.backend,
                                     timeout_s=st.case_timeout_s,
                                     pg_timeout_s=st.pg_timeout_s))


def names_injected_rank(case: UserCase, out: CaseOutcome) -> bool:
    """Whether the run stopped naming the faulty rank (a detection, or a crash/hang the
    launcher or a watchdog attributed); where every rank makes the mistake, any rank it names
    (which rank's error reaches the launcher first is a race)."""
    if case.kind is CaseKind.CORPUS and pattern(case.name).reach is Reach.EVERY_RANK:
        return out.outcome in ("detected", "crash", "hang-timeout") and bool(out.ranks)
    return out.attributed


def case_result(case: UserCase, out: CaseOutcome) -> CheckResult:
    """A case as a conformance row: passed when the run stopped naming the faulty rank."""
    return CheckResult(case.check, out.strategy, names_injected_rank(case, out), out.summary(),
                       out.to_json(),
                       {"kind": out.kind, "step": out.step, "ranks": out.ranks}
                       if out.outcome != "no-effect" and out.kind else None)


def skipped_result(case: UserCase, spec: TargetSpec, reason: str) -> CheckResult:
    return CheckResult(case.check, strategy_label(spec), True, f"skipped: {reason}",
                       {"outcome": "skipped"})


def run_user_faults(spec: TargetSpec, names: tuple[str, ...],
                    settings: UserFaultSettings = UserFaultSettings()) -> list[CheckResult]:
    """``openclaw-bench conform --model/--hook``'s fault rows, run from the parent process."""
    from openclaw_ref.core.pools import PoolCache

    cache = PoolCache(backend=settings.backend)
    runner = UserFaultRunner(spec, cache.get, settings)
    results = []
    try:
        for case in (user_case(n) for n in names):
            reason = not_applicable(case, runner.target)
            results.append(skipped_result(case, spec, reason) if reason
                           else case_result(case, runner.run_case(case)))
    finally:
        cache.close()
    return results
