"""Pointing the conformance suite at a user's model and hook (``conformance/target.py``):
bad input is refused in one line before any rank starts, the example's averaging hook passes
the model-agnostic checks (judged against stock DDP) and its hook that forgets to divide fails
equivalence naming the ranks; the example's BatchNorm MLP passes with no hook and with
``harden()`` and is reported not shard-invariant. The example is ``examples/my_model.py``
(importable as ``examples.my_model`` here)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from openclaw_ref.cli import main
from openclaw_ref.conformance.target import Target, TargetSpec, load_hook, validate_spec
from openclaw_ref.conformance.user_checks import check_bucket_layout, check_equivalence
from openclaw_ref.sync.errors import BadInput
from tests.helpers import MarkedItem

REPO = Path(__file__).parents[1]
MODEL = "examples.my_model:make_target"
GOOD, BROKEN = "examples.my_model:good_hook", "examples.my_model:forgets_to_divide"


def not_a_target():
    return torch.nn.Linear(2, 2)


def wants_an_argument(size):
    return not_a_target()


def hook_with_one_argument(ddp_model):
    pass


def uneven_target() -> Target:
    """Rank r gets r + 1 samples: the ranks' mean losses no longer average to the global one."""
    def batch(step, rank, world_size):
        return torch.ones(rank + 1, 2), torch.zeros(rank + 1, dtype=torch.long)

    return Target(torch.nn.Linear(2, 2), batch, F.cross_entropy)


HERE = Path(__file__).stem


@pytest.mark.parametrize("spec,message", [
    (TargetSpec("no_such_module:make"), "cannot import no_such_module"),
    (TargetSpec("examples.my_model:no_such_factory"), "has no 'no_such_factory'"),
    (TargetSpec("examples.my_model"), "must be MODULE:NAME"),
    (TargetSpec(f"{HERE}:not_a_target"), "returned Linear, not"),
    (TargetSpec(f"{HERE}:wants_an_argument"), "must take 0 positional argument"),
    (TargetSpec(MODEL, f"{HERE}:hook_with_one_argument"), "must take 2 positional argument"),
    (TargetSpec(MODEL, "examples.my_model:FEATURES"), "is a int, not a callable"),
    (TargetSpec(f"{HERE}:uneven_target"), "does not fit world size 2: samples per rank [1, 2]"),
    (TargetSpec(MODEL, world_size=1), "--openclaw-world-size must be >= 2"),
], ids=["unimportable", "missing-name", "no-colon", "wrong-return-type", "factory-signature",
        "hook-signature", "hook-not-callable", "does-not-fit-world-size", "one-rank"])
def test_bad_input_is_refused_in_one_line_before_any_rank_starts(spec, message):
    with pytest.raises(BadInput) as info:
        validate_spec(spec)
    assert message in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("hook", [GOOD, BROKEN, "examples.my_model:hardened"],
                         ids=["good-hook", "forgets-to-divide", "hardened"])
def test_every_hook_of_the_example_passes_the_start_up_checks(hook):
    """The false-alarm side of the refusals above: a well-formed target and hook pass, even a
    hook that averages wrongly (that is for the checks on the ranks to find)."""
    from examples import my_model

    validate_spec(TargetSpec(MODEL, hook))
    assert load_hook(hook) is getattr(my_model, hook.partition(":")[2])


def test_the_cli_refuses_a_bad_hook_with_exit_2(capsys):
    assert main(["conform", "--model", MODEL, "--hook", f"{HERE}:hook_with_one_argument"]) == 2
    err = capsys.readouterr().err.strip()
    assert "must take 2 positional argument" in err and len(err.splitlines()) == 1


def test_the_plugin_turns_bad_input_into_a_usage_error():
    from openclaw_ref.conformance.plugin import pytest_configure

    option = SimpleNamespace(openclaw_model=MODEL, openclaw_hook=f"{HERE}:hook_with_one_argument",
                             openclaw_world_size=2, openclaw_wire="fp32")
    config = SimpleNamespace(option=option, addinivalue_line=lambda *args: None)
    with pytest.raises(pytest.UsageError, match="must take 2 positional argument"):
        pytest_configure(config)


def _config(**options):
    hooks = SimpleNamespace(pytest_deselected=lambda items: None)
    return SimpleNamespace(getoption=lambda name, default=None: options.get(name, default),
                           hook=hooks)


@pytest.mark.parametrize("model,hook,skipped", [
    (None, None, False), (MODEL, None, True), (None, GOOD, True)],
    ids=["no-options", "model", "hook"])
def test_the_suites_own_tests_skip_only_under_a_user_target(model, hook, skipped):
    from openclaw_ref.conformance.plugin import pytest_collection_modifyitems

    own, zoo, agnostic = MarkedItem("openclaw_model"), MarkedItem("zoo"), MarkedItem()
    pytest_collection_modifyitems(_config(openclaw_model=model, openclaw_hook=hook),
                                  [own, zoo, agnostic])
    assert bool(own.added) == bool(zoo.added) == skipped and not agnostic.added
    if skipped:
        assert "--openclaw-" in own.added[0].kwargs["reason"]


# "not slow" names slow: the rule leaves it to pytest's own marker filter
@pytest.mark.parametrize("markexpr,kept", [("conformance", 2), ("conformance or slow", 3),
                                           ("not slow", 3), ("", 2)])
def test_slow_conformance_tests_run_only_when_the_marker_expression_names_slow(markexpr, kept):
    from openclaw_ref.conformance.plugin import pytest_collection_modifyitems

    items = [MarkedItem("conformance"), MarkedItem("conformance", "slow"), MarkedItem("slow")]
    pytest_collection_modifyitems(_config(markexpr=markexpr), items)
    assert len(items) == kept


@pytest.mark.slow
def test_pytest_refuses_a_bad_model_as_a_usage_error():
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
                           "--openclaw-model", "no_such_module:make", "--co", "-q",
                           "tests/test_user_target.py"], capture_output=True, text=True,
                          cwd=REPO, timeout=120)
    assert proc.returncode == pytest.ExitCode.USAGE_ERROR, proc.stdout + proc.stderr
    assert "cannot import no_such_module" in proc.stderr


def test_a_hook_that_forgets_to_divide_fails_equivalence_naming_the_ranks(pools):
    result = pools.get(2).run(check_equivalence, TargetSpec(MODEL, BROKEN), timeout_s=180)[0]
    assert not result.passed
    assert result.event["ranks"] == [0, 1] and "ranks [0, 1] differ" in result.detail


def test_the_averaging_hook_gives_stock_ddps_bits(pools):
    result = pools.get(2).run(check_equivalence, TargetSpec(MODEL, GOOD), timeout_s=180)[0]
    assert result.passed, result.detail
    assert result.figures["bitwise_required"] and result.figures["max_abs_diff"] == 0


BATCHNORM = "examples.my_model:make_batchnorm_target"


@pytest.mark.parametrize("hook", [None, "examples.my_model:hardened"], ids=["stock", "hardened"])
def test_a_batchnorm_model_passes_equivalence_with_stock_ddp_and_with_harden(pools, hook):
    """Before stock DDP was the oracle, this model failed with no hook at all (N ranks of any
    correct DDP differ from one process on it)."""
    result = pools.get(2).run(check_equivalence, TargetSpec(BATCHNORM, hook), timeout_s=180)[0]
    assert result.passed and result.figures["max_abs_diff"] == 0, result.detail


def test_conform_reports_a_batchnorm_model_not_shard_invariant_and_passes_harden(capsys,
                                                                                 tmp_path):
    out = tmp_path / "conform.json"
    code = main(["conform", "--model", BATCHNORM, "--hook", "examples.my_model:hardened",
                 "--out", str(out)])
    table = capsys.readouterr().out
    assert code == 0, table
    assert "| MODEL" in table and "this model is not shard-invariant" in table
    rows = {c["check"]: c for c in json.loads(out.read_text())["checks"]}
    prop = rows["shard invariance (model property)"]
    assert prop["role"] == "property" and prop["figures"]["shard_invariant"] is False
    assert rows["equivalence (default)"]["passed"]
    # harden()'s default step guard registers no comm hook: no bucket to judge one by one
    assert "bucket average" not in rows


def test_the_user_hook_sees_the_same_buckets_on_every_rank(pools):
    result = pools.get(2).run(check_bucket_layout, TargetSpec(MODEL, GOOD), timeout_s=180)[0]
    assert result.passed and result.figures["buckets"] >= 1, result.detail


def test_bucket_layout_fires_when_one_rank_registers_its_parameters_in_another_order(pools):
    """The openclaw model as a target under the example's averaging hook, two same-shaped
    projections swapped on rank 1 only: DDP reduces them by index, so rank 1's hook sees
    buckets holding other names."""
    from openclaw_ref.core.faults import parse_fault

    result = pools.get(2).run(check_bucket_layout, TargetSpec(hook=GOOD),
                              (parse_fault("permuted-params@1"),), timeout_s=180)[0]
    assert not result.passed and result.event["ranks"] == [0, 1], result.detail  # two: both


def test_stock_ddp_has_no_hook_whose_buckets_could_be_observed(pools):
    result = pools.get(2).run(check_bucket_layout, TargetSpec(MODEL), timeout_s=180)[0]
    assert result.figures == {"outcome": "skipped"} and "no comm hook" in result.detail


def test_replica_consistency_fires_on_a_bitflip_naming_the_rank_and_parameter(pools):
    from openclaw_ref.conformance.user_checks import check_replica_consistency
    from openclaw_ref.core.faults import parse_fault

    result = pools.get(2).run(check_replica_consistency, TargetSpec(MODEL, GOOD),
                              (parse_fault("bitflip=2.bias@1:1"),), timeout_s=180)[0]
    assert not result.passed
    assert result.event["ranks"] == [0, 1] and result.event["step"] == 1  # two ranks: both
    assert result.event["params"] == ["2.bias"]


@pytest.mark.slow
def test_conform_fails_a_hook_that_forgets_to_divide_with_exit_3(capsys, tmp_path):
    out = tmp_path / "conform.json"
    assert main(["conform", "--model", MODEL, "--hook", BROKEN, "--out", str(out)]) == 3
    table = capsys.readouterr().out
    assert "| equivalence (default)" in table and "ranks [0, 1] differ" in table
    assert out.exists()


@pytest.mark.parametrize("hook,outcome,ranks", [
    (GOOD, "silent-corruption", []),
    ("examples.my_model:hardened", "detected", [0, 1]),  # two ranks: both suspects
], ids=["plain-hook", "hardened"])
def test_a_bitflip_is_silent_under_a_plain_hook_and_detected_by_harden(pools, hook, outcome,
                                                                       ranks):
    from openclaw_ref.conformance.user_faults import UserFaultRunner, case_result, user_case

    case = user_case("bitflip")
    out = UserFaultRunner(TargetSpec(MODEL, hook), pools.get).run_case(case)
    assert (out.outcome, out.ranks) == (outcome, ranks), out
    assert case_result(case, out).passed == (outcome == "detected")
