"""The clean check's two paths (``control_counts``): the host path a small CPU block takes gives
the tensor path's answer bit for bit, on every block the property tests can draw, and
``check_counts`` sends a block to the host only when it is small and on a CPU."""

from __future__ import annotations

import pytest
import torch
from count_blocks import PERTURB, WIRES, step_block
from hypothesis import example, given
from hypothesis import strategies as st

from openclaw_ref.sync.evidence import control_counts_host
from openclaw_ref.sync.evidence.control_counts import (
    HOST_CHECK_MAX_ELEMENTS,
    STEP_FIELDS,
    CountLayout,
    _agree,
    _spread,
    agrees,
    check_counts_tensor,
    spread,
)
from openclaw_ref.sync.evidence.control_counts_host import check_counts, check_counts_host

NAN, INF = float("nan"), float("inf")
# detail layout (W ≤ 64), its edge, the histogram layout, and bf16's two groups of 256 ranks
WORLDS = st.one_of(st.integers(1, 9), st.integers(60, 66), st.integers(257, 270))
# values a corrupted element takes: NaN and infinite counts, off-by-one and impossible counts
CORRUPT = st.tuples(st.integers(-2**20, 2**20), st.sampled_from([NAN, INF, -INF, 0.0, 1.0, 2.0,
                                                            3.0, -1.0, 255.0, 0.5]))
EXTRA = st.one_of(
    st.none(),
    st.lists(st.floats(allow_nan=True, allow_infinity=True), max_size=5).map(
        lambda v: torch.tensor(v, dtype=torch.float64)),
    st.lists(st.floats(width=32), max_size=5).map(lambda v: torch.tensor(v)),
    st.lists(st.integers(-2**63, 2**63 - 1), min_size=1, max_size=5).map(
        lambda v: torch.tensor(v, dtype=torch.int64)),  # beyond 2^53: rounded to float64
    st.booleans().map(lambda v: torch.tensor(v)))  # 0-dim


def both_paths(block: torch.Tensor, layout: CountLayout, buckets: int,
               extra: torch.Tensor | None = None) -> tuple[str, str]:
    """Each path's answer as its repr (exact for every float, NaN included)."""
    return (repr(check_counts_host(block, layout, buckets, extra)),
            repr(check_counts_tensor(block, layout, buckets, extra)))


@given(world=WORLDS, dtype=st.sampled_from(WIRES), buckets=st.integers(1, 40),
       seed=st.integers(0, 2**32 - 1),
       perturb=st.lists(st.tuples(PERTURB, st.integers(0, 300), st.integers(0, 39)),
                        max_size=6),
       replica=st.sampled_from(["same", "one differs", "some abstain", "none"]),
       corrupt=st.lists(CORRUPT, max_size=4), extra=EXTRA)
@example(world=2, dtype=torch.float32, buckets=8, seed=0, perturb=[], replica="same",
         corrupt=[], extra=None)  # the hook-cost job's step
@example(world=3, dtype=torch.float16, buckets=2, seed=1, replica="some abstain", corrupt=[],
         perturb=[("joined", 0, 0), ("joined", 1, 0), ("joined", 2, 0)], extra=None)
@example(world=4, dtype=torch.float32, buckets=3, seed=2, perturb=[("twice", 1, 1)],
         replica="one differs", corrupt=[(0, NAN), (140, INF)], extra=None)  # NaN n
@example(world=64, dtype=torch.bfloat16, buckets=1, seed=3, perturb=[], replica="same",
         corrupt=[(139 + 4 * 7 + 2, NAN), (-STEP_FIELDS, NAN)], extra=None)  # NaN ready, n
@example(world=65, dtype=torch.float16, buckets=2, seed=4, perturb=[("joined", 64, 1)],
         replica="none", corrupt=[], extra=torch.tensor([2**53 + 1], dtype=torch.int64))
def test_the_host_path_gives_the_tensor_paths_answer_on_every_block(
        world, dtype, buckets, seed, perturb, replica, corrupt, extra):
    """Clean steps and every perturbation ``count_blocks`` draws (a rank out of step on one
    field, joined, silent, counted twice, non-finite) in any buckets, replica rows agreeing or
    not, and elements overwritten afterwards with NaN, ±inf or counts no step can hold."""
    if world > 256:
        dtype, buckets = torch.bfloat16, min(buckets, 4)  # two groups; 256 ranks' writes each
    layout = CountLayout(world, dtype)
    g = torch.Generator().manual_seed(seed)
    ready = torch.randint(0, 5000, (buckets, world), generator=g).tolist()
    digest = int(torch.randint(-2**62, 2**62, (), generator=g))
    replicas = {"same": [digest] * world, "none": [None] * world,
                "one differs": [digest ^ 1] + [digest] * (world - 1),
                "some abstain": [None if r % 2 else digest for r in range(world)]}[replica]
    block = step_block(layout, buckets, ready, perturb, replicas)
    for at, value in corrupt:
        block[at % block.numel()] = value
    host, tensor = both_paths(block, layout, buckets, extra)
    assert host == tensor


def test_a_clean_step_passes_on_both_paths_and_a_silent_rank_fails_on_both():
    """The equality above is not two paths failing alike: a clean step passes both, with
    figures; one rank silent in one bucket fails that bucket on both."""
    layout = CountLayout(4, torch.float32)
    ready = [[10, 20, 30, 40], [5, 5, 5, 5]]
    clean = step_block(layout, 2, ready, [], [7] * 4)
    silent = step_block(layout, 2, ready, [("empty", 2, 1)], [7] * 4)
    for check in (check_counts_host, check_counts_tensor):
        ok, _ = check(clean, layout, 2)
        assert ok.ok == [True, True] and ok.replica_ok
        assert ok.figures[0].late_rank == 3 and 0.29 < ok.figures[0].skew_ms < 0.31
        assert ok.figures[1].late_rank == 0  # a tie: the first rank at the latest time
        failed, _ = check(silent, layout, 2)
        assert failed.ok == [True, False] and failed.counts[1][0] == 3.0


@pytest.mark.parametrize("counts,n", [([0.0, 2.0, -0.0], 2.0), ([0.0, 1.0], 2.0), ([NAN], 2.0),
                                      ([NAN, 0.0], NAN), ([0.0], NAN), ([0.0, 5.0], 0.0),
                                      ([INF, INF], INF), ([], 3.0)])
def test_the_host_agreement_rule_answers_as_its_tensor_form(counts, n):
    tensor = _agree(torch.tensor([counts], dtype=torch.float64), torch.tensor([n]))
    assert agrees(counts, n) == bool(tensor[0])


@pytest.mark.parametrize("marks,ms", [([1.0, 1.0, 1.0], [3.0, NAN, NAN]), ([0.0, 2.0], [3.0, 4.0]),
                                      ([1.0, 1.0], [5.0, 5.0]), ([1.0, 0.0, 1.0], [1.0, 9.0, 4.0]),
                                      ([1.0, 1.0], [INF, INF]), ([NAN, 1.0], [7.0, 2.0])])
def test_the_host_spread_rule_answers_as_its_tensor_form(marks, ms):
    """Ties (the first rank at the latest), NaN times (the first NaN), inactive ranks."""
    skew, late = _spread(torch.tensor([marks], dtype=torch.float64),
                         torch.tensor([ms], dtype=torch.float64))
    assert repr(spread(marks, ms)) == repr((skew.item(), int(late.item())))


def test_check_counts_takes_the_host_path_only_for_a_small_block_on_a_cpu(monkeypatch):
    taken = []
    for module, name in ((control_counts_host, "check_counts_tensor"),
                         (control_counts_host, "check_counts_host")):
        real = getattr(module, name)
        monkeypatch.setattr(module, name,
                            lambda *a, _n=name, _f=real: taken.append(_n) or _f(*a))
    layout = CountLayout(2, torch.float32)
    most = (HOST_CHECK_MAX_ELEMENTS - STEP_FIELDS) // layout.row  # buckets the host path takes
    assert layout.size(most) <= HOST_CHECK_MAX_ELEMENTS < layout.size(most + 1)
    for buckets in (1, most, most + 1):
        check_counts(torch.zeros(layout.size(buckets)), layout, buckets)
    monkeypatch.setattr(control_counts_host, "check_counts_tensor",
                        lambda *a: taken.append("meta"))
    check_counts(torch.zeros(layout.size(1), device="meta"), layout, 1)
    assert taken == ["check_counts_host", "check_counts_host", "check_counts_tensor", "meta"]
