"""The replica slices (``replica_slices``): K slices that cover every parameter element exactly
once at equal bytes per step, and a divergence named from the gathered per-piece digests."""

from __future__ import annotations

import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

from openclaw_ref.sync.evidence.replica_slices import ReplicaSlices, partition


@given(shapes=st.lists(st.tuples(st.integers(0, 50), st.sampled_from([1, 2, 4, 8])),
                       max_size=8), k=st.integers(1, 20))
def test_the_slices_cover_every_element_exactly_once_at_about_equal_bytes(shapes, k):
    slices = partition(shapes, k)
    seen = [[0] * n for n, _ in shapes]
    for pieces in slices:
        for i, a, b in pieces:
            for e in range(a, b):
                seen[i][e] += 1
    assert all(c == 1 for row in seen for c in row)
    total = sum(n * size for n, size in shapes)
    largest = max((size for _, size in shapes), default=0)
    for pieces in slices:
        got = sum((b - a) * shapes[i][1] for i, a, b in pieces)
        assert abs(got - total / k) <= largest + 1  # cut at element boundaries


def _named():
    torch.manual_seed(0)
    return list(nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 4)).named_parameters())


def _rows(slices: ReplicaSlices, nudged: dict[int, str], clock: int, world: int):
    """Every rank's gather row at ``clock``; rank r nudges parameter ``nudged[r]`` first."""
    rows = []
    for r in range(world):
        named = [(n, p.detach().clone()) for n, p in slices.named]
        for n, p in named:
            if nudged.get(r) == n:
                p.view(-1)[-1] += 1e-3
        mine = ReplicaSlices(named, slices.k)
        mine.digest_slice(clock)
        rows.append(mine.gather_row())
    return rows


def test_equal_replicas_show_no_divergence():
    slices = ReplicaSlices(_named(), 3)
    assert slices.divergence(_rows(slices, {}, 4, 3), [0, 1, 2], step=4) is None


def test_the_odd_rank_and_the_first_differing_parameter_are_named():
    named = _named()
    slices = ReplicaSlices(named, 1)
    err = slices.divergence(_rows(slices, {2: "1.weight"}, 0, 3), [0, 1, 2], step=5)
    assert err is not None and err.ranks == [2] and err.params == ["1.weight"]
    assert "first differing parameter 1.weight" in str(err) and err.step == 5


def test_an_element_outside_the_steps_slice_is_not_seen_until_its_turn():
    """The nudged element is the last one of the last parameter: slice K − 1 alone holds it."""
    slices = ReplicaSlices(_named(), 4)
    name = slices.named[-1][0]
    for clock in range(3):
        assert slices.divergence(_rows(slices, {1: name}, clock, 2), [0, 1], step=clock) is None
    err = slices.divergence(_rows(slices, {1: name}, 3, 2), [0, 1], step=3)
    assert err is not None and err.ranks == [0, 1] and err.params == [name]  # two: both


def test_every_slice_is_planned_at_construction_so_no_step_builds_a_plan():
    """A plan copies index tensors to the parameters' device: on CUDA that copy would be a host
    synchronization inside backward, so all K plans are built when the slices are made."""
    model = nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 3), nn.Linear(3, 5))
    slices = ReplicaSlices(list(model.named_parameters()), 24)
    planned = dict(slices.digest._plans)
    for clock in range(2 * slices.k):
        slices.digest_slice(clock)
    assert slices.digest._plans == planned and len(planned) > 1
