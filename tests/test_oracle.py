"""Judging a hook against stock DDP (``conformance/oracle.py``, ``user_checks.py``) on
hand-made run records, no processes: which tolerance applies, that the first differing step and
its ranks are named, that one-process equivalence is a property row and never a failure, and
that the buffer half of replica consistency fires where DDP broadcasts buffers."""

from __future__ import annotations

import pytest
import torch

from openclaw_ref.conformance.oracle import equivalence_tolerance, shard_invariance
from openclaw_ref.conformance.run_record import RunRecord
from openclaw_ref.conformance.settings import Role
from openclaw_ref.conformance.target import TargetSpec
from openclaw_ref.conformance.tolerance import WIRE_ATOL
from openclaw_ref.conformance.user_checks import judge_equivalence, judge_replicas
from openclaw_ref.conformance.user_record import StepDiff, compare_states
from openclaw_ref.sync.base import Wire

SPEC = TargetSpec("m:f", "m:h")


@pytest.mark.parametrize("wire,world,fp32,atol", [
    (Wire.NATIVE, 2, True, 0.0), (Wire.FP32, 2, True, 0.0), (Wire.FP32, 2, False, 1e-5),
    (Wire.NATIVE, 3, True, 1e-5), (Wire.FP32, 4, True, 1e-5), (Wire.FP16, 2, True, 5e-3),
    (Wire.BF16, 2, True, 2e-2)])
def test_bit_for_bit_is_required_only_at_two_ranks_on_the_gradients_own_dtype(wire, world,
                                                                              fp32, atol):
    assert equivalence_tolerance(wire, world, fp32, 0.0).atol == atol


def test_an_oracle_that_differs_from_itself_drops_the_bitwise_claim():
    tolerance = equivalence_tolerance(Wire.NATIVE, 2, True, 3e-7)
    assert tolerance.atol == pytest.approx(WIRE_ATOL[Wire.NATIVE] + 3e-7)
    assert "differs from itself" in tolerance.why


def diffs(*per_rank: list[float]) -> list[list[StepDiff]]:
    return [[StepDiff(s, d, "w" if d else "", d == 0) for s, d in enumerate(x)] for x in per_rank]


def test_equivalence_names_the_first_step_and_the_ranks_beyond_the_tolerance():
    result = judge_equivalence(SPEC, "default", diffs([0, 0, 1e-3], [0, 2e-3, 5e-3]),
                               equivalence_tolerance(Wire.FP32, 2, True, 0.0), 0.0)
    assert not result.passed
    assert result.event == {"kind": "NotEquivalent", "step": 1, "ranks": [1], "params": ["w"]}
    assert "after step 1" in result.detail and "bit for bit" in result.detail


def test_under_join_each_rank_is_judged_on_every_step_it_ran():
    """The last rank ran one step fewer: a difference on rank 0's last step still counts."""
    result = judge_equivalence(SPEC, "join", diffs([0, 0, 0, 1e-3], [0, 0, 0]),
                               equivalence_tolerance(Wire.FP32, 2, True, 0.0), 0.0)
    assert not result.passed and result.event["step"] == 3 and result.event["ranks"] == [0]


def test_one_ulp_fails_a_bitwise_claim_and_passes_the_fp32_tolerance():
    one_ulp = diffs([0, 6e-8], [0, 6e-8])
    bitwise = equivalence_tolerance(Wire.NATIVE, 2, True, 0.0)
    three_ranks = equivalence_tolerance(Wire.NATIVE, 3, True, 0.0)
    assert not judge_equivalence(SPEC, "default", one_ulp, bitwise, 0.0).passed
    assert judge_equivalence(SPEC, "default", one_ulp, three_ranks, 0.0).passed


def test_a_run_a_hook_stopped_fails_with_the_hooks_error():
    stopped = RunRecord(1, True, error={"kind": "NonFiniteGradient"}, error_text="NaN in 'w'")
    result = judge_equivalence(SPEC, "default", diffs([0], [0]),
                               equivalence_tolerance(Wire.NATIVE, 2, True, 0.0), 0.0, stopped)
    assert not result.passed and "rank 1: NaN in 'w'" in result.detail


def test_compare_states_reports_bits_the_largest_difference_and_a_nan():
    a = [{"w": torch.ones(3), "b": torch.zeros(2)}] * 2
    b = [{"w": torch.ones(3), "b": torch.zeros(2)},
         {"w": torch.tensor([1.0, float("nan"), 1.0]), "b": torch.tensor([0.0, 0.5])}]
    same, nan = compare_states(a, b)
    assert same.bitwise and same.diff == 0
    assert not nan.bitwise and nan.diff != nan.diff and nan.name == "w"


def stock_record(final: float, one_process: float) -> RunRecord:
    return RunRecord(0, False, param_names=("w",), states=[{"w": torch.full((2,), final)}],
                     one_process={"w": torch.full((2,), one_process)})


@pytest.mark.parametrize("one_process,invariant", [(1.0, True), (1.0 + 5e-6, True),
                                                   (1.0141, False)])
def test_one_process_equivalence_is_a_property_row_never_a_failure(one_process, invariant):
    row = shard_invariance(stock_record(1.0, one_process), 2, "m:f")
    assert row.role is Role.PROPERTY and row.passed
    assert row.figures["shard_invariant"] is invariant
    assert ("hooks are judged against stock DDP" in row.detail) is not invariant


def replica(rank: int, params: str, buffers: str) -> RunRecord:
    return RunRecord(rank, True, param_names=("w",), param_digests=[(params,)],
                     step_buffers=[buffers])


def test_buffers_are_compared_where_ddp_broadcasts_them_and_the_rank_is_named():
    records = [replica(0, "p", "b0"), replica(1, "p", "b1"), replica(2, "p", "b0")]
    result = judge_replicas(SPEC, records, broadcast_buffers=True)
    assert not result.passed and result.event["ranks"] == [1]
    assert judge_replicas(SPEC, records, broadcast_buffers=False).passed


def test_parameters_that_differ_are_named_with_the_rank_before_any_buffer():
    records = [replica(0, "p", "b0"), replica(1, "q", "b1")]
    result = judge_replicas(SPEC, records)
    assert not result.passed and result.event["ranks"] == [0, 1]  # two ranks: both suspects
    assert result.event["params"] == ["w"]
