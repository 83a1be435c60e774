"""The conformance checks: one implementation of each, used by the pytest suite (``conformance/``)
and by the cluster mode (``openclaw-bench conform`` under torchrun).

Every check is a collective function ``check_xxx(ctx, settings) -> CheckResult`` that every rank
of a live process group calls; its verdict is computed from data gathered to *every* rank, so all
ranks agree on pass/fail (and the cluster mode exits with the same code everywhere).

Checks, named as users look for them:
  shape agreement      each rank's synchronized gradient manifest (names, shapes, dtypes, presence)
                       agrees every step, over the sparsity schedule;
  bucket alignment     per-rank bucket layouts (stock DDP's recorded through a comm hook) equal on
                       every rank every step — the seed's M3;
  overflow rate        on a high-dynamic-range gradient workload (max/min > 1e4, the seed's M4),
                       the fraction of gradient elements that are inf/NaN after the FP16 sync;
  replica consistency  parameters bitwise equal on every rank after every step;
  equivalence          N ranks end where one process on the same global batch ends;
  fault detection      each non-group-killing fault is detected, attributed to the right rank.

The recorders the checks train with live in ``recorders.py``; the cluster driver in
``cluster.py``. The fault × strategy matrix lives in ``conformance/fault_matrix.py``; the
DDP-option matrix (``harden()`` on a plain model against no-hook DDP) in
``experiments/ddp_option_matrix.py``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from openclaw_ref.arms.config import ArmConfig
from openclaw_ref.conformance.fault_matrix import case_task, classify
from openclaw_ref.conformance.recorders import (
    BucketLayouts,
    HighDynamicRange,
    ManifestRecorder,
    OverflowCounter,
    ReplicaDigests,
    observed_run,
)
from openclaw_ref.conformance.settings import SEED_OVERFLOW_RATE, CheckResult, ConformSettings
from openclaw_ref.conformance.tolerance import equivalence_atol
from openclaw_ref.core.collectives import gather
from openclaw_ref.core.faults import GROUP_KILLING, FaultSpec, parse_fault
from openclaw_ref.core.launch import RankContext
from openclaw_ref.sync.errors import ConsistencyError, ReplicaDivergence, ShapeMismatch, SyncTimeout
from openclaw_ref.sync.evidence.vote import majority


def compare_manifests(per_rank: Sequence[Sequence[tuple]], step: int) -> ShapeMismatch | None:
    """None if every rank's manifest is equal; else who lacks/differs on which parameters.
    A rank that lacks a gradient the majority has (or vice versa) is the disagreeing rank."""
    if all(m == per_rank[0] for m in per_rank):
        return None
    names = {e[0] for m in per_rank for e in m}
    by_name = [{e[0]: e[1:] for e in m} for m in per_rank]
    bad_params, bad_ranks = [], set()
    order = [e[0] for e in per_rank[0]]
    for name in order + sorted(names - set(order)):
        entries = [d.get(name) for d in by_name]
        odd = majority(entries).differing
        if odd:
            bad_params.append(name)
            bad_ranks.update(odd)
    orders = [tuple(e[0] for e in m) for m in per_rank]
    if not bad_params:  # same entries, different order
        bad_ranks.update(majority(orders).differing)
        bad_params = [a for a, b in zip(orders[0], orders[max(bad_ranks)]) if a != b]
    return ShapeMismatch("gradient manifests differ", step=step, ranks=sorted(bad_ranks),
                         params=bad_params)


def check_shape_agreement(ctx: RankContext, s: ConformSettings,
                          faults: tuple[FaultSpec, ...] = ()) -> CheckResult:
    """Synchronized gradient manifests agree on every rank at every step. Also measures how often
    the *local* (pre-sync) manifests disagree — the seed's C5 symptom, legitimate here because
    an expert with no sample on a rank has no local gradient."""
    cfg = s.train_config(ctx.world_size, faults)
    recorder = ManifestRecorder()
    error = _run_catching(lambda: observed_run(ctx, cfg, recorder), ctx)
    all_synced, all_local = zip(*gather(ctx, (recorder.synced, recorder.local_missing)))
    steps = min(len(x) for x in all_synced)
    first: ShapeMismatch | None = None
    agreeing = 0
    mismatches = []
    for step in range(steps):
        mismatch = compare_manifests([m[step] for m in all_synced], step)
        if mismatch is None:
            agreeing += 1
            continue
        first = first or mismatch
        mismatches.append({"step": step, "ranks": mismatch.ranks, "params": mismatch.params})
    local_disagree = sum(len({tuple(m[i]) for m in all_local}) > 1 for i in range(steps))
    figures = {"steps": steps, "agreeing_steps": agreeing,
               "local_manifest_disagreement_steps": local_disagree,
               "local_manifest_disagreement_rate": local_disagree / steps if steps else 0.0,
               "mismatches": mismatches}
    if error is not None:
        return _error_result("shape agreement", s.sync.name, error, figures)
    if first is not None:
        return CheckResult("shape agreement", s.sync.name, False, str(first), figures,
                           first.event().to_json())
    return CheckResult("shape agreement", s.sync.name, True,
                       f"synchronized gradient manifests equal on {ctx.world_size} ranks at all "
                       f"{steps} steps (local manifests differed at {local_disagree})", figures)


def check_bucket_alignment(ctx: RankContext, s: ConformSettings,
                           faults: tuple[FaultSpec, ...] = ()) -> CheckResult:
    """Every rank reduces the same parameters in the same bucket slot at every step (M3).
    Stock DDP is recorded through ``LayoutRecorder`` around its own hook; other strategies
    report their layout through ``bucket_layout()``."""
    cfg = s.train_config(ctx.world_size, faults)
    layouts = BucketLayouts()
    error = _run_catching(lambda: observed_run(ctx, cfg, layouts), ctx)
    per_rank = gather(ctx, layouts.layouts)
    steps = min(len(x) for x in per_rank)
    figures: dict = {"steps": steps,
                     "buckets": len(per_rank[0][0]) if steps and per_rank[0][0] else None,
                     "layout_rank0_step0": [[i, list(n)] for i, n in per_rank[0][0]]
                     if steps and per_rank[0][0] else None}
    if error is not None:
        return _error_result("bucket alignment", s.sync.name, error, figures)
    if steps and any(x[0] is None for x in per_rank):
        return CheckResult("bucket alignment", s.sync.name, False,
                           f"strategy {s.sync.name} exposes no bucket layout to check", figures)
    for step in range(steps):
        at = [x[step] for x in per_rank]
        odd = majority(at).differing
        if odd:
            ref = at[0] if odd[0] != 0 else at[-1]
            bad = at[odd[0]]
            bucket, params = _first_layout_difference(ref, bad)
            err = dict(kind="BucketMisalignment", step=step, ranks=odd, bucket=bucket,
                       params=params, detail="bucket layouts differ")
            figures["layouts_at_mismatch"] = {r: [[i, list(n)] for i, n in at[r]]
                                              for r in range(len(at))}
            return CheckResult("bucket alignment", s.sync.name, False,
                               f"BucketMisalignment at step {step}, bucket {bucket}, ranks {odd}",
                               figures, err)
    return CheckResult("bucket alignment", s.sync.name, True,
                       f"{figures['buckets']} bucket(s), identical on {ctx.world_size} ranks at "
                       f"all {steps} steps", figures)


def _first_layout_difference(a: tuple, b: tuple) -> tuple[int | None, list[str]]:
    for (ia, na), (ib, nb) in zip(a, b):
        if (ia, na) != (ib, nb):
            return ia, sorted(set(na) ^ set(nb)) or list(na)
    longer = a if len(a) > len(b) else b
    extra = longer[min(len(a), len(b))] if len(a) != len(b) else (None, ())
    return extra[0], list(extra[1])


def check_overflow_rate(ctx: RankContext, s: ConformSettings,
                        limit: float | None = SEED_OVERFLOW_RATE) -> CheckResult:
    """Fraction of gradient elements that are inf/NaN after the sync on the HDR workload, with
    the weights held fixed (no optimizer step, so one overflow cannot poison later steps).
    A strategy that counts its own wire overflows (``step_metrics()['overflow_elements']``) is
    taken at its word too; the larger of the two counts is reported."""
    cfg = s.train_config(ctx.world_size)
    counter = OverflowCounter()
    error = _run_catching(lambda: observed_run(ctx, cfg, HighDynamicRange(s), counter,
                                               apply_updates=False), ctx)
    per_rank = gather(ctx, counter.counts)
    c = per_rank[0]
    overflow = max(c["nonfinite"], c["reported"])
    rate = overflow / c["elements"] if c["elements"] else 0.0
    figures = {"elements": c["elements"], "overflow_elements": overflow,
               "nonfinite_after_sync": c["nonfinite"], "strategy_reported": c["reported"],
               "overflow_rate": rate, "skipped_steps": c["skipped"], "steps": cfg.steps,
               "wire": s.sync.harden.wire, "scale": s.sync.harden.scale, "limit": limit,
               "min_dynamic_range": min(r["ratio_min"] for r in per_rank),
               "hdr_loss_scale": s.hdr_loss_scale, "hdr_spread_decades": s.hdr_spread_decades}
    if error is not None:
        return _error_result("overflow rate", s.sync.name, error, figures)
    passed = limit is None or rate <= limit
    return CheckResult("overflow rate", s.sync.name, passed,
                       f"{rate:.4%} of {c['elements']} elements inf/NaN after sync"
                       + ("" if limit is None else f" (limit {limit:.3%})"), figures)


def check_replica_consistency(ctx: RankContext, s: ConformSettings,
                              faults: tuple[FaultSpec, ...] = ()) -> CheckResult:
    """Parameters bitwise equal on every rank after every optimizer step."""
    cfg = s.train_config(ctx.world_size, faults)
    recorder = ReplicaDigests()
    error = _run_catching(lambda: observed_run(ctx, cfg, recorder), ctx)
    names = recorder.names
    per_rank = gather(ctx, recorder.digests)
    steps = min(len(x) for x in per_rank)
    equal_steps = sum(len({x[i] for x in per_rank}) == 1 for i in range(steps))
    figures = {"steps": steps, "equal_steps": equal_steps}
    if error is not None:
        return _error_result("replica consistency", s.sync.name, error, figures)
    for step in range(steps):
        at = [x[step] for x in per_rank]
        odd = majority(at).differing
        if odd:
            params = [names[i] for i in range(len(names))
                      if len({a[i] for a in at}) > 1]
            err = ReplicaDivergence("parameters differ between replicas", step=step, ranks=odd,
                                    params=params)
            return CheckResult("replica consistency", s.sync.name, False, str(err), figures,
                               err.event().to_json())
    return CheckResult("replica consistency", s.sync.name, True,
                       f"bitwise equal on {ctx.world_size} ranks after each of {steps} steps",
                       figures)


def check_equivalence(ctx: RankContext, s: ConformSettings) -> CheckResult:
    """N ranks on global batch G end with the parameters one process gets on the same G.
    The reference runs on rank 0 itself (strategy ``local``, world size 1: no collective).
    Tolerance: max |Δparam| ≤ ``equivalence_atol`` (``tolerance.py``: by the wire dtype, and
    for PowerSGD a bound on what its error feedback still holds back). The optimizer is
    SGD: Adam divides by the running gradient magnitude, which turns a last-bit difference in a
    near-zero gradient into a full ``lr``-sized step and would measure Adam, not the sync."""
    cfg = dataclasses.replace(s.train_config(ctx.world_size), optimizer="sgd")
    model = observed_run(ctx, cfg)
    reference_max_diff = None
    if ctx.is_main:
        solo_ctx = RankContext(0, 1, 0, 1, ctx.backend, ctx.device, ctx.store)
        solo = observed_run(solo_ctx, dataclasses.replace(
            cfg, world_size=1, sync=ArmConfig(name="local")))
        diffs = [float((a.detach() - b.detach()).abs().max())
                 for a, b in zip(model.parameters(), solo.parameters())]
        reference_max_diff = max(diffs)
    max_diff = gather(ctx, reference_max_diff)[0]
    atol = equivalence_atol(s.sync, cfg.lr, cfg.steps)
    figures = {"max_abs_param_diff": max_diff, "atol": atol, "steps": cfg.steps,
               "world_size": ctx.world_size,
               "global_batch": cfg.global_batch}
    passed = max_diff is not None and max_diff <= atol
    return CheckResult("equivalence", s.sync.name, passed,
                       f"max |Δparam| vs 1 process = {max_diff:.3g} (atol {atol:g})", figures)


def check_fault_detection(ctx: RankContext, s: ConformSettings) -> list[CheckResult]:
    """Inject each fault of ``s.faults`` into a short run of the strategy on this very group and
    expect it detected, attributed to the faulty rank (and parameter/bucket) within one step."""
    results = []
    if ctx.world_size < 2:
        return [CheckResult("fault detection", s.sync.name, False,
                            "needs at least 2 ranks", {})]
    for text in s.faults:
        spec = parse_fault(text)
        if spec.name in GROUP_KILLING:
            continue
        spec = dataclasses.replace(spec, step=min(spec.step, s.train.steps - 2))
        cfg = s.train_config(ctx.world_size, (spec,))
        reply = case_task(ctx, cfg)
        reference = None
        outcome = classify(s.sync.name, spec, ctx.world_size, reply=reply,
                           reference_digest=reference,
                           replica_check_every=s.sync.replica_check_every)
        # rank 0 alone holds the run record (events of a non-fatal detection, e.g. a skipped
        # NaN step): its verdict is every rank's, so the job exits with one code everywhere
        outcome = gather(ctx, outcome)[0]
        results.append(CheckResult(f"fault detection: {text}", s.sync.name,
                                   outcome.outcome == "detected" and outcome.attributed,
                                   outcome.summary(), outcome.to_json()))
    return results


def _run_catching(fn: Callable[[], Any], ctx: RankContext | None = None) -> BaseException | None:
    """Run ``fn``; a detection it raises (on every rank at the same step) is returned instead.
    With ``ctx`` the lowest rank's error is returned on every rank, so verdicts agree (each rank
    names the bucket by its own members)."""
    error: BaseException | None = None
    try:
        fn()
    except (ConsistencyError, SyncTimeout) as exc:
        error = exc
    if ctx is not None and ctx.world_size > 1:
        error = next((e for e in gather(ctx, error) if e is not None), None)
    return error


def _error_result(check: str, strategy: str, exc: BaseException, figures: dict) -> CheckResult:
    event = exc.event().to_json() if hasattr(exc, "event") else None
    return CheckResult(check, strategy, False, f"the run stopped: {exc}", figures, event)
