"""The false-alarm corpus (``experiments.false_alarms``): ``harden()`` at its defaults neither
stops nor changes a healthy job — activation checkpointing (reentrant and not, with and without
``static_graph``), a rank-0 pause longer than the watchdog deadline, GradScaler with the fp16
wire, a wire overflow in the plain loop — names a real disagreement without inventing a
majority, and refuses a pre-scaled fp16 wire under GradScaler on every rank at the same step.
2 ranks here (bitwise against the reference); 4 ranks under ``slow`` (≤ 1e-6 relative; ≤ 2^-11
on an fp16 wire, ``false_alarms.FP16_RELATIVE_LIMIT``, whose comment gives the reason)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from openclaw_ref.experiments.false_alarms import (
    FAULTS,
    FP16_RELATIVE_LIMIT,
    PAUSE_BEFORE,
    PAUSE_DEADLINE_S,
    PAUSE_S,
    REFUSED,
    RELATIVE_LIMIT,
    SPECS,
    Arm,
    Outcome,
    Pattern,
    arm_task,
    hardened_config,
    judge,
    max_relative,
)
from openclaw_ref.sync.base import SyncConfig

pytestmark = [pytest.mark.conformance, pytest.mark.openclaw_model]

HEALTHY = [p for p in Pattern if p not in FAULTS and p not in REFUSED]


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


def test_the_pause_row_runs_the_default_policy_with_only_the_deadline_shortened():
    """What a user gets by default, in seconds: the default action (it never kills, and raises
    only for a silent rank or a failed collective), a pause longer than the deadline."""
    config = hardened_config(SPECS[Pattern.RANK0_PAUSE])
    default = SyncConfig()
    assert config.watchdog_action is default.watchdog_action
    assert config.watchdog_s == PAUSE_DEADLINE_S < PAUSE_S < default.watchdog_s
    assert dataclasses.replace(config, watchdog_s=default.watchdog_s) == default


def _assert_the_pause_is_reported_by_every_waiting_rank_and_stops_nobody(replies):
    rank0, *waiting = replies
    assert all(r["error"] is None for r in replies)
    assert rank0["timeouts"] == []
    for reply in waiting:
        assert reply["seconds"] > PAUSE_DEADLINE_S  # it really waited past the deadline
        [detail] = reply["timeouts"]  # its watchdog fired once, and only reported
        assert f"rank 0 has not reached step {PAUSE_BEFORE}'s allreduce" in detail, detail
        assert "it is alive" in detail, detail


def test_the_pause_is_diagnosed_by_the_waiting_rank_but_nobody_is_stopped(two_ranks):
    _assert_the_pause_is_reported_by_every_waiting_rank_and_stops_nobody(
        two_ranks[Pattern.RANK0_PAUSE, Arm.HARDENED])


def test_gradscaler_over_a_pre_scaled_wire_is_refused_on_every_rank_at_the_same_step(
        two_ranks):
    """``auto`` would multiply on top of the loss scale (double scaling): refused with
    ``BadInput`` at the first step the scaler runs; the same loop on stock DDP's
    ``fp16_compress_hook`` is the reference itself."""
    pattern = Pattern.SCALER_FP16_AUTO
    assert _outcome(two_ranks, pattern, Arm.HARDENED) is Outcome.RIGHT_CAUSE
    assert _outcome(two_ranks, pattern, Arm.STOCK) is Outcome.EXACT
    assert {r["error"]["step"] for r in two_ranks[pattern, Arm.HARDENED]} != {0}


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


@pytest.mark.parametrize("pattern", FAULTS + REFUSED, ids=[p.name for p in FAULTS + REFUSED])
def test_the_judge_calls_an_error_on_one_rank_only_or_at_different_steps_a_misdiagnosis(
        two_ranks, pattern):
    rank0, rank1 = two_ranks[pattern, Arm.HARDENED]
    reference = two_ranks[pattern, Arm.REFERENCE]
    assert judge(pattern, [rank0, {**rank1, "error": None}], reference) is Outcome.MISDIAGNOSED
    later = {**rank1, "error": {**rank1["error"], "step": rank1["error"]["step"] + 1}}
    assert judge(pattern, [rank0, later], reference) is Outcome.MISDIAGNOSED


@pytest.mark.slow
def test_at_four_ranks_every_healthy_pattern_is_exact_and_the_faults_rightly_named(pools):
    """Exact: ≤ 1e-6 relative on the fp32 wire, ≤ 2^-11 on the fp16 one (its reason:
    ``false_alarms.FP16_RELATIVE_LIMIT``), the loss-scale sequences identical."""
    runs = _run(pools, 4)
    for pattern in HEALTHY:
        assert _outcome(runs, pattern, Arm.HARDENED) is Outcome.EXACT, pattern
        limit = FP16_RELATIVE_LIMIT if SPECS[pattern].fp16 else RELATIVE_LIMIT
        distance = max_relative(runs[pattern, Arm.HARDENED], runs[pattern, Arm.REFERENCE])
        assert distance is not None and distance <= limit, (pattern, distance)
    for pattern in FAULTS + REFUSED:
        assert _outcome(runs, pattern, Arm.HARDENED) is Outcome.RIGHT_CAUSE, pattern
    _assert_the_pause_is_reported_by_every_waiting_rank_and_stops_nobody(
        runs[Pattern.RANK0_PAUSE, Arm.HARDENED])
