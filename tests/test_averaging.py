"""The bucket-average check (``conformance/averaging.py``) on hand-made buckets, no processes:
a correct average passes on its wire, each broken hook's result is caught and attributed to the
rank it wrongs, and the rounding bound is tight enough to tell an fp16 wire from an fp32 one."""

from __future__ import annotations

import pytest
import torch

from openclaw_ref.conformance.averaging import check_bucket, first_fault
from openclaw_ref.sync.base import Wire


def local_buckets(world: int = 2, n: int = 64, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, generator=g) * (1 + r) for r in range(world)]


def average(buckets: list[torch.Tensor]) -> torch.Tensor:
    return torch.stack(buckets).sum(0) / len(buckets)


@pytest.mark.parametrize("world", [2, 3, 4])
def test_the_average_passes_on_every_rank(world):
    g = local_buckets(world)
    assert check_bucket(0, 0, g, [average(g)] * world, Wire.FP32) is None


def test_an_fp16_wire_passes_as_fp16_and_is_too_coarse_to_pass_as_fp32():
    g = local_buckets()
    wire = (torch.stack([x.half() / 2 for x in g]).sum(0)).float()  # PyTorch's fp16 hook
    assert check_bucket(0, 0, g, [wire] * 2, Wire.FP16) is None
    assert check_bucket(0, 0, g, [wire] * 2, Wire.FP32) is not None


def test_a_sum_without_the_division_names_every_rank():
    g = local_buckets()
    fault = check_bucket(0, 0, g, [g[0] + g[1]] * 2, Wire.FP32)
    assert fault.ranks == [0, 1] and fault.weights == pytest.approx([1.0, 1.0])


def test_one_rank_scaled_before_the_average_names_that_rank():
    g = local_buckets()
    fault = check_bucket(3, 1, g, [(g[0] + 2 * g[1]) / 2] * 2, Wire.FP32)
    assert (fault.step, fault.bucket, fault.ranks) == (3, 1, [1])
    assert fault.weights == pytest.approx([0.5, 1.0])


def test_a_rank_that_keeps_its_own_bucket_is_named_as_un_reduced():
    g = local_buckets(world=3)
    results = [average(g), g[1].clone(), average(g)]
    fault = check_bucket(0, 0, g, results, Wire.FP32)
    assert fault.ranks == [1] and "un-reduced" in fault.detail


def test_slices_in_another_order_are_moved_not_weighted():
    g = local_buckets()
    first, second = average(g).split([40, 24])
    fault = check_bucket(0, 0, g, [torch.cat([second, first])] * 2, Wire.FP32)
    assert fault.ranks == [0, 1] and "moved or mixed" in fault.detail


def test_ranks_with_equal_buckets_are_all_named_when_their_weights_cannot_be_told_apart():
    g = local_buckets(world=1) * 2  # the same gradient on both ranks
    fault = check_bucket(0, 0, g, [g[0] * 2] * 2, Wire.FP32)
    assert fault.ranks == [0, 1]


def test_a_nan_result_is_not_an_average():
    g = local_buckets()
    bad = average(g)
    bad[5] = float("nan")
    assert check_bucket(0, 0, g, [bad, average(g)], Wire.FP32).ranks == [0]


def test_sparse_buckets_are_judged_as_their_dense_values():
    dense = local_buckets(n=12)
    g = [x.to_sparse() for x in dense]
    assert check_bucket(0, 0, g, [average(dense).to_sparse()] * 2, Wire.FP32) is None
    assert check_bucket(0, 0, g, [(dense[0] + dense[1]).to_sparse()] * 2, Wire.FP32) is not None


def test_the_first_fault_is_found_by_step_then_bucket_and_a_bucket_one_rank_lacks_is_skipped():
    g = local_buckets()
    good, bad = (0, g[0], average(g)), (1, g[0], g[0] + g[1])
    rank0 = [[good], [good, (1, g[0], g[0] * 2)]]
    rank1 = [[(0, g[1], average(g)), (1, g[1], g[1] * 7)], [(0, g[1], average(g)), bad]]
    fault, checked = first_fault([rank0, rank1], Wire.FP32)
    assert (fault.step, fault.bucket) == (1, 1) and checked == 3
