"""The fault × hook matrix: what each sync path does when each fault is injected — stock DDP,
DDP with one of PyTorch's own comm hooks (run as shipped: any ``sync.ddp.is_stock`` strategy is
one more column, no code here per hook), and the suite's own strategies.

``MatrixRunner`` runs one short training per (strategy, fault) cell on reusable rank pools
(group-killing faults on fresh pools with short deadlines), and ``classify`` turns what the
system surfaced — a rank's reply, the detection it raised in-band, or the pool's failure; never
what the injector knows — into one of ``OUTCOMES``: ``detected`` (with rank and
parameter/bucket), ``silent-corruption`` (replicas diverge, or the result differs from the
fault-free run), ``hang-timeout`` (ended by a deadline), ``crash`` (a rank error/death
surfaced), ``no-effect``. ``conformance/suite/test_fault_matrix.py`` asserts on it; ``compare``
publishes it.
"""

from __future__ import annotations

import dataclasses
import datetime
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch.distributed as dist

from openclaw_ref.arms.config import ArmConfig, harden_defaults
from openclaw_ref.arms.registry import STRATEGIES
from openclaw_ref.conformance.case_pool import play
from openclaw_ref.core.config import ModelSection, TrainSection
from openclaw_ref.core.errors import LaunchTimeout, RankFailed
from openclaw_ref.core.faults import (
    FAULTS,
    GROUP_KILLING,
    FaultSpec,
    fault_text,
    parse_duration_s,
    parse_fault,
)
from openclaw_ref.core.launch import LaunchConfig, RankContext, RankPool
from openclaw_ref.sync.base import WatchdogAction
from openclaw_ref.sync.errors import ConsistencyError, SyncTimeout

OUTCOMES = ("detected", "silent-corruption", "hang-timeout", "crash", "no-effect")
# Columns: stock DDP, PyTorch's own comm hooks as users register them, then the suite's own.
MATRIX_STRATEGIES = ("ddp", "ddp-allreduce", "ddp-fp16", "ddp-bf16", "ddp-powersgd", "hardened",
                     "hardened-defaults", "hardened-bucket", "bucketed")
PER_BUCKET = "hardened-bucket"  # the column of harden()'s per-bucket guard
# The column of harden(model) exactly as users call it: every setting at harden()'s default
# (the other hardened columns run the matrix's short watchdog and replica interval).
DEFAULTS = "hardened-defaults"

# ---------------------------------------------------------------------------------------------
# The fault × strategy matrix


@dataclass(frozen=True)
class MatrixSettings:
    """One short run per cell: the tiny preset on 2 ranks, 5 steps, the fault at step 2."""

    world_size: int = 2
    model: ModelSection = ModelSection()
    train: TrainSection = TrainSection(steps=5, global_batch=8, eval_every=0)
    fault_step: int = 2
    replica_check_every: int = 2
    watchdog_s: float = 2.0
    pg_timeout_s: float = 5.0  # gloo's own deadline in the fresh pools of group-killing faults
    case_timeout_s: float = 60.0
    late_rank_value: str = "250ms"  # far above scheduler noise on a loaded box (≤ 75 ms seen)
    hang_value: str = "600s"

    def fault_text(self, fault: str) -> str:
        value = {"late-rank": self.late_rank_value, "hang": self.hang_value}.get(fault)
        return fault_text(fault, value, self.fault_step)

    def sync_config(self, strategy: str) -> ArmConfig:
        """Stock DDP, with or without one of PyTorch's hooks, as users get it (``as_shipped``);
        ``hardened-defaults``: ``harden(model)`` as users call it (``harden_defaults()``, every
        setting at its default); ``hardened``: the step guard and the gradients' own wire;
        ``hardened-bucket`` (the per-bucket guard) and ``bucketed`` (the agreed planner) with an
        FP16 wire at the seed's 2^12 (so scale faults reach their pre-scale); every
        parameter's replica compared within K steps (``replica_slices`` for hardened,
        ``replica_check_every`` for bucketed), a short watchdog that ends a hung job at its own
        deadline (``WatchdogAction.EXIT``: the default, ``RAISE``, would leave a hang to gloo's
        timeout)."""
        if as_shipped(strategy):
            return ArmConfig(name=strategy)
        if strategy == DEFAULTS:
            return harden_defaults()
        knobs = dict(replica_check_every=self.replica_check_every,
                     replica_slices=self.replica_check_every, watchdog_s=self.watchdog_s,
                     watchdog_action=WatchdogAction.EXIT)
        if strategy == "hardened":
            return ArmConfig.of(strategy, **knobs)
        planner = "norm-ema-agreed" if strategy == "bucketed" else "static"
        guard = {"guard": "bucket"} if strategy == PER_BUCKET else {}
        return ArmConfig.of(strategy_name(strategy), wire="fp16", scale="4096",
                            planner=planner, **guard, **knobs)

    def train_config(self, strategy: str, fault: str | None):
        from openclaw_ref.core.train import TrainConfig

        faults = (parse_fault(self.fault_text(fault)),) if fault else ()
        return TrainConfig.from_sections(self.model, self.train, world_size=self.world_size,
                                         sync=self.sync_config(strategy), faults=faults,
                                         backend="gloo", progress=False)


@dataclass
class CaseOutcome:
    strategy: str
    fault: str
    outcome: str
    kind: str = ""
    step: int | None = None
    ranks: list[int] = field(default_factory=list)
    bucket: int | None = None
    params: list[str] = field(default_factory=list)
    detail: str = ""
    expected_ranks: list[int] = field(default_factory=list)
    expected_params: list[str] = field(default_factory=list)
    attributed: bool = False  # right rank, and right parameter or a bucket where one applies
    in_time: bool = False  # detected within one step (bitflip: one replica-check interval)
    wall_s: float = 0.0

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    def summary(self) -> str:
        where = []
        if self.kind:
            where.append(self.kind)
        if self.step is not None:
            where.append(f"step {self.step}")
        if self.ranks:
            where.append(f"ranks {self.ranks}")
        if self.bucket is not None:
            where.append(f"bucket {self.bucket}")
        if self.params:
            where.append(", ".join(self.params[:2]) + (" …" if len(self.params) > 2 else ""))
        return f"{self.outcome}" + (f" ({'; '.join(where)})" if where else "")


def case_task(ctx: RankContext, cfg, callbacks: Sequence[Any] = ()) -> tuple[str, Any]:
    """One matrix case on one rank: train (with ``callbacks``, e.g. a corpus fault), and turn an
    in-band detection (raised on every rank at the same step) into a reply, so the group
    survives for the next case. The monitored barrier proves every rank got out of the run;
    if one did not, it raises and the pool (which then has a wedged rank) is replaced by the
    caller."""
    from openclaw_ref.core.train import train_rank

    try:
        return ("ok", train_rank(ctx, cfg, callbacks))
    except ConsistencyError as exc:
        return detected_in_band(ctx, exc)
    except SyncTimeout as exc:  # the group timed out: no collective can run on it any more
        return ("detected", exc)


def detected_in_band(ctx: RankContext, exc: ConsistencyError) -> tuple[str, Any]:
    """The reply for a detection raised on every rank at once; the monitored barrier proves that
    every rank got out of the run (if one did not, it raises and the caller replaces the
    pool)."""
    if ctx.world_size > 1:
        dist.monitored_barrier(timeout=datetime.timedelta(seconds=10))
    return ("detected", exc)


def _late_rank_from_metrics(record: dict, step: int,
                            delay_ms: float) -> tuple[list[int], int | None]:
    """The late rank a strategy reported for ``step`` in its per-step metrics: the
    ``late_rank`` of every bucket (``sync.buckets[*]``; under the step guard one entry per
    step) whose arrival skew is at least half the injected delay — smaller skews are scheduler
    noise, not the fault."""
    steps = record.get("steps", [])
    if step >= len(steps):
        return [], None
    buckets = (steps[step].get("sync") or {}).get("buckets") or []
    hits = [b for b in buckets if b.get("skew_ms", 0.0) >= 0.5 * delay_ms
            and b.get("late_rank") is not None]
    if not hits:
        return [], None
    index = hits[0]["index"]  # None: the step guard's one ready time per rank and step
    return sorted({int(b["late_rank"]) for b in hits}), None if index is None else int(index)


def classify(strategy: str, spec: FaultSpec, world_size: int, *, reply: tuple | None = None,
             failure: BaseException | None = None, reference_digest: str | None = None,
             replica_check_every: int = 0, died: Sequence[int] = (),
             window: int | None = None) -> CaseOutcome:
    """What happened, from what the system surfaced (never from what the injector knows):
    the rank's reply (a record, or the detection it raised in-band), or the pool's failure.
    ``window``: the steps after the fault within which a detection is in time (default: the
    replica interval for a bit flip, otherwise the next step)."""
    out = CaseOutcome(strategy, _fault_label(spec), "no-effect",
                      expected_ranks=[spec.target_rank(world_size)],
                      expected_params=spec.target_params())
    detection: Any = None
    if failure is not None:
        detection = _from_failure(out, failure, died)
    elif reply is not None and reply[0] == "detected":
        detection = reply[1]
    elif reply is not None:
        _from_record(out, spec, world_size, reply[1] or {}, reference_digest)
    if detection is not None:
        _from_detection(out, detection)
    if window is None:
        window = max(1, replica_check_every) if spec.name == "bitflip" else 1
    _judge_attribution(out, spec, window)
    return out


def _from_failure(out: CaseOutcome, failure: BaseException, died: Sequence[int]) -> Any:
    """Fill ``out`` from a failed task; returns the check's own error when that is the cause."""
    cause = getattr(failure, "cause", None)
    if isinstance(cause, (ConsistencyError, SyncTimeout)):
        return cause
    if isinstance(failure, LaunchTimeout):
        out.outcome, out.kind, out.ranks = "hang-timeout", "LaunchTimeout", failure.ranks
        out.detail = str(failure)
    elif isinstance(failure, RankFailed):
        text = failure.summary
        timed_out = "timed out" in text.lower() or "timeout" in text.lower()
        out.outcome = "hang-timeout" if timed_out else "crash"
        out.kind, out.ranks, out.detail = text.split(":")[0], [failure.rank], text[:300]
        others = sorted(set(died) - {failure.rank})
        # the blamed rank reported (it has a traceback) and only saw its peer vanish; a silent
        # death is blamed with none, and a sibling's echo quoted in its summary says "by peer"
        if others and failure.traceback_text and "by peer" in text:
            out.kind, out.ranks = "peer died", others
            out.detail = f"rank {failure.rank}: {text[:200]}; ranks {others} exited first"
    else:
        out.outcome, out.kind, out.detail = "crash", type(failure).__name__, str(failure)
    return None


def _from_record(out: CaseOutcome, spec: FaultSpec, world_size: int, record: dict,
                 reference_digest: str | None) -> None:
    """Fill ``out`` from a finished run's record: an event naming the faulty rank, a late rank
    in the step metrics, or replicas that silently diverged."""
    events = record.get("events") or []
    relevant = [e for e in events if spec.target_rank(world_size) in (e.get("ranks") or [])]
    late, late_bucket = ([], None)
    if spec.name == "late-rank":
        late, late_bucket = _late_rank_from_metrics(
            record, spec.step, parse_duration_s(spec.resolved_value) * 1e3)
    if relevant:
        e = relevant[0]
        out.outcome, out.kind, out.step = "detected", e["kind"], e.get("step")
        out.ranks, out.bucket, out.params = e.get("ranks") or [], e.get("bucket"), \
            e.get("params") or []
        out.detail = e.get("detail", "")
    elif late:
        out.outcome, out.kind, out.step, out.ranks, out.bucket = \
            "detected", "late rank in step metrics", spec.step, late, late_bucket
    else:
        summary = record.get("summary", {})
        diverged = not summary.get("replicas_equal", True)
        differs = (reference_digest is not None
                   and summary.get("param_digest") != reference_digest)
        if diverged or differs:
            out.outcome = "silent-corruption"
            out.detail = ("replicas diverged" if diverged else "replicas equal") + \
                ("; result differs from the fault-free run" if differs else "")
        elif events:
            out.detail = f"{len(events)} event(s), none naming rank {out.expected_ranks}"


def _from_detection(out: CaseOutcome, detection: Any) -> None:
    out.outcome, out.kind = "detected", type(detection).__name__
    out.step = getattr(detection, "step", None)
    out.ranks = list(getattr(detection, "ranks", []) or [])
    out.bucket = getattr(detection, "bucket", None)
    out.params = list(getattr(detection, "params", []) or [])
    out.detail = str(detection)[:300]


def _judge_attribution(out: CaseOutcome, spec: FaultSpec, window: int) -> None:
    """A detection is attributed when it names the faulty rank and its parameter or bucket,
    and in time when it fired within ``window`` steps of the fault; a crash or hang is
    attributed when it names the faulty rank."""
    if out.outcome == "detected":
        rank_ok = set(out.expected_ranks) <= set(out.ranks)
        where_ok = (not out.expected_params or bool(set(out.params) & set(out.expected_params))
                    or out.bucket is not None)
        out.attributed = rank_ok and where_ok
        out.in_time = out.step is None or out.step <= spec.effective_step() + window
    elif out.outcome in ("crash", "hang-timeout"):
        out.attributed = set(out.expected_ranks) <= set(out.ranks)


def _fault_label(spec: FaultSpec) -> str:
    return spec.name + (f"={spec.value}" if spec.value else "")


class MatrixRunner:
    """Runs fault × strategy cases on reusable pools; group-killing faults get a fresh pool with
    short deadlines. ``get_pool(world_size)`` supplies the shared pool (the tests' ``pools``)."""

    def __init__(self, settings: MatrixSettings,
                 get_pool: Callable[[int], RankPool] | None = None) -> None:
        self.settings = settings
        self._own: RankPool | None = None
        self._get_pool = get_pool or self._own_pool
        self.references: dict[str, str] = {}
        self.spawns = 0

    def _own_pool(self, world_size: int) -> RankPool:
        if self._own is None or self._own.broken:
            self._own = self._fresh(self.settings.case_timeout_s, 60.0)
        return self._own

    def _fresh(self, timeout_s: float, pg_timeout_s: float) -> RankPool:
        self.spawns += 1
        return RankPool(LaunchConfig(self.settings.world_size, backend="gloo",
                                     timeout_s=timeout_s, pg_timeout_s=pg_timeout_s))

    def reference(self, strategy: str) -> str | None:
        """The fault-free run's parameter digest for ``strategy`` (computed once)."""
        if strategy not in self.references:
            pool = self._get_pool(self.settings.world_size)
            cfg = self.settings.train_config(strategy, None)
            reply = pool.run(case_task, cfg, timeout_s=self.settings.case_timeout_s)[0]
            if reply[0] != "ok":
                raise AssertionError(f"fault-free {strategy} run was not clean: {reply[1]}")
            self.references[strategy] = reply[1]["summary"]["param_digest"]
        return self.references[strategy]

    def run_case(self, strategy: str, fault: str) -> CaseOutcome:
        st = self.settings
        cfg = st.train_config(strategy, fault)
        spec = cfg.faults[0]
        reference = self.reference(strategy)
        t0 = time.perf_counter()
        fresh = kills_group(strategy, fault)
        # a fresh pool: gloo's short deadline ends a hang on the waiting rank; the pool's own
        # (the case's) is the last resort, long enough for a loaded box to reach the hang
        pool = self._fresh(st.case_timeout_s, st.pg_timeout_s) if fresh \
            else self._get_pool(st.world_size)
        reply, failure, died = play(pool, fresh, case_task, cfg, timeout_s=st.case_timeout_s)
        out = classify(strategy, spec, st.world_size, reply=reply, failure=failure,
                       reference_digest=reference, replica_check_every=st.replica_check_every,
                       died=died)
        out.wall_s = time.perf_counter() - t0
        return out

    def close(self) -> None:
        if self._own is not None:
            self._own.close()


def kills_group(strategy: str, fault: str) -> bool:
    """Whether a case leaves the process group unusable, so it must run on a fresh pool with
    short deadlines: a crash or a hang always; a bucket-cap mismatch under DDP makes gloo abort
    or wait on a size mismatch."""
    from openclaw_ref.core.faults import DDP_STRATEGIES

    return fault in GROUP_KILLING or (fault == "local-buckets"
                                       and strategy_name(strategy) in DDP_STRATEGIES)


def as_shipped(strategy: str) -> bool:
    """Whether ``strategy`` is run with no settings of ours: no sync at all, or DDP plus at
    most one of PyTorch's comm hooks (``sync.ddp.is_stock``)."""
    from openclaw_ref.arms.ddp import is_stock

    return strategy == "local" or is_stock(STRATEGIES.get(strategy_name(strategy)))


def strategy_name(column: str) -> str:
    """The registered strategy a matrix column runs (``hardened-bucket``,
    ``hardened-defaults``: ``hardened``)."""
    return "hardened" if column in (PER_BUCKET, DEFAULTS) else column


def column_settings(settings: MatrixSettings, columns: Sequence[str]) -> dict[str, dict]:
    """Per column, the settings it ran with and its strategy's defaults (``harden()``'s for
    the hardened columns), as JSON holds them: the figures a renderer marks a column from
    when the two differ."""
    return {c: {"sync": settings.sync_config(c).to_json(),
                "defaults": ArmConfig(name=strategy_name(c)).to_json()} for c in columns}


def matrix_strategies() -> tuple[str, ...]:
    """The matrix's columns that exist in this build (every one of ``MATRIX_STRATEGIES`` once
    all are registered)."""
    return tuple(s for s in MATRIX_STRATEGIES if strategy_name(s) in STRATEGIES)

__all__ = ["DEFAULTS", "FAULTS", "MATRIX_STRATEGIES", "OUTCOMES", "CaseOutcome", "MatrixRunner",
           "MatrixSettings", "case_task", "classify", "column_settings", "detected_in_band"]
