"""The false-alarm corpus (``experiments.false_alarms``): ``harden()`` at its defaults neither
stops nor changes a healthy job — activation checkpointing (reentrant and not, with and without
``static_graph``), a rank-0 pause longer than the watchdog deadline, GradScaler with the fp16
wire, a wire overflow in the plain loop — and names a real disagreement without inventing a
majority. 2 ranks here (bitwise against the reference); 4 ranks under ``slow`` (≤ 1e-6
relative; ≤ 2^-11 on an fp16 wire, ``false_alarms.FP16_RELATIVE_LIMIT``)."""

from __future__ import annotations

import pytest
import torch

from openclaw_ref.experiments.false_alarms import (
    FAULTS,
    PAUSE_DEADLINE_S,
    Arm,
    Outcome,
    Pattern,
    arm_task,
    judge,
)

pytestmark = [pytest.mark.conformance, pytest.mark.openclaw_model]

HEALTHY = [p for p in Pattern if p not in FAULTS and p is not Pattern.SCALER_FP16_AUTO]


def _run(pools, world_size: int) -> dict[tuple[Pattern, Arm], list[dict]]:
    pool = pools.get(world_size)
    return {(p, a): pool.run(arm_task, p, a) for p in Pattern for a in Arm}


@pytest.fixture(scope="module")
def two_ranks(pools):
    return _run(pools, 2)


def _outcome(runs, pattern: Pattern, arm: Arm) -> Outcome:
    return judge(pattern, runs[pattern, arm], runs[pattern, Arm.REFERENCE])


@pytest.mark.parametrize("pattern", HEALTHY, ids=[p.name for p in HEALTHY])
def test_the_hardened_loop_is_exact_and_silent(two_ranks, pattern):
    assert _outcome(two_ranks, pattern, Arm.HARDENED) is Outcome.EXACT
    for reply in two_ranks[pattern, Arm.HARDENED]:
        assert reply["error"] is None
        assert bool(torch.isfinite(reply["params"]).all())


def test_the_pause_is_diagnosed_by_the_waiting_rank_but_nobody_is_stopped(two_ranks):
    rank0, rank1 = two_ranks[Pattern.RANK0_PAUSE, Arm.HARDENED]
    assert rank0["error"] is None and rank1["error"] is None
    assert rank1["seconds"] > PAUSE_DEADLINE_S  # rank 1 really waited past the deadline
    assert "SyncTimeout" in rank1["events"]  # its watchdog fired (and only reported)
    assert "SyncTimeout" not in rank0["events"]


def test_gradscaler_with_auto_scale_raises_nothing_and_keeps_the_weights_finite(two_ranks):
    """``auto`` multiplies on top of the loss scale (it is opt-in, for jobs without a loss
    scaler): its scale sequence may differ from the reference, but no alarm, no inf."""
    assert _outcome(two_ranks, Pattern.SCALER_FP16_AUTO, Arm.HARDENED) in (Outcome.EXACT,
                                                                          Outcome.DIFFERS)


def test_the_overflow_pattern_really_overflows_and_stock_ddp_writes_inf(two_ranks):
    assert _outcome(two_ranks, Pattern.OVERFLOW_PLAIN, Arm.STOCK) is Outcome.NON_FINITE
    assert all("WireOverflow" in r["events"]
               for r in two_ranks[Pattern.OVERFLOW_PLAIN, Arm.HARDENED])


def test_the_scaler_pattern_really_skips_steps(two_ranks):
    for reply in two_ranks[Pattern.SCALER_FP16, Arm.REFERENCE]:
        scales = reply["scales"]
        assert any(b < a for a, b in zip(scales, scales[1:])) or scales[0] < 2.0 ** 20


def test_two_disagreeing_ranks_are_named_without_a_majority(two_ranks):
    pattern = Pattern.TWO_RANKS_DISAGREE
    assert _outcome(two_ranks, pattern, Arm.HARDENED) is Outcome.RIGHT_CAUSE
    assert _outcome(two_ranks, pattern, Arm.STOCK) is Outcome.SILENT


def test_the_judge_calls_an_exception_a_false_alarm_and_a_changed_weight_a_difference(
        two_ranks):
    reference = two_ranks[Pattern.REENTRANT, Arm.REFERENCE]
    alarmed = [{**r, "error": {"kind": "RuntimeError", "message": "x", "ranks": []}}
               for r in reference]
    assert judge(Pattern.REENTRANT, alarmed, reference) is Outcome.FALSE_ALARM
    nudged = [{**r, "params": r["params"] + 1e-3} for r in reference]
    assert judge(Pattern.REENTRANT, nudged, reference) is Outcome.DIFFERS
    inf = [{**r, "params": r["params"] * float("inf")} for r in reference]
    assert judge(Pattern.REENTRANT, inf, reference) is Outcome.NON_FINITE
    assert judge(Pattern.REENTRANT, None, reference) is Outcome.KILLED


def test_the_judge_calls_a_majority_claimed_between_two_ranks_a_misdiagnosis(two_ranks):
    replies = two_ranks[Pattern.TWO_RANKS_DISAGREE, Arm.HARDENED]
    invented = [{**r, "error": {**r["error"], "message": "step 1 on most ranks, {rank 0: "
                                "step 2}"}} for r in replies]
    assert judge(Pattern.TWO_RANKS_DISAGREE, invented, None) is Outcome.MISDIAGNOSED


@pytest.mark.slow
def test_at_four_ranks_every_healthy_pattern_is_exact_and_the_fault_rightly_named(pools):
    runs = _run(pools, 4)
    for pattern in HEALTHY:
        assert _outcome(runs, pattern, Arm.HARDENED) is Outcome.EXACT, pattern
    assert _outcome(runs, Pattern.TWO_RANKS_DISAGREE, Arm.HARDENED) is Outcome.RIGHT_CAUSE
