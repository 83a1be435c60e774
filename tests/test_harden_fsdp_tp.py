"""``harden()`` on FSDP2 × tensor parallel (a (dp=2, tp=2) mesh on 4 gloo ranks; HSDP × TP on a
(replicate, shard, tp) mesh on 8): healthy plans train bitwise as without it, with no warning
and no error; each published TP/SP bug class is named at its first step on every rank."""

from __future__ import annotations

import warnings

import pytest
import torch

from tests.tp_model import Bug, Plan, train


def _recorded(plan: Plan, bug: Bug, hardened: bool) -> tuple[dict, set[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        reply = train(plan, bug, hardened)
    return reply, {str(w.message) for w in caught}


def tp_task(ctx, plan: str, bug: str) -> dict:
    """This rank's account of the script hardened; healthy: beside it, the same script
    without ``harden()`` (bitwise equal, and the warnings ``harden()`` added)."""
    plan, bug = Plan(plan), Bug(bug)
    hardened, caught = _recorded(plan, bug, True)
    reply = {k: v for k, v in hardened.items() if k != "full"}
    if bug is Bug.NONE:
        stock, stock_caught = _recorded(plan, bug, False)
        reply["added_warnings"] = sorted(caught - stock_caught)
        reply["bitwise"] = bool(hardened["full"]) and all(
            torch.equal(hardened["full"][n], stock["full"][n]) for n in stock["full"])
    return reply


def _run(pools, plan: Plan, bug: Bug) -> list[dict]:
    return pools.get(4).run(tp_task, plan.value, bug.value, timeout_s=240)


@pytest.mark.parametrize("plan", list(Plan))
def test_a_healthy_tensor_parallel_job_trains_bitwise_without_a_warning(pools, plan):
    for reply in _run(pools, plan, Bug.NONE):
        assert reply["outcome"] is None, reply["outcome"]
        assert reply["bitwise"]
        assert reply["added_warnings"] == []
        assert reply["summary"]["checks_passed"] == 3


NORMS = ["blocks.0.norm.weight", "blocks.0.norm.bias", "blocks.1.norm.weight",
         "blocks.1.norm.bias"]
EVERY = [0, 1, 2, 3]  # tp groups of two: a tie in each, both ranks of a group named


def _outcomes(replies: list[dict]) -> list[tuple]:
    return [r["outcome"][:4] if r["outcome"] else None for r in replies]


def test_sequence_parallel_norms_left_out_of_the_plan_are_named_not_reduced_over_tp(pools):
    replies = _run(pools, Plan.SEQUENCE_PARALLEL, Bug.NORMS_LEFT_OUT)
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
