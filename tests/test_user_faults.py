"""The fault matrix on a user's target (``conformance/user_faults.py``) on the documented example
(``examples/my_model.py``): under its ``hardened`` hook every fault and corpus pattern that
applies is detected naming the injected rank (a crash is named by the launcher; unsharded data
is caught by no column, as on the openclaw model); under stock DDP each outcome is the fact
measured here; a case that cannot apply to the model is skipped with its reason, and runs where
it applies; the clean runs and the join option set stay silent."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from openclaw_ref.cli import main
from openclaw_ref.conformance.target import Target, TargetSpec
from openclaw_ref.conformance.user_checks import check_equivalence
from openclaw_ref.conformance.user_faults import (
    UserFaultRunner,
    names_injected_rank,
    not_applicable,
    swappable_pair,
    user_case,
    user_case_names,
)
from openclaw_ref.sync.errors import BadInput

MODEL = "examples.my_model:make_target"
HARDENED, GOOD = "examples.my_model:hardened", "examples.my_model:good_hook"
BROKEN = "examples.my_model:forgets_to_divide"
TWO_BRANCH = "tests.test_user_faults:two_branch_target"

# The example has no two same-shaped siblings outside its Sequential, and every parameter
# gets a gradient (no find_unused_parameters).
NOT_APPLICABLE = ("missing-grad", "permuted-params", "layer-order")
# What harden() (the example's ``hardened``) raises for each case, and the case it misses.
HARDENED_KIND = {
    "late-rank": "late rank in step metrics", "scale-mismatch": "ReplicaDivergence",
    "bitflip": "ReplicaDivergence", "nan-grad": "NonFiniteGradient", "hang": "SyncTimeout",
    "convert-after-wrap": "GradientsNotAveraged", "forward-via-module": "GradientsNotAveraged",
    "param-replaced-after-wrap": "GradientsNotAveraged", "clip-one-rank": "ReplicaDivergence",
    "lr-off-by-one": "ReplicaDivergence", "skip-step-one-rank": "ReplicaDivergence",
    "load-on-rank0-after-wrap": "ReplicaDivergence", "scaler-state-differs": "ReplicaDivergence",
}
UNCAUGHT = ("data-not-sharded",)  # every rank reads the same batch: replicas stay equal
# Stock DDP on the example, as measured (torch 2.13, gloo, 2 ranks).
STOCK_FACTS = {
    "late-rank": "no-effect",  # DDP waits; nothing is measured
    "scale-mismatch": "silent-corruption", "bitflip": "silent-corruption",
    "nan-grad": "silent-corruption",  # the NaN is averaged into both replicas, no error
    "crash": "crash",  # the launcher names the dead rank
    "hang": "hang-timeout",  # gloo's timeout on the waiting rank 0, not the hung rank
    "convert-after-wrap": "silent-corruption", "forward-via-module": "silent-corruption",
    "param-replaced-after-wrap": "crash",  # DDP's "Expected to have finished reduction"
    "clip-one-rank": "silent-corruption", "lr-off-by-one": "silent-corruption",
    "skip-step-one-rank": "silent-corruption", "load-on-rank0-after-wrap": "silent-corruption",
    "scaler-state-differs": "silent-corruption", "data-not-sharded": "silent-corruption",
}
SLOW = ("hang",)  # a fresh pool and gloo's deadline: ~11-15 s here
SLOW_STOCK = ("crash", "hang")  # the hardened crash is the CI representative of a dead rank


class TwoBranch(nn.Module):
    """Two same-shaped layers used by name: their registration order is not the forward's."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.head = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.b(torch.relu(self.a(x)))))


def two_branch_target() -> Target:
    torch.manual_seed(0)

    def batch(step: int, rank: int, world_size: int):
        g = torch.Generator().manual_seed(100 * step + rank)
        return torch.randn(4, 8, generator=g), torch.randint(0, 2, (4,), generator=g)

    return Target(TwoBranch(), batch, F.cross_entropy, lr=0.1)


def _params(cases, slow=()):
    return [pytest.param(c, marks=[pytest.mark.slow] if c in slow else [], id=c) for c in cases]


@pytest.fixture(scope="module")
def hardened(pools):
    return UserFaultRunner(TargetSpec(MODEL, HARDENED), pools.get)


@pytest.fixture(scope="module")
def stock(pools):
    return UserFaultRunner(TargetSpec(MODEL), pools.get)


@pytest.mark.parametrize("name", NOT_APPLICABLE)
def test_a_case_that_cannot_apply_to_the_example_is_skipped_with_its_reason(name):
    from examples.my_model import make_target

    reason = not_applicable(user_case(name), make_target())
    assert reason and name in reason


def test_registration_can_be_permuted_only_outside_an_ordered_container():
    assert swappable_pair(two_branch_target().module) == ("a", "b")
    assert swappable_pair(nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))) is None
    assert not_applicable(user_case("permuted-params"), two_branch_target()) is None


@pytest.mark.parametrize("name,ranks,named", [
    ("param-replaced-after-wrap", [1], True),  # every rank makes the mistake: any rank
    ("param-replaced-after-wrap", [], False),
    ("clip-one-rank", [1], True),  # rank 1 clips
    ("clip-one-rank", [0], False),
], ids=["every-rank-any", "every-rank-none", "one-rank-right", "one-rank-wrong"])
def test_a_crash_names_the_injected_rank_or_any_rank_for_an_every_rank_mistake(name, ranks,
                                                                                named):
    from openclaw_ref.conformance.fault_matrix import classify
    from openclaw_ref.core.errors import RankFailed
    from openclaw_ref.core.faults import FaultSpec

    case = user_case(name)
    fault = FaultSpec(name, rank=0 if name.startswith("param") else 1, step=0)
    failure = RankFailed(ranks[0], "RuntimeError: boom") if ranks else RuntimeError("boom")
    out = classify("user-hook", fault, 2, failure=failure)
    assert out.outcome == "crash" and names_injected_rank(case, out) == named, out


def test_an_unknown_case_is_refused_naming_the_known_ones():
    with pytest.raises(BadInput, match="choose from late-rank"):
        user_case_names("bitflip,no-such-fault")
    assert "data-not-sharded" in user_case_names("all")


@pytest.mark.parametrize("name", _params(HARDENED_KIND, SLOW))
def test_harden_detects_each_fault_on_the_example_naming_the_injected_rank(hardened, name):
    out = hardened.run_case(user_case(name))
    assert out.outcome == "detected" and out.kind == HARDENED_KIND[name], out
    if name == "load-on-rank0-after-wrap":  # 2 ranks: no majority to name rank 0 against
        assert out.ranks, out
    else:
        assert names_injected_rank(user_case(name), out), out


def test_a_crashed_rank_is_named_under_harden(hardened):
    out = hardened.run_case(user_case("crash"))
    assert out.outcome == "crash" and out.ranks == [1] and out.attributed, out


@pytest.mark.parametrize("name", UNCAUGHT)
def test_unsharded_data_passes_even_harden_silently(hardened, name):
    out = hardened.run_case(user_case(name))
    assert out.outcome == "silent-corruption" and "differs" in out.detail, out


@pytest.mark.parametrize("name", _params(STOCK_FACTS, SLOW_STOCK))
def test_stock_ddp_outcome_on_the_example_is_the_measured_fact(stock, name):
    out = stock.run_case(user_case(name))
    assert out.outcome == STOCK_FACTS[name], out


@pytest.mark.parametrize("name", ["permuted-params", "layer-order"])
def test_harden_detects_a_permuted_registration_where_the_model_allows_one(pools, name):
    out = UserFaultRunner(TargetSpec(TWO_BRANCH, HARDENED), pools.get).run_case(user_case(name))
    assert out.outcome == "detected" and out.ranks == [0, 1], out  # two ranks: both suspects


@pytest.mark.parametrize("hook", [HARDENED, None], ids=["hardened", "stock"])
def test_the_clean_run_stays_silent(pools, hook):
    kind, record = UserFaultRunner(TargetSpec(MODEL, hook), pools.get).clean_reply()
    assert kind == "ok" and record["events"] == [], record
    assert record["summary"]["replicas_equal"]


@pytest.mark.parametrize("hook,passed", [(HARDENED, True), (GOOD, True), (BROKEN, False)],
                         ids=["hardened", "averaging", "forgets-to-divide"])
def test_the_join_option_set_holds_for_averaging_hooks_and_fails_a_summing_one(pools, hook,
                                                                               passed):
    """The last rank runs one step fewer under ``ddp.join()``: the joined rank's zero buckets
    and DDP's final broadcast must leave every rank where stock DDP under join ends."""
    result = pools.get(2).run(check_equivalence, TargetSpec(MODEL, hook), "join",
                              timeout_s=180)[0]
    assert result.passed == passed, result.detail


@pytest.mark.slow
def test_conform_runs_the_fault_rows_and_skips_what_cannot_apply(capsys):
    code = main(["conform", "--model", MODEL, "--hook", HARDENED, "--faults",
                 "bitflip,permuted-params,convert-after-wrap"])
    table = capsys.readouterr().out
    assert code == 0, table
    assert "fault: bitflip" in table and "skipped: permuted-params" in table
