"""The checks that apply to any model, on the target the options name (``--openclaw-model``,
``--openclaw-hook``; default: the openclaw model under stock DDP), on ``--openclaw-world-size``
ranks. Each failure names the check, the step where there is one, and the ranks.

The oracle is stock DDP on the same model, shards, seeds and DDP options (``oracle``): a hook
passes when it ends every step where stock DDP ends it. Whether stock DDP itself equals one
process on the global batch is a property of the model (BatchNorm, in-batch losses and
batch-level branches make it differ under any correct DDP), reported in its own row.
Each (model, hook, DDP option set) trains once (``target_runs``); every check below reads
that run.

The fault matrix on the target (``user_faults``): each fault and corpus pattern that applies to
the model is injected on its rank, must end (a crash or a hang by a deadline), and its outcome
— detected, silent corruption, crash, hang-timeout, no effect — goes to the report; a case that
cannot apply to the model is skipped with the reason.
"""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from openclaw_ref.conformance.oracle import shard_invariance
from openclaw_ref.conformance.settings import Role
from openclaw_ref.conformance.target import build_target
from openclaw_ref.conformance.user_checks import (
    DDP_OPTION_SETS,
    NO_BUFFER_BROADCAST,
    equivalence_from,
    judge_average,
    judge_layout,
    judge_replicas,
    not_applicable,
    options_for,
    run_failed,
    set_label,
)
from openclaw_ref.conformance.user_faults import (
    CaseKind,
    UserFaultRunner,
    case_result,
    names_injected_rank,
    user_cases,
)
from openclaw_ref.conformance.user_faults import not_applicable as case_not_applicable

pytestmark = [pytest.mark.conformance, pytest.mark.ddp_hook]

# DDP option sets beyond these run in the slow set
CI_OPTION_SETS = ("default", NO_BUFFER_BROADCAST, "join")
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


def _oracle(target_runs, spec, target, option_set, cap=None):
    reason = not_applicable(option_set, target)
    if reason:
        pytest.skip(reason)
    oracle = target_runs.oracle(spec, options_for(option_set, cap))
    if oracle.error:
        why = (f"stock DDP itself stops under {set_label(option_set, cap)} on this model "
               f"({oracle.error}): there is nothing to judge a hook against")
        if option_set == "default":
            pytest.fail(why)  # the model does not train under DDP at all: not a pass
        pytest.skip(why)
    return oracle


def _runs(target_runs, spec, option_set="default", cap=None):
    return target_runs.runs(spec, options_for(option_set, cap))


def test_the_model_is_measured_against_one_process(target_runs, target_spec, target,
                                                   conformance_report):
    """The model's property, beside the checks: does stock DDP equal one process on the
    global batch? Reported either way; a hook is never failed for it."""
    oracle = _oracle(target_runs, target_spec, target, "default")
    row = conformance_report.add_check(
        shard_invariance(oracle.runs[0], target_spec.world_size, target_spec.factory))
    assert row.role is Role.PROPERTY and row.passed
    assert row.figures["steps"] == DDP_OPTION_SETS["default"].steps, row.figures


def _option_sets():
    for name in DDP_OPTION_SETS:
        marks = [] if name in CI_OPTION_SETS else [pytest.mark.slow]
        yield pytest.param(name, marks=marks, id=name)


@pytest.mark.parametrize("option_set", list(_option_sets()))
def test_every_rank_ends_each_step_where_stock_ddp_ends_it(target_runs, target_spec, target,
                                                           conformance_report, option_set):
    oracle = _oracle(target_runs, target_spec, target, option_set)
    result = conformance_report.add_check(equivalence_from(
        target_spec, option_set, oracle, _runs(target_runs, target_spec, option_set)))
    assert result.passed, f"{result.check}: {result.detail}"


def _hooked_records(target_runs, spec, check, option_set="default"):
    runs = _runs(target_runs, spec, option_set)
    if runs.records is None:
        pytest.fail(run_failed(check, spec, runs).detail)
    if not runs.records[0].hooked:
        pytest.skip("no comm hook: stock DDP's own reduction is the oracle itself")
    return runs.records


def test_each_bucket_comes_back_as_the_average_of_the_ranks_buckets(target_runs, target_spec,
                                                                    conformance_report):
    records = _hooked_records(target_runs, target_spec, "bucket average")
    result = conformance_report.add_check(judge_average(target_spec, records))
    assert result.passed, f"{result.check}: {result.detail}"
    assert result.figures["buckets_checked"] >= 1


@pytest.mark.parametrize("option_set", ["default", NO_BUFFER_BROADCAST])
def test_replicas_stay_bitwise_equal_after_every_step(target_runs, target_spec, target,
                                                      conformance_report, option_set):
    """Parameters after every step; and the buffers each forward starts from, where DDP
    broadcasts them (its default), not where ``broadcast_buffers=False`` lets them differ."""
    reason = not_applicable(option_set, target)
    if reason:
        pytest.skip(reason)
    runs = _runs(target_runs, target_spec, option_set)
    if runs.records is None:
        pytest.fail(run_failed("replica consistency", target_spec, runs).detail)
    broadcast = DDP_OPTION_SETS[option_set].ddp_option("broadcast_buffers", True)
    result = conformance_report.add_check(judge_replicas(target_spec, runs.records, broadcast))
    assert result.passed, f"{result.check}: {result.detail}"


def test_bucket_layout_is_identical_on_every_rank(target_runs, target_spec, conformance_report):
    records = _hooked_records(target_runs, target_spec, "bucket layout")
    result = conformance_report.add_check(judge_layout(target_spec, records))
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
    reason = case_not_applicable(case, target)
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
def test_for_any_bucket_cap_ranks_match_stock_ddp_and_agree_on_buckets(target_runs,
                                                                       target_spec, target,
                                                                       caps):
    """Examples drawn first, each run on the pooled group (no spawn per example)."""
    for cap in caps:
        oracle = _oracle(target_runs, target_spec, target, "default", cap)
        runs = _runs(target_runs, target_spec, "default", cap)
        result = equivalence_from(target_spec, set_label("default", cap), oracle, runs)
        assert result.passed, f"{result.check}: {result.detail}"
        if runs.records[0].hooked:
            layout = judge_layout(target_spec, runs.records)
            assert layout.passed, f"bucket cap {cap:g} MB: {layout.detail}"
