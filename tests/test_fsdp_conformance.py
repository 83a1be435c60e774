"""``--openclaw-wrapper fsdp2|hsdp``: the conformance suite judges ``harden()`` of ``fully_shard``
(or the ``--openclaw-hook`` subject) against stock ``fully_shard`` on a user's model. Bad
wrapper options are refused in one line before any rank starts; a subject that changes the
gradients fails equivalence naming every rank; the suite runs from outside the checkout on
``examples/my_model.py`` at 2 ranks (CI) and, as HSDP on a 2 × 2 mesh, at 4 (``slow``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from openclaw_ref.conformance.fault_matrix import CaseOutcome
from openclaw_ref.conformance.fsdp_faults import FsdpCase, case_result
from openclaw_ref.conformance.fsdp_run import FSDP_OPTION_SETS
from openclaw_ref.conformance.oracle import TargetRuns
from openclaw_ref.conformance.target import (
    FSDP_HARDEN,
    TargetSpec,
    validate_spec,
    with_default_subject,
)
from openclaw_ref.conformance.user_checks import equivalence_from
from openclaw_ref.sync.errors import BadInput

REPO = Path(__file__).parents[1]
EXAMPLE = "examples.my_model:make_target"
SUITE = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-m", "conformance",
         "--pyargs", "openclaw_ref.conformance.suite", "-q"]


@pytest.mark.parametrize("spec,message", [
    (TargetSpec(EXAMPLE, wrapper="fsdp"), "--openclaw-wrapper must be one of ddp, fsdp2, hsdp"),
    (TargetSpec(EXAMPLE, world_size=2, wrapper="hsdp"), "needs an even --openclaw-world-size >= 4"),
    (TargetSpec(EXAMPLE, world_size=6, wrapper="hsdp", wire="fp16"), "does not apply"),
    (TargetSpec(None, wrapper="fsdp2"), "needs --openclaw-model"),
], ids=["unknown", "hsdp-at-2", "fp16-wire", "no-model"])
def test_a_bad_wrapper_option_is_refused_in_one_line(spec, message):
    with pytest.raises(BadInput, match=message.replace("(", r"\(")):
        validate_spec(spec)


def test_under_fsdp2_the_default_subject_is_harden_and_no_hook_is_the_stock_wrapper():
    spec = with_default_subject(TargetSpec(EXAMPLE, wrapper="fsdp2"))
    assert spec.hook == FSDP_HARDEN
    assert with_default_subject(TargetSpec(EXAMPLE)).hook is None  # ddp: stock DDP


def test_the_plugin_refuses_hsdp_at_two_ranks_as_a_usage_error():
    from openclaw_ref.conformance.plugin import pytest_configure

    option = SimpleNamespace(openclaw_model=EXAMPLE, openclaw_hook=None, openclaw_world_size=2,
                             openclaw_wire="fp32", openclaw_wrapper="hsdp")
    config = SimpleNamespace(option=option, addinivalue_line=lambda *args: None)
    with pytest.raises(pytest.UsageError, match="hsdp"):
        pytest_configure(config)


def test_pytest_refuses_an_unknown_wrapper_before_collecting_anything(tmp_path):
    proc = subprocess.run(SUITE + ["--openclaw-wrapper", "fsdp", "--co"], capture_output=True,
                          text=True, cwd=tmp_path, timeout=120)
    assert proc.returncode == pytest.ExitCode.USAGE_ERROR, proc.stdout + proc.stderr
    assert "invalid choice: 'fsdp'" in proc.stderr


def test_a_subject_that_doubles_the_gradients_fails_equivalence_on_every_rank(pools):
    spec = TargetSpec("openclaw_ref.conformance.zoo.fsdp:mlp",
                      "openclaw_ref.conformance.zoo.fsdp:hardened_but_doubles", 2, "fp32", "fsdp2")
    runs = TargetRuns(pools.get)
    options = FSDP_OPTION_SETS["default"]
    result = equivalence_from(spec, "default", runs.oracle(spec, options),
                              runs.runs(spec, options))
    assert not result.passed, result.detail
    assert result.event.get("ranks") == [0, 1] and result.event["step"] == 0, result.detail
    assert "differ from stock FSDP2" in result.detail


def _suite_on_the_example(tmp_path, *options):
    """The suite as a user runs it: from a directory outside the checkout, the example's
    folder on the path."""
    report = tmp_path / "report.json"
    env = {**os.environ, "PYTHONPATH": str(REPO / "examples"), "OMP_NUM_THREADS": "1",
           "OPENCLAW_CONFORMANCE_OUT": str(report)}
    proc = subprocess.run(SUITE + ["--openclaw-model", "my_model:make_target", *options],
                          capture_output=True, text=True, cwd=tmp_path, env=env, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    return {c["check"]: c for c in json.loads(report.read_text())["checks"]}


def test_the_suite_passes_harden_on_fsdp2_on_a_user_model_at_two_ranks(tmp_path):
    checks = _suite_on_the_example(tmp_path, "--openclaw-wrapper", "fsdp2")
    assert checks["equivalence (default)"]["passed"]
    assert checks["equivalence (default)"]["strategy"] == "harden() on fsdp2"
    # a clock split of two ranks: no majority, both named
    assert checks["fsdp2 corpus: extra-backward-one-rank"]["event"]["ranks"] == [0, 1]
    clip = checks["fsdp2 corpus: clip-local-norm"]
    assert clip["event"]["kind"] == "ScaleMismatch" and clip["event"]["ranks"] == [0, 1], clip


def test_a_fault_harden_does_not_catch_is_reported_as_a_known_gap_not_hidden():
    missed = CaseOutcome("harden() on fsdp2", "bitflip", "silent-corruption",
                         expected_ranks=[1])
    row = case_result(FsdpCase("bitflip"), missed)
    assert not row.passed and row.figures["known_gap"], row
    assert "not caught by harden() today" in row.detail
    caught = CaseOutcome("harden() on fsdp2", "nan-grad", "detected", kind="NonFiniteGradient",
                         step=2, ranks=[1], expected_ranks=[1], attributed=True)
    assert not case_result(FsdpCase("nan-grad"), caught).figures["known_gap"]


@pytest.mark.slow
def test_the_suite_passes_harden_on_hsdp_on_a_user_model_at_four_ranks(tmp_path):
    checks = _suite_on_the_example(tmp_path, "--openclaw-wrapper", "hsdp",
                                   "--openclaw-world-size", "4")
    assert checks["equivalence (default)"]["passed"]
    assert checks["replica consistency"]["passed"]
