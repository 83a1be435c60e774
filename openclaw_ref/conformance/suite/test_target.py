"""The checks that apply to any model, on the target the options name (``--openclaw-model``,
``--openclaw-hook``; default: the openclaw model under stock DDP), on ``--openclaw-world-size``
ranks. Each failure names the check, the step where there is one, and the ranks.

The fault matrix on the target (``user_faults``): each fault and corpus pattern that applies to
the model is injected on its rank, must end (a crash or a hang by a deadline), and its outcome
— detected, silent corruption, crash, hang-timeout, no effect — goes to the report; a case that
cannot apply to the model is skipped with the reason.
"""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from openclaw_ref.conformance.target import build_target
from openclaw_ref.conformance.user_checks import (
    DDP_OPTION_SETS,
    check_bucket_layout,
    check_equivalence,
    check_replica_consistency,
)
from openclaw_ref.conformance.user_faults import (
    CaseKind,
    UserFaultRunner,
    case_result,
    names_injected_rank,
    not_applicable,
    user_cases,
)

pytestmark = pytest.mark.conformance

# DDP option sets beyond these run in the slow set
CI_OPTION_SETS = ("default", "join")
# in CI (not slow): every fault that stays in-band and two corpus patterns (one acting at
# construction on every rank, one per step on one rank); crash and hang (a fresh rank pool and
# a deadline: > 5 s each on the openclaw model) and the rest of the corpus in the slow set
CI_CORPUS = ("convert-after-wrap", "clip-one-rank")
SLOW_FAULTS = ("crash", "hang")
# cases that change nothing by design when nobody measures them (a late rank only waits)
MAY_HAVE_NO_EFFECT = ("late-rank", "hang")
# where the faulty rank cannot be named: 2 ranks hold no majority against the acting rank 0
UNNAMEABLE_AT_TWO_RANKS = ("load-on-rank0-after-wrap",)


@pytest.fixture(scope="session")
def target(target_spec):
    return build_target(target_spec.factory)


def run(pools, spec, fn, *args):
    results = pools.get(spec.world_size).run(fn, spec, *args, timeout_s=180)
    assert all(r == results[0] for r in results), "ranks disagree on a verdict"
    return results[0]


def _option_sets():
    for name in DDP_OPTION_SETS:
        marks = [] if name in CI_OPTION_SETS else [pytest.mark.slow]
        yield pytest.param(name, marks=marks, id=name)


@pytest.mark.parametrize("option_set", list(_option_sets()))
def test_n_ranks_equal_one_process_on_the_same_global_batch(pools, target_spec, target,
                                                            conformance_report, option_set):
    if option_set == "static_graph" and target.find_unused_parameters:
        pytest.skip("static_graph needs the same unused parameters every step; this target "
                    "declares find_unused_parameters (the openclaw model's set changes)")
    result = conformance_report.add_check(run(pools, target_spec, check_equivalence, option_set))
    assert result.passed, f"{result.check}: {result.detail}"


def test_replicas_stay_bitwise_equal_after_every_step(pools, target_spec, conformance_report):
    result = conformance_report.add_check(run(pools, target_spec, check_replica_consistency))
    assert result.passed, f"{result.check}: {result.detail}"


def test_bucket_layout_is_identical_on_every_rank(pools, target_spec, conformance_report):
    result = conformance_report.add_check(run(pools, target_spec, check_bucket_layout))
    assert result.passed, f"{result.check}: {result.detail}"
    assert result.figures["buckets"] >= 1


@pytest.fixture(scope="module")
def fault_runner(pools, target_spec):
    return UserFaultRunner(target_spec, pools.get)


def _cases():
    for case in user_cases():
        slow = case.name in SLOW_FAULTS or (case.kind is CaseKind.CORPUS
                                            and case.name not in CI_CORPUS)
        yield pytest.param(case, marks=[pytest.mark.slow] if slow else [], id=case.name)


def test_the_fault_free_run_is_silent_and_repeatable(fault_runner):
    """The reference every case is judged against: no event, equal replicas, and the same
    parameters on a second run (else "differs from the fault-free run" would mean nothing)."""
    kind, record = fault_runner.clean_reply()
    assert kind == "ok", record
    assert record["events"] == [] and record["summary"]["replicas_equal"], record["events"]
    assert record["summary"]["param_digest"] == fault_runner.reference()


@pytest.mark.parametrize("case", list(_cases()))
def test_an_injected_fault_ends_and_its_outcome_is_recorded(fault_runner, target,
                                                           conformance_report, case):
    """The fault × hook cell of this hook, for the report. A fault that changes the run must
    not come out as no effect (the injector would have missed the model); a detection or a
    crash must name the faulty rank."""
    reason = not_applicable(case, target)
    if reason:
        pytest.skip(reason)
    out = fault_runner.run_case(case)
    conformance_report.add_check(case_result(case, out))
    if case.name not in MAY_HAVE_NO_EFFECT:
        assert out.outcome != "no-effect", out
    if out.outcome in ("detected", "crash") and case.name not in UNNAMEABLE_AT_TWO_RANKS:
        assert names_injected_rank(case, out), f"{case.check}: {out.summary()} does not " \
                                               f"name rank {out.expected_ranks}"


@pytest.mark.slow
@settings(max_examples=3)
@given(caps=st.lists(st.floats(1e-5, 1.0), min_size=1, max_size=2))
@example(caps=[1e-6])  # a bucket per parameter (DDP never splits one)
def test_for_any_bucket_cap_ranks_equal_one_process_and_agree_on_buckets(pools, target_spec,
                                                                          caps):
    """Examples drawn first, each run on the pooled group (no spawn per example)."""
    for cap in caps:
        layout = run(pools, target_spec, check_bucket_layout, (), cap)
        assert layout.passed, f"bucket cap {cap:g} MB: {layout.detail}"
        result = run(pools, target_spec, check_equivalence, "default", cap)
        assert result.passed, f"{result.check}: {result.detail}"
