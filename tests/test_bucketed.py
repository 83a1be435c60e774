"""The bucketed engine and its planners: frames independent of the plan, DDP's semantics, the
seed's local-norm planner caught misaligning, the agreed planner silent."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

from openclaw_ref.arms.bucket_plan import (
    AgreedNormEmaPlanner,
    BucketPlan,
    NormEmaPlanner,
    ParamInfo,
    cut_frames,
)
from openclaw_ref.arms.bucketed import BucketedEngine
from openclaw_ref.arms.config import ArmConfig
from openclaw_ref.core.data import DataConfig, SkillDataset, rank_batch
from openclaw_ref.core.model import build_model, preset
from openclaw_ref.core.train import TrainConfig, train_model
from openclaw_ref.sync.errors import BucketMisalignment, ConsistencyError
from tests.helpers import record_of, train_cfg


def _params(sizes: list[int]) -> list[ParamInfo]:
    return [ParamInfo(f"p{i}", (n,), "torch.float32", n) for i, n in enumerate(sizes)]


@given(st.lists(st.integers(1, 50), min_size=1, max_size=20), st.integers(1, 64), st.randoms())
def test_frame_sizes_never_depend_on_the_plan_and_cover_every_element_once(sizes, cap, rnd):
    params = _params(sizes)
    order = list(range(len(sizes)))
    rnd.shuffle(order)
    a = cut_frames(BucketPlan(tuple(range(len(sizes))), (0,) * len(sizes)), params, cap)
    b = cut_frames(BucketPlan(tuple(order), (0,) * len(sizes)), params, cap)
    assert [f.elements for f in a] == [f.elements for f in b]
    assert all(f.elements <= cap for f in b)
    covered = sorted((pc.param, e) for f in b for pc in f.pieces for e in range(pc.start, pc.stop))
    assert covered == [(i, e) for i, n in enumerate(sizes) for e in range(n)]


def test_reordering_changes_the_membership_digest_of_a_frame():
    params = _params([4, 4])
    a = cut_frames(BucketPlan((0, 1), (0, 0)), params, 4)
    b = cut_frames(BucketPlan((1, 0), (0, 0)), params, 4)
    assert a[0].digest != b[0].digest


def test_the_seeds_rule_puts_a_parameter_by_its_norm_relative_to_its_ema():
    planner = NormEmaPlanner(_params([1, 1, 1]))
    first = planner.plan([1.0, 2.0, None])  # EMA starts at the norm: id ⌊1/0.85⌋ = 1; no grad: last
    assert first.order == (0, 1, 2) and first.groups[:2] == (1, 1)
    second = planner.plan([0.5, 4.0, 1.0])  # 0.5/(0.85·~1) → 0; 4/(0.85·~2) → 2; first sight → 1
    assert dict(zip(second.order, second.groups)) == {0: 0, 1: 2, 2: 1}
    assert second.order == (0, 2, 1)


def test_the_agreed_planner_plans_only_from_what_it_observed():
    planner = AgreedNormEmaPlanner(_params([1, 1]))
    assert planner.plan(None).order == (0, 1)
    planner.observe([1.0, None])
    assert planner.plan([99.0, 99.0]).order == planner.plan(None).order  # local norms ignored


def error_of(ctx, cfg: TrainConfig):
    try:
        train_model(ctx, cfg)
    except ConsistencyError as exc:
        return exc
    return None


@pytest.mark.parametrize("planner", ["static", "norm-ema-agreed"])
def test_bucketed_fp32_trains_like_ddp(pools, planner):
    ddp = pools.get(2).run(record_of, train_cfg(2, ArmConfig.of("ddp")))[0]
    sync = ArmConfig.of("bucketed", planner=planner, bucket_cap_mb=0.01)
    rec = pools.get(2).run(record_of, train_cfg(2, sync))[0]
    final, ref = rec["summary"]["final_loss"], ddp["summary"]["final_loss"]
    assert abs(final - ref) / ref <= 1e-5
    assert rec["summary"]["replicas_equal"] and rec["events"] == []
    assert rec["summary"]["sync"]["bucket_checks"] == 10 * rec["summary"]["sync"]["frames_per_step"]


def test_the_seeds_local_norm_planner_is_caught_misaligning_on_every_rank(pools):
    sync = ArmConfig.of("bucketed", planner="norm-ema", bucket_cap_mb=0.01)
    errors = pools.get(2).run(error_of, train_cfg(2, sync, steps=5))
    assert all(isinstance(e, BucketMisalignment) for e in errors), errors
    assert errors[0].step == errors[1].step and errors[0].bucket == errors[1].bucket
    assert errors[0].ranks == errors[1].ranks == [0, 1]  # two ranks: both suspects


def agreed_plans(ctx, steps: int) -> list[tuple[int, ...]]:
    """The agreed planner's bucket ids over a few steps (to show the plan really moves)."""
    cfg = preset("tiny")
    ds = SkillDataset(cfg, DataConfig())
    model = build_model(cfg)
    engine = BucketedEngine(model, ArmConfig.of("bucketed", planner="norm-ema-agreed",
                                              bucket_cap_mb=0.01), ctx.rank, ctx.world_size,
                            store=ctx.store)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    plans = []
    try:
        for step in range(steps):
            engine.begin_step(step)
            b = rank_batch(ds, step, 8, ctx.rank, ctx.world_size)
            F.cross_entropy(model(b.tokens, b.sample_ids, step), b.labels).backward()
            engine.finish_step(step)
            plans.append(engine.last_plan.order)
            opt.step()
            opt.zero_grad(set_to_none=True)
    finally:
        engine.close()
    return plans


def test_the_agreed_plan_changes_between_steps_yet_agrees_across_ranks(pools):
    plans = pools.get(2).run(agreed_plans, 4)
    assert plans[0] == plans[1]
    assert len(set(plans[0])) > 1


def presence_semantics(ctx) -> dict:
    """One parameter without gradient on every rank, one without on rank 1 only."""
    lin = torch.nn.Linear(2, 2)
    model = torch.nn.ModuleDict({"a": lin, "b": torch.nn.Linear(2, 2)})
    engine = BucketedEngine(model, ArmConfig.of("bucketed"), ctx.rank, ctx.world_size,
                            store=ctx.store)
    try:
        engine.begin_step(0)
        for p in model.parameters():
            p.grad = torch.full_like(p, float(ctx.rank + 1))
        model["b"].weight.grad = None  # nowhere
        if ctx.rank == 1:
            model["a"].bias.grad = None  # on rank 1 only
        engine.finish_step(0)
        return {n: (None if p.grad is None else p.grad.flatten()[0].item())
                for n, p in model.named_parameters()}
    finally:
        engine.close()


def test_absent_gradients_follow_ddp_semantics(pools):
    got = pools.get(2).run(presence_semantics)
    for g in got:
        assert g["b.weight"] is None  # no rank had one: stays None, the optimizer skips it
        assert g["a.bias"] == 0.5  # (1 + 0) / 2: zero-filled where absent
        assert g["a.weight"] == 1.5 and g["b.bias"] == 1.5

