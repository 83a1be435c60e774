"""Every check of ``harden()`` fires on its injected fault, naming the right rank, step and (under
the per-bucket guard) bucket — identically on every rank — and stays silent without one. The
pre-scale faults belong to the per-bucket guard (``guard="bucket"``), the only one that
pre-scales; everything else runs under the default step guard."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F

from openclaw_ref.arms.config import ArmConfig
from openclaw_ref.arms.ddp import wrap_ddp
from openclaw_ref.core.data import DataConfig, SkillDataset, rank_batch
from openclaw_ref.core.errors import RankFailed
from openclaw_ref.core.launch import LaunchConfig, RankPool
from openclaw_ref.core.model import build_model, preset
from openclaw_ref.sync.errors import (
    BucketMisalignment,
    ClockMismatch,
    ConsistencyError,
    NonFiniteGradient,
    ParameterMismatch,
    ReplicaDivergence,
    ScaleMismatch,
    SyncTimeout,
)
from openclaw_ref.sync.hardening import harden

WATCHED = "layer.3.attn.v_proj.weight"  # the seed's C2 parameter


@dataclass(frozen=True)
class Fault:
    """A test-only fault on one rank: ``clock`` (logical clock one ahead from ``step``),
    ``swap`` (experts 0 and 1 of layer 0 registered in swapped order), ``nan`` / ``huge`` (a
    gradient multiplied by NaN / 1e9 at ``step``), ``perturb`` (a weight nudged after ``step``),
    ``sleep`` (stall before backward at ``step``), ``clip`` (gradients clipped on this rank
    only at ``step``, as in BLOOM-176B / DeepSpeed#1801), ``cap`` (half the bucket cap on one rank),
    ``scale`` (the rank pre-scales by 2^``exponent`` from the start: the seed's M4)."""

    kind: str = "none"
    rank: int = 1
    step: int = 1
    exponent: int = 0


def _swap_registration(model) -> None:
    """Register experts 0 and 1 of layer 0 in swapped order: every shape by index is unchanged
    (DDP's own check passes), but each name now sits at the other's index."""
    experts = model.layer[0].ffn.experts
    mods = experts._modules
    order = ["1", "0"] + [k for k in mods if k not in ("0", "1")]
    experts._modules = type(mods)((k, mods[k]) for k in order)


def _unchecked(*args, **kwargs) -> None:
    """A start-up check that finds nothing."""


def run_with_fault(ctx, sync: ArmConfig, fault: Fault, steps: int = 3,
                   check_construction: bool = True) -> dict:
    """A plain DDP training loop with ``harden``; returns what each rank saw (never raises a
    ConsistencyError, so the pool stays usable). ``check_construction=False``: the start-up
    check is stubbed out, to show what the in-band checks catch alone."""
    import time
    from unittest import mock

    from openclaw_ref.sync.evidence import checks

    cfg = preset("tiny")
    ds = SkillDataset(cfg, DataConfig())
    model = build_model(cfg)
    mine = fault.rank == ctx.rank
    if fault.kind == "swap" and mine:
        _swap_registration(model)
    seen: dict = {"error": None, "applied": [], "metrics": [], "summary": None, "events": []}
    state = None
    if fault.kind == "cap" and mine:
        sync = dataclasses.replace(sync, bucket_cap_mb=sync.bucket_cap_mb / 2)
    try:
        ddp = wrap_ddp(model, ctx, sync)
        with mock.patch.object(checks, "construction_check",
                               checks.construction_check if check_construction else _unchecked):
            state = harden(ddp, sync.harden, ctx)
        if fault.kind == "scale" and mine:
            state.policy.override(ctx.rank, fault.exponent)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        watched = dict(model.named_parameters())[WATCHED]
        for step in range(steps):
            ahead = fault.kind == "clock" and mine and step >= fault.step
            state.begin_step(step + 1 if ahead else step)
            batch = rank_batch(ds, step, 8, ctx.rank, ctx.world_size)
            loss = F.cross_entropy(ddp(batch.tokens, batch.sample_ids, step), batch.labels)
            handle = None
            if mine and step == fault.step and fault.kind in ("nan", "huge"):
                factor = float("nan") if fault.kind == "nan" else 1e9
                handle = watched.register_hook(lambda g, factor=factor: g * factor)
            if mine and step == fault.step and fault.kind == "sleep":
                time.sleep(5.0)
            loss.backward()
            if handle is not None:
                handle.remove()
            applied = state.finish_step(step)
            seen["applied"].append(applied)
            seen["metrics"].append(state.step_metrics())
            if mine and step == fault.step and fault.kind == "clip":
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1e-3)
            if applied:
                opt.step()
            opt.zero_grad(set_to_none=True)
            if mine and step == fault.step and fault.kind == "perturb":
                with torch.no_grad():
                    watched.add_(1e-3)
        seen["summary"] = state.summary()
        seen["events"] = list(state.events)
    except ConsistencyError as exc:
        seen["error"] = exc
    finally:
        if state is not None:
            state.close()
    return seen


def _same_error_everywhere(results: list[dict], kind: type) -> ConsistencyError:
    errors = [r["error"] for r in results]
    assert all(isinstance(e, kind) for e in errors), errors
    first = errors[0]
    for e in errors[1:]:
        assert (e.step, e.ranks, e.bucket) == (first.step, first.ranks, first.bucket)
    return first


def test_no_fault_no_alarm(pools):
    results = pools.get(2).run(run_with_fault, ArmConfig.of("hardened", wire="fp16"), Fault())
    assert all(r["error"] is None and r["applied"] == [True] * 3 for r in results)
    assert results[0]["summary"]["checks_run"] == results[0]["summary"]["checks_passed"] > 3


# two ranks that disagree and no majority: both are suspects (``vote.majority``)
TWO_SUSPECTS = [0, 1]


@pytest.mark.parametrize("guard", ["step", "bucket"])
def test_a_rank_whose_clock_runs_ahead_raises_clock_mismatch(pools, guard):
    results = pools.get(2).run(run_with_fault, ArmConfig.of("hardened", guard=guard),
                               Fault("clock", 1, 1))
    err = _same_error_everywhere(results, ClockMismatch)
    assert err.ranks == TWO_SUSPECTS and err.step == 1
    assert (err.bucket is None) == (guard == "step")  # the step guard names no bucket
    # two ranks: neither is "the odd one out"; the message gives both clocks
    assert "no majority" in str(err) and "most" not in str(err)
    assert "rank 0: step 1" in str(err) and "rank 1: step 2" in str(err)


def test_the_seeds_scale_mismatch_is_caught_naming_the_rank(pools):
    sync = ArmConfig.of("hardened", wire="fp16", scale="4096", guard="bucket")
    results = pools.get(4).run(run_with_fault, sync, Fault("scale", 3, exponent=10))  # 2^12 vs 2^10
    err = _same_error_everywhere(results, ScaleMismatch)
    assert err.ranks == [3] and err.step == 0


def test_scale_mismatch_is_caught_on_the_fp32_wire_too(pools):
    sync = ArmConfig.of("hardened", wire="fp32", guard="bucket")
    results = pools.get(2).run(run_with_fault, sync, Fault("scale", 1, exponent=3))
    err = _same_error_everywhere(results, ScaleMismatch)
    assert err.ranks == TWO_SUSPECTS


def test_swapped_same_shaped_parameters_fail_the_construction_check(pools):
    results = pools.get(2).run(run_with_fault, ArmConfig.of("hardened"), Fault("swap", 1))
    err = _same_error_everywhere(results, ParameterMismatch)
    assert err.ranks == TWO_SUSPECTS
    assert "layer.0.ffn.experts.0.w1.weight" in err.params


def test_swapped_parameters_that_ddp_accepts_are_caught_in_band_as_misalignment(pools):
    results = pools.get(2).run(run_with_fault, ArmConfig.of("hardened", bucket_cap_mb=0.01),
                               Fault("swap", 1), 3, False)
    err = _same_error_everywhere(results, BucketMisalignment)
    assert err.ranks == TWO_SUSPECTS and err.step == 0
    assert any(p.startswith("layer.0.ffn.experts.") for p in err.params)


def test_a_rank_with_another_bucket_cap_is_named_at_construction_not_aborted_by_gloo(pools):
    results = pools.get(2).run(run_with_fault, ArmConfig.of("hardened", bucket_cap_mb=0.02),
                               Fault("cap", 1))
    err = _same_error_everywhere(results, BucketMisalignment)
    assert err.ranks == TWO_SUSPECTS and err.step is None


def test_a_nan_gradient_under_the_raise_policy_raises_non_finite_naming_the_rank(pools):
    sync = ArmConfig.of("hardened", wire="fp16", nonfinite="raise")
    results = pools.get(2).run(run_with_fault, sync, Fault("nan", 1, 1))
    err = _same_error_everywhere(results, NonFiniteGradient)
    assert err.ranks == [1] and err.step == 1


def test_a_nan_gradient_under_the_skip_policy_skips_the_step_everywhere_and_names_the_rank(
        pools):
    results = pools.get(2).run(run_with_fault, ArmConfig.of("hardened", wire="fp16"),
                               Fault("nan", 1, 1))
    for r in results:
        assert r["error"] is None
        assert r["applied"] == [True, False, True]
        kinds = {(e.kind, e.step, tuple(e.ranks)) for e in r["events"]}
        assert kinds == {("NonFiniteGradient", 1, (1,))}


def test_a_finite_gradient_that_overflows_only_under_the_pre_scale_is_not_a_local_nan(pools):
    sync = ArmConfig.of("hardened", wire="fp16", scale="4096", nonfinite="raise", guard="bucket")
    results = pools.get(2).run(run_with_fault, sync, Fault("huge", 1, 1))
    for r in results:
        assert r["error"] is None  # 1e9-scaled but finite: an overflow, skipped, not fatal
        assert r["applied"] == [True, False, True]
        # no NonFiniteGradient: only the wire overflowed; finish_step told every rank to skip
        assert r["events"] == []


def test_an_fp16_wire_overflow_under_the_step_guard_skips_the_step_on_every_rank(pools):
    """DDP's own fp16 wire (its C++ hook) overflows on rank 1's 1e9-scaled but finite
    gradients: no rank's own gradient was non-finite, the reduced ones are, and every rank
    skips that step."""
    sync = ArmConfig.of("hardened", wire="fp16", nonfinite="raise")
    results = pools.get(2).run(run_with_fault, sync, Fault("huge", 1, 1))
    for r in results:
        assert r["error"] is None and r["events"] == []
        assert r["applied"] == [True, False, True]
        assert r["metrics"][1]["overflowed"] and r["metrics"][1]["overflow_elements"] > 0
        assert r["summary"]["skipped_steps"] == 1


def test_a_wire_overflow_skips_the_step_on_every_rank_and_backs_off_the_scale(pools):
    sync = ArmConfig.of("hardened", wire="fp16", scale="auto", guard="bucket")
    results = pools.get(2).run(run_with_fault, sync, Fault("huge", 1, 1))
    for r in results:
        assert r["error"] is None
        assert r["applied"] == [True, False, True]
        assert r["metrics"][1]["overflowed"] and r["metrics"][1]["overflow_elements"] > 0
        assert r["metrics"][2]["scale_exp"] == r["metrics"][1]["scale_exp"] - 1
        assert r["summary"]["skipped_steps"] == 1
        assert 0 < r["summary"]["overflow_rate_elements"] < 1


def test_a_weight_nudged_after_the_optimizer_step_is_named_at_the_next_step_with_k_1(pools):
    sync = ArmConfig.of("hardened", replica_slices=1)
    results = pools.get(2).run(run_with_fault, sync, Fault("perturb", 1, 1))
    err = _same_error_everywhere(results, ReplicaDivergence)
    assert err.ranks == TWO_SUSPECTS and err.step == 2 and err.params == [WATCHED]


def test_a_weight_nudged_after_the_optimizer_step_is_named_within_k_steps_by_default(pools):
    k = ArmConfig.of("hardened").harden.replica_slices
    results = pools.get(2).run(run_with_fault, ArmConfig.of("hardened"), Fault("perturb", 1, 1),
                               2 + k)
    err = _same_error_everywhere(results, ReplicaDivergence)
    assert err.ranks == TWO_SUSPECTS and 2 <= err.step <= 1 + k and err.params == [WATCHED]


@pytest.mark.parametrize("k", [1, None], ids=["K=1", "default K"])
def test_gradient_clipping_on_one_rank_only_is_named_within_k_steps(pools, k):
    sync = ArmConfig.of("hardened") if k is None else ArmConfig.of("hardened", replica_slices=k)
    window = sync.harden.replica_slices
    results = pools.get(2).run(run_with_fault, sync, Fault("clip", 1, 1), 2 + window)
    err = _same_error_everywhere(results, ReplicaDivergence)
    assert err.ranks == TWO_SUSPECTS and 2 <= err.step <= 1 + window and err.params
    assert "first differing parameter " + err.params[0] in str(err)


def test_replica_digests_ride_every_step_and_stay_silent_without_a_fault(pools):
    results = pools.get(2).run(run_with_fault, ArmConfig.of("hardened", replica_slices=2),
                               Fault(), 4)
    assert all(r["error"] is None for r in results)
    assert results[0]["summary"]["replica_checks"] == 4


def test_a_stalled_rank_is_named_by_the_watchdog_with_exit_code_4():
    sync = ArmConfig.of("hardened", watchdog_s=0.5, watchdog_action="exit")
    with RankPool(LaunchConfig(2, backend="gloo", pg_timeout_s=30.0, timeout_s=60)) as pool:
        with pytest.raises(RankFailed) as err:
            pool.run(run_with_fault, sync, Fault("sleep", 1, 1))
    assert err.value.rank == 0
    assert isinstance(err.value.cause, SyncTimeout)
    assert err.value.cause.ranks == [1] and err.value.cause.step == 1
    assert err.value.exit_code == 4
