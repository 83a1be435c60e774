"""Hypothesis properties of the pieces every sync path is built from, in-process (pure
functions: no process group), plus one multi-rank property whose examples are all drawn first
and run in ONE task on a pooled group. Profiles: ``HYPOTHESIS_PROFILE=dev|ci|nightly``."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from openclaw_ref.arms.bucket_plan import ParamInfo, cut_frames, make_planner
from openclaw_ref.arms.bucketed import has_nonfinite
from openclaw_ref.arms.config import ArmConfig
from openclaw_ref.conformance.checks import check_equivalence
from openclaw_ref.conformance.settings import ConformSettings
from openclaw_ref.core.config import TRAIN_PRESETS, ModelSection
from openclaw_ref.core.data import DataConfig, SkillDataset, rank_batch
from openclaw_ref.core.model import build_model, preset, sparsity_at, validate_sparsity_range
from openclaw_ref.sync.evidence.precision import (
    count_nonfinite,
    finite_sum,
    from_wire,
    to_wire,
)

pytestmark = [pytest.mark.conformance, pytest.mark.openclaw_model]

LO, HI = 0.12, 0.68  # the seed's sparsity range (S2)
ratios = st.floats(LO, HI, allow_nan=False)
seeds = st.integers(0, 2**16)
world_sizes = st.integers(1, 4)
caps = st.integers(1, 4096)  # bucket cap in elements: down to one-element buckets


@given(ratio=ratios, seed=seeds)
@example(ratio=LO, seed=0)
@example(ratio=HI, seed=0)
def test_mask_density_is_within_binomial_tolerance(ratio, seed):
    cfg = preset("tiny", sparsity_range=(ratio, ratio), seed=seed)
    model = build_model(cfg)
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(1, cfg.vocab_size, (8, cfg.seq_len), generator=g)
    keep = model.layer[0].ffn.gate.unit_mask(tokens, torch.arange(8), step=seed % 97)
    n = keep.numel()
    sigma = math.sqrt(n * ratio * (1 - ratio))
    assert abs(float((keep == 0).sum()) - n * ratio) <= 5 * sigma + 1


@given(ratio=st.one_of(st.floats(-1.0, -1e-9), st.floats(1.0, 2.0)))
@example(ratio=1.0)
@example(ratio=-0.01)
def test_sparsity_ratios_outside_the_unit_interval_are_rejected(ratio):
    with pytest.raises(ValueError):
        validate_sparsity_range(ratio, ratio)


@given(ratio=ratios, seed=seeds)
@example(ratio=LO, seed=1)
@example(ratio=HI, seed=1)
def test_masked_units_get_exactly_zero_gradient(ratio, seed):
    cfg = preset("tiny", sparsity_range=(ratio, ratio), seed=seed, n_layer=2)
    model = build_model(cfg)
    ds = SkillDataset(cfg, DataConfig(n_train=64, n_val=8, seed=seed))
    batch = rank_batch(ds, 0, 8, 0, 1)
    captured = {}

    def keep_grad(module, inputs, output):
        output.register_hook(lambda g: captured.__setitem__("g", g))
    model.layer[1].ffn.w1.register_forward_hook(keep_grad)
    F.cross_entropy(model(batch.tokens, batch.sample_ids, 3), batch.labels).backward()
    keep = model.layer[1].ffn.gate.unit_mask(batch.tokens, batch.sample_ids, 3)
    assert sparsity_at(cfg, 3) == pytest.approx(ratio)
    assert torch.all(captured["g"][keep == 0] == 0)


def _infos(sizes):
    return [ParamInfo(f"p{i}", (n,), "torch.float32", n) for i, n in enumerate(sizes)]


norm_histories = st.lists(st.lists(st.one_of(st.none(), st.floats(1e-6, 1e3)), min_size=6,
                                   max_size=6), min_size=1, max_size=5)


@given(sizes=st.lists(st.integers(1, 300), min_size=1, max_size=12), cap=caps,
       planner=st.sampled_from(["static", "norm-ema", "norm-ema-agreed"]),
       history=norm_histories)
@example(sizes=[1, 1, 1], cap=1, planner="static", history=[[None] * 6])
def test_every_bucket_plan_covers_each_parameter_once_within_the_cap(sizes, cap, planner, history):
    infos = _infos(sizes)
    p = make_planner(planner, infos)
    for norms in history:
        norms = (norms * len(sizes))[:len(sizes)]
        plan = p.plan(norms if p.needs_local_norms else None)
        frames = cut_frames(plan, infos, cap)
        covered = {i: [] for i in range(len(sizes))}
        for f in frames:
            assert 0 < f.elements <= cap
            for piece in f.pieces:
                covered[piece.param].append((piece.start, piece.stop))
        for i, spans in covered.items():
            spans.sort()
            assert spans[0][0] == 0 and spans[-1][1] == sizes[i]
            assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))  # no gap, no overlap
        if p.needs_synced_norms:
            p.observe(norms)


@given(sizes=st.lists(st.integers(1, 50), min_size=2, max_size=10), world=world_sizes,
       history=norm_histories, local_noise=seeds)
def test_agreed_plans_are_identical_across_ranks_for_any_gradient_history(sizes, world, history,
                                                                          local_noise):
    """Each 'rank' has its own local norms (different), but sees the same synchronized norms:
    the agreed planner must produce the same plan everywhere, every step."""
    infos = _infos(sizes)
    planners = [make_planner("norm-ema-agreed", infos) for _ in range(world)]
    g = torch.Generator().manual_seed(local_noise)
    for synced in history:
        synced = (synced * len(sizes))[:len(sizes)]
        plans = [pl.plan(torch.rand(len(sizes), generator=g).tolist()) for pl in planners]
        assert all(pl == plans[0] for pl in plans)
        for pl in planners:
            pl.observe(synced)


@given(world=world_sizes, exponent=st.integers(0, 12), seed=seeds,
       magnitude=st.floats(-6, 1))
@example(world=1, exponent=12, seed=0, magnitude=1.0)  # |g| near 16·W/2^12·65504: the top edge
def test_fp16_prescale_unscale_round_trip_is_within_the_fp16_bound(world, exponent, seed,
                                                                   magnitude):
    g = torch.randn(256, generator=torch.Generator().manual_seed(seed)) * 10.0 ** magnitude
    scaled = g * 2.0 ** exponent / world
    assume(float(scaled.abs().max()) < 65504)
    wire = torch.empty(256, dtype=torch.float16)
    to_wire(g, wire, world, exponent)
    back = from_wire(wire, exponent)
    # fp16: relative error ≤ 2^-11 for normals, absolute ≤ 2^-25 (half the smallest subnormal
    # step 2^-24) below 2^-14 — both measured after unscaling by 2^-e
    bound = torch.maximum((g / world).abs() * 2.0 ** -11,
                          torch.full_like(g, 2.0 ** (-25 - exponent)))
    assert torch.all((back - g / world).abs() <= bound)


@given(n=st.integers(1, 2000), buckets=st.integers(1, 8), where=st.integers(0, 10**6),
       bad=st.sampled_from([float("inf"), float("-inf"), float("nan")]),
       wire=st.sampled_from([torch.float16, torch.bfloat16, torch.float32]))
@example(n=1, buckets=1, where=0, bad=float("nan"), wire=torch.float16)
def test_overflow_detector_never_misses_an_inf_or_nan_in_any_bucket(n, buckets, where, bad, wire):
    grads = [torch.randn(n) for _ in range(buckets)]
    b, i = where % buckets, where % n
    grads[b][i] = bad
    for k, grad in enumerate(grads):
        out = torch.empty(n, dtype=wire)
        to_wire(grad, out, 2, 12 if wire == torch.float16 else 0)
        assert int(count_nonfinite(out)) == (1 if k == b else 0)
        assert bool(has_nonfinite(out)) == (k == b)  # the local attribution's test
        # the ledger's flag: the sum of the reduced bucket (confirmed by the exact count)
        assert math.isfinite(float(finite_sum(from_wire(out, 12 if wire == torch.float16
                                                             else 0)))) == (k != b)


EQUIV_EXAMPLES = st.lists(st.tuples(seeds, ratios, st.sampled_from([0.01, 0.05, 25.0])),
                          min_size=1, max_size=2)


@pytest.mark.parametrize("world_size", [2, pytest.param(4, marks=pytest.mark.slow)])
@settings(max_examples=2)
@given(examples=EQUIV_EXAMPLES)
def test_ranks_equal_one_process_for_drawn_seeds_ratios_and_bucket_caps(pools, world_size,
                                                                       examples):
    """Examples drawn first, then each runs on the pooled group (no spawn per example)."""
    pool = pools.get(world_size)
    for seed, ratio, cap in examples:
        s = ConformSettings(sync=ArmConfig(name="ddp", bucket_cap_mb=cap),
                            model=ModelSection(seed=seed, sparsity_range=(ratio, ratio)),
                            train=dataclasses.replace(TRAIN_PRESETS["conformance"], steps=3))
        result = pool.run(check_equivalence, s, timeout_s=120)[0]
        assert result.passed, (seed, ratio, cap, result.detail)
