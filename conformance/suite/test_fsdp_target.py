"""The checks of ``--openclaw-wrapper fsdp2`` / ``hsdp`` on the user's model (``--openclaw-model``):
the subject — ``harden()`` of ``fully_shard`` with its defaults, or ``--openclaw-hook``'s
``CALLABLE(fsdp_model, mesh)`` — against the oracle, stock ``fully_shard`` (HSDP: on the same
(W/2, 2) mesh) on the same shards and seeds. Skipped without ``--openclaw-wrapper fsdp2/hsdp``.

  equivalence          per cell of the healthy-jobs table (``fsdp_run.FSDP_OPTION_SETS``):
                       every rank ends every step bit for bit where stock FSDP2 ends it, and
                       the subject raised nothing and recorded no event (0 false alarms);
  replica consistency  the full parameters equal on every rank after every step (under HSDP,
                       each replica gathers its own copy: replicas that drift differ);
  faults               each FSDP2-form fault and FSDP2 corpus pattern that applies, injected on
                       its rank (``fsdp_faults``): its outcome goes to the report; what
                       ``harden()`` does not catch today is reported as such, as the DDP matrix
                       does, and fails nothing; a detection or crash must name the right rank.
"""

from __future__ import annotations

import pytest

from openclaw_ref.conformance.fsdp_faults import (
    GROUP_KILLING,
    MAY_HAVE_NO_EFFECT,
    FsdpFaultRunner,
    case_result,
    fsdp_cases,
    not_applicable,
)
from openclaw_ref.conformance.fsdp_run import FSDP_OPTION_SETS, FsdpJob
from openclaw_ref.conformance.oracle import STOCK_WRAPPER, shard_invariance
from openclaw_ref.conformance.settings import Role
from openclaw_ref.conformance.user_checks import equivalence_from, judge_replicas, run_failed

pytestmark = [pytest.mark.conformance, pytest.mark.fsdp_wrapper]

# the quick pass (pytest -m conformance): the default cell and accumulation, and the faults
# that stay in-band and are cheap; the other cells, the rest of the corpus, and the cases that
# end the group (a fresh pool and gloo's deadline) under slow
QUICK_SETS = ("default", "accumulation (set_requires_gradient_sync(False))")
QUICK_CASES = ("nan-grad", "extra-backward-one-rank", "lr-one-rank", "clip-local-norm")


def _oracle(target_runs, spec, option_set):
    oracle = target_runs.oracle(spec, FSDP_OPTION_SETS[option_set])
    if oracle.error:
        pytest.fail(f"stock {spec.wrapper} itself stops under {option_set} on this model "
                    f"({oracle.error}): there is nothing to judge a subject against")
    return oracle


def _marked(names, quick):
    return [pytest.param(n, id=n, marks=[] if n in quick else [pytest.mark.slow])
            for n in names]


def test_the_model_is_measured_against_one_process(target_runs, target_spec,
                                                   conformance_report):
    """Reported, never a failure: does stock FSDP2 equal one process on the global batch?"""
    oracle = _oracle(target_runs, target_spec, "default")
    row = conformance_report.add_check(
        shard_invariance(oracle.runs[0], target_spec.world_size, target_spec.factory,
                         STOCK_WRAPPER[target_spec.wrapper]))
    assert row.role is Role.PROPERTY and row.passed


@pytest.mark.parametrize("option_set", _marked(FSDP_OPTION_SETS, QUICK_SETS))
def test_every_rank_ends_each_step_where_the_stock_wrapper_ends_it_with_no_alarm(
        target_runs, target_spec, conformance_report, option_set):
    oracle = _oracle(target_runs, target_spec, option_set)
    runs = target_runs.runs(target_spec, FSDP_OPTION_SETS[option_set])
    result = conformance_report.add_check(equivalence_from(target_spec, option_set, oracle, runs))
    assert result.passed, f"{result.check}: {result.detail}"
    events = [e for r in runs.records for e in r.events]
    assert events == [], f"false alarm under {option_set}: {events}"


def test_replicas_stay_bitwise_equal_after_every_step(target_runs, target_spec,
                                                      conformance_report):
    runs = target_runs.runs(target_spec, FSDP_OPTION_SETS["default"])
    if runs.records is None:
        pytest.fail(run_failed("replica consistency", target_spec, runs).detail)
    result = conformance_report.add_check(judge_replicas(target_spec, runs.records, False))
    assert result.passed, f"{result.check}: {result.detail}"


@pytest.fixture(scope="module")
def fault_runner(pools, target_spec):
    return FsdpFaultRunner(target_spec, pools.get)


def test_the_fault_free_run_is_silent(fault_runner):
    kind, record = fault_runner.reply(FsdpJob())
    assert kind == "ok", record
    assert record["events"] == [] and record["summary"]["replicas_equal"], record["events"]


def _cases():
    for case in fsdp_cases():
        quick = case.name in QUICK_CASES and case.name not in GROUP_KILLING
        yield pytest.param(case, id=case.name, marks=[] if quick else [pytest.mark.slow])


@pytest.mark.parametrize("case", list(_cases()))
def test_an_injected_fault_ends_and_its_outcome_is_recorded(fault_runner, conformance_report,
                                                           case):
    """The subject's cell of the fault matrix, for the report. A case that changes the run
    must not come out as no effect; a detection or crash must name the acting rank."""
    reason = not_applicable(case)
    if reason:
        pytest.skip(reason)
    out = fault_runner.run_case(case)
    conformance_report.add_check(case_result(case, out))
    if case.name not in MAY_HAVE_NO_EFFECT:
        assert out.outcome != "no-effect", out
    if out.outcome in ("detected", "crash"):
        assert out.attributed, f"{case.check}: {out.summary()} does not name rank " \
                               f"{out.expected_ranks}"
