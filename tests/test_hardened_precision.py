"""Wire precision: divide before the cast, one scale for all, overflow counted, dynamic scale."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from openclaw_ref.sync.base import ScaleMode, SyncConfig
from openclaw_ref.sync.errors import BadInput
from openclaw_ref.sync.evidence.precision import (
    OverflowStats,
    ScalePolicy,
    count_nonfinite,
    divide,
    finite_sum,
    from_wire,
    to_wire,
)


def simulated_allreduce(locals_: list[torch.Tensor], wire: torch.dtype,
                        exponent: int) -> torch.Tensor:
    """Our wire path on W local tensors, the SUM done in the wire dtype as gloo/NCCL do."""
    world = len(locals_)
    outs = []
    for g in locals_:
        out = torch.empty(g.numel(), dtype=wire)
        to_wire(g, out, world, exponent)
        outs.append(out)
    total = outs[0].clone()
    for o in outs[1:]:
        total += o
    return from_wire(total, exponent)


def torch_fp16_compress(locals_: list[torch.Tensor]) -> torch.Tensor:
    """What torch's fp16_compress_hook does: cast first, then divide, then SUM."""
    world = len(locals_)
    total = torch.zeros(locals_[0].numel(), dtype=torch.float16)
    for g in locals_:
        total += g.to(torch.float16).div_(world)
    return total.float()


def test_dividing_before_the_cast_keeps_a_local_element_above_fp16_max_finite():
    locals_ = [torch.tensor([70656.0, 1.0]), torch.tensor([0.0, 1.0])]
    ours = simulated_allreduce(locals_, torch.float16, exponent=0)
    theirs = torch_fp16_compress(locals_)
    assert torch.isfinite(ours).all() and ours[0] == 35328.0  # exact in fp16
    assert torch.isinf(theirs[0])


def test_an_average_above_fp16_max_overflows_and_is_counted():
    locals_ = [torch.tensor([70000.0, 1.0]), torch.tensor([70000.0, 1.0])]
    ours = simulated_allreduce(locals_, torch.float16, exponent=0)
    assert int(count_nonfinite(ours)) == 1


NORMAL_FP32 = st.floats(-1e3, 1e3, allow_nan=False, width=32).filter(
    lambda v: v == 0 or abs(v) >= 2**-100)  # dividing a subnormal by W may round it away


@given(st.lists(NORMAL_FP32, min_size=1, max_size=64), st.integers(1, 8))
def test_fp32_wire_average_is_the_exact_mean_for_power_of_two_worlds(values, log_world):
    world = 2 ** (log_world % 3)
    g = torch.tensor(values, dtype=torch.float32)
    avg = simulated_allreduce([g] * world, torch.float32, exponent=0)
    torch.testing.assert_close(avg, g, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64],
                         ids=str)
@pytest.mark.parametrize("divisor", [1, 2, 8, 1024, 2.0 ** -11, 3, 6, 0.75])
def test_dividing_gives_torch_divs_bits_whether_or_not_the_divisor_is_a_power_of_two(
        dtype, divisor):
    torch.manual_seed(0)
    t = torch.cat([torch.randn(4096) * 10.0 ** torch.randint(-40, 40, (4096,)).float(),
                   torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"),
                                 1e-45, -1e-45, 3.4e38, 6e-8, 65504.0])]).to(dtype)
    expected = torch.div(t, divisor)
    got = divide(t, divisor, out=torch.empty_like(t))
    assert torch.equal(got.view(torch.uint8), expected.view(torch.uint8))
    inplace = t.clone()
    divide(inplace, divisor, out=inplace)
    assert torch.equal(inplace.view(torch.uint8), expected.view(torch.uint8))


def test_fp32_wire_hands_back_a_view_not_a_copy():
    t = torch.ones(4)
    assert from_wire(t, 0).data_ptr() == t.data_ptr()


def test_the_wire_is_divided_before_it_is_rounded_to_fp16():
    out = torch.empty(2, dtype=torch.float16)
    to_wire(torch.tensor([131000.0, 1.0]), out, 4, 0)  # 131000 itself is past fp16's max
    assert out.tolist() == [32752.0, 0.25]
    to_wire(torch.tensor([1e9, 1.0]), out, 2, 12)  # finite locally, inf on the wire
    assert torch.isinf(out[0])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_the_sum_flag_fires_on_nan_and_inf_and_not_on_a_finite_half_tensor(dtype):
    big = torch.full((64,), 60000.0 if dtype == torch.float16 else 1e30, dtype=dtype)
    assert math.isfinite(float(finite_sum(big)))  # fp16 values summed in fp32: no false flag
    for bad in (float("nan"), float("inf"), float("-inf")):
        t = torch.ones(64, dtype=dtype)
        t[17] = bad
        assert not math.isfinite(float(finite_sum(t)))


def test_a_sum_that_overflows_flags_but_counts_no_non_finite_element():
    t = torch.full((4,), 3e38)
    assert not math.isfinite(float(finite_sum(t))) and count_nonfinite(t) == 0


def test_fixed_scale_is_the_configured_power_of_two_on_fp16_and_one_elsewhere():
    assert ScalePolicy.from_config(SyncConfig(wire="fp16", scale="4096")).exponent == 12
    assert ScalePolicy.from_config(SyncConfig(wire="fp16", scale="1024")).exponent == 10
    assert ScalePolicy.from_config(SyncConfig(wire="bf16")).exponent == 0
    assert ScalePolicy.from_config(SyncConfig(wire="fp32")).exponent == 0


def test_per_rank_scale_overrides_only_the_named_rank():
    p = ScalePolicy.from_config(SyncConfig(wire="fp16", scale="4096"))
    p.override(3, 10)
    assert [p.exponent_for(r) for r in range(4)] == [12, 12, 12, 10]


def test_auto_scale_backs_off_on_overflow_and_grows_after_clean_steps():
    p = ScalePolicy.from_config(SyncConfig(wire="fp16", scale="auto"))
    p.growth_interval = 3
    start = p.exponent
    p.update(True)
    assert p.exponent == start - 1
    for _ in range(3):
        p.update(False)
    assert p.exponent == start and (p.backoffs, p.growths) == (1, 1)


def test_fixed_scale_never_moves():
    p = ScalePolicy.from_config(SyncConfig(wire="fp16", scale="4096"))
    p.update(True)
    assert p.exponent == 12


def test_overflow_rates_count_elements_and_steps():
    s = OverflowStats()
    s.add(100, 0, skipped=False)
    s.add(100, 5, skipped=True)
    j = s.to_json()
    assert j["overflow_rate_elements"] == pytest.approx(5 / 200)
    assert j["overflow_rate_steps"] == pytest.approx(0.5)
    assert j["skipped_steps"] == 1


def test_the_default_fp16_wire_defers_to_a_loss_scaler_with_no_pre_scale():
    assert SyncConfig(wire="fp16").scale_mode is ScaleMode.LOSS_SCALER
    p = ScalePolicy.from_config(SyncConfig(wire="fp16"))
    assert p.loss_scaler and not p.auto and p.exponent == 0


def test_under_a_loss_scaler_the_wire_is_fp16_compress_hooks_cast_then_divide_bit_for_bit():
    p = ScalePolicy.from_config(SyncConfig(wire="fp16", scale="loss-scaler"))
    assert p.loss_scaler and not p.auto and p.exponent == 0
    g = torch.tensor([70000.0, 65519.0, 3.0, 1e-8, -65536.0])
    ours = torch.empty(5, dtype=torch.float16)
    to_wire(g, ours, 2, p.exponent, cast_first=p.loss_scaler)
    theirs = g.to(torch.float16).div_(2)  # fp16_compress_hook's compress step
    assert torch.equal(ours, theirs)
    assert torch.isinf(ours[0]) and torch.isinf(ours[4])  # a local |g| >= 65520 overflows there
    p.update(True)
    assert p.exponent == 0 and p.backoffs == 0  # the scaler backs off, never the hook


def test_scale_accepts_a_power_of_two_auto_or_loss_scaler_and_nothing_else():
    assert SyncConfig(scale="loss-scaler").scale_exp == 0
    assert SyncConfig(scale="auto").scale_exp is None
    with pytest.raises(BadInput, match="power of two, 'auto' or 'loss-scaler'"):
        SyncConfig(scale="gradscaler")
