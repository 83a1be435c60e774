"""The fault × strategy matrix: what each sync path does when each fault is injected.

One short run per cell (tiny preset, 2 ranks, 5 steps, fault at step 2), classified from what
the system surfaced. ``hardened`` (the step guard, at the matrix's short watchdog and replica
interval: the printed table marks every column whose settings are not its defaults) and
``bucketed`` must detect every fault, naming the faulty
rank and its parameter or bucket, within one step (bitflip: one replica-check interval), and end
a hang by their own deadline. Stock DDP's outcomes are asserted as the facts we measured: that
table is what users come for. Known gaps are strict xfails: the day they are fixed, the xfail
turns into a failure and the table here must be updated.

Each cell runs once, when a test first asks for it, on the shared 2-rank pool; faults that
kill the group (crash, hang) get fresh pools with short deadlines (a spawn each: the dominant
cost). The ``ddp`` and ``hardened`` columns run in CI (but for ``ddp``'s crash: ``hardened``'s
shows the launcher naming a dead rank); ``ddp-fp16`` and ``bucketed`` (the same facts through
PyTorch's fp16 hook, the same detections through the other self-verifying strategy) under
``slow``, with the per-bucket guard's column (``hardened-bucket``: ``harden()`` with
``guard="bucket"``). The columns of PyTorch's own hooks are asserted in
``test_fault_matrix_hooks.py`` (a few cells in CI, the whole columns under ``slow``).
"""

from __future__ import annotations

import dataclasses

import pytest

from openclaw_ref.conformance.fault_matrix import (
    PER_BUCKET,
    CaseOutcome,
    MatrixRunner,
    MatrixSettings,
    column_settings,
    matrix_strategies,
)
from openclaw_ref.core.faults import FAULTS
from openclaw_ref.reporting.render import fault_matrix_table

pytestmark = [pytest.mark.conformance, pytest.mark.openclaw_model]

SETTINGS = MatrixSettings()
COLUMNS = ("ddp", "ddp-fp16", "hardened", "bucketed")

# What stock DDP does, as measured here (torch 2.13, gloo, 2 ranks); see the module docstring.
STOCK_FACTS: dict[str, str] = {
    "late-rank": "no-effect",  # DDP waits; nothing is measured or reported
    "local-buckets": "crash",  # different bucket sizes: gloo aborts the process (SIGABRT)
    "scale-mismatch": "silent-corruption",  # each rank unscales by its own factor: replicas diverge
    "missing-grad": "silent-corruption",  # zero-filled as if unused: the average is halved
    "permuted-params": "silent-corruption",  # DDP compares shapes by index only: sums q with v
    "bitflip": "silent-corruption",  # DDP never compares parameters after construction
    "nan-grad": "silent-corruption",  # NaN is averaged into every replica, no error
    "crash": "crash",
    "hang": "hang-timeout",  # gloo's own collective timeout on the waiting rank
}

# Gaps of the self-verifying strategies, measured: (strategy, fault) -> why.
KNOWN_GAPS: dict[tuple[str, str], str] = {}


CI_COLUMNS = ("ddp", "hardened")


class Cells:
    """The matrix's cells, each run on first request; the table of those that ran is printed
    and reported when the module ends."""

    def __init__(self, runner: MatrixRunner) -> None:
        self.runner = runner
        self.outcomes: dict[tuple[str, str], CaseOutcome] = {}

    def __getitem__(self, key: tuple[str, str]) -> CaseOutcome:
        if key not in self.outcomes:
            strategy, fault = key
            if strategy not in matrix_strategies():
                pytest.fail(f"strategy {strategy} is not registered: the matrix must cover it")
            cell = self.outcomes[key] = self.runner.run_case(strategy, fault)
            print(f"{strategy:9s} {fault:16s} {cell.wall_s:5.1f} s  {cell.summary()}")
        return self.outcomes[key]


@pytest.fixture(scope="module")
def matrix(pools, conformance_report):
    runner = MatrixRunner(SETTINGS, get_pool=pools.get)
    cells = Cells(runner)
    try:
        yield cells
    finally:
        runner.close()
        conformance_report.matrix.extend(cells.outcomes.values())
        conformance_report.matrix_settings = dataclasses.asdict(SETTINGS)
        outcomes = list(cells.outcomes.values())
        columns = column_settings(SETTINGS, list(dict.fromkeys(o.strategy for o in outcomes)))
        print("\n" + fault_matrix_table(outcomes, columns))


def _cell(matrix, strategy: str, fault: str) -> CaseOutcome:
    return matrix[strategy, fault]


def _columns(*strategies: str):
    """``strategies`` as parameters, those outside ``CI_COLUMNS`` marked slow."""
    return [pytest.param(s, marks=[] if s in CI_COLUMNS else [pytest.mark.slow], id=s)
            for s in strategies]


def _stock_cells():
    """Stock DDP's cells; its crash (a fresh pool: a spawn) and its hang (gloo's timeout) under
    slow, as ``hardened``'s crash and hang in CI already show a dead rank and a late one named."""
    for strategy in ("ddp", "ddp-fp16"):
        for fault in FAULTS:
            # crash and hang wait out gloo's timeout on stock DDP: the slow profile (CI budget)
            slow = strategy not in CI_COLUMNS or fault in ("crash", "hang")
            yield pytest.param(strategy, fault, marks=[pytest.mark.slow] if slow else [],
                               id=f"{strategy}-{fault}")


@pytest.mark.parametrize("strategy,fault", list(_stock_cells()))
def test_stock_ddp_outcome_is_the_measured_fact(matrix, strategy, fault):
    cell = _cell(matrix, strategy, fault)
    assert cell.outcome == STOCK_FACTS[fault], cell


@pytest.mark.parametrize("fault", ["crash"])
@pytest.mark.parametrize("strategy", _columns(*COLUMNS[1:]) + [
    pytest.param("ddp", marks=pytest.mark.slow, id="ddp")])
def test_a_crashed_rank_is_named(matrix, strategy, fault):
    cell = _cell(matrix, strategy, fault)
    assert cell.outcome == "crash" and cell.attributed, cell


def _self_verifying_cases():
    for strategy in ("hardened", PER_BUCKET, "bucketed"):
        for fault in FAULTS:
            if fault == "crash":
                continue  # a dead rank is surfaced by the launcher for every strategy (above)
            marks = [] if strategy in CI_COLUMNS else [pytest.mark.slow]
            if (strategy, fault) in KNOWN_GAPS:
                marks.append(pytest.mark.xfail(reason=KNOWN_GAPS[strategy, fault], strict=True))
            yield pytest.param(strategy, fault, marks=marks, id=f"{strategy}-{fault}")


@pytest.mark.parametrize("strategy,fault", list(_self_verifying_cases()))
def test_self_verifying_strategy_detects_and_attributes_the_fault(matrix, strategy, fault):
    cell = _cell(matrix, strategy, fault)
    assert cell.outcome == "detected", cell
    assert cell.attributed, f"wrong attribution: {cell}"
    assert cell.in_time, f"detected too late: {cell}"


@pytest.mark.parametrize("strategy", _columns("hardened", PER_BUCKET, "bucketed"))
def test_self_verifying_strategy_ends_a_hang_by_its_own_deadline(matrix, strategy):
    """Its own watchdog's ``SyncTimeout`` naming the hung rank — not the pool's deadline
    (``LaunchTimeout``) and not gloo's timeout on the waiting rank (a ``crash`` naming it).
    No wall-clock bound: on a loaded 2-core box the fresh pool's spawn alone took 15-22 s."""
    cell = _cell(matrix, strategy, "hang")
    assert cell.kind == "SyncTimeout" and cell.ranks == cell.expected_ranks, cell


def test_stock_ddp_hang_is_ended_only_by_gloos_timeout_on_the_waiting_rank(matrix):
    cell = _cell(matrix, "ddp", "hang")
    assert cell.outcome == "hang-timeout" and cell.ranks == [0], cell
