"""The control block: exact in every wire dtype after a SUM, and a verdict that names the right
rank from the reduced block alone."""

from __future__ import annotations

import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

from openclaw_ref.arms.blocks import READY_DETAIL_MAX_RANKS, block_size, check_blocks, write_block
from openclaw_ref.sync.errors import (
    BucketMisalignment,
    ClockMismatch,
    ConsistencyError,
    MissingGradient,
    ScaleMismatch,
)
from openclaw_ref.sync.evidence.control import verify
from openclaw_ref.sync.evidence.control_layout import (
    SLOT_FIELDS,
    decode_block,
    encode_slot,
    joined_slot,
    membership_digest,
    unissued_slot,
)

WIRES = [torch.float32, torch.float16, torch.bfloat16]


def reduced_block(slots: list[list[int]], dtype: torch.dtype) -> torch.Tensor:
    """What the allreduce does: each rank writes its own slot into a zeroed block; SUM."""
    world = len(slots)
    total = torch.zeros(block_size(world), dtype=dtype)
    for r, slot in enumerate(slots):
        block = torch.empty(block_size(world), dtype=dtype)
        write_block(block, r, slot)
        total += block
    return total


def reduce_blocks(slots: list[list[int]], dtype: torch.dtype) -> list[float]:
    return reduced_block(slots, dtype).tolist()


def slot(clock=7, bucket=3, digest=0xDEADBEEF01234567, scale_exp=12, ready_s=0.0123,
         absent=None, nonfinite=False):
    return encode_slot(clock=clock, bucket=bucket, digest=digest, scale_exp=scale_exp,
                       ready_s=ready_s, absent=absent, nonfinite=nonfinite)


@pytest.mark.parametrize("dtype", WIRES, ids=str)
@given(clock=st.integers(0, 2**32 - 1), bucket=st.integers(0, 2**16 - 1),
       digest=st.integers(0, 2**64 - 1), scale_exp=st.integers(-128, 127),
       ready_s=st.floats(0, 100), world=st.integers(1, 8))
@example(clock=2**32 - 1, bucket=2**16 - 1, digest=2**64 - 1, scale_exp=127, ready_s=0.0, world=1)
def test_every_field_survives_the_sum_exactly_in_every_wire_dtype(
        dtype, clock, bucket, digest, scale_exp, ready_s, world):
    slots = [encode_slot(clock=clock + r, bucket=bucket, digest=digest ^ r, scale_exp=scale_exp,
                         ready_s=ready_s) for r in range(world)]
    decoded = decode_block(reduce_blocks(slots, dtype), world)
    for r, s in enumerate(decoded):
        assert s.valid
        assert s.clock == (clock + r) % 2**32
        assert (s.bucket, s.digest, s.scale_exp) == (bucket, digest ^ r, scale_exp)
        assert abs(s.ready_ms - ready_s * 1e3) <= 0.01 + 1e-9 or ready_s > 167


def test_the_block_has_one_slot_per_rank():
    assert block_size(4) == 4 * SLOT_FIELDS


def test_agreeing_ranks_pass_and_give_skew_and_late_rank():
    slots = [slot(ready_s=0.010), slot(ready_s=0.013), slot(ready_s=0.011)]
    verdict = verify(decode_block(reduce_blocks(slots, torch.float16), 3), bucket=3, params=["w"])
    assert verdict.late_rank == 1
    assert verdict.skew_ms == pytest.approx(3.0, abs=0.02)


def test_a_rank_ahead_raises_clock_mismatch_naming_it():
    slots = [slot(), slot(), slot(clock=8), slot()]
    with pytest.raises(ClockMismatch) as err:
        verify(decode_block(reduce_blocks(slots, torch.float16), 4), bucket=3, params=["w"])
    assert (err.value.ranks, err.value.step, err.value.bucket) == ([2], 7, 3)


def test_different_membership_raises_bucket_misalignment_naming_the_rank():
    slots = [slot(), slot(digest=1), slot()]
    with pytest.raises(BucketMisalignment) as err:
        verify(decode_block(reduce_blocks(slots, torch.bfloat16), 3), bucket=3, params=["a", "b"])
    assert err.value.ranks == [1] and err.value.params == ["a", "b"]


def test_different_bucket_index_raises_bucket_misalignment():
    slots = [slot(), slot(), slot(bucket=4)]
    with pytest.raises(BucketMisalignment) as err:
        verify(decode_block(reduce_blocks(slots, torch.float32), 3), bucket=3, params=[])
    assert err.value.ranks == [2] and err.value.bucket == 3


def test_the_seeds_two_scales_raise_scale_mismatch_naming_the_rank():
    slots = [slot(scale_exp=12), slot(scale_exp=12), slot(scale_exp=12), slot(scale_exp=10)]
    with pytest.raises(ScaleMismatch) as err:
        verify(decode_block(reduce_blocks(slots, torch.float16), 4), bucket=0, params=[])
    assert err.value.ranks == [3] and err.value.step == 7




@pytest.mark.parametrize("dtype", WIRES, ids=str)
def test_a_required_gradient_absent_on_one_rank_raises_missing_gradient_naming_it(dtype):
    reduced = reduce_blocks([slot(), slot(), slot(absent=1)], dtype)
    with pytest.raises(MissingGradient) as err:
        verify(decode_block(reduced, 3), bucket=3, params=["w1", "v_proj", "b"])
    assert err.value.ranks == [2] and err.value.params == ["v_proj"] and err.value.step == 7


@pytest.mark.parametrize("dtype", WIRES, ids=str)
def test_a_bucket_one_rank_never_issued_raises_missing_gradient_naming_it(dtype):
    reduced = reduce_blocks([slot(), unissued_slot(slot()), slot()], dtype)
    with pytest.raises(MissingGradient) as err:
        verify(decode_block(reduced, 3), bucket=3, params=["w1", "b"])
    assert err.value.ranks == [1] and err.value.step == 7 and err.value.bucket == 3
    assert "DDP never reduced this backward's last bucket" in str(err.value)


def test_a_bucket_every_rank_issued_decodes_as_issued():
    slots = decode_block(reduce_blocks([slot(), slot()], torch.float32), 2)
    assert not any(s.unissued for s in slots)


def test_no_absent_gradient_decodes_as_none():
    assert all(s.absent is None for s in decode_block(reduce_blocks([slot(), slot()],
                                                                     torch.float16), 2))


def test_a_tie_names_every_rank_and_says_either_may_be_faulty():
    slots = [slot(scale_exp=12), slot(scale_exp=10)]
    with pytest.raises(ScaleMismatch) as err:
        verify(decode_block(reduce_blocks(slots, torch.float16), 2), bucket=0, params=[])
    assert err.value.ranks == [0, 1] and "either side may be the faulty one" in str(err.value)


@pytest.mark.parametrize("field,values,error", [
    ("clock", (8, 7), ClockMismatch), ("bucket", (3, 4), BucketMisalignment),
    ("digest", (1, 2), BucketMisalignment), ("scale_exp", (12, 10), ScaleMismatch)])
def test_two_ranks_that_disagree_are_not_called_a_majority_and_both_values_are_given(
        field, values, error):
    slots = [slot(**{field: values[0]}), slot(**{field: values[1]})]
    with pytest.raises(error) as err:
        verify(decode_block(reduce_blocks(slots, torch.float32), 2), bucket=3, params=[])
    message = str(err.value)
    assert "most" not in message and "the ranks disagree, no majority" in message
    assert "rank 0: " in message and "rank 1: " in message


def test_a_tie_between_many_ranks_is_no_majority_either():
    slots = [slot(clock=7), slot(clock=7), slot(clock=8), slot(clock=8)]
    with pytest.raises(ClockMismatch) as err:
        verify(decode_block(reduce_blocks(slots, torch.float32), 4), bucket=3, params=[])
    assert "no majority" in str(err.value) and "rank 3: step 8" in str(err.value)


def test_a_real_majority_is_stated_with_its_size_and_the_others_values():
    slots = [slot(), slot(), slot(clock=9), slot()]
    with pytest.raises(ClockMismatch) as err:
        verify(decode_block(reduce_blocks(slots, torch.float32), 4), bucket=3, params=[])
    assert "step 7 on 3 of 4 ranks, {rank 2: step 9}" in str(err.value)


def test_a_rank_that_wrote_no_slot_is_named():
    reduced = reduce_blocks([slot(), slot()], torch.float16)
    reduced[SLOT_FIELDS:] = [0.0] * SLOT_FIELDS
    with pytest.raises(BucketMisalignment) as err:
        verify(decode_block(reduced, 2), bucket=0, params=[])
    assert err.value.ranks == [1] and err.value.step == 7


def test_two_ranks_writing_the_same_slot_are_caught_not_misread():
    world = 2
    total = torch.zeros(block_size(world), dtype=torch.float16)
    for _ in range(2):  # both believe they are rank 0
        block = torch.empty(block_size(world), dtype=torch.float16)
        write_block(block, 0, slot())
        total += block
    decoded = decode_block(total.tolist(), world)
    assert not decoded[0].valid and not decoded[1].valid


def test_membership_digest_depends_on_order_names_shapes_and_slices():
    a = [("x", (2, 3), "torch.float32", 0, 6), ("y", (2, 3), "torch.float32", 0, 6)]
    assert membership_digest(a) != membership_digest(a[::-1])
    assert membership_digest(a) != membership_digest([("x", (3, 2), "torch.float32", 0, 6), a[1]])
    assert membership_digest(a) != membership_digest([("x", (2, 3), "torch.float32", 0, 5), a[1]])
    assert membership_digest(a) == membership_digest(list(a))


def test_a_joined_ranks_slot_abstains_from_every_comparison():
    slots = [slot(clock=7), joined_slot(), slot(clock=7)]
    verdict = verify(decode_block(reduce_blocks(slots, torch.float16), 3), bucket=3, params=["w"])
    assert verdict.late_rank in (0, 2) and len(verdict.ready_ms) == 2


def test_a_joined_rank_does_not_hide_a_clock_mismatch_among_the_active_ones():
    slots = [slot(clock=7), joined_slot(), slot(clock=7), slot(clock=8)]
    with pytest.raises(ClockMismatch) as err:
        verify(decode_block(reduce_blocks(slots, torch.float32), 4), bucket=3, params=["w"])
    assert err.value.ranks == [3]


# --- the vectorized rule agrees with verify() ----------------------------------------------


def _slow(slots, dtype):
    """verify()'s answer: the error kind and ranks, or the skew and late rank."""
    try:
        v = verify(decode_block(reduce_blocks(slots, dtype), len(slots)), bucket=3, params=["w"])
    except ConsistencyError as exc:
        return ("raise", type(exc).__name__, exc.ranks)
    if v.nonfinite_ranks:
        return ("nonfinite", v.nonfinite_ranks)
    return ("ok", round(v.skew_ms, 6), v.late_rank, v.ready_ms)


def _fast(slots, dtype, rank):
    checked, _ = check_blocks(reduced_block(slots, dtype)[None], [3], rank)
    v = checked.verdicts[0]
    return None if v is None else ("ok", round(v.skew_ms, 6), v.late_rank, v.ready_ms)


PERTURB = st.sampled_from(["none", "clock", "bucket", "digest", "scale", "absent", "joined",
                           "empty", "collide", "nonfinite", "unissued"])


@pytest.mark.parametrize("dtype", WIRES, ids=str)
@given(world=st.integers(1, 9), ready=st.lists(st.integers(0, 5000), min_size=9, max_size=9),
       perturb=st.lists(st.tuples(PERTURB, st.integers(0, 8)), max_size=3))
@example(world=2, ready=[5, 5] + [0] * 7, perturb=[])  # a tie: the lowest rank is late
@example(world=3, ready=[0] * 9, perturb=[("joined", 1)])
def test_check_blocks_passes_exactly_the_buckets_verify_passes_with_the_same_figures(
        dtype, world, ready, perturb):
    """Seen from every rank that is itself active (a joined rank does not settle). A bucket
    with a joined slot is left to ``verify``; every other verdict must match it exactly."""
    slots = [slot(ready_s=ready[r] * 1e-5) for r in range(world)]
    for kind, r in perturb:
        r %= world
        if kind == "joined":
            slots[r] = joined_slot()
        elif kind == "empty":
            slots[r] = [0] * SLOT_FIELDS
        elif kind == "collide":
            slots[r] = [a + b for a, b in zip(slots[r], slots[(r + 1) % world])]
        elif kind == "unissued":
            slots[r] = unissued_slot(slot(ready_s=ready[r] * 1e-5))
        elif kind != "none":
            field = {"clock": "clock", "bucket": "bucket", "digest": "digest",
                     "scale": "scale_exp", "absent": "absent", "nonfinite": "nonfinite"}[kind]
            slots[r] = slot(ready_s=ready[r] * 1e-5, **{field: 1})
    slow = _slow(slots, dtype)
    joined = any(s == joined_slot() for s in slots)
    for rank in range(world):
        if slots[rank][0] not in (0xA5, 0x3C):
            continue  # only an active rank runs the check (0x3C: it sent zeros, and settles)
        fast = _fast(slots, dtype, rank)
        if slow[0] != "ok" or joined:
            assert fast is None
        else:
            assert fast == slow


def test_check_blocks_names_nothing_itself_and_flags_only_the_bad_bucket():
    good = reduced_block([slot(), slot()], torch.float32)
    bad = reduced_block([slot(), slot(clock=8)], torch.float32)
    checked, riders = check_blocks(torch.stack([good, bad, good]), [0, 1, 2], 0,
                                   torch.tensor([1.5, float("inf")]))
    assert checked.ok == [True, False, True] and checked.verdicts[1] is None
    assert riders == [1.5, float("inf")]


def test_per_rank_ready_times_stay_on_the_device_beyond_the_detail_limit():
    world = READY_DETAIL_MAX_RANKS + 1
    checked, _ = check_blocks(reduced_block([slot()] * world, torch.float32)[None], [3], 0)
    assert checked.verdicts[0].ready_ms is None and checked.verdicts[0].skew_ms == 0.0


def test_a_local_nan_is_named_by_verify_and_never_passed_by_check_blocks():
    slots = [slot(), slot(nonfinite=True), slot()]
    verdict = verify(decode_block(reduce_blocks(slots, torch.float32), 3), bucket=3, params=[])
    assert verdict.nonfinite_ranks == (1,)
    checked, _ = check_blocks(reduced_block(slots, torch.float32)[None], [3], 0)
    assert checked.ok == [False]
