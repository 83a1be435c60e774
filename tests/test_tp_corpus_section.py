"""The comparison's ``tp_corpus`` section: FSDP2 × tensor parallel, healthy set-ups and published
TP/SP mistakes under the script as written and ``harden()``'s defaults. Its tables and its row
of results/README.md are rendered from a hand-written record (figures only, every word from the
renderer); the section is registered wherever the other sections are; its run order and
figures. ``tests/test_tp_corpus.py`` asserts each column's measured outcomes."""

from __future__ import annotations

import json

from openclaw_ref.cli import choices
from openclaw_ref.experiments import registry
from openclaw_ref.experiments.sections import tp_corpus
from openclaw_ref.experiments.settings import CompareConfig, quick_config
from openclaw_ref.fsdp_corpus.patterns import Column
from openclaw_ref.reporting import record
from openclaw_ref.reporting.section_tables import SECTION_TABLES
from openclaw_ref.reporting.summary import tp_rows
from openclaw_ref.reporting.tp_tables import tp_cell, tp_corpus_tables
from openclaw_ref.tp_corpus.cases import CASES, MeshShape
from tests.helpers import ROOT

SETTINGS = {"steps": 12, "fault_rank": 1, "fault_step": 0, "timeout_s": 10.0,
            "lr_factor": 2.0, "weight_delta": 0.01, "max_norm": 0.05, "batch_per_dp_rank": 4,
            "seq": 8}
TWO_D = "dp2-tp2"


def _case(name: str, column: str, outcome: str, **kw) -> dict:
    return {"case": name, "column": column, "mesh": kw.pop("mesh", TWO_D),
            "world_size": kw.pop("world_size", 4), "outcome": outcome, "error": None,
            "step": None, "ranks": [], "params": [], "drift": None, "drift_params": [],
            "from_base": None, "replicas_differ": False, "warned_ranks": [],
            "warnings_per_rank": 0, "failed_error": None, "failed_ranks": [],
            "bitwise_equal_to_stock": None, **kw}


NORMS = ["blocks.0.norm.bias", "blocks.0.norm.weight", "norm.weight"]
SECTION = {
    "settings": SETTINGS,
    "cases_run": [tp_corpus.case_source(n) for n in ("sequence-parallel", "norms-left-out-of-sp",
                                                     "clip-counts-replicated-tp-times")],
    "cases": [
        _case("sequence-parallel", "stock", "no-effect", drift=0.0),
        _case("norms-left-out-of-sp", "stock", "silent-corruption", drift=0.137,
              drift_params=NORMS, from_base=0.102, replicas_differ=True),
        _case("clip-counts-replicated-tp-times", "stock", "silent-corruption", drift=0.0,
              from_base=0.0514),
        _case("sequence-parallel", "hardened", "no-effect", drift=0.0, warned_ranks=[0, 1, 2, 3],
              warnings_per_rank=2, bitwise_equal_to_stock=True),
        _case("norms-left-out-of-sp", "hardened", "detected", error="GradientsNotAveraged",
              step=0, ranks=[0, 1, 2, 3], params=NORMS),
        _case("clip-counts-replicated-tp-times", "hardened", "silent-corruption", drift=0.0,
              from_base=0.0514),
    ],
}


# --- the tables, from a hand-written record ----------------------------------------------------

def test_the_outcome_table_is_case_source_stock_and_hardened_with_a_row_per_case():
    table = tp_corpus_tables(SECTION, {})[0]
    assert table.headers == ["case", "public source", "stock (as written)", "harden() defaults"]
    assert table.rows == [
        ["sequence-parallel", "— (healthy)", "trains (no warning)",
         "trains (bitwise = stock; warned ×2 on 4 ranks)"],
        ["norms-left-out-of-sp",
         "[Megatron-LM#1446](https://github.com/NVIDIA/Megatron-LM/issues/1446)",
         "silent: replicas drift 1.4e-01 (blocks.0.norm.bias, blocks.0.norm.weight +1)",
         "detected (GradientsNotAveraged; step 0; ranks 0,1,2,3); blocks.0.norm.bias, "
         "blocks.0.norm.weight +1"],
        ["clip-counts-replicated-tp-times",
         "[ROCm/TransformerEngine#715](https://github.com/ROCm/TransformerEngine/pull/715)",
         "silent: replicas equal; 5.1e-02 off the correct run",
         "silent: replicas equal; 5.1e-02 off the correct run"],
    ]


def test_the_caption_counts_the_mistakes_caught_and_the_healthy_jobs_left_quiet():
    caption = tp_corpus_tables(SECTION, {})[0].caption
    for said in ("12-step run", "the 2-D mesh (dp=2, tp=2) on 4 gloo ranks", "rank 1 alone",
                 "from step 0", "timeout 10 s", "harden(model) right after the last fully_shard",
                 "Caught: stock (as written) 0 of 2, harden() defaults 1 of 2",
                 "healthy and quiet (no error, no warning): stock (as written) 1 of 1, "
                 "harden() defaults 0 of 1."):
        assert said in caption, said


def test_the_drift_table_lists_each_stock_mistake_with_its_drift_and_its_base():
    drift = tp_corpus_tables(SECTION, {})[-1]
    assert drift.rows == [
        ["norms-left-out-of-sp", TWO_D, "silent-corruption", "0.137", "3",
         "blocks.0.norm.bias, blocks.0.norm.weight +1", "0.102", "sequence-parallel"],
        ["clip-counts-replicated-tp-times", TWO_D, "silent-corruption", "0", "0", "—",
         "0.0514", "clip-per-mesh"]]


def test_one_outcome_table_per_mesh():
    three = [{**c, "mesh": MeshShape.THREE_D.value, "world_size": 8} for c in SECTION["cases"]]
    sources = [{**p, "mesh": MeshShape.THREE_D.value} for p in SECTION["cases_run"]]
    sec = {**SECTION, "cases": SECTION["cases"] + three,
           "cases_run": SECTION["cases_run"] + sources}
    tables = tp_corpus_tables(sec, {})
    assert len(tables) == 3 and "HSDP × TP" in tables[1].caption
    assert "on 8 gloo ranks" in tables[1].caption


def test_a_healthy_job_stopped_is_a_false_alarm_and_a_refusal_is_said_as_one():
    alarm = _case("x", "hardened", "detected", error="ReplicaDivergence", step=0, ranks=[0, 1])
    assert tp_cell(alarm, healthy=True) == "false alarm (ReplicaDivergence; step 0; ranks 0,1)"
    refused = _case("x", "hardened", "crash", error="BadInput", step=0, ranks=list(range(8)))
    assert tp_cell(refused, healthy=True) == "refused (BadInput at harden())"
    hang = _case("x", "stock", "hang-timeout", error="watchdog", step=11, ranks=[0, 1, 2, 3])
    assert tp_cell(hang, healthy=False) == "hang-timeout (watchdog; step 11; ranks 0,1,2,3)"


def test_a_hardened_run_that_changed_the_parameters_says_so():
    changed = _case("x", "hardened", "no-effect", bitwise_equal_to_stock=False)
    assert tp_cell(changed, healthy=True) == "trains (NOT bitwise = stock; no warning)"


def test_no_header_or_cell_holds_a_pipe_that_would_split_the_markdown_table():
    for table in tp_corpus_tables(SECTION, {}):
        assert all("|" not in str(cell) for row in [table.headers, *table.rows] for cell in row)


# --- results/README.md's row --------------------------------------------------------------------

def test_the_summary_row_counts_mistakes_caught_and_healthy_jobs_left_quiet_per_column():
    [row] = tp_rows({"tp_corpus": SECTION}, "m")
    assert row[0].startswith("FSDP2 × tensor parallel") and "dp2-tp2 on 4 ranks" in row[0]
    assert row[1] == ("stock (as written): mistakes caught 0 of 2 (silent-corruption ×2); "
                      "healthy quiet 1 of 1")
    assert row[2] == ("harden() defaults: mistakes caught 1 of 2 (silent-corruption ×1); "
                      "healthy quiet 0 of 1 (warned ×1)")
    assert row[4].startswith("[FSDP2 × tensor parallel") and "m/comparison.md#" in row[4]
    assert tp_rows({}, "m") == []


# --- registered wherever the other sections are ------------------------------------------------

def test_the_section_is_registered_recorded_offered_by_the_cli_and_rendered():
    assert "tp_corpus" in registry.SECTIONS and "tp_corpus" in record.SECTIONS
    assert "tp_corpus" in choices.SECTIONS and "tp_corpus" in SECTION_TABLES
    assert "tp_corpus" in CompareConfig().sections


def test_healthy_cases_run_first_and_the_hang_last_on_each_mesh():
    for mesh in tp_corpus.MESHES:
        names = tp_corpus.cases_of(CompareConfig(), mesh)
        assert sorted(names) == sorted(n for n, c in CASES.items() if c.mesh is mesh)
        healthy = [CASES[n].healthy for n in names]
        assert healthy == sorted(healthy, reverse=True)
    assert tp_corpus.cases_of(CompareConfig(), MeshShape.TWO_D)[-1] == \
        "extra-microbatch-one-rank"
    quick = tp_corpus.cases_of(quick_config(), MeshShape.TWO_D)
    assert quick == ("sequence-parallel", "norms-left-out-of-sp")
    assert tp_corpus.meshes_of(quick_config()) == (MeshShape.TWO_D,)
    assert tp_corpus.jobs(CompareConfig()) == 4


def test_a_case_keeps_figures_and_drops_the_outcomes_wording():
    outcome = {"pattern": "lr-one-rank", "kind": "detected", "ranks": [1], "step": 0,
               "detail": "OptimizerMismatch at step 0 …", "max_abs_diff": None,
               "per_rank": {"0": "detected"}, "error": "OptimizerMismatch", "mesh": TWO_D,
               "world_size": 4, "params": [], "drift": None, "drift_params": [],
               "warnings": {"1": ["UserWarning: a", "UserWarning: b"]}, "digests": {}}
    figures = tp_corpus.case_figures("lr-one-rank", Column.HARDENED, outcome)
    assert figures["outcome"] == "detected" and figures["error"] == "OptimizerMismatch"
    assert figures["warned_ranks"] == [1] and figures["warnings_per_rank"] == 2
    assert "detail" not in figures and "per_rank" not in figures
    assert figures["bitwise_equal_to_stock"] is None


def test_the_committed_record_with_the_section_parses():
    doc = json.loads((ROOT / "results" / "cpu2-gloo" / record.RAW_NAME).read_text())
    assert record.parse_record({**doc, "tp_corpus": SECTION}).section("tp_corpus") == SECTION
