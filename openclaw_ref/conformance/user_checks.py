"""The conformance checks that apply to any model: run on a ``TargetSpec`` (the user's model and
comm hook, or the openclaw model under stock DDP) on a live group, verdicts identical on every
rank, failures naming the step, the ranks and the parameter or bucket as the openclaw checks do.

  equivalence          N ranks end where one process ends on the concatenated global batch
                       (max |Δparam| ≤ WIRE_ATOL[wire]); per DDP option set (``DDP_OPTION
                       SETS``: default, gradient-as-bucket-view, static graph, no_sync, unused
                       parameters, join: the last rank one step short under ``ddp.join()``);
  replica consistency  parameters bitwise equal on every rank after every step;
  bucket layout        the buckets the user's hook saw are identical on every rank every step.

The fault matrix on the same target is ``user_faults`` (run from the parent: a crash or a hang
ends the rank pool).

Checks that need the openclaw model (gating sparsity, the overflow workload, the bucketed
engine) stay in ``checks.py`` and skip on other models.
"""

from __future__ import annotations

import dataclasses

from openclaw_ref.conformance.recorders import ReplicaDigests
from openclaw_ref.conformance.settings import CheckResult
from openclaw_ref.conformance.target import TargetSpec
from openclaw_ref.conformance.tolerance import WIRE_ATOL
from openclaw_ref.conformance.user_run import (
    USER_STRATEGY,
    Layouts,
    LoopOptions,
    train_reference,
    train_target,
)
from openclaw_ref.core.collectives import gather
from openclaw_ref.core.faults import FaultSpec
from openclaw_ref.sync.base import Wire
from openclaw_ref.sync.errors import ConsistencyError, ReplicaDivergence
from openclaw_ref.sync.vote import plurality

DDP_OPTION_SETS: dict[str, LoopOptions] = {
    "default": LoopOptions(),
    "gradient_as_bucket_view": LoopOptions(ddp_options=(("gradient_as_bucket_view", True),)),
    "static_graph": LoopOptions(ddp_options=(("static_graph", True),)),
    "no_sync": LoopOptions(accumulate=2),
    "find_unused_parameters": LoopOptions(ddp_options=(("find_unused_parameters", True),)),
    "join": LoopOptions(uneven=1),  # the last rank runs one step fewer, under ddp.join()
}


def strategy_label(spec: TargetSpec) -> str:
    """The column a target's results are filed under: the hook's name, or stock DDP."""
    return spec.hook or f"{USER_STRATEGY} (stock DDP)"


def check_equivalence(ctx, spec: TargetSpec, option_set: str = "default",
                      bucket_cap_mb: float | None = None) -> CheckResult:
    """Every rank's parameters after the run against one process on the same global batches;
    each rank computes the reference itself from the parameters DDP started from. A
    ``bucket_cap_mb`` replaces the option set's (25 MB, DDP's default)."""
    options = DDP_OPTION_SETS[option_set]
    if bucket_cap_mb is not None:
        options = dataclasses.replace(options, bucket_cap_mb=bucket_cap_mb)
        option_set = f"{option_set}, bucket cap {bucket_cap_mb:g} MB"
    model, start = train_target(ctx, spec, options)
    reference = dict(train_reference(spec, options, ctx.world_size, start).named_parameters())
    worst = max(((float((p.detach() - reference[n].detach()).abs().max()), n)
                 for n, p in model.named_parameters()), default=(0.0, ""))
    per_rank = gather(ctx, worst)
    atol = WIRE_ATOL[Wire(spec.wire)]
    bad = [r for r, (diff, _) in enumerate(per_rank) if not diff <= atol]
    diff, param = max(per_rank)
    figures = {"max_abs_param_diff": diff, "per_rank": [d for d, _ in per_rank], "atol": atol,
               "wire": str(spec.wire), "steps": options.steps, "ddp_options": option_set}
    name = f"equivalence ({option_set})"
    if bad:
        first = per_rank[bad[0]][1]
        return CheckResult(name, strategy_label(spec), False,
                           f"ranks {bad} differ from one process on the same global batch: max "
                           f"|Δparam| {diff:.3g} in {first!r} (tolerance {atol:g}, wire "
                           f"{spec.wire})", figures,
                           {"kind": "NotEquivalent", "ranks": bad, "params": [first]})
    return CheckResult(name, strategy_label(spec), True,
                       f"{ctx.world_size} ranks equal one process within {atol:g} (max |Δ| "
                       f"{diff:.3g} in {param!r})", figures)


def check_replica_consistency(ctx, spec: TargetSpec,
                              faults: tuple[FaultSpec, ...] = ()) -> CheckResult:
    """Parameters bitwise equal on every rank after every optimizer step."""
    digests = ReplicaDigests()
    options = LoopOptions()
    error = _catching(lambda: train_target(ctx, spec, options, faults, [digests]))
    per_rank = gather(ctx, digests.digests)
    steps = min(len(x) for x in per_rank)
    figures = {"steps": steps}
    if error is not None:
        return CheckResult("replica consistency", strategy_label(spec), False,
                           f"the run stopped: {error}", figures, error.event().to_json())
    for step in range(steps):
        at = [x[step] for x in per_rank]
        odd = plurality(at).differing
        if odd:
            params = [n for i, n in enumerate(digests.names) if len({a[i] for a in at}) > 1]
            err = ReplicaDivergence("parameters differ between replicas", step=step, ranks=odd,
                                    params=params)
            return CheckResult("replica consistency", strategy_label(spec), False, str(err),
                               figures, err.event().to_json())
    return CheckResult("replica consistency", strategy_label(spec), True,
                       f"bitwise equal on {ctx.world_size} ranks after each of {steps} steps",
                       figures)


def check_bucket_layout(ctx, spec: TargetSpec, faults: tuple[FaultSpec, ...] = (),
                        bucket_cap_mb: float = LoopOptions.bucket_cap_mb) -> CheckResult:
    """The buckets the hook was called with (parameter names), identical on every rank at
    every step."""
    layouts = Layouts()
    train_target(ctx, spec, LoopOptions(bucket_cap_mb=bucket_cap_mb), faults, [layouts])
    per_rank = gather(ctx, layouts.layouts)
    steps = min(len(x) for x in per_rank)
    figures = {"steps": steps, "buckets": len(per_rank[0][-1]) if steps else 0}
    for step in range(steps):
        at = [x[step] for x in per_rank]
        odd = plurality(at).differing
        if odd:
            return CheckResult("bucket layout", strategy_label(spec), False,
                               f"BucketMisalignment at step {step}, ranks {odd}", figures,
                               {"kind": "BucketMisalignment", "step": step, "ranks": odd})
    return CheckResult("bucket layout", strategy_label(spec), True,
                       f"{figures['buckets']} bucket(s), identical on {ctx.world_size} ranks at "
                       f"all {steps} steps", figures)


def _catching(fn) -> ConsistencyError | None:
    try:
        fn()
    except ConsistencyError as exc:
        return exc
    return None


def run_user_checks(ctx, spec: TargetSpec) -> list[dict]:
    """``openclaw-bench conform --model/--hook`` on one rank: every model-agnostic check but the
    faults (the DDP option sets the target supports), results as JSON (same on all ranks)."""
    from openclaw_ref.conformance.target import build_target

    target = build_target(spec.factory)
    sets = [n for n in DDP_OPTION_SETS
            if not (n == "static_graph" and target.find_unused_parameters)]
    results = [check_equivalence(ctx, spec, n) for n in sets]
    results += [check_replica_consistency(ctx, spec), check_bucket_layout(ctx, spec)]
    return [r.to_json() for r in results]
