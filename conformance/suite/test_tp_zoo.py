"""The suite's own proof under ``--openclaw-wrapper fsdp2-tp`` (``zoo.tp``, 4 gloo ranks on a
(dp, tp) = (2, 2) mesh): the fsdp2-tp checks pass ``harden()`` on a correct sequence-parallel
plan, and on the same plan with the norms left out — the published bug stock trains through
silently — the tp-replica check fails naming the norms and every rank, and ``harden()`` stops
the job at step 0. One stock run pair and one ``harden()`` run per plan, one pool task per
fault case, all on the session's 4-rank pool."""

from __future__ import annotations

import pytest

from openclaw_ref.conformance import tp_checks
from openclaw_ref.conformance.target import FSDP_HARDEN, TP_WRAPPER, TargetSpec
from openclaw_ref.conformance.tp_run import TpFault
from openclaw_ref.conformance.zoo.tp import NORMS

pytestmark = [pytest.mark.conformance, pytest.mark.zoo]

RIGHT = TargetSpec("openclaw_ref.conformance.zoo.tp:sequence_parallel", FSDP_HARDEN, 4,
                   "fp32", TP_WRAPPER)
NORMS_LEFT_OUT = TargetSpec("openclaw_ref.conformance.zoo.tp:norms_left_out", FSDP_HARDEN, 4,
                            "fp32", TP_WRAPPER)
EVERY = [0, 1, 2, 3]


@pytest.mark.parametrize("check", [tp_checks.equivalence, tp_checks.no_alarm,
                                   tp_checks.tp_replicas], ids=lambda c: c.__name__)
def test_a_correct_sequence_parallel_plan_passes(target_runs, check):
    row = check(target_runs, RIGHT)
    assert row.passed, f"{row.check}: {row.detail}"


def test_the_correct_plan_holds_tp_replicas_the_check_compares(target_runs):
    """Not vacuous: the norms, the input projection's and each w2's bias are compared."""
    row = tp_checks.tp_replicas(target_runs, RIGHT)
    assert set(NORMS) <= set(row.figures["params"]) and row.figures["steps"] > 0, row.figures


@pytest.mark.parametrize("fault", list(TpFault), ids=str)
def test_a_fault_stock_tp_trains_through_is_named_at_step_0_on_the_correct_plan(
        target_runs, pools, fault):
    row = tp_checks.fault_case(target_runs, pools.get, RIGHT, fault)
    assert row.figures["stock"] == "silent-corruption", row.detail
    assert row.passed, f"{row.check}: {row.detail}"


def test_norms_left_out_fail_the_tp_replica_check_naming_the_norms_and_every_rank(
        target_runs):
    row = tp_checks.tp_replicas(target_runs, NORMS_LEFT_OUT)
    assert not row.passed
    assert row.event["step"] == 0 and row.event["ranks"] == EVERY, row.event
    assert sorted(row.event["params"]) == sorted(NORMS), row.event
    assert "differ across their tp group after step 0" in row.detail


def test_harden_stops_norms_left_out_at_step_0_as_gradients_not_averaged(target_runs):
    row = tp_checks.no_alarm(target_runs, NORMS_LEFT_OUT)
    assert not row.passed
    assert (row.event["kind"], row.event["step"], row.event["ranks"]) == \
        ("GradientsNotAveraged", 0, EVERY), row.event
    assert sorted(row.event["params"]) == sorted(NORMS), row.event
