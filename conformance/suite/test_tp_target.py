"""The checks of ``--openclaw-wrapper fsdp2-tp`` on the user's 2-D model (``--openclaw-model``,
whose ``Target`` carries a ``tp_plan``): the subject — ``harden()`` with its defaults, or
``--openclaw-hook``'s ``CALLABLE(model, mesh)`` — against stock FSDP2 × TP on a (W/2, 2)
(dp, tp) mesh, one batch per dp group (``conformance/tp_run.py``, ``tp_checks.py``). Skipped
under any other wrapper.

  equivalence   every rank ends every step bit for bit where stock ends it;
  no alarm      no error, no event but CanaryOff, no warning stock did not give;
  tp replicas   under stock, every tp-replicated parameter bitwise equal across its tp group
                after every step (the plan is right), else the parameters and ranks named;
  faults        a tp rank fed another batch, one rank's learning rate: stock trains through
                both silently; the subject names each at step 0, naming the rank.
"""

from __future__ import annotations

import pytest

from openclaw_ref.conformance import tp_checks
from openclaw_ref.conformance.tp_run import TpFault

pytestmark = [pytest.mark.conformance, pytest.mark.tp_wrapper]


@pytest.fixture(scope="module")
def oracle(target_runs, target_spec):
    """Stock FSDP2 × TP on the model, before anything else runs it."""
    oracle = tp_checks.oracle_of(target_runs, target_spec)
    if oracle.error:
        pytest.fail(f"stock FSDP2 x TP itself stops on this model ({oracle.error}): there is "
                    f"nothing to judge a subject against")
    return oracle


def test_every_rank_ends_each_step_bitwise_where_stock_tp_ends_it(
        oracle, target_runs, target_spec, conformance_report):
    row = conformance_report.add_check(tp_checks.equivalence(target_runs, target_spec))
    assert row.passed, f"{row.check}: {row.detail}"


def test_the_subject_adds_no_error_event_or_warning(oracle, target_runs, target_spec,
                                                    conformance_report):
    row = conformance_report.add_check(tp_checks.no_alarm(target_runs, target_spec))
    assert row.passed, f"{row.check}: {row.detail}"


def test_every_tp_replicated_parameter_stays_equal_over_its_tp_group_under_stock(
        oracle, target_runs, target_spec, conformance_report):
    row = conformance_report.add_check(tp_checks.tp_replicas(target_runs, target_spec))
    assert row.passed, f"{row.check}: {row.detail}"


@pytest.mark.parametrize("fault", list(TpFault), ids=str)
def test_a_fault_stock_tp_trains_through_is_named_at_step_0(
        oracle, target_runs, pools, target_spec, conformance_report, fault):
    row = conformance_report.add_check(
        tp_checks.fault_case(target_runs, pools.get, target_spec, fault))
    assert row.figures["stock"] == "silent-corruption", row.detail
    assert row.passed, f"{row.check}: {row.detail}"
