"""The conformance checks that apply to any model, judged from ``RunRecord``s (the user's model
and comm hook, or stock DDP alone) — verdicts identical wherever they are computed, failures
naming the step, the ranks and the parameter or bucket as the openclaw checks do.

  equivalence          every rank ends each step where stock DDP ends it on the same shards,
                       seeds and DDP options (``oracle.equivalence_tolerance``: bit for bit at
                       2 ranks on the gradients' own dtype, else the wire's tolerance); per DDP
                       option set (``DDP_OPTION_SETS``). Parameters and buffers both.
  bucket average       what the hook returned for each bucket is the average of what the ranks
                       handed it (``averaging``), naming the rank whose contribution or result
                       is wrong;
  replica consistency  parameters bitwise equal on every rank after every step, and — where
                       DDP promises it (``broadcast_buffers``, its default) — the buffers each
                       step's first forward starts from;
  bucket layout        the buckets the user's hook saw are identical on every rank every step.
  shard invariance     (a property of the model, ``oracle.shard_invariance``) stock DDP against
                       one process on the global batch: reported, never a failure.

The pytest suite judges records the parent gathered from a rank pool (``oracle.TargetRuns``,
each run made once); ``check_*`` below are the same judges as rank tasks (cluster mode,
``openclaw-bench conform --model``): each rank runs stock DDP and the hook, compares its own
states locally and gathers only what the judges need.

The fault matrix on the same target is ``user_faults`` (run from the parent: a crash or a hang
ends the rank pool).
"""

from __future__ import annotations

import dataclasses

import torch

from openclaw_ref.conformance import averaging
from openclaw_ref.conformance.oracle import (
    STOCK_WRAPPER,
    Oracle,
    Runs,
    Tolerance,
    equivalence_tolerance,
    max_diff,
    shard_invariance,
)
from openclaw_ref.conformance.run_record import RunRecord
from openclaw_ref.conformance.settings import CheckResult
from openclaw_ref.conformance.target import FSDP_HARDEN, Target, TargetSpec, build_target
from openclaw_ref.conformance.user_record import StepDiff, compare_states, record_run
from openclaw_ref.conformance.user_run import USER_STRATEGY, LoopOptions
from openclaw_ref.core.collectives import gather
from openclaw_ref.core.faults import FaultSpec
from openclaw_ref.sync.base import Wire
from openclaw_ref.sync.errors import ReplicaDivergence
from openclaw_ref.sync.evidence.vote import majority

NO_BUFFER_BROADCAST = "broadcast_buffers=False"
DDP_OPTION_SETS: dict[str, LoopOptions] = {
    "default": LoopOptions(),
    "gradient_as_bucket_view": LoopOptions(ddp_options=(("gradient_as_bucket_view", True),)),
    "static_graph": LoopOptions(ddp_options=(("static_graph", True),)),
    "no_sync": LoopOptions(accumulate=2),
    "find_unused_parameters": LoopOptions(ddp_options=(("find_unused_parameters", True),)),
    NO_BUFFER_BROADCAST: LoopOptions(ddp_options=(("broadcast_buffers", False),)),
    "join": LoopOptions(uneven=1),  # the last rank runs one step fewer, under ddp.join()
}


def strategy_label(spec: TargetSpec) -> str:
    """The column a target's results are filed under: the hook's name, or the stock wrapper."""
    if spec.hook == FSDP_HARDEN:
        return f"harden() on {spec.wrapper}"
    return spec.hook or f"{USER_STRATEGY} ({STOCK_WRAPPER[spec.wrapper]})"


def options_for(option_set: str, bucket_cap_mb: float | None = None) -> LoopOptions:
    options = DDP_OPTION_SETS[option_set]
    return options if bucket_cap_mb is None else dataclasses.replace(
        options, bucket_cap_mb=bucket_cap_mb)


def set_label(option_set: str, bucket_cap_mb: float | None = None) -> str:
    return option_set if bucket_cap_mb is None else \
        f"{option_set}, bucket cap {bucket_cap_mb:g} MB"


def not_applicable(option_set: str, target: Target) -> str | None:
    """Why ``option_set`` says nothing on ``target`` (None: it applies)."""
    if option_set == "static_graph" and target.find_unused_parameters:
        return ("static_graph needs the same unused parameters every step; this target "
                "declares find_unused_parameters (its set may change)")
    if option_set == NO_BUFFER_BROADCAST and not list(target.module.buffers()):
        return "the model has no buffers: broadcast_buffers changes nothing"
    return None


def stopped(records: list[RunRecord]) -> RunRecord | None:
    return next((r for r in records if r.error is not None), None)


# --- the judges ------------------------------------------------------------------------------

def judge_equivalence(spec: TargetSpec, label: str, diffs: list[list[StepDiff]],
                      tolerance: Tolerance, noise: float,
                      error: RunRecord | None = None) -> CheckResult:
    """``diffs[r]``: rank r's hook run against stock DDP's, step by step (under ``join`` the
    last rank has fewer steps: each rank is judged on every step it ran)."""
    name = f"equivalence ({label})"
    steps = max((len(d) for d in diffs), default=0)
    figures = {"max_abs_diff": max_diff(diffs), "atol": tolerance.atol,
               "bitwise_required": tolerance.bitwise, "tolerance": tolerance.why,
               "oracle": STOCK_WRAPPER[spec.wrapper], "oracle_noise": noise,
               "wire": str(spec.wire), "wrapper": spec.wrapper,
               "steps": steps, "ddp_options": label,
               "per_rank": [max((d.diff for d in x), default=0.0) for x in diffs]}
    if error is not None:
        return CheckResult(name, strategy_label(spec), False,
                           f"the run stopped on rank {error.rank}: {error.error_text}",
                           figures, error.error)
    for step in range(steps):
        bad = [r for r, x in enumerate(diffs) if step < len(x) and tolerance.exceeded(x[step])]
        if bad:
            worst = max((diffs[r][step] for r in bad), key=lambda d: (d.diff, d.name))
            bound = "bit for bit" if tolerance.bitwise else f"within {tolerance.atol:g}"
            return CheckResult(
                name, strategy_label(spec), False,
                f"ranks {bad} differ from {STOCK_WRAPPER[spec.wrapper]} after step {step}: "
                f"max |Δ| "
                f"{worst.diff:.3g} in {worst.name!r} (required: {bound}, wire {spec.wire})",
                figures, {"kind": "NotEquivalent", "step": step, "ranks": bad,
                          "params": [worst.name]})
    if tolerance.bitwise:
        detail = (f"bit for bit equal to {STOCK_WRAPPER[spec.wrapper]} on {len(diffs)} ranks "
                  f"after each of {steps} steps")
    else:
        detail = (f"within {tolerance.atol:g} of {STOCK_WRAPPER[spec.wrapper]} on {len(diffs)} "
                  f"ranks (max |Δ| {figures['max_abs_diff']:.3g}; {tolerance.why})")
    return CheckResult(name, strategy_label(spec), True, detail, figures)


def judge_replicas(spec: TargetSpec, records: list[RunRecord],
                   broadcast_buffers: bool = True) -> CheckResult:
    """Parameters after every step, and (where DDP broadcasts them) the buffers each step's
    first forward starts from, equal on every rank."""
    name = "replica consistency"
    steps = min(len(r.param_digests) for r in records)
    figures = {"steps": steps, "buffers_compared": broadcast_buffers}
    error = stopped(records)
    if error is not None:
        return CheckResult(name, strategy_label(spec), False,
                           f"the run stopped: {error.error_text}", figures, error.error)
    names = records[0].param_names
    for step in range(steps):
        at = [r.param_digests[step] for r in records]
        odd = majority(at).differing
        if odd:
            params = [n for i, n in enumerate(names) if len({a[i] for a in at}) > 1]
            err = ReplicaDivergence("parameters differ between replicas", step=step,
                                    ranks=odd, params=params)
            return CheckResult(name, strategy_label(spec), False, str(err), figures,
                               err.event().to_json())
    forwards = min(len(r.step_buffers) for r in records)
    if broadcast_buffers:
        for i in range(forwards):
            odd = majority([r.step_buffers[i] for r in records]).differing
            if odd:
                return CheckResult(name, strategy_label(spec), False,
                                   f"buffers differ between replicas at the start of step {i}'s "
                                   f"forward (DDP broadcasts rank 0's): ranks {odd}", figures,
                                   {"kind": "BufferDivergence", "step": i, "ranks": odd})
    buffers = (f"; the buffers each step's forward starts from equal too ({forwards} steps)"
               if broadcast_buffers and forwards else "")
    return CheckResult(name, strategy_label(spec), True, f"parameters bitwise equal on "
                       f"{len(records)} ranks after each of {steps} steps{buffers}", figures)


def not_observed(check: str, spec: TargetSpec) -> CheckResult:
    """The row of a hook-only check on stock DDP: nothing to observe, said so (not a pass)."""
    return CheckResult(check, strategy_label(spec), True, "skipped: no comm hook — stock DDP's "
                       "own reduction is the oracle itself", {"outcome": "skipped"})


def judge_layout(spec: TargetSpec, records: list[RunRecord]) -> CheckResult:
    name = "bucket layout"
    if not records[0].hooked:
        return not_observed(name, spec)
    steps = min(len(r.layouts) for r in records)
    figures = {"steps": steps, "buckets": len(records[0].layouts[-1]) if steps else 0}
    for step in range(steps):
        odd = majority([r.layouts[step] for r in records]).differing
        if odd:
            return CheckResult(name, strategy_label(spec), False,
                               f"BucketMisalignment at step {step}, ranks {odd}", figures,
                               {"kind": "BucketMisalignment", "step": step, "ranks": odd})
    return CheckResult(name, strategy_label(spec), True,
                       f"{figures['buckets']} bucket(s), identical on {len(records)} ranks at "
                       f"all {steps} steps", figures)


def judge_average(spec: TargetSpec, records: list[RunRecord]) -> CheckResult:
    name = "bucket average"
    if not records[0].hooked:
        return not_observed(name, spec)
    error = stopped(records)
    if error is not None:
        return CheckResult(name, strategy_label(spec), False,
                           f"the run stopped: {error.error_text}", {}, error.error)
    fault, checked = averaging.first_fault([r.buckets for r in records], Wire(spec.wire))
    figures = {"buckets_checked": checked, "steps": min(len(r.buckets) for r in records)}
    if fault is not None:
        figures.update(error=fault.error, bound=fault.bound, weights=fault.weights)
        return CheckResult(name, strategy_label(spec), False,
                           f"step {fault.step}, bucket {fault.bucket}: {fault.detail} (max "
                           f"|y − ȳ| {fault.error:.3g} > {fault.bound:.3g})", figures,
                           {"kind": "BucketNotAveraged", "step": fault.step,
                            "bucket": fault.bucket, "ranks": fault.ranks})
    return CheckResult(name, strategy_label(spec), True,
                       f"each of {checked} bucket(s) came back as the average of the ranks' "
                       f"buckets, on every rank", figures)


def equivalence_from(spec: TargetSpec, label: str, oracle: Oracle, runs: Runs) -> CheckResult:
    """The equivalence row from records gathered in the parent (``oracle.TargetRuns``); the
    caller skips an option set where stock DDP itself failed (``oracle.error``)."""
    if runs.records is None:
        return run_failed(f"equivalence ({label})", spec, runs)
    diffs = [compare_states(h.states, o.states) for h, o in zip(runs.records, oracle.runs)]
    noise = max_diff(oracle.noise())
    tolerance = equivalence_tolerance(Wire(spec.wire), spec.world_size, oracle.fp32_grads(),
                                      noise, same_collectives=spec.wrapper != "ddp")
    return judge_equivalence(spec, label, diffs, tolerance, noise, stopped(runs.records))


def run_failed(check: str, spec: TargetSpec, runs: Runs) -> CheckResult:
    """A row for a run that never finished (the pool named the rank)."""
    return CheckResult(check, strategy_label(spec), False, f"the run stopped: {runs.failure}",
                       {}, {"kind": "RunFailed"})


# --- the same judges as rank tasks (cluster mode and single checks) --------------------------

def _local_equivalence(ctx, spec: TargetSpec, options: LoopOptions, runs: RunRecord,
                       one_process: bool = False) -> tuple[list[list[StepDiff]],
                                                           list[list[StepDiff]], Tolerance,
                                                           RunRecord]:
    """Stock DDP on this rank's group (with ``one_process``, rank 0 also one process) — twice
    where a hook is judged, once where ``runs`` already is stock DDP — compared here with this
    rank's ``runs``; only the per-step differences are gathered."""
    stock = dataclasses.replace(spec, hook=None, wire="native")
    reference = record_run(ctx, stock, options, one_process=one_process)
    again = record_run(ctx, stock, options) if spec.hook is not None else runs
    diffs = gather(ctx, compare_states(runs.states, reference.states))
    noise = gather(ctx, compare_states(again.states, reference.states))
    fp32 = all(reference.start[n].dtype == torch.float32 for n in reference.param_names)
    tolerance = equivalence_tolerance(Wire(spec.wire), ctx.world_size, fp32, max_diff(noise))
    return diffs, noise, tolerance, reference


def check_equivalence(ctx, spec: TargetSpec, option_set: str = "default",
                      bucket_cap_mb: float | None = None) -> CheckResult:
    """A rank task: the hook's run against stock DDP under ``option_set`` (a
    ``bucket_cap_mb`` replaces the option set's 25 MB). Without a hook, stock DDP is judged
    against a second run of itself: whether the oracle reproduces its own bits."""
    options = options_for(option_set, bucket_cap_mb)
    runs = record_run(ctx, spec, options)
    diffs, noise, tolerance, _ = _local_equivalence(ctx, spec, options, runs)
    error = stopped(gather(ctx, runs.light()))
    return judge_equivalence(spec, set_label(option_set, bucket_cap_mb), diffs, tolerance,
                             max_diff(noise), error)


def check_replica_consistency(ctx, spec: TargetSpec,
                              faults: tuple[FaultSpec, ...] = ()) -> CheckResult:
    """A rank task: parameters (and broadcast buffers) equal on every rank after every step."""
    records = gather(ctx, record_run(ctx, spec, LoopOptions(), faults).light())
    return judge_replicas(spec, records)


def check_bucket_layout(ctx, spec: TargetSpec, faults: tuple[FaultSpec, ...] = (),
                        bucket_cap_mb: float = LoopOptions.bucket_cap_mb) -> CheckResult:
    """A rank task: the buckets the hook was called with (parameter names), identical on every
    rank at every step."""
    options = LoopOptions(bucket_cap_mb=bucket_cap_mb)
    records = gather(ctx, record_run(ctx, spec, options, faults).light())
    return judge_layout(spec, records)


def run_user_checks(ctx, spec: TargetSpec) -> list[dict]:
    """``openclaw-bench conform --model/--hook`` on one rank: the model's shard invariance,
    then every model-agnostic check but the faults (the DDP option sets the target supports),
    results as JSON (same on all ranks)."""
    target = build_target(spec.factory)
    results: list[CheckResult] = []
    for option_set in DDP_OPTION_SETS:
        if not_applicable(option_set, target):
            continue
        options = DDP_OPTION_SETS[option_set]
        runs = record_run(ctx, spec, options)
        diffs, noise, tolerance, reference = _local_equivalence(
            ctx, spec, options, runs, one_process=option_set == "default")
        light = gather(ctx, runs.light())
        if option_set == "default":
            results.append(gather(ctx, shard_invariance(reference, ctx.world_size, spec.factory)
                                  if ctx.rank == 0 else None)[0])
        results.append(judge_equivalence(spec, option_set, diffs, tolerance, max_diff(noise),
                                         stopped(light)))
        if option_set == "default" and runs.hooked:
            results += [judge_average(spec, light), judge_layout(spec, light)]
        if not options.uneven:
            results.append(dataclasses.replace(
                judge_replicas(spec, light, options.ddp_option("broadcast_buffers", True)),
                check=f"replica consistency ({option_set})"))
    return [r.to_json() for r in results]
