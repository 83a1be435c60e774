"""The compute canary's parts on one process: the probe touches nothing of training, its input
survives the trip as tensors, and the vote over the gathered rows names the right rank — or,
at start-up, turns the canary off and says why (``sync/evidence/canary*.py``)."""

from __future__ import annotations

import math
from types import MethodType, SimpleNamespace

import pytest
import torch
from torch import nn

from openclaw_ref.sync.base import SyncConfig
from openclaw_ref.sync.errors import BadInput, ComputeMismatch, ConsistencyError
from openclaw_ref.sync.evidence.canary import (
    HEAD,
    PROBED,
    UNAVAILABLE_EVENT,
    UNBUILT,
    UNREPRODUCIBLE,
    UNREPRODUCIBLE_EVENT,
    Canary,
)
from openclaw_ref.sync.evidence.canary_probe import _decode, _describe, capture, run_probe
from openclaw_ref.sync.evidence.canary_tolerance import outliers
from openclaw_ref.sync.hardening import refuse_canary


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.Dropout(0.3), nn.Linear(8, 2))


def test_the_probe_leaves_grads_buffers_and_the_rng_stream_untouched():
    net, x = _net(), torch.randn(2, 6)
    before = {n: b.clone() for n, b in net.named_buffers()}
    rng = torch.get_rng_state()
    grads = run_probe(net, list(net.named_parameters()), (x,), {}, seed=3)
    assert all(g is not None for g in grads)
    assert all(p.grad is None for p in net.parameters())
    assert all(torch.equal(before[n], b) for n, b in net.named_buffers())
    assert torch.equal(torch.get_rng_state(), rng)


def test_the_probe_is_bitwise_reproducible_with_dropout():
    net, x = _net(), torch.randn(2, 6)
    a = run_probe(net, list(net.named_parameters()), (x,), {}, seed=5)
    b = run_probe(net, list(net.named_parameters()), (x,), {}, seed=5)
    assert all(torch.equal(g, h) for g, h in zip(a, b))


def test_the_probe_input_is_a_slice_of_the_batch_and_survives_the_header_round_trip():
    x, ids, mask = torch.randn(8, 3), torch.arange(8), torch.ones(4, 4)
    noted = capture((x, ids, 7), {"mask": mask, "scale": 0.5, "flag": True, "name": "x",
                                  "none": None})
    assert noted.leaves[0].shape == (2, 3) and torch.equal(noted.leaves[1], ids[:2])
    assert noted.leaves[2] == 7
    words, tensors = _describe(noted.leaves)
    payload = torch.cat([t.reshape(-1).view(torch.uint8) for t in tensors])
    back = _decode(words, payload)
    for mine, theirs in zip(noted.leaves, back):
        if isinstance(mine, torch.Tensor):
            assert torch.equal(mine, theirs) and mine.dtype == theirs.dtype
        elif isinstance(mine, str):
            assert theirs is not mine  # a string is not sent: each rank keeps its own
        else:
            assert mine == theirs and type(mine) is type(theirs)


def _canary(world: int) -> Canary:
    tracked = [("a.weight", nn.Parameter(torch.zeros(1))), ("b.weight", nn.Parameter(
        torch.zeros(1)))]
    guard = SimpleNamespace(tracked=tracked, events=[], global_ranks=list(range(world)),
                            group=None)
    return Canary(guard, every=2)


def _row(status: int, digests: tuple[int, int], probe: int = 1) -> list[int]:
    return [status, 2, 0, probe, *digests]


def test_the_outlier_of_three_ranks_is_named_with_its_first_differing_parameter():
    rows = [_row(PROBED, (1, 2)), _row(PROBED, (1, 9)), _row(PROBED, (1, 2))]
    err = _canary(3).divergence(rows, [0, 1, 2], step=5)
    assert isinstance(err, ComputeMismatch) and isinstance(err, ConsistencyError)
    assert err.ranks == [1] and err.params == ["b.weight"] and err.step == 5
    assert "rank 0's input slice of step 2" in str(err)


def test_two_ranks_that_differ_are_reported_as_either_side():
    err = _canary(2).divergence([_row(PROBED, (1, 2)), _row(PROBED, (3, 2))], [0, 1], step=3)
    assert err.ranks == [1] and err.params == ["a.weight"]
    assert "either side may be the faulty one" in str(err)


def test_agreeing_probes_raise_nothing():
    assert _canary(2).divergence([_row(PROBED, (1, 2))] * 2, [0, 1], step=3) is None


@pytest.mark.parametrize("rows", [
    [_row(PROBED, (1, 2), probe=0), _row(PROBED, (1, 3), probe=0)],  # start-up probe differs
    [_row(PROBED, (1, 2), probe=0), _row(UNREPRODUCIBLE, (1, 2), probe=0)],  # not reproducible
])
def test_what_a_bitwise_probe_cannot_judge_switches_to_the_tolerance_with_an_event(rows):
    canary = _canary(2)
    with pytest.warns(UserWarning, match="no longer seen"):
        assert canary.divergence(rows, [0, 1], step=1) is None
    assert canary.on and canary.tolerant
    (event,) = canary.guard.events
    assert event.ranks == [1] and event.kind == UNREPRODUCIBLE_EVENT


def test_a_probe_input_a_rank_could_not_rebuild_turns_the_canary_off_with_an_event():
    canary = _canary(2)
    with pytest.warns(UserWarning, match="canary off"):
        assert canary.divergence([_row(PROBED, (1, 2)), _row(UNBUILT, (0, 0))], [0, 1],
                                 step=1) is None
    assert not canary.on and canary.guard.events[0].kind == UNAVAILABLE_EVENT
    assert len(_row(PROBED, (1, 2))) == HEAD + 2


def test_the_tolerance_names_a_rank_off_by_more_than_it_and_passes_rounding_noise():
    healthy = [1.0, 1.0, 10.0, 0.5, 4.0]  # probed, then (sum, mass) of two parameters
    noisy = [1.0, 1.0 + 1e-6, 10.0, 0.5, 4.0 - 1e-6]
    wild = [1.0, 1.0, 10.0, 3e30, 3e30]
    assert outliers([healthy, noisy, healthy]) == ([], None)
    assert outliers([healthy, wild, noisy]) == ([1], 1)
    assert outliers([healthy, wild]) == ([1], 1)  # two ranks: the larger mass is named
    assert outliers([healthy, [0.0] * 5, wild]) == ([2], 1)  # rank 1 did not probe
    assert outliers([healthy, [1.0, 1.0, 10.0, math.inf, math.inf]]) == ([1], 1)
    assert outliers([[1.0, math.nan, math.nan]] * 2) == ([], None)  # nothing finite to judge


def test_a_negative_canary_interval_is_refused():
    with pytest.raises(BadInput, match="canary"):
        SyncConfig(canary_every=-1)


def test_the_canary_is_refused_under_the_per_bucket_guard():
    with pytest.raises(BadInput, match="step guard only"):
        refuse_canary(nn.Linear(2, 2), SyncConfig("hardened", guard="bucket", canary_every=4))


def test_the_probe_runs_the_forward_the_instance_carries_rather_than_the_class_one():
    """A client's persistent wrapper (Accelerate's autocast) is what training runs, so it is
    what the probe checks: here one that doubles the output doubles every gradient."""
    net, x = _net(), torch.randn(2, 6)
    net.forward = MethodType(lambda self, t: 2 * type(self).forward(self, t), net)
    plain = run_probe(net, list(net.named_parameters()), (x,), {}, seed=7)
    wrapped = run_probe(net, list(net.named_parameters()), (x,), {}, seed=7,
                        forward=net.forward)
    assert all(torch.equal(2 * g, h) for g, h in zip(plain, wrapped))
