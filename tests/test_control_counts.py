"""The counted step block (``control_counts``): its clean check passes exactly the buckets the
per-rank ``verify`` passes, with the same figures, on every wire dtype and at every world size,
in bytes that do not grow with the world size."""

from __future__ import annotations

import pytest
import torch
from count_blocks import PERTURB, WIRES, contribution, perturbed, slot, summed
from hypothesis import assume, example, given
from hypothesis import strategies as st

from openclaw_ref.experiments.verify_scale import hist_bin
from openclaw_ref.sync.errors import ConsistencyError
from openclaw_ref.sync.evidence.control import verify
from openclaw_ref.sync.evidence.control_counts import (
    DETAIL_MAX_RANKS,
    HIST_BINS,
    HIST_PER_OCTAVE,
    CountLayout,
    bin_floor_ms,
    first_failing_field,
    ready_bin,
)
from openclaw_ref.sync.evidence.control_counts_host import check_counts
from openclaw_ref.sync.evidence.control_counts_write import write_counts
from openclaw_ref.sync.evidence.control_layout import READY_UNIT_US, decode_block, joined_slot

CAUSE = {"ClockMismatch": {"clock"}, "BucketMisalignment": {"missing", "bucket", "digest"},
         "ScaleMismatch": {"scale"}, "MissingGradient": {"absent"}}


def per_rank(slots: list[list[int]]) -> list[float]:
    """Today's per-rank reduced block of one bucket: every rank's slot at its position."""
    return [float(v) for s in slots for v in s]


def _verify(slots):
    try:
        v = verify(decode_block(per_rank(slots), len(slots)), bucket=3, params=["w"])
    except ConsistencyError as exc:
        return ("raise", type(exc).__name__)
    if v.nonfinite_ranks:
        return ("nonfinite",)
    return ("ok", round(v.skew_ms, 6), v.late_rank, v.ready_ms, v.joined)


def counted(layout: CountLayout, writes: list[list[list[int]]]):
    parts = [contribution(layout, r, [s]) for r, ws in enumerate(writes) for s in ws]
    block = summed(parts) if parts else torch.zeros(layout.size(1), dtype=layout.dtype)
    checked, _ = check_counts(block, layout, 1)
    return checked


@pytest.mark.parametrize("dtype", WIRES, ids=str)
@given(world=st.integers(1, 9), ready=st.lists(st.integers(0, 5000), min_size=9, max_size=9),
       perturb=st.lists(st.tuples(PERTURB, st.integers(0, 8)), max_size=3))
@example(world=2, ready=[5, 5] + [0] * 7, perturb=[])  # a tie: the lowest rank is late
@example(world=3, ready=[0] * 9, perturb=[("joined", 1)])
@example(world=3, ready=[0] * 9, perturb=[("joined", 0), ("joined", 1), ("joined", 2)])
def test_the_count_check_passes_exactly_what_verify_passes_with_the_same_figures(
        dtype, world, ready, perturb):
    """Every perturbation of today's test except one rank's contribution landing twice while
    another's is missing: sums cannot tell that from two good contributions, and it cannot
    arise — each rank writes its own contribution once (``write_counts`` zero-fills first)."""
    assume(not {"twice", "empty"} <= {kind for kind, _ in perturb})
    slots, writes = perturbed(world, ready, perturb)
    slow = _verify(slots)
    checked = counted(CountLayout(world, dtype), writes)
    if slow[0] != "ok":
        assert checked.ok == [False]
        return
    assert checked.ok == [True]
    f = checked.figures[0]
    assert ("ok", round(f.skew_ms, 6), f.late_rank, f.ready_ms, f.joined) == slow


@given(world=st.integers(1, 9), perturb=st.lists(st.tuples(PERTURB, st.integers(0, 8)),
                                                 min_size=1, max_size=3))
def test_the_counts_alone_tell_the_first_cause_verify_raises(world, perturb):
    """What a step with a joined rank (no gather) reports: the kind of ``verify``'s error."""
    assume(not {"twice", "empty"} <= {kind for kind, _ in perturb})
    slots, writes = perturbed(world, [0] * 9, perturb)
    slow = _verify(slots)
    checked = counted(CountLayout(world, torch.float32), writes)
    field = None if checked.ok[0] else first_failing_field(checked.counts[0], world)
    if slow[0] == "raise":
        assert field in CAUSE[slow[1]]
    elif slow[0] == "nonfinite":
        assert field == "nonfinite"
    else:
        assert field is None


@pytest.mark.parametrize("dtype,world", [(torch.float32, 65), (torch.bfloat16, 300),
                                         (torch.float16, 2100)], ids=str)
def test_beyond_the_exact_limit_ranks_are_counted_in_groups_and_still_agree_exactly(dtype,
                                                                                     world):
    layout = CountLayout(world, dtype)
    assert layout.groups == -(-world // {torch.float32: 2**24, torch.bfloat16: 256,
                                         torch.float16: 2048}[dtype])
    clean = [[slot(ready_s=r * 1e-4)] for r in range(world)]
    assert counted(layout, clean).ok == [True]
    for kind in ("clock", "nonfinite", "empty", "twice"):
        _, writes = perturbed(world, [0] * world, [(kind, world - 1)])
        assert counted(layout, writes).ok == [False], kind


@given(ready=st.lists(st.integers(0, 2**24 - 1), min_size=65, max_size=70))
@example(ready=[0] * 65)
def test_beyond_64_ranks_the_skew_is_exact_to_one_histogram_bin(ready):
    world = len(ready)
    layout = CountLayout(world, torch.float32)
    assert not layout.detail
    checked = counted(layout, [[slot(ready_s=u * 1e-5)] for u in ready])
    f = checked.figures[0]
    exact = (max(ready) - min(ready)) * 1e-2  # ms
    bin_width = max(max(ready), 1) * 1e-2 * (2 ** (1 / HIST_PER_OCTAVE) - 1)
    assert f.late_rank is None and f.ready_ms is None
    assert abs(f.skew_ms - exact) <= bin_width + 1e-2


@pytest.mark.parametrize("dtype", WIRES, ids=str)
def test_replica_digests_agree_by_counts_and_a_joined_rank_abstains(dtype):
    layout = CountLayout(4, dtype)
    s = [slot()]
    digest = -0x1234_5678_9ABC_DEF0
    same = [contribution(layout, r, s, digest) for r in range(4)]
    assert check_counts(summed(same), layout, 1)[0].replica_ok
    joined = same[:3] + [contribution(layout, 3, [joined_slot()])]
    assert check_counts(summed(joined), layout, 1)[0].replica_ok
    one_bit = same[:3] + [contribution(layout, 3, s, digest ^ 1)]
    sign = same[:3] + [contribution(layout, 3, s, -digest)]
    for parts in (one_bit, sign):
        check, _ = check_counts(summed(parts), layout, 1)
        assert check.ok == [True] and not check.replica_ok


def test_a_nan_on_one_rank_fails_the_counts_through_the_device_flag():
    layout = CountLayout(3, torch.float16)
    parts = [contribution(layout, r, [slot()]) for r in range(3)]
    flagged = torch.zeros(layout.size(1), dtype=torch.float16)
    write_counts(flagged, layout, 1, torch.tensor([slot()]), flags=torch.tensor([True]))
    assert check_counts(summed(parts), layout, 1)[0].ok == [True]
    assert check_counts(summed([parts[0], flagged, parts[2]]), layout, 1)[0].ok == [False]


@pytest.mark.parametrize("dtype", WIRES, ids=str)
def test_a_digest_written_from_the_host_is_the_block_a_device_digest_writes(dtype):
    layout = CountLayout(3, dtype)
    s = torch.tensor([slot(), slot(bucket=4)])
    for digest in (0, 1, -1, -0x1234_5678_9ABC_DEF0, (1 << 63) - 1, -(1 << 63)):
        host, device = (torch.full((layout.size(2),), 9.0, dtype=dtype) for _ in range(2))
        write_counts(host, layout, 1, s, replica=digest)
        write_counts(device, layout, 1, s, replica=torch.tensor(digest, dtype=torch.int64))
        assert torch.equal(host, device), digest


def test_a_nan_on_one_rank_fails_the_counts_through_a_host_flag_and_only_its_bucket():
    layout = CountLayout(3, torch.float32)
    slots = [slot(), slot(bucket=4)]
    parts = [contribution(layout, r, slots) for r in range(3)]
    flagged = torch.zeros(layout.size(2))
    write_counts(flagged, layout, 1, torch.tensor(slots), flags=[False, True])
    clean = torch.zeros(layout.size(2))
    write_counts(clean, layout, 1, torch.tensor(slots), flags=[False, False])
    assert torch.equal(clean, parts[1])
    assert check_counts(summed([parts[0], flagged, parts[2]]), layout, 2)[0].ok == [True, False]


def test_extra_values_ride_along_in_the_one_host_read():
    layout = CountLayout(2, torch.float32)
    block = summed([contribution(layout, r, [slot(), slot(bucket=4)]) for r in range(2)])
    checked, extra = check_counts(block, layout, 2, torch.tensor([1.5, float("inf")]))
    assert checked.ok == [True, True] and extra == [1.5, float("inf")]


@pytest.mark.parametrize("buckets", [16, 128, 1024])
def test_block_bytes_at_8192_ranks_stay_within_twice_those_at_8_ranks_on_fp32(buckets):
    small, large = (CountLayout(w, torch.float32).nbytes(buckets) for w in (8, 8192))
    assert large <= 2 * small
    assert CountLayout(DETAIL_MAX_RANKS + 1, torch.float32).row == CountLayout(
        2**24, torch.float32).row  # no growth with W beyond the ready detail


@given(units=st.lists(st.integers(0, (1 << 24) - 1), min_size=1, max_size=50))
@example(units=[0, 1, 2, 3, 46340, 46341, (1 << 24) - 1, 1 << 12, (1 << 12) - 1])
def test_the_host_and_tensor_ready_bins_are_the_same_integer_formula(units):
    """``ready_bin`` (host, one slot) and ``hist_bin`` (tensor, the scale experiment's
    synthesized blocks) bin every ready time alike, and bin k starts at ``bin_floor_ms(k)``."""
    tensor = hist_bin(torch.tensor(units)).tolist()
    assert tensor == [ready_bin(u) for u in units]
    for u, k in zip(units, tensor):
        ms = u * READY_UNIT_US / 1e3
        assert bin_floor_ms(k) <= ms + 1e-12
        assert k == HIST_BINS - 1 or ms < bin_floor_ms(k + 1)
