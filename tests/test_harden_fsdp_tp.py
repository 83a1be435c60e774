"""``harden()`` on FSDP2 × tensor parallel (a (dp=2, tp=2) mesh on 4 gloo ranks; HSDP × TP on a
(replicate, shard, tp) mesh on 8): healthy plans train bitwise as without it, with no warning
and no error; each published TP/SP bug class is named at its first step on every rank."""

from __future__ import annotations

import warnings

import pytest
import torch

from openclaw_ref.tp_corpus.cases import MeshShape, Plan
from tests.tp_model import Bug, train


def _recorded(plan: Plan, bug: Bug, hardened: bool, **kw) -> tuple[dict, set[str]]:
    """``train``'s reply and the warnings shown meanwhile."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        reply = train(plan, bug, hardened, **kw)
    return reply, {str(w.message) for w in caught}


def tp_task(ctx, plan: str, bug: str, shape: str = MeshShape.TWO_D.value,
            compiled: bool = False, clip: bool = False) -> dict:
    """This rank's account of the script hardened; healthy: beside it, the same script
    without ``harden()`` run first (so that a warning torch gives once per process, at a first
    compile, falls to stock): bitwise equal, and the warnings ``harden()`` added."""
    plan, bug = Plan(plan), Bug(bug)
    kw = {"shape": MeshShape(shape), "compiled": compiled, "clip": clip}
    healthy = bug is Bug.NONE and plan is not Plan.SP_WITHOUT_NORMS
    stock, stock_caught = _recorded(plan, bug, False, **kw) if healthy else ({}, set())
    hardened, caught = _recorded(plan, bug, True, **kw)
    reply = {k: v for k, v in hardened.items() if k != "full"}
    if healthy:
        reply["added_warnings"] = sorted(caught - stock_caught)
        reply["bitwise"] = bool(hardened["full"]) and all(
            torch.equal(hardened["full"][n], stock["full"][n]) for n in stock["full"])
    return reply


def _run(pools, plan: Plan, bug: Bug) -> list[dict]:
    return pools.get(4).run(tp_task, plan.value, bug.value, timeout_s=240)


def _assert_healthy(replies: list[dict]) -> None:
    for reply in replies:
        assert reply["outcome"] is None, reply["outcome"]
        assert reply["bitwise"]
        assert reply["added_warnings"] == []
        assert reply["summary"]["checks_passed"] == 3


# what each plan's placements say is replicated over tp: (pattern, parameters), read by harden()
OVER_TP = {Plan.SEQUENCE_PARALLEL: {"dp:2=S,tp:2=R": 9},  # norms, w2's and inp's biases
           Plan.PLAIN: {"dp:2=S": 8, "dp:2=S,tp:2=R": 2}}  # norms and inp left out; w2.bias


@pytest.mark.parametrize("plan", [Plan.SEQUENCE_PARALLEL, Plan.PLAIN])
def test_a_healthy_tensor_parallel_job_trains_bitwise_without_a_warning(pools, plan):
    replies = _run(pools, plan, Bug.NONE)
    _assert_healthy(replies)
    for reply in replies:
        classes = reply["summary"]["replicas"]
        assert {c["pattern"]: c["params"] for c in classes} == OVER_TP[plan]
        assert all(c["beyond"] == ["tp"] and c["slices"] == 1 for c in classes)


@pytest.mark.slow
def test_clipping_by_the_global_norm_across_two_meshes_trains_bitwise_without_a_warning(pools):
    _assert_healthy(pools.get(4).run(tp_task, Plan.PLAIN.value, Bug.NONE.value,
                                     MeshShape.TWO_D.value, False, True, timeout_s=240))


@pytest.mark.slow
def test_loss_parallel_trains_bitwise_without_a_warning(pools):
    _assert_healthy(_run(pools, Plan.LOSS_PARALLEL, Bug.NONE))


@pytest.mark.slow
def test_compiled_blocks_train_bitwise_without_a_warning(pools):
    _assert_healthy(pools.get(4).run(tp_task, Plan.SEQUENCE_PARALLEL.value, Bug.NONE.value,
                                     MeshShape.TWO_D.value, True, timeout_s=600))


@pytest.mark.slow
def test_hsdp_by_tp_on_a_3d_mesh_trains_bitwise_without_a_warning(pools):
    replies = pools.get(8).run(tp_task, Plan.SEQUENCE_PARALLEL.value, Bug.NONE.value,
                               MeshShape.THREE_D.value, timeout_s=600)
    _assert_healthy(replies)
    classes = {c["pattern"]: c["beyond"] for c in replies[0]["summary"]["replicas"]}
    assert classes["replicate:2=R,shard:2=S,tp:2=R"] == ["tp"]  # the norms: over tp
    assert classes["replicate:2=R,shard:2=S,tp:2=S"] == []  # TP's shards: HSDP's replicas


NORMS = ["blocks.0.norm.weight", "blocks.0.norm.bias", "blocks.1.norm.weight",
         "blocks.1.norm.bias", "norm.weight", "norm.bias"]
EVERY = [0, 1, 2, 3]  # tp groups of two: a tie in each, both ranks of a group named


def _outcomes(replies: list[dict]) -> list[tuple]:
    return [r["outcome"][:4] if r["outcome"] else None for r in replies]


def test_sequence_parallel_norms_left_out_of_the_plan_are_named_not_reduced_over_tp(pools):
    replies = _run(pools, Plan.SP_WITHOUT_NORMS, Bug.NONE)
    assert _outcomes(replies) == [("GradientsNotAveraged", 0, EVERY, NORMS)] * 4
    assert "gradient not reduced over tp" in replies[0]["outcome"][4]


def test_tp_ranks_fed_different_batches_are_an_input_mismatch_at_the_first_step(pools):
    replies = _run(pools, Plan.PLAIN, Bug.BATCH_BY_GLOBAL_RANK)
    assert _outcomes(replies) == [("InputMismatch", 0, EVERY, [])] * 4


def test_the_canary_is_off_on_a_tensor_parallel_model_with_an_event_saying_why(pools):
    for reply in _run(pools, Plan.PLAIN, Bug.NONE):
        assert reply["summary"]["canary"]["why"].startswith("off: tensor parallel")
        assert [e[0] for e in reply["events"]] == ["CanaryOff"]


@pytest.mark.slow
@pytest.mark.parametrize("plan", list(Plan))
def test_a_replicated_weight_moved_on_one_rank_is_named_with_its_tp_peer(pools, plan):
    replies = _run(pools, plan, Bug.NORM_WEIGHT_ONE_RANK)
    assert _outcomes(replies) == [("ReplicaDivergence", 0, [2, 3],
                                   ["blocks.0.norm.weight"])] * 4


@pytest.mark.slow
def test_one_rank_with_another_lr_is_named_alone(pools):
    assert _outcomes(_run(pools, Plan.PLAIN, Bug.LR_ONE_RANK)) == \
        [("OptimizerMismatch", 0, [3], [])] * 4


@pytest.mark.slow
def test_clipping_by_each_rank_local_norm_is_a_scale_mismatch_not_a_gradient_one(pools):
    outcomes = _outcomes(_run(pools, Plan.PLAIN, Bug.LOCAL_NORM_CLIP))
    assert [o[:2] for o in outcomes] == [("ScaleMismatch", 0)] * 4


@pytest.mark.slow
def test_an_extra_micro_batch_on_one_tp_rank_is_a_clock_mismatch_naming_it(pools):
    assert _outcomes(_run(pools, Plan.PLAIN, Bug.EXTRA_MICROBATCH)) == \
        [("ClockMismatch", 1, [3], [])] * 4


def partial_task(ctx) -> str:
    """A parameter whose placement is ``Partial``: which ranks hold its replicas cannot be read
    from it."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Partial, distribute_tensor

    from openclaw_ref.sync.errors import BadInput
    from openclaw_ref.sync.fsdp.mesh import seat_of

    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))
    p = distribute_tensor(torch.zeros(4), mesh, [Partial()])
    try:
        seat_of("w", p, mesh, None)
    except BadInput as exc:
        return str(exc)
    return "read"


def test_a_parameter_that_is_partial_is_refused_naming_it(pools):
    for told in pools.get(2).run(partial_task, timeout_s=120):
        assert told.startswith("parameter w has placement") and "Partial" in told
