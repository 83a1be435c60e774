"""``--openclaw-wrapper fsdp2-tp``: the conformance suite judges ``harden()`` of a user's FSDP2 ×
tensor-parallel model (its ``Target.tp_plan``) against stock on a (dp, tp) = (2, 2) mesh. Bad
options are refused in one line before any rank starts; only the fsdp2-tp checks run under it;
each check fires on its mistake (a subject that changes the gradients, one that warns, a tp
replica split, a fault the subject misses) and names the rank; the suite runs from outside the
checkout on the zoo's plans (``slow``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from types import SimpleNamespace

import pytest
import torch.distributed as dist

from openclaw_ref.conformance import tp_checks
from openclaw_ref.conformance.oracle import Runs
from openclaw_ref.conformance.run_record import RunRecord
from openclaw_ref.conformance.target import (
    FSDP_HARDEN,
    TP_WRAPPER,
    Target,
    TargetSpec,
    validate_spec,
)
from openclaw_ref.conformance.tp_run import FAULT_RANK, TpFault
from openclaw_ref.conformance.zoo import tp as zoo_tp
from openclaw_ref.sync.errors import BadInput
from openclaw_ref.sync.hardening import CANARY_OFF, harden
from tests.helpers import MarkedItem

HERE = "tests.test_tp_conformance"
RIGHT = "openclaw_ref.conformance.zoo.tp:sequence_parallel"
NORMS_LEFT_OUT = "openclaw_ref.conformance.zoo.tp:norms_left_out"
EXAMPLE = "examples.my_model:make_target"  # a Target without a tp_plan


def spec(model: str = RIGHT, hook: str | None = FSDP_HARDEN, **kw) -> TargetSpec:
    return TargetSpec(model, hook, kw.pop("world_size", 4), kw.pop("wire", "fp32"),
                      TP_WRAPPER)


def plan_of_one_argument() -> Target:
    target = zoo_tp.sequence_parallel()
    return Target(target.module, target.batch, target.loss, tp_plan=lambda model: None)


@pytest.mark.parametrize("bad,message", [
    (spec(world_size=2), "needs an even --openclaw-world-size >= 4; got 2"),
    (spec(world_size=5), "needs an even --openclaw-world-size >= 4; got 5"),
    (spec(wire="fp16"), "does not apply"),
    (spec(model=None), "needs --openclaw-model"),
    (spec(model=EXAMPLE), "needs a tensor-parallel plan"),
    (spec(model=f"{HERE}:plan_of_one_argument"), "must take 2 positional argument"),
], ids=["two-ranks", "odd", "fp16-wire", "no-model", "no-tp-plan", "plan-signature"])
def test_a_bad_fsdp2_tp_option_is_refused_in_one_line_before_any_rank_starts(bad, message):
    with pytest.raises(BadInput) as info:
        validate_spec(bad)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_a_tp_target_at_four_ranks_passes_the_start_up_checks():
    validate_spec(spec())


def _options(**kw) -> SimpleNamespace:
    return SimpleNamespace(**{"openclaw_model": RIGHT, "openclaw_hook": None,
                              "openclaw_world_size": None, "openclaw_wire": "fp32",
                              "openclaw_wrapper": TP_WRAPPER, **kw})


def test_under_fsdp2_tp_the_default_is_four_ranks_and_harden_the_subject():
    from openclaw_ref.conformance.plugin import _spec

    made = _spec(SimpleNamespace(option=_options()))
    assert (made.world_size, made.hook, made.wrapper) == (4, FSDP_HARDEN, TP_WRAPPER)
    assert _spec(SimpleNamespace(option=_options(openclaw_world_size=8))).world_size == 8
    assert _spec(SimpleNamespace(option=_options(openclaw_wrapper="ddp",
                                                 openclaw_hook=None))).world_size == 2


@pytest.mark.parametrize("wrapper,runs", [
    ("ddp", {"ddp_hook"}), ("fsdp2", {"fsdp_wrapper"}), ("hsdp", {"fsdp_wrapper"}),
    (TP_WRAPPER, {"tp_wrapper"})])
def test_each_wrapper_runs_only_its_own_checks(wrapper, runs):
    from openclaw_ref.conformance.plugin import WRAPPER_MARKERS, pytest_collection_modifyitems

    items = {m: MarkedItem("conformance", m) for m in WRAPPER_MARKERS}
    options = {"openclaw_wrapper": wrapper, "openclaw_model": RIGHT}
    config = SimpleNamespace(getoption=lambda name, default=None: options.get(name, default),
                             hook=SimpleNamespace(pytest_deselected=lambda items: None))
    pytest_collection_modifyitems(config, list(items.values()))
    assert {m for m, item in items.items() if not item.added} == runs


# --- the judges on records made by hand -------------------------------------------------------

def _record(rank: int, replicas: list[dict] | None = None, **kw) -> RunRecord:
    return RunRecord(rank, True, param_names=("a", "b"), tp_replicas=replicas or [], **kw)


def _replicas(split_rank: int | None = None, step: int = 0, steps: int = 2) -> list[RunRecord]:
    """Four ranks, tp groups {0, 1} and {2, 3} (keys 1 and 2): "a" replicated over tp, and on
    ``split_rank`` its copy differs from ``step`` on."""
    return [_record(r, [{"a": (1 + r // 2, "x" if r == split_rank and s >= step else "d")}
                        for s in range(steps)]) for r in range(4)]


def test_tp_replicas_pass_when_every_copy_is_equal():
    row = tp_checks.judge_tp_replicas(spec(hook=None), _replicas())
    assert row.passed and row.figures == {"params": ["a"], "steps": 2}, row.detail


def test_a_tp_replica_split_is_named_at_its_step_with_its_group():
    row = tp_checks.judge_tp_replicas(spec(hook=None), _replicas(split_rank=3, step=1))
    assert not row.passed
    assert row.event == {"kind": "TpReplicasDiffer", "step": 1, "ranks": [2, 3],
                         "params": ["a"]}, row.event
    assert "after step 1: a (ranks [[2, 3]])" in row.detail


def test_a_plan_that_shards_every_parameter_has_no_tp_replica_to_compare():
    row = tp_checks.judge_tp_replicas(spec(hook=None), [_record(r, [{}]) for r in range(4)])
    assert row.passed and "nothing to compare" in row.detail


CANARY = {"kind": CANARY_OFF, "step": None, "detail": "off: tensor parallel"}


def test_the_canarys_own_event_is_no_alarm():
    stock = [_record(r) for r in range(4)]
    subject = Runs([_record(r, events=[CANARY]) for r in range(4)])
    row = tp_checks.judge_no_alarm(spec(), stock, subject)
    assert row.passed and row.figures["canary"] == ["off: tensor parallel"], row.detail


def test_a_warning_stock_did_not_give_is_an_alarm_naming_its_rank():
    stock = [_record(r, warnings=["UserWarning: torch's own"]) for r in range(4)]
    subject = Runs([_record(r, warnings=["UserWarning: torch's own"]
                            + (["UserWarning: mine"] if r == 2 else [])) for r in range(4)])
    row = tp_checks.judge_no_alarm(spec(), stock, subject)
    assert not row.passed and row.event["ranks"] == [2]
    assert row.figures["added_warnings"] == {2: ["UserWarning: mine"]}, row.figures


def _event(kind: str, ranks: list[int], step: int = 0) -> dict:
    return {"kind": kind, "step": step, "ranks": ranks, "params": [], "detail": ""}


def _fault(subject: list[dict | None], stock_changed: bool = True):
    healthy = [RunRecord(r, False, param_digests=[("h",)]) for r in range(4)]
    replies = [{"stock": ("f",) if stock_changed else ("h",), "subject": s} for s in subject]
    return tp_checks.judge_fault(spec(), TpFault.LR_ONE_RANK, replies, healthy)


def test_a_fault_named_at_step_0_on_its_rank_passes():
    row = _fault([_event("OptimizerMismatch", [FAULT_RANK])] * 4)
    assert row.passed and row.figures["stock"] == "silent-corruption", row.detail


@pytest.mark.parametrize("subject", [
    [None] * 4,
    [_event("OptimizerMismatch", [3])] * 4,
    [_event("OptimizerMismatch", [FAULT_RANK], step=1)] * 4,
    [_event("ClockMismatch", [FAULT_RANK])] * 4,
    [_event("OptimizerMismatch", [FAULT_RANK])] * 3 + [None],
], ids=["missed", "wrong-rank", "late", "wrong-kind", "not-every-rank"])
def test_a_fault_missed_or_misnamed_fails(subject):
    row = _fault(subject)
    assert not row.passed and "expected OptimizerMismatch at step 0 naming rank 1" in row.detail


def test_a_fault_that_changed_nothing_in_stock_says_so():
    assert _fault([None] * 4, stock_changed=False).figures["stock"] == "no-effect"


# --- the checks firing on real runs ------------------------------------------------------------

def warns_on_rank_2(model, mesh):
    """A subject that gives a warning on one rank: the no-alarm check must name it."""
    guard = harden(model)
    if dist.get_rank() == 2:
        warnings.warn("a subject's own warning", UserWarning, stacklevel=1)
    return guard


def test_a_subject_that_doubles_the_gradients_fails_equivalence_on_every_rank(target_runs):
    doubles = spec(hook="openclaw_ref.conformance.zoo.fsdp:hardened_but_doubles")
    row = tp_checks.equivalence(target_runs, doubles)
    assert not row.passed
    assert (row.event["step"], row.event["ranks"]) == (0, [0, 1, 2, 3]), row.detail
    assert "differ from stock FSDP2 x TP" in row.detail


def test_a_subject_that_warns_on_one_rank_fails_no_alarm_naming_it(target_runs):
    row = tp_checks.no_alarm(target_runs, spec(hook=f"{HERE}:warns_on_rank_2"))
    assert not row.passed and row.event["ranks"] == [2], row.detail
    assert row.figures["added_warnings"] == {2: ["UserWarning: a subject's own warning"]}


# --- the suite as a user runs it ---------------------------------------------------------------

SUITE = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-m", "conformance",
         "--pyargs", "openclaw_ref.conformance.suite", "-q", "-rs",
         "--openclaw-wrapper", TP_WRAPPER]


def _suite(tmp_path, model: str) -> tuple[subprocess.CompletedProcess, dict]:
    report = tmp_path / "report.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENCLAW_CONFORMANCE_OUT": str(report)}
    proc = subprocess.run(SUITE + ["--openclaw-model", model], capture_output=True, text=True,
                          cwd=tmp_path, env=env, timeout=600)
    return proc, {c["check"]: c for c in json.loads(report.read_text())["checks"]}


@pytest.mark.slow
def test_the_suite_passes_harden_on_a_correct_tp_plan_from_outside_the_checkout(tmp_path):
    proc, checks = _suite(tmp_path, RIGHT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert set(checks) == {"equivalence (default)", "no alarm (error, event or warning)",
                           "tp replicas", *(f"fsdp2-tp fault: {f}" for f in TpFault)}, checks
    assert all(c["passed"] for c in checks.values())
    assert checks["equivalence (default)"]["strategy"] == "harden() on fsdp2-tp"


@pytest.mark.slow
def test_the_suite_fails_a_plan_with_norms_left_out_naming_them(tmp_path):
    proc, checks = _suite(tmp_path, NORMS_LEFT_OUT)
    assert proc.returncode == pytest.ExitCode.TESTS_FAILED, proc.stdout[-3000:]
    replicas = checks["tp replicas"]
    assert not replicas["passed"] and replicas["event"]["ranks"] == [0, 1, 2, 3]
    assert sorted(replicas["event"]["params"]) == sorted(zoo_tp.NORMS)
    assert "tp-replicated parameters differ across their tp group after step 0" in proc.stdout
