"""``harden()`` on a model the suite does not own, per DDP option, against PyTorch's own DDP.

For every case of ``openclaw_ref.experiments.ddp_option_matrix.CASES`` (2 gloo ranks, rank-dependent
inputs): zero false alarms, parity with no-hook DDP (fp32 gradients: relative 1e-6; fp16/bf16 wires:
inside the rounding bound derived in ``narrow_wire_excess``), the GradScaler skipping the same
steps, and a rank-dependent FP16 pre-scale still caught naming the right global rank. Runs in
``pytest -m conformance``, so a user's cluster exercises these DDP set-ups too.
"""

from __future__ import annotations

import pytest

from openclaw_ref.experiments.ddp_option_matrix import (
    CASES,
    FOUR_RANK_SUBGROUPS,
    UNIT_ROUNDOFF,
    DDPCase,
    ddp_case_task,
    hook_parity_task,
    narrow_wire_excess,
    relative_error,
)
from openclaw_ref.sync.errors import NonFiniteGradient

pytestmark = [pytest.mark.conformance, pytest.mark.openclaw_model]

FP32_PARITY = 1e-6
SCALER_PARITY = 1e-5


@pytest.fixture(scope="module")
def replies(pools) -> dict[str, list[dict]]:
    pool = pools.get(2)
    return {case.name: pool.run(ddp_case_task, case) for case in CASES}


def _case(name_part: str) -> DDPCase:
    return next(c for c in CASES if name_part in c.name)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_no_false_alarm(replies, case):
    for reply in replies[case.name]:
        assert reply["error"] is None, reply["error"]
        summary = reply["summary"]
        assert summary["checks_run"] == summary["checks_passed"] > 0


@pytest.mark.parametrize("case", [c for c in CASES if c.wire not in UNIT_ROUNDOFF],
                         ids=[c.name for c in CASES if c.wire not in UNIT_ROUNDOFF])
def test_parameters_match_no_hook_ddp(replies, case):
    limit = SCALER_PARITY if case.scaler else FP32_PARITY
    for reply in replies[case.name]:
        err = relative_error(reply["hardened"]["params"], reply["oracle"]["params"])
        assert err <= limit, f"rank {reply['rank']}: relative error {err:.3g}"


@pytest.mark.parametrize("wire", sorted(UNIT_ROUNDOFF))
def test_a_narrow_wire_stays_inside_its_derived_rounding_bound(replies, wire):
    ranks = replies[_case(f"wire {wire}").name]
    local_terms = [r["grads_local"] for r in ranks]
    for reply in ranks:
        excess = narrow_wire_excess(reply["grads_hardened"], reply["grads_oracle"], local_terms,
                                    wire)
        assert excess <= 0, f"rank {reply['rank']}: {excess:.3g} beyond the bound"


def test_the_rounding_bound_fires_on_a_gradient_off_by_more_than_it(replies):
    ranks = replies[_case("wire bf16").name]
    local_terms = [r["grads_local"] for r in ranks]
    off = {n: g * (1 + 4 * UNIT_ROUNDOFF["bf16"]) + 1e-3 for n, g in
           ranks[0]["grads_oracle"].items()}
    assert narrow_wire_excess(off, ranks[0]["grads_oracle"], local_terms, "bf16") > 0


def test_the_scaler_skips_the_same_steps_as_without_the_hook(replies):
    for reply in replies[_case("GradScaler").name]:
        scales = reply["hardened"]["scales"]
        assert scales == reply["oracle"]["scales"]
        assert scales[0] < 2.0 ** 24, "the case must start with an overflowing scale"
        assert reply["summary"]["skipped_steps"] >= 1
        assert {e["kind"] for e in reply["events"]} == {"NonFiniteGradient"}


def test_joined_ranks_shadow_steps_are_recognised(replies):
    rank0, rank1 = replies[_case("join()").name]
    assert rank0["summary"]["shadow_steps"] > 0  # rank 0 ran out of inputs first
    assert rank1["summary"]["shadow_steps"] == 0


def test_each_rank_of_a_singleton_group_keeps_its_own_gradients(replies):
    rank0, rank1 = replies[_case("sub-group").name]
    assert relative_error(rank0["hardened"]["params"], rank1["hardened"]["params"]) > 1e-3


@pytest.mark.parametrize("case", [c for c in CASES if not c.subgroups],
                         ids=[c.name for c in CASES if not c.subgroups])
def test_a_ranks_nan_gradient_is_still_caught_naming_the_rank(replies, case):
    for reply in replies[case.name]:
        assert isinstance(reply["fault"], NonFiniteGradient), reply["fault"]
        assert reply["fault"].ranks == [1] and reply["fault"].step == 1


def test_two_ddp_groups_in_one_job_each_get_their_own_average(pools):
    results = pools.get(4).run(ddp_case_task, FOUR_RANK_SUBGROUPS)
    for reply in results:
        assert reply["error"] is None
        err = relative_error(reply["hardened"]["params"], reply["oracle"]["params"])
        assert err <= FP32_PARITY, f"rank {reply['rank']}: {err:.3g}"
    assert relative_error(results[0]["hardened"]["params"],
                          results[2]["hardened"]["params"]) > 1e-3  # the groups differ
    assert [r["fault"].ranks for r in results] == [[1], [1], [3], [3]]  # global ranks


@pytest.mark.parametrize("on_new_group", [False, True], ids=["allreduce", "process_group"])
def test_pytorch_hook_parity_body_ported_to_gloo(pools, on_new_group):
    for rows in pools.get(2).run(hook_parity_task, on_new_group):
        for _expected, plain, torch_hook, hardened in rows:
            assert hardened == plain == torch_hook
        first_expected, *_, first_hardened = rows[0]
        # the first iteration: exactly the mean of the ranks
        assert first_hardened == first_expected
