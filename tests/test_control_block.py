"""The control block: exact in every wire dtype after a SUM, and a verdict that names the right
rank from the reduced block alone."""

from __future__ import annotations

import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

from openclaw_ref.errors import (
    BucketMisalignment, ClockMismatch, MissingGradient, NonFiniteGradient, ScaleMismatch,
)
from openclaw_ref.sync.control import (
    SLOT_FIELDS, block_size, decode_block, encode_slot, membership_digest, verify, write_block,
)

WIRES = [torch.float32, torch.float16, torch.bfloat16]


def reduce_blocks(slots: list[list[int]], dtype: torch.dtype, flags=None) -> list[float]:
    """What the allreduce does: each rank writes its own slot into a zeroed block; SUM."""
    world = len(slots)
    total = torch.zeros(block_size(world), dtype=dtype)
    for r, slot in enumerate(slots):
        block = torch.empty(block_size(world), dtype=dtype)
        flag = None if flags is None else torch.tensor(flags[r])
        write_block(block, r, slot, flag)
        total += block
    return total.tolist()


def slot(clock=7, bucket=3, digest=0xDEADBEEF01234567, scale_exp=12, ready_s=0.0123,
         absent=None):
    return encode_slot(clock=clock, bucket=bucket, digest=digest, scale_exp=scale_exp,
                       ready_s=ready_s, absent=absent)


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


def test_a_local_nan_raises_non_finite_gradient_naming_the_rank():
    reduced = reduce_blocks([slot(), slot()], torch.float16, flags=[False, True])
    with pytest.raises(NonFiniteGradient) as err:
        verify(decode_block(reduced, 2), bucket=0, params=[])
    assert err.value.ranks == [1]


@pytest.mark.parametrize("dtype", WIRES, ids=str)
def test_a_required_gradient_absent_on_one_rank_raises_missing_gradient_naming_it(dtype):
    reduced = reduce_blocks([slot(), slot(), slot(absent=1)], dtype)
    with pytest.raises(MissingGradient) as err:
        verify(decode_block(reduced, 3), bucket=3, params=["w1", "v_proj", "b"])
    assert err.value.ranks == [2] and err.value.params == ["v_proj"] and err.value.step == 7


def test_no_absent_gradient_decodes_as_none():
    assert all(s.absent is None for s in decode_block(reduce_blocks([slot(), slot()],
                                                                     torch.float16), 2))


def test_a_tie_is_decided_for_the_lowest_rank():
    slots = [slot(scale_exp=12), slot(scale_exp=10)]
    with pytest.raises(ScaleMismatch) as err:
        verify(decode_block(reduce_blocks(slots, torch.float16), 2), bucket=0, params=[])
    assert err.value.ranks == [1]


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
    from openclaw_ref.sync.control import joined_slot

    slots = [slot(clock=7), joined_slot(), slot(clock=7)]
    verdict = verify(decode_block(reduce_blocks(slots, torch.float16), 3), bucket=3, params=["w"])
    assert verdict.late_rank in (0, 2) and len(verdict.ready_ms) == 2


def test_a_joined_rank_does_not_hide_a_clock_mismatch_among_the_active_ones():
    from openclaw_ref.sync.control import joined_slot

    slots = [slot(clock=7), joined_slot(), slot(clock=7), slot(clock=8)]
    with pytest.raises(ClockMismatch) as err:
        verify(decode_block(reduce_blocks(slots, torch.float32), 4), bucket=3, params=["w"])
    assert err.value.ranks == [3]
