"""The FSDP2 guard's verdict (``facts.judge``) from hand-written rows: it reads nothing but
the rows, so these are the cases every rank decides alike — which check fires first, which
ranks it names (by global rank), and what is never compared."""

from __future__ import annotations

import math

import torch

from openclaw_ref.sync.errors import (
    CheckpointMismatch,
    ClockMismatch,
    GradientsNotAveraged,
    InputMismatch,
    MissingGradient,
    OptimizerMismatch,
    ReplicaDivergence,
    ScaleMismatch,
)
from openclaw_ref.sync.fsdp.facts import Exchange, Field, hyper_digest, judge
from openclaw_ref.sync.fsdp.mesh import Seat
from openclaw_ref.sync.fsdp.replicas import Column, Replicas
from openclaw_ref.sync.fsdp.scale import ScaleRecord, from_bits, sampled, to_bits, unit_roundoff


def _row(**values: int) -> list[int]:
    row = [0] * len(Field)
    row[Field.KIND], row[Field.OPT_STEPS], row[Field.BACKWARDS] = Exchange.OPTIMIZER_STEP, 3, 3
    row[Field.REDUCED], row[Field.OPT_OWNS], row[Field.HYPER] = 11, 1, 22
    row[Field.SCALE] = to_bits(float("nan"))
    for name, v in values.items():
        row[Field[name]] = v
    return row


def test_ranks_that_agree_get_no_verdict():
    assert judge([_row(), _row(), _row()], [0, 1, 2], True) == (None, [])


def test_a_rank_at_another_clock_is_a_clock_mismatch_naming_its_global_rank():
    error, _ = judge([_row(), _row(), _row(KIND=Exchange.EXTRA_FORWARD, OPT_STEPS=2)],
                     [4, 5, 6], True)
    assert isinstance(error, ClockMismatch) and error.ranks == [6] and error.step == 3
    assert "forward after a reduced backward" in error.detail


def test_a_rank_that_reduced_other_parameters_is_a_missing_gradient():
    error, _ = judge([_row(), _row(REDUCED=12), _row()], [0, 1, 2], True)
    assert isinstance(error, MissingGradient) and error.ranks == [1]


def _classes(*seats: Seat) -> Replicas:
    """One rank's replica classes, one parameter each (the verdict reads only the rows)."""
    shards = [(f"p{i}", torch.zeros(4)) for i in range(len(seats))]
    return Replicas(list(seats), shards, 16)


HSDP = Seat("replicate:2=R,shard:2=S", 1, 2, ())
TP = Seat("dp:2=S,tp:2=R", 1, 2, ("tp",))


def _with(row: list[int], *columns: int) -> list[int]:
    return row + list(columns)


def test_replicas_are_compared_only_among_ranks_holding_the_same_shards():
    rows = [_with(_row(), 1, 7, 0), _with(_row(), 2, 8, 0),
            _with(_row(), 1, 7, 0), _with(_row(), 2, 8, 0)]
    assert judge(rows, [0, 1, 2, 3], True, replicas=_classes(HSDP)) == (None, [])
    rows[3][len(Field) + Column.VALUE] = 9
    error, _ = judge(rows, [0, 1, 2, 3], True, slices=16, replicas=_classes(HSDP),
                     name=lambda finding: ["p0"])
    assert isinstance(error, ReplicaDivergence) and error.ranks == [1, 3]  # two replicas: both
    assert "slice 3 of 16" in error.detail and error.params == ["p0"]


def test_a_gradient_that_differs_across_tp_replicas_is_not_averaged_over_tp():
    rows = [_with(_row(), 1, 7, 5), _with(_row(), 1, 7, 5), _with(_row(), 2, 8, 6),
            _with(_row(), 2, 8, 6)]
    assert judge(rows, [0, 1, 2, 3], True, replicas=_classes(TP)) == (None, [])
    rows[1][len(Field) + Column.GRAD] = 4
    error, _ = judge(rows, [0, 1, 2, 3], True, replicas=_classes(TP), name=lambda f: ["w"])
    assert isinstance(error, GradientsNotAveraged) and error.ranks == [0, 1]
    assert "gradient not reduced over tp" in error.detail and error.params == ["w"]


def test_hsdp_replicas_compare_values_only_never_gradients():
    rows = [_with(_row(), 1, 7, 5), _with(_row(), 1, 7, 6)]
    assert judge(rows, [0, 1], True, replicas=_classes(HSDP)) == (None, [])


def test_a_scale_mismatch_is_judged_before_the_gradients_it_made_differ():
    rows = [_with(_row(SCALE=to_bits(0.5)), 1, 7, 5), _with(_row(SCALE=to_bits(0.25)), 1, 7, 6)]
    error, _ = judge(rows, [0, 1], True, replicas=_classes(TP))
    assert isinstance(error, ScaleMismatch)


def test_tp_ranks_fed_different_inputs_are_an_input_mismatch_before_any_gradient():
    rows = [_with(_row(INPUT_OF=1, INPUT=3), 1, 7, 5), _with(_row(INPUT_OF=1, INPUT=4), 1, 7, 6),
            _with(_row(INPUT_OF=3, INPUT=9), 2, 7, 5), _with(_row(INPUT_OF=3, INPUT=9), 2, 7, 5)]
    error, _ = judge(rows, [0, 1, 2, 3], True, replicas=_classes(TP))
    assert isinstance(error, InputMismatch) and error.ranks == [0, 1]


def test_an_extra_forward_exchange_never_judges_the_optimizer():
    rows = [_row(KIND=Exchange.EXTRA_FORWARD, OPT_OWNS=0, HYPER=0)] * 2
    assert judge(rows, [0, 1], True) == (None, [])


def test_an_optimizer_without_the_models_parameters_is_named_on_every_rank_it_steps():
    error, _ = judge([_row(OPT_OWNS=0), _row(OPT_OWNS=0)], [0, 1], True)
    assert isinstance(error, OptimizerMismatch) and error.ranks == [0, 1]


def test_a_nonfinite_flag_under_skip_is_an_event_not_an_error():
    error, events = judge([_row(), _row(NONFINITE=1)], [0, 1], False)
    assert error is None and [(e.kind, e.ranks) for e in events] == [("NonFiniteGradient", [1])]


def test_a_learning_rate_one_ulp_off_has_another_digest():
    p = [torch.nn.Parameter(torch.zeros(2))]
    a = torch.optim.AdamW(p, lr=1e-3)
    b = torch.optim.AdamW(p, lr=math.nextafter(1e-3, 1.0))
    assert hyper_digest(a) != hyper_digest(b)
    assert hyper_digest(a) == hyper_digest(torch.optim.AdamW(p, lr=1e-3))


def test_a_two_rank_disagreement_says_there_is_no_majority():
    error, _ = judge([_row(), _row(HYPER=23)], [0, 1], True)
    assert error.ranks == [0, 1] and "no majority" in error.detail
    error, _ = judge([_row(), _row(), _row(HYPER=23)], [0, 1, 2], True)
    assert error.ranks == [2] and "no majority" not in error.detail


# --- the later checks: loads, scale ---------------------------------------------

def test_a_load_on_one_of_two_ranks_names_the_rank_that_loaded():
    error, _ = judge([_row(LOADS=1), _row()], [0, 1], True)
    assert isinstance(error, CheckpointMismatch) and error.ranks == [0]
    assert "rank 0: 1, rank 1: 0" in error.detail
    error, _ = judge([_row(LOADS=1), _row(), _row(), _row()], [0, 1, 2, 3], True)
    assert error.ranks == [0]
    assert judge([_row(LOADS=2)] * 3, [0, 1, 2], True) == (None, [])


def _scaled(*factors: float) -> list[list[int]]:
    return [_row(SCALE=to_bits(f)) for f in factors]


def test_ranks_scaled_by_their_own_factors_are_a_scale_mismatch():
    error, _ = judge(_scaled(0.1, 0.13), [0, 1], True)
    assert isinstance(error, ScaleMismatch) and error.ranks == [0, 1] and "×0.13" in error.detail
    error, _ = judge(_scaled(0.5, 0.5, 1.0, 0.5), [0, 1, 2, 3], True)
    assert error.ranks == [2]


def test_one_factor_within_rounding_or_a_rank_not_judged_is_no_verdict():
    assert judge(_scaled(0.5, 0.5 * (1 + 1e-6), 0.5), [0, 1, 2], True) == (None, [])
    assert judge(_scaled(0.5, float("nan"), 0.7), [0, 1, 2], True)[0].ranks == [0, 2]
    assert judge(_scaled(float("nan"), 0.7), [0, 1], True) == (None, [])


def test_a_uniform_factor_is_told_from_a_change_that_is_not_a_scaling():
    g = torch.randn(1000, dtype=torch.float32)
    rec = ScaleRecord([g.numel()], unit_roundoff([torch.float32]))
    rec.reduced(0, g.clone())
    assert abs(rec.factor([g * 0.37]) - 0.37) < 1e-6
    assert math.isnan(rec.factor([g.clamp(-1.0, 1.0)]))  # clip_grad_value_
    assert math.isnan(ScaleRecord([g.numel()], 1e-7).factor([g]))  # nothing reduced
    assert from_bits(to_bits(0.37)) == 0.37


def test_the_scale_factor_is_measured_on_the_smallest_parameters_that_fit_the_sample():
    sizes = [1 << 20, 16, 1 << 15, 4, 1 << 16]
    assert sampled(sizes, budget=1 << 16) == {3, 1, 2}  # smallest first while they fit
    assert sampled(sizes, budget=10) == {3}
    assert sampled(sizes, budget=2) == {3}  # at least one, the smallest
    rec = ScaleRecord(sizes, unit_roundoff([torch.float32]))
    big = torch.randn(8)
    rec.reduced(0, big)  # not sampled: not recorded, so a change to it alone is not judged
    assert math.isnan(rec.factor([big * 0.5, None, None, None, None]))
