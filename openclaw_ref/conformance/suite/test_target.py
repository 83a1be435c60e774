"""The checks that apply to any model, on the target the options name (``--openclaw-model``,
``--openclaw-hook``; default: the openclaw model under stock DDP), on ``--openclaw-world-size``
ranks. Each failure names the check, the step where there is one, and the ranks."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from openclaw_ref.conformance.target import build_target
from openclaw_ref.conformance.user_checks import (
    DDP_OPTION_SETS,
    FaultOutcome,
    check_bucket_layout,
    check_equivalence,
    check_fault,
    check_replica_consistency,
    fault_for,
)

pytestmark = pytest.mark.conformance

# DDP option sets beyond the default one run in the slow set (and always on a user's model)
CI_OPTION_SETS = ("default",)
# faults the suite injects without the model's cooperation, on the model's first parameter
FAULTS = ("bitflip", "nan-grad", "missing-grad", "scale-mismatch")


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


@pytest.mark.slow
@pytest.mark.parametrize("fault", FAULTS)
def test_an_injected_fault_has_an_effect_and_its_outcome_is_recorded(pools, target_spec, target,
                                                                      conformance_report, fault):
    """The fault × hook cell of this hook: recorded for the report; a fault that changes nothing
    would mean the injector missed the model."""
    if fault == "missing-grad" and not target.find_unused_parameters:
        pytest.skip("without find_unused_parameters DDP raises on the next forward and leaves "
                    "the other ranks waiting: it kills the group (stock DDP's own behaviour)")
    spec_fault = fault_for(fault, target.module)
    result = conformance_report.add_check(run(pools, target_spec, check_fault, spec_fault))
    assert result.figures["outcome"] != FaultOutcome.NO_EFFECT, result.detail


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
