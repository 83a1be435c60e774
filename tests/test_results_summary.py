"""``results/README.md`` — what harden() buys, in one table — is rendered from the committed
record by ``openclaw-bench report`` like every published file (never typed): the committed file
equals the renderer's output, and each row's cells are the long tables' own, counted right."""

from __future__ import annotations

from openclaw_ref.reporting.record import load_record
from openclaw_ref.reporting.summary import (
    corpus_rows,
    fault_rows,
    results_readme,
    sdc_rows,
    step_cost,
)
from tests.helpers import ROOT

MACHINE = ROOT / "results" / "cpu2-gloo"


def test_the_committed_summary_is_the_renderers_output_from_the_committed_record():
    rec = load_record(MACHINE / "raw.json")
    assert results_readme(rec, MACHINE.name) == (ROOT / "results" / "README.md").read_text()


def test_its_first_table_has_a_row_per_fault_of_the_matrix_and_per_corpus():
    text = (ROOT / "results" / "README.md").read_text()
    first_table = text.split("\n\n| fault ", 1)[1].split("\n\n", 1)[0]
    for fault in ("missing-grad", "permuted-params", "nan-grad", "bitflip", "hang=600s"):
        assert f"`{fault}`" in first_table
    for row in ("published DDP silent errors", "hardware computes wrong",
                "published FSDP2 mistakes", "healthy jobs"):
        assert row in first_table


def _case(fault: str, strategy: str, cell: str) -> dict:
    return {"fault": fault, "strategy": strategy, "cell": cell}


def test_a_fault_row_reads_stock_ddp_and_harden_as_users_call_it_not_the_tuned_column():
    doc = {"faults": {"cases": [_case("nan-grad", "ddp", "silent-corruption"),
                                _case("nan-grad", "hardened", "detected (tuned)"),
                                _case("nan-grad", "hardened-defaults", "detected (defaults)"),
                                _case("none", "ddp", "")]},
           "hook_cost": {"jobs": {"mlp": {"summary": {"hardened": {
               "ratio": 1.5, "ratio_low": 1.25, "ratio_high": 1.75}}}}}}
    rows = fault_rows(doc, "m")
    assert [r[:4] for r in rows] == [["fault matrix: `nan-grad` on one rank",
                                      "silent-corruption", "detected (defaults)",
                                      "1.500 [1.250, 1.750] × a step (mlp)"]]
    assert step_cost({}) == "—"


def test_corpus_and_sdc_rows_count_what_each_column_caught():
    cases = [{"model": "mlp", "column": col, "outcome": out} for col, out in (
        ("ddp", "silent-corruption"), ("ddp", "crash"), ("hardened", "detected"),
        ("hardened", "silent-corruption"), ("ddp-detail", "detected"))]
    row = corpus_rows({"corpus": {"cases": cases}}, "m")[0]
    assert row[1] == "stock DDP: caught 0 of 2 (silent-corruption ×1, crash ×1)"
    assert row[2] == "harden() defaults: caught 1 of 2 (silent-corruption ×1)"
    sdc = {"settings": {"canary_every": 3}, "corpus": [
        {"column": "stock DDP", "outcome": "silent-corruption"},
        {"column": "harden(), canary on", "outcome": "detected"}]}
    row = sdc_rows({"sdc": sdc}, "m")[0]
    assert "every 3 steps" in row[0] and row[1] == "stock DDP: caught 0 of 1 (silent-corruption ×1)"
    assert row[2] == "harden(), canary on: caught 1 of 1"
